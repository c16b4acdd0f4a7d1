"""Running programs: pytest or git, without a shell, bounded in time and output."""

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from ..commands import CommandRefused, parse_command, program_argv
from ..trust import (
    child_environment,
    inside,
    interpreter_directories,
    limit_resources,
    redact,
    sandbox_argv,
    socket_filter_descriptor,
)
from . import failure, observation
from .paths import ignore_rules, open_directory, resolve_path
from .write import AGENT_FILES, GIT_DIRECTORY_NAMES, GIT_FILES

def repository_settings(top: str, metadata) -> list[str]:
    """Every settings file git may read in the project: those of the repository of
    work tree TOP and of each repository among METADATA (survey's), with their
    submodules' and work trees'."""
    dot_gits = [os.path.join(top, ".git")] + [
        path for path in metadata if os.path.basename(path).casefold() == ".git"
    ]
    directories = {
        os.path.realpath(directory)
        for path in [*dot_gits, *metadata]
        for directory in [path, *repository_directories(os.path.dirname(path))]
    }
    return sorted(
        {
            path
            for directory in directories
            if os.path.isdir(directory)
            for path in settings_places(directory)
            if os.path.isfile(path)
        }
    )

# Settings that make git run a program, read other settings, or look at another
# directory.
RISKY_GIT_SETTINGS = re.compile(
    r"filter\.|include\.|includeif\.|core\.worktree|core\.fsmonitor"
    r"|core\.hookspath|diff\.external|diff\..*\.(command|textconv)|core\.pager"
    r"|pager\.|core\.(sshcommand|gitproxy|askpass|editor|alternaterefscommand)"
    r"|sequence\.editor|credential\.|gpg\.|alias\.|uploadpack\.|receivepack\."
    r"|remote\..*\.(uploadpack|receivepack)|merge\..*\.driver"
    r"|interactive\.difffilter|submodule\..*\.update"
)


UNREADABLE = "(unreadable)"


def risky_git_settings(git: str, files: list[str], environment: dict) -> list[str]:
    """The settings in FILES that git status or diff could act on, each named with its
    file; a file git cannot read is named too."""
    found = []
    for path in files:
        listed = subprocess.run(
            [git, "config", "--file", path, "--null", "--name-only", "--list"],
            env=environment,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=10,
        )
        names = listed.stdout.split("\0") if listed.returncode == 0 else [UNREADABLE]
        found += [
            f"{name} in {path}"
            for name in names
            if name == UNREADABLE or RISKY_GIT_SETTINGS.match(name)
        ]
    return found

def repository_of(root: str) -> str:
    """The work tree of the repository ROOT lies in: ROOT or the nearest directory above
    it that holds a .git; ROOT itself when none does."""
    directory = root
    while not os.path.lexists(os.path.join(directory, ".git")):
        if os.path.dirname(directory) == directory:
            return root
        directory = os.path.dirname(directory)
    return directory


def git_variables(top: str) -> dict:
    """The environment that points git at the repository of work tree TOP and no
    other."""
    return {
        "GIT_DIR": os.path.join(top, ".git"),
        "GIT_WORK_TREE": top,
        "GIT_CEILING_DIRECTORIES": os.path.dirname(top),
    }

def repository_directories(top: str) -> list[str]:
    """What git reads of the repository of work tree TOP: its .git and, when .git is a
    file that points elsewhere, the directory it names and that one's common directory.
    """
    dot_git = os.path.join(top, ".git")
    found = [dot_git]
    if os.path.isfile(dot_git) and not os.path.islink(dot_git):
        with open(dot_git, encoding="utf-8", errors="replace") as file:
            first = file.readline()
        if first.startswith("gitdir: "):
            found.append(
                os.path.realpath(os.path.join(top, first[len("gitdir: ") :].strip()))
            )
            common = os.path.join(found[-1], "commondir")
            if os.path.isfile(common):
                with open(common, encoding="utf-8", errors="replace") as file:
                    found.append(
                        os.path.realpath(os.path.join(found[-1], file.read().strip()))
                    )
    return [path for path in found if os.path.isdir(path) or path == dot_git]

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
    """Read the program's output to its end, keeping its head and tail; None at the
    deadline.

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

GIT_NAMES = (".git", *GIT_FILES)


def stamp(path: str) -> tuple:
    """What tells the file at PATH from another one put in its place: inode and kind."""
    info = os.lstat(path)
    return info.st_ino, stat.S_IFMT(info.st_mode)

def survey(root: str, rules, secret_files) -> tuple[list[str], dict]:
    """One walk of the root, links not followed: the paths to mask in the sandbox, and
    git's metadata with the stamp of each.

    Masked are SECRET_FILES, what RULES (.mlplcodeignore, or None) excludes, and the
    other names of any file among them. Git's metadata is every .git, .gitattributes
    and .gitmodules, and every directory that holds HEAD, objects and refs.
    """
    secret, masked, metadata, names, hidden = set(secret_files), [], {}, {}, set()
    pending = [(root, "", False)]
    while pending:
        directory, relative_dir, under_mask = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError:
            continue
        if GIT_DIRECTORY_NAMES <= {entry.name for entry in entries}:
            metadata[directory] = stamp(directory)
        for entry in entries:
            if entry.name.casefold() in GIT_NAMES:
                metadata[entry.path] = stamp(entry.path)
                continue
            if entry.is_symlink():
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            relative = relative_dir + entry.name + ("/" if is_dir else "")
            masks = not under_mask and (
                entry.path in secret or bool(rules and rules.match_file(relative))
            )
            if masks:
                masked.append(entry.path)
            if is_dir:
                pending.append((entry.path, relative, under_mask or masks))
            elif under_mask or masks:
                hidden.add(entry.inode())
            else:
                names.setdefault(entry.inode(), []).append(entry.path)
    return (
        masked + [path for inode in hidden for path in names.get(inode, [])],
        metadata,
    )

def remove_planted(root: str, before: dict) -> list[str]:
    """Remove git's metadata that is new since BEFORE, or not the same file: a .git or
    git file whole, the HEAD of a directory that became a repository. Gives what was
    removed.
    """
    removed = []
    for path, mark in sorted(survey(root, None, ())[1].items()):
        if before.get(path) == mark:
            continue
        if os.path.basename(path).casefold() not in GIT_NAMES:
            path = os.path.join(path, "HEAD")
        directory = open_directory(os.path.dirname(path))
        try:
            name = os.path.basename(path)
            if stat.S_ISDIR(
                os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode
            ):
                shutil.rmtree(name, dir_fd=directory)
            else:
                os.unlink(name, dir_fd=directory)
        finally:
            os.close(directory)
        removed.append(os.path.relpath(path, root))
    return removed

GIT_SETTINGS = ("config", "config.worktree")
NESTED_REPOSITORIES = ("modules", "worktrees")


def settings_places(directory: str) -> list[str]:
    """Where git looks for the settings of the git directory DIRECTORY and of the
    submodules and worktrees it holds, whether a file is there or not."""
    parents = [directory]
    for name in NESTED_REPOSITORIES:
        nested = os.path.join(directory, name)
        if os.path.isdir(nested) and not os.path.islink(nested):
            parents += [parent for parent, _, _ in os.walk(nested)]
    return [os.path.join(parent, name) for parent in parents for name in GIT_SETTINGS]


def git_settings(metadata) -> list[str]:
    """The settings files of the git directories among METADATA (paths), their
    submodules' and worktrees' included, links not followed: what a test may not
    read."""
    return [
        path
        for directory in metadata
        if os.path.isdir(directory) and not os.path.islink(directory)
        for path in settings_places(directory)
        if os.path.isfile(path) and not os.path.islink(path)
    ]

def protected_paths(root: str, metadata: dict) -> list[str]:
    """What a sandboxed program may read but not change: the agent's own files, git's
    metadata."""
    paths = [os.path.join(root, name) for name in AGENT_FILES] + sorted(metadata)
    return [
        path for path in paths if os.path.lexists(path) and not os.path.islink(path)
    ]

KILLED_SECONDS = 5


class SignalsHeld:
    """From now until release(), the signals that have a Python handler are noted, not
    handled; release() gives each handler back and hands on what came meanwhile."""

    def __init__(self):
        self.handlers, self.came = {}, []
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            for number in signal.valid_signals():
                if callable(signal.getsignal(number)):
                    self.handlers[number] = signal.signal(number, self.note)
        except BaseException:  # a signal not yet held raised: give back those that are
            self.release()
            raise

    def note(self, number, frame):
        self.came.append(number)

    def release(self):
        handlers, came = self.handlers, self.came
        self.handlers, self.came = {}, []
        for number, handler in handlers.items():
            signal.signal(number, handler)
        for number in came:
            handlers[number](number, None)


def run_process(
    argv: list[str],
    project,
    protected: list[str],
    masked: list[str],
    variables: dict,
    shown: list[str] = (),
    descriptors: tuple[int, ...] = (),
) -> tuple[int, Output] | None:
    """Run argv in the root without a shell; give (exit code, output), or None on
    timeout.

    With bubblewrap, the program runs in its sandbox (chapter "The sandbox and its
    limits"), PROTECTED paths read-only, MASKED ones emptied, and the directories
    SHOWN read-only beside the interpreter's; either way it gets the allow-listed
    environment and VARIABLES, the DESCRIPTORS, a fresh HOME, rlimits, /dev/null as
    stdin, and a new session whose whole process group is killed however run_process
    ends, an interrupt included.
    """
    deadline, root, bwrap = (
        time.monotonic() + RUN_TIMEOUT_SECONDS,
        project.root,
        project.programs["bwrap"],
    )
    with (
        tempfile.TemporaryDirectory(prefix="mlplcode-run-") as scratch,
        contextlib.ExitStack() as closing,
    ):
        home = "/tmp" if bwrap else scratch
        if bwrap:
            empty = os.path.join(scratch, "empty")
            open(empty, "w").close()
            socket_filter = socket_filter_descriptor()
            if socket_filter is not None:
                closing.callback(os.close, socket_filter)
                descriptors = (*descriptors, socket_filter)
            readable = [*interpreter_directories(), *shown]
            argv = sandbox_argv(
                bwrap, argv, root, readable, protected, masked, empty, socket_filter
            )
        held = SignalsHeld()
        try:
            process = subprocess.Popen(
                argv,
                cwd=root,
                pass_fds=descriptors,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**child_environment(root, home), **variables},
                start_new_session=True,
                preexec_fn=limit_resources,
            )
        except BaseException:
            held.release()
            raise
        with process:
            try:
                held.release()
                output = drain(process, deadline)
            finally:
                kill_group(process)
                drain(process, time.monotonic() + KILLED_SECONDS)
    return None if output is None else (process.returncode, output)

KEY_BYTES = 32
CHANNEL = "MLPLCODE_RESULTS"
PLUGIN_NAME = "mlplcode_results.py"
with open(os.path.join(os.path.dirname(__file__), "..", PLUGIN_NAME), "rb") as source:
    PLUGIN_TEXT = source.read()


def run_tests(
    argv: list[str], project, protected: list[str], masked: list[str], variables: dict
) -> tuple[int, Output, dict] | None:
    """run_process for pytest, with the channel that its plugin's record comes back by:
    (exit code, output, results judged from the record), or None on timeout."""
    key = secrets.token_bytes(KEY_BYTES)
    with tempfile.TemporaryDirectory(prefix="mlplcode-results-") as directory:
        plugin = os.path.join(directory, "plugin")
        os.mkdir(plugin)
        with open(os.path.join(plugin, PLUGIN_NAME), "wb") as file:
            file.write(PLUGIN_TEXT)
        key_read, key_write = os.pipe()
        os.write(key_write, key)
        os.close(key_write)
        path = os.path.join(directory, "record")
        record_write = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        record_read = os.open(path, os.O_RDONLY)
        os.unlink(path)
        try:
            try:
                result = run_process(
                    argv,
                    project,
                    protected,
                    masked,
                    {
                        **variables,
                        "PYTHONPATH": plugin,
                        CHANNEL: f"{key_read}:{record_write}",
                    },
                    shown=[plugin],
                    descriptors=(key_read, record_write),
                )
            finally:
                os.close(key_read)
                os.close(record_write)
            record = read_record(record_read, key)
        finally:
            os.close(record_read)
    if result is None:
        return None
    return (*result, judge_results(result[0], record, project.secret_values))

RECORD_BYTES = 1024 * 1024
NO_RECORD = "pytest did not finish its session: an exit, a crash or a deadline"
NOT_SIGNED = "what came back is not a record signed by mlplcode's plugin"


def read_record(descriptor: int, key: bytes) -> dict | str:
    """The record that the plugin signed with KEY, read from DESCRIPTOR, or why there is
    none, in words."""
    data = os.read(descriptor, RECORD_BYTES + 1)
    if not data:
        return NO_RECORD
    tag, _, payload = data.removesuffix(b"\n").partition(b" ")
    expected = hmac.new(key, payload, hashlib.sha256).hexdigest().encode()
    if data.count(b"\n") != 1 or not hmac.compare_digest(tag, expected):
        return NOT_SIGNED
    try:
        record = json.loads(payload)
    except (ValueError, RecursionError):
        return NOT_SIGNED
    return record if well_formed(record) else NOT_SIGNED

def well_formed(record) -> bool:
    """Whether RECORD has the fields of the plugin's record, each of its kind."""
    return (
        isinstance(record, dict)
        and isinstance(record.get("finished"), bool)
        and isinstance(record.get("counts"), dict)
        and all(
            isinstance(name, str) and type(count) is int
            for name, count in record["counts"].items()
        )
        and isinstance(record.get("failures"), list)
        and all(isinstance(name, str) for name in record["failures"])
        and isinstance(record.get("canaries"), list)
        and all(
            isinstance(canary, list)
            and len(canary) == 3
            and all(isinstance(word, str) for word in canary)
            for canary in record["canaries"]
        )
    )

OUTCOMES = ("failed", "passed", "skipped", "xfailed", "xpassed", "error", "unreported")
WORDS = {"error": ("error", "errors"), "unreported": ("never ran", "never ran")}
REQUIRED_CANARIES = ("function", "collector")
FAILED = ("failed", "error")


def counted(results: dict) -> str:
    """The counts of RESULTS in words, in the order of pytest's summary: "1 failed, 2
    passed"."""
    parts = []
    for outcome in OUTCOMES:
        if results[outcome]:
            one, many = WORDS.get(outcome, (outcome, outcome))
            parts.append(f"{results[outcome]} {many if results[outcome] > 1 else one}")
    return ", ".join(parts) or "no tests ran"


def refused(why: str) -> dict:
    """The judgement of a run whose record is not believed: nothing passed."""
    return {"passed": False, "results": None, "line": f"results: none ({why})"}


def judge_results(exit_code: int, record: dict | str, secret_values) -> dict:
    """What a test run's record says: {"passed": bool, "results": the counts and the
    failures' names, or None when nothing is believed, "line": the observation's}."""
    if isinstance(record, str):
        return refused(record)
    canaries = record["canaries"]
    wrong = [
        f"{kind} in {place} {outcome}" if place else f"{kind} {outcome}"
        for kind, place, outcome in canaries
        if outcome not in FAILED
    ]
    made = {kind for kind, _, _ in canaries}
    wrong += [f"{kind} never ran" for kind in REQUIRED_CANARIES if kind not in made]
    if wrong and record["finished"]:
        canaries = "the canaries" if len(wrong) > 1 else "the canary"
        return refused(f"{canaries} {', '.join(wrong)}: pytest was rewired")
    results = {outcome: record["counts"].get(outcome, 0) for outcome in OUTCOMES}
    results["failures"] = [redact(name, secret_values) for name in record["failures"]]
    passed = (
        exit_code == 0
        and record["finished"]
        and sum(results[outcome] for outcome in OUTCOMES) > 0
        and not (results["failed"] or results["error"] or results["unreported"])
    )
    stopped = "" if record["finished"] else "; pytest stopped before the end"
    return {
        "passed": passed,
        "results": results,
        "line": f"results: {counted(results)}{stopped}",
    }

TIMING = re.compile(r" in \d+(?:\.\d+)?s(?: \(\d+:\d\d:\d\d\))?")


def steady_output(output: str, root: str) -> str:
    """Output that reads the same on every run of the same test: the root shown as ".",
    and pytest's timings dropped, so that a replay reproduces the journal exactly."""
    return TIMING.sub("", output.replace(os.path.realpath(root), "."))

def show_output(output: Output, root: str) -> str:
    """The output as text for the model: head and tail made steady, and how many bytes
    were cut."""
    head, tail = (
        steady_output(part.decode("utf-8", "replace"), root)
        for part in (output.head, output.tail)
    )
    cut = output.total - len(output.head) - len(output.tail)
    return f"{head}\n[... {cut} bytes cut ...]\n{tail}" if cut else head + tail

def run_command(action: dict, project) -> dict:
    """RUN: run pytest or git status/diff in the root; report the exit code and capped
    output.

    Refuses every other program, option and path, anything written for a shell, and
    the tests when their Python lies in the project, before anything starts. A
    non-zero exit code is a result, not a tool failure. Git metadata the run created
    is removed, and named.
    """
    try:
        kind, argv, paths = parse_command(action["command"])
    except CommandRefused as refusal:
        return failure(str(refusal))
    for path in paths:
        resolve_path(project, path)
    root, sandboxed = project.root, project.programs["bwrap"] is not None
    mode = "sandboxed" if sandboxed else "unsandboxed"
    variables, repository = {}, []
    if kind == "run" and not project.programs["python"]:
        return failure(
            f"the Python that runs mlplcode ({sys.executable}) lies inside the project,"
            " where a write could change what it runs on this machine; install"
            " mlplcode outside the project (pipx, or a virtual environment elsewhere)"
        )
    masked, metadata = survey(
        root, ignore_rules(project, ".mlplcodeignore"), project.secret_files
    )
    if kind == "run":
        masked += git_settings(metadata)
    if kind == "git":
        if not project.programs["git"]:
            return failure(
                "git is not installed on this machine; RUN git status or diff is"
                " unavailable"
            )
        top = repository_of(root)
        variables = git_variables(top)
        repository = [
            path for path in repository_directories(top) if not inside(path, root)
        ]
        risky = risky_git_settings(
            project.programs["git"],
            repository_settings(top, metadata),
            child_environment(root, root),
        )
        if risky:
            return failure(
                f"the repository sets {', '.join(risky)}, which git status or diff"
                " could act on; RUN git is refused in this repository"
            )
    start = run_tests if kind == "run" else run_process
    try:
        result = start(
            program_argv(kind, argv, paths, project.programs),
            project,
            protected_paths(root, metadata) + repository,
            masked,
            variables,
        )
    finally:
        planted = remove_planted(root, metadata)
    removed = [
        f"[removed what the run created that git would obey: {', '.join(planted)}]"
    ] * bool(planted)
    if result is None:
        return failure(
            "\n".join([
                (
                    f"timed out after {RUN_TIMEOUT_SECONDS:g} s and was killed"
                    f" ({mode}); run fewer tests (one file, -x) or fix what hangs"
                ),
                *removed,
            ])
        )
    exit_code, output = result[0], show_output(result[1], root)
    fields = {"exit_code": exit_code, "kind": kind, "sandboxed": sandboxed}
    lines = [f"exit code {exit_code} ({mode})"]
    if kind == "run":
        judged = result[2]
        fields.update(passed=judged["passed"], results=judged["results"])
        lines.append(judged["line"])
    return observation("\n".join([*lines, *removed, output]), **fields)

def check_run(action: dict, project) -> None:
    """Refuse, as RUN would, a path operand that names a path the tools may not use."""
    try:
        paths = parse_command(action["command"])[2]
    except CommandRefused:
        return
    for path in paths:
        resolve_path(project, path)
