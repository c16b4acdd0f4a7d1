"""Model faults: a server that fails, or misbehaves on purpose, ends the call with one ModelError line.

Every server here is real and listens on 127.0.0.1. Timing bounds in these
tests only keep a broken build from hanging; they are not speed claims.
"""
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlplcode import models
from mlplcode.cli import main
from mlplcode.journal import read_events
from mlplcode.models import ModelError, model_from_spec

MESSAGES = [{"role": "user", "content": "Say hello."}]
MIB = 1024 * 1024
HANG_GUARD = 30  # seconds: far beyond any deadline here, only so that a bug cannot hang the suite


def chat_body(text):
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})


def answer(status, body, headers=()):
    """A behaviour: answer with STATUS, the text BODY and any extra HEADERS."""
    def behave(handler):
        payload = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        handler.send_response(status)
        for name, value in headers:
            handler.send_header(name, value)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)
    return behave


def endless(handler):
    """A behaviour: a 200 whose body never ends (no length; it would end when the connection closes)."""
    handler.send_response(200)
    handler.end_headers()
    block = b"[" * 65536
    while not handler.server.stopping.is_set():
        handler.wfile.write(block)


def fifty_megabytes(handler):
    """A behaviour: a 200 with a declared body of 50 MB, sent a MiB at a time."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(50 * MIB))
    handler.end_headers()
    block = b" " * MIB
    for _ in range(50):
        handler.wfile.write(block)


def drip_body(handler):
    """A behaviour: a 200 whose body comes one byte a second, never finishing."""
    handler.send_response(200)
    handler.send_header("Content-Length", "1000")
    handler.end_headers()
    drip(handler)


def drip_headers(handler):
    """A behaviour: a status line, then a header one byte a second, never finishing."""
    handler.wfile.write(b"HTTP/1.0 200 OK\r\nX-Drip: ")
    drip(handler)


def drip(handler):
    while not handler.server.stopping.wait(1.0):
        handler.wfile.write(b"a")
        handler.wfile.flush()


def hang_up(handler):
    """A behaviour: close the connection without answering."""


class FaultHandler(BaseHTTPRequestHandler):
    """Records each request's JSON body, then behaves as the next planned behaviour says."""

    def do_POST(self):
        self.server.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        behaviours = self.server.behaviours
        behave = behaviours.pop(0) if len(behaviours) > 1 else behaviours[0]
        try:
            behave(self)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up, which is what it should do when it has had enough

    def log_message(self, *args):
        pass


@pytest.fixture
def server(monkeypatch):
    """A server on 127.0.0.1; set `behaviours` (the last one repeats), read `requests`."""
    monkeypatch.setattr(models, "RETRY_BACKOFF", 0.01)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FaultHandler)
    httpd.behaviours, httpd.requests, httpd.stopping = [], [], threading.Event()
    httpd.spec = f"openai:qwen@http://127.0.0.1:{httpd.server_port}/v1"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield httpd
    httpd.stopping.set()
    httpd.shutdown()
    httpd.server_close()


def failure(server, **options):
    """The one-line message of the ModelError that a call to SERVER ends with."""
    with pytest.raises(ModelError) as caught:
        model_from_spec(server.spec, **options)(MESSAGES)
    message = str(caught.value)
    assert message.startswith(server.spec + ": ") and "\n" not in message
    return message


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- what the server sends -------------------------------------------------


def test_a_body_that_never_ends_is_cut_off_at_the_cap(server):
    server.behaviours = [endless]
    assert failure(server, max_reply_bytes=MIB).endswith(f": reply is longer than {MIB} bytes")
    assert len(server.requests) == 1


def test_a_body_of_50_mb_is_refused_after_the_first_mib(server):
    server.behaviours = [fifty_megabytes]
    assert failure(server).endswith(f": reply is longer than {MIB} bytes")


def test_a_body_of_exactly_the_cap_is_read(server):
    reply = "x" * 1000
    server.behaviours = [answer(200, chat_body(reply))]
    assert model_from_spec(server.spec, max_reply_bytes=len(chat_body(reply)))(MESSAGES) == reply


@pytest.mark.parametrize("behave", [drip_body, drip_headers], ids=["body", "headers"])
def test_a_server_that_drips_a_byte_a_second_is_cut_off_at_the_deadline(server, behave):
    server.behaviours = [behave]
    began = time.monotonic()
    assert failure(server, timeout=2).endswith(": no complete reply within the 2 s deadline")
    assert time.monotonic() - began < HANG_GUARD


def test_json_nested_200000_deep_is_one_line_and_no_recursion_error(server):
    server.behaviours = [answer(200, "[" * 200_000 + "]" * 200_000)]
    assert failure(server).endswith(": reply is JSON nested too deeply to read")


@pytest.mark.parametrize("escaped, replaced", [
    ("a\\ud800b", "a\ufffdb"),              # a lone high surrogate
    ("\\udc00z", "\ufffdz"),                # a lone low surrogate
    ("\\ud83d\\ude00", "\U0001F600"),       # a whole pair is one character, and kept
])
def test_a_lone_surrogate_becomes_the_replacement_character(server, escaped, replaced):
    server.behaviours = [answer(200, '{"choices": [{"message": {"content": "%s"}}]}' % escaped)]
    reply = model_from_spec(server.spec)(MESSAGES)
    assert reply == replaced
    reply.encode("utf-8")  # the journal can write it


def test_bytes_that_are_not_utf8_become_the_replacement_character(server):
    server.behaviours = [answer(200, b'{"choices": [{"message": {"content": "a\xffb"}}]}')]
    assert model_from_spec(server.spec)(MESSAGES) == "a\ufffdb"


def test_a_malformed_status_line_is_one_line(server):
    server.behaviours = [lambda handler: handler.wfile.write(b"NOT HTTP AT ALL\r\n\r\n")]
    assert ": request failed: " in failure(server)


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/v\u00e9", "http://a..b:{port}/v1"])
def test_a_path_or_host_that_cannot_be_sent_is_one_line(server, url):
    spec = "openai:qwen@" + url.format(port=server.server_port)
    with pytest.raises(ModelError) as caught:
        model_from_spec(spec, on_retry=pytest.fail)(MESSAGES)
    assert str(caught.value).startswith(spec + ": request failed: ")
    assert "\n" not in str(caught.value)


def test_https_to_a_plain_http_server_is_one_line(server):
    port = server.server_port
    with pytest.raises(ModelError) as caught:
        model_from_spec(f"openai:qwen@https://127.0.0.1:{port}/v1")(MESSAGES)
    assert ": request failed: " in str(caught.value) and "\n" not in str(caught.value)


# --- retries ---------------------------------------------------------------


def test_a_refused_connection_is_retried_three_times_each_shown(monkeypatch):
    monkeypatch.setattr(models, "RETRY_BACKOFF", 0.01)
    spec = f"openai:qwen@http://127.0.0.1:{closed_port()}/v1"
    shown = []
    with pytest.raises(ModelError) as caught:
        model_from_spec(spec, on_retry=shown.append)(MESSAGES)
    assert str(caught.value).endswith("(after 3 retries)")
    assert "refused" in str(caught.value).lower()
    assert [line.rpartition("; ")[2] for line in shown] == [
        "retry 1 of 3 in 0.01 s", "retry 2 of 3 in 0.02 s", "retry 3 of 3 in 0.04 s"]
    assert all(line.startswith(spec + ": connection failed: ") for line in shown)


def test_a_503_then_a_200_succeeds_after_one_retry(server):
    server.behaviours = [answer(503, "loading model"), answer(200, chat_body("ready"))]
    shown = []
    assert model_from_spec(server.spec, on_retry=shown.append)(MESSAGES) == "ready"
    assert shown == [f"{server.spec}: HTTP 503: loading model; retry 1 of 3 in 0.01 s"]
    assert len(server.requests) == 2


def test_the_default_on_retry_prints_the_line_on_stderr(server, capsys):
    server.behaviours = [hang_up, answer(200, chat_body("ready"))]
    assert model_from_spec(server.spec)(MESSAGES) == "ready"
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"{server.spec}: connection failed: ")
    assert err.endswith("; retry 1 of 3 in 0.01 s\n")


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_a_4xx_is_not_retried(server, status):
    server.behaviours = [answer(status, "no such model"), answer(200, chat_body("no"))]
    assert failure(server, on_retry=pytest.fail).endswith(f": HTTP {status}: no such model")
    assert len(server.requests) == 1


def test_a_429_waits_what_retry_after_asks(server):
    server.behaviours = [answer(429, "slow down", [("Retry-After", "1")]), answer(200, chat_body("ok"))]
    shown = []
    began = time.monotonic()
    assert model_from_spec(server.spec, on_retry=shown.append)(MESSAGES) == "ok"
    assert time.monotonic() - began >= 1
    assert shown == [f"{server.spec}: HTTP 429: slow down; retry 1 of 3 in 1 s"]


def test_a_429_without_retry_after_waits_the_backoff(server):
    server.behaviours = [answer(429, "slow down"), answer(200, chat_body("ok"))]
    shown = []
    assert model_from_spec(server.spec, on_retry=shown.append)(MESSAGES) == "ok"
    assert shown[0].endswith("retry 1 of 3 in 0.01 s")


def test_a_429_asking_a_long_wait_is_not_retried(server):
    server.behaviours = [answer(429, "slow down", [("Retry-After", "120")])]
    assert failure(server, on_retry=pytest.fail).endswith(": HTTP 429: slow down (asks to wait 120 s)")


def test_no_retry_is_begun_that_the_deadline_leaves_no_time_for(server, monkeypatch):
    monkeypatch.setattr(models, "RETRY_BACKOFF", 0.4)  # 0.4 s, then 0.8 s: past a 1 s deadline
    server.behaviours = [answer(503, "busy")]
    shown = []
    message = failure(server, timeout=1, on_retry=shown.append)
    assert message.endswith(": HTTP 503: busy (after 1 retry; the deadline leaves no time for another)")
    assert len(shown) == 1 and len(server.requests) == 2


# --- the whole run: one line, stop: error, a journal that ends in a stop -----


@pytest.mark.parametrize("behave, complaint", [
    (endless, f"reply is longer than {MIB} bytes"),
    (fifty_megabytes, f"reply is longer than {MIB} bytes"),
    (answer(200, "[" * 200_000), "reply is JSON nested too deeply to read"),
    (answer(503, "overloaded"), "HTTP 503: overloaded (after 3 retries)"),
], ids=["endless", "50MB", "deep", "503"])
def test_a_model_fault_ends_the_run_with_one_line_and_stop_error(server, project, tmp_path, capsys,
                                                                 behave, complaint):
    server.behaviours = [behave]
    journal = str(tmp_path / "run.jsonl")
    status = main(["run", "Add mul", "--root", project, "--model", server.spec, "--journal", journal])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert status == 1 and lines[-1] == "stop: error"
    assert lines[-2].endswith(complaint)
    assert "Traceback" not in out + err
    events = read_events(journal)
    assert events[-1]["type"] == "stop" and events[-1]["reason"] == "error"


def test_a_reply_with_a_lone_surrogate_is_journalled_and_the_run_goes_on(server, project, tmp_path,
                                                                         capsys):
    server.behaviours = [answer(200, '{"choices": [{"message": {"content": "READ \\ud800.py"}}]}')]
    journal = str(tmp_path / "run.jsonl")
    status = main(["run", "Add mul", "--root", project, "--model", server.spec, "--journal", journal,
                   "--budget", "1"])
    assert status == 1 and capsys.readouterr().out.splitlines()[-1] == "stop: budget"
    events = read_events(journal)
    assert [e["text"] for e in events if e["type"] == "reply"] == ["READ \ufffd.py"]
    assert events[-1]["type"] == "stop"
