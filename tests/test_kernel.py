"""The mlplcode kernel, driven over jupyter_client as Jupyter drives it."""
import json
import os
import sys
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

from conftest import HANG, install_kernelspec
from mlplcode import Agent
from mlplcode.kernel import COMMANDS, help_view
from mlplcode.policy import DEFAULT_POLICY
from mlplcode.show import as_text
from mlplcode.tools.run import RUN_TIMEOUT_SECONDS

install_kernelspec()  # before any kernel test class is set up
TIMEOUT = HANG


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

    def ok_after_interrupt(self, code):
        """ok, for the first cell after an interrupted one: ipykernel answers "aborted" to a request
        that reaches it before it has finished aborting its queue (its stop_on_error), a race the
        test loses now and then; such a request is sent again, a few times at most."""
        for _ in range(10):
            reply, outputs = self.cell(code)
            if reply["status"] != "aborted":
                break
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
    complete_code_samples = ["%step", "Keep add unchanged.", "%%task\nAdd mul", "%root x\n%step 2",
                             "%%note\n%approve is what I would say"]
    incomplete_code_samples = ["%%task", "%%task\n\n", "%%note"]
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
    assert kinds(shown) == ["decision"] and "patched calc.py" in text(shown)
    # The decision and what came of it, not the step and its diff again (the cell above shows them).
    assert text(shown).splitlines()[:2] == ["step 3: PATCH calc.py",
                                            "verdict: ask (PATCH calc.py is write: ask), approved by the human"]
    assert "reply:" not in text(shown) and "+def mul" not in text(shown)
    shown = kernel.ok("%step")
    assert "waiting: %approve or %deny [reason]" in text(shown)
    assert "+def test_mul():" in shown[0]["content"]["data"]["text/plain"]  # the WRITE as a diff
    shown = kernel.ok("%deny patch the test file instead")
    assert kinds(shown) == ["decision"] and "DECLINED" in text(shown) and "declined by the human" in text(shown)
    assert "+def test_mul" not in text(shown)
    prompt = text(kernel.ok("%show prompt"))
    assert "NOTE FROM THE HUMAN:\n    patch the test file instead" in prompt
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
    shown = kernel.ok("%deny")
    assert kinds(shown) == ["decision", "stop"]
    assert "stop: denied: step 3: the human declined PATCH calc.py" in text(shown)
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


def usage_error(kernel, code):
    """The one line a refused cell answers with; a refusal of the kernel's, never Python's."""
    reply, _ = kernel.cell(code)
    assert reply["status"] == "error" and reply["ename"] == "UsageError", (code, reply["ename"], reply["evalue"])
    assert len(reply["traceback"]) == 1 and "\n" not in reply["evalue"]
    return reply["evalue"]


def command_line_refusal(capsys, *options):
    """What `mlplcode run` says of OPTIONS, without its prefix and suffix."""
    from mlplcode.cli import main
    with pytest.raises(SystemExit):
        main(["run", "t", "--root", ".", "--model", "echo", *options])
    return capsys.readouterr().err.strip().removeprefix("mlplcode run: ").removesuffix(" (see --help)")


def test_bad_arguments_are_answered_with_the_commands_usage_not_pythons_words(kernel, project, capsys):
    usage = "%model " + COMMANDS["model"][0]
    for cell in ["%model", "%model ", "%model echo extra", "%model echo --context", "%model echo --seed 1"]:
        assert usage in usage_error(kernel, cell)
    for options in [["--grammar", "bogus"], ["--context", "-5"], ["--context", "1e3"], ["--context", "²"],
                    ["--timeout", "nan"], ["--timeout", "-1"]]:
        said = command_line_refusal(capsys, *options)
        assert said.startswith(f"argument {options[0]}: ") and options[1] in said
        assert said in usage_error(kernel, "%model echo " + " ".join(options))
    assert "model: none yet" in text(kernel.ok("%show state"))  # a refused %model sets nothing
    assert usage_error(kernel, "%budget ²") == "%budget N: N is a positive whole number, not '²'"
    assert usage_error(kernel, "%save") == "%save FILE.ipynb|FILE.org|FILE.md"
    assert usage_error(kernel, "%help deny extra") == "%help [COMMAND]: one command at a time, not 'deny extra'"
    kernel.ok(f"%root {project}\n%model echo --grammar gbnf --context 4096\n%task t")
    for cell, line in [("%step ²", "%step N"), ("%step 2 3", "%step N"), ("%fork ²", "%fork N"), ("%fork", "%fork N")]:
        assert usage_error(kernel, cell).startswith(line + ": N is a positive whole number")
    assert usage_error(kernel, "%save") == "%save FILE.ipynb|FILE.org|FILE.md"


def test_a_count_is_what_int_reads_as_a_positive_decimal_and_nothing_else():
    from mlplcode.kernel import UsageError, positive
    assert positive("7", "%step N") == 7 and positive("120", "%step N") == 120
    for text in ["", "0", "00", "-1", "+1", " 1", "1_0", "1.0", "²", "¹²", "½", "two"]:
        with pytest.raises(UsageError, match=r"^%step N: N is a positive whole number"):
            positive(text, "%step N")


def test_a_failure_inside_a_step_is_an_error_reply_and_the_kernel_lives(kernel, project, tmp_path):
    kernel.ok(f"%root {project}\n%model echo\n%task t")
    journal = pathlib.Path(journal_of(kernel))
    journal.unlink()
    journal.mkdir()  # the journal can no longer be appended to
    assert "Is a directory" in kernel.error("%step")
    assert kernel.manager.is_alive()
    assert "help" in text(kernel.ok("%help help"))


@pytest.mark.parametrize("word", ["exit", "quit", "quit()"])
def test_exit_and_quit_leave_the_console_and_are_no_note(kernel, project, word):
    kernel.ok(f"%root {project}\n%model echo\n%task Add mul")
    reply, outputs = kernel.cell(word)
    assert reply["status"] == "ok"
    assert reply["payload"] == [{"source": "ask_exit", "keepkernel": False}]  # jupyter console leaves
    assert "%resume takes it up again" in text(outputs)
    step = kernel.cell("%step")
    assert step[0]["payload"] == []
    assert "NOTE FROM THE HUMAN" not in step[1][0]["content"]["data"]["text/plain"]  # the echo: its prompt
    assert kinds(kernel.ok(f"%%note\n{word}")) == ["note"]  # a note that is only the word, on purpose


def test_a_note_cell_reaches_the_next_prompt(kernel, project):
    kernel.ok(f"%root {project}\n%model echo\n%task Look around")
    assert kinds(kernel.ok("Keep add unchanged.")) == ["note"]
    reply = kernel.ok("%step")[0]["content"]["data"]["text/plain"]
    assert "NOTE FROM THE HUMAN:\n    Keep add unchanged." in reply


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
        request = kernel.client.execute("%step")
        assert slow_server.asked.wait(TIMEOUT)
        interrupted = time.monotonic()
        kernel.manager.interrupt_kernel()
        reply = kernel.client.get_shell_msg(timeout=TIMEOUT)["content"]
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - interrupted < 5
        # The cell shows how the run stands after the interrupt, then the error.
        outputs = outputs_of(kernel, request)
        assert [m["msg_type"] for m in outputs] == ["display_data", "error"]
        assert kinds(outputs[:1]) == ["state"] and "stop: interrupted" in text(outputs[:1])
        assert kernel.manager.is_alive()
        state = text(kernel.ok_after_interrupt("%show state"))
        assert "steps: 0 of 20" in state and "stop: interrupted" in state  # nothing of the cut step recorded
        assert "the run was interrupted: use %resume" in kernel.error("%step")
        slow_server.release.set()
        assert "next: step 1" in text(kernel.ok("%resume"))
        assert "READ calc.py" in text(kernel.ok("%step"))
    finally:
        kernel.close()


def outputs_of(kernel, request):
    """The outputs of the cell sent as REQUEST, read from the output channel until the kernel is idle."""
    outputs = []
    while True:
        message = kernel.client.get_iopub_msg(timeout=TIMEOUT)
        if message["parent_header"].get("msg_id") != request:
            continue
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return outputs
        if message["msg_type"] in ("stream", "display_data", "execute_result", "error"):
            outputs.append(message)


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
                                   "    time.sleep(3600)\nEND", f"RUN python -m pytest -q {name}"]))
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
        # Gone well before RUN's own deadline would have killed them: the interrupt did.
        deadline = time.monotonic() + RUN_TIMEOUT_SECONDS / 2
        while processes_marked(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes_marked(name) == [], "the interrupted test run is still running"
        assert "stop: interrupted" in text(kernel.ok_after_interrupt("%show state"))
    finally:
        for pid in processes_marked(name):
            os.kill(pid, 9)
        kernel.close()


def test_every_command_has_help():
    for name in COMMANDS:
        assert as_text(help_view(name)).startswith(f"%{name}")


def test_compact_folds_the_steps_so_far_into_a_summary(kernel, project, tmp_path):
    script = tmp_path / "reads.json"
    script.write_text(json.dumps(["READ calc.py", "READ test_calc.py", "READ calc.py"]))
    kernel.ok(f"%root {project}\n%model scripted:{script}\n%task Look around\n%step 2")
    shown = kernel.ok("%compact")
    assert kinds(shown) == ["compact"]
    assert "steps 1 to 2 are summarized in the prompt" in text(shown)
    prompt = text(kernel.ok("%show prompt"))
    # A script's replies are actions: the summary is made from the journal, and the script keeps its third.
    assert ("NOTES ON STEPS 1 TO 2 (a summary written for you, not what the tools answered):\n"
            "    step 1: READ calc.py: calc.py (5 lines)" in prompt) and "ACTION 1" not in prompt
    assert "READ calc.py" in text(kernel.ok("%step"))


def test_fork_makes_the_branch_the_run_and_show_tree_draws_both(kernel, project, replies):
    kernel.ok(f"%root {project}\n%model scripted:{replies}\n%task Add mul\n%step 3\n%approve")
    parent = journal_of(kernel)
    assert kinds(kernel.ok("%fork 3")) == ["state"]
    branch = journal_of(kernel)
    assert branch != parent
    assert text(kernel.ok("%step")).endswith("waiting: %approve or %deny [reason]")  # step 3 asks again
    tree = text(kernel.ok("%show tree"))
    assert f"parent: {parent} (branched before step 3)" in tree and f"this run: {branch}" in tree


# --- settings, runs on disk, and taking one up -----------------------------

def test_the_state_before_a_run_is_the_settings_as_commands_write_them(kernel, project):
    before = text(kernel.ok("%show state"))
    assert before.splitlines() == [
        "root: none yet: use %root DIR or %root --copy DIR", "model: none yet: use %model SPEC",
        "budget: 20 steps", "policy: " + " ".join(f"{k}={v}" for k, v in DEFAULT_POLICY.items()),
        "run: none yet: use %task TEXT to start one, or %resume [JOURNAL]"], before
    kernel.ok(f"%root {project}\n%model echo --context 4096 --timeout 30\n%policy run=allow\n%task --next Add mul")
    after = text(kernel.ok("%show state"))
    assert f"root: {project}" in after and "model: echo --context 4096 --timeout 30" in after
    assert "run=allow" in after and "task: Add mul" in after
    assert "None" not in before + after and "{" not in before + after


def test_task_next_keeps_the_task_for_a_bare_task_cell(kernel, project):
    assert "%task --next TEXT" in kernel.error("%task --next")
    assert "%task needs a task" in kernel.error("%task")
    kernel.ok(f"%root {project}\n%model echo")
    assert text(kernel.ok("%task --next Add mul\n%task --next Add div")) == (
        "task of the next run: Add mul\n\ntask of the next run: Add div\n")
    assert "task: Add div" in text(kernel.ok("%task"))


def start_runs(tmp_path, project, replies, state):
    """Two runs in a kernel of its own, under the state directory STATE: one finished, one waiting at an ask."""
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    first = Kernel(tmp_path, env=env)
    try:
        first.ok(f"%root {project}\n%model scripted:{replies}\n%task Look and stop\n%step 3\n%deny")
        done = journal_of(first)
        first.ok(f"%model scripted:{replies}\n%task Add mul\n%step 3")
        waiting = journal_of(first)
    finally:
        first.close()
    return env, done, waiting


def test_resume_alone_in_a_new_kernel_takes_up_the_unfinished_run_last_written(project, replies, tmp_path):
    env, done, waiting = start_runs(tmp_path, project, replies, tmp_path / "state")
    os.utime(done)  # the finished run is the one written last; it is not taken up
    kernel = Kernel(tmp_path, env=env)
    try:
        runs = text(kernel.ok("%show runs"))
        assert runs.startswith(f"2 runs in {tmp_path / 'state' / 'mlplcode' / 'runs'}, the last written first")
        assert runs.index(done) < runs.index(waiting)
        assert "task: Look and stop" in runs and "stop: denied\n" in runs + "\n"
        assert "steps: 3 of 20\n    stop: none yet (unfinished: %resume takes it up)" in runs
        shown = kernel.ok("%resume")
        assert kinds(shown) == ["state", "step", "ask"]
        assert f"journal: {waiting}" in text(shown) and "task: Add mul" in text(shown)
        assert "patched calc.py" in text(kernel.ok("%approve"))
    finally:
        kernel.close()


def test_resume_alone_refuses_when_no_run_can_go_on(project, replies, tmp_path):
    env, done, waiting = start_runs(tmp_path, project, replies, tmp_path / "state")
    shutil.rmtree(project)  # the waiting run's project is gone: nothing is left to take up
    kernel = Kernel(tmp_path, env=env)
    try:
        assert f"root: {project} (gone)" in text(kernel.ok("%show runs"))
        assert kernel.error("%resume") == (
            f"no unfinished run in {tmp_path / 'state' / 'mlplcode' / 'runs'} to take up: %show runs lists the"
            " runs there, %resume JOURNAL takes up one of them, %task TEXT starts a new one")
        # Named, the journal is refused in the one line the agent gives.
        assert kernel.error(f"%resume {waiting}") == f"{waiting}: the run's project {project} is gone"
    finally:
        kernel.close()


def test_show_runs_lists_an_unreadable_journal_with_its_reason(kernel, tmp_path):
    runs = tmp_path / "state" / "mlplcode" / "runs"
    runs.mkdir(parents=True)
    (runs / "broken.jsonl").write_text("not json\n")
    kernel.close()
    kernel.__init__(tmp_path, env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")})
    shown = text(kernel.ok("%show runs"))
    assert "1 runs in" in shown and "broken:\n    unreadable: " in shown and "line 1: not JSON" in shown


# --- highlighting ----------------------------------------------------------

def test_the_kernel_names_a_lexer_that_pygments_finds(kernel):
    from pygments.lexers import get_lexer_by_name
    from pygments.token import Keyword, Name, Operator, String, Text
    kernel.client.kernel_info()
    info = kernel.client.get_shell_msg(timeout=TIMEOUT)["content"]["language_info"]
    assert (info["pygments_lexer"], info["codemirror_mode"]) == ("mlplcode", "text/plain")
    lexer = get_lexer_by_name(info["pygments_lexer"])  # through the entry point pyproject.toml declares
    tokens = [(kind, value) for kind, value in lexer.get_tokens("%root --copy add\n%policy write=ask\n%%task\nAdd mul\n")
              if value.strip()]
    assert tokens == [(Keyword, "%root"), (Name.Attribute, "--copy"), (String, "add"), (Keyword, "%policy"),
                      (Name.Variable, "write"), (Operator, "="),
                      (Name.Constant, "ask"), (Keyword, "%%task"), (String, "\nAdd mul\n")]
    for name in COMMANDS:
        assert next(iter(lexer.get_tokens(f"%{name} x"))) == (Keyword, f"%{name}")
    assert list(lexer.get_tokens("Keep add.\n%step\n")) == [(Text, "Keep add.\n%step\n")]  # a note, whole
    assert [(kind, value) for kind, value in lexer.get_tokens("%%note\n%step\n") if value.strip()] == [
        (Keyword, "%%note"), (String, "\n%step\n")]


def test_exit_in_a_real_jupyter_console_leaves_it(project, tmp_path):
    """`jupyter console --kernel mlplcode`, typed at as a person would: a task, then exit."""
    pexpect = pytest.importorskip("pexpect")
    console = os.path.join(os.path.dirname(sys.executable), "jupyter-console")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "TERM": "dumb"}
    child = pexpect.spawn(console, ["--kernel", "mlplcode", "--simple-prompt"], cwd=str(tmp_path), env=env,
                          encoding="utf-8", timeout=HANG)
    try:
        child.expect(r"In \[1\]: ")
        child.sendline(f"%root {project}")
        child.expect(r"In \[2\]: ")
        child.sendline("exit")
        left = child.expect([pexpect.EOF, r"In \[3\]: "])  # a third prompt: exit was taken as a note
        shown = child.before
    finally:
        child.close(force=True)
    assert left == 0 and "%resume takes it up again" in shown
    assert child.exitstatus == 0
