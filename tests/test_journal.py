import pytest

from mlplcode.journal import append_event, fold, known_paths, read_events


def test_events_round_trip_one_line_each(tmp_path):
    path = tmp_path / "run.jsonl"
    events = [{"type": "start", "task": "t", "budget": 3, "policy": {}, "model": "echo"},
              {"type": "reply", "step": 1, "text": "READ a.py\nünïcode"}]
    for event in events:
        append_event(str(path), event)
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2
    assert read_events(str(path)) == events


def test_a_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "run.jsonl"
    append_event(str(path), {"type": "note", "text": "kept"})
    with open(path, "a") as f:
        f.write('{"type": "note", "te')
    assert read_events(str(path)) == [{"type": "note", "text": "kept"}]


def test_fold_builds_the_state_from_events_alone():
    events = [
        {"type": "start", "task": "add mul", "budget": 5, "policy": {"read": "allow"}, "model": "echo"},
        {"type": "note", "text": "be brief"},
        {"type": "reply", "step": 1, "text": "READ calc.py"},
        {"type": "action", "step": 1, "action": {"tool": "read", "path": "calc.py"}},
        {"type": "verdict", "step": 1, "verdict": "allow", "reason": "read"},
        {"type": "observation", "step": 1, "ok": True, "text": "calc.py (1 lines)\nx\n"},
        {"type": "stop", "reason": "budget", "message": "all 5 steps used"},
    ]
    state = fold(events)
    assert (state.task, state.budget, state.policy) == ("add mul", 5, {"read": "allow"})
    assert state.notes == [(0, "be brief")]
    [step] = state.steps
    assert (step.number, step.reply, step.verdict) == (1, "READ calc.py", "allow")
    assert step.observation == {"ok": True, "text": "calc.py (1 lines)\nx\n"}
    assert state.stop == {"reason": "budget", "message": "all 5 steps used"}
    assert known_paths(state) == {"calc.py"}


def test_failed_reads_are_not_known():
    events = [
        {"type": "start", "task": "t", "budget": 5, "policy": {}, "model": "echo"},
        {"type": "reply", "step": 1, "text": "READ nope.py"},
        {"type": "action", "step": 1, "action": {"tool": "read", "path": "nope.py"}},
        {"type": "verdict", "step": 1, "verdict": "allow", "reason": ""},
        {"type": "observation", "step": 1, "ok": False, "text": "ERROR: no such file"},
    ]
    assert known_paths(fold(events)) == set()


def test_a_line_that_is_not_an_event_is_named(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text('{"type": "note", "text": "ok"}\n[1, 2]\n')
    with pytest.raises(ValueError, match="line 2: not an event"):
        read_events(str(path))
