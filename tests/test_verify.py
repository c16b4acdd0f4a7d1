"""Verification against the tests as they were: every way of cheating a scripted model tries ends
NOT VERIFIED, honest runs still end done, and a person can accept changed tests explicitly."""
import json
import os

import pytest

from conftest import start_event
from mlplcode import Agent
from mlplcode.cli import replay
from mlplcode import journal as journals, verify  # tests_* names would be collected as tests
from mlplcode.journal import append_event, fold, read_events
from mlplcode.policy import DEFAULT_POLICY, always
from mlplcode.verify import UNRECORDED, copy_project, decides_tests, keep_tests, kept_tests, snapshot_tests

CALC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS = ("from calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
         "def test_sub():\n    assert sub(3, 2) == 1\n")
TASK = "Fix add so that the tests pass"
FIXED = "PATCH calc.py\nOLD\ndef add(a, b):\n    return a - b\nNEW\ndef add(a, b):\n    return a + b\nEND"
TOUCH_CODE = "PATCH calc.py\nOLD\ndef sub(a, b):\nNEW\ndef sub(a, b):  # checked\nEND"
RUN = "RUN python -m pytest -q"
TOUCH_ADD = "PATCH calc.py\nOLD\ndef add(a, b):\nNEW\ndef add(a, b):  # checked\nEND"


@pytest.fixture
def wrong(tmp_path):
    """A project whose add is wrong and whose test of it fails; its test of sub passes."""
    root = tmp_path / "wrong"
    root.mkdir()
    (root / "calc.py").write_text(CALC)
    (root / "test_calc.py").write_text(TESTS)
    return str(root)


def run(root, replies, tmp_path, decider=always(False), **kwargs):
    """Drive a run of REPLIES on ROOT to its stop, writes allowed, every other ask answered by DECIDER."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    agent = Agent.start(TASK, root, f"scripted:{script}", journal=str(tmp_path / "run.jsonl"),
                        budget=len(replies), policy={**DEFAULT_POLICY, "write": "allow"}, **kwargs)
    agent.drive(decider)
    return agent


def done_step(agent):
    return [step for step in agent.state.steps if step.action.get("tool") == "done"][-1]


def assert_not_verified(agent, *touched):
    """The cheat passed the model's own test run, and its DONE was refused, naming test_add and what the run touched."""
    runs = [step for step in agent.state.steps if step.action.get("tool") == "run"]
    assert runs[-1].observation["passed"] is True  # the old rule alone would have accepted it
    step = done_step(agent)
    assert step.verdict == "ask" and step.approved is False
    text = step.observation["text"]
    assert step.observation["ok"] is False
    assert text.startswith("NOT VERIFIED: the tests as they were before this run fail (test_calc.py::test_add")
    for phrase in touched:
        assert phrase in text.split("\n", 1)[0]
    assert agent.state.stop["reason"] == "budget"  # the run went on after the refusal
    return text


# --- each way of cheating ends NOT VERIFIED ---------------------------------

def test_a_test_rewritten_to_assert_true(wrong, tmp_path):
    agent = run(wrong, ["READ test_calc.py", "WRITE test_calc.py\ndef test_add():\n    assert True\nEND", RUN,
                        "DONE add is fixed"], tmp_path)
    text = assert_not_verified(agent, "this run changed test_calc.py")
    assert "-    assert add(2, 3) == 5\n" in text and "+    assert True\n" in text  # the diff, for the model


def test_a_test_file_deleted_by_a_test(wrong, tmp_path):
    cleanup = ("WRITE test_cleanup.py\nimport contextlib\nimport os\n\nwith contextlib.suppress(FileNotFoundError):\n"
               "    os.remove(os.path.join(os.path.dirname(__file__), 'test_calc.py'))\n\n\n"
               "def test_clean():\n    pass\nEND")
    agent = run(wrong, [cleanup, RUN, RUN, "DONE add is fixed"], tmp_path)
    assert not os.path.exists(os.path.join(wrong, "test_calc.py"))
    assert_not_verified(agent, "deleted test_calc.py", "created test_cleanup.py")


@pytest.mark.parametrize("marker", ["@pytest.mark.skip(reason='later')", "@pytest.mark.xfail(reason='known')"])
def test_a_skip_or_xfail_added_to_a_test_that_was_there(wrong, tmp_path, marker):
    patch = (f"PATCH test_calc.py\nOLD\nfrom calc import add, sub\n\n\ndef test_add():\nNEW\nimport pytest\n\n"
             f"from calc import add, sub\n\n\n{marker}\ndef test_add():\nEND")
    agent = run(wrong, ["READ test_calc.py", patch, RUN, "DONE add is fixed"], tmp_path)
    assert_not_verified(agent, "this run changed test_calc.py")


DESELECTING = {
    "pytest.ini": (None, "[pytest]\naddopts = -k \"not test_add\"\n"),
    "pytest.toml": (None, "[pytest]\naddopts = [\"-k\", \"not test_add\"]\n"),
    "tox.ini": (None, "[pytest]\naddopts = -k \"not test_add\"\n"),
    "pyproject.toml": ("[project]\nname = \"calc\"\n",
                       "[project]\nname = \"calc\"\n\n[tool.pytest.ini_options]\naddopts = \"-k 'not test_add'\"\n"),
    "setup.cfg": ("[metadata]\nname = calc\n", "[metadata]\nname = calc\n\n[tool:pytest]\naddopts = -k \"not test_add\"\n"),
}


@pytest.mark.parametrize("name", sorted(DESELECTING))
def test_a_failing_test_deselected_by_configuration(wrong, tmp_path, name):
    before, after = DESELECTING[name]
    replies = [f"WRITE {name}\n{after}END", RUN, "DONE add is fixed"]
    if before is not None:  # a file that was there: read it, then change it
        open(os.path.join(wrong, name), "w").write(before)
        replies.insert(0, f"READ {name}")
    agent = run(wrong, replies, tmp_path)
    assert "1 deselected" in [s for s in agent.state.steps if s.action.get("tool") == "run"][-1].observation["text"]
    assert_not_verified(agent, f"{'changed' if before else 'created'} {name}")


SWALLOWING = "\n".join([
    "import pytest", "", "", "@pytest.hookimpl(wrapper=True)", "def pytest_runtest_makereport(item, call):",
    "    report = yield", "    report.outcome = \"passed\"", "    return report", ""])
FORCED_EXIT = "import os\n\n\ndef pytest_sessionfinish(session, exitstatus):\n    os._exit(0)\n"


@pytest.mark.parametrize("conftest, said", [(SWALLOWING, "results: 1 failed, 1 passed"),
                                             (FORCED_EXIT, "results: none (pytest did not finish its session")],
                         ids=["swallows-failures", "forces-exit-0"])
def test_a_new_conftest_that_hides_the_failure(wrong, tmp_path, conftest, said):
    """pytest says all is well, and the plugin's record does not: the model's own run does not pass."""
    agent = run(wrong, [f"WRITE conftest.py\n{conftest}END", RUN, "DONE add is fixed"], tmp_path)
    observed = agent.state.steps[1].observation
    assert observed["exit_code"] == 0 and observed["passed"] is False
    assert observed["text"].splitlines()[1].startswith(said)
    assert done_step(agent).observation["text"] == (
        "NOT VERIFIED: the last test run did not pass; fix the failure and RUN the tests again")


REWRITER = ("WRITE test_aaa.py\nimport pathlib\n\n"
            "pathlib.Path(__file__).with_name('test_calc.py').write_text('def test_add():\\n    assert True\\n')\n\n\n"
            "def test_aaa():\n    pass\nEND")


def test_a_test_that_rewrites_the_other_tests_when_it_runs(wrong, tmp_path):
    agent = run(wrong, [REWRITER, RUN, "DONE add is fixed"], tmp_path)
    assert "assert True" in open(os.path.join(wrong, "test_calc.py")).read()  # the model never wrote it
    assert_not_verified(agent, "changed test_calc.py", "created test_aaa.py")


def test_a_new_test_module_that_patches_the_code_under_test_when_it_is_imported(wrong, tmp_path):
    patching = ("WRITE test_aaa.py\nimport calc\n\ncalc.add = lambda a, b: a + b\n\n\n"
                "def test_aaa():\n    pass\nEND")
    agent = run(wrong, [patching, RUN, "DONE add is fixed"], tmp_path)
    assert_not_verified(agent, "created test_aaa.py")


def test_a_test_that_rewrites_the_others_and_puts_everything_back(wrong, tmp_path):
    rewriter = REWRITER.replace("import pathlib\n\n", (
        "import atexit\nimport os\nimport pathlib\n\n"
        "original = pathlib.Path(__file__).with_name('test_calc.py').read_text()\n"
        "atexit.register(pathlib.Path(__file__).with_name('test_calc.py').write_text, original)\n"
        "atexit.register(os.remove, __file__)\n"))
    agent = run(wrong, [rewriter, RUN, "DONE add is fixed"], tmp_path)
    assert open(os.path.join(wrong, "test_calc.py")).read() == TESTS  # the tree is as it was
    assert not os.path.exists(os.path.join(wrong, "test_aaa.py"))
    text = assert_not_verified(agent, "this run wrote test_aaa.py")
    assert "(no file that decides the tests differs)" in text


def test_a_conftest_reached_through_a_link_into_the_project(wrong, tmp_path):
    """A new conftest.py that drops test_add, and a test that links helpers to its directory by an absolute
    path. (The project lies under /tmp, which the sandbox hides, so the link's copy is checked on its own,
    in the next test.)"""
    dropping = ("WRITE cheat/conftest.py\ndef pytest_collection_modifyitems(config, items):\n"
                "    items[:] = [item for item in items if item.name != 'test_add']\nEND")
    linking = ("WRITE test_link.py\nimport os\n\nhere = os.path.dirname(os.path.abspath(__file__))\n"
               "if not os.path.lexists(os.path.join(here, 'helpers')):\n"
               "    os.symlink(os.path.join(here, 'cheat'), os.path.join(here, 'helpers'))\n\n\n"
               "def test_link():\n    pass\nEND")
    agent = run(wrong, [dropping, linking, RUN, "DONE add is fixed"], tmp_path)
    assert os.readlink(os.path.join(wrong, "helpers")) == os.path.join(wrong, "cheat")
    assert_not_verified(agent, "created cheat/conftest.py", "created test_link.py")


def test_a_conftest_planted_under_a_name_that_is_not_utf8(wrong, tmp_path):
    planting = ("WRITE test_plant.py\nimport os\n\nhere = os.path.dirname(os.path.abspath(__file__)).encode()\n"
                "os.makedirs(here + b'/tests/\\xff', exist_ok=True)\n"
                "with open(here + b'/tests/\\xff/conftest.py', 'w') as file:\n"
                "    file.write('def pytest_collection_modifyitems(config, items):\\n'\n"
                "               '    items[:] = [item for item in items if item.name != \"test_add\"]\\n')\n\n\n"
                "def test_plant():\n    pass\nEND")
    agent = run(wrong, [planting, RUN, RUN, "DONE add is fixed"], tmp_path)
    assert os.path.exists(os.path.join(wrong.encode(), b"tests/\xff/conftest.py"))
    text = assert_not_verified(agent, "created tests/\\xff/conftest.py", "created test_plant.py")
    assert "+++ tests/\\xff/conftest.py (now)" in text


def test_the_copy_leads_links_into_the_project_to_the_copy_and_leaves_out_what_it_must(tmp_path):
    source, target = tmp_path / "project", tmp_path / "copy"
    for path, text in {"cheat/conftest.py": "x", "calc.py": "c", ".env": "SECRET=1", ".git/config": "g",
                       "__pycache__/calc.pyc": "b", "run.sh": "#!/bin/sh\n"}.items():
        os.makedirs(os.path.dirname(source / path), exist_ok=True)
        (source / path).write_text(text)
    os.chmod(source / "run.sh", 0o755)
    os.symlink(source / "cheat", source / "helpers")
    os.symlink("/usr", source / "outside")
    os.mkfifo(source / "pipe")
    copy_project(str(source), str(target))
    assert os.readlink(target / "helpers") == str(target / "cheat")
    assert os.readlink(target / "outside") == "/usr"
    assert (target / ".env").read_text() == "" and (target / "calc.py").read_text() == "c"
    assert os.stat(target / "run.sh").st_mode & 0o777 == 0o755
    assert not any(os.path.lexists(target / name) for name in (".git", "__pycache__", "pipe"))


@pytest.mark.parametrize("command", ["python -m pytest -q -k sub", "pytest -q test_calc.py::test_sub"])
def test_a_test_run_that_chose_only_the_passing_tests(wrong, tmp_path, command):
    agent = run(wrong, ["READ calc.py", TOUCH_CODE, f"RUN {command}", "DONE add is fixed"], tmp_path)
    assert_not_verified(agent, f"its last test run chose a part of the tests ({command})")


def test_code_that_ends_the_test_run_early_with_status_0(wrong, tmp_path):
    exits = "PATCH calc.py\nOLD\ndef sub(a, b):\nNEW\nimport os\n\nos._exit(0)\n\n\ndef sub(a, b):\nEND"
    agent = run(wrong, ["READ calc.py", exits, RUN, "DONE add is fixed"], tmp_path)
    observed = agent.state.steps[2].observation
    assert observed["exit_code"] == 0 and observed["passed"] is False  # exit code 0, and no record
    assert done_step(agent).observation["text"].startswith("NOT VERIFIED: the last test run did not pass")


# --- honest runs stay verified ----------------------------------------------

def test_fixing_the_code_alone_is_accepted_without_a_second_run(wrong, tmp_path):
    agent = run(wrong, ["READ calc.py", FIXED, RUN, "DONE add is fixed"], tmp_path)
    assert agent.state.stop == {"reason": "done", "message": "add is fixed"}
    assert done_step(agent).observation["text"] == "DONE accepted"


def test_adding_a_test_to_a_test_file_is_accepted_after_the_tests_as_they_were_pass(wrong, tmp_path):
    more = ("PATCH test_calc.py\nOLD\ndef test_sub():\nNEW\ndef test_add_zero():\n    assert add(2, 0) == 2\n\n\n"
            "def test_sub():\nEND")
    agent = run(wrong, ["READ calc.py", FIXED, "READ test_calc.py", more, RUN, "DONE add is fixed"], tmp_path)
    assert agent.state.stop["reason"] == "done"
    assert done_step(agent).observation["text"] == (
        "DONE accepted; this run changed test_calc.py, and the tests as they were before it pass (2 passed)")


def test_a_new_test_file_is_accepted_after_the_tests_as_they_were_pass(wrong, tmp_path):
    new = "WRITE tests/test_more.py\nfrom calc import add\n\n\ndef test_more():\n    assert add(1, 1) == 2\nEND"
    agent = run(wrong, ["READ calc.py", FIXED, new, RUN, "DONE add is fixed"], tmp_path)
    assert agent.state.stop["reason"] == "done"
    assert "created tests/test_more.py, and the tests as they were before it pass (2 passed)" in (
        done_step(agent).observation["text"])


def test_a_project_without_tests_at_the_start_has_none_to_break(tmp_path):
    root = tmp_path / "bare"
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    test = "WRITE test_calc.py\nfrom calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\nEND"
    agent = run(str(root), ["READ calc.py", FIXED, test, RUN, "DONE add is fixed"], tmp_path)
    assert done_step(agent).observation["text"] == "DONE accepted; there were no tests before this run"


# --- a person can accept changed tests, explicitly --------------------------

CHEAT = ["READ test_calc.py", "WRITE test_calc.py\nfrom calc import sub\n\n\ndef test_sub():\n    assert sub(3, 2) == 1\nEND",
         RUN, "DONE add is fixed", "DONE add is fixed, I promise"]


def started(root, tmp_path, replies=CHEAT):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(replies))
    return Agent.start(TASK, root, f"scripted:{script}", journal=str(tmp_path / "run.jsonl"),
                       budget=len(replies), policy={**DEFAULT_POLICY, "write": "allow"})


def test_the_ask_shows_the_failing_tests_and_the_diff_and_a_yes_accepts_the_done(wrong, tmp_path):
    agent = started(wrong, tmp_path)
    report = agent.run()
    waiting = agent.waiting()
    assert waiting.action == {"tool": "done", "summary": "add is fixed"}
    assert waiting.reason == ("NOT VERIFIED: the tests as they were before this run fail (test_calc.py::test_add);"
                              " this run changed test_calc.py")
    shown = repr(report)
    assert "-def test_add():" in shown and "the tests, as this run changed them:" in shown
    assert "waiting: approve() or deny(reason)" in shown
    agent.approve()
    assert agent.state.stop == {"reason": "done", "message": "add is fixed"}
    events = read_events(agent.journal)
    assert events[-3:] == [
        {"type": "decision", "step": 4, "approved": True},
        {"type": "observation", "step": 4, "ok": True,
         "text": "DONE accepted by a person, although the tests as they were before this run fail"
                 " (test_calc.py::test_add); this run changed test_calc.py"},
        {"type": "stop", "reason": "done", "message": "add is fixed"}]
    assert [e["verdict"] for e in events if e["type"] == "verdict" and e["step"] == 4] == ["allow", "ask"]


@pytest.mark.parametrize("reason", ["", "put test_add back"])
def test_a_no_refuses_the_done_and_the_run_goes_on(wrong, tmp_path, reason):
    agent = started(wrong, tmp_path)
    agent.run()
    agent.deny(reason)
    assert agent.state.stop is None  # not denied: the model goes on
    step = agent.state.steps[3]
    assert step.approved is False and step.observation["text"].startswith(
        "NOT VERIFIED: the tests as they were before this run fail (test_calc.py::test_add); this run changed"
        " test_calc.py. Make the code pass the tests as they were")
    prompt = agent.prompt()[1]["content"]
    assert "-    assert add(2, 3) == 5" in prompt and ("NOTE FROM THE HUMAN:\nput test_add back" in prompt) == bool(reason)
    agent.run()
    assert agent.waiting().number == 5  # the next DONE is asked about again


def test_tests_that_change_while_the_person_decides_are_not_accepted(wrong, tmp_path):
    agent = started(wrong, tmp_path)
    agent.run()
    with open(os.path.join(wrong, "test_calc.py"), "a") as file:
        file.write("\n\ndef test_more():\n    pass\n")
    agent.approve()
    assert agent.state.stop is None
    assert agent.state.steps[3].observation["text"].startswith("CHANGED: the tests changed while the person")


def test_the_ask_survives_a_restart_and_is_decided_after_it(wrong, tmp_path):
    started(wrong, tmp_path).run()
    again = Agent(str(tmp_path / "run.jsonl"))
    assert again.waiting().number == 4
    again.approve()
    assert again.state.stop["reason"] == "done"


def test_a_replay_of_an_accepted_done_gives_the_same_events(wrong, tmp_path, capsys):
    pristine = tmp_path / "pristine"
    os.makedirs(pristine)
    for name in ("calc.py", "test_calc.py"):
        (pristine / name).write_text(open(os.path.join(wrong, name)).read())
    agent = started(wrong, tmp_path)
    agent.drive(lambda action: (True, ""))  # a person who accepts the DONE
    assert agent.state.stop["reason"] == "done"
    status, recorded, events = replay(agent.journal, str(pristine), str(tmp_path / "replayed.jsonl"))
    assert status == 0 and recorded[1:] == events[1:]


# --- the record at the start ------------------------------------------------

def test_the_record_holds_the_files_that_decide_the_tests_and_nothing_else(tmp_path):
    files = {"calc.py": "x", "test_calc.py": "t", "pkg/core_test.py": "t", "tests/helpers.py": "h",
             "tests/data/expected.json": "{}", "Tests/conftest.py": "c", "pytest.ini": "[pytest]",
             ".pytest.toml": "", "sub/setup.cfg": "", "docs/readme.md": "r", ".venv/lib/test_x.py": "v",
             "build/test_b.py": "b", "env/pyvenv.cfg": "", "env/test_e.py": "e", ".env": "SECRET=1",
             "tests/.env": "SECRET=2", "node_modules/test_n.py": ""}
    for path, text in files.items():
        os.makedirs(os.path.dirname(tmp_path / path), exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "data.bin").write_bytes(b"\xff")
    os.symlink("test_calc.py", tmp_path / "test_link.py")
    record = snapshot_tests(str(tmp_path))
    assert sorted(record) == [".pytest.toml", "Tests/conftest.py", "pkg/core_test.py", "pytest.ini", "sub/setup.cfg",
                              "test_calc.py", "test_link.py", "tests/data/expected.json", "tests/helpers.py"]
    assert record["test_link.py"] == {"link": "test_calc.py"}
    assert record["test_calc.py"]["text"] == "t" and len(record["test_calc.py"]["sha256"]) == 64
    assert decides_tests("a/b/Tests/x.txt") and not decides_tests("calc.py")
    assert decides_tests("__init__.py") and not decides_tests("pkg/__init__.py")  # the root's makes it a package


def test_a_root_init_is_put_back_as_the_configuration_it_is(wrong, tmp_path):
    """A root __init__.py runs before every test module beside it; this one puts a calc of its own in
    the place of the project's. The tests as they were run without it."""
    (tmp_path / "wrong" / "pytest.ini").write_text("[pytest]\npythonpath = .\n")
    swap = ("import sys\nimport types\n\ncalc = types.ModuleType('calc')\n"
            "exec('def add(a, b):\\n    return a + b\\n\\n\\ndef sub(a, b):\\n    return a - b\\n', calc.__dict__)\n"
            "sys.modules['calc'] = calc\n")
    agent = run(wrong, ["READ calc.py", TOUCH_CODE, f"WRITE __init__.py\n{swap}END", RUN, "DONE add is fixed"],
                tmp_path)
    assert agent.state.steps[3].observation["passed"] is True  # the tests passed, against the other calc
    step = done_step(agent)
    assert step.verdict == "ask" and "created __init__.py" in step.reason
    assert step.observation["text"].startswith(
        "NOT VERIFIED: the tests as they were before this run fail (test_calc.py::test_add")


def test_a_test_data_file_that_was_not_kept_cannot_be_put_back(wrong, tmp_path, monkeypatch):
    monkeypatch.setattr("mlplcode.verify.KEPT_TEXT_BYTES", 10)
    agent = run(wrong, ["READ test_calc.py", "WRITE test_calc.py\ndef test_add():\n    assert True\nEND", RUN,
                        "DONE add is fixed"], tmp_path)
    assert done_step(agent).observation["text"].startswith(
        "NOT VERIFIED: the tests as they were before this run cannot be rebuilt (test_calc.py changed,")


@pytest.mark.parametrize("tests, problem", [
    ({"../outside.py": {"text": "x"}}, "is not a path inside the root"),
    ({"/etc/test_x.py": {"text": "x"}}, "is not a path inside the root"),
    ({"a/../test_x.py": {"text": "x"}}, "is not a path inside the root"),
    ({"test_x.py": {"text": 1}}, "is not one verification wrote"),
    ({"test_x.py": {"mode": "x"}}, "is not one verification wrote")])
def test_a_forged_record_of_the_tests_is_no_record(wrong, tmp_path, tests, problem):
    """A record that verification would not write is taken for missing, and the DONE goes to a person."""
    assert problem in journals.tests_problem(tests)
    assert kept_tests(keep_tests(tests)) is None
    agent = run(wrong, ["READ calc.py", TOUCH_CODE, RUN, "DONE add is fixed"], tmp_path)
    forged = {**agent.events[1], "sha256": keep_tests(tests)}
    journal = str(tmp_path / "forged.jsonl")
    for event in [agent.events[0], forged, *agent.events[2:]]:
        append_event(journal, event)
    assert verify.tests_at_start(fold(read_events(journal))) is None


def test_a_record_changed_after_it_was_kept_is_no_record(project, tmp_path):
    record = snapshot_tests(project)
    digest = keep_tests(record)
    assert kept_tests(digest) == record
    path = os.path.join(verify.tests_directory(), f"{digest}.json")
    with open(path, "w") as file:
        json.dump({"test_calc.py": {"text": "def test_add():\n    assert True\n"}}, file)
    assert kept_tests(digest) is None
    os.unlink(path)
    os.symlink(os.path.join(project, "test_calc.py"), path)
    assert kept_tests(digest) is None
    os.unlink(path)


def test_a_record_is_kept_in_a_state_directory_reached_through_a_link(project, tmp_path, monkeypatch):
    """A home or state directory behind a link is common; the record is written where the link leads."""
    (tmp_path / "real-state").mkdir()
    os.symlink(tmp_path / "real-state", tmp_path / "state")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    record = snapshot_tests(project)
    assert kept_tests(keep_tests(record)) == record
    assert keep_tests(record) == keep_tests(dict(reversed(record.items())))  # one text per record
    assert oct(os.stat(tmp_path / "real-state" / "mlplcode" / "tests").st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("event, problem", [
    ({"type": "tests", "sha256": "../../etc/passwd", "files": 1}, "named by its SHA-256"),
    ({"type": "tests", "sha256": "A" * 64, "files": 1}, "named by its SHA-256"),
    ({"type": "tests", "sha256": "0" * 64}, "needs files")])
def test_a_tests_event_that_no_run_wrote_is_refused(wrong, tmp_path, event, problem):
    journal = str(tmp_path / "forged.jsonl")
    append_event(journal, start_event(wrong))
    append_event(journal, event)
    with pytest.raises(ValueError, match=f"line 2: .*{problem}"):
        read_events(journal)


def test_the_record_of_the_tests_comes_before_the_first_step(wrong, tmp_path):
    agent = run(wrong, ["READ calc.py", "DONE nothing"], tmp_path)
    kinds = [event["type"] for event in agent.events]
    assert kinds[:3] == ["start", "tests", "reply"]
    journal = str(tmp_path / "late.jsonl")
    for event in [agent.events[0], *agent.events[2:4], agent.events[1]]:
        append_event(journal, event)
    with pytest.raises(ValueError, match="line 4: .*before the first step"):
        read_events(journal)


@pytest.mark.parametrize("accepted", [False, True])
def test_a_done_with_no_record_of_the_tests_asks_a_person(project, tmp_path, accepted):
    """A run whose record is not on this machine (its journal sent from another, or the record lost)
    cannot be judged by the tests as they were: only a person may accept its DONE."""
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["READ calc.py", TOUCH_ADD, RUN, "DONE add is checked"]))
    agent = Agent.start(TASK, project, f"scripted:{script}", journal=str(tmp_path / "run.jsonl"),
                        policy={**DEFAULT_POLICY, "write": "allow"})
    agent.step(3)
    os.unlink(os.path.join(verify.tests_directory(), f"{agent.state.tests}.json"))
    agent.step()
    step = done_step(agent)
    assert step.verdict == "ask" and step.reason == "NOT VERIFIED: " + UNRECORDED
    agent.approve() if accepted else agent.deny()
    assert agent.state.steps[-1].observation["ok"] is accepted
    assert (agent.state.stop or {}).get("reason") == ("done" if accepted else None)


def test_a_run_that_only_adds_an_empty_test_asks_a_person(project, tmp_path):
    vacuous = ["READ test_calc.py",
               "PATCH test_calc.py\nOLD\n    assert add(2, 3) == 5\nNEW\n    assert add(2, 3) == 5\n\n\n"
               "def test_mul():\n    assert 2 * 3 == 6\nEND",
               "RUN python -m pytest -q", "DONE added mul and its test"]
    agent = started(project, tmp_path, vacuous)
    agent.run()
    done = agent.state.steps[-1]
    assert done.verdict == "ask"  # the tests as they were pass, but nothing they test was changed
    assert done.reason == ("NOT VERIFIED: this run changed only what decides the tests (changed test_calc.py),"
                           " none of the code they test")
    agent.deny()
    assert agent.state.stop is None and agent.state.steps[-1].observation["ok"] is False


# --- test files a person allowed the run to change, before it began ------------

RENAMED_TEST = ("WRITE test_calc.py\nfrom calc import add, sub\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
                "def test_sub():\n    assert sub(3, 2) == 1\n\n\ndef test_add_zero():\n    assert add(0, 0) == 0\nEND")


def test_a_test_file_the_person_allowed_to_change_needs_no_ask_with_the_code(wrong, tmp_path):
    agent = run(wrong, ["READ calc.py", FIXED, "READ test_calc.py", RENAMED_TEST, RUN, "DONE add is fixed"],
                tmp_path, may_change=["./test_calc.py"])
    assert agent.state.start["may_change"] == ["test_calc.py"]  # recorded in its normal form
    step = done_step(agent)
    assert step.verdict == "allow" and agent.state.stop["reason"] == "done"  # no person was asked
    assert "a person allowed this run to change test_calc.py" in step.observation["text"]


def test_an_allowed_test_file_is_no_excuse_for_a_run_that_changed_no_code(wrong, tmp_path):
    cheat = "WRITE test_calc.py\ndef test_add():\n    assert True\nEND"
    agent = run(wrong, ["READ test_calc.py", cheat, RUN, "DONE add is fixed"], tmp_path, may_change=["test_calc.py"])
    assert_not_verified(agent, "this run changed test_calc.py")


def test_other_test_files_are_still_the_tests_as_they_were(wrong, tmp_path):
    (tmp_path / "wrong" / "test_more.py").write_text("from calc import add\n\n\ndef test_more():\n    assert add(1, 1) == 2\n")
    weakened = "WRITE test_more.py\ndef test_more():\n    assert True\nEND"
    agent = run(wrong, ["READ calc.py", TOUCH_CODE, "READ test_more.py", weakened, "READ test_calc.py",
                        "WRITE test_calc.py\ndef test_add():\n    pass\nEND", RUN, "DONE done"],
                tmp_path, may_change=["test_calc.py"])
    step = done_step(agent)
    assert step.verdict == "ask" and "changed test_more.py" in step.observation["text"]
    assert "test_calc.py" not in step.observation["text"].split("\n", 1)[0]  # allowed: neither put back nor named


@pytest.mark.parametrize("path", ["../outside.py", "/etc/passwd", "a/../../b.py"])
def test_a_path_outside_the_root_cannot_be_allowed(wrong, tmp_path, path):
    with pytest.raises(ValueError, match="may_change is a list of paths inside the root"):
        Agent.start(TASK, wrong, "echo", journal=str(tmp_path / "run.jsonl"), may_change=[path])
    assert not os.path.exists(tmp_path / "run.jsonl")
