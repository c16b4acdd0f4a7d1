"""Small local models as people serve them, against real HTTP servers on 127.0.0.1 that answer
as llama.cpp's server, llama-cpp-python's, vLLM, SGLang, Ollama and LM Studio do: what each
says about itself settles the grammar and the context without a flag; the settled options are
printed and recorded; a context too small is refused before the run starts, and above it every
prompt fits the server's context; a reply cut at the reply limit is refused as cut."""
import contextlib
import io
import json
import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlplcode import Agent, models
from mlplcode.cli import main, replay, after_start
from mlplcode.compaction import SUMMARY_PROMPT
from mlplcode.grammar import grammar_text
from mlplcode.journal import read_events
from mlplcode.models import model_from_spec, settled_options

SUMMARY_START = SUMMARY_PROMPT.split(".")[0]
CHARS_PER_TOKEN = 3.3  # the servers' tokenizer: a little worse than a real one on code


def tokens(messages):
    """The prompt's tokens as the fake servers count them: the text, and a few tokens of the
    chat template around each message."""
    return sum(math.ceil(len(m["content"]) / CHARS_PER_TOKEN) + 4 for m in messages)


# What each server answers about itself, as its own documentation and source show it (the book's
# section "What a server says about itself"): path -> body; None means 404.
def introduction(kind, n_ctx, model="m"):
    if kind == "llama.cpp":
        return {"/props": {"default_generation_settings": {"n_ctx": n_ctx, "n_predict": -1},
                           "total_slots": 1, "model_path": "/models/m.gguf"},
                "/v1/models": {"object": "list", "data": [{"id": "/models/m.gguf", "object": "model",
                                                          "owned_by": "llamacpp",
                                                          "meta": {"n_ctx_train": 131072}}]}}
    if kind == "llama-cpp-python":  # its models listed, owned by "me"; nothing says its n_ctx
        return {"/v1/models": {"object": "list", "data": [{"id": "/models/smollm2.gguf", "object": "model",
                                                          "owned_by": "me", "permissions": []}]},
                "/openapi.json": {"info": {"title": "🦙 llama.cpp Python API", "version": "0.3.16"}}}
    if kind.startswith("vllm"):
        version = "0.12.0" if kind == "vllm-0.12" else "0.11.2"
        return {"/v1/models": {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "vllm",
                                                          "root": model, "max_model_len": n_ctx,
                                                          "permission": [{"object": "model_permission"}]}]},
                "/version": {"version": version}}
    if kind == "sglang":
        return {"/v1/models": {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "sglang",
                                                          "root": model, "max_model_len": n_ctx}]}}
    if kind.startswith("ollama"):
        parameters = 'stop "<|eot|>"' + (f"\nnum_ctx {n_ctx}" if kind == "ollama" else "")
        return {"/v1/models": {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "library"}]},
                "POST /api/show": {"model_info": {"llama.context_length": 131072}, "parameters": parameters}}
    if kind == "lm-studio":
        return {"/v1/models": {"object": "list", "data": [{"id": model, "object": "model",
                                                          "owned_by": "organization_owner"}]},
                "/api/v1/models": {"models": [{"type": "llm", "key": model, "max_context_length": 32768,
                                               "loaded_instances": [{"id": model,
                                                                     "config": {"context_length": n_ctx}}]}]}}
    if kind == "lm-studio-0.3":
        return {"/api/v0/models/m": {"id": model, "object": "model", "type": "llm", "state": "loaded",
                                     "max_context_length": 32768}}
    return {}  # a server that says nothing of itself, as a hosted service


def overflow(kind, prompt, max_tokens, n_ctx):
    """The 400 each server answers for a request too long for its context, in its own words, or
    None. llama.cpp and llama-cpp-python refuse a prompt that alone overflows (and cut the reply
    short); the others refuse when the prompt and the reply limit together do."""
    if kind == "llama.cpp" and prompt >= n_ctx:
        return {"error": {"code": 400, "message": f"request ({prompt} tokens) exceeds the available context"
                          f" size ({n_ctx} tokens), try increasing it", "type": "exceed_context_size_error",
                          "n_prompt_tokens": prompt, "n_ctx": n_ctx}}
    if kind == "llama-cpp-python" and prompt >= n_ctx:
        return {"error": {"message": f"This model's maximum context length is {n_ctx} tokens. However, you"
                          f" requested {prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the"
                          " completion). Please reduce the length of the messages or completion.",
                          "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
    if kind not in ("llama.cpp", "llama-cpp-python") and prompt + max_tokens > n_ctx:
        return {"object": "error", "message": f"This model's maximum context length is {n_ctx} tokens. However,"
                f" you requested {prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the"
                " completion). Please reduce the length of the messages or completion.",
                "type": "BadRequestError", "param": None, "code": 400}
    return None


class Server(BaseHTTPRequestHandler):
    """Answers as the server self.server.kind would; keeps every chat request and every 400 sent."""

    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        said = introduction(self.server.kind, self.server.n_ctx).get(self.path)
        self.answer(200, said) if said is not None else self.answer(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            said = introduction(self.server.kind, self.server.n_ctx).get("POST " + self.path)
            return self.answer(200, said) if said is not None else self.answer(404, {"detail": "Not Found"})
        server, prompt = self.server, tokens(body["messages"])
        server.requests.append(body)
        time.sleep(server.delay)
        refusal = overflow(server.kind, prompt, body["max_tokens"], server.n_ctx)
        if refusal:
            server.refusals.append(refusal)
            return self.answer(400, refusal)
        summary = body["messages"][0]["content"].startswith(SUMMARY_START)
        reply = server.summary if summary else (server.replies.pop(0) if server.replies else "READ calc.py")
        room = min(body["max_tokens"], server.n_ctx - prompt)  # llama.cpp stops at a full context too
        cut = len(reply) > room * CHARS_PER_TOKEN
        content = reply[:int(room * CHARS_PER_TOKEN)] if cut else reply
        self.answer(200, {"object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content},
             "finish_reason": "length" if cut else "stop"}]})

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serving(kind, n_ctx=4096, replies=(), summary="Summary: calc.py holds add; the tests pass.", delay=0):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    httpd.kind, httpd.n_ctx, httpd.replies, httpd.summary, httpd.delay = kind, n_ctx, list(replies), summary, delay
    httpd.requests, httpd.refusals = [], []
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield httpd, f"openai:m@http://127.0.0.1:{httpd.server_port}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


# kind: (what it says of itself, the context it is started with, the grammar and its field, the context settled)
KNOWN = {
    "llama.cpp": ("llama.cpp", 4096, "gbnf", "grammar", 4096, "server"),
    "llama-cpp-python": ("llama-cpp-python", 4096, "gbnf", "grammar", 2048, "assumed"),
    "vllm": ("vllm", 32768, "lark", "guided_grammar", 32768, "server"),
    "vllm-0.12": ("vllm", 32768, "lark", "structured_outputs", 32768, "server"),
    "sglang": ("sglang", 8192, "gbnf", "ebnf", 8192, "server"),
    "ollama": ("ollama", 8192, None, None, 8192, "server"),
    "ollama-unset": ("ollama", 8192, None, None, 2048, "assumed"),
    "lm-studio": ("lm-studio", 4096, None, None, 4096, "server"),
    "lm-studio-0.3": ("lm-studio", 4096, None, None, 2048, "assumed"),
    "silent": ("unknown", 8192, None, None, 2048, "assumed"),
}


@pytest.mark.parametrize("kind", sorted(KNOWN))
def test_each_server_is_known_by_what_it_says_and_a_run_asks_it_so(kind, project, tmp_path, capsys):
    name, n_ctx, notation, field, context, source = KNOWN[kind]
    with serving(kind, n_ctx) as (server, spec):
        status = main(["run", "Add mul", "--root", project, "--model", spec, "--budget", "1",
                       "--journal", str(tmp_path / "j.jsonl"), "--no"])
        [request] = server.requests
    out = capsys.readouterr().out
    options = read_events(str(tmp_path / "j.jsonl"))[0]["model_options"]
    assert status == 1 and out.splitlines()[-1] == "stop: budget"
    assert (options["server"], options["grammar"], options["context"], options["context_from"]) == (
        name, notation, context, source)
    assert options["max_tokens"] == request["max_tokens"] == min(4096, context // 4)
    grammars = {key: request[key] for key in ("grammar", "guided_grammar", "ebnf", "structured_outputs")
                if key in request}
    if notation:
        sent = grammar_text(notation)
        assert grammars == {field: {"grammar": sent} if field == "structured_outputs" else sent}
    else:
        assert grammars == {}
    [line] = [line for line in out.splitlines() if line.startswith("model: ")]  # said before the first step
    assert f"context {context} tokens" in line and f"grammar {notation or 'none'}" in line
    assert ("assumed: the server does not say" in line) == (source == "assumed")
    assert out.index("model: ") < out.index("step  1")


def test_what_the_command_line_says_wins_over_the_server():
    with serving("llama.cpp", 512) as (server, spec):
        options = settled_options(spec, {"grammar": "none", "context": 4096})
        assert server.requests == []
    assert options == {"grammar": None, "context": 4096, "max_tokens": 1024, "server": "not asked",
                       "context_from": "option"}
    with serving("vllm") as (server, spec):
        assert settled_options(spec, {"grammar": "lark"})["grammar_field"] == "guided_grammar"
        assert settled_options(spec, {"grammar": "gbnf"}).get("grammar_field") is None  # vLLM's is not gbnf


def test_a_model_without_a_server_asks_nothing_and_says_nothing():
    assert settled_options("echo", {}) == {"grammar": None, "context": 8192, "max_tokens": 2048}
    assert models.settled_line(settled_options("echo", {})) == ""
    with pytest.raises(ValueError, match="grammar 'ebnf' is not one of"):
        settled_options("echo", {"grammar": "ebnf"})


def test_a_context_below_what_the_protocol_needs_is_refused_before_the_run_starts(project, tmp_path, capsys):
    journal = tmp_path / "j.jsonl"
    with serving("llama.cpp", 512) as (server, spec):
        status = main(["run", "Read the files", "--root", project, "--model", spec, "--journal", str(journal)])
        assert server.requests == []
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1 and not journal.exists()
    assert "a context of 512 tokens is too small" in err and "the smallest context that works is" in err
    smallest = int(err.split("the smallest context that works is ")[1].split()[0])
    replies = ["READ calc.py", "READ test_calc.py", "SEARCH add"] * 4
    with serving("llama.cpp", smallest, replies) as (server, spec):  # at exactly that size, it starts and fits
        status = main(["run", "Read the files", "--root", project, "--model", spec, "--budget", "12",
                       "--journal", str(tmp_path / "k.jsonl"), "--no"])
        assert server.refusals == [] and len(server.requests) > 12  # steps and compactions
    assert status == 1 and capsys.readouterr().out.splitlines()[-1] == "stop: budget"


LONG_FILE = "".join(f"def f{n}(x):\n    return x * {n} + {n * 7}  # the {n}th function\n\n\n" for n in range(60))


@pytest.mark.parametrize("kind,n_ctx", [("vllm", 2048), ("llama-cpp-python", 2048), ("llama.cpp", 1400)])
def test_compaction_keeps_every_prompt_within_a_small_context_that_the_server_enforces(kind, n_ctx, project,
                                                                                         tmp_path, capsys):
    with open(os.path.join(project, "long.py"), "w") as file:
        file.write(LONG_FILE)
    summary = " ".join(["The agent read long.py, calc.py and the tests; nothing failed."] * 40)  # too long
    replies = ["READ long.py", "READ calc.py", "SEARCH return", "READ test_calc.py"] * 8
    with serving(kind, n_ctx, replies, summary) as (server, spec):
        status = main(["run", "Read the files again and again", "--root", project, "--model", spec,
                       "--budget", "30", "--journal", str(tmp_path / "j.jsonl"), "--no"])
        assert server.refusals == []  # no HTTP 400: every prompt and its reply limit fit
        assert max(tokens(r["messages"]) + r["max_tokens"] for r in server.requests) <= n_ctx
    out = capsys.readouterr().out
    events = read_events(str(tmp_path / "j.jsonl"))
    compactions = [e for e in events if e["type"] == "compact"]
    assert status == 1 and out.splitlines()[-1] == "stop: budget" and len(compactions) >= 2
    steps = sum(e["type"] == "reply" for e in events)
    assert steps == 30 and len(server.requests) == steps + len(compactions)  # one summary per compaction
    assert out.count("compact: steps 1 to ") == len(compactions)


def test_a_server_that_does_not_say_its_context_and_refuses_the_prompt_says_what_to_do(project, tmp_path,
                                                                                          capsys):
    replies = ["READ calc.py", "READ test_calc.py", "SEARCH add"] * 3
    with serving("llama-cpp-python", 512, replies) as (server, spec):  # started with --n_ctx 512, unsaid
        status = main(["run", "Add mul", "--root", project, "--model", spec, "--journal",
                       str(tmp_path / "j.jsonl"), "--no"])
        assert len(server.refusals) == 1 and len(server.requests) > 1  # the first prompts fit
    out = capsys.readouterr().out
    [stop] = [line for line in out.splitlines() if line.startswith("error: ")]
    assert status == 1 and out.splitlines()[-1] == "stop: error"
    assert "Please reduce the length of the messages or completion." in stop  # quoted whole, not cut at 200
    assert stop.endswith("the server's context is 512 tokens, not the 2048 this run took: run again with"
                         " --context 512")
    with serving("llama-cpp-python", 512) as (server, spec):  # and so told, it refuses to start
        assert main(["run", "Add mul", "--root", project, "--model", spec, "--context", "512"]) == 2
    assert "the smallest context that works is" in capsys.readouterr().err


CUT_WRITE = "WRITE calc.py\n" + "".join(f"def g{n}(a, b):\n    return a * b + {n}\n\n\n" for n in range(200)) + "END"


def test_a_reply_cut_at_the_reply_limit_is_refused_as_cut_told_and_replayed(project, tmp_path, capsys):
    before = open(os.path.join(project, "calc.py")).read()
    with serving("llama.cpp", 2048, ["READ calc.py", CUT_WRITE, "READ calc.py"]) as (server, spec):
        status = main(["run", "Add mul", "--root", project, "--model", spec, "--budget", "3", "--yes",
                       "--journal", str(tmp_path / "j.jsonl")])
        last_prompt = server.requests[-1]["messages"][1]["content"]
    assert status == 1 and open(os.path.join(project, "calc.py")).read() == before  # the cut WRITE never ran
    events = read_events(str(tmp_path / "j.jsonl"))
    replies = [e for e in events if e["type"] == "reply"]
    assert [e.get("cut", False) for e in replies] == [False, True, False]
    [verdict] = [e for e in events if e["type"] == "verdict" and e["step"] == 2]
    assert verdict["verdict"] == "refused" and verdict["reason"].startswith(
        "CUT OFF: your reply reached the reply limit of 512 tokens before it ended")
    assert "OBSERVATION 2:\nCUT OFF:" in last_prompt and "PATCH of the few lines" in last_prompt
    assert "CUT OFF: your reply reached" in capsys.readouterr().out
    with contextlib.redirect_stdout(io.StringIO()):  # a replay gives the cut reply back as cut
        _, recorded, again = replay(str(tmp_path / "j.jsonl"), project, str(tmp_path / "again.jsonl"))
    assert after_start(again) == after_start(recorded)


def test_a_slow_server_gets_a_sign_of_life_while_the_reply_is_waited_for(monkeypatch):
    monkeypatch.setattr(models, "WAIT_NOTICE", 0.2)
    lines = []
    with serving("silent", n_ctx=100000, delay=1.0) as (server, spec):
        model = model_from_spec(spec, timeout=60, on_retry=lines.append)
        assert model([{"role": "user", "content": "hi"}]) == "READ calc.py"
    assert lines and all("waiting for the reply" in line and "of the 60 s deadline" in line for line in lines)


def test_a_server_that_drips_no_byte_still_ends_at_the_deadline(monkeypatch):
    monkeypatch.setattr(models, "WAIT_NOTICE", 0.2)
    lines = []
    with serving("silent", n_ctx=100000, delay=3.0) as (server, spec):
        model = model_from_spec(spec, timeout=1, on_retry=lines.append)
        with pytest.raises(models.ModelError, match="no complete reply within the 1 s deadline"):
            model([{"role": "user", "content": "hi"}])
    assert lines  # it said it was waiting, and it still stopped at the deadline
