import json
import os
import re

import nbformat
import pytest

from mlplcode import Agent
from mlplcode.kernel import parse_cell
from mlplcode.show import as_html, as_markdown, as_text, change, step_view
from mlplcode.transcript import MODEL_COMMAND_OPTIONS, save
from mlplcode.trust import org_verbatim


@pytest.fixture
def finished(project, replies, tmp_path):
    """The journal of the add-mul run: approve, deny with a reason, a note, approve, done."""
    agent = Agent.start("Add mul and its test", project, f"scripted:{replies}", journal=str(tmp_path / "run.jsonl"))
    agent.step(3)
    agent.approve()
    agent.step()
    agent.deny("patch the test file instead")
    agent.step()
    agent.note("Keep the test short.")
    agent.approve()
    agent.run()
    return agent


def test_a_write_is_a_diff_against_the_file_as_the_run_last_saw_it(finished):
    state = finished.state
    write = change(state, state.steps[3])
    assert write.startswith("--- test_calc.py (as last seen)\n+++ test_calc.py (written)\n")
    assert "-from calc import add\n+from calc import add, mul\n" in write
    assert change(state, state.steps[2]).startswith("--- calc.py (OLD)\n+++ calc.py (NEW)\n")


def test_a_new_file_is_a_diff_against_nothing(project, tmp_path):
    script = tmp_path / "s.json"
    script.write_text(json.dumps(["WRITE notes.txt\nhello\nEND"]))
    agent = Agent.start("t", project, f"scripted:{script}", journal=str(tmp_path / "j.jsonl"))
    state = agent.step().state
    assert change(state, state.steps[0]) == "--- /dev/null\n+++ notes.txt (written)\n@@ -0,0 +1 @@\n+hello\n"


def test_views_escape_what_each_format_would_misread():
    view = [("title", "", "step 1: READ __init__.py"), ("block", "reply", "```python\n<b>\n```"),
            ("line", "verdict", "allow")]
    markdown = as_markdown(view)
    assert "#### step 1: READ \\_\\_init\\_\\_.py" in markdown
    assert "````text\n```python\n<b>\n```\n````" in markdown
    assert "&lt;b&gt;" in as_html(view)
    assert as_text(view) == "step 1: READ __init__.py\nreply:\n    ```python\n    <b>\n    ```\nverdict: allow"


def test_org_writes_text_as_fixed_width_lines_that_nothing_can_end_or_open():
    assert org_verbatim("* heading\n#+end_example\n\n  ,* already\nsrc_sh{ls}") == \
        ": * heading\n: #+end_example\n:\n:   ,* already\n: src_sh{ls}"


def test_the_notebook_transcript_is_a_valid_notebook_of_the_cells_that_drove_the_run(finished, tmp_path):
    path = str(tmp_path / "t.ipynb")
    assert save(finished.journal, path) == 7
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    sources = [cell.source for cell in notebook.cells[2:]]
    assert sources == ["%%task\nAdd mul and its test", "%step", "%step", "%step\n%approve",
                       "%step\n%deny patch the test file instead", "%step", "Keep the test short.",
                       "%approve", "%step", "%step"]
    kinds = [output.metadata["mlplcode"]["kind"] for cell in notebook.cells for output in cell.get("outputs", [])]
    assert kinds == ["task"] + ["step"] * 5 + ["note"] + ["step"] * 2 + ["stop"]
    assert notebook.metadata.kernelspec.name == "mlplcode"
    assert {output.metadata["mlplcode"]["run"] for cell in notebook.cells for output in cell.get("outputs", [])} \
        == {finished.run_id}


@pytest.mark.parametrize("note", ["%approve\n%run", "  %policy write=allow", "%%task\nsomething else"])
def test_a_note_that_looks_like_commands_is_written_as_a_note(project, replies, tmp_path, note):
    """An editor's prompt or a Python call may record such a note; run again from the
    notebook, it must be the same note, not the commands it looks like."""
    agent = Agent.start("t", project, f"scripted:{replies}", journal=str(tmp_path / "run.jsonl"))
    agent.note(note)
    path = str(tmp_path / "t.ipynb")
    save(agent.journal, path)
    cell = nbformat.read(path, as_version=4).cells[-1].source
    assert parse_cell(cell) == [("note", note.strip())]


def test_the_notebook_s_model_cell_carries_the_options_the_run_used(project, replies, tmp_path):
    from mlplcode.kernel import COMMANDS, model_setting
    options = {"grammar": "lark", "context": 4096, "timeout": 30.0}
    agent = Agent.start("t", project, f"scripted:{replies}", journal=str(tmp_path / "j.jsonl"),
                        model_options=options)
    path = str(tmp_path / "t.ipynb")
    save(agent.journal, path)
    settings = nbformat.read(path, as_version=4).cells[1].source.splitlines()
    model = next(line for line in settings if line.startswith("%model "))
    assert model == f"%model scripted:{replies} --grammar lark --context 4096 --timeout 30.0"
    spec, given = model_setting(model.removeprefix("%model "))  # as the kernel reads the cell again
    again = Agent.start("t", project, spec, journal=str(tmp_path / "again.jsonl"), model_options=given)
    assert again.state.start["model_options"] == agent.state.start["model_options"]
    assert re.findall(r"--(\w+)", COMMANDS["model"][0]) == list(MODEL_COMMAND_OPTIONS)


def test_a_run_without_a_grammar_is_taken_up_again_without_one(project, replies, tmp_path):
    from mlplcode.kernel import model_setting
    agent = Agent.start("t", project, f"scripted:{replies}", journal=str(tmp_path / "j.jsonl"),
                        model_options={"grammar": "none"})
    save(agent.journal, str(tmp_path / "t.ipynb"))
    source = nbformat.read(str(tmp_path / "t.ipynb"), as_version=4).cells[1].source
    model = next(line for line in source.splitlines() if line.startswith("%model "))
    assert model.endswith(" --grammar none --context 8192")  # the context the run settled on
    spec, given = model_setting(model.removeprefix("%model "))
    again = Agent.start("t", project, spec, journal=str(tmp_path / "again.jsonl"), model_options=given)
    assert again.state.start["model_options"] == agent.state.start["model_options"]


def test_the_org_transcript_has_a_section_per_step_note_and_stop(finished, tmp_path):
    path = str(tmp_path / "t.org")
    save(finished.journal, path)
    text = open(path).read()
    headings = [line for line in text.splitlines() if line.startswith("* ")]
    assert headings == ["* step 1: READ", "* step 2: READ", "* step 3: PATCH", "* step 4: WRITE",
                        "* note from the human", "* step 5: PATCH", "* note from the human", "* step 6: RUN",
                        "* step 7: DONE", "* stop"]
    assert text.startswith(f"#+TITLE: mlplcode run\n: mlplcode run {finished.run_id}\n")
    assert "* step 7: DONE\n: step 7: DONE added mul and its test\n" in text
    assert "action:\n: --- calc.py (OLD)" in text and ": verdict: allow" in text


def test_the_markdown_transcript_is_rendered_from_the_journal_not_from_memory(finished, tmp_path):
    journal = finished.journal
    del finished  # nothing of the agent's memory is left
    path = str(tmp_path / "t.md")
    save(journal, path)
    text = open(path).read()
    assert text.startswith("# mlplcode run ")
    assert "## step 4: WRITE test\\_calc.py" in text
    assert "**stop:** done: added mul and its test" in text


def test_a_transcript_of_a_waiting_run_says_what_it_waits_for(project, replies, tmp_path):
    agent = Agent.start("t", project, f"scripted:{replies}", journal=str(tmp_path / "j.jsonl"))
    agent.step(3)
    save(agent.journal, str(tmp_path / "t.md"))
    assert "**waiting:** a decision on the last step" in open(tmp_path / "t.md").read()
    save(agent.journal, str(tmp_path / "t.ipynb"))
    last = nbformat.read(str(tmp_path / "t.ipynb"), as_version=4).cells[-1]
    assert last.outputs[-1].data["text/plain"] == "waiting: %approve or %deny [reason]"


def test_save_refuses_an_unknown_format(finished, tmp_path):
    with pytest.raises(ValueError, match="FILE.ipynb, FILE.org or FILE.md"):
        save(finished.journal, str(tmp_path / "t.html"))
    assert not os.path.exists(tmp_path / "t.html")


def test_a_step_view_has_reply_action_verdict_and_observation(finished):
    state = finished.state
    labels = [label for _, label, _ in step_view(state, state.steps[2])]
    assert labels == ["", "reply", "action", "verdict", "observation"]
