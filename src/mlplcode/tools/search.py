"""Searching: a literal string in the project's text files, with ripgrep or in
Python."""

import contextlib
import os
import subprocess
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pathspec

from . import failure, observation
from .paths import SECRET_NAME_PATTERNS, denial_reason, ignore_rules, spelling_problem
from .read import READ_CAP_BYTES, read_if_text

SEARCH_MAX_MATCHES = 50
SEARCH_MAX_FILES = 200
SEARCH_LINE_CHARS = 200
SEARCH_MAX_DEPTH = 32
SEARCH_SECONDS = 10


class SearchTimedOut(Exception):
    """A search ran out of time; the matches found so far are still shown."""


@dataclass(frozen=True)
class Match:
    """One line that contains the query: which file, which line, what it says."""

    path: str
    line_number: int
    text: str

def walk_searchable(
    directory: str,
    relative_dir: str,
    gitignore: pathspec.PathSpec,
    mlplcodeignore: pathspec.PathSpec,
    depth: int = 1,
) -> Iterator[str]:
    """Yield the relative paths of the files SEARCH may look at, in path order.

    Entries are visited sorted by name, depth first: the order ripgrep_files puts
    ripgrep's list in, so both backends stop at the same file when the file cap is
    reached. Only real files and directories are taken, never symlinks (ripgrep
    skips them too), so no link leads the search out of the root. Denied and
    gitignored paths are pruned with everything under them, and so is what lies
    deeper than SEARCH_MAX_DEPTH, as ripgrep's --max-depth does.
    """
    for entry in sorted(os.scandir(directory), key=lambda entry: entry.name):
        is_dir = entry.is_dir(follow_symlinks=False)
        relative = relative_dir + entry.name + ("/" if is_dir else "")
        if denial_reason(relative, mlplcodeignore) or gitignore.match_file(relative):
            continue
        if is_dir and depth < SEARCH_MAX_DEPTH:
            yield from walk_searchable(
                entry.path, relative, gitignore, mlplcodeignore, depth + 1
            )
        elif entry.is_file(follow_symlinks=False):
            yield relative

def lines_matching(relative: str, text: str, query: str) -> Iterator[Match]:
    """Yield the lines of one file's text that contain the query literally, numbered
    from 1."""
    number, end = 1, 0
    at = text.find(query)
    while at != -1:
        begin = text.rfind("\n", end, at) + 1
        number += text.count("\n", end, begin)
        end = text.find("\n", at)
        if end == -1:
            end = len(text)
        yield Match(relative, number, text[begin:end])
        at = text.find(query, end)

def matches_in(
    root: str, files: Iterable[str], query: str, deadline: float
) -> Iterator[Match]:
    """Yield the matches in FILES, paths relative to ROOT, taken in their order and
    skipping the files READ would refuse.

    Raises SearchTimedOut when the deadline passes, checked before each file.
    """
    for relative in files:
        if time.monotonic() > deadline:
            raise SearchTimedOut
        text = read_if_text(os.path.join(root, relative))
        if text is not None:
            yield from lines_matching(relative, text, query)


def python_matches(project, query: str, deadline: float) -> Iterator[Match]:
    """Search in pure Python, for machines without ripgrep; yields matches in path
    order."""
    gitignore, mlplcodeignore = (
        project.ignore[".gitignore"],
        project.ignore[".mlplcodeignore"],
    )
    files = walk_searchable(project.root, "", gitignore, mlplcodeignore)
    return matches_in(project.root, files, query, deadline)

def ripgrep_command(project, query: str) -> list[str]:
    """Build the rg argv that lists the files holding the query, of exactly the files
    python_matches searches.

    rg's own ignore logic is switched off (--no-ignore, --hidden, --no-config) and
    replaced by ours: the root .gitignore and .mlplcodeignore as ignore files,
    .git and secret names as excluding globs. --text and --encoding none make rg
    look at every file raw, so the binary rule is applied after, by decode_text.
    """
    command = [
        project.programs["rg"],
        "--files-with-matches",
        "--fixed-strings",
        "--null",
        "--text",
        "--encoding",
        "none",
        "--hidden",
        "--no-ignore",
        "--no-config",
        "--max-depth",
        str(SEARCH_MAX_DEPTH),
        "--max-filesize",
        str(READ_CAP_BYTES),
        "--iglob",
        "!.git",
    ]
    command += [f"--iglob=!{pattern}" for pattern in SECRET_NAME_PATTERNS]
    for name in (".gitignore", ".mlplcodeignore"):
        if os.path.isfile(os.path.join(project.root, name)):
            command += ["--ignore-file", name]
    return command + ["--regexp", query, "."]

def ripgrep_files(project, query: str, deadline: float) -> tuple[list[str], bool]:
    """The files in which ripgrep finds the query, in the walk's order, and whether it
    finished before the deadline."""
    try:
        listed = subprocess.run(
            ripgrep_command(project, query),
            cwd=project.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=max(0.0, deadline - time.monotonic()),
        ).stdout
        finished = True
    except subprocess.TimeoutExpired as stopped:
        listed, finished = stopped.output or b"", False
    names = [os.fsdecode(name).removeprefix("./") for name in listed.split(b"\0")[:-1]]
    return sorted(names, key=lambda name: name.split("/")), finished

def ripgrep_matches(project, query: str, deadline: float) -> Iterator[Match]:
    """Search with ripgrep: it finds the files, matches_in reads them as the walk's.

    Raises SearchTimedOut when the deadline passes, while rg lists or after.
    """
    files, finished = ripgrep_files(project, query, deadline)
    yield from matches_in(project.root, files, query, deadline)
    if not finished:
        raise SearchTimedOut

def unnameable(path: str) -> bool:
    """Whether READ could not be given PATH: it holds a newline or what spelling_problem
    refuses."""
    return "\n" in path or spelling_problem(path) is not None


def first_files(matches: Iterator[Match]) -> tuple[list[Match], str, int]:
    """Keep the matches of the first SEARCH_MAX_FILES files; say why the search stopped
    early, and how many matching files were left out because READ could not name them.

    The reason is "" when it ran to the end, else a phrase for the summary line:
    stopping at the file cap or the deadline bounds the time and memory of a
    search for a common word.
    """
    kept: list[Match] = []
    files: set[str] = set()
    unnamed: set[str] = set()
    try:
        for match in matches:
            if match.path in unnamed or (match.path not in files and unnameable(match.path)):
                unnamed.add(match.path)
                continue
            if match.path not in files:
                if len(files) == SEARCH_MAX_FILES:
                    return (
                        kept,
                        f"more files match after the first {SEARCH_MAX_FILES}",
                        len(unnamed),
                    )
                files.add(match.path)
            kept.append(match)
    except SearchTimedOut:
        return kept, f"the search stopped after {SEARCH_SECONDS:g} s", len(unnamed)
    return kept, "", len(unnamed)

def format_matches(query: str, matches: list[Match], stopped: str, unnamed: int) -> str:
    """Render at most SEARCH_MAX_MATCHES matches as `path:line: text`.

    Long lines are cut, and a final line says how much was left out, so the
    model knows its answer is partial and can narrow the query.
    """
    left_out = (
        f"[{unnamed} matching file(s) left out: a name holds a newline or a character"
        " READ refuses]"
        if unnamed
        else ""
    )
    if not matches and not stopped:
        return "\n".join(filter(None, [f"no matches for {query!r}", left_out]))
    lines = [
        f"{match.path}:{match.line_number}: {match.text[:SEARCH_LINE_CHARS]}"
        for match in matches[:SEARCH_MAX_MATCHES]
    ]
    cut = matches[SEARCH_MAX_MATCHES:]
    if cut:
        files = len({match.path for match in cut})
        stopped = f"; {stopped}" if stopped else ""
        lines.append(
            f"[... {len(cut)} more matches in {files} file(s) cut{stopped};"
            " narrow the query]"
        )
    elif stopped:
        lines.append(f"[... {stopped}; narrow the query]")
    return "\n".join(filter(None, [*lines, left_out]))

def search_files(action: dict, project) -> dict:
    """SEARCH: find a literal string in the project's text files, with ripgrep when
    installed.

    Refuses an empty query and one holding a newline or NUL: matches are within one
    line.
    """
    query = action["query"]
    if not query or "\n" in query or "\0" in query:
        return failure(
            "the query must be non-empty text on one line;"
            " SEARCH matches within a line"
        )
    # Both backends read the rules here, so that a broken file is refused either way.
    for name in (".gitignore", ".mlplcodeignore"):
        ignore_rules(project, name)
    deadline = time.monotonic() + SEARCH_SECONDS
    if project.programs["rg"]:
        found = ripgrep_matches(project, query, deadline)
    else:
        found = python_matches(project, query, deadline)
    with contextlib.closing(found):
        matches, stopped, unnamed = first_files(found)
    return observation(format_matches(query, matches, stopped, unnamed))
