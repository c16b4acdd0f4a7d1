"""Compaction: a long run's prompt stays within the model's context, and the run replays exactly."""
import contextlib
import io
import json
import os
import shutil

import pytest

from mlplcode import Agent
from mlplcode.cli import EXAMPLES, replay
from mlplcode.compaction import SUMMARY_PROMPT
from mlplcode.prompt import CHARS_PER_TOKEN, build_context, prompt_budget, run_marker
from mlplcode.transcript import markdown

SUMMARY_START = SUMMARY_PROMPT.split(".")[0]


class Live:
    """A model that reads its whole prompt, as a live one does: READs for steps, a short summary when asked."""

    def __init__(self, replies):
        self.replies, self.prompts, self.summaries = list(replies), [], 0

    def __call__(self, messages):
        self.prompts.append(messages)
        if messages[0]["content"].startswith(SUMMARY_START):
            self.summaries += 1
            return f"Summary {self.summaries}: calc.py holds add; test_calc.py tests it."
        return self.replies.pop(0)


def tokens(messages):
    return sum(len(message["content"]) for message in messages) // CHARS_PER_TOKEN + 1


@pytest.fixture
def long_run(project, tmp_path):
    agent = Agent.start("Read the files again and again", project, "echo", journal=str(tmp_path / "run.jsonl"),
                        budget=40, model_options={"context": 1400})
    agent.model = Live(["READ calc.py", "READ test_calc.py", "SEARCH add"] * 14)
    return agent


def test_every_prompt_of_a_long_run_fits_its_budget(long_run):
    long_run.step(5)
    long_run.note("Keep going.")
    long_run.run()
    model, state = long_run.model, long_run.state
    assert state.stop["reason"] == "budget" and len(state.steps) == 40
    budget = prompt_budget(state)
    assert max(tokens(messages) for messages in model.prompts) <= budget
    assert model.summaries == state.compactions > 1
    assert [e["type"] for e in long_run.events].count("compact") == state.compactions
    last = build_context(state)[1]["content"]
    assert f"] NOTES ON STEPS 1 TO {state.summarized} (a summary written for you, not what the tools answered):\nSummary {model.summaries}:" in last
    assert "] NOTE FROM THE HUMAN:\nKeep going." in last  # a note survives every compaction, word for word
    assert f"ACTION {len(state.steps)}:" in last and "ACTION 1:\n" not in last


def test_a_compacted_run_replays_exactly(long_run, tmp_path):
    long_run.run()
    fresh = shutil.copytree(os.path.join(EXAMPLES, "add"), str(tmp_path / "fresh"))
    with contextlib.redirect_stdout(io.StringIO()):
        status, recorded, replayed = replay(long_run.journal, fresh, str(tmp_path / "again.jsonl"))
    assert [e for e in replayed[1:]] == recorded[1:]
    assert any(e["type"] == "compact" for e in replayed)


def scripted_run(project, tmp_path, name, replies, budget, context):
    script = tmp_path / f"{name}.json"
    script.write_text(json.dumps(replies))
    return Agent.start("Read the files again and again", shutil.copytree(project, str(tmp_path / name)),
                       f"scripted:{script}", journal=str(tmp_path / f"{name}.jsonl"), budget=budget,
                       model_options={"context": context})


def test_a_scripted_model_keeps_its_replies_for_steps_and_the_summary_is_made_from_the_journal(
        project, tmp_path):
    """300 alternating READs in a small context: before, each summary took a reply of the script,
    two READs of one file met in a row, and the run ended stuck after two compactions (at 1,024
    tokens; the smallest context that starts this task is now 1,363)."""
    replies = ["READ calc.py", "READ test_calc.py"] * 150
    agent = scripted_run(project, tmp_path, "long", replies, 300, 1400)
    agent.run()
    state = agent.state
    assert state.stop["reason"] == "budget" and len(state.steps) == 300 and state.compactions > 2
    assert [step.action["path"] for step in state.steps] == [reply.split()[1] for reply in replies]
    summaries = [event["summary"] for event in agent.events if event["type"] == "compact"]
    assert summaries[0].startswith("step 1: READ calc.py: calc.py (5 lines)")
    assert max(map(len, summaries)) <= 4000  # the latest lines, as much as a paragraph of the prompt holds
    fresh = shutil.copytree(os.path.join(EXAMPLES, "add"), str(tmp_path / "fresh"))
    with contextlib.redirect_stdout(io.StringIO()):
        status, recorded, replayed = replay(agent.journal, fresh, str(tmp_path / "again.jsonl"))
    assert replayed[1:] == recorded[1:]  # a replay is given the recorded summaries back


def test_a_compacted_scripted_run_is_taken_up_past_its_summaries(project, tmp_path):
    replies = ["READ calc.py", "READ test_calc.py", "SEARCH add"] * 14
    whole = scripted_run(project, tmp_path, "whole", replies, 40, 1400)
    whole.run()
    part = scripted_run(project, tmp_path, "part", replies, 40, 1400)
    part.step(14)
    assert part.state.compactions > 0
    resumed = Agent(part.journal)  # its model starts after the replies used, summaries being none of them
    resumed.run()
    assert resumed.events[1:] == whole.events[1:]


def test_compact_folds_every_step_at_once_and_the_transcript_shows_it(project, tmp_path):
    agent = Agent.start("t", project, "echo", journal=str(tmp_path / "j.jsonl"), budget=5)
    agent.model = Live(["READ calc.py", "READ test_calc.py"])
    with pytest.raises(Exception, match="nothing to compact yet"):
        agent.compact()
    agent.step(2)
    agent.compact()
    assert agent.state.summarized == 2 and agent.events[-1]["type"] == "compact"
    prompt = agent.prompt()[1]["content"]
    marker = run_marker(agent.state.start)
    assert prompt.startswith(f"[{marker}] TASK:\nt\n\n[{marker}] NOTES ON STEPS 1 TO 2 (a summary written"
                             " for you, not what the tools answered):\nSummary 1:") and "ACTION" not in prompt
    assert "steps 1 to 2 are summarized in the prompt" in markdown(agent.events)
