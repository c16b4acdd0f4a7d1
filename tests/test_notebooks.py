"""Every notebook in notebooks/ runs from top to bottom, as Jupyter would run it."""
import glob
import os
import shutil

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient

from conftest import install_kernelspec
from mlplcode.cli import EXAMPLES

install_kernelspec()
NOTEBOOKS = os.path.join(os.path.dirname(EXAMPLES), "notebooks")


@pytest.mark.parametrize("name", sorted(os.path.basename(p) for p in glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))))
def test_the_notebook_runs_in_a_copy_of_the_checkout(name, tmp_path):
    """Run it in a copy of notebooks/ and examples/, so that its journal, its
    transcript and its %root --copy (TMPDIR) all land in the test's directory."""
    shutil.copytree(NOTEBOOKS, tmp_path / "notebooks")
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    notebook = nbformat.read(str(tmp_path / "notebooks" / name), as_version=4)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    NotebookClient(notebook, timeout=60, resources={"metadata": {"path": str(tmp_path / "notebooks")}}).execute(env=env)
    nbformat.validate(notebook)
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.output_type == "error"]
    if name == "walkthrough.ipynb":
        kinds = [output.metadata["mlplcode"]["kind"] for output in outputs if "metadata" in output and output.metadata]
        assert kinds.count("ask") == 2 and kinds[-2:] == ["state", "saved"]
        assert "stop: done" in open(tmp_path / "notebooks" / "walkthrough-transcript.md").read().replace("**", "")


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(NOTEBOOKS, "*.ipynb"))))
def test_the_notebook_and_its_markdown_pair_agree(path):
    notebook = nbformat.read(path, as_version=4)
    paired = jupytext.read(path.removesuffix(".ipynb") + ".md", fmt="md:myst")
    assert [(c.cell_type, c.source) for c in notebook.cells] == [(c.cell_type, c.source) for c in paired.cells]
