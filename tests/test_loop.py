import pytest

from conftest import Recorder, start_event

from mlplcode.journal import waiting_step
from mlplcode.loop import decide, step
from mlplcode.models import ModelError
from mlplcode.policy import DEFAULT_POLICY, always
from mlplcode.tools.project import open_project

PATCH_MUL = ("PATCH calc.py\nOLD\ndef add(a, b):\n    return a + b\nNEW\n"
             "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\nEND")
WRITE_TEST = ("WRITE test_calc.py\nfrom calc import add, mul\n\n\ndef test_add():\n"
              "    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\nEND")
ADD_MUL = ["READ calc.py", "READ test_calc.py", PATCH_MUL, WRITE_TEST,
           "RUN python -m pytest -q", "DONE added mul and its test"]


def scripted(replies):
    replies = list(replies)
    def model(messages):
        if not replies:
            raise ModelError("scripted model has no reply left")
        return replies.pop(0)
    return model


def drive(project, replies, decider=always(True), **kwargs):
    """Step the loop to its stop, answering each ask with DECIDER, as Agent.drive does."""
    record, model, where = Recorder(start_event(project, **kwargs)), scripted(replies), open_project(project)
    while record.state.stop is None:
        waiting = waiting_step(record.state)
        if waiting:
            where = decide(record.state, *decider(waiting.action), where, record)
        else:
            where = step(record.state, model, where, record)
    return record.state.stop["reason"], record.state, record.events


def test_the_whole_add_mul_flow_ends_done(project):
    reason, state, events = drive(project, ADD_MUL)
    assert reason == "done"
    assert [s.verdict for s in state.steps] == ["allow", "allow", "ask", "ask", "allow", "allow"]
    assert [s.approved for s in state.steps] == [None, None, True, True, None, None]
    assert "def mul(a, b):" in open(f"{project}/calc.py").read()
    assert state.steps[4].observation["passed"] is True
    assert state.stop == {"reason": "done", "message": "added mul and its test"}


def test_done_without_an_edit_is_not_verified(project):
    reason, state, _ = drive(project, ["READ calc.py", "DONE all good"], budget=2)
    assert reason == "budget"
    assert state.steps[1].observation["text"].startswith("NOT VERIFIED: no file was edited")


def test_done_after_an_edit_without_a_test_run_is_not_verified(project):
    reason, state, _ = drive(project, ADD_MUL[:3] + ["DONE added mul"], budget=4)
    assert state.steps[3].observation["text"].startswith("NOT VERIFIED: no test run since the last edit")


def test_done_after_a_failing_test_run_is_not_verified(project):
    broken = WRITE_TEST.replace("== 6", "== 7")
    replies = ["READ calc.py", "READ test_calc.py", PATCH_MUL, broken, "RUN pytest -q", "DONE added mul"]
    reason, state, _ = drive(project, replies, budget=6)
    assert state.steps[4].observation["passed"] is False
    assert state.steps[5].observation["text"].startswith("NOT VERIFIED: the last test run did not pass")


def test_a_declined_ask_without_a_reason_ends_the_run_denied(project):
    reason, state, events = drive(project, ["READ calc.py", PATCH_MUL, "READ calc.py"],
                                  decider=always(False), budget=3)
    assert reason == "denied" and len(state.steps) == 2
    assert state.steps[1].approved is False and state.steps[1].observation is None
    assert events[-1]["message"] == "step 2: the human declined PATCH calc.py"
    assert "def mul" not in open(f"{project}/calc.py").read()


def test_a_declined_ask_with_a_reason_is_an_observation_a_note_and_the_run_goes_on(project):
    reason, state, events = drive(project, ["READ calc.py", PATCH_MUL, "READ calc.py"],
                                  decider=lambda action: (False, "add sub instead"), budget=3)
    assert reason == "budget"
    assert state.steps[1].approved is False
    assert state.steps[1].observation["text"].startswith("DECLINED")
    assert state.notes == [(2, "add sub instead")]
    assert {"type": "decision", "step": 2, "approved": False, "reason": "add sub instead"} in events
    assert "def mul" not in open(f"{project}/calc.py").read()


def test_a_denied_action_ends_the_run_and_names_it(project):
    reason, state, events = drive(project, ["RUN rm -rf calc.py"])
    assert reason == "denied"
    assert "RUN rm -rf calc.py" in events[-1]["message"]
    assert open(f"{project}/calc.py").read().startswith('"""A tiny')


def test_the_policy_can_deny_a_category(project):
    reason, _, events = drive(project, ["READ calc.py"], policy={**DEFAULT_POLICY, "read": "deny"})
    assert reason == "denied"


def test_the_budget_stops_the_run(project):
    reason, state, events = drive(project, ["READ calc.py"] * 5, budget=2)
    assert reason == "budget"
    assert len(state.steps) == 2


def test_a_repeated_reply_is_flagged_then_the_third_is_stuck(project):
    reason, state, events = drive(project, ["READ calc.py"] * 3)
    assert state.steps[1].observation["repeat"] is True
    assert "repeat" not in state.steps[0].observation
    assert reason == "stuck"
    assert state.steps[2].observation is None


def test_a_model_failure_stops_the_run_with_error(project):
    reason, state, events = drive(project, [])
    assert reason == "error"
    assert events[-1]["message"] == "scripted model has no reply left"


def test_a_parse_error_is_shown_to_the_model_and_the_run_goes_on(project):
    reason, state, _ = drive(project, ["I think I should read the file.", "READ calc.py"], budget=2)
    first = state.steps[0]
    assert first.action == {"error": first.action["error"]}
    assert first.verdict == "refused"
    assert first.observation["text"].startswith("PARSE ERROR: ")
    assert state.steps[1].observation["ok"] is True


def test_writing_an_existing_file_unread_is_refused(project):
    reason, state, _ = drive(project, [PATCH_MUL], budget=1)
    assert state.steps[0].verdict == "refused"
    assert "read it first" in state.steps[0].observation["text"]
    assert "def mul" not in open(f"{project}/calc.py").read()


def test_a_new_file_may_be_written_unread(project):
    reason, state, _ = drive(project, ["WRITE notes.txt\nhello\nEND"], budget=1)
    assert state.steps[0].observation["ok"] is True
    assert open(f"{project}/notes.txt").read() == "hello\n"


def test_a_tool_failure_is_an_error_observation(project):
    reason, state, _ = drive(project, ["READ ../outside.txt"], budget=1)
    assert state.steps[0].observation["ok"] is False
    assert state.steps[0].observation["text"].startswith("ERROR: ")


def test_step_takes_exactly_one_turn(project):
    record = Recorder(start_event(project))
    step(record.state, scripted(["READ calc.py", "READ test_calc.py"]), open_project(project), record)
    assert [e["type"] for e in record.events] == ["start", "tests", "reply", "action", "verdict",
                                                   "observation"]


def test_an_ask_waits_for_decide(project):
    record, where = Recorder(start_event(project)), open_project(project)
    model = scripted(["READ calc.py", ADD_MUL[2]])
    step(record.state, model, where, record)
    step(record.state, model, where, record)
    waiting = waiting_step(record.state)
    assert waiting.number == 2 and waiting.observation is None
    assert "def mul" not in open(f"{project}/calc.py").read()
    decide(record.state, True, "", where, record)
    assert waiting_step(record.state) is None
    assert record.state.steps[-1].observation["text"].startswith("patched calc.py")
    with pytest.raises(ValueError, match="no action is waiting"):
        decide(record.state, True, "", where, record)


def test_an_approval_is_refused_when_the_target_changed_before_the_decision(project):
    record, where = Recorder(start_event(project)), open_project(project)
    model = scripted(["READ calc.py", ADD_MUL[2]])
    step(record.state, model, where, record)
    step(record.state, model, where, record)
    assert record.state.steps[-1].target["path"] == "calc.py"
    with open(f"{project}/calc.py", "a") as calc:
        calc.write("# changed while the human was deciding\n")
    decide(record.state, True, "", where, record)
    assert record.state.steps[-1].observation["text"].startswith("CHANGED")
    assert "def mul" not in open(f"{project}/calc.py").read()


def test_a_search_can_be_asked_about_though_it_binds_no_target(project):
    reason, state, _ = drive(project, ["SEARCH def add"], budget=1,
                             policy={**DEFAULT_POLICY, "search": "ask"})
    assert state.steps[0].verdict == "ask" and state.steps[0].target is None
    assert state.steps[0].observation["text"].startswith("calc.py:4:")


def test_the_read_first_guard_sees_through_dot_dot(project):
    reason, state, _ = drive(project, ["WRITE nope/../calc.py\nx = 1\nEND"], budget=1)
    assert state.steps[0].verdict == "refused" and "read it first" in state.steps[0].reason


def test_a_path_the_tools_refuse_is_refused_before_the_policy_asks(project):
    asked = []
    reason, state, _ = drive(project, ["WRITE ../outside.txt\nx\nEND"], budget=1,
                             decider=lambda action: asked.append(action) or (True, ""))
    assert state.steps[0].verdict == "refused" and asked == []
    assert "leaves the project root" in state.steps[0].observation["text"]


def test_a_denied_command_says_which_word_was_refused(project):
    reason, _, events = drive(project, ["RUN pytest --junitxml=/tmp/x.xml"])
    assert reason == "denied"
    assert "option --junitxml is not allowed" in events[-1]["message"]
