"""The mlplcode kernel, driven over jupyter_client as Jupyter drives it."""
import json
import os
import pathlib
import shutil
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jupyter_kernel_test
import nbformat
import pytest
from jupyter_client.manager import start_new_kernel

from conftest import install_kernelspec
from mlplcode import Agent
from mlplcode.kernel import COMMANDS, help_view
from mlplcode.show import as_text

install_kernelspec()  # before any kernel test class is set up
TIMEOUT = 30


class Kernel:
    """A running mlplcode kernel and a client; `cell` runs one cell and gives its reply and outputs."""

    def __init__(self, cwd, env=None):
        self.manager, self.client = start_new_kernel(kernel_name="mlplcode", cwd=str(cwd),
                                                     env=os.environ.copy() if env is None else env)

    def cell(self, code, timeout=TIMEOUT):
        outputs = []
        reply = self.client.execute_interactive(code, timeout=timeout, output_hook=outputs.append)
        shown = [m for m in outputs if m["msg_type"] in ("stream", "display_data", "execute_result", "error")]
        return reply["content"], shown

    def ok(self, code):
        reply, outputs = self.cell(code)
        assert reply["status"] == "ok", reply.get("evalue")
        return outputs

    def error(self, code):
        reply, outputs = self.cell(code)
        assert reply["status"] == "error"
        assert [m["msg_type"] for m in outputs][-1] == "error"
        return reply["evalue"]

    def close(self):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


@pytest.fixture
def kernel(tmp_path):
    running = Kernel(tmp_path)
    yield running
    running.close()


def kinds(outputs):
    return [m["content"]["metadata"]["mlplcode"]["kind"] for m in outputs if m["msg_type"] != "stream"]


def text(outputs):
    return "\n".join(m["content"]["data"]["text/plain"] if "data" in m["content"] else m["content"]["text"]
                     for m in outputs)


# --- the protocol, checked by jupyter_kernel_test --------------------------

class MlplcodeKernelTests(jupyter_kernel_test.KernelTests):
    """Jupyter's conformance tests. They share one kernel, in a scratch directory
    that holds a project named "hello, world": `%root` echoes the root it was
    given on stdout, which is the kernel's one honest hello world."""
    kernel_name = "mlplcode"
    language_name = "mlplcode"
    file_extension = ".txt"

    @classmethod
    def setUpClass(cls):
        cls.scratch = tempfile.mkdtemp(prefix="mlplcode-kernel-tests-")
        os.mkdir(os.path.join(cls.scratch, "hello, world"))
        cls.km, cls.kc = start_new_kernel(kernel_name=cls.kernel_name, cwd=cls.scratch)
        cls.code_hello_world = f"%root {cls.scratch}/hello, world"
        cls.kc.execute_interactive(f"{cls.code_hello_world}\n%model echo", timeout=TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(cls.scratch, ignore_errors=True)

    code_generate_error = "%approve"
    code_execute_result = [{"code": "%help deny", "result": as_text(help_view("deny"))},
                           {"code": "%help", "result": as_text(help_view())}]
    code_display_data = [{"code": "%task Say hello\n%step", "mime": "text/html"},
                         {"code": "%step", "mime": "text/markdown"}]
    completion_samples = [{"text": "%ap", "matches": {"%approve"}},
                          {"text": "%s", "matches": {"%step", "%show", "%save"}},
                          {"text": "%show st", "matches": {"state"}}]
    complete_code_samples = ["%step", "Keep add unchanged.", "%%task\nAdd mul", "%root x\n%step 2"]
    incomplete_code_samples = ["%%task", "%%task\n\n"]
    invalid_code_samples = ["%stpe", "%step\nnot a command"]
    code_inspect_sample = "%deny"


# --- the add-mul task, one cell at a time ----------------------------------

def test_the_add_mul_task_with_one_ask_approved_and_one_denied_by_a_cell(kernel, project, replies, tmp_path):
    settings = kernel.ok(f"%root {project}\n%model scripted:{replies}\n%budget 10\n%policy write=ask run=allow")
    assert [m["content"]["text"] for m in settings][0] == f"root: {project}\n"
    assert kinds(kernel.ok("%%task\nAdd mul(a, b) to calc.py\nand its test")) == ["task"]
    assert kinds(kernel.ok("%run")) == ["step", "step", "step", "ask"]
    assert "%approve" in kernel.error("%step")
    shown = kernel.ok("%approve")
    assert kinds(shown) == ["step"] and "patched calc.py" in text(shown)
    shown = kernel.ok("%step")
    assert "waiting: %approve or %deny [reason]" in text(shown)
    assert "+def test_mul():" in shown[0]["content"]["data"]["text/plain"]  # the WRITE as a diff
    assert "DECLINED" in text(kernel.ok("%deny patch the test file instead"))
    prompt = text(kernel.ok("%show prompt"))
    assert "NOTE FROM THE HUMAN: patch the test file instead" in prompt
    kernel.ok("%step")
    kernel.ok("%approve")
    outputs = kernel.ok("%run")
    assert kinds(outputs) == ["step", "step", "stop"]
    assert "stop: done: added mul and its test" in text(outputs)
    metadata = outputs[0]["content"]["metadata"]["mlplcode"]
    assert metadata["step"] == 6 and len(metadata["run"]) == 20
    assert "def test_mul" in open(os.path.join(project, "test_calc.py")).read()
    assert "%task TEXT" in kernel.error("%step")
    assert "%task TEXT" in kernel.error("%approve")

    for name in ("t.ipynb", "t.org", "t.md"):
        assert kinds(kernel.ok(f"%save {name}")) == ["saved"]
    nbformat.validate(nbformat.read(str(tmp_path / "t.ipynb"), as_version=4))
    assert open(tmp_path / "t.org").read().count("\n* step ") == 7
    journal = journal_of(kernel)
    assert os.path.dirname(journal) == os.path.join(os.environ["XDG_STATE_HOME"], "mlplcode", "runs")
    assert Agent(journal).state.stop["reason"] == "done"  # the kernel's journal opens with Agent


def journal_of(kernel):
    """The journal of the kernel's run in progress, as %show journal names it."""
    return text(kernel.ok("%show journal")).splitlines()[0].removeprefix("journal: ")


def test_a_bare_deny_ends_the_run(kernel, project, replies):
    kernel.ok(f"%root {project}\n%model scripted:{replies}\n%task Add mul\n%step 3")
    assert "stop: denied: step 3: the human declined PATCH calc.py" in text(kernel.ok("%deny"))
    assert "%task TEXT" in kernel.error("%step")


CHEAT = ["READ test_calc.py", "WRITE test_calc.py\ndef test_add():\n    assert True\nEND",
         "RUN python -m pytest -q", "DONE add works", "DONE add works, really"]


def cheat_run(kernel, project, tmp_path):
    """A run in which the model rewrites the failing test to assert True and says DONE: %run stops at its ask."""
    open(os.path.join(project, "calc.py"), "w").write("def add(a, b):\n    return a - b\n")
    script = tmp_path / "cheat.json"
    script.write_text(json.dumps(CHEAT))
    kernel.ok(f"%root {project}\n%model scripted:{script}\n%policy write=allow\n%task Fix add")
    shown = kernel.ok("%run")
    assert kinds(shown) == ["step", "step", "step", "step", "ask"]
    return text(shown)


def test_a_done_whose_tests_changed_waits_with_the_diff_and_approve_accepts_it(kernel, project, tmp_path):
    shown = cheat_run(kernel, project, tmp_path)
    assert ("verdict: ask (NOT VERIFIED: the tests as they were before this run fail (test_calc.py::test_add);"
            " this run changed test_calc.py)") in shown
    assert "the tests, as this run changed them:" in shown and "+    assert True" in shown
    shown = text(kernel.ok("%approve"))
    assert "DONE accepted by a person, although the tests as they were" in shown
    assert "stop: done: add works" in shown
    assert Agent(journal_of(kernel)).state.steps[3].approved is True


def test_a_bare_deny_of_a_done_whose_tests_changed_refuses_it_and_the_run_goes_on(kernel, project, tmp_path):
    cheat_run(kernel, project, tmp_path)
    shown = text(kernel.ok("%deny"))
    assert "NOT VERIFIED: the tests as they were before this run fail" in shown and "stop:" not in shown
    assert kinds(kernel.ok("%step")) == ["step", "ask"]  # the model went on, and said DONE again


def test_mistakes_are_error_replies_that_say_what_to_do(kernel, project):
    assert "%task TEXT" in kernel.error("%approve")
    assert kernel.error("%stpe") == "unknown command %stpe; did you mean %step? %help lists the commands"
    assert "no root" in kernel.error("%model echo\n%task t")
    assert "not a directory" in kernel.error("%root /no/such/dir")
    assert "unknown category 'wirte'" in kernel.error("%policy wirte=ask")
    assert "positive whole number" in kernel.error("%budget many")
    assert "unknown model spec" in kernel.error("%model gpt-4")
    kernel.ok(f"%root {project}\n%task t")
    assert "nothing is waiting for a decision: use %step" in kernel.error("%deny no")
    assert "FILE.ipynb, FILE.org or FILE.md" in kernel.error("%save t.html")
    assert "line 2 is not a command" in kernel.error("%step\nhello")


def test_a_failure_inside_a_step_is_an_error_reply_and_the_kernel_lives(kernel, project, tmp_path):
    kernel.ok(f"%root {project}\n%model echo\n%task t")
    journal = pathlib.Path(journal_of(kernel))
    journal.unlink()
    journal.mkdir()  # the journal can no longer be appended to
    assert "Is a directory" in kernel.error("%step")
    assert kernel.manager.is_alive()
    assert "help" in text(kernel.ok("%help help"))


def test_a_note_cell_reaches_the_next_prompt(kernel, project):
    kernel.ok(f"%root {project}\n%model echo\n%task Look around")
    assert kinds(kernel.ok("Keep add unchanged.")) == ["note"]
    reply = kernel.ok("%step")[0]["content"]["data"]["text/plain"]
    assert "NOTE FROM THE HUMAN: Keep add unchanged." in reply


def test_root_copy_works_on_a_fresh_copy(kernel, project, tmp_path):
    root = kernel.ok(f"%root --copy {project}")[0]["content"]["text"]
    copy = root.removeprefix("root: ").removesuffix(" (a fresh copy)\n")
    assert copy != project and open(os.path.join(copy, "calc.py")).read() == open(os.path.join(project, "calc.py")).read()
    shutil.rmtree(os.path.dirname(copy))


# --- restart and resume ----------------------------------------------------

def test_after_a_restart_resume_takes_the_run_up_at_its_waiting_ask(kernel, project, replies, tmp_path):
    kernel.ok(f"%root {project}\n%model scripted:{replies}\n%task Add mul")
    kernel.ok("%step 3")
    journal = journal_of(kernel)
    kernel.manager.restart_kernel(now=True)
    kernel.client.wait_for_ready(timeout=TIMEOUT)
    assert "no run yet" in kernel.error("%approve")
    assert kinds(kernel.ok(f"%resume {journal}")) == ["state", "step", "ask"]
    kernel.ok("%approve")
    assert "WRITE test_calc.py" in text(kernel.ok("%step"))  # the script goes on at its 4th reply


# --- interrupts ------------------------------------------------------------

class SlowChat(BaseHTTPRequestHandler):
    """A chat-completions server that answers only when `release` is set."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.asked.set()
        self.server.release.wait(TIMEOUT)
        body = json.dumps({"choices": [{"message": {"content": "READ calc.py"}}]}).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the interrupted client has gone

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SlowChat)
    httpd.asked, httpd.release = threading.Event(), threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield httpd
    httpd.release.set()
    httpd.shutdown()
    httpd.server_close()


def test_an_interrupt_stops_the_run_and_resume_takes_it_up(project, tmp_path, slow_server):
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    kernel = Kernel(tmp_path, env=env)
    try:
        url = f"http://127.0.0.1:{slow_server.server_port}/v1"
        kernel.ok(f"%root {project}\n%model openai:slow@{url} --grammar none --context 4096\n%task Add mul")
        kernel.client.execute("%step")
        assert slow_server.asked.wait(TIMEOUT)
        interrupted = time.monotonic()
        kernel.manager.interrupt_kernel()
        reply = kernel.client.get_shell_msg(timeout=TIMEOUT)["content"]
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - interrupted < 5
        assert kernel.manager.is_alive()
        state = text(kernel.ok("%show state"))
        assert "steps: 0 of 20" in state and "stop: interrupted" in state  # nothing of the cut step recorded
        assert "the run was interrupted: use %resume" in kernel.error("%step")
        slow_server.release.set()
        assert "next: step 1" in text(kernel.ok("%resume"))
        assert "READ calc.py" in text(kernel.ok("%step"))
    finally:
        kernel.close()


def processes_marked(mark):
    """Pids of running processes whose command line holds MARK."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark.encode() in (entry / "cmdline").read_bytes():
                if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_an_interrupt_during_a_test_run_kills_the_tests(project, tmp_path):
    # The stop button while RUN executes: the tests must not go on to their own timeout.
    name = f"test_interrupted_{uuid.uuid4().hex[:12]}.py"
    replies = tmp_path / "sleep.json"
    replies.write_text(json.dumps([f"WRITE {name}\nimport time\n\n\ndef test_sleeps():\n"
                                   "    time.sleep(60)\nEND", f"RUN python -m pytest -q {name}"]))
    kernel = Kernel(tmp_path)
    try:
        kernel.ok(f"%root {project}\n%model scripted:{replies}\n%policy write=allow\n%task Sleep")
        kernel.client.execute("%run")
        deadline = time.monotonic() + TIMEOUT
        while not processes_marked(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_marked(name), "the test run never started"
        kernel.manager.interrupt_kernel()
        reply = kernel.client.get_shell_msg(timeout=TIMEOUT)["content"]
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        deadline = time.monotonic() + 5
        while processes_marked(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_marked(name) == [], "the interrupted test run is still running"
        assert "stop: interrupted" in text(kernel.ok("%show state"))
    finally:
        for pid in processes_marked(name):
            os.kill(pid, 9)
        kernel.close()


def test_every_command_has_help():
    for name in COMMANDS:
        assert as_text(help_view(name)).startswith(f"%{name}")


def test_compact_folds_the_steps_so_far_into_a_summary(kernel, project, tmp_path):
    script = tmp_path / "with-summary.json"
    script.write_text(json.dumps(["READ calc.py", "READ test_calc.py", "calc.py holds add; its test passes."]))
    kernel.ok(f"%root {project}\n%model scripted:{script}\n%task Look around\n%step 2")
    shown = kernel.ok("%compact")
    assert kinds(shown) == ["compact"]
    assert "steps 1 to 2 are summarized in the prompt" in text(shown)
    prompt = text(kernel.ok("%show prompt"))
    assert "SUMMARY OF STEPS 1 TO 2:\n    calc.py holds add; its test passes." in prompt and "ACTION 1" not in prompt


def test_fork_makes_the_branch_the_run_and_show_tree_draws_both(kernel, project, replies):
    kernel.ok(f"%root {project}\n%model scripted:{replies}\n%task Add mul\n%step 3\n%approve")
    parent = journal_of(kernel)
    assert kinds(kernel.ok("%fork 3")) == ["state"]
    branch = journal_of(kernel)
    assert branch != parent
    assert text(kernel.ok("%step")).endswith("waiting: %approve or %deny [reason]")  # step 3 asks again
    tree = text(kernel.ok("%show tree"))
    assert f"parent: {parent} (branched before step 3)" in tree and f"this run: {branch}" in tree
