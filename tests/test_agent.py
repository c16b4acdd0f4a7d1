import json

import pytest

import mlplcode.loop
from mlplcode import Agent
from mlplcode.agent import AgentError
from mlplcode.journal import append_event, read_events
from mlplcode.policy import DEFAULT_POLICY


@pytest.fixture
def agent(project, replies, tmp_path):
    return Agent.start("Add mul and its test", project, f"scripted:{replies}", journal=str(tmp_path / "run.jsonl"))


def test_the_add_mul_task_with_an_approval_and_a_denial(agent, project):
    first = agent.step(5)
    assert first.numbers == (1, 2, 3)  # stopped early, at the ask
    assert agent.state.steps[2].verdict == "ask"
    assert agent.approve().numbers == (3,)
    assert agent.step().numbers == (4,)
    denied = agent.deny("patch the test file instead of rewriting it")
    assert denied.state.steps[3].approved is False
    assert "NOTE FROM THE HUMAN: patch the test file instead" in agent.prompt()[1]["content"]
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


def test_a_journal_the_agent_did_not_write_is_refused(tmp_path):
    journal = str(tmp_path / "cli.jsonl")
    append_event(journal, {"type": "start", "task": "t", "budget": 1, "policy": DEFAULT_POLICY, "model": "echo"})
    with pytest.raises(ValueError, match="not a run an Agent started"):
        Agent(journal)


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


def test_the_default_journal_is_named_after_the_run_in_the_working_directory(project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    agent = Agent.start("t", project, "echo")
    assert agent.journal == str(tmp_path / f"mlplcode-{agent.run_id}.jsonl")


def test_the_prompt_is_exactly_what_the_model_is_sent(project, tmp_path):
    agent = Agent.start("Say what you see", project, "echo", journal=str(tmp_path / "j.jsonl"))
    agent.note("Be brief.")
    expected = agent.prompt()[1]["content"]
    assert agent.step().state.steps[0].reply == expected


def test_an_interrupt_closes_the_step_it_cut_short_and_the_run_goes_on(agent, monkeypatch):
    def interrupted(action, root):
        raise KeyboardInterrupt
    monkeypatch.setattr(mlplcode.loop, "execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        agent.step()
    monkeypatch.undo()
    cut = agent.state.steps[0]
    assert cut.observation["text"].startswith("INTERRUPTED")
    assert read_events(agent.journal) == agent.events
    assert agent.step().state.steps[1].action == {"tool": "read", "path": "test_calc.py"}


def test_a_report_shows_itself_as_html_markdown_and_text(agent):
    report = agent.step(3)
    assert "<pre>" in report._repr_html_() and "step 3: PATCH calc.py" in report._repr_html_()
    assert "```diff" in report._repr_markdown_()
    text = repr(report)
    assert text.startswith("step 1: READ calc.py\n")
    assert text.endswith("waiting: approve() or deny(reason)")
