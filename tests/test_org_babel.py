"""Org-babel: the bridge (python3 -m mlplcode.babel) and the backend (ob-mlplcode.el).

The bridge and the backend are tested on the stock python3 kernel of
ipykernel, which speaks the same protocol as the mlplcode kernel and keeps
state that a test can see (a variable); the agent itself is stepped from an
org file in batch Emacs by test_org_file_steps_the_agent.

Every test runs with its own Jupyter runtime directory, so its sessions are
its own, and the `sessions` fixture stops them at the end and fails the test
if any kernel process is left.
"""
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from mlplcode import Agent

from conftest import HANG, require_tool

ROOT = Path(__file__).resolve().parents[1]
LISP_FILE = ROOT / "src" / "mlplcode" / "ob-mlplcode.el"
EXAMPLES = ROOT / "examples"
TIMEOUT = HANG


class Sessions:
    """The environment of a test's sessions, and the bridge run in it."""

    def __init__(self, tmp_path):
        self.cwd = tmp_path
        self.runtime = tmp_path / "runtime"
        self.directory = self.runtime / "mlplcode-babel"
        self.jupyter_path = tmp_path / "jupyter"
        self.env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.runtime),
                    "JUPYTER_PATH": str(self.jupyter_path), "IPYTHONDIR": str(tmp_path / "ipython")}
        self.env.pop("JPY_PARENT_PID", None)

    def bridge(self, *args, block=""):
        return subprocess.run([sys.executable, "-m", "mlplcode.babel", *args], input=block,
                              capture_output=True, text=True, env=self.env, cwd=self.cwd, timeout=TIMEOUT)

    def pid(self, name):
        return int((self.directory / f"{name}.pid").read_text())

    def install_kernel(self, name, argv):
        """A kernelspec NAME under this test's JUPYTER_PATH."""
        spec = self.jupyter_path / "kernels" / name
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": name, "language": name}))

    def kernel_processes(self):
        """Pids of processes started with a connection file of this test."""
        needle = str(self.directory).encode()
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    command = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if needle in command:
                    found.append(int(entry.name))
        return found


def alive(pid):
    """Whether PID runs and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def sessions(tmp_path):
    sessions = Sessions(tmp_path)
    yield sessions
    for pid_file in sorted(sessions.directory.rglob("*.pid")):
        scoped = pid_file.parent != sessions.directory  # a session of an org file: its test stops it
        if not scoped:
            sessions.bridge("--session", pid_file.stem, "--stop")
    left = [pid for pid in sessions.kernel_processes() if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"kernel processes left running: {left}"


# ---------------------------------------------------------------- the bridge, on the python3 kernel

def stream(text, name="stdout"):
    return {"msg_type": "stream", "content": {"name": name, "text": text}}


def test_a_line_sent_in_two_stream_messages_is_one_line():
    """ipykernel may flush a print's text before its newline, as it did once on a loaded machine."""
    from mlplcode.babel import Outputs
    outputs = Outputs()
    for message in [stream("42"), stream("\n"), stream("warned\n", "stderr"), stream("more"),
                    {"msg_type": "clear_output", "content": {"wait": True}}, stream("after")]:
        outputs.hook(message)
    assert outputs.text() == "after\n"
    outputs = Outputs()
    for message in [stream("42"), stream("\n"), stream("warned\n", "stderr"), stream("more")]:
        outputs.hook(message)
    assert outputs.text() == "42\nwarned\nmore\n"


def test_a_session_keeps_its_kernel_between_blocks_until_stopped(sessions):
    first = sessions.bridge("--session", "s", "--kernel", "python3", block="x = 41\nprint('set')\n")
    assert (first.returncode, first.stdout, first.stderr) == (0, "set\n", "")
    pid = sessions.pid("s")
    second = sessions.bridge("--session", "s", "--kernel", "python3", block="print(x + 1)\nx\n")
    assert (second.returncode, second.stdout) == (0, "42\n41\n")
    assert sessions.pid("s") == pid

    stopped = sessions.bridge("--session", "s", "--stop")
    assert (stopped.returncode, stopped.stdout) == (0, f"session s: stopped its kernel (pid {pid})\n")
    assert not alive(pid)
    assert list(sessions.directory.iterdir()) == []
    again = sessions.bridge("--session", "s", "--stop")
    assert (again.returncode, again.stdout) == (0, "session s: no kernel was running\n")


def test_an_error_is_printed_as_text_and_exits_1(sessions):
    result = sessions.bridge("--session", "e", "--kernel", "python3",
                             block="print('before')\n1/0\n")
    assert result.returncode == 1
    assert result.stdout.startswith("before\n")
    assert "ZeroDivisionError: division by zero" in result.stdout
    assert "\x1b[" not in result.stdout, "colour codes must be stripped"
    # The session goes on after an error.
    after = sessions.bridge("--session", "e", "--kernel", "python3", block="print('after')")
    assert (after.returncode, after.stdout) == (0, "after\n")


def test_a_session_whose_kernel_died_starts_a_new_one_and_says_so(sessions):
    assert sessions.bridge("--session", "d", "--kernel", "python3", block="x = 1").returncode == 0
    old = sessions.pid("d")
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(old) and time.monotonic() < deadline:
        time.sleep(0.05)
    result = sessions.bridge("--session", "d", "--kernel", "python3", block="print('fresh')")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[session d: its kernel had stopped; this block ran in a new one]\nfresh\n"
    assert sessions.pid("d") != old


def test_a_block_past_its_timeout_is_interrupted_and_the_session_goes_on(sessions):
    result = sessions.bridge("--session", "t", "--kernel", "python3", "--timeout", "1",
                             block="import time\nprint('started', flush=True)\nx = 5\ntime.sleep(60)\n")
    assert result.returncode == 3
    # What the block printed, how the kernel took the interrupt, and what stopped it.
    assert result.stdout.startswith("started\n") and "KeyboardInterrupt" in result.stdout, result.stdout
    assert result.stdout.endswith("\n[the block ran for more than 1 s and was interrupted]\n")
    assert result.stderr == "mlplcode.babel: the block ran for more than 1 s and was interrupted\n"
    after = sessions.bridge("--session", "t", "--kernel", "python3", block="print(x)")
    assert (after.returncode, after.stdout) == (0, "5\n"), after.stderr


def test_an_interrupted_bridge_interrupts_the_block_and_the_session_goes_on(sessions):
    assert sessions.bridge("--session", "i", "--kernel", "python3", block="x = 7").returncode == 0
    bridge = subprocess.Popen([sys.executable, "-m", "mlplcode.babel", "--session", "i", "--kernel", "python3"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=sessions.env, cwd=sessions.cwd)
    bridge.stdin.write("import time\nprint('started')\nopen('started', 'w').close()\ntime.sleep(60)\n")
    bridge.stdin.close()
    deadline = time.monotonic() + 20
    while not (sessions.cwd / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    bridge.send_signal(signal.SIGINT)
    time.sleep(0.2)
    bridge.send_signal(signal.SIGINT)  # a second interrupt while the bridge reports the first is ignored
    assert bridge.wait(timeout=20) == 3
    assert time.monotonic() - started < 10
    with bridge.stdout, bridge.stderr:
        output = bridge.stdout.read()
        assert output.startswith("started\n") and "KeyboardInterrupt" in output, output
        assert output.endswith("\n[interrupted; the kernel was interrupted too]\n")
        assert bridge.stderr.read() == "mlplcode.babel: interrupted; the kernel was interrupted too\n"
    after = sessions.bridge("--session", "i", "--kernel", "python3", block="print(x)")
    assert (after.returncode, after.stdout) == (0, "7\n"), after.stderr


def test_a_kernel_that_fails_to_start_is_reported_with_its_log(sessions):
    sessions.install_kernel("broken", [sys.executable, "-c", "import sys; sys.exit('no luck today')",
                                       "{connection_file}"])
    result = sessions.bridge("--session", "b", "--kernel", "broken", block="1")
    assert result.returncode == 2
    log = sessions.directory / "b.log"
    assert result.stderr == (f"mlplcode.babel: the broken kernel exited with status 1 while starting: "
                             f"'no luck today'; its output is in {log}\n")
    assert log.read_text() == "no luck today\n"
    assert sorted(p.name for p in sessions.directory.iterdir()) == ["b.log"]


def test_a_session_refuses_another_kernel(sessions):
    assert sessions.bridge("--session", "k", "--kernel", "python3", block="1").returncode == 0
    result = sessions.bridge("--session", "k", "--kernel", "mlplcode", block="%step")
    assert result.returncode == 2
    assert "session k runs the python3 kernel, not mlplcode; stop it first" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["--session", "a b"], "session 'a b': a session name is letters, digits and . _ + -"),
    (["--session", ".hidden"], "a session name is"),
    (["--kernel", "no-such-kernel"], "no Jupyter kernel named 'no-such-kernel'"),
])
def test_refusals_exit_2_with_one_line(sessions, args, message):
    result = sessions.bridge(*args, block="print(1)")
    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert sessions.kernel_processes() == []


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_a_timeout_must_be_a_positive_number(sessions, value):
    result = sessions.bridge("--timeout", value)
    assert result.returncode == 2
    assert "is not a positive number of seconds" in result.stderr


def test_lisp_file_names_the_shipped_backend(sessions):
    result = sessions.bridge("--lisp-file")
    assert result.returncode == 0
    assert Path(result.stdout.strip()).read_bytes() == LISP_FILE.read_bytes()


# ---------------------------------------------------------------- the backend, in batch Emacs

def run_emacs(sessions, org_name, body):
    """Execute every block of ORG_NAME in batch Emacs, with the backend loaded as a user would."""
    require_tool("emacs", "org-babel blocks run through ob-mlplcode.el")
    program = f"""(progn
      (setq ob-mlplcode-python {json.dumps(sys.executable)})
      (load (car (process-lines ob-mlplcode-python "-m" "mlplcode.babel" "--lisp-file")))
      (setq org-confirm-babel-evaluate nil)
      (find-file {json.dumps(org_name)})
      (condition-case failure (progn {body})
        (error (message "signalled: %s" (error-message-string failure)) (kill-emacs 3)))
      (save-buffer))"""
    return subprocess.run(["emacs", "--batch", "-Q", "--eval", program], capture_output=True,
                          text=True, env=sessions.env, cwd=sessions.cwd, timeout=TIMEOUT)


def results(org_text):
    """The text of each #+RESULTS:, in order: its ': ' lines, or the body of its example block."""
    found = []
    lines = org_text.split("\n")
    for i, line in enumerate(lines):
        if line != "#+RESULTS:":
            continue
        body = []
        if lines[i + 1] == "#+begin_example":
            for following in lines[i + 2:]:
                if following == "#+end_example":
                    break
                body.append(re.sub(r"^(\s*),(,*(?:\*|#\+))", r"\1\2", following))
        else:
            for following in lines[i + 1:]:
                if following != ":" and not following.startswith(": "):
                    break
                body.append(following[2:])
        found.append("\n".join(body))
    return found


PYTHON_BLOCKS = """\
#+TITLE: the backend on the python3 kernel

#+begin_src mlplcode :session py :kernel python3
x = 41
print("set")
#+end_src

#+begin_src mlplcode :session py :kernel python3
print(x + 1)
#+end_src

#+begin_src mlplcode :session py :kernel python3
print("ünïcode ✓")
1/0
#+end_src

#+begin_src mlplcode :session :kernel python3
import os
print(os.getcwd())
#+end_src
"""


def test_org_blocks_run_in_their_sessions_and_write_results(sessions):
    org = sessions.cwd / "py.org"
    org.write_text(PYTHON_BLOCKS, encoding="utf-8")
    emacs = run_emacs(sessions, org.name, """(org-babel-execute-buffer)
      (ob-mlplcode-stop-session "py")
      (ob-mlplcode-stop-session "default")""")
    assert emacs.returncode == 0, emacs.stderr[-3000:]
    assert "session py: stopped its kernel" in emacs.stderr
    assert "the block ended in an error" in emacs.stderr
    set_, answer, error, cwd = results(org.read_text(encoding="utf-8"))
    assert (set_, answer) == ("set", "42")
    assert error.startswith("ünïcode ✓\n") and error.endswith("ZeroDivisionError: division by zero")
    # A bare :session is the session "default", whose kernel runs in the org file's folder.
    assert cwd == str(sessions.cwd)
    # The sessions belong to the org file: their files were in a folder of its own, and nowhere else.
    assert [p.is_dir() and len(p.name) for p in sessions.directory.iterdir()] == [16]
    assert "session default: stopped its kernel" in emacs.stderr


def test_a_failing_bridge_stops_the_buffer_with_its_message(sessions):
    org = sessions.cwd / "bad.org"
    org.write_text("#+begin_src mlplcode :session s :kernel no-such-kernel\n%step\n#+end_src\n"
                   "\n#+begin_src mlplcode :session s :kernel python3\nprint(1)\n#+end_src\n")
    emacs = run_emacs(sessions, org.name, "(org-babel-execute-buffer)")
    assert emacs.returncode == 3, emacs.stderr[-3000:]
    assert "signalled: mlplcode: mlplcode.babel: no Jupyter kernel named 'no-such-kernel'" in emacs.stderr
    assert "#+RESULTS:" not in org.read_text()
    assert sessions.kernel_processes() == []


# ---------------------------------------------------------------- the agent, in batch Emacs

AGENT_BLOCKS = """\
#+TITLE: stepping the agent from org-babel

#+begin_src mlplcode :session agent
%root add
%model replay:add.journal.jsonl
%task Add a function mul(a, b) to calc.py that multiplies two numbers, and a test for it
#+end_src

#+begin_src mlplcode :session agent
%step
#+end_src

#+begin_src mlplcode :session agent
%step
#+end_src

#+begin_src mlplcode :session agent
%step
#+end_src

#+begin_src mlplcode :session agent
%approve
#+end_src

#+begin_src mlplcode :session agent
%show state
#+end_src

#+begin_src mlplcode :session agent
%approve
#+end_src
"""


def test_org_file_steps_the_agent(sessions):
    shutil.copytree(EXAMPLES / "add", sessions.cwd / "add")
    shutil.copy(EXAMPLES / "add.journal.jsonl", sessions.cwd / "add.journal.jsonl")
    # The kernel is installed as the README says, under a prefix that only this test's JUPYTER_PATH sees.
    prefix = sessions.cwd / "prefix"
    install = subprocess.run([sys.executable, "-m", "mlplcode.cli", "kernel", "install", "--prefix", str(prefix)],
                             capture_output=True, text=True, env=sessions.env, timeout=TIMEOUT)
    assert install.returncode == 0, install.stderr
    sessions.env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    org = sessions.cwd / "agent.org"
    org.write_text(AGENT_BLOCKS, encoding="utf-8")
    emacs = run_emacs(sessions, org.name, """(org-babel-execute-buffer)
      (ob-mlplcode-stop-session "agent")""")
    assert emacs.returncode == 0, emacs.stderr[-3000:]
    task, read1, read2, patch, approve, state, nothing = results(org.read_text(encoding="utf-8"))
    assert "task: Add a function mul(a, b)" in task
    assert "READ calc.py" in read1 and "def add(a, b):" in read1
    assert "READ test_calc.py" in read2 and "def test_add():" in read2
    assert "PATCH calc.py" in patch and "+def mul(a, b):" in patch and "%approve" in patch
    assert "patched calc.py" in approve
    assert "def mul(a, b):" in (sessions.cwd / "add" / "calc.py").read_text()
    assert re.search(r"steps: 3\b", state), state
    journal = re.search(r"journal: (\S+)", state).group(1)
    assert Agent(journal).state.steps[2].approved is True  # the journal babel's kernel wrote opens with Agent
    # An approve with nothing waiting is an error: its text is the result, and the run goes on.
    assert "nothing is waiting for a decision" in nothing
    assert "the block ended in an error" in emacs.stderr
    assert "session agent: stopped its kernel" in emacs.stderr


# ---------------------------------------------------------------- sessions per file, asking, stopping

def test_two_org_files_with_the_same_session_name_run_two_kernels(sessions):
    for name, block in (("a.org", "x = 'a'\nprint(x)"), ("b.org", "print(x)")):
        (sessions.cwd / name).write_text(f"#+begin_src mlplcode :session s :kernel python3\n{block}\n#+end_src\n")
    body = """(org-babel-execute-buffer) (save-buffer)
      (find-file "b.org") (org-babel-execute-buffer) (save-buffer)
      (ob-mlplcode-stop-session "s") (find-file "a.org") (ob-mlplcode-stop-session "s")"""
    emacs = run_emacs(sessions, "a.org", body)
    assert emacs.returncode == 0, emacs.stderr[-3000:]
    assert results((sessions.cwd / "a.org").read_text()) == ["a"]
    assert "NameError: name 'x' is not defined" in results((sessions.cwd / "b.org").read_text())[0]
    assert emacs.stderr.count("session s: stopped its kernel") == 2


def run_emacs_as_told(sessions, org_name, body, answers):
    """Batch Emacs with the lines `--init` prints, and ANSWERS typed to Org's questions on standard input."""
    require_tool("emacs", "org-babel blocks run through ob-mlplcode.el")
    init = subprocess.run([sys.executable, "-m", "mlplcode.babel", "--init"], capture_output=True, text=True,
                          check=True, env=sessions.env).stdout
    (sessions.cwd / "init.el").write_text(init)
    program = f"""(progn (find-file {json.dumps(org_name)})
      (condition-case failure (progn {body})
        (error (message "signalled: %s" (error-message-string failure)) (kill-emacs 3)))
      (save-buffer))"""
    return subprocess.run(["emacs", "--batch", "-Q", "-l", "init.el", "--eval", program], input=answers,
                          capture_output=True, text=True, env=sessions.env, cwd=sessions.cwd, timeout=TIMEOUT)


def test_init_lines_let_stepping_blocks_run_without_asking(sessions):
    shutil.copytree(EXAMPLES / "add", sessions.cwd / "add")
    shutil.copy(EXAMPLES / "add.journal.jsonl", sessions.cwd / "add.journal.jsonl")
    install_mlplcode_kernel(sessions)
    org = sessions.cwd / "steps.org"
    org.write_text(AGENT_BLOCKS.replace("%root add", "%root --copy add").replace(
        "#+begin_src mlplcode :session agent\n%approve\n#+end_src\n\n#+begin_src mlplcode :session agent\n%show",
        "#+begin_src mlplcode :session agent :kernel python3\nprint('a note to Org, Python to Python')\n#+end_src\n\n"
        "#+begin_src mlplcode :session agent\n%approve\n#+end_src\n\n#+begin_src mlplcode :session agent\n%show"))
    # One question for the block that sets the run up (yes), one for the block in another kernel (no);
    # a third question would find no answer, and Emacs would fail.
    emacs = run_emacs_as_told(sessions, org.name, """(org-babel-execute-buffer)
      (ob-mlplcode-stop-session "agent")""", "yes\nno\n")
    assert emacs.returncode == 0, emacs.stderr[-3000:]
    assert (emacs.stdout + emacs.stderr).count("Evaluate this mlplcode code block") == 2, emacs.stdout
    assert "Evaluation of this mlplcode code block is aborted" in emacs.stderr
    found = results(org.read_text())
    assert len(found) == 7 and "+def mul(a, b):" in found[3] and "patched calc.py" in found[4]
    assert "def mul" not in (sessions.cwd / "add" / "calc.py").read_text()  # the copy was patched, not add/


def install_mlplcode_kernel(sessions):
    """Install the kernel as the README says, under a prefix that only this test's JUPYTER_PATH sees."""
    prefix = sessions.cwd / "prefix"
    install = subprocess.run([sys.executable, "-m", "mlplcode.cli", "kernel", "install", "--prefix", str(prefix)],
                             capture_output=True, text=True, env=sessions.env, timeout=TIMEOUT)
    assert install.returncode == 0, install.stderr
    sessions.env["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")


def test_a_block_past_its_timeout_has_results_and_stops_the_buffer(sessions):
    org = sessions.cwd / "slow.org"
    org.write_text("#+begin_src mlplcode :session t :kernel python3\nimport time\nprint('started', flush=True)\n"
                   "time.sleep(60)\n#+end_src\n\n#+begin_src mlplcode :session t :kernel python3\nprint('next')\n"
                   "#+end_src\n")
    emacs = run_emacs(sessions, org.name, """(setq ob-mlplcode-timeout 2)
      (unwind-protect (org-babel-execute-buffer) (save-buffer) (ob-mlplcode-stop-session "t"))""")
    assert emacs.returncode == 3, emacs.stderr[-3000:]
    assert "signalled: mlplcode: mlplcode.babel: the block ran for more than 2 s and was interrupted" in emacs.stderr
    (slow,) = results(org.read_text())  # the second block did not run
    assert slow.startswith("started\n") and "KeyboardInterrupt" in slow
    assert slow.endswith("[the block ran for more than 2 s and was interrupted]")


class HeldChat(BaseHTTPRequestHandler):
    """A chat-completions server that holds every request until the test ends."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.asked.set()
        self.server.release.wait(TIMEOUT)

    def log_message(self, *args):
        pass


def test_c_g_in_emacs_writes_what_happened_as_the_results(sessions):
    """C-g typed at a terminal Emacs, on a pseudo-terminal, while %step waits for the model."""
    require_tool("emacs", "C-g in Emacs while a block runs")
    server = ThreadingHTTPServer(("127.0.0.1", 0), HeldChat)
    server.asked, server.release = threading.Event(), threading.Event()
    threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True).start()
    shutil.copytree(EXAMPLES / "add", sessions.cwd / "add")
    install_mlplcode_kernel(sessions)
    org = sessions.cwd / "cg.org"
    url = f"http://127.0.0.1:{server.server_port}/v1"
    org.write_text(f"#+begin_src mlplcode :session cg\n%root --copy add\n%model openai:held@{url} --grammar none"
                   " --context 4096\n%task Add mul\n#+end_src\n\n#+begin_src mlplcode :session cg\n%step\n#+end_src\n\n"
                   "#+begin_src mlplcode :session cg\n%show state\n#+end_src\n")
    init = subprocess.run([sys.executable, "-m", "mlplcode.babel", "--init"], capture_output=True, text=True,
                          check=True, env=sessions.env).stdout
    # Emacs outside --batch compiles the Lisp it loads to native code in the background, into
    # ~/.emacs.d/eln-cache, each file not compiled there yet, for as long as it runs: up to 5
    # CPU-seconds of this test (calendar.el), nothing to do with C-g, and files written outside
    # the test's directory.
    (sessions.cwd / "init.el").write_text("(setq native-comp-deferred-compilation nil)\n" + init
                                          + "(setq org-confirm-babel-evaluate nil)\n")
    program = """(progn (find-file "cg.org")
      (condition-case nil (org-babel-execute-buffer) (quit (write-region "quit" nil "quit-seen")))
      (save-buffer) (ob-mlplcode-stop-session "cg") (kill-emacs 0))"""
    env = {key: value for key, value in sessions.env.items() if "proxy" not in key.lower()}
    pid, terminal = pty.fork()
    if pid == 0:
        os.chdir(sessions.cwd)
        os.execvpe("emacs", ["emacs", "-nw", "-Q", "-l", "init.el", "--eval", program], {**env, "TERM": "xterm"})
    try:
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        screen = Screen(terminal)
        assert server.asked.wait(TIMEOUT), "the step never asked the model"
        screen.read(1)
        os.write(terminal, b"\x07")  # C-g
        _, status = screen.wait_exit(pid, TIMEOUT)
        assert os.waitstatus_to_exitcode(status) == 0, screen.text[-2000:]
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
    assert (sessions.cwd / "quit-seen").read_text() == "quit"  # the quit went on, after the results
    settings, step = results(org.read_text())  # the block after the interrupted one did not run
    assert "task: Add mul" in settings
    assert "steps: 0 of 20" in step and "stop: interrupted: the human stopped the run before its first step" in step
    assert "KeyboardInterrupt: interrupted; the run stopped as interrupted" in step
    assert step.endswith("[interrupted; the kernel was interrupted too]")


class Screen:
    """What a program on a pseudo-terminal writes, read so that it never blocks on a full terminal."""

    def __init__(self, terminal):
        self.terminal, self.text = terminal, ""

    def read(self, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if select.select([self.terminal], [], [], 0.05)[0]:
                try:
                    self.text += os.read(self.terminal, 65536).decode("utf-8", "replace")
                except OSError:
                    return

    def wait_exit(self, pid, seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return done, status
            self.read(0.1)
        os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)
