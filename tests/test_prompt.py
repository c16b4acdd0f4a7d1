from conftest import Recorder, start_event

from mlplcode.loop import step
from mlplcode.models import model_from_spec
from mlplcode.prompt import SYSTEM_PROMPT, Rendered, build_context, cut
from mlplcode.tools.project import open_project


def test_the_prompt_at_step_1(project):
    record = Recorder(start_event(project, budget=5))
    step(record.state, model_from_spec("echo"), open_project(project), record)
    assert record.events[2]["text"] == (
        "[34acbbe8] TASK:\nAdd mul and its test\n\n"
        "[34acbbe8] You have 5 of 5 steps left. Reply with exactly one action.")


def test_the_prompt_at_step_3(project):
    record = Recorder(start_event(project, budget=5))
    record({"type": "note", "text": "Keep add unchanged."})
    replies = iter(["READ calc.py", "Let me look.", None])
    echo = model_from_spec("echo")
    def model(messages):
        reply = next(replies)
        return echo(messages) if reply is None else reply
    where = open_project(project)
    for _ in range(3):
        where = step(record.state, model, where, record)
    [reply] = [e for e in record.events if e["type"] == "reply" and e["step"] == 3]
    assert reply["text"] == (
        "[34acbbe8] TASK:\nAdd mul and its test\n\n"
        "[34acbbe8] NOTE FROM THE HUMAN:\nKeep add unchanged.\n\n"
        "[34acbbe8] ACTION 1:\nREAD calc.py\n\n"
        "[34acbbe8] OBSERVATION 1:\ncalc.py (5 lines)\n"
        '"""A tiny calculator: the project the example task works on."""\n\n\n'
        "def add(a, b):\n    return a + b\n\n\n"
        "[34acbbe8] ACTION 2:\nLet me look.\n\n"
        "[34acbbe8] OBSERVATION 2:\nPARSE ERROR: no action found; start a line with one of "
        "READ, SEARCH, WRITE, PATCH, RUN or DONE\n\n"
        "[34acbbe8] You have 3 of 5 steps left. Reply with exactly one action.")


def test_the_kept_paragraphs_give_the_same_prompt_as_writing_it_whole(project):
    record = Recorder(start_event(project, budget=50))
    rendered, where = Rendered(), open_project(project)
    replies = iter(["READ calc.py", "READ calc.py", "SEARCH add", "hmm", "READ test_calc.py"] * 3)
    for number in range(15):
        if number % 4 == 1:
            record({"type": "note", "text": f"note {number}"})
        assert build_context(record.state, rendered) == build_context(record.state)
        where = step(record.state, lambda messages: next(replies), where, record, rendered)
    assert build_context(record.state, rendered) == build_context(record.state)
    assert rendered.steps == 14  # every step but the last is kept


def test_a_repeated_reply_is_flagged_in_the_prompt(project):
    record = Recorder(start_event(project, budget=5))
    where = open_project(project)
    for _ in range(2):
        where = step(record.state, lambda messages: "READ calc.py", where, record)
    assert record.state.steps[1].observation["repeat"] is True
    assert "] OBSERVATION 2: NOTE: this reply is identical to your previous one.\ncalc.py" in \
        build_context(record.state)[1]["content"]


def test_the_system_prompt_is_made_from_the_verb_table():
    assert "<path>" in SYSTEM_PROMPT and ".py" not in SYSTEM_PROMPT
    assert "Never write an OBSERVATION" in SYSTEM_PROMPT
    assert "DONE is accepted only after you have edited a file and a test run has passed" in SYSTEM_PROMPT
    forms = SYSTEM_PROMPT.split("\n\n")[1]
    assert forms.splitlines()[0] == "READ <path>" and forms.splitlines()[-1] == "DONE <summary>"


def test_long_observations_are_cut_with_a_marker():
    text = "a" * 3000 + "b" * 3000
    shown = cut(text, 4000)
    assert shown.startswith("a" * 2000) and shown.endswith("b" * 2000)
    assert "[... 2000 characters cut ...]" in shown
    assert cut("short", 4000) == "short"
