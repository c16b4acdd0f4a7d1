"""Attacks that are not one scripted run of cases.py.

The sandbox run by an ordinary user; journals rewritten between two sessions,
taken up by every front end (Agent, command line, kernel, org-babel bridge);
a directory swapped for a link while a tool works; git in a project that lies
inside a larger repository.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid

import pytest
from jupyter_client.manager import start_new_kernel

from conftest import HANG, install_kernelspec, require_tool
from mlplcode import Agent, loop, trust
from mlplcode.cli import main
from mlplcode.tools import read as read_module, write as write_module
from mlplcode.tools.project import open_project
from mlplcode.verbs import execute

NOBODY = 65534
CANARY = "canary-nobody-5e2b8c1d"


# --- the sandbox, run by an ordinary user ------------------------------------------------

# Run by the system's python3 in the sandbox: what it can see and do as an ordinary user.
ORDINARY_USER_ATTACKS = """import os, socket, subprocess
for line in open('/proc/self/status'):
    if line.startswith(('Uid:', 'CapEff:', 'NoNewPrivs:')):
        print(line.strip())
open('made-in-the-sandbox.txt', 'w').write('ok')
for name, command in [('remount', ['mount', '-o', 'remount,rw,bind', '/']),
                      ('unshare-user', ['unshare', '-r', 'true'])]:
    done = subprocess.run(command, capture_output=True, stdin=subprocess.DEVNULL)
    print('ESCAPED' if done.returncode == 0 else 'refused', name)
for path in ('/usr/mlplcode-escaped-{unique}', '/var/tmp/mlplcode-escaped-{unique}'):
    try:
        open(path, 'w').close()
        print('ESCAPED', path)
    except OSError as error:
        print('refused', path, error.strerror)
for path in ('{socket}', 'dev.sock'):
    try:
        client = socket.socket(socket.AF_UNIX)
        client.connect(path)
        print('ESCAPED: connected to the host at', path)
    except OSError as error:
        print('unreachable', path, error.strerror)
print('ENV=' + repr(open('.env').read()))
print('RUN', os.path.exists('/run'))"""


def test_the_sandbox_holds_for_an_ordinary_user(tmp_path):
    require_tool("bwrap", "the sandbox run by an ordinary user")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 in /usr/bin for the ordinary user to run: NOT checked")
    as_nobody = os.geteuid() == 0
    if as_nobody:
        require_tool("setpriv", "the sandbox run by an ordinary user")
    unique = uuid.uuid4().hex[:12]
    base = tempfile.mkdtemp(prefix="mlplcode-nobody-", dir="/tmp")  # pytest's tmp_path is root's alone
    listening = f"/run/mlplcode-{unique}.sock" if as_nobody else str(tmp_path / "host.sock")
    root, empty = os.path.join(base, "project"), os.path.join(base, "empty")
    inside = os.path.join(root, "dev.sock")  # a development server's, in the project
    servers = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)]
    try:
        os.mkdir(root)
        open(empty, "w").close()
        with open(os.path.join(root, ".env"), "w") as env:
            env.write(f"TOKEN={CANARY}\n")
        for server, path in zip(servers, (listening, inside)):
            server.bind(path)
            server.listen()
            server.setblocking(False)
            os.chmod(path, 0o777)
        if as_nobody:
            for directory, _, files in os.walk(base):
                for path in (directory, *(os.path.join(directory, name) for name in files)):
                    os.chown(path, NOBODY, NOBODY)
        attacks = (ORDINARY_USER_ATTACKS.replace("{unique}", unique)
                   .replace("{socket}", listening))
        socket_filter = trust.socket_filter_descriptor()
        argv = trust.sandbox_argv(shutil.which("bwrap"), [python, "-c", attacks], root, [], [],
                                  [os.path.join(root, ".env")], empty, socket_filter)
        if as_nobody:
            argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, cwd=base, timeout=HANG,
                              env={"PATH": os.defpath, "LANG": "C.UTF-8"},
                              pass_fds=() if socket_filter is None else (socket_filter,))
        if socket_filter is not None:
            os.close(socket_filter)
        if "namespace" in done.stderr and done.returncode != 0:
            pytest.skip(f"this kernel lets no ordinary user make a namespace ({done.stderr.strip()}):"
                        " the sandbox needs that without root; NOT checked")
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert f"Uid:\t{NOBODY}" in out and "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out
        assert "ESCAPED" not in out, out
        assert "ENV=''" in out and CANARY not in out
        assert "RUN False" in out
        assert open(os.path.join(root, "made-in-the-sandbox.txt")).read() == "ok"
        assert "unreachable dev.sock" in out, out
        for server in servers:
            try:
                server.accept()[0].close()
                reached = True
            except BlockingIOError:
                reached = False
            assert not reached, "the sandbox reached a Unix socket of the host"
    finally:
        for server in servers:
            server.close()
        for path in (listening, f"/usr/mlplcode-escaped-{unique}", f"/var/tmp/mlplcode-escaped-{unique}"):
            if os.path.lexists(path):
                os.unlink(path)
        shutil.rmtree(base)


# --- journals rewritten between two sessions --------------------------------------------

REPLIES = ["READ calc.py", "WRITE notes.txt\nx\nEND"]
LOOSE = {"read": "allow", "search": "allow", "write": "allow", "interpreter": "allow",
         "run": "allow", "git": "allow", "shell": "deny"}


def waiting_run(project, tmp_path):
    """A run that waits at the ask of its second step; give its journal."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(REPLIES))
    agent = Agent.start("t", project, f"scripted:{script}", journal=str(tmp_path / "run.jsonl"))
    agent.run()
    return agent.journal


def forge(journal, **changes):
    """Rewrite the start event of JOURNAL as a test or another program could."""
    with open(journal) as file:
        lines = file.read().split("\n")
    start = {**json.loads(lines[0]), **changes}
    lines[0] = json.dumps(start, sort_keys=True)
    with open(journal, "w") as file:
        file.write("\n".join(lines))


@pytest.fixture
def elsewhere(tmp_path):
    """Another project, which a forged start event names as the root."""
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "calc.py").write_text("# another project\n")
    return str(other)


@pytest.mark.parametrize("field", ["root", "policy"])
def test_a_start_event_rewritten_is_refused(project, tmp_path, elsewhere, field):
    journal = waiting_run(project, tmp_path)
    forge(journal, **{"root": elsewhere} if field == "root" else {"policy": LOOSE})
    with pytest.raises(ValueError, match=rf"not the one this run began with \({field} changed since\)"):
        Agent(journal)


def test_a_journal_this_machine_did_not_start_is_refused(project, tmp_path):
    journal = tmp_path / "brought.jsonl"
    journal.write_text(json.dumps({"type": "start", "task": "t", "budget": 5, "policy": LOOSE,
                                   "model": "echo", "model_options": {}, "root": project, "tests": {},
                                   "run": "20000101-000000-" + uuid.uuid4().hex[:4]}) + "\n")
    with pytest.raises(ValueError, match="this machine started no run"):
        Agent(str(journal))


def test_a_journal_forged_during_a_step_is_refused_when_the_interrupt_reads_it(project, tmp_path,
                                                                                 monkeypatch):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["READ calc.py", "RUN python -m pytest -q"]))
    agent = Agent.start("t", project, f"scripted:{script}", journal=str(tmp_path / "run.jsonl"))
    policy = agent.state.start["policy"]

    def forge_then_interrupt(action, project_value):
        if action["tool"] == "run":  # what a test could do to a journal it can reach
            forge(agent.journal, policy=LOOSE)
            raise KeyboardInterrupt
        return execute(action, project_value)

    monkeypatch.setattr(loop, "execute", forge_then_interrupt)
    with pytest.raises(ValueError, match="policy changed since"):
        agent.run()
    assert agent.state.start["policy"] == policy


def test_the_command_line_refuses_to_resume_a_forged_journal(project, tmp_path, elsewhere, capsys):
    journal = waiting_run(project, tmp_path)
    forge(journal, root=elsewhere, policy=LOOSE)
    assert main(["resume", journal, "--yes"]) == 2
    err = capsys.readouterr().err
    assert "(policy, root changed since); what it says, its writer chose:" in err
    assert f"  root: {elsewhere} (its tools write there" in err
    assert "  policy: write=allow interpreter=allow git=allow (looser than the default)" in err
    assert err.endswith("if each line is yours: run mlplcode resume again with --trust-journal\n")
    assert (tmp_path / "elsewhere" / "notes.txt").exists() is False


def test_the_command_line_refuses_a_journal_inside_the_root(project, capsys):
    assert main(["run", "t", "--root", project, "--model", "echo", "--journal",
                 os.path.join(project, "run.jsonl")]) == 2
    assert "is inside the project" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(project, "run.jsonl"))


def test_the_kernel_keeps_its_journal_outside_and_refuses_a_forged_one(project, tmp_path, elsewhere):
    install_kernelspec()
    journal = waiting_run(project, tmp_path)
    forge(journal, policy=LOOSE)
    manager, client = start_new_kernel(kernel_name="mlplcode", cwd=project)  # started in the project
    try:
        asked = []
        reply = client.execute_interactive(f"%resume {journal}", timeout=HANG, output_hook=asked.append)
        asked = [m["content"]["data"]["text/plain"] for m in asked if "data" in m.get("content", {})]
        assert reply["content"]["status"] == "ok" and "why: its start event is not the one" in asked[0]
        assert "policy changed since" in asked[0] and "%approve takes it as yours" in asked[0]
        reply = client.execute_interactive("%deny\n%step", timeout=HANG)["content"]
        assert reply["status"] == "error" and reply["evalue"].startswith("no run yet")
        script = tmp_path / "kernel.json"
        script.write_text(json.dumps(REPLIES))
        shown = []
        client.execute_interactive(f"%root {project}\n%model scripted:{script}\n%task t\n%show journal",
                                   timeout=HANG, output_hook=shown.append)
        texts = [m["content"]["data"]["text/plain"] for m in shown if "data" in m.get("content", {})]
        where = [line for text in texts for line in text.splitlines() if line.startswith("journal: ")]
        assert where and not where[0].removeprefix("journal: ").startswith(project)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_an_org_babel_block_refuses_a_forged_journal(project, tmp_path):
    journal = waiting_run(project, tmp_path)
    forge(journal, policy=LOOSE)
    env = {**os.environ, "JUPYTER_PATH": install_kernelspec(),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "IPYTHONDIR": str(tmp_path / "ipython")}
    env.pop("JPY_PARENT_PID", None)

    def bridge(*arguments, block=""):
        return subprocess.run([sys.executable, "-m", "mlplcode.babel", "--session", "forged", *arguments],
                              input=block, capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=HANG)
    try:
        done = bridge("--kernel", "mlplcode", block=f"%resume {journal}\n")
        assert done.returncode == 0, done.stderr  # an ask, which the next block answers
        assert "policy changed since" in done.stdout and "%approve takes it as yours" in done.stdout
        done = bridge("--kernel", "mlplcode", block="%step\n")
        assert done.returncode == 1 and "no run yet" in done.stdout
    finally:
        bridge("--stop")


# --- paths swapped while a tool works ---------------------------------------------------

@pytest.fixture
def swap_world(tmp_path):
    """A project with pkg/mod.py, and outside it a directory that a swapped-in link leads to."""
    root, outside = tmp_path / "project", tmp_path / "outside"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    outside.mkdir()
    (outside / "mod.py").write_text(f"{CANARY}\n")
    return root, outside


def swapping_after(module, root, monkeypatch):
    """Make MODULE's resolve_path swap pkg for a link to ../outside just after it judged a path."""
    real = module.resolve_path

    def resolve_then_swap(project, path):
        resolved = real(project, path)
        os.rename(root / "pkg", root.parent / "moved")
        os.symlink(root.parent / "outside", root / "pkg")
        return resolved

    monkeypatch.setattr(module, "resolve_path", resolve_then_swap)


@pytest.mark.parametrize("action", [
    {"tool": "write", "path": "pkg/mod.py", "content": "pwned\n"},
    {"tool": "write", "path": "pkg/new/deep.py", "content": "pwned\n"},
    {"tool": "patch", "path": "pkg/mod.py", "old": f"{CANARY}\n", "new": "pwned\n"},
])
def test_a_directory_swapped_for_a_link_cannot_move_a_write(swap_world, monkeypatch, action):
    root, outside = swap_world
    project = open_project(str(root))
    swapping_after(write_module, root, monkeypatch)
    result = execute(action, project)
    assert result["ok"] is False and "changed while it was being" in result["text"], result
    assert sorted(os.listdir(outside)) == ["mod.py"]
    assert (outside / "mod.py").read_text() == f"{CANARY}\n"


def test_a_directory_swapped_for_a_link_cannot_redirect_a_read(swap_world, monkeypatch):
    root, _ = swap_world
    project = open_project(str(root))
    swapping_after(read_module, root, monkeypatch)
    result = execute({"tool": "read", "path": "pkg/mod.py"}, project)
    assert result["ok"] is False and "changed while it was being opened" in result["text"]
    assert CANARY not in result["text"]


# --- git in a project inside a larger repository ----------------------------------------

def test_git_in_a_project_inside_a_larger_repository_shows_only_the_project(tmp_path):
    big = tmp_path / "big"
    (big / "proj").mkdir(parents=True)
    git = ["git", "-C", str(big), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (big / "outer.txt").write_text("a\n")
    (big / "proj" / "inner.txt").write_text("b\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    (big / "outer.txt").write_text("a changed\n")
    (big / "proj" / "inner.txt").write_text("b changed\n")
    (big / "stray.txt").write_text("untracked outside the project\n")
    project = open_project(str(big / "proj"))
    status = execute({"tool": "run", "command": "git status --short"}, project)["text"]
    diff = execute({"tool": "run", "command": "git diff --stat"}, project)["text"]
    assert " M inner.txt" in status and "outer" not in status and "stray" not in status
    assert "inner.txt" in diff and "outer" not in diff
