from mlplcode.loop import step
from mlplcode.models import model_from_spec
from mlplcode.policy import DEFAULT_POLICY, always
from mlplcode.prompt import SYSTEM_PROMPT, cut


def test_the_prompt_at_step_1(project):
    events = [{"type": "start", "task": "Add mul and its test", "budget": 5,
               "policy": DEFAULT_POLICY, "model": "echo"}]
    step(events, model_from_spec("echo"), project, always(True), events.append)
    assert events[1]["text"] == (
        "TASK: Add mul and its test\n\n"
        "You have 5 of 5 steps left. Reply with exactly one action.")


def test_the_prompt_at_step_3(project):
    events = [{"type": "start", "task": "Add mul and its test", "budget": 5,
               "policy": DEFAULT_POLICY, "model": "echo"},
              {"type": "note", "text": "Keep add unchanged."}]
    replies = iter(["READ calc.py", "Let me look.", None])
    echo = model_from_spec("echo")
    def model(messages):
        reply = next(replies)
        return echo(messages) if reply is None else reply
    for _ in range(3):
        step(events, model, project, always(True), events.append)
    [reply] = [e for e in events if e["type"] == "reply" and e["step"] == 3]
    assert reply["text"] == (
        "TASK: Add mul and its test\n\n"
        "NOTE FROM THE HUMAN: Keep add unchanged.\n\n"
        "ACTION 1:\nREAD calc.py\n\n"
        "OBSERVATION 1:\ncalc.py (5 lines)\n"
        '"""A tiny calculator: the project the example task works on."""\n\n\n'
        "def add(a, b):\n    return a + b\n\n\n"
        "ACTION 2:\nLet me look.\n\n"
        "OBSERVATION 2:\nPARSE ERROR: no action found; start a line with one of "
        "READ, SEARCH, WRITE, PATCH, RUN or DONE\n\n"
        "You have 3 of 5 steps left. Reply with exactly one action.")


def test_the_system_prompt_uses_placeholders_and_states_the_rules():
    assert "<path>" in SYSTEM_PROMPT and ".py" not in SYSTEM_PROMPT
    assert "Never write an OBSERVATION" in SYSTEM_PROMPT
    assert "DONE is accepted only after you have edited a file and a test run has passed" in SYSTEM_PROMPT


def test_long_observations_are_cut_with_a_marker():
    text = "a" * 3000 + "b" * 3000
    shown = cut(text, 4000)
    assert shown.startswith("a" * 2000) and shown.endswith("b" * 2000)
    assert "[... 2000 characters cut ...]" in shown
    assert cut("short", 4000) == "short"
