"""The README's Jupyter and Emacs paragraphs, followed as written, in a home of their own.

The commands are read out of README.md, so that a change there is a change
here. `.venv/bin/` is this test run's environment, which `python3 tasks.py
test` makes at .venv. Two lines are not run: `pip install jupyterlab` (CI
does not download a front end; the kernelspec it would find is checked with
`jupyter kernelspec list`, and the walkthrough is run as Jupyter runs it,
with nbclient) and `jupyter lab`, which starts a server for a browser.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import HANG, require_tool

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TIMEOUT = HANG


def paragraph(opening):
    """The README's list item that begins with OPENING, up to the next item."""
    start = README.index(f"\n- {opening}")
    return README[start:README.index("\n- ", start + 1)]


def blocks(text, language):
    """The fenced blocks of LANGUAGE in TEXT, their indentation removed."""
    return [re.sub(r"(?m)^  ", "", body) for body in re.findall(rf"```{language}\n(.*?)\n  ```", text, re.S)]


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh user: an empty home, no Jupyter or XDG paths of the test session's."""
    home = tmp_path / "home"
    home.mkdir()
    for name in ("JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    return home


def run_as_written(line):
    """A README command line, run by bash in the checkout, with .venv/bin/ this run's environment."""
    command = line.replace(".venv/bin/", os.path.dirname(sys.executable) + "/")
    result = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, f"{line}: {result.stderr}"
    return result.stdout


def test_the_jupyter_paragraph(home, tmp_path):
    (commands,) = blocks(paragraph("Step the agent in Jupyter"), "sh")
    install, front_end, copy, start = commands.splitlines()
    assert front_end == ".venv/bin/pip install jupyterlab"
    assert start == ".venv/bin/jupyter lab notebooks/my-walkthrough.ipynb"
    assert "installed the mlplcode kernel in " + str(home) in run_as_written(install)
    listed = json.loads(run_as_written(".venv/bin/jupyter kernelspec list --json"))["kernelspecs"]
    assert listed["mlplcode"]["resource_dir"].startswith(str(home))
    # In a checkout of its own, committed: the copy the README makes, run as the notebook front
    # end runs it and saved as it autosaves, leaves git with nothing to show.
    checkout = tmp_path / "checkout"
    for name in ("notebooks", "examples"):
        shutil.copytree(ROOT / name, checkout / name)
    shutil.copy(ROOT / ".gitignore", checkout / ".gitignore")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(checkout)]
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "checkout"]):
        subprocess.run(git + argv, check=True, capture_output=True)
    subprocess.run(["bash", "-c", copy], cwd=checkout, check=True, timeout=TIMEOUT)
    mine = checkout / "notebooks" / "my-walkthrough.ipynb"
    notebook = nbformat.read(str(mine), as_version=4)
    env = {**os.environ, "TMPDIR": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    NotebookClient(notebook, timeout=HANG, resources={"metadata": {"path": str(mine.parent)}}).execute(env=env)
    assert not [o for cell in notebook.cells for o in cell.get("outputs", []) if o.output_type == "error"]
    assert "stop: done" in (mine.parent / "walkthrough-transcript.md").read_text().replace("**", "")
    nbformat.write(notebook, str(mine))
    (mine.parent / ".ipynb_checkpoints").mkdir()
    (mine.parent / ".ipynb_checkpoints" / "my-walkthrough-checkpoint.ipynb").write_text("{}")
    status = subprocess.run(git + ["status", "--porcelain"], capture_output=True, text=True, check=True)
    assert status.stdout == ""


def test_the_emacs_paragraph(home, tmp_path):
    require_tool("emacs", "the README's Emacs paragraph")
    text = paragraph("Step it in Emacs")
    commands = blocks(text, "sh")[0]
    for line in commands.splitlines():
        run_as_written(line)
    init = home / ".emacs.d" / "init.el"
    assert f'(setq ob-mlplcode-python "{sys.executable}")' in init.read_text()
    # An org file in a checkout's top folder, with the README's blocks, executed block by block.
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / "examples", checkout / "examples")
    (org,) = blocks(text, "org")
    (checkout / "tour.org").write_text(org + "\n")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TMPDIR": str(tmp_path)}
    # The README's command for batch Emacs, which loads the init file and asks nothing; no input,
    # so a question would end it.
    (batch,) = blocks(paragraph("Step it in Emacs").split("batch Emacs runs the whole file")[1], "sh")
    emacs = subprocess.run(["bash", "-c", batch], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           cwd=checkout, env=env, timeout=TIMEOUT)
    assert emacs.returncode == 0, emacs.stderr[-3000:]
    results = (checkout / "tour.org").read_text().split("#+RESULTS:")[1:]
    assert len(results) == 2 and "task: Add a function mul(a, b)" in results[0]
    assert "step 1: READ calc.py" in results[1]
    assert "session agent: stopped its kernel" in emacs.stderr
    assert "def mul" not in (checkout / "examples" / "add" / "calc.py").read_text()  # a copy was worked on
