"""Searching: a literal string in the project's text files, with ripgrep or in
Python."""

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
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

    Entries are visited sorted by name, depth first: the order of `rg --sort
    path`, so both backends stop at the same file when the file cap is reached.
    Only real files and directories are taken, never symlinks (ripgrep skips
    them too), so no link leads the search out of the root. Denied and
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
    for number, line in enumerate(text.split("\n"), start=1):
        if query in line:
            yield Match(relative, number, line)

def python_matches(project, query: str, deadline: float) -> Iterator[Match]:
    """Search in pure Python, for machines without ripgrep; yields matches in path
    order.

    Raises SearchTimedOut when the deadline passes, checked before each file.
    """
    gitignore, mlplcodeignore = (
        project.ignore[".gitignore"],
        project.ignore[".mlplcodeignore"],
    )
    for relative in walk_searchable(project.root, "", gitignore, mlplcodeignore):
        if time.monotonic() > deadline:
            raise SearchTimedOut
        text = read_if_text(os.path.join(project.root, relative))
        if text is not None:
            yield from lines_matching(relative, text, query)

def ripgrep_command(project, query: str) -> list[str]:
    """Build the rg argv that searches exactly the files python_matches searches.

    rg's own ignore logic is switched off (--no-ignore, --hidden, --no-config) and
    replaced by ours: the root .gitignore and .mlplcodeignore as ignore files,
    .git and secret names as excluding globs. --text and --encoding none make rg
    report every file raw, so the binary rule is applied after, by decode_text.
    """
    command = [
        project.programs["rg"],
        "--fixed-strings",
        "--line-number",
        "--no-heading",
        "--color",
        "never",
        "--null",
        "--text",
        "--encoding",
        "none",
        "--hidden",
        "--no-ignore",
        "--no-config",
        "--sort",
        "path",
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

def ripgrep_records(lines: Iterator[bytes]) -> Iterator[bytes]:
    """The records of `rg --null` output, each whole though its path may hold
    newlines."""
    pending = b""
    for line in lines:
        pending += line
        if b"\0" in pending:
            yield pending
            pending = b""


def parse_ripgrep_line(raw: bytes) -> Match:
    """Split one line of `rg --null` output, `./path NUL number : text`, into a
    Match."""
    path, _, rest = raw.removesuffix(b"\n").partition(b"\0")
    number, _, text = rest.partition(b":")
    return Match(
        os.fsdecode(path).removeprefix("./"),
        int(number),
        text.decode("utf-8", "replace"),
    )

def ripgrep_matches(project, query: str, deadline: float) -> Iterator[Match]:
    """Search with ripgrep, dropping the files that python_matches would skip as not
    text.

    rg is killed when the caller stops reading, so a capped search ends early,
    and when the deadline passes, which raises SearchTimedOut.
    """
    root = project.root
    with subprocess.Popen(
        ripgrep_command(project, query),
        cwd=root,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    ) as rg:
        alarm = threading.Timer(max(0.0, deadline - time.monotonic()), rg.kill)
        alarm.start()
        try:
            current, is_text = None, False
            for raw in ripgrep_records(rg.stdout):
                match = parse_ripgrep_line(raw)
                if match.path != current:
                    current = match.path
                    is_text = read_if_text(os.path.join(root, current)) is not None
                if is_text:
                    yield match
            if time.monotonic() > deadline:
                raise SearchTimedOut
        finally:
            alarm.cancel()
            rg.kill()

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
