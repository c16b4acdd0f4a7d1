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
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pathspec

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

    Case is ignored: .ENV is as secret as .env, and some file systems agree.
    """
    folded = name.casefold()
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

def resolve_path(root: str, path: str) -> str:
    """Turn a path from the model into the real absolute path it names inside the root.

    Symlinks are resolved before any rule is applied, so a link can neither lead
    out of the root nor give a harmless name to a protected file. Refuses empty,
    NUL-containing and absolute paths, paths that leave the root, and paths that
    denial_reason denies.
    """
    if not path or "\0" in path:
        raise PathRefused(f"{path!r}: not a usable path;"
                          " give a file path relative to the project root")
    if os.path.isabs(path):
        raise PathRefused(f"{path}: absolute paths are refused;"
                          " give a path relative to the project root")
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(real_root, path))
    if os.path.commonpath([real_root, target]) != real_root:
        raise PathRefused(f"{path}: leaves the project root; use a path inside the project")
    relative = os.path.relpath(target, real_root).replace(os.sep, "/")
    reason = denial_reason(relative, load_ignore_rules(real_root, ".mlplcodeignore"))
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

def read_text(path: str, shown: str) -> str:
    """Read a resolved file as text, for READ and PATCH.

    Refuses missing files, directories and other non-regular files, files over
    READ_CAP_BYTES and binary files, each with a hint of what to do instead.
    """
    if not os.path.exists(path):
        raise PathRefused(f"{shown}: no such file; use SEARCH to find the right path")
    if not os.path.isfile(path):
        raise PathRefused(f"{shown}: not a regular file; READ and PATCH take a text file")
    size = os.path.getsize(path)
    if size > READ_CAP_BYTES:
        raise PathRefused(f"{shown}: {size} bytes is over the read cap of {READ_CAP_BYTES} bytes;"
                          " use SEARCH to find the lines you need")
    with open(path, "rb") as file:
        text = decode_text(file.read())
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


@dataclass(frozen=True)
class Match:
    """One line that contains the query: which file, which line, what it says."""

    path: str
    line_number: int
    text: str

def walk_searchable(directory: str, relative_dir: str, gitignore: pathspec.PathSpec,
                    mlplcodeignore: pathspec.PathSpec) -> Iterator[str]:
    """Yield the relative paths of the files SEARCH may look at, in path order.

    Entries are visited sorted by name, depth first: the order of `rg --sort
    path`, so both backends stop at the same file when the file cap is reached.
    Only real files and directories are taken, never symlinks (ripgrep skips
    them too), so no link leads the search out of the root. Denied and
    gitignored paths are pruned with everything under them.
    """
    for entry in sorted(os.scandir(directory), key=lambda entry: entry.name):
        is_dir = entry.is_dir(follow_symlinks=False)
        relative = relative_dir + entry.name + ("/" if is_dir else "")
        if denial_reason(relative, mlplcodeignore) or gitignore.match_file(relative):
            continue
        if is_dir:
            yield from walk_searchable(entry.path, relative, gitignore, mlplcodeignore)
        elif entry.is_file(follow_symlinks=False):
            yield relative

def read_if_text(path: str) -> str | None:
    """Give a file's text, or None for a file SEARCH skips: binary, not UTF-8 or unreadable."""
    try:
        with open(path, "rb") as file:
            return decode_text(file.read())
    except OSError:
        return None

def lines_matching(relative: str, text: str, query: str) -> Iterator[Match]:
    """Yield the lines of one file's text that contain the query literally, numbered from 1."""
    for number, line in enumerate(text.split("\n"), start=1):
        if query in line:
            yield Match(relative, number, line)

def python_matches(root: str, query: str, gitignore: pathspec.PathSpec,
                   mlplcodeignore: pathspec.PathSpec) -> Iterator[Match]:
    """Search in pure Python, for machines without ripgrep; yields matches in path order."""
    for relative in walk_searchable(root, "", gitignore, mlplcodeignore):
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
               "--no-config", "--sort", "path", "--iglob", "!.git"]
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

def ripgrep_matches(root: str, query: str) -> Iterator[Match]:
    """Search with ripgrep, dropping the files that python_matches would skip as not text.

    rg is killed when the caller stops reading, so a capped search ends early.
    """
    with subprocess.Popen(ripgrep_command(root, query), cwd=root, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as rg:
        try:
            current, is_text = None, False
            for raw in rg.stdout:
                match = parse_ripgrep_line(raw)
                if match.path != current:
                    current = match.path
                    is_text = read_if_text(os.path.join(root, current)) is not None
                if is_text:
                    yield match
        finally:
            rg.kill()

def first_files(matches: Iterator[Match]) -> tuple[list[Match], bool]:
    """Keep the matches of the first SEARCH_MAX_FILES files, and say whether more files matched.

    Stopping there bounds the time and memory of a search for a common word.
    """
    kept: list[Match] = []
    files: set[str] = set()
    for match in matches:
        if match.path not in files:
            if len(files) == SEARCH_MAX_FILES:
                return kept, True
            files.add(match.path)
        kept.append(match)
    return kept, False

def format_matches(query: str, matches: list[Match], more_files: bool) -> str:
    """Render at most SEARCH_MAX_MATCHES matches as `path:line: text`.

    Long lines are cut, and a final line says how much was left out, so the
    model knows its answer is partial and can narrow the query.
    """
    if not matches:
        return f"no matches for {query!r}"
    lines = [f"{match.path}:{match.line_number}: {match.text[:SEARCH_LINE_CHARS]}"
             for match in matches[:SEARCH_MAX_MATCHES]]
    cut = matches[SEARCH_MAX_MATCHES:]
    if cut:
        files = len({match.path for match in cut})
        stopped = f"; more files match after the first {SEARCH_MAX_FILES}" if more_files else ""
        lines.append(f"[... {len(cut)} more matches in {files} file(s) cut{stopped};"
                     " narrow the query]")
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
    if shutil.which("rg"):
        found = ripgrep_matches(real_root, query)
    else:
        found = python_matches(real_root, query, gitignore, mlplcodeignore)
    with contextlib.closing(found):
        matches, more_files = first_files(found)
    return observation(format_matches(query, matches, more_files))

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

def writable_path(root: str, shown: str) -> str:
    """Resolve a path for WRITE or PATCH.

    Besides what resolve_path refuses, refuses a directory and .mlplcodeignore:
    the agent may not unhide what the user hid from it.
    """
    path = resolve_path(root, shown)
    if os.path.isdir(path):
        raise PathRefused(f"{shown}: is a directory; WRITE and PATCH take a file path")
    if path == os.path.join(os.path.realpath(root), ".mlplcodeignore"):
        raise PathRefused(f"{shown}: .mlplcodeignore is the user's list of hidden files;"
                          " the agent may not change it")
    return path

def write_file(action: dict, root: str) -> dict:
    """WRITE: create or replace a whole file, making missing parent directories.

    The parents are inside the root because the resolved path is.
    """
    shown, content = action["path"], action["content"]
    path = writable_path(root, shown)
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
    write_atomically(path, text[:start] + new + text[start + len(old):])
    first, last = line_number(text, start), line_number(text, start + len(old) - 1)
    return observation(f"patched {shown}: replaced lines {first}-{last}")

# A word that is a shell operator (&&, |, ;, >, 2>&1, ...) or holds a substitution.
SHELL_SYNTAX = re.compile(r"^\d*[<>|&;]|\$\(|`")
PYTEST_PREFIXES = (["pytest"], ["python", "-m", "pytest"], ["python3", "-m", "pytest"])
GIT_PREFIXES = (["git", "status"], ["git", "diff"])


def classify_command(command: str) -> tuple[str, list[str]]:
    """Sort a RUN command into "run" (pytest), "git" (status or diff) or "shell" (all else).

    No command ever reaches a shell, so one written for a shell (an operator or a
    $( substitution as a word) is classed "shell" and refused, not run half-way.
    A command shlex cannot split is ("shell", []).
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        return "shell", []
    if any(SHELL_SYNTAX.search(word) for word in argv):
        return "shell", argv
    if any(argv[:len(prefix)] == prefix for prefix in PYTEST_PREFIXES):
        return "run", argv
    if argv[:2] in GIT_PREFIXES:
        return "git", argv
    return "shell", argv

def program_argv(kind: str, argv: list[str]) -> list[str]:
    """Give the argv actually started: pytest under this very Python, git without a pager."""
    if kind == "run":
        arguments = argv[1:] if argv[0] == "pytest" else argv[3:]
        return [sys.executable, "-m", "pytest", *arguments]
    return ["git", "--no-pager", *argv[1:]]

SECRET_VARIABLE_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
# Secrets whose names the suffix and API_KEY rules miss.
SECRET_VARIABLES = frozenset({"AWS_ACCESS_KEY_ID", "PGPASSWORD", "MYSQL_PWD"})


def is_secret_variable(name: str) -> bool:
    """Say whether an environment variable's name marks it as a secret, ignoring case."""
    upper = name.upper()
    return (upper in SECRET_VARIABLES or upper.endswith(SECRET_VARIABLE_SUFFIXES)
            or "API_KEY" in upper)

def child_environment() -> dict[str, str]:
    """Give the parent's environment minus secrets: tests and git need PATH and HOME, not keys."""
    return {name: value for name, value in os.environ.items() if not is_secret_variable(name)}

RUN_TIMEOUT_SECONDS = 120
OUTPUT_HEAD_CHARS = 4000
OUTPUT_TAIL_CHARS = 4000


def cap_output(output: str) -> str:
    """Keep the head and tail of long output: the start says what ran, the end how it ended."""
    cut = len(output) - OUTPUT_HEAD_CHARS - OUTPUT_TAIL_CHARS
    if cut <= 0:
        return output
    return (f"{output[:OUTPUT_HEAD_CHARS]}\n[... {cut} characters cut ...]\n"
            f"{output[-OUTPUT_TAIL_CHARS:]}")

def run_process(argv: list[str], root: str) -> tuple[int, str] | None:
    """Run argv in the root without a shell; give (exit code, output), or None on timeout.

    The child leads a new session, so on timeout its whole process group,
    grandchildren included, is killed. Its stdin is /dev/null so a prompt cannot
    hang it, stderr is merged into stdout, and no secret is in its environment.
    """
    with subprocess.Popen(argv, cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=child_environment(),
                          start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            return None
    return process.returncode, output.decode("utf-8", errors="replace")

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

def run_command(action: dict, root: str) -> dict:
    """RUN: run pytest or git status/diff in the root; report the exit code and capped output.

    Refuses every other program, and anything written for a shell, before
    anything starts. A non-zero exit code is a result, not a tool failure.
    """
    kind, argv = classify_command(action["command"])
    if kind == "shell":
        return failure("not an allowed program; RUN accepts pytest, python -m pytest,"
                       " git status, git diff")
    result = run_process(program_argv(kind, argv), root)
    if result is None:
        return failure(f"timed out after {RUN_TIMEOUT_SECONDS:g} s and was killed;"
                       " run fewer tests (one file, -x) or fix what hangs")
    exit_code, output = result[0], steady_output(result[1], root)
    fields = {"exit_code": exit_code, "kind": kind}
    if kind == "run":
        fields["passed"] = pytest_passed(exit_code, output)
    return observation(f"exit code {exit_code}\n{cap_output(output)}", **fields)

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
        return TOOLS[name](action, root)
    except PathRefused as refusal:
        return failure(str(refusal))
    except (OSError, UnicodeError) as problem:
        return failure(f"{name} failed: {problem}; check the path or content and try again")
