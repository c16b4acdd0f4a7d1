"""Branching: a new run that takes an old one up before one of its steps, in a copy of its project."""
import contextlib
import io
import json
import os
import shutil

import pytest

from conftest import PATCH_MUL, WRITE_TEST
from mlplcode import Agent
from mlplcode.branch import tree_view
from mlplcode.cli import EXAMPLES, after_start, main, replay
from mlplcode.journal import read_events
from mlplcode.show import as_text

ADD_MUL = ["READ calc.py", "READ test_calc.py", PATCH_MUL, WRITE_TEST, "RUN python -m pytest -q",
           "DONE added mul and its test"]


@pytest.fixture
def parent(project, tmp_path):
    script = tmp_path / "add-mul.json"
    script.write_text(json.dumps(ADD_MUL))
    agent = Agent.start("Add mul and its test", project, f"scripted:{script}", journal=str(tmp_path / "parent.jsonl"))
    agent.drive(lambda action: (True, ""))
    assert agent.state.stop["reason"] == "done"
    return agent


def replays(journal, tmp_path, name):
    fresh = shutil.copytree(os.path.join(EXAMPLES, "add"), str(tmp_path / name))
    with contextlib.redirect_stdout(io.StringIO()):
        status, recorded, replayed = replay(journal, fresh, str(tmp_path / f"{name}.jsonl"))
    return after_start(recorded) == after_start(replayed)


def test_a_branch_before_an_approved_write_can_deny_it(parent, project, tmp_path):
    branch = parent.fork(4)
    events = read_events(branch.journal)
    assert events[0] == {"type": "branch", "parent": parent.journal, "at": 4, "sha256": events[0]["sha256"]}
    assert after_start(events) == after_start(parent.events)[:len(after_start(events))]
    assert len(branch.state.steps) == 3 and branch.root != parent.root
    assert "def mul" in open(os.path.join(branch.root, "calc.py")).read()  # step 3 happened before
    assert "test_mul" not in open(os.path.join(branch.root, "test_calc.py")).read()  # step 4 undone
    report = branch.step()
    assert report.state.steps[3].action["tool"] == "write"  # the script gives reply 4 again
    branch.deny()
    assert branch.state.stop == {"reason": "denied", "message": "step 4: the human declined WRITE test_calc.py"}
    assert "test_mul" not in open(os.path.join(branch.root, "test_calc.py")).read()
    assert "test_mul" in open(os.path.join(project, "test_calc.py")).read()  # the parent is untouched
    assert parent.state == Agent(parent.journal).state
    assert replays(parent.journal, tmp_path, "parent-again") and replays(branch.journal, tmp_path, "branch-again")


def test_the_tree_shows_the_parent_and_its_branches(parent):
    branch = parent.fork(3)
    assert f"parent: {parent.journal} (branched before step 3)" in as_text(tree_view(branch.journal))
    assert f"branch: {branch.journal} (before step 3)" in as_text(tree_view(parent.journal))


def test_a_file_the_journal_cannot_tell_refuses_the_branch_and_leaves_nothing(project, tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps(["RUN python -m pytest -q", "READ calc.py", PATCH_MUL, "READ test_calc.py"]))
    agent = Agent.start("t", project, f"scripted:{script}", journal=str(tmp_path / "j.jsonl"), budget=4)
    agent.drive(lambda action: (True, ""))
    branches = os.path.join(os.environ["XDG_STATE_HOME"], "mlplcode", "branches")
    before = sorted(os.listdir(branches)) if os.path.isdir(branches) else []
    with pytest.raises(ValueError, match="calc.py: the journal does not say what it held before step 1"):
        agent.fork(1)
    assert (sorted(os.listdir(branches)) if os.path.isdir(branches) else []) == before
    assert agent.fork(2).state.steps[0].action["tool"] == "run"  # from step 2 on, calc.py is known


def test_fork_on_the_command_line_says_where_and_how_to_go_on(parent, capsys):
    assert main(["fork", parent.journal, "--at", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    journal = out[0].removeprefix("branch: ")
    assert out[1].startswith("root: ") and out[1].endswith("(a copy, with the files as they were before step 4)")
    assert out[-1] == f"go on with: mlplcode resume {journal}"
    assert main(["fork", parent.journal, "--at", "9"]) == 2
    assert "the run has steps 1 to 6" in capsys.readouterr().err
