"""What a run asks of a server, settled at its start: the context window and the grammar, from real servers on 127.0.0.1."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlplcode import Agent
from mlplcode.grammar import grammar_text
from mlplcode.models import settled_options


class FakeServer(BaseHTTPRequestHandler):
    """Answers as the server named by self.server.kind would, and keeps every chat request's body."""

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        kind = self.server.kind
        if kind == "llama.cpp" and self.path == "/props":
            return self.answer(200, {"default_generation_settings": {"n_ctx": 512}, "total_slots": 1})
        if kind == "vllm" and self.path == "/v1/models":
            return self.answer(200, {"data": [{"id": "m", "object": "model", "max_model_len": 32768}]})
        self.answer(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/api/show" and self.server.kind == "ollama":
            return self.answer(200, {"model_info": {"llama.context_length": 131072},
                                     "parameters": "stop \"<|eot|>\"\nnum_ctx 8192"})
        if self.path == "/v1/chat/completions":
            self.server.requests.append(body)
            return self.answer(200, {"choices": [{"message": {"content": "READ calc.py"}}]})
        self.answer(404, {"error": "not found"})

    def log_message(self, *args):
        pass


@pytest.fixture(params=["llama.cpp", "vllm", "ollama", "silent"])
def server(request):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    httpd.kind, httpd.requests = request.param, []
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


EXPECTED = {"llama.cpp": ("gbnf", 512, "grammar"), "vllm": ("lark", 32768, "guided_grammar"),
            "ollama": (None, 8192, None), "silent": (None, 8192, None)}  # 8192: the default


def test_a_run_settles_grammar_and_context_from_its_server_and_sends_the_grammar(server, project, tmp_path):
    spec = f"openai:m@http://127.0.0.1:{server.server_port}/v1"
    agent = Agent.start("t", project, spec, journal=str(tmp_path / "j.jsonl"), budget=1)
    notation, context, field = EXPECTED[server.kind]
    options = agent.state.start["model_options"]
    assert options["grammar"] == notation and options["context"] == context
    assert options["max_tokens"] == min(4096, context // 4)
    agent.step()
    [request] = server.requests
    assert request["max_tokens"] == options["max_tokens"]
    if field:
        assert request[field] == grammar_text(notation)
    assert not {"grammar", "guided_grammar"} & set(request) or field


def test_what_the_command_line_says_wins_over_the_server(server):
    spec = f"openai:m@http://127.0.0.1:{server.server_port}/v1"
    assert settled_options(spec, {"grammar": "none", "context": 4096}) == {"grammar": None, "context": 4096,
                                                                           "max_tokens": 1024}
    assert settled_options(spec, {"grammar": "lark"})["grammar"] == "lark"


def test_a_model_without_a_server_asks_nothing():
    assert settled_options("echo", {}) == {"grammar": None, "context": 8192, "max_tokens": 2048}
    with pytest.raises(ValueError, match="grammar 'ebnf' is not one of"):
        settled_options("echo", {"grammar": "ebnf"})
