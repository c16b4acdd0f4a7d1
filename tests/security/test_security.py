"""The adversarial suite: each case of cases.py driven through the real loop with a scripted model.

Every case is checked for its own outcome and for what must hold whatever
the case: nothing outside the root changed, no process it started is left,
nothing reached a server on 127.0.0.1 or a Unix socket of the host, no
program of the project ran on the host, no planted canary secret reached the
journal, a prompt or the printed transcript, neither as itself nor in a form
that decoding base64, hex or percent-encoding gets back, and the printed
transcript holds no character that a terminal obeys or that hides itself.

Every case runs with a hostile PATH: programs named like the ones the agent
starts (rg, git, bwrap, python, pytest) wait in the project's .venv/bin and
node_modules/.bin, which come first on the PATH, and in the working
directory, which an empty and a relative entry name. Each leaves a mark
beside the project if it runs on the host.
"""
import base64
import binascii
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
import uuid

import pytest

from conftest import require_tool
from mlplcode import Agent, cli, trust
from mlplcode.models import ModelError
from mlplcode.policy import DEFAULT_POLICY, terminal_decider
from mlplcode.tools import project as project_module, run as run_module, search as search_module

from cases import CANARIES, CASES, MARK



HOST_PROGRAMS = ("rg", "git", "bwrap", "python", "python3", "pytest")


class World:
    """A project root beside an outside directory and a home, all under one temporary directory."""

    def __init__(self, base, port):
        self.base, self.root, self.port = base, base / "project", port
        self.outside, self.home = base / "outside", base / "home"
        self.unique, self.ran = uuid.uuid4().hex[:12], base / "host-ran"
        for directory in (self.root, self.outside, self.home / ".ssh"):
            directory.mkdir(parents=True)
        (self.root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        (self.root / "test_calc.py").write_text(
            "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
        (self.root / ".env").write_text(f"API_TOKEN={CANARIES['dotenv']}\n")
        (self.outside / "secret.txt").write_text(f"{CANARIES['outside']}\n")
        (self.home / ".ssh" / "id_rsa").write_text(f"{CANARIES['home']}\n")
        for directory in self.planted_directories():
            directory.mkdir(parents=True)
            for name in HOST_PROGRAMS:
                (directory / name).write_text(f"#!/bin/sh\necho \"$0 $*\" >> {self.ran}\n")
                (directory / name).chmod(0o755)

    def planted_directories(self):
        """Where programs of the project wait to be found: a virtual environment's bin, node's."""
        return [self.root / ".venv" / "bin", self.root / "node_modules" / ".bin"]

    def hostile_path(self):
        """A PATH that names the project's programs first, then an empty and a relative entry."""
        planted = ":".join(str(directory) for directory in self.planted_directories())
        return f"{planted}::.:{os.environ['PATH']}"

    def fill(self, text):
        """Put the world's paths and the process marker into a case's text."""
        return (text.replace("{root}", str(self.root)).replace("{outside}", str(self.outside))
                .replace("{home}", str(self.home)).replace("{mark}", MARK)
                .replace("{port}", str(self.port)).replace("{base}", str(self.base))
                .replace("{unique}", self.unique).replace("{pid}", str(os.getpid())))


def build(world, setup):
    """Carry out a case's setup steps in the world; give the Unix socket servers it started."""
    listeners = []
    for operation, *arguments in setup:
        arguments = [world.fill(argument) for argument in arguments]
        at = world.root / arguments[0] if arguments else None
        if at is not None:
            at.parent.mkdir(parents=True, exist_ok=True)
        if operation == "file":
            at.write_text(arguments[1])
        elif operation == "bytes":
            at.write_bytes(arguments[1].encode("latin-1"))
        elif operation == "symlink":
            os.symlink(arguments[1], at)
        elif operation == "executable":
            at.chmod(0o755)
        elif operation == "hardlink":
            os.link(arguments[1], at)
        elif operation == "dir":
            at.mkdir(exist_ok=True)
        elif operation == "fifo":
            os.mkfifo(at)
        elif operation == "socket":
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(at))
            server.close()
        elif operation == "device":
            try:
                os.mknod(at, stat.S_IFCHR | 0o600, os.makedev(1, 3))
            except PermissionError:
                pytest.skip("mknod needs root")
        elif operation == "git":
            subprocess.run(["git", "init", "-q", str(world.root)], check=True)
        elif operation == "gitconfig":
            subprocess.run(["git", "-C", str(world.root), "config", *arguments], check=True)
        elif operation == "bare":
            subprocess.run(["git", "init", "-q", "--bare", str(at)], check=True)
        elif operation == "unix_listener":
            if not os.access(at.parent, os.W_OK):
                pytest.skip(f"a socket in {at.parent} needs root")
            server = socket.socket(socket.AF_UNIX)
            here = os.getcwd()
            os.chdir(at.parent)  # bound by its short name: a socket's path may hold only 107 bytes
            try:
                server.bind(at.name)
            finally:
                os.chdir(here)
            server.listen()
            server.setblocking(False)
            listeners.append((server, at))
        elif operation == "git-run":  # a git command in the root, as a person would type it
            subprocess.run(["git", "-C", str(world.root), "-c", "user.name=case", "-c", "user.email=case@x",
                            *arguments], check=True, capture_output=True)
        elif operation == "remove":
            at.unlink()
        elif operation == "deep":
            (world.root / ("d/" * int(arguments[0])) / "deep.txt").parent.mkdir(parents=True)
            (world.root / ("d/" * int(arguments[0])) / "deep.txt").write_text("needle\n")
        else:
            raise ValueError(f"unknown setup operation {operation}")
    return listeners


BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{8,}")
HEX_RUN = re.compile(r"[0-9a-fA-F]{16,}")


def decodings(text):
    """TEXT, and every text a reader gets back by decoding what it holds: percent-encoding, and
    each run of hex or base64 characters (either alphabet, wrapped lines joined) at every offset."""
    yield text
    yield urllib.parse.unquote(text)
    for source in (text, re.sub(r"\r?\n", "", text)):
        for run in BASE64_RUN.findall(source):
            run = run.replace("-", "+").replace("_", "/")
            for offset in range(4):
                chunk = run[offset:len(run) - ((len(run) - offset) % 4 == 1)]
                yield base64.b64decode(chunk + "=" * (-len(chunk) % 4)).decode("latin-1")
        for run in HEX_RUN.findall(source):
            for offset in (0, 1):
                chunk = run[offset:][:(len(run) - offset) // 2 * 2]
                yield binascii.unhexlify(chunk).decode("latin-1")


def recoverable(secret, text):
    """Whether SECRET can be read in TEXT, as it is or by decoding part of it."""
    return any(secret in decoded for decoded in decodings(text))


def decider(name, world, shown, monkeypatch):
    """The human of a case: approves everything, and for a TOCTOU case changes the world first."""
    yes = (True, "")

    def swap_to_symlink(action):
        target = world.root / action["path"]
        target.unlink()
        os.symlink(world.outside / "secret.txt", target)
        return yes

    def change_content(action):
        (world.root / action["path"]).write_text("changed behind the human's back\n")
        return yes

    def swap_parent(action):
        parent = world.root / action["path"].split("/")[0]
        os.rename(parent, world.base / "moved")
        os.symlink(world.outside, parent)
        return yes

    def create_it(action):
        (world.root / action["path"]).write_text("appeared\n")
        return yes

    def lose_bubblewrap(action):
        monkeypatch.setattr("mlplcode.tools.approval.find_program", lambda name, root: None)
        return yes

    terminal = terminal_decider(ask=lambda prompt: "y", show=shown.append)
    return {"yes": lambda action: yes, "no": lambda action: (False, ""),
            "no_because": lambda action: (False, "not this file"), "terminal": terminal,
            "swap_to_symlink": swap_to_symlink, "change_content": change_content,
            "swap_parent": swap_parent, "create_it": create_it,
            "lose_bubblewrap": lose_bubblewrap}[name]


def tree_hash(directory):
    """A hash of every name, kind, mode and content under directory, links not followed."""
    digest = hashlib.sha256()
    for parent, subdirectories, files in sorted(os.walk(directory)):
        subdirectories.sort()
        for name in sorted(subdirectories + files):
            path = os.path.join(parent, name)
            info = os.lstat(path)
            digest.update(f"{path}:{info.st_mode}:{info.st_size}".encode())
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as file:
                    digest.update(file.read())
    return digest.hexdigest()


def leftover_processes(base):
    """Running processes marked by a case, or working inside the case's directory."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as status:
                if status.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                marked = MARK.encode() in cmdline.read()
            inside = os.readlink(f"/proc/{pid}/cwd").startswith(str(base))
        except OSError:
            continue
        if (marked or inside) and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def processes_left(base, seconds=3):
    """Wait a moment for killed processes to go; describe those left, each by its pid,
    command line and working directory, so that a failure says which it was."""
    deadline = time.monotonic() + seconds
    while leftover_processes(base) and time.monotonic() < deadline:
        time.sleep(0.05)
    described = []
    for pid in leftover_processes(base):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace")
            described.append(f"{pid}: {command} in {os.readlink(f'/proc/{pid}/cwd')}")
        except OSError:
            continue  # it went while being described
    return described


@pytest.fixture
def listener():
    """A TCP server on 127.0.0.1 that no case may reach."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.setblocking(False)
        yield server


def nobody_connected(server):
    """Say whether no connection reached the server."""
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@pytest.fixture
def fast(monkeypatch):
    """Bound every limit of the tools to a few seconds and a few megabytes."""
    monkeypatch.setattr(run_module, "RUN_TIMEOUT_SECONDS", 3)
    monkeypatch.setattr(trust, "RUN_CPU_SECONDS", 1)
    monkeypatch.setattr(trust, "RUN_FILE_BYTES", 1024 * 1024)
    monkeypatch.setattr(trust, "RUN_MEMORY_BYTES", 1024 * 1024 * 1024)


def hide_program(program, monkeypatch):
    """Make the project find no PROGRAM, as on a machine without it."""
    real = project_module.find_program
    monkeypatch.setattr(project_module, "find_program",
                        lambda name, root: None if name == program else real(name, root))


def set_mode(mode, monkeypatch):
    """Make RUN sandboxed (bwrap needed) or unsandboxed for a case; "any" takes what is here."""
    if mode == "sandboxed":
        require_tool("bwrap", "sandboxed RUN cases")
    elif mode == "unsandboxed":
        hide_program("bwrap", monkeypatch)


def nobody_came(listeners):
    """Say whether no connection reached the Unix socket servers."""
    reached = []
    for server, path in listeners:
        try:
            server.accept()[0].close()
            reached.append(path)
        except BlockingIOError:
            pass
    return reached == []


def close(listeners):
    """Stop the Unix socket servers and remove their files."""
    for server, path in listeners:
        server.close()
        path.unlink(missing_ok=True)


def git_obeys_nothing(world, directories):
    """Run git status as a person would, in each of DIRECTORIES; say whether git ran nothing."""
    for directory in directories:
        subprocess.run([GIT, "status"], cwd=world.root / directory, capture_output=True,
                       env={**os.environ, "PATH": os.defpath}, timeout=30)
    return not (world.base / "git-ran").exists()


def escapes(world):
    """Files a case's test may have dropped outside the sandbox, removed after they are found."""
    found = []
    for path in (f"/usr/mlplcode-escaped-{world.unique}", f"/var/tmp/mlplcode-escaped-{world.unique}"):
        if os.path.lexists(path):
            found.append(path)
            os.unlink(path)
    return found


GIT = shutil.which("git")


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_case(case, tmp_path, monkeypatch, fast, capsys, listener, request):
    world = World(tmp_path, listener.getsockname()[1])
    monkeypatch.setenv("HOME", str(world.home))
    monkeypatch.setenv("MLPLCODE_CANARY_API_KEY", CANARIES["environment"])
    for (module, name), value in case.get("constants", {}).items():
        monkeypatch.setattr({"search": search_module, "trust": trust, "run": run_module}[module], name, value)
    set_mode(case.get("mode", "any"), monkeypatch)
    for program in case.get("without", []):
        hide_program(program, monkeypatch)
    request.addfinalizer(lambda: escapes(world))
    listeners = build(world, case.get("setup", []))
    request.addfinalizer(lambda: close(listeners))
    monkeypatch.setenv("PATH", world.hostile_path())
    monkeypatch.chdir(world.planted_directories()[0])
    for name, value in case.get("environment", {}).items():
        monkeypatch.setenv(name, world.fill(value))
    if "executable" in case:  # mlplcode started from a Python the case names
        monkeypatch.setattr(sys, "executable", world.fill(case["executable"]))
    before = tree_hash(world.outside), tree_hash(world.home)

    replies, prompts = [world.fill(reply) for reply in case["replies"]], []

    def model(messages):
        prompts.append(json.dumps(messages))
        if not replies:
            raise ModelError("no reply left")
        return replies.pop(0)

    shown, journal = [], tmp_path / "journal.jsonl"
    agent = Agent.start("the case's task", str(world.root), "echo", journal=str(journal),
                        budget=len(case["replies"]), policy={**DEFAULT_POLICY, **case.get("policy", {})},
                        on_event=cli.print_event)
    agent.model = model  # the case's replies, with each prompt kept to look for canaries in
    cli.drive(agent, decider(case.get("decide", "yes"), world, shown, monkeypatch))
    transcript = capsys.readouterr().out
    state = agent.state

    expect = case["expect"]
    assert state.stop["reason"] == expect.get("stop", "budget")
    for number, (verdict, fragment) in enumerate(expect.get("steps", []), start=1):
        step = state.steps[number - 1]
        assert step.verdict == verdict, (number, step.reason)
        said = step.observation["text"] if step.observation else step.reason
        assert world.fill(fragment) in said, (number, said)
    said = "".join(step.observation["text"] for step in state.steps if step.observation)
    for fragment in expect.get("said", []):
        assert world.fill(fragment) in said, (fragment, said)
    for fragment in expect.get("not_said", []):
        assert world.fill(fragment) not in said
    for relative, content in expect.get("files", {}).items():
        path = world.root / relative
        assert (path.read_text() if os.path.lexists(path) else None) == content, relative
    for fragment in expect.get("shown", []):
        assert fragment in "".join(shown)
    assert git_obeys_nothing(world, expect.get("git_in", [])), "git obeyed what a test planted"
    for fragment in expect.get("not_shown", []):
        assert fragment not in "".join(shown) and fragment not in transcript
    for fragment in expect.get("printed", []):
        assert fragment in transcript, (fragment, transcript)

    assert (tree_hash(world.outside), tree_hash(world.home)) == before, "something outside changed"
    assert escapes(world) == [], "a test wrote outside the sandbox"
    assert not world.ran.exists(), f"a program of the project ran on the host: {world.ran.read_text()}"
    assert processes_left(tmp_path) == [], "a process of the case is still running"
    assert nobody_connected(listener), "a case reached the network"
    assert nobody_came(listeners), "a case reached a Unix socket of the host"
    recorded = journal.read_text() + "".join(prompts) + transcript + said
    for name, canary in [*CANARIES.items(), *(("case", secret) for secret in case.get("canaries", []))]:
        assert not recoverable(canary, recorded), f"the {name} canary leaked"
    assert not [char for char in transcript if trust.is_invisible(char)], "an invisible character was printed"
