"""Branching: a new run that takes an old one up before one of its steps, in a copy of its project."""
import contextlib
import io
import json
import os
import shutil

import pytest

from conftest import PATCH_MUL, WRITE_TEST
from mlplcode import Agent
from mlplcode.branch import fork, tree_view, untold_warning
from mlplcode.cli import EXAMPLES, after_start, main, replay
from mlplcode.journal import fold, read_events
from mlplcode.policy import DEFAULT_POLICY
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
    assert events[0] == {"type": "branch", "parent": parent.journal, "at": 4, "sha256": events[0]["sha256"],
                         "untold": [5]}  # step 5 ran the tests
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


# A test file that writes notes.txt whenever pytest collects it: how a RUN changes a file
# that the journal never sees it change.
STAMPING_TEST = 'open("notes.txt", "w").write("written by the tests\\n")\n'


def run_script(project, tmp_path, replies, name="j", approve=lambda action: True):
    """A run of the scripted REPLIES on PROJECT, every ask answered by APPROVE."""
    script = tmp_path / f"{name}.json"
    script.write_text(json.dumps(replies))
    agent = Agent.start("t", project, f"scripted:{script}", journal=str(tmp_path / f"{name}.jsonl"),
                        budget=len(replies), policy={**DEFAULT_POLICY, "run": "ask"})
    agent.drive(lambda action: (True, "") if approve(action) else (False, "not now"))
    return agent


@pytest.fixture
def notes(project):
    """The example project with notes.txt, and a test file that rewrites notes.txt when run."""
    with open(os.path.join(project, "notes.txt"), "w") as file:
        file.write("as the user left it\n")
    with open(os.path.join(project, "test_stamp.py"), "w") as file:
        file.write(STAMPING_TEST)
    return project


def notes_in(agent):
    with open(os.path.join(agent.root, "notes.txt")) as file:
        return file.read()


def test_a_test_run_before_the_step_makes_what_was_read_earlier_untrusted(notes, tmp_path):
    # Step 1 reads notes.txt, step 3's tests rewrite it, step 6 writes it: before step 5 it
    # held what the tests left, not what step 1 read, and nothing says what that was.
    agent = run_script(notes, tmp_path, ["READ notes.txt", "READ calc.py", "RUN python -m pytest -q",
                                         "READ test_calc.py", "READ calc.py", "WRITE notes.txt\nnew\nEND"])
    assert [step.observation["ok"] for step in agent.state.steps] == [True] * 6
    with pytest.raises(ValueError, match=r"^notes.txt: the journal does not say what it held before"
                       r" step 5; the test run at step 3 may have changed it$"):
        agent.fork(5)
    assert notes_in(agent.fork(3)) == "as the user left it\n"  # before the run, step 1 vouches


def test_a_read_after_the_test_run_vouches_again(notes, tmp_path):
    agent = run_script(notes, tmp_path, ["READ notes.txt", "RUN python -m pytest -q", "READ notes.txt",
                                         "READ calc.py", "WRITE notes.txt\nnew\nEND"])
    assert notes_in(agent.fork(4)) == "written by the tests\n"  # what step 3 read, after the run
    # From step 3 on, a read follows the run: it gives the file as it was before step 3.
    assert notes_in(agent.fork(3)) == "written by the tests\n"


def test_a_write_after_a_test_run_does_not_say_the_file_was_new(notes, tmp_path):
    # The run saw notes.txt at step 1, so the guard let step 3 overwrite it unread: the write
    # says nothing of whether the file existed before step 3, and the branch must not remove it.
    agent = run_script(notes, tmp_path, ["READ notes.txt", "RUN python -m pytest -q",
                                         "WRITE notes.txt\nnew\nEND"])
    with pytest.raises(ValueError, match="notes.txt: the journal does not say what it held before step 3"):
        agent.fork(3)


def test_a_test_run_that_failed_still_ran(notes, tmp_path, monkeypatch):
    # A run that times out has written half of what it meant to: its observation is not ok, and
    # what step 2 read of notes.txt is what the tests left, not the file before step 1.
    monkeypatch.setattr("mlplcode.tools.run.RUN_TIMEOUT_SECONDS", 3)
    with open(os.path.join(notes, "test_stamp.py"), "a") as file:
        file.write("import time\ntime.sleep(60)\n")
    agent = run_script(notes, tmp_path, ["RUN python -m pytest -q", "READ notes.txt",
                                         "PATCH notes.txt\nOLD\nwritten by the tests\nNEW\npatched\nEND"])
    assert agent.state.steps[0].observation["text"].startswith("ERROR: timed out")
    assert [step.observation["ok"] for step in agent.state.steps] == [False, True, True]
    with pytest.raises(ValueError, match=r"^notes.txt: the journal does not say what it held before"
                       r" step 1; the test run at step 1 may have changed it$"):
        agent.fork(1)
    assert notes_in(agent.fork(2)) == "written by the tests\n"


def test_a_test_run_that_never_ran_changes_nothing(notes, tmp_path):
    # A declined RUN was not carried out: the journal still knows notes.txt, and the branch
    # names no step that ran tests.
    agent = run_script(notes, tmp_path, ["READ notes.txt", "RUN python -m pytest -q",
                                         "READ calc.py", "WRITE notes.txt\nnew\nEND"],
                       approve=lambda action: action["tool"] != "run")
    assert agent.state.steps[1].observation["text"].startswith("DECLINED")
    journal, root, untold = fork(agent.journal, 3)
    assert open(os.path.join(root, "notes.txt")).read() == "as the user left it\n"
    assert untold == []
    assert fork(agent.journal, 2)[2] == []


def test_a_path_is_one_file_however_it_is_written(notes, tmp_path):
    # ./notes.txt and notes.txt are one file: the write at step 3 was allowed because step 1
    # read it, so it existed, and the branch must put back what step 1 read, not remove it.
    agent = run_script(notes, tmp_path, ["READ ./notes.txt", "READ calc.py", "WRITE notes.txt\nnew\nEND"])
    assert notes_in(agent.fork(3)) == "as the user left it\n"


def test_the_branch_remembers_the_steps_that_ran_tests_for_every_front_end(notes, tmp_path, capsys):
    # The test run at step 3 is after the branch point: its effects are in the copy, and both
    # the branch's own state (what %fork warns from) and the command line say so.
    agent = run_script(notes, tmp_path, ["READ notes.txt", "READ calc.py", "RUN python -m pytest -q"])
    branch = agent.fork(2)
    assert branch.state.branch["untold"] == [3]
    assert Agent(branch.journal).state.branch["untold"] == [3]
    assert agent.fork(3).state.branch["untold"] == [3]
    assert main(["fork", agent.journal, "--at", "2"]) == 0
    assert untold_warning([3]) in capsys.readouterr().out.splitlines()
    assert untold_warning([]) == ""


def test_a_run_without_steps_says_so_when_asked_for_a_branch(project, tmp_path):
    agent = Agent.start("t", project, "echo", journal=str(tmp_path / "j.jsonl"))
    with pytest.raises(ValueError, match="^the run has no steps yet; a branch starts at one of them$"):
        agent.fork(1)


def test_fork_of_the_shipped_journal_names_its_project_with_root(capsys):
    journal = os.path.join(EXAMPLES, "add.journal.jsonl")
    assert main(["fork", journal, "--at", "3"]) == 2  # its root is not taken on its word
    err = capsys.readouterr().err
    assert f"this machine started no run {read_events(journal)[0]['run']}" in err
    assert "  root: /tmp/mlplcode-example/add (its tools write there" in err
    assert err.rstrip().endswith("or name the project with --root DIR, for the defaults")
    assert main(["fork", journal, "--at", "3", "--trust-journal"]) == 2  # taken, but it is gone
    assert "is gone; name the project to branch from (mlplcode fork --root DIR)" in capsys.readouterr().err
    assert main(["fork", journal, "--at", "3", "--root", os.path.join(EXAMPLES, "add")]) == 0
    out = capsys.readouterr().out.splitlines()
    branch, root = out[0].removeprefix("branch: "), out[1].removeprefix("root: ").split(" (a copy")[0]
    assert open(os.path.join(root, "calc.py")).read() == open(os.path.join(EXAMPLES, "add", "calc.py")).read()
    events = read_events(branch)
    assert events[0]["type"] == "branch" and events[1]["root"] == root and len(fold(events).steps) == 2
    assert out[-2].startswith("warning: the parent is not a run this machine started, so neither is the branch")
    assert events[1]["policy"] == DEFAULT_POLICY and "api_key_env" not in events[1]["model_options"]
