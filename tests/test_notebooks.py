"""Every notebook in notebooks/ runs from top to bottom, as Jupyter would run it, and as papermill and
nbconvert run it; and its Markdown pair stays as it is through a jupytext sync."""
import glob
import json
import os
import shutil
import subprocess
import sys
import warnings

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from conftest import HANG, install_kernelspec
from mlplcode.cli import EXAMPLES

install_kernelspec()
NOTEBOOKS = os.path.join(os.path.dirname(EXAMPLES), "notebooks")
BIN = os.path.dirname(sys.executable)


def scratch_checkout(tmp_path):
    """A copy of notebooks/ and examples/, so that journals, transcripts and copies (TMPDIR) land in TMP_PATH."""
    shutil.copytree(NOTEBOOKS, tmp_path / "notebooks")
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return {**os.environ, "TMPDIR": str(tmp_path)}


def execute(path, env):
    notebook = nbformat.read(str(path), as_version=4)
    NotebookClient(notebook, timeout=HANG, resources={"metadata": {"path": str(path.parent)}}).execute(env=env)
    nbformat.validate(notebook)
    return notebook


def outputs_of(notebook):
    return [output for cell in notebook.cells for output in cell.get("outputs", [])]


def plain(outputs):
    return "\n".join(o.get("text") or o.get("data", {}).get("text/plain", "") for o in outputs)


@pytest.mark.parametrize("name", sorted(os.path.basename(p) for p in glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))))
def test_the_notebook_runs_in_a_copy_of_the_checkout(name, tmp_path):
    env = scratch_checkout(tmp_path)
    notebook = execute(tmp_path / "notebooks" / name, env)
    outputs = outputs_of(notebook)
    assert not [output for output in outputs if output.output_type == "error"]
    if name == "walkthrough.ipynb":
        kinds = [output.metadata["mlplcode"]["kind"] for output in outputs if "metadata" in output and output.metadata]
        assert kinds.count("ask") == 2 and kinds[-2:] == ["state", "saved"]
        assert "stop: done" in open(tmp_path / "notebooks" / "walkthrough-transcript.md").read().replace("**", "")
    if name == "batch.ipynb":
        assert "stop: done" in plain(outputs[-1:])


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))))
def test_the_notebook_and_its_markdown_pair_agree(path):
    notebook = nbformat.read(path, as_version=4)
    paired = jupytext.read(path.removesuffix(".ipynb") + ".md", fmt="md:myst")
    assert [(c.cell_type, c.source) for c in notebook.cells] == [(c.cell_type, c.source) for c in paired.cells]
    assert [c.metadata.get("tags") for c in notebook.cells] == [c.metadata.get("tags") for c in paired.cells]


@pytest.mark.parametrize("name", sorted(os.path.basename(p) for p in glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))))
def test_a_jupytext_sync_of_an_unchanged_notebook_changes_nothing(name, tmp_path):
    shutil.copytree(NOTEBOOKS, tmp_path / "notebooks")
    pair = [tmp_path / "notebooks" / name, tmp_path / "notebooks" / name.replace(".ipynb", ".md")]
    before = [path.read_bytes() for path in pair]
    for synced in pair:  # from either side, as an editor saving one of them would
        result = subprocess.run([os.path.join(BIN, "jupytext"), "--sync", str(synced)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert [path.read_bytes() for path in pair] == before, result.stderr


def test_papermill_runs_the_batch_notebook_with_another_task_and_model(tmp_path):
    env = scratch_checkout(tmp_path)
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["READ calc.py", "PATCH calc.py\nOLD\ndef add(a, b):\n    return a + b\nNEW\n"
                                  "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\nEND",
                                  "RUN python -m pytest -q", "DONE added sub"]))
    out = tmp_path / "out.ipynb"
    # The command line, as a user runs it: papermill finds the translator through the entry point.
    result = subprocess.run([os.path.join(BIN, "papermill"), str(tmp_path / "notebooks" / "batch.ipynb"), str(out),
                             "--cwd", str(tmp_path / "notebooks"), "-p", "task", "Add sub(a, b) to calc.py",
                             "-p", "model", f"scripted:{script}", "-p", "budget", "6"],
                            capture_output=True, text=True, env=env, timeout=HANG)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "unknown parameter" not in result.stderr, result.stderr[-3000:]
    notebook = nbformat.read(str(out), as_version=4)
    injected = notebook.cells[2]
    assert injected.metadata.tags == ["injected-parameters"]
    assert injected.source == f"%task --next Add sub(a, b) to calc.py\n%model scripted:{script}\n%budget 6\n"
    state = plain(outputs_of(notebook)[-1:])
    assert "task: Add sub(a, b) to calc.py" in state and f"model: scripted:{script}" in state
    assert "steps: 4 of 6" in state and "stop: done: added sub" in state


def test_papermill_knows_the_parameters_of_a_notebook_and_their_defaults():
    from papermill.inspection import inspect_notebook
    found = inspect_notebook(os.path.join(NOTEBOOKS, "batch.ipynb"))
    assert sorted(found) == ["budget", "model", "policy", "root", "task"]
    assert found["root"]["default"] == "--copy ../examples/add" and found["budget"]["default"] == "None"
    assert found["task"]["default"].startswith("Add a function mul(a, b)")


def test_papermill_refuses_a_parameter_that_is_no_setting(tmp_path):
    from papermill.exceptions import PapermillException
    from papermill.translators import translate_parameters
    assert translate_parameters("mlplcode", "mlplcode", {"root": "--copy x", "policy": "run=allow"}) == (
        "%root --copy x\n%policy run=allow\n")
    for parameters, refusal in [({"temperature": 0.2}, "takes the parameters root, model, budget, policy, task"),
                                ({"task": "two\nlines"}, "one line of text"), ({"budget": True}, "one line"),
                                ({"model": None}, "one line")]:
        with pytest.raises(PapermillException, match=refusal):
            translate_parameters("mlplcode", "mlplcode", parameters)


def test_nbconvert_writes_highlighted_cells_and_fixed_width_outputs(tmp_path):
    env = scratch_checkout(tmp_path)
    executed = tmp_path / "notebooks" / "executed.ipynb"
    nbformat.write(execute(tmp_path / "notebooks" / "walkthrough.ipynb", env), str(executed))
    # The command line, as a user runs it.
    result = subprocess.run([os.path.join(BIN, "jupyter"), "nbconvert", "--to", "html", str(executed)],
                            capture_output=True, text=True, env=env, timeout=HANG)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "No lexer found" not in result.stderr and "Warning" not in result.stderr, result.stderr
    page = (tmp_path / "notebooks" / "executed.html").read_text()
    assert '<div class="highlight hl-mlplcode"><pre><span></span><span class="k">%root</span>' in page
    assert '<span class="na">--copy</span>' in page
    outputs = page.count('<div class="mlplcode')
    opening = '<div class="mlplcode tex2jax_ignore mathjax_ignore" style="font-family: monospace">'
    assert outputs > 10 and page.count(opening) == outputs
