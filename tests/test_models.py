"""Tests for models: every spec kind, and the HTTP adapter against a real local server."""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import start_event

from mlplcode import models
from mlplcode.models import ModelError, model_from_spec

MESSAGES = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Say hello."},
]
SECRET = "sk-test-5ecret-value"


def chat_reply(text):
    """A chat-completions response body as an OpenAI-compatible server sends it."""
    message = {"role": "assistant", "content": text}
    return json.dumps({"choices": [{"index": 0, "message": message}]})


# --- echo, scripted, replay ------------------------------------------------


def test_echo_returns_the_last_message_content():
    assert model_from_spec("echo")(MESSAGES) == "Say hello."


def test_echo_refuses_no_messages():
    with pytest.raises(ModelError, match="no messages"):
        model_from_spec("echo")([])


def test_scripted_replies_in_order_then_runs_out(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["first", "second"]))
    model = model_from_spec(f"scripted:{script}")
    assert [model(MESSAGES), model(MESSAGES)] == ["first", "second"]
    with pytest.raises(ModelError) as caught:
        model(MESSAGES)
    assert str(caught.value) == "scripted model has no reply left (2 used)"


def test_a_resumed_script_starts_after_the_replies_already_used(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(["first", "second", "third"]))
    model = model_from_spec(f"scripted:{script}", used=2)
    assert model(MESSAGES) == "third"
    with pytest.raises(ModelError, match=r"\(3 used\)$"):
        model(MESSAGES)


@pytest.mark.parametrize("content, complaint", [
    (None, "cannot read"),
    ("[\"unclosed", "not valid JSON"),
    ('{"replies": ["a"]}', "must be a JSON array of strings"),
    ('["a", 1]', "must be a JSON array of strings"),
])
def test_scripted_refuses_a_bad_file_when_built(tmp_path, content, complaint):
    script = tmp_path / "script.json"
    if content is not None:
        script.write_text(content)
    with pytest.raises(ModelError, match=complaint) as caught:
        model_from_spec(f"scripted:{script}")
    assert str(script) in str(caught.value)
    assert "\n" not in str(caught.value)


def test_replay_uses_only_reply_events_in_order(tmp_path):
    journal = tmp_path / "run.jsonl"
    events = [
        start_event(tmp_path),
        {"type": "reply", "step": 1, "text": "READ a.py"},
        {"type": "observation", "step": 1, "ok": True, "text": "print(1)"},
        {"type": "reply", "step": 2, "text": "DONE"},
    ]
    journal.write_text("".join(json.dumps(event) + "\n" for event in events))
    model = model_from_spec(f"replay:{journal}")
    assert [model(MESSAGES), model(MESSAGES)] == ["READ a.py", "DONE"]
    with pytest.raises(ModelError, match=r"^replay model has no reply left \(2 used\)$"):
        model(MESSAGES)


@pytest.mark.parametrize("line, complaint", [
    ("{not json", "line 2: not JSON"),
    ('["a list"]', "line 2: not an event"),
])
def test_replay_refuses_a_bad_journal_when_built(tmp_path, line, complaint):
    journal = tmp_path / "run.jsonl"
    journal.write_text(json.dumps(start_event(tmp_path)) + "\n" + line + "\n")
    with pytest.raises(ModelError, match=complaint):
        model_from_spec(f"replay:{journal}")


# --- spec parsing ------------------------------------------------------------


@pytest.mark.parametrize("spec", [
    "gpt-4", "echo:x", "scripted:", "replay:", "ollama:", "openai:qwen",
    "openai:@http://127.0.0.1:1/v1", "openai:qwen@127.0.0.1:1/v1",
    "openai:qwen@ftp://127.0.0.1:1/v1", "openai:qwen@http:///v1",
    "openai:qwen@http://127.0.0.1:port/v1", "openai:qwen@http://127.0.0.1:0/v1",
    "openai:qwen@http://127.0.0.1:70000/v1", "openai:qwen@http://user:pw@127.0.0.1:1/v1",
])
def test_an_unknown_or_malformed_spec_is_a_value_error(spec):
    with pytest.raises(ValueError, match="use scripted:FILE.json, replay:JOURNAL, echo") as caught:
        model_from_spec(spec)
    assert repr(spec) in str(caught.value)


def test_the_limits_are_the_documented_constants():
    assert models.DEFAULT_TIMEOUT == 600.0
    assert models.DEFAULT_MAX_REPLY_BYTES == 1024 * 1024
    assert models.DEFAULT_MAX_TOKENS == 4096
    assert (models.RETRIES, models.RETRY_BACKOFF, models.RETRY_AFTER_LIMIT) == (3, 0.5, 30.0)
    assert models.OLLAMA_BASE_URL == "http://127.0.0.1:11434/v1"


@pytest.mark.parametrize("options, complaint", [
    ({"timeout": 0}, "timeout must be above 0"),
    ({"timeout": -1.0}, "timeout must be above 0"),
    ({"timeout": float("nan")}, "timeout must be above 0"),
    ({"timeout": float("inf")}, "at most a day"),
    ({"max_reply_bytes": 0}, "max_reply_bytes must be a positive integer"),
    ({"max_tokens": 1.5}, "max_tokens must be a positive integer"),
])
def test_limits_no_call_could_keep_are_a_value_error_when_built(options, complaint):
    with pytest.raises(ValueError, match=complaint):
        model_from_spec("openai:qwen@http://127.0.0.1:1/v1", **options)


def test_models_without_a_server_accept_and_ignore_the_http_options():
    model = model_from_spec("echo", timeout=1, max_reply_bytes=1, max_tokens=1, on_retry=print)
    assert model(MESSAGES) == "Say hello."


# --- the HTTP adapter against a real server on 127.0.0.1 -------------------

DROP = (None, "")  # an answer that closes the connection without a response


class ChatServerHandler(BaseHTTPRequestHandler):
    """Records each request and gives the next planned (status, body) answer."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests.append({
            "path": self.path,
            "host": self.headers.get("Host"),
            "authorization": self.headers.get("Authorization"),
            "body": json.loads(body),
        })
        status, text = self.server.answers.pop(0)
        if status is None:
            return  # HTTP/1.0: the connection closes with nothing sent
        if status == "slow":
            time.sleep(0.5)
            return
        payload = text.replace("{authorization}", self.headers.get("Authorization", ""))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload.encode())))
        self.end_headers()
        self.wfile.write(payload.encode())

    def log_message(self, *args):
        pass  # keep the test output quiet


@pytest.fixture
def quick_retries(monkeypatch):
    """Retries wait a hundredth of a second, so the tests of retrying stay fast."""
    monkeypatch.setattr(models, "RETRY_BACKOFF", 0.01)


@pytest.fixture
def server(quick_retries):
    """A chat-completions server on 127.0.0.1; set `answers`, read `requests`."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ChatServerHandler)
    httpd.answers, httpd.requests = [], []
    httpd.base_url = f"http://127.0.0.1:{httpd.server_port}/v1"
    # a short poll interval makes shutdown quick; the default costs 0.5 s a test
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def closed_port():
    """A port on 127.0.0.1 where nothing listens, so connecting is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_openai_posts_the_chat_and_returns_the_reply(server):
    server.answers = [(200, chat_reply("hello"))]
    model = model_from_spec(f"openai:qwen@{server.base_url}")
    assert model(MESSAGES) == "hello"
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["host"] == f"127.0.0.1:{server.server_port}"
    assert request["body"] == {"model": "qwen", "messages": MESSAGES, "temperature": 0,
                               "max_tokens": 4096}
    assert request["authorization"] is None


def test_max_tokens_is_sent_as_given(server):
    server.answers = [(200, chat_reply("hello"))]
    assert model_from_spec(f"openai:qwen@{server.base_url}", max_tokens=12)(MESSAGES) == "hello"
    assert server.requests[0]["body"]["max_tokens"] == 12


def test_proxy_variables_are_not_honoured(server, monkeypatch):
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, f"http://127.0.0.1:{closed_port()}")
    server.answers = [(200, chat_reply("direct"))]
    assert model_from_spec(f"openai:qwen@{server.base_url}")(MESSAGES) == "direct"


def test_the_key_is_sent_from_the_named_variable_at_call_time(server, monkeypatch):
    server.answers = [(200, chat_reply("hello"))]
    model = model_from_spec(f"openai:qwen@{server.base_url}", api_key_env="MLPL_TEST_KEY")
    monkeypatch.setenv("MLPL_TEST_KEY", SECRET)
    assert model(MESSAGES) == "hello"
    assert server.requests[0]["authorization"] == f"Bearer {SECRET}"


def test_a_named_but_unset_key_variable_is_refused_by_name(server, monkeypatch):
    monkeypatch.delenv("MLPL_TEST_KEY", raising=False)
    model = model_from_spec(f"openai:qwen@{server.base_url}", api_key_env="MLPL_TEST_KEY")
    with pytest.raises(ModelError) as caught:
        model(MESSAGES)
    assert str(caught.value) == (
        f"openai:qwen@{server.base_url}: environment variable MLPL_TEST_KEY is not set")
    assert server.requests == []


def test_ollama_is_openai_at_the_local_ollama_url(server, monkeypatch):
    monkeypatch.setattr(models, "OLLAMA_BASE_URL", server.base_url)
    server.answers = [(200, chat_reply("hi"))]
    assert model_from_spec("ollama:qwen2.5-coder:7b")(MESSAGES) == "hi"
    assert server.requests[0]["path"] == "/v1/chat/completions"
    assert server.requests[0]["body"]["model"] == "qwen2.5-coder:7b"


def test_a_client_error_names_the_status_and_is_not_retried(server):
    server.answers = [(400, '{"error":\n "context too long"}'), (200, chat_reply("no"))]
    with pytest.raises(ModelError) as caught:
        model_from_spec(f"openai:qwen@{server.base_url}")(MESSAGES)
    assert str(caught.value) == (
        f'openai:qwen@{server.base_url}: HTTP 400: {{"error": "context too long"}}')
    assert len(server.requests) == 1


def test_a_server_error_is_retried_and_then_named_on_one_line(server):
    crash = "Traceback (most recent call last):\n  model crashed"
    server.answers = [(500, crash)] * 4
    with pytest.raises(ModelError) as caught:
        model_from_spec(f"openai:qwen@{server.base_url}", on_retry=lambda line: None)(MESSAGES)
    message = str(caught.value)
    assert message.startswith(f"openai:qwen@{server.base_url}: HTTP 500: Traceback")
    assert message.endswith("model crashed (after 3 retries)") and "\n" not in message
    assert len(server.requests) == 4


@pytest.mark.parametrize("body, complaint", [
    ("this is not json", "reply is not JSON"),
    ('{"choices": []}', r"reply has no choices\[0\].message.content"),
    ('{"choices": [{"message": {"content": null}}]}', "content is not a string"),
])
def test_a_malformed_reply_is_a_model_error(server, body, complaint):
    server.answers = [(200, body)]
    with pytest.raises(ModelError, match=complaint):
        model_from_spec(f"openai:qwen@{server.base_url}")(MESSAGES)


def test_a_dropped_connection_is_retried_once_and_then_succeeds(server):
    server.answers = [DROP, (200, chat_reply("second time lucky"))]
    assert model_from_spec(f"openai:qwen@{server.base_url}")(MESSAGES) == "second time lucky"
    assert len(server.requests) == 2


def test_connection_failures_get_three_retries(server):
    server.answers = [DROP, DROP, DROP, DROP, (200, chat_reply("too late"))]
    with pytest.raises(ModelError, match=r"connection failed: .* \(after 3 retries\)$"):
        model_from_spec(f"openai:qwen@{server.base_url}")(MESSAGES)
    assert len(server.requests) == 4


def test_a_refused_connection_is_a_one_line_model_error(quick_retries):
    base_url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(ModelError) as caught:
        model_from_spec(f"openai:qwen@{base_url}")(MESSAGES)
    message = str(caught.value)
    assert message.startswith(f"openai:qwen@{base_url}: connection failed: ")
    assert "refused" in message.lower() and message.endswith("(after 3 retries)")


def test_a_timeout_is_not_retried(server):
    server.answers = [("slow", ""), (200, chat_reply("no"))]
    with pytest.raises(ModelError) as caught:
        model_from_spec(f"openai:qwen@{server.base_url}", timeout=0.1)(MESSAGES)
    assert str(caught.value) == (
        f"openai:qwen@{server.base_url}: no complete reply within the 0.1 s deadline")
    assert len(server.requests) == 1


def test_the_key_never_appears_in_error_messages(server, monkeypatch):
    monkeypatch.setenv("MLPL_TEST_KEY", SECRET)
    server.answers = [(401, '{"error": "Incorrect API key provided: {authorization}"}')]
    model = model_from_spec(f"openai:qwen@{server.base_url}", api_key_env="MLPL_TEST_KEY")
    with pytest.raises(ModelError) as caught:
        model(MESSAGES)
    assert "HTTP 401" in str(caught.value) and "Incorrect API key" in str(caught.value)
    assert SECRET not in str(caught.value)

    retries = []
    server.answers = [(503, "overloaded for {authorization}")] * 4
    model = model_from_spec(f"openai:qwen@{server.base_url}", api_key_env="MLPL_TEST_KEY",
                            on_retry=retries.append)
    with pytest.raises(ModelError) as caught:
        model(MESSAGES)
    assert len(retries) == 3 and "[api key]" in retries[0]
    assert SECRET not in str(caught.value) + "".join(retries)

    refused = model_from_spec(f"openai:qwen@http://127.0.0.1:{closed_port()}/v1",
                              api_key_env="MLPL_TEST_KEY")
    with pytest.raises(ModelError) as caught:
        refused(MESSAGES)
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize("key", ["sk-one\nInjected: header", "sk-caf\u00e9"])
def test_a_key_no_header_can_carry_is_refused_by_name(server, monkeypatch, key):
    monkeypatch.setenv("MLPL_TEST_KEY", key)
    model = model_from_spec(f"openai:qwen@{server.base_url}", api_key_env="MLPL_TEST_KEY")
    with pytest.raises(ModelError) as caught:
        model(MESSAGES)
    assert str(caught.value) == (f"openai:qwen@{server.base_url}: environment variable "
                                 "MLPL_TEST_KEY holds characters an HTTP header cannot carry")
    assert server.requests == []


def test_the_models_load_the_grammar_and_the_tools_only_for_a_model_with_a_grammar():
    import subprocess
    import sys

    check = ("import sys; import mlplcode.models as m; loaded = lambda: sorted(n for n in sys.modules"
             " if n.startswith(('mlplcode.grammar', 'mlplcode.tools'))); print(loaded());"
             " m.grammar_fields('gbnf'); print('mlplcode.grammar' in loaded())")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", "True"]
