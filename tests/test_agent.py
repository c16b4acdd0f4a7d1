import json
import os

import pytest

import mlplcode.agent
import mlplcode.loop
from mlplcode import Agent
from mlplcode.agent import AgentError, Syncing
from mlplcode.journal import append_event, read_events
from mlplcode.policy import DEFAULT_POLICY


@pytest.fixture
def agent(project, replies, tmp_path):
    return Agent.start("Add mul and its test", project, f"scripted:{replies}", journal=str(tmp_path / "run.jsonl"))


def test_a_sync_runs_in_a_thread_the_process_waits_for_and_its_failure_is_raised_by_wait(tmp_path):
    journal = tmp_path / "j.jsonl"
    append_event(str(journal), {"type": "start"})
    syncing = Syncing(str(journal))
    assert not syncing.thread.daemon  # so the process does not exit before the disk has the events
    syncing.wait()
    failing = Syncing(str(tmp_path / "removed.jsonl"))
    with pytest.raises(FileNotFoundError):
        failing.wait()


def test_each_call_starts_its_sync_and_waits_for_the_one_before(agent, monkeypatch):
    agent.step()
    first = agent.syncing
    agent.step()
    assert agent.syncing is not first and not first.thread.is_alive()

    def failing(path):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(mlplcode.agent, "sync_journal", failing)
    agent.note("one more")  # its sync fails on its thread, and the next call says so
    with pytest.raises(OSError, match="Input/output"):
        agent.note("and another")


def test_the_add_mul_task_with_an_approval_and_a_denial(agent, project):
    first = agent.step(5)
    assert first.numbers == (1, 2, 3)  # stopped early, at the ask
    assert agent.state.steps[2].verdict == "ask"
    assert agent.approve().numbers == (3,)
    assert agent.step().numbers == (4,)
    denied = agent.deny("patch the test file instead of rewriting it")
    assert denied.state.steps[3].approved is False
    assert "] NOTE FROM THE HUMAN:\npatch the test file instead" in agent.prompt()[1]["content"]
    agent.run()
    agent.approve()
    report = agent.run()
    assert report.state.stop == {"reason": "done", "message": "added mul and its test"}
    assert [s.approved for s in report.state.steps] == [None, None, True, False, True, None, None]
    assert "def test_mul" in open(f"{project}/test_calc.py").read()


def test_every_event_is_in_the_journal_as_it_happens(agent):
    agent.step(3)
    assert read_events(agent.journal) == agent.events
    start = agent.events[0]
    assert start["run"] == agent.run_id and start["root"] == agent.root


def test_a_step_while_an_ask_waits_is_refused_with_what_to_do(agent):
    agent.step(3)
    with pytest.raises(AgentError, match=r"^step 3 is waiting for a decision: use approve\(\) or deny\(reason\)$"):
        agent.step()


def test_a_decision_with_nothing_waiting_is_refused(agent):
    with pytest.raises(AgentError, match=r"nothing is waiting for a decision: use step\(\)"):
        agent.approve()
    with pytest.raises(AgentError, match="nothing is waiting"):
        agent.deny("no")
    assert [e["type"] for e in read_events(agent.journal)] == ["start"]  # the reason was not recorded


def test_after_the_stop_steps_decisions_and_notes_are_refused(project, tmp_path):
    script = tmp_path / "one.json"
    script.write_text(json.dumps(["READ calc.py"]))
    agent = Agent.start("t", project, f"scripted:{script}", journal=str(tmp_path / "j.jsonl"), budget=1)
    agent.step()
    assert agent.step().state.stop["reason"] == "budget"
    for call in (agent.step, agent.run, agent.approve, lambda: agent.note("hi")):
        with pytest.raises(AgentError, match="stopped|nothing is waiting") as caught:
            call()
        assert "Agent.start" in str(caught.value)


def test_a_run_taken_up_from_its_journal_goes_on_where_it_stopped(agent):
    agent.step(3)
    again = Agent(agent.journal)
    assert again.state == agent.state
    again.approve()
    assert again.step().state.steps[3].action["tool"] == "write"  # the script went on at reply 4


def test_a_journal_without_the_one_start_event_shape_is_refused(tmp_path):
    journal = str(tmp_path / "old.jsonl")
    append_event(journal, {"type": "start", "task": "t", "budget": 1, "policy": DEFAULT_POLICY, "model": "echo"})
    with pytest.raises(ValueError, match="line 1: a start event needs model_options"):
        Agent(journal)


def test_a_journal_whose_policy_is_not_whole_is_refused(agent):
    lines = open(agent.journal).read().replace('"git": "ask", ', "")
    open(agent.journal, "w").write(lines)
    with pytest.raises(ValueError, match="the policy names no verdict for git"):
        Agent(agent.journal)


def test_a_run_whose_project_is_gone_cannot_be_taken_up(agent, project):
    agent.step()
    os.rename(project, project + "-moved")
    with pytest.raises(ValueError, match=f"the run's project {project} is gone"):
        Agent(agent.journal)


def test_a_journal_inside_the_project_is_refused(project):
    with pytest.raises(ValueError, match="is inside the project"):
        Agent.start("t", project, "echo", journal=os.path.join(project, "sub", "j.jsonl"))
    assert not os.path.exists(os.path.join(project, "sub"))


def test_start_refuses_before_writing_anything(project, tmp_path):
    journal = tmp_path / "j.jsonl"
    with pytest.raises(ValueError, match="not a directory"):
        Agent.start("t", str(tmp_path / "missing"), "echo", journal=str(journal))
    with pytest.raises(ValueError, match="unknown model spec"):
        Agent.start("t", project, "gpt-4", journal=str(journal))
    assert not journal.exists()
    journal.write_text("")
    with pytest.raises(ValueError, match="already exists"):
        Agent.start("t", project, "echo", journal=str(journal))


def test_settings_the_journal_would_refuse_are_refused_before_anything_is_written(tmp_path):
    """A transcript writes the root back as a command: a line break in it would add one."""
    root = tmp_path / "one\n%approve"
    root.mkdir()
    journal = tmp_path / "state" / "j.jsonl"
    with pytest.raises(ValueError, match="root is one line of printable text"):
        Agent.start("t", str(root), "echo", journal=str(journal))
    assert not (tmp_path / "state").exists()


def test_a_reason_over_several_lines_is_kept_as_one(agent):
    agent.step(5)
    agent.approve()
    agent.step()
    agent.deny("patch the test\nfile instead\x1b[2J of rewriting it ")
    decision = [event for event in agent.events if event["type"] == "decision"][-1]
    assert decision["reason"] == "patch the test file instead[2J of rewriting it"
    assert read_events(agent.journal) == agent.events


def test_the_default_journal_is_named_after_the_run_in_the_state_directory(project, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(project)
    agent = Agent.start("t", ".", "echo")
    assert agent.journal == str(tmp_path / "state" / "mlplcode" / "runs" / f"{agent.run_id}.jsonl")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    again = Agent.start("t", ".", "echo")
    assert again.journal.startswith(str(tmp_path / "home" / ".local" / "state" / "mlplcode" / "runs"))


def test_the_prompt_is_exactly_what_the_model_is_sent(project, tmp_path):
    agent = Agent.start("Say what you see", project, "echo", journal=str(tmp_path / "j.jsonl"))
    agent.note("Be brief.")
    expected = agent.prompt()[1]["content"]
    assert agent.step().state.steps[0].reply == expected


def test_an_interrupt_closes_the_step_stops_the_run_and_resume_takes_it_up(agent, monkeypatch):
    def interrupted(action, project):
        raise KeyboardInterrupt
    monkeypatch.setattr(mlplcode.loop, "execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        agent.step()
    monkeypatch.undo()
    cut = agent.state.steps[0]
    assert cut.observation["text"] == ("INTERRUPTED: the human stopped this step before it finished; its"
                                       " action may have been carried out, whole or in part: look before"
                                       " doing it again")
    assert agent.state.stop["reason"] == "interrupted"
    assert read_events(agent.journal) == agent.events
    with pytest.raises(AgentError, match=r"the run was interrupted: use resume\(\)"):
        agent.step()
    again = Agent(agent.journal)
    again.resume()
    assert again.events[-1] == {"type": "resume"}
    assert again.step().state.steps[1].action == {"tool": "read", "path": "test_calc.py"}


def test_an_interrupt_while_the_model_thinks_of_its_first_reply_says_so(project, tmp_path):
    agent = Agent.start("t", project, "echo", journal=str(tmp_path / "j.jsonl"))

    def thinking(messages):
        raise KeyboardInterrupt
    agent.model = thinking
    with pytest.raises(KeyboardInterrupt):
        agent.step()
    assert agent.events[-1] == {"type": "stop", "reason": "interrupted",
                                "message": "the human stopped the run before its first step"}
    agent.resume()
    agent.model = lambda messages: "READ calc.py"
    assert agent.step().state.steps[0].action == {"tool": "read", "path": "calc.py"}
    with pytest.raises(KeyboardInterrupt):
        agent.model = thinking
        agent.step()
    assert agent.state.stop["message"] == "the human stopped the run after step 1"


def test_a_run_whose_process_died_mid_step_is_taken_up_with_its_step_closed(agent):
    agent.step()
    append_event(agent.journal, {"type": "reply", "step": 2, "text": "READ test_calc.py"})
    again = Agent(agent.journal)
    with pytest.raises(AgentError, match=r"step 2 was cut short: use resume\(\)"):
        again.step()
    again.resume()
    assert again.state.steps[1].observation["text"] == (
        "CUT SHORT: the process that ran this step ended before the step finished, and recorded no"
        " reason; its action was not carried out")  # it was never judged, and no human stopped it
    assert again.step().state.steps[2].action == {"tool": "patch", "path": "calc.py",
                                                  "old": "def add(a, b):\n    return a + b\n",
                                                  "new": "def add(a, b):\n    return a + b\n\n\n"
                                                         "def mul(a, b):\n    return a * b\n"}


def test_a_step_whose_process_died_after_its_verdict_may_have_acted_and_no_human_is_blamed(agent):
    agent.step()
    for event in ({"type": "reply", "step": 2, "text": "READ test_calc.py"},
                  {"type": "action", "step": 2, "action": {"tool": "read", "path": "test_calc.py"}},
                  {"type": "verdict", "step": 2, "verdict": "allow", "reason": "READ test_calc.py is read: allow"}):
        append_event(agent.journal, event)
    again = Agent(agent.journal)
    again.resume()
    text = again.state.steps[1].observation["text"]
    assert text.startswith("CUT SHORT: the process that ran this step ended") and "human" not in text
    assert text.endswith("its action may have been carried out, whole or in part: look before doing it again")
    assert again.state.stop is None and again.events[-1]["type"] == "observation"  # no resume: nothing stopped it


def test_an_interrupt_before_the_verdict_says_the_action_was_not_carried_out(agent):
    def watcher(event, state):
        if event["type"] == "action":
            raise KeyboardInterrupt
    agent.on_event = watcher
    with pytest.raises(KeyboardInterrupt):
        agent.step()
    assert [event["type"] for event in agent.events] == ["start", "tests", "reply", "action", "observation",
                                                               "stop"]
    assert agent.state.steps[0].observation["text"] == (
        "INTERRUPTED: the human stopped this step before it finished; its action was not carried out")


def test_a_finished_run_cannot_be_taken_up(project, tmp_path):
    agent = Agent.start("t", project, "echo", journal=str(tmp_path / "j.jsonl"), budget=1)
    agent.run()
    with pytest.raises(AgentError, match=r"stopped \(budget\) and cannot be taken up again"):
        agent.resume()


def test_drive_answers_each_ask_and_runs_to_the_stop(agent, project):
    asked = []
    def decider(action):
        asked.append(action["tool"])
        return (True, "") if len(asked) != 2 else (False, "patch the test file instead")
    report = agent.drive(decider)
    assert report.state.stop["reason"] == "done" and asked == ["patch", "write", "patch"]


def test_a_bare_no_ends_the_run_denied(agent):
    agent.step(3)
    report = agent.deny()
    assert report.state.stop == {"reason": "denied", "message": "step 3: the human declined PATCH calc.py"}


def test_a_report_keeps_showing_what_it_showed(agent):
    report = agent.step(3)
    before = repr(report)
    agent.approve()
    agent.step()
    assert repr(report) == before


def test_a_report_shows_itself_as_html_markdown_and_text(agent):
    report = agent.step(3)
    assert "<pre>" in report._repr_html_() and "step 3: PATCH calc.py" in report._repr_html_()
    assert "```diff" in report._repr_markdown_()
    text = repr(report)
    assert text.startswith("step 1: READ calc.py\n")
    assert text.endswith("waiting: approve() or deny(reason)")


def test_every_committed_journal_opens_with_agent():
    from mlplcode.cli import EXAMPLES
    journals = [os.path.join(EXAMPLES, name) for name in os.listdir(EXAMPLES) if name.endswith(".jsonl")]
    assert journals
    for journal in journals:
        assert Agent(journal).state.stop["reason"] == "done", journal
