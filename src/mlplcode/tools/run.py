"""Running programs: pytest or git, without a shell, bounded in time and output."""
import contextlib
import os
import re
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

from ..commands import CommandRefused, parse_command, program_argv
from ..trust import child_environment, limit_resources, sandbox_argv
from . import failure, observation
from .paths import resolve_path
from .write import AGENT_FILES

# Repository settings that make git status or diff run a program or read another repository.
RISKY_GIT_SETTINGS = re.compile(r"filter\.|include\.|includeif\.|core\.worktree|core\.fsmonitor"
                                r"|diff\.external|diff\..*\.(command|textconv)|core\.pager")


def risky_git_settings(git: str, root: str, environment: dict) -> list[str]:
    """The settings of the repository at root that git status or diff could act on."""
    listed = subprocess.run([git, "config", "--local", "--name-only", "--list"], cwd=root,
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

def protected_paths(root: str) -> list[str]:
    """What a sandboxed program may read but not change: .git and the agent's own files."""
    names = (".git", *AGENT_FILES)
    return [os.path.join(root, name) for name in names if os.path.exists(os.path.join(root, name))]

KILLED_SECONDS = 5


def run_process(argv: list[str], project) -> tuple[int, Output] | None:
    """Run argv in the root without a shell; give (exit code, output), or None on timeout.

    With bubblewrap, the program runs in its sandbox (chapter "Trust"); either way it
    gets the allow-listed environment, a fresh HOME, rlimits, /dev/null as stdin, and
    a new session whose whole process group is killed on timeout.
    """
    deadline, root, bwrap = time.monotonic() + RUN_TIMEOUT_SECONDS, project.root, project.programs["bwrap"]
    with tempfile.TemporaryDirectory(prefix="mlplcode-run-") as scratch:
        home = "/tmp" if bwrap else scratch
        if bwrap:
            empty = os.path.join(scratch, "empty")
            open(empty, "w").close()
            argv = sandbox_argv(bwrap, argv, root, protected_paths(root), project.secret_files, empty)
        with subprocess.Popen(argv, cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=child_environment(root, home),
                              start_new_session=True, preexec_fn=limit_resources) as process:
            try:
                output = drain(process, deadline)
            finally:
                kill_group(process)
                drain(process, time.monotonic() + KILLED_SECONDS)
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

def run_command(action: dict, project) -> dict:
    """RUN: run pytest or git status/diff in the root; report the exit code and capped output.

    Refuses every other program, option and path, and anything written for a shell,
    before anything starts. A non-zero exit code is a result, not a tool failure.
    """
    try:
        kind, argv, paths = parse_command(action["command"])
    except CommandRefused as refusal:
        return failure(str(refusal))
    for path in paths:
        resolve_path(project, path)
    root, sandboxed = project.root, project.programs["bwrap"] is not None
    mode = "sandboxed" if sandboxed else "unsandboxed"
    if kind == "git":
        if not project.programs["git"]:
            return failure("git is not installed on this machine; RUN git status or diff is unavailable")
        risky = risky_git_settings(project.programs["git"], root, child_environment(root, root))
        if risky:
            return failure(f"the repository sets {', '.join(risky)}, which git status or diff"
                           " could act on; RUN git is refused in this repository")
    result = run_process(program_argv(kind, argv), project)
    if result is None:
        return failure(f"timed out after {RUN_TIMEOUT_SECONDS:g} s and was killed ({mode});"
                       " run fewer tests (one file, -x) or fix what hangs")
    exit_code, output = result[0], show_output(result[1], root)
    fields = {"exit_code": exit_code, "kind": kind, "sandboxed": sandboxed}
    if kind == "run":
        fields["passed"] = pytest_passed(exit_code, output)
    return observation(f"exit code {exit_code} ({mode})\n{output}", **fields)

def check_run(action: dict, project) -> None:
    """Refuse, as RUN would, a path operand that names a path the tools may not use."""
    try:
        paths = parse_command(action["command"])[2]
    except CommandRefused:
        return
    for path in paths:
        resolve_path(project, path)
