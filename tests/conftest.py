import os
import shutil
import warnings

import pytest

from mlplcode.cli import EXAMPLES


@pytest.fixture
def project(tmp_path):
    """A fresh copy of the example project: calc.py with add, and its test."""
    return shutil.copytree(os.path.join(EXAMPLES, "add"), str(tmp_path / "add"))


def require_tool(program, purpose):
    """Skip, visibly, when PROGRAM is not on PATH; fail instead when MLPLCODE_REQUIRE_TOOLS=1 (CI)."""
    if shutil.which(program):
        return
    reason = f"{program} is not on PATH: {purpose} NOT checked"
    if os.environ.get("MLPLCODE_REQUIRE_TOOLS") == "1":
        pytest.fail(reason + " (MLPLCODE_REQUIRE_TOOLS=1)")
    warnings.warn(reason + " (set MLPLCODE_REQUIRE_TOOLS=1 to make this an error)")
    pytest.skip(reason)
