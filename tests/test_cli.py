import argparse
import io
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from mlplcode import Agent
from mlplcode.cli import EXAMPLES, build_parser, main
from mlplcode.journal import read_events

from conftest import require_tool


REPLIES = [
    "READ calc.py",
    "READ test_calc.py",
    "PATCH calc.py\nOLD\ndef add(a, b):\n    return a + b\nNEW\ndef add(a, b):\n    return a + b\n\n\n"
    "def mul(a, b):\n    return a * b\nEND",
    "WRITE test_calc.py\nfrom calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\nEND",
    "RUN python -m pytest -q",
    "DONE added mul and its test",
]


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(REPLIES))
    return str(path)


def test_run_prints_each_step_and_ends_with_the_stop_line(project, script, tmp_path, capsys):
    journal = str(tmp_path / "run.jsonl")
    status = main(["run", "Add mul and its test", "--root", project, "--model", f"scripted:{script}",
                   "--yes", "--journal", journal])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0
    assert lines[0] == "task: Add mul and its test"
    assert lines[1].startswith("RUN: ")
    assert lines[2] == f"journal: {journal}"
    assert lines[3].split() == ["step", "1", "READ", "calc.py", "allow", "calc.py", "(5", "lines)"]
    assert "ask, approved" in lines[5]
    assert lines[-2:] == ["done: added mul and its test", "stop: done"]
    assert len([line for line in lines if line.startswith("step  6")]) == 1
    events = read_events(journal)
    assert events[0]["type"] == "start" and events[-1] == {"type": "stop", "reason": "done",
                                                           "message": "added mul and its test"}
    assert Agent(journal).state.stop["reason"] == "done"  # one journal format, every front end


def test_without_a_terminal_every_ask_is_declined_and_the_run_ends_denied(project, script, capsys):
    status = main(["run", "Add mul", "--root", project, "--model", f"scripted:{script}", "--budget", "5"])
    out = capsys.readouterr().out.splitlines()
    assert status == 1
    assert "ask, declined" in out[-3] and out[-1] == "stop: denied"
    assert out[-2] == "denied: step 3: the human declined PATCH calc.py"
    assert "def mul" not in open(os.path.join(project, "calc.py")).read()


def test_the_journal_goes_to_the_state_directory_and_never_into_the_project(project, script, tmp_path,
                                                                              monkeypatch, capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    main(["run", "t", "--root", project, "--model", f"scripted:{script}", "--budget", "1"])
    journal = capsys.readouterr().out.splitlines()[2].removeprefix("journal: ")
    assert os.path.dirname(journal) == str(tmp_path / "state" / "mlplcode" / "runs")
    assert main(["run", "t", "--root", project, "--model", "echo", "--journal",
                 os.path.join(project, "j.jsonl")]) == 2
    assert "is inside the project" in capsys.readouterr().err


def test_the_last_step_line_is_printed_once_when_the_budget_stops_the_run(project, script, capsys):
    main(["run", "t", "--root", project, "--model", f"scripted:{script}", "--budget", "1"])
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out if line.startswith("step")] == [["step", "1"]]
    assert out[-2:] == ["budget: all 1 steps used", "stop: budget"]


def test_a_policy_file_is_used(project, script, tmp_path, capsys):
    policy = tmp_path / "policy.json"
    policy.write_text('{"read": "deny"}')
    assert main(["run", "t", "--root", project, "--model", f"scripted:{script}",
                 "--policy", str(policy)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("denied: step 1: READ calc.py") and out[-1] == "stop: denied"
    assert out[-3].split()[:4] == ["step", "1", "READ", "calc.py"]


def test_replay_reproduces_the_events_of_a_run(project, script, tmp_path, capsys):
    journal = str(tmp_path / "run.jsonl")
    main(["run", "Add mul and its test", "--root", project, "--model", f"scripted:{script}",
          "--yes", "--journal", journal])
    fresh = shutil.copytree(os.path.join(EXAMPLES, "add"), str(tmp_path / "fresh"))
    replayed = str(tmp_path / "replayed.jsonl")
    assert main(["replay", journal, "--root", fresh, "--output", replayed]) == 0
    assert read_events(replayed)[1:] == read_events(journal)[1:]
    assert read_events(replayed)[0]["model"] == f"replay:{journal}"
    assert capsys.readouterr().out.splitlines()[-1] == "replay: the events are the same as the journal's"


def test_a_replay_gives_a_no_its_recorded_reason(project, tmp_path, capsys):
    replies = tmp_path / "r.json"
    replies.write_text(json.dumps(["READ calc.py", REPLIES[2], "READ test_calc.py"]))
    journal = tmp_path / "run.jsonl"
    agent = Agent.start("t", project, f"scripted:{replies}", journal=str(journal), budget=3)
    agent.drive(lambda action: (False, "not yet"))
    fresh = shutil.copytree(os.path.join(EXAMPLES, "add"), str(tmp_path / "fresh"))
    assert main(["replay", str(journal), "--root", fresh, "--output", str(tmp_path / "again.jsonl")]) == 1
    assert capsys.readouterr().out.splitlines()[-3:] == [
        "budget: all 3 steps used", "stop: budget", "replay: the events are the same as the journal's"]


def test_resume_takes_up_an_interrupted_cli_run(project, tmp_path, monkeypatch, capsys):
    journal, script = str(tmp_path / "run.jsonl"), tmp_path / "again.json"
    script.write_text(json.dumps(REPLIES[:5] + REPLIES[4:]))  # the interrupted RUN, then one more
    import mlplcode.loop
    real = mlplcode.loop.execute
    def interrupt_the_test_run(action, where):
        if action["tool"] == "run":
            raise KeyboardInterrupt
        return real(action, where)
    monkeypatch.setattr(mlplcode.loop, "execute", interrupt_the_test_run)
    assert main(["run", "Add mul", "--root", project, "--model", f"scripted:{script}", "--yes",
                 "--journal", journal]) == 130
    assert capsys.readouterr().out.splitlines()[-1] == "stop: interrupted"
    monkeypatch.undo()
    assert main(["resume", journal, "--yes"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "stop: done"
    kinds = [e["type"] for e in read_events(journal)]
    assert kinds.count("resume") == 1 and kinds.count("stop") == 2
    assert main(["resume", journal]) == 2
    assert "the run has stopped (done) and cannot be taken up again: use mlplcode run" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["run", "t", "--model", "echo"], "the following arguments are required: --root"),
    (["run", "t", "--root", "/nonexistent", "--model", "echo"], "--root /nonexistent: not a directory"),
    (["run", "t", "--root", ".", "--model", "gpt"], "unknown model spec 'gpt'"),
    (["run", "t", "--root", ".", "--model", "echo", "--budget", "0"], "'0' is not a positive whole number"),
    (["run", "t", "--root", ".", "--model", "echo", "--budget", "²"], "'²' is not a positive whole number"),
    (["run", "t", "--root", ".", "--model", "echo", "--yes", "--no"], "not allowed with argument"),
    (["replay", "missing.jsonl", "--root", "."], "missing.jsonl"),
    (["bogus"], "invalid choice: 'bogus'"),
])
def test_bad_arguments_get_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        status = main(argv)
        raise SystemExit(status)
    err = capsys.readouterr().err
    assert stopped.value.code == 2
    assert len(err.strip().splitlines()) == 1 and message in err


def test_an_existing_journal_is_not_appended_to(project, tmp_path, capsys):
    journal = tmp_path / "old.jsonl"
    journal.write_text("")
    assert main(["run", "t", "--root", project, "--model", "echo", "--journal", str(journal)]) == 2
    assert "already exists" in capsys.readouterr().err


def test_every_command_has_help():
    for command in (["--help"], ["run", "--help"], ["replay", "--help"], ["resume", "--help"], ["demo", "--help"]):
        result = subprocess.run([sys.executable, "-m", "mlplcode.cli", *command],
                                capture_output=True, text=True)
        assert result.returncode == 0 and result.stdout.startswith("usage: mlplcode")


def test_the_demo_replays_the_example_to_done_and_leaves_it_untouched(capsys):
    before = {name: open(os.path.join(EXAMPLES, "add", name)).read()
              for name in os.listdir(os.path.join(EXAMPLES, "add")) if name.endswith(".py")}
    assert main(["demo"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "stop: done"
    assert [line.split()[2] for line in out if line.startswith("step")] == [
        "READ", "READ", "PATCH", "WRITE", "RUN", "DONE"]
    after = {name: open(os.path.join(EXAMPLES, "add", name)).read() for name in before}
    assert after == before


def test_the_committed_example_journal_replays_to_the_same_events(tmp_path, capsys):
    require_tool("bwrap", "the example journal's RUN observation, recorded sandboxed")
    fresh = shutil.copytree(os.path.join(EXAMPLES, "add"), str(tmp_path / "add"))
    # The shipped journal is not one this machine started: its answers are taken on the person's word.
    assert main(["replay", os.path.join(EXAMPLES, "add.journal.jsonl"), "--root", fresh, "--trust-journal"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "replay: the events are the same as the journal's"
    assert "DONE accepted; this run changed test_calc.py, and the tests as" in out[-4]
    assert read_events(os.path.join(EXAMPLES, "add.journal.jsonl"))[-2]["text"].endswith(
        "the tests as they were before it pass (1 passed)")


CHEAT = ["READ test_calc.py", "WRITE test_calc.py\ndef test_add():\n    assert True\nEND",
         "RUN python -m pytest -q", "DONE add works"]


@pytest.fixture
def cheat(tmp_path):
    path = tmp_path / "cheat.json"
    path.write_text(json.dumps(CHEAT))
    return str(path)


def test_with_yes_a_done_whose_tests_changed_is_shown_with_the_diff_and_not_accepted(project, cheat, capsys):
    open(os.path.join(project, "calc.py"), "w").write("def add(a, b):\n    return a - b\n")
    assert main(["run", "Fix add", "--root", project, "--model", f"scripted:{cheat}", "--yes"]) == 1
    out = capsys.readouterr().out.splitlines()
    asked = out.index("step  4  NOT VERIFIED: the tests as they were before this run fail (test_calc.py::test_add);"
                      " this run changed test_calc.py")
    assert out[asked + 1:asked + 3] == ["--- test_calc.py (at the start)", "+++ test_calc.py (now)"]
    assert "+    assert True" in out[asked:]
    assert "ask, declined    NOT VERIFIED: the tests as they were" in out[-3]  # --yes cannot vouch for tests
    assert out[-1] == "stop: error"  # the script has no reply left after the refusal


def test_with_no_a_done_whose_tests_changed_is_refused_and_the_run_goes_on(project, cheat, capsys):
    open(os.path.join(project, "calc.py"), "w").write("def add(a, b):\n    return a - b\n")
    assert main(["run", "Fix add", "--root", project, "--model", f"scripted:{cheat}", "--no",
                 "--policy", write_allowed(project), "--budget", "4"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "ask, declined    NOT VERIFIED: the tests as they were" in out[-3]
    assert out[-2:] == ["budget: all 4 steps used", "stop: budget"]


@pytest.mark.parametrize("command", ["run", "resume"])
def test_the_help_of_no_says_what_a_no_does_to_a_done(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    help = " ".join(capsys.readouterr().out.split())
    no = help[help.index("--no "):]
    assert "a declined DONE is refused and the run goes on" in no
    assert "which ends the run" not in no


def write_allowed(project):
    path = os.path.join(os.path.dirname(project), "write.json")
    open(path, "w").write('{"write": "allow"}')
    return path


class Terminal(io.StringIO):
    """Standard input as a person at a terminal would give it."""

    def isatty(self):
        return True


def test_at_a_terminal_a_person_accepts_a_done_whose_tests_changed(project, cheat, monkeypatch, capsys):
    open(os.path.join(project, "calc.py"), "w").write("def add(a, b):\n    return a - b\n")
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    assert main(["run", "Fix add", "--root", project, "--model", f"scripted:{cheat}",
                 "--policy", write_allowed(project)]) == 0
    out = capsys.readouterr().out
    assert "+    assert True" in out
    assert "accept this DONE although the tests as they were fail? [y/N] " in out
    assert out.splitlines()[-1] == "stop: done"


def test_a_model_server_that_is_down_stops_the_run_with_error_and_keeps_the_journal(project, tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.setattr("mlplcode.models.RETRY_BACKOFF", 0.01)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    journal = str(tmp_path / "run.jsonl")
    status = main(["run", "Add mul", "--root", project, "--model", f"openai:m@http://127.0.0.1:{port}/v1",
                   "--journal", journal])
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert status == 1 and out[-1] == "stop: error"
    assert "connection" in out[-2] and "(after 3 retries)" in out[-2]
    assert not [line for line in out if line.startswith("step")]
    assert [line.split("; ")[-1] for line in captured.err.splitlines()] == [
        "retry 1 of 3 in 0.01 s", "retry 2 of 3 in 0.02 s", "retry 3 of 3 in 0.04 s"]
    assert read_events(journal)[0]["model_options"] == {  # a server that said nothing: a safe context
        "timeout": 600.0, "grammar": None, "context": 2048, "max_tokens": 512, "server": "unknown",
        "context_from": "assumed"}
    events = read_events(journal)
    assert [e["type"] for e in events] == ["start", "tests", "stop"]  # recorded before the first step
    assert events[-1]["reason"] == "error"


def test_kernel_install_writes_a_kernelspec_for_this_python_under_a_prefix(tmp_path, capsys):
    assert main(["kernel", "install", "--prefix", str(tmp_path)]) == 0
    where = tmp_path / "share" / "jupyter" / "kernels" / "mlplcode"
    assert capsys.readouterr().out == f"installed the mlplcode kernel in {where}\n"
    spec = json.loads((where / "kernel.json").read_text())
    assert spec["argv"] == [sys.executable, "-m", "mlplcode.kernel", "-f", "{connection_file}"]
    assert spec["language"] == "mlplcode"


def test_kernel_install_goes_to_the_users_jupyter_directory_by_default(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path))
    assert main(["kernel", "install"]) == 0
    assert (tmp_path / "kernels" / "mlplcode" / "kernel.json").exists()
    assert main(["kernel", "install", "--user"]) == 0  # again: the kernelspec is replaced


def test_kernel_install_takes_one_place(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["kernel", "install", "--user", "--sys-prefix"])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_banner_says_unsandboxed_when_bubblewrap_is_missing(project, script, monkeypatch, capsys):
    monkeypatch.setattr("mlplcode.tools.project.find_program",
                        lambda name, root: None if name == "bwrap" else shutil.which(name))
    main(["run", "t", "--root", project, "--model", f"scripted:{script}", "--budget", "1"])
    assert capsys.readouterr().out.splitlines()[1] == (
        "RUN: unsandboxed: bubblewrap (bwrap) not found; tests run with your user's files and network")


def test_the_banner_says_sandboxed_with_bubblewrap(project, script, capsys):
    require_tool("bwrap", "the sandboxed banner")
    main(["run", "t", "--root", project, "--model", f"scripted:{script}", "--budget", "1"])
    assert capsys.readouterr().out.splitlines()[1].startswith("RUN: sandboxed by bubblewrap")


def test_step_lines_show_escapes_not_control_characters(project, tmp_path, capsys):
    (tmp_path / "evil.json").write_text(json.dumps(["READ \x1b]0;owned\x07calc\u202e.py"]))
    main(["run", "t\x1b[2J", "--root", project, "--model", f"scripted:{tmp_path}/evil.json",
          "--budget", "1"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert "task: t\\x1b[2J" in out and "READ \\x1b]0;owned\\x07calc\\u202e.py" in out


def subcommands(parser):
    """The subcommands of PARSER, each with the options it takes, a nested one named in full."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                inner = subcommands(sub)
                if inner:
                    found.update({f"{name} {key}": options for key, options in inner.items()})
                else:
                    found[name] = {option for each in sub._actions for option in each.option_strings
                                   if option.startswith("--") and option != "--help"}
    return found


def test_the_book_lists_every_subcommand_with_every_option():
    book = open(os.path.join(os.path.dirname(EXAMPLES), "mlplcode.org"), encoding="utf-8").read()
    table = book[book.index("The command has "):]
    table = table[table.index("#+begin_example"):table.index("#+end_example")]
    usages = {}
    for line in table.splitlines()[1:]:
        if line.startswith("mlplcode "):
            words = line.split()
            name = " ".join(words[1:3]) if words[1] == "kernel" else words[1]
            usages[name] = ""
        usages[name] += line
    parsed = subcommands(build_parser())
    assert sorted(usages) == sorted(parsed)
    count = book[book.index("The command has "):].split()[3]
    assert count == {7: "seven", 10: "ten"}.get(len(parsed), str(len(parsed)))
    for name, options in parsed.items():
        assert {option for option in options if option not in usages[name]} == set(), name


@pytest.mark.parametrize("flags, stop", [(["--yes"], "done"), (["--no"], "denied"), ([], "denied")])
def test_resume_puts_the_ask_a_run_waits_at_to_the_person(project, script, tmp_path, capsys, flags, stop):
    journal = str(tmp_path / "run.jsonl")
    agent = Agent.start("Add mul", project, f"scripted:{script}", journal=journal)
    agent.run()  # as a notebook leaves it: step 3, a PATCH, waits for a decision
    assert agent.waiting().number == 3
    status = main(["resume", journal, *flags])
    out = capsys.readouterr().out.splitlines()
    assert out[3] == "step  3  waits: PATCH calc.py"
    assert (status, out[-1]) == (0 if stop == "done" else 1, f"stop: {stop}")
    decisions = [e for e in read_events(journal) if e["type"] == "decision"]
    assert decisions[0] == {"type": "decision", "step": 3, "approved": stop == "done"}


def test_may_change_names_the_test_files_a_run_may_change_in_its_start_event(project, script, tmp_path):
    journal = str(tmp_path / "run.jsonl")
    assert main(["run", "Add mul", "--root", project, "--model", f"scripted:{script}", "--yes",
                 "--journal", journal, "--may-change", "test_calc.py", "--may-change", "tests/../test_calc.py"]) == 0
    assert read_events(journal)[0]["may_change"] == ["test_calc.py"]
    assert main(["run", "Add mul", "--root", project, "--model", f"scripted:{script}", "--yes",
                 "--journal", str(tmp_path / "other.jsonl"), "--may-change", "../elsewhere.py"]) == 2
