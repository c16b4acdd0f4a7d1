"""Tools: the five actions the agent can take, each confined to the project root.

An action is a dict the protocol parsed from the model's reply, such as
{"tool": "read", "path": "src/app.py"}. `execute` carries it out and returns an
observation, {"ok": bool, "text": str}. A failure is an observation too: ok is
False and the text starts with "ERROR: " and says what went wrong and what to
do instead, because the model can only recover from what it is told. Nothing
raised inside a tool escapes `execute`.
"""

import contextlib
import difflib
import fnmatch
import hashlib
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pathspec

from .trust import (child_environment, environment_secrets, find_bubblewrap, is_invisible,
                    limit_resources, redact, sandbox_argv, visible)

def observation(text: str, **fields) -> dict:
    """Build a successful observation; RUN adds its exit code and kind as extra fields."""
    return {"ok": True, "text": text, **fields}

def failure(message: str) -> dict:
    """Build a failed observation; the ERROR prefix tells the model and the log it failed."""
    return {"ok": False, "text": f"ERROR: {message}"}

class PathRefused(Exception):
    """A tool cannot use a path; the message names the path, the reason and what to do."""

# Matched case-insensitively against every component of a path.
SECRET_NAME_PATTERNS = (
    ".env", ".env.*", "id_rsa", "id_ed25519", "*.pem", "*.key", "*.p12", "*.pfx",
    ".npmrc", ".pypirc", ".netrc", "credentials*.json", "secrets.y*ml",
)


def is_secret_name(name: str) -> bool:
    """Say whether a file or directory name looks like it holds keys or credentials.

    Case and trailing dots and spaces are ignored: .ENV and ".env." are as secret
    as .env, and some file systems agree.
    """
    folded = name.casefold().rstrip(" .")
    return any(fnmatch.fnmatchcase(folded, pattern) for pattern in SECRET_NAME_PATTERNS)

def load_ignore_rules(root: str, name: str) -> pathspec.PathSpec:
    """Read the gitignore-style rules of a file at the root; no file means no rules.

    Refuses a file that is not UTF-8 or holds an invalid pattern rather than
    skipping it, since a dropped rule would show what the user meant to hide.
    """
    try:
        with open(os.path.join(root, name), encoding="utf-8") as rules:
            return pathspec.GitIgnoreSpec.from_lines(rules)
    except FileNotFoundError:
        return pathspec.GitIgnoreSpec.from_lines([])
    except ValueError as problem:  # UnicodeDecodeError is a ValueError too
        raise PathRefused(f"{name}: cannot be parsed ({problem}); fix or delete it") from None

def denial_reason(relative: str, mlplcodeignore: pathspec.PathSpec) -> str | None:
    """Say why a path relative to the root is off limits, or None when it is not.

    Every component is checked, so a .git or secret directory hides all it holds.
    `relative` uses / and ends with / for a directory, as gitignore rules expect.
    """
    for part in relative.rstrip("/").split("/"):
        if part.casefold() == ".git":
            return ".git is protected; use RUN git status or git diff to look at the repository"
        if is_secret_name(part):
            return f"{part} may hold secrets, so tools never touch it; work without it"
    if mlplcodeignore.match_file(relative):
        return "excluded by .mlplcodeignore; work without it"
    return None

PATH_MAX_CHARS = 1024
DRIVE = re.compile(r"^[A-Za-z]:")


def spelling_problem(path: str) -> str | None:
    """Say what is wrong with how a path is written, before the file system is asked."""
    if not path or "\0" in path:
        return "not a usable path"
    if len(path) > PATH_MAX_CHARS:
        return f"longer than {PATH_MAX_CHARS} characters"
    if any(is_invisible(char) for char in path):
        return "holds control or invisible characters; write the path in plain text"
    if os.path.isabs(path) or DRIVE.match(path) or path.startswith("\\\\"):
        return "absolute paths are refused (drive and UNC forms too)"
    if "\\" in path:
        return "holds a backslash; separate directories with /"
    return None

def resolve_path(root: str, path: str) -> str:
    """Turn a path from the model into the real absolute path it names inside the root.

    Symlinks are resolved before any rule is applied, so a link can neither lead
    out of the root nor give a harmless name to a protected file. The path as
    written is judged too: a denial of either spelling wins. Refuses what
    spelling_problem finds, paths that leave the root, and paths that
    denial_reason denies.
    """
    problem = spelling_problem(path)
    if problem:
        raise PathRefused(f"{visible(path[:PATH_MAX_CHARS])!r}: {problem};"
                          " give a path relative to the project root")
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, path))
    if os.path.commonpath([real_root, target]) != real_root:
        raise PathRefused(f"{path}: leaves the project root; use a path inside the project")
    mlplcodeignore = load_ignore_rules(real_root, ".mlplcodeignore")
    written = os.path.normpath(path).replace(os.sep, "/")
    relative = os.path.relpath(target, real_root).replace(os.sep, "/")
    for spelling in (written, relative):
        reason = denial_reason(spelling, mlplcodeignore)
        if reason:
            raise PathRefused(f"{path}: {reason}")
    return target

def count_lines(text: str) -> int:
    """Count lines as editors and PATCH number them: a last line without a newline counts."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)

READ_CAP_BYTES = 256 * 1024
BINARY_SNIFF_BYTES = 8 * 1024


def decode_text(data: bytes) -> str | None:
    """Decode file bytes as UTF-8 text, or give None for a file that is not text.

    A NUL byte in the first 8 KiB is the usual mark of a binary file; bytes that
    are not UTF-8 could not be shown or patched faithfully either.
    """
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None

def kind_of(mode: int) -> str:
    """Name the kind of a file that is not a regular file, for a refusal."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a device"


def check_regular(info: os.stat_result, shown: str) -> None:
    """Refuse all but a regular file with one name: a FIFO blocks, a device never ends, and a
    second hard link may be a name for a file outside the project."""
    if not stat.S_ISREG(info.st_mode):
        raise PathRefused(f"{shown}: is {kind_of(info.st_mode)}, not a regular file;"
                          " the tools take text files")
    if info.st_nlink > 1:
        raise PathRefused(f"{shown}: has {info.st_nlink} hard links, and another name may lie"
                          " outside the project; the tools refuse it")

def read_bytes(path: str, shown: str) -> bytes:
    """Read a resolved file whole, after checking that it is a regular file of modest size.

    The file is opened without following a symlink and without blocking, and the
    checks are repeated on what was opened, so a file swapped after resolve_path is
    refused, not read.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise PathRefused(f"{shown}: no such file; use SEARCH to find the right path") from None
    check_regular(info, shown)
    if info.st_size > READ_CAP_BYTES:
        raise PathRefused(f"{shown}: {info.st_size} bytes is over the read cap of"
                          f" {READ_CAP_BYTES} bytes; use SEARCH to find the lines you need")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        raise PathRefused(f"{shown}: changed while it was being opened; try again") from None
    with os.fdopen(descriptor, "rb") as file:
        opened = os.fstat(file.fileno())
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise PathRefused(f"{shown}: changed while it was being opened; try again")
        check_regular(opened, shown)
        data = file.read(READ_CAP_BYTES + 1)
    if len(data) > READ_CAP_BYTES:
        raise PathRefused(f"{shown}: grew over the read cap of {READ_CAP_BYTES} bytes")
    return data

def read_text(path: str, shown: str) -> str:
    """Read a resolved file as text, for READ and PATCH; refuses what read_bytes refuses,
    and binary files, each with a hint of what to do instead."""
    text = decode_text(read_bytes(path, shown))
    if text is None:
        raise PathRefused(f"{shown}: binary or not UTF-8; READ and PATCH take text files only")
    return text

def read_file(action: dict, root: str) -> dict:
    """READ: show a text file under a header with its line count, so lines can be cited."""
    shown = action["path"]
    text = read_text(resolve_path(root, shown), shown)
    return observation(f"{shown} ({count_lines(text)} lines)\n{text}")

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

def walk_searchable(directory: str, relative_dir: str, gitignore: pathspec.PathSpec,
                    mlplcodeignore: pathspec.PathSpec, depth: int = 1) -> Iterator[str]:
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
            yield from walk_searchable(entry.path, relative, gitignore, mlplcodeignore, depth + 1)
        elif entry.is_file(follow_symlinks=False):
            yield relative

def read_if_text(path: str) -> str | None:
    """Give a file's text, or None for a file SEARCH skips: one READ would refuse, or unreadable."""
    try:
        return decode_text(read_bytes(path, path))
    except (PathRefused, OSError):
        return None

def lines_matching(relative: str, text: str, query: str) -> Iterator[Match]:
    """Yield the lines of one file's text that contain the query literally, numbered from 1."""
    for number, line in enumerate(text.split("\n"), start=1):
        if query in line:
            yield Match(relative, number, line)

def python_matches(root: str, query: str, gitignore: pathspec.PathSpec,
                   mlplcodeignore: pathspec.PathSpec, deadline: float) -> Iterator[Match]:
    """Search in pure Python, for machines without ripgrep; yields matches in path order.

    Raises SearchTimedOut when the deadline passes, checked before each file.
    """
    for relative in walk_searchable(root, "", gitignore, mlplcodeignore):
        if time.monotonic() > deadline:
            raise SearchTimedOut
        text = read_if_text(os.path.join(root, relative))
        if text is not None:
            yield from lines_matching(relative, text, query)

def ripgrep_command(root: str, query: str) -> list[str]:
    """Build the rg argv that searches exactly the files python_matches searches.

    rg's own ignore logic is switched off (--no-ignore, --hidden, --no-config) and
    replaced by ours: the root .gitignore and .mlplcodeignore as ignore files,
    .git and secret names as excluding globs. --text and --encoding none make rg
    report every file raw, so the binary rule is applied after, by decode_text.
    """
    command = ["rg", "--fixed-strings", "--line-number", "--no-heading", "--color", "never",
               "--null", "--text", "--encoding", "none", "--hidden", "--no-ignore",
               "--no-config", "--sort", "path", "--max-depth", str(SEARCH_MAX_DEPTH),
               "--max-filesize", str(READ_CAP_BYTES), "--iglob", "!.git"]
    command += [f"--iglob=!{pattern}" for pattern in SECRET_NAME_PATTERNS]
    for name in (".gitignore", ".mlplcodeignore"):
        if os.path.isfile(os.path.join(root, name)):
            command += ["--ignore-file", name]
    return command + ["--regexp", query, "."]

def parse_ripgrep_line(raw: bytes) -> Match:
    """Split one line of `rg --null` output, `./path NUL number : text`, into a Match."""
    path, _, rest = raw.removesuffix(b"\n").partition(b"\0")
    number, _, text = rest.partition(b":")
    return Match(os.fsdecode(path).removeprefix("./"), int(number),
                 text.decode("utf-8", "replace"))

def ripgrep_matches(root: str, query: str, deadline: float) -> Iterator[Match]:
    """Search with ripgrep, dropping the files that python_matches would skip as not text.

    rg is killed when the caller stops reading, so a capped search ends early,
    and when the deadline passes, which raises SearchTimedOut.
    """
    with subprocess.Popen(ripgrep_command(root, query), cwd=root, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as rg:
        alarm = threading.Timer(max(0.0, deadline - time.monotonic()), rg.kill)
        alarm.start()
        try:
            current, is_text = None, False
            for raw in rg.stdout:
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

def first_files(matches: Iterator[Match]) -> tuple[list[Match], str]:
    """Keep the matches of the first SEARCH_MAX_FILES files; say why the search stopped early.

    The reason is "" when it ran to the end, else a phrase for the summary line:
    stopping at the file cap or the deadline bounds the time and memory of a
    search for a common word.
    """
    kept: list[Match] = []
    files: set[str] = set()
    try:
        for match in matches:
            if match.path not in files:
                if len(files) == SEARCH_MAX_FILES:
                    return kept, f"more files match after the first {SEARCH_MAX_FILES}"
                files.add(match.path)
            kept.append(match)
    except SearchTimedOut:
        return kept, f"the search stopped after {SEARCH_SECONDS:g} s"
    return kept, ""

def format_matches(query: str, matches: list[Match], stopped: str) -> str:
    """Render at most SEARCH_MAX_MATCHES matches as `path:line: text`.

    Long lines are cut, and a final line says how much was left out, so the
    model knows its answer is partial and can narrow the query.
    """
    if not matches and not stopped:
        return f"no matches for {query!r}"
    lines = [f"{match.path}:{match.line_number}: {match.text[:SEARCH_LINE_CHARS]}"
             for match in matches[:SEARCH_MAX_MATCHES]]
    cut = matches[SEARCH_MAX_MATCHES:]
    if cut:
        files = len({match.path for match in cut})
        stopped = f"; {stopped}" if stopped else ""
        lines.append(f"[... {len(cut)} more matches in {files} file(s) cut{stopped};"
                     " narrow the query]")
    elif stopped:
        lines.append(f"[... {stopped}; narrow the query]")
    return "\n".join(lines)

def search_files(action: dict, root: str) -> dict:
    """SEARCH: find a literal string in the project's text files, with ripgrep when installed.

    Refuses an empty query and one holding a newline or NUL: matches are within one line.
    """
    query = action["query"]
    if not query or "\n" in query or "\0" in query:
        return failure("the query must be non-empty text on one line;"
                       " SEARCH matches within a line")
    real_root = os.path.realpath(root)
    # Loaded for both backends, so a broken rules file is refused either way.
    gitignore = load_ignore_rules(real_root, ".gitignore")
    mlplcodeignore = load_ignore_rules(real_root, ".mlplcodeignore")
    deadline = time.monotonic() + SEARCH_SECONDS
    if shutil.which("rg"):
        found = ripgrep_matches(real_root, query, deadline)
    else:
        found = python_matches(real_root, query, gitignore, mlplcodeignore, deadline)
    with contextlib.closing(found):
        matches, stopped = first_files(found)
    return observation(format_matches(query, matches, stopped))

def write_atomically(path: str, content: str) -> None:
    """Replace a file's content so that a crash leaves either the old file or the new one.

    The temporary file sits in the same directory, since os.replace is atomic only
    within one file system, and is removed if anything fails. The old file's mode
    is kept; a new file gets 0644.
    """
    mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else 0o644
    descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".mlplcode-",
                                             suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise

# The agent's own files: the user's list of what it may not see, and its policy files.
AGENT_FILES = (".mlplcodeignore", ".mlplcode")


def writable_path(root: str, shown: str) -> str:
    """Resolve a path for WRITE or PATCH.

    Besides what resolve_path refuses, refuses a directory, a file that is not
    regular or has other names, and the agent's own files: the agent may not
    unhide what the user hid from it, nor change its own policy.
    """
    path = resolve_path(root, shown)
    relative = os.path.relpath(path, os.path.realpath(root)).replace(os.sep, "/")
    if relative.split("/")[0].casefold() in AGENT_FILES:
        raise PathRefused(f"{shown}: {relative.split('/')[0]} holds the agent's own rules;"
                          " the agent may not change it")
    if os.path.lexists(path):
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            raise PathRefused(f"{shown}: is a directory; WRITE and PATCH take a file path")
        check_regular(info, shown)
    return path

WRITE_CAP_BYTES = READ_CAP_BYTES


def check_size(content: str, shown: str) -> None:
    """Refuse content over the write cap: what the agent writes, it must be able to READ back."""
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > WRITE_CAP_BYTES:
        raise PathRefused(f"{shown}: {size} bytes is over the write cap of {WRITE_CAP_BYTES}"
                          " bytes; split the file")

def write_file(action: dict, root: str) -> dict:
    """WRITE: create or replace a whole file, making missing parent directories.

    The parents are inside the root because the resolved path is.
    """
    shown, content = action["path"], action["content"]
    path = writable_path(root, shown)
    check_size(content, shown)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, content)
    return observation(f"wrote {shown} ({count_lines(content)} lines)")

def line_number(text: str, index: int) -> int:
    """Give the 1-based number of the line on which a character index of text falls."""
    return text.count("\n", 0, index) + 1

def occurrences(text: str, old: str) -> list[int]:
    """Give every index where OLD starts in text; overlapping ones count, as each is a candidate."""
    starts = []
    index = text.find(old)
    while index != -1:
        starts.append(index)
        index = text.find(old, index + 1)
    return starts

def closest_window(lines: list[str], old_lines: list[str]) -> int:
    """Give the start of the run of len(old_lines) lines most similar to OLD.

    Windows are compared as text, so a line with one wrong character still
    counts as close; the first of equally close windows wins.
    """
    size = len(old_lines)
    matcher = difflib.SequenceMatcher(b="\n".join(old_lines))  # OLD is analysed once

    def similarity(start: int) -> float:
        """Score one window against OLD, from 0 (nothing alike) to 1 (equal)."""
        matcher.set_seq1("\n".join(lines[start:start + size]))
        return matcher.ratio()

    return max(range(max(1, len(lines) - size + 1)), key=similarity)

def not_found_message(shown: str, text: str, old: str) -> str:
    """Explain a missed OLD and show the most similar lines, numbered, for the model to copy."""
    lines = text.split("\n")
    old_lines = old.removesuffix("\n").split("\n")
    start = closest_window(lines, old_lines)
    window = lines[start:start + len(old_lines)]
    numbered = "\n".join(f"{start + offset + 1:>5} | {line}" for offset, line in enumerate(window))
    return (f"OLD was not found in {shown}. The most similar lines are:\n{numbered}\n"
            "Copy OLD exactly from the file, whitespace included, or READ it again.")

def ambiguous_message(shown: str, text: str, starts: list[int]) -> str:
    """Say how often and on which lines OLD occurs; the first 20 lines are enough to locate it."""
    numbers = [str(line_number(text, start)) for start in starts]
    listed = ", ".join(numbers[:20]) + (", ..." if len(numbers) > 20 else "")
    return (f"OLD occurs {len(starts)} times in {shown}, at lines {listed};"
            " include more surrounding lines in OLD so it occurs once")

def patch_file(action: dict, root: str) -> dict:
    """PATCH: replace the one occurrence of OLD with NEW, written atomically like WRITE.

    Refuses an empty OLD, a missing OLD (showing the closest lines) and an OLD
    that occurs more than once (saying where): a guessed edit is worse than none.
    """
    shown, old, new = action["path"], action["old"], action["new"]
    path = writable_path(root, shown)
    text = read_text(path, shown)
    if not old:
        return failure(f"OLD is empty; copy the lines to replace from {shown}")
    starts = occurrences(text, old)
    if not starts:
        return failure(not_found_message(shown, text, old))
    if len(starts) > 1:
        return failure(ambiguous_message(shown, text, starts))
    start = starts[0]
    patched = text[:start] + new + text[start + len(old):]
    check_size(patched, shown)
    write_atomically(path, patched)
    first, last = line_number(text, start), line_number(text, start + len(old) - 1)
    return observation(f"patched {shown}: replaced lines {first}-{last}")

# A word that is a shell operator (&&, |, ;, >, 2>&1, ...) or holds a substitution.
SHELL_SYNTAX = re.compile(r"^\d*[<>|&;]|\$\(|`")
PYTEST_PREFIXES = (["pytest"], ["python", "-m", "pytest"], ["python3", "-m", "pytest"])
GIT_SUBCOMMANDS = ("status", "diff")


class CommandRefused(Exception):
    """A RUN command is not on the allow-list; the message says which word and why."""

NUMBER = re.compile(r"\d{1,4}")
TRACEBACKS = re.compile(r"auto|long|short|line|native|no")
EXPRESSION = re.compile(r"[^-].*", re.DOTALL)
PYTEST_OPTIONS = {
    "-q": None, "-qq": None, "-v": None, "-vv": None, "-x": None, "-s": None, "-l": None,
    "--lf": None, "--last-failed": None, "--ff": None, "--failed-first": None,
    "--showlocals": None, "-k": EXPRESSION, "-m": EXPRESSION, "--maxfail": NUMBER,
    "--tb": TRACEBACKS, "--durations": NUMBER,
}
GIT_OPTIONS = {
    "status": {"-s": None, "--short": None, "-b": None, "--branch": None, "--long": None,
               "--porcelain": None, "-uno": None, "-unormal": None, "-uall": None},
    "diff": {"--stat": None, "--numstat": None, "--shortstat": None, "--name-only": None,
             "--name-status": None, "--cached": None, "--staged": None, "--no-color": None,
             "-w": None, "--ignore-all-space": None, "-R": None, "--check": None,
             "-U": NUMBER, "--unified": NUMBER},
}
REVISION = re.compile(r"(?:HEAD|[0-9a-f]{4,40})(?:[~^]\d*)*"
                      r"(?:\.\.\.?(?:HEAD|[0-9a-f]{4,40})(?:[~^]\d*)*)?")

def split_options(words: list[str], allowed: dict) -> list[str]:
    """Check each option in WORDS against ALLOWED and give the other words, the operands.

    An option is allowed only if it is listed; one that takes a value (a pattern in
    ALLOWED) takes it as --name=value or as the next word, and the value must match.
    Everything after -- is an operand. Raises CommandRefused naming the first
    word that is not allowed.
    """
    operands, index = [], 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            return operands + words[index:]
        if not word.startswith("-") or word == "-":
            operands.append(word)
            continue
        name, equals, value = word.partition("=")
        if name not in allowed:
            raise CommandRefused(f"option {name} is not allowed; allowed: {' '.join(allowed)}")
        pattern = allowed[name]
        if pattern is None and equals:
            raise CommandRefused(f"option {name} takes no value")
        if pattern is not None and not equals:
            if index == len(words):
                raise CommandRefused(f"option {name} needs a value")
            value, index = words[index], index + 1
        if pattern is not None and not pattern.fullmatch(value):
            raise CommandRefused(f"{value!r} is not a value {name} accepts")
    return operands

def parse_command(command: str) -> tuple[str, list[str], list[str]]:
    """Split a RUN command and check it word by word: (kind, argv, paths).

    kind is "run" for pytest and "git" for git status or diff; paths are the
    operands that name files, for the tools to check like any other path.
    Raises CommandRefused for anything written for a shell, any other
    program or subcommand, and any option not on the allow-list.
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        raise CommandRefused("cannot be split into words (an unclosed quote?)") from None
    if any(SHELL_SYNTAX.search(word) for word in argv):
        raise CommandRefused("holds shell syntax; there is no shell, so send one plain command")
    for prefix in PYTEST_PREFIXES:
        if argv[:len(prefix)] == prefix:
            operands = split_options(argv[len(prefix):], PYTEST_OPTIONS)
            return "run", argv, [operand.split("::")[0] for operand in operands]
    if argv[:1] == ["git"] and argv[1:2] and argv[1] in GIT_SUBCOMMANDS:
        operands = split_options(argv[2:], GIT_OPTIONS[argv[1]])
        return "git", argv, [word for word in operands if not REVISION.fullmatch(word)]
    raise CommandRefused("not an allowed program; RUN accepts pytest, python -m pytest,"
                         " git status, git diff")

def command_refusal(command: str) -> str:
    """Why RUN refuses a command, or "" when the command is allowed."""
    try:
        parse_command(command)
    except CommandRefused as refusal:
        return str(refusal)
    return ""


def classify_command(command: str) -> str:
    """The kind of a RUN command for the policy: "run", "git", or "shell" for anything refused."""
    return "shell" if command_refusal(command) else parse_command(command)[0]

def program_argv(kind: str, argv: list[str]) -> list[str]:
    """Give the argv actually started: pytest under this very Python, git without a pager."""
    if kind == "run":
        arguments = argv[1:] if argv[0] == "pytest" else argv[3:]
        return [sys.executable, "-P", "-m", "pytest", *arguments]
    subcommand, arguments = argv[1], argv[2:]
    safety = ["--no-ext-diff", "--no-textconv"] if subcommand == "diff" else []
    return ["git", "--no-pager", "-c", "core.fsmonitor=false", subcommand, *safety, *arguments]

# Repository settings that make git status or diff run a program or read another repository.
RISKY_GIT_SETTINGS = re.compile(r"filter\.|include\.|includeif\.|core\.worktree|core\.fsmonitor"
                                r"|diff\.external|diff\..*\.(command|textconv)|core\.pager")


def risky_git_settings(root: str, environment: dict) -> list[str]:
    """The settings of the repository at root that git status or diff could act on."""
    listed = subprocess.run(["git", "config", "--local", "--name-only", "--list"], cwd=root,
                            env=environment, stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, errors="replace", timeout=10)
    return [name for name in listed.stdout.split() if RISKY_GIT_SETTINGS.match(name)]

RUN_TIMEOUT_SECONDS = 120
OUTPUT_HEAD_BYTES = 4000
OUTPUT_TAIL_BYTES = 4000
POLL_SECONDS = 0.05


@dataclass
class Output:
    """What a program printed: the first and last bytes, and how many bytes in all."""

    head: bytes = b""
    tail: bytes = b""
    total: int = 0

def drain(process: subprocess.Popen, deadline: float) -> Output | None:
    """Read the program's output to its end, keeping its head and tail; None at the deadline.

    Memory stays bounded whatever the program prints. Once the program has exited,
    what is left of its process group is killed, so that a child it left running
    cannot hold the output open, or go on at all.
    """
    output, pipe = Output(), process.stdout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            kill_group(process)
        if not select.select([pipe], [], [], POLL_SECONDS)[0]:
            continue
        chunk = os.read(pipe.fileno(), 65536)
        if not chunk:
            return output
        output.total += len(chunk)
        room = max(0, OUTPUT_HEAD_BYTES - len(output.head))
        output.head += chunk[:room]
        output.tail = (output.tail + chunk[room:])[-OUTPUT_TAIL_BYTES:]
    return None


def kill_group(process: subprocess.Popen) -> None:
    """Kill every process of the program's group; the group may already be gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)

def secret_paths(root: str) -> list[str]:
    """Every file and directory in the root whose name marks it secret, symlinks aside.

    .git is not walked: it is read-only in the sandbox, and large.
    """
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if name.casefold() != ".git"]
        for name in subdirectories + files:
            path = os.path.join(directory, name)
            if is_secret_name(name) and not os.path.islink(path):
                found.append(path)
        subdirectories[:] = [name for name in subdirectories if not is_secret_name(name)]
    return found


def planted_secrets(paths: list[str]) -> set[str]:
    """The values held in the root's secret files: each line, and what follows its = sign."""
    values = set()
    for path in paths:
        for line in (read_if_text(path) or "").splitlines():
            for value in (line, line.partition("=")[2]):
                value = value.strip().strip("'\"")
                if len(value) >= 6:
                    values.add(value)
    return values


def protected_paths(root: str) -> list[str]:
    """What a sandboxed program may read but not change: .git and the agent's own files."""
    names = (".git", *AGENT_FILES)
    return [os.path.join(root, name) for name in names if os.path.exists(os.path.join(root, name))]

def run_process(argv: list[str], root: str, bwrap: str | None) -> tuple[int, Output] | None:
    """Run argv in the root without a shell; give (exit code, output), or None on timeout.

    With bubblewrap, the program runs in its sandbox (chapter "Trust"); either way it
    gets the allow-listed environment, a fresh HOME, rlimits, /dev/null as stdin, and
    a new session whose whole process group is killed on timeout.
    """
    deadline = time.monotonic() + RUN_TIMEOUT_SECONDS
    with tempfile.TemporaryDirectory(prefix="mlplcode-run-") as scratch:
        home = "/tmp" if bwrap else scratch
        if bwrap:
            empty = os.path.join(scratch, "empty")
            open(empty, "w").close()
            argv = sandbox_argv(bwrap, argv, root, protected_paths(root), secret_paths(root), empty)
        with subprocess.Popen(argv, cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=child_environment(root, home),
                              start_new_session=True, preexec_fn=limit_resources) as process:
            output = drain(process, deadline)
            kill_group(process)
            if output is None:
                return None
    return process.returncode, output

PYTEST_FAILURE_SUMMARY = re.compile(r"\b\d+ (failed|errors?)\b")


def pytest_passed(exit_code: int, output: str) -> bool:
    """Say whether a pytest run passed: exit code 0 and a final summary without failures.

    The summary is checked too in case a plugin or conftest forces exit code 0.
    """
    lines = output.strip().splitlines()
    return exit_code == 0 and not (lines and PYTEST_FAILURE_SUMMARY.search(lines[-1]))

TIMING = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?")


def steady_output(output: str, root: str) -> str:
    """Output that reads the same on every run of the same test: the root shown as ".",
    and pytest's timings dropped, so that a replay reproduces the journal exactly."""
    return TIMING.sub("", output.replace(os.path.realpath(root), "."))

def show_output(output: Output, root: str) -> str:
    """The output as text for the model: head and tail made steady, and how many bytes were cut."""
    head, tail = (steady_output(part.decode("utf-8", "replace"), root)
                  for part in (output.head, output.tail))
    cut = output.total - len(output.head) - len(output.tail)
    return f"{head}\n[... {cut} bytes cut ...]\n{tail}" if cut else head + tail

def run_command(action: dict, root: str) -> dict:
    """RUN: run pytest or git status/diff in the root; report the exit code and capped output.

    Refuses every other program, option and path, and anything written for a shell,
    before anything starts. A non-zero exit code is a result, not a tool failure.
    """
    try:
        kind, argv, paths = parse_command(action["command"])
    except CommandRefused as refusal:
        return failure(str(refusal))
    for path in paths:
        resolve_path(root, path)
    bwrap = find_bubblewrap(root)
    mode = "sandboxed" if bwrap else "unsandboxed"
    if kind == "git":
        risky = risky_git_settings(root, child_environment(root, root))
        if risky:
            return failure(f"the repository sets {', '.join(risky)}, which git status or diff"
                           " could act on; RUN git is refused in this repository")
    result = run_process(program_argv(kind, argv), root, bwrap)
    if result is None:
        return failure(f"timed out after {RUN_TIMEOUT_SECONDS:g} s and was killed ({mode});"
                       " run fewer tests (one file, -x) or fix what hangs")
    exit_code, output = result[0], show_output(result[1], root)
    fields = {"exit_code": exit_code, "kind": kind, "sandboxed": bwrap is not None}
    if kind == "run":
        fields["passed"] = pytest_passed(exit_code, output)
    return observation(f"exit code {exit_code} ({mode})\n{output}", **fields)

def check_action(action: dict, root: str) -> str | None:
    """The refusal the tools would give an action's paths, found before anyone is asked.

    The same functions judge the paths here and again when the tool runs: READ's
    path, WRITE's and PATCH's target and size, RUN's path operands. Gives the
    ERROR text, or None when the tools will not refuse on these grounds.
    """
    tool = action.get("tool")
    try:
        if tool == "read":
            path = resolve_path(root, action["path"])
            if os.path.lexists(path):
                check_regular(os.lstat(path), action["path"])
        elif tool in ("write", "patch"):
            writable_path(root, action["path"])
            if tool == "write":
                check_size(action["content"], action["path"])
        elif tool == "run" and classify_command(action["command"]) != "shell":
            for path in parse_command(action["command"])[2]:
                resolve_path(root, path)
    except PathRefused as refusal:
        return f"ERROR: {refusal}"
    except OSError:
        return None
    return None

def fingerprint(action: dict, root: str) -> dict:
    """What an approval is bound to besides the action's text: the state of its target.

    For WRITE and PATCH, the file the path leads to now: where it really is, whether
    the path is a link, and the kind, size, link count and SHA-256 of what is there.
    For RUN, the command's words and whether it would be sandboxed. Taken when the
    human is asked and again just before the action runs; any difference refuses it.
    """
    if action["tool"] == "run":
        words = shlex.split(action["command"])
        return {"argv": words, "sandboxed": find_bubblewrap(root) is not None}
    real_root = os.path.realpath(root)
    written = os.path.join(real_root, action["path"])
    real = os.path.realpath(written)
    target = {"path": os.path.relpath(real, real_root), "link": os.path.islink(written)}
    try:
        info = os.lstat(real)
    except OSError:
        return {**target, "exists": False}
    target.update(kind=kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else "file",
                  size=info.st_size, links=info.st_nlink)
    if stat.S_ISREG(info.st_mode):
        with open(real, "rb") as file:
            target["sha256"] = hashlib.sha256(file.read(READ_CAP_BYTES + 1)).hexdigest()
    return target

TOOLS = {"read": read_file, "search": search_files, "write": write_file,
         "patch": patch_file, "run": run_command}
REQUIRED_FIELDS = {"read": ("path",), "search": ("query",), "write": ("path", "content"),
                   "patch": ("path", "old", "new"), "run": ("command",)}


def execute(action: dict, root: str) -> dict:
    """Carry out one action in the project at root and give back its observation.

    Refuses unknown tools and actions missing a text field, and turns what the
    tools raise (refused paths, OS errors, text that cannot be encoded) into
    ERROR observations: the loop must go on and the model must learn why.
    """
    name = action.get("tool")
    if not isinstance(name, str) or name not in TOOLS:
        return failure(f"unknown tool {name!r}; use one of {', '.join(TOOLS)}")
    missing = [field for field in REQUIRED_FIELDS[name] if not isinstance(action.get(field), str)]
    if missing:
        return failure(f"{name} needs the text field(s) {', '.join(missing)}")
    try:
        result = TOOLS[name](action, root)
    except PathRefused as refusal:
        result = failure(str(refusal))
    except (OSError, UnicodeError) as problem:
        result = failure(f"{name} failed: {problem}; check the path or content and try again")
    secrets = environment_secrets() | planted_secrets(secret_paths(os.path.realpath(root)))
    return {**result, "text": redact(result["text"], secrets)}
