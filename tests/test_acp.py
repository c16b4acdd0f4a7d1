"""mlplcode acp, started as a subprocess and driven by the ACP SDK's own client side, or by raw JSON lines."""
import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import uuid

import pytest

from mlplcode import Agent
from mlplcode.journal import read_events

from conftest import ADD_MUL_WITH_A_DENIAL, HANG

try:
    import acp
    from acp.schema import AllowedOutcome, ClientCapabilities, RequestPermissionResponse
except ModuleNotFoundError:
    if os.environ.get("MLPLCODE_REQUIRE_TOOLS") == "1":
        raise
    pytest.skip("the agent-client-protocol package (mlplcode[acp]) is not installed", allow_module_level=True)

MLPLCODE = os.path.join(os.path.dirname(sys.executable), "mlplcode")
TASK = "Add a function mul(a, b) to calc.py and a test for it"
REASON = "patch test_calc.py instead of writing it whole"
WAIT = HANG  # seconds a test waits for the agent before it gives up


def runs():
    return os.path.join(os.environ["XDG_STATE_HOME"], "mlplcode", "runs")


def script(tmp_path, replies, name="replies.json"):
    path = tmp_path / name
    path.write_text(json.dumps(replies))
    return f"scripted:{path}"


class Client:
    """An ACP client as an editor is one: it records every update, and answers each permission
    request with the next of ANSWERS (option ids)."""

    def __init__(self, answers=()):
        self.answers, self.updates, self.asked = list(answers), [], []
        self.seen = {}

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))
        self.seen.setdefault(update.session_update, asyncio.Event()).set()

    async def request_permission(self, options, session_id, tool_call, **kwargs):
        self.asked.append((tool_call.model_dump(mode="json", by_alias=True, exclude_none=True),
                           [option.option_id for option in options]))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.answers.pop(0)))

    def kinds(self, name):
        return [update for update in self.updates if update["sessionUpdate"] == name]


@contextlib.asynccontextmanager
async def agent(client, model, *options):
    """`mlplcode acp` as a subprocess, connected to CLIENT and initialized."""
    environment = {"XDG_STATE_HOME": os.environ["XDG_STATE_HOME"],  # and the package under test, if named
                   **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ}}
    async with acp.spawn_agent_process(client, MLPLCODE, "acp", "--model", model, *options, env=environment,
                                       transport_kwargs={"stderr": subprocess.DEVNULL,
                                                         "shutdown_timeout": WAIT}) as (conn, process):
        reply = await asyncio.wait_for(conn.initialize(protocol_version=acp.PROTOCOL_VERSION,
                                                       client_capabilities=ClientCapabilities()), WAIT)
        assert reply.protocol_version == acp.PROTOCOL_VERSION
        yield conn, process
    assert process.returncode == 0  # it ended by itself when its stdin closed


def prompt(conn, session_id, words):
    return asyncio.wait_for(conn.prompt(session_id=session_id, prompt=[acp.text_block(words)]), WAIT)


def test_initialize_says_what_the_agent_can_do(tmp_path):
    async def main():
        async with agent(Client(), script(tmp_path, [])) as (conn, _):
            reply = await conn.initialize(protocol_version=acp.PROTOCOL_VERSION)
            capabilities = reply.agent_capabilities
            assert capabilities.load_session is True
            prompts = capabilities.prompt_capabilities
            assert (prompts.image, prompts.audio, prompts.embedded_context) == (False, False, False)
            assert reply.agent_info.name == "mlplcode"
    asyncio.run(main())


def example_run(project, tmp_path):
    """The example task end to end: the PATCH of calc.py allowed, the WRITE of the test rejected
    with a reason given in the next prompt, the PATCH of the test allowed, then the tests and DONE."""
    client = Client(["allow", "explain", "allow"])

    async def main():
        async with agent(client, script(tmp_path, ADD_MUL_WITH_A_DENIAL)) as (conn, _):
            session = (await conn.new_session(cwd=project)).session_id
            first = await prompt(conn, session, TASK)
            second = await prompt(conn, session, REASON)
            return session, first.stop_reason, second.stop_reason

    return client, *asyncio.run(main())


def test_the_example_task_with_one_write_rejected_for_a_reason(project, tmp_path):
    client, session, first, second = example_run(project, tmp_path)
    assert (first, second) == ("end_turn", "end_turn")  # the first turn ended to let the person say why
    events = read_events(os.path.join(runs(), f"{session}.jsonl"))  # the session is the run, kept outside the root
    assert events[0]["run"] == session and events[0]["task"] == TASK and events[0]["root"] == project
    decisions = [(event["step"], event["approved"], event.get("reason")) for event in events if event["type"] == "decision"]
    assert decisions == [(3, True, None), (4, False, REASON), (5, True, None)]
    assert events[-1] == {"type": "stop", "reason": "done", "message": "added mul and its test"}
    assert "def mul(a, b):" in open(os.path.join(project, "calc.py")).read()
    assert "def test_mul():" in open(os.path.join(project, "test_calc.py")).read()

    starts = client.kinds("tool_call")
    assert [start["kind"] for start in starts] == ["read", "read", "edit", "edit", "edit", "execute", "other"]
    assert starts[0]["locations"] == [{"path": os.path.join(project, "calc.py")}]
    assert starts[2]["locations"] == [{"path": os.path.join(project, "calc.py"), "line": 4}]  # where OLD starts
    assert "locations" not in starts[5]  # a command acts on no one file
    asked = [(call["toolCallId"], options) for call, options in client.asked]
    assert asked == [("step-3", ["allow", "explain", "reject"]), ("step-4", ["allow", "explain", "reject"]),
                     ("step-5", ["allow", "explain", "reject"])]
    write = client.asked[1][0]["content"][0]  # the WRITE is shown as a diff against the file as READ saw it
    assert write["type"] == "diff" and write["path"] == os.path.join(project, "test_calc.py")
    assert write["oldText"] == "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    assert write["newText"].endswith("def test_mul():\n    assert mul(2, 3) == 6\n")

    finished = {update["toolCallId"]: update for update in client.kinds("tool_call_update") if "content" in update}
    assert finished["step-4"]["status"] == "failed" and "DECLINED" in finished["step-4"]["content"][0]["content"]["text"]
    assert [part["type"] for part in finished["step-3"]["content"]] == ["diff", "content"]
    assert finished["step-6"]["status"] == "completed" and "exit code 0" in finished["step-6"]["content"][0]["content"]["text"]
    messages = [update["content"]["text"] for update in client.kinds("agent_message_chunk")]
    assert messages[0] == "```\nREAD calc.py\n```\n"  # the model's reply, shown as it is
    assert messages[-1].startswith("stop: `done`")
    assert client.kinds("user_message_chunk") == []  # the client shows the person's own words


class FailingClient(Client):
    """A client that fails its first permission request as a client without it does."""

    async def request_permission(self, options, session_id, tool_call, **kwargs):
        if not self.asked:
            self.asked.append(None)
            raise acp.RequestError.method_not_found("session/request_permission")
        return await super().request_permission(options, session_id, tool_call, **kwargs)


def test_a_client_that_fails_an_ask_is_named_and_the_next_prompt_asks_again(project, tmp_path):
    client = FailingClient(["allow", "reject"])

    async def main():
        async with agent(client, script(tmp_path, ADD_MUL_WITH_A_DENIAL)) as (conn, _):
            session = (await conn.new_session(cwd=project)).session_id
            with pytest.raises(acp.RequestError) as failed:
                await prompt(conn, session, TASK)
            journal = os.path.join(runs(), f"{session}.jsonl")
            waiting = Agent(journal).waiting().number
            second = await prompt(conn, session, "go on")
            return failed.value, waiting, second.stop_reason, journal

    error, waiting, reason, journal = asyncio.run(main())
    assert error.code == -32603 and "the client failed session/request_permission (-32601" in str(error)
    assert f"step {waiting} still waits for a decision" in str(error) and waiting == 3
    assert reason == "refusal"  # the second prompt asked again: step 3 allowed, step 4 rejected
    decisions = [(e["step"], e["approved"]) for e in read_events(journal) if e["type"] == "decision"]
    assert decisions == [(3, True), (4, False)]


def test_a_bare_reject_ends_the_run_as_a_refusal(project, tmp_path):
    client = Client(["reject"])

    async def main():
        async with agent(client, script(tmp_path, ADD_MUL_WITH_A_DENIAL)) as (conn, _):
            session = (await conn.new_session(cwd=project)).session_id
            reply = await prompt(conn, session, TASK)
            with pytest.raises(acp.RequestError, match=r"the run has stopped \(denied\).*: use a new session"):
                await prompt(conn, session, "please go on")
            return session, reply.stop_reason

    session, reason = asyncio.run(main())
    assert reason == "refusal"
    assert read_events(os.path.join(runs(), f"{session}.jsonl"))[-1]["reason"] == "denied"
    assert "mul" not in open(os.path.join(project, "calc.py")).read()


def test_loading_a_finished_run_replays_its_updates_in_order(project, tmp_path):
    client, session, *_ = example_run(project, tmp_path)
    loader = Client()

    async def main():
        async with agent(loader, script(tmp_path, [], "none.json")) as (conn, _):
            await asyncio.wait_for(conn.load_session(cwd=project, session_id=session), WAIT)
            with pytest.raises(acp.RequestError, match=r"the run has stopped \(done\).*: use a new session"):
                await prompt(conn, session, "and a div too")
            with pytest.raises(acp.RequestError, match="works in"):
                await conn.load_session(cwd=str(tmp_path), session_id=session)
            with pytest.raises(acp.RequestError, match="no run"):
                await conn.load_session(cwd=project, session_id="../" + session)

    asyncio.run(main())
    person = [update for update in loader.updates if update["sessionUpdate"] == "user_message_chunk"]
    assert [update["content"]["text"] for update in person] == [TASK, REASON]
    assert [update for update in loader.updates if update not in person] == client.updates


def processes_with(marker):
    """The command lines, as lists of words, of the processes whose command line holds MARKER."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                words = file.read().split(b"\0")
            if any(marker.encode() in word for word in words):
                found.append(words)
    return found


def sleeping(marker):
    """Whether the test's own Python runs yet, not only the sandbox that starts it."""
    return any(not words[0].endswith(b"bwrap") for words in processes_with(marker))


async def until(condition):
    """Wait, a little at a time and at most WAIT seconds, until CONDITION() holds."""
    for _ in range(WAIT * 20):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"waited {WAIT} s in vain")


def test_a_cancel_during_a_sleeping_run_kills_it_and_a_later_prompt_goes_on(project, tmp_path):
    name = f"test_sleeps_{uuid.uuid4().hex[:8]}.py"
    (tmp_path / "add" / name).write_text("import time\n\n\ndef test_sleeps():\n    time.sleep(120)\n")
    model = script(tmp_path, [f"RUN python -m pytest -q {name}", "READ calc.py"])
    client = Client()

    async def main():
        async with agent(client, model, "--budget", "2") as (conn, _):
            session = (await conn.new_session(cwd=project)).session_id
            turn = asyncio.ensure_future(prompt(conn, session, "run the slow test"))
            await until(lambda: sleeping(name))
            await conn.cancel(session_id=session)
            cancelled = await turn
            left = processes_with(name)
            later = await prompt(conn, session, "that test is slow on purpose; go on")
            return session, cancelled.stop_reason, left, later.stop_reason

    session, cancelled, left, later = asyncio.run(main())
    assert cancelled == "cancelled" and left == []
    events = read_events(os.path.join(runs(), f"{session}.jsonl"))
    kinds = [event["type"] for event in events]
    assert kinds.index("resume") == kinds.index("stop") + 1  # interrupted, then taken up by the next prompt
    assert events[kinds.index("stop")]["reason"] == "interrupted"
    assert events[kinds.index("resume") + 1] == {"type": "note", "text": "that test is slow on purpose; go on"}
    assert later == "max_turn_requests" and events[-1]["reason"] == "budget"
    assert processes_with(name) == []


def test_unknown_methods_and_bad_requests_get_errors_and_the_agent_lives(project, tmp_path):
    async def main():
        async with agent(Client(), script(tmp_path, ["DONE nothing"])) as (conn, _):
            with pytest.raises(acp.RequestError) as unknown:
                await conn.ext_method("mlplcode/nothing", {})
            assert unknown.value.code == -32601
            with pytest.raises(acp.RequestError, match="not an absolute path to a directory"):
                await conn.new_session(cwd="relative/path")
            with pytest.raises(acp.RequestError, match="would lie inside"):  # the journals' own directory
                await conn.new_session(cwd=os.environ["XDG_STATE_HOME"])
            with pytest.raises(acp.RequestError, match="no session"):
                await prompt(conn, "no-such-session", "hello")
            session = (await conn.new_session(cwd=project)).session_id
            with pytest.raises(acp.RequestError, match="the prompt is empty"):
                await prompt(conn, session, "   ")
            with pytest.raises(acp.RequestError, match="does not take image blocks"):
                await conn.prompt(session_id=session, prompt=[acp.image_block("AAAA", "image/png")])
            with pytest.raises(acp.RequestError, match=r"the run stopped \(error\)") as failed:
                await prompt(conn, session, "do nothing")  # DONE unverified, then no replies left
            assert failed.value.code == -32603  # only a model that failed is an error
    asyncio.run(main())


@pytest.mark.parametrize("replies,options,reason,stop", [
    (["READ calc.py"] * 3, [], "end_turn", "stuck"),
    (["READ calc.py", "READ test_calc.py"], ["--budget", "1"], "max_turn_requests", "budget"),
    (["READ calc.py"], ["--policy", "POLICY"], "refusal", "denied"),
])
def test_an_ordinary_end_of_a_run_ends_the_turn_with_a_stop_reason_not_an_error(project, tmp_path, replies,
                                                                                 options, reason, stop):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"read": "deny"}))
    options = [str(policy) if option == "POLICY" else option for option in options]
    client = Client()

    async def main():
        async with agent(client, script(tmp_path, replies), *options) as (conn, _):
            session = (await conn.new_session(cwd=project)).session_id
            return session, (await prompt(conn, session, TASK)).stop_reason

    session, answered = asyncio.run(main())
    assert answered == reason
    assert read_events(os.path.join(runs(), f"{session}.jsonl"))[-1]["reason"] == stop
    last = [update["content"]["text"] for update in client.kinds("agent_message_chunk")][-1]
    assert last.startswith(f"stop: `{stop}`")  # the last message says why


def test_acp_takes_the_context_and_the_grammar_and_says_what_it_settled(project, tmp_path):
    from test_server_probe import serving

    client = Client()

    async def main(spec, *options):
        async with agent(client, spec, *options) as (conn, _):
            session = (await conn.new_session(cwd=project)).session_id
            return await prompt(conn, session, TASK)

    with serving("llama.cpp", 4096, ["READ calc.py"]) as (server, spec):
        answered = asyncio.run(main(spec, "--budget", "1", "--grammar", "none"))
        assert "grammar" not in server.requests[0]  # --grammar none wins over a server that takes one
    thoughts = [update["content"]["text"] for update in client.kinds("agent_thought_chunk")]
    assert answered.stop_reason == "max_turn_requests"
    assert thoughts[0].startswith("`model: llama.cpp's server; context 4096 tokens, as the server says;")
    with pytest.raises(acp.RequestError, match="the smallest context that works is"):
        asyncio.run(main(script(tmp_path, ["READ calc.py"]), "--context", "512"))
    refused = subprocess.run([MLPLCODE, "acp", "--model", "echo", "--grammar", "ebnf"], capture_output=True,
                             text=True, timeout=WAIT)
    assert refused.returncode == 2 and "--grammar" in refused.stderr


class Raw:
    """A client of raw JSON lines, with no SDK: what the transport rule asks of any client."""

    def __init__(self, model, *options):
        environment = {**os.environ, "XDG_STATE_HOME": os.environ["XDG_STATE_HOME"]}
        self.process = subprocess.Popen([MLPLCODE, "acp", "--model", model, *options], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment)
        self.lines = []

    def write(self, data):
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message):
        self.write(json.dumps(message).encode() + b"\n")

    def read(self):
        """The next message: every line of stdout must be one JSON-RPC 2.0 message."""
        line = self.process.stdout.readline()
        self.lines.append(line)
        message = json.loads(line)
        assert line.endswith(b"\n") and message["jsonrpc"] == "2.0"
        return message

    def reply(self, id):
        """Read up to the response to request ID, answering permission requests with allow."""
        while True:
            message = self.read()
            if message.get("method") == "session/request_permission":
                self.send({"jsonrpc": "2.0", "id": message["id"],
                           "result": {"outcome": {"outcome": "selected", "optionId": "allow"}}})
            elif "method" not in message and message["id"] == id:
                return message

    def close(self):
        rest, errors = self.process.communicate(timeout=WAIT)  # closes stdin first
        return rest, errors.decode()


def test_a_raw_json_lines_client_runs_the_example_to_the_end(project, tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"write": "allow"}))
    raw = Raw(script(tmp_path, ["READ calc.py", "READ test_calc.py"] + ADD_MUL_WITH_A_DENIAL[2:4]
                     + ADD_MUL_WITH_A_DENIAL[5:]), "--policy", str(policy))
    raw.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
    assert raw.reply(1)["result"]["protocolVersion"] == 1
    raw.send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": project, "mcpServers": []}})
    session = raw.reply(2)["result"]["sessionId"]
    raw.send({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
              "params": {"sessionId": session, "prompt": [{"type": "text", "text": TASK}]}})
    assert raw.reply(3)["result"] == {"stopReason": "end_turn"}
    rest, errors = raw.close()
    assert rest == b"" and raw.process.returncode == 0  # nothing but messages, and a clean end
    assert sum(b'"sessionUpdate":"tool_call"' in line for line in raw.lines) == 6
    assert "mlplcode acp: protocol version 1" in errors  # what is said to a person goes to stderr


@pytest.mark.parametrize("line, code, id", [
    (b"not json", -32700, None),
    (b"[1, 2]", -32600, None),
    (b'{"jsonrpc": "1.0", "id": 7, "method": "initialize", "params": {}}', -32600, 7),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "initialize"}', -32600, None),
    (b'{"jsonrpc": "2.0", "id": 8, "method": 5}', -32600, 8),
    (b'{"jsonrpc": "2.0", "id": 9, "method": "initialize", "params": "x"}', -32600, 9),
    (b'{"jsonrpc": "2.0", "id": 10, "error": "x"}', -32600, 10),
    (b'{"jsonrpc": "2.0", "id": 11}', -32600, 11),
    (b"[" * 100000, -32700, None),
    (b'{"jsonrpc": "2.0", "id": 12, "method": "session/unknown", "params": {}}', -32601, 12),
    (b'{"jsonrpc": "2.0", "id": 13, "method": "session/new", "params": {"cwd": 5}}', -32602, 13),
])
def test_malformed_json_rpc_gets_an_error_and_the_agent_lives(line, code, id, tmp_path):
    raw = Raw(script(tmp_path, []))
    raw.write(line + b"\n")
    error = raw.read()
    assert error["id"] == id and error["error"]["code"] == code
    raw.send({"jsonrpc": "2.0", "id": 99, "method": "initialize", "params": {"protocolVersion": 1}})
    assert raw.reply(99)["result"]["protocolVersion"] == 1
    assert raw.close()[0] == b"" and raw.process.returncode == 0


def test_the_first_initialize_is_answered_before_the_sdk_and_as_the_sdk_answers(tmp_path):
    from mlplcode import acp_wire
    assert acp_wire.PROTOCOL_VERSION == acp.PROTOCOL_VERSION
    raw = Raw(script(tmp_path, []))
    for id, version in ((1, 1), ("second", 1), (3, 7)):  # the first is ours; the SDK answers the others
        raw.send({"jsonrpc": "2.0", "id": id, "method": "initialize",
                  "params": {"protocolVersion": version, "clientCapabilities": {"terminal": False}}})
    answers = [raw.read() for _ in range(3)]
    assert [answer["id"] for answer in answers] == [1, "second", 3]
    assert answers[0]["result"] == answers[1]["result"] == answers[2]["result"]
    assert raw.lines[0].replace(b'"id":1,', b'"id":3,') == raw.lines[2]  # the same line, byte for byte
    assert raw.close()[0] == b"" and raw.process.returncode == 0


@pytest.mark.parametrize("first", [
    {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {"protocolVersion": -1}},
    {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {"protocolVersion": True}},
    {"jsonrpc": "2.0", "id": 5, "method": "initialize"},
    {"jsonrpc": "2.0", "method": "initialize", "params": {"protocolVersion": 1}},
    {"jsonrpc": "2.0", "id": 5, "method": "session/new", "params": {"cwd": "relative"}},
])
def test_a_first_line_that_is_not_a_plain_initialize_is_left_to_the_sdk(first, tmp_path):
    from mlplcode.acp_wire import answer_initialize, is_initialize
    assert not is_initialize(first)
    written = io.BytesIO()
    line = json.dumps(first).encode() + b"\n"
    assert list(answer_initialize(iter([line, b"next\n"]), written)) == [line, b"next\n"]
    assert written.getvalue() == b""
    answers = []
    for before in ([], [{"jsonrpc": "2.0", "id": 98, "method": "initialize", "params": {"protocolVersion": 1}}]):
        raw = Raw(script(tmp_path, []))  # the line first, then second after an initialize the SDK never saw
        for message in [*before, first, {"jsonrpc": "2.0", "id": 99, "method": "ping"}]:
            raw.send(message)
        seen = [raw.read() for _ in range(len(before) + 1 + ("id" in first))]
        answers.append([message for message in seen if message.get("id") in (5, 99)])
        raw.close()
        assert raw.process.returncode == 0
    assert answers[0] == answers[1], answers  # the SDK answers the line wherever it comes


def test_a_line_longer_than_the_limit_is_read_to_its_end_and_refused():
    from mlplcode.acp_wire import lines, read_message
    read = list(lines(io.BytesIO(b"x" * 25 + b"\n{}\n" + b"z" * 10 + b"\n" + b"y" * 11), limit=10))
    assert read == [None, b"{}\n", b"z" * 10 + b"\n", None]
    assert read_message(None)[1]["error"]["code"] == -32700


def test_nothing_but_the_protocol_reaches_stdout():
    program = ("import os; from mlplcode.acp_wire import take_stdio\n"
               "reading, writing = take_stdio()\n"
               "print('a stray print'); os.system('echo a child process')\n"
               "writing.write(reading.readline()); writing.flush()\n")
    result = subprocess.run([sys.executable, "-c", program], input=b"a message\n", capture_output=True)
    assert result.stdout == b"a message\n"
    assert b"a stray print" in result.stderr and b"a child process" in result.stderr


def test_the_acp_command_refuses_a_bad_model_spec_in_one_line(tmp_path):
    result = subprocess.run([MLPLCODE, "acp", "--model", "gpt"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "unknown model spec 'gpt'" in result.stderr


def test_without_the_acp_package_the_command_says_what_to_install():
    program = "import sys; sys.modules['acp'] = None; from mlplcode.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", program, "acp", "--model", "echo"], capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("mlplcode acp: needs the Agent Client Protocol package:"
                             " pip install 'mlplcode[acp]'\n")
    usage = subprocess.run([sys.executable, "-m", "mlplcode.cli", "acp", "--help"], capture_output=True, text=True)
    assert usage.returncode == 0 and usage.stdout.startswith("usage: mlplcode acp")


def test_a_stop_reason_from_a_journal_is_shown_escaped_in_a_code_span():
    from mlplcode import trust
    from mlplcode.acp import updates
    from mlplcode.journal import State, apply

    hostile = "done\u202e [look](http://x) \x1b[2J`"
    state = State()
    for event in ({"type": "start", "task": "t", "budget": 3, "policy": {}},
                  {"type": "stop", "reason": hostile, "message": "m"}):
        shown = updates(event, apply(state, event))
    assert len(shown) == 1  # a run stopped before its first step has no tool call to fail
    said = shown[-1].content.text
    assert not [char for char in said if trust.is_invisible(char)]
    assert said.startswith("stop: `` done\\u202e [look](http://x) \\x1b[2J` ``\n\n")


def test_the_ask_of_a_done_offers_to_refuse_it_not_to_end_the_run():
    from mlplcode.acp import permission_options

    done = permission_options({"tool": "done", "summary": "s"})
    write = permission_options({"tool": "write", "path": "a.py", "content": ""})
    assert [option.option_id for option in done] == [option.option_id for option in write]
    assert [option.kind for option in done] == [option.kind for option in write]
    assert "end the run" in write[-1].name and "the run goes on" in done[-1].name
    assert not [option.name for option in done if "end the run" in option.name]
