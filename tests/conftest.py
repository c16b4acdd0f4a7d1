import atexit
import functools
import json
import os
import shutil
import tempfile
import warnings

import pytest

from mlplcode.cli import EXAMPLES, install_kernel

# Journals go to the XDG state directory by default: keep this session's, and the kernels'
# and Emacs's it starts, out of the user's.
os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="mlplcode-state-")
atexit.register(shutil.rmtree, os.environ["XDG_STATE_HOME"], True)

# How long a test waits for a program, a kernel or a notebook before it gives up: a
# guard against a hang, never a verdict on a slow machine. A loaded machine may take
# many times longer than an idle one, and a correct run must still pass there.
HANG = 1800


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


# The add-mul task as a model would do it, with a WRITE that is declined in
# favour of a PATCH: the replies shared by the Agent, kernel and transcript tests.
PATCH_MUL = ("PATCH calc.py\nOLD\ndef add(a, b):\n    return a + b\nNEW\n"
             "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\nEND")
WRITE_TEST = ("WRITE test_calc.py\nfrom calc import add, mul\n\n\ndef test_add():\n"
              "    assert add(2, 3) == 5\n\n\ndef test_mul():\n    assert mul(2, 3) == 6\nEND")
PATCH_TEST = ("PATCH test_calc.py\nOLD\nfrom calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
              "NEW\nfrom calc import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
              "def test_mul():\n    assert mul(2, 3) == 6\nEND")
ADD_MUL_WITH_A_DENIAL = ["READ calc.py", "READ test_calc.py", PATCH_MUL, WRITE_TEST, PATCH_TEST,
                         "RUN python -m pytest -q", "DONE added mul and its test"]


@pytest.fixture
def replies(tmp_path):
    """A scripted model's file holding ADD_MUL_WITH_A_DENIAL."""
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(ADD_MUL_WITH_A_DENIAL))
    return str(path)


@functools.cache
def install_kernelspec():
    """Install the mlplcode kernelspec once, into a temporary JUPYTER_PATH for this test session.

    jupyter_kernel_test reads JUPYTER_PATH when its class is set up, so the
    test modules call this at import time, not in a fixture.
    """
    directory = tempfile.mkdtemp(prefix="mlplcode-jupyter-")
    atexit.register(shutil.rmtree, directory, True)
    install_kernel(user=False, prefix=directory)
    os.environ["JUPYTER_PATH"] = os.path.join(directory, "share", "jupyter")
    return os.environ["JUPYTER_PATH"]


def start_event(root, task="Add mul and its test", budget=10, policy=None, model="test"):
    """A start event as every front end writes it."""
    from mlplcode.policy import DEFAULT_POLICY
    return {"type": "start", "task": task, "budget": budget, "policy": policy or DEFAULT_POLICY,
            "model": model, "model_options": {}, "root": str(root), "run": "test-run"}


def tests_event(root):
    """The tests event an Agent records before the first step: the tests under ROOT, recorded and kept."""
    from mlplcode.verify import keep_tests, snapshot_tests
    record = snapshot_tests(os.path.realpath(root))
    return {"type": "tests", "sha256": keep_tests(record), "files": len(record)}


class Recorder:
    """The loop's RECORD function for tests: keeps the events and applies each to a state, as an Agent
    does, starting from START and the record of the tests of its root."""

    def __init__(self, start):
        from mlplcode.journal import fold
        self.events = [start, tests_event(start["root"])]
        self.state = fold(self.events)

    def __call__(self, event):
        from mlplcode.journal import apply
        self.events.append(event)
        apply(self.state, event)


# The order in which pytest-xdist hands the test files to its workers (python3 tasks.py test runs
# it with --dist loadfile: a file to a worker, so that a file's shared fixtures are made once). By
# itself it hands out the files with the most tests first, and these have few tests and the
# suite's longest fixtures and runs: the export and the matrix were handed out 220 s and 310 s
# into a run, and whether the workers then ended together was luck. So they go first, longest
# first, each to the first worker free, and what is handed out last is short; the rest follow by
# their number of tests as before. (The queue of files is reordered, never a worker's collection:
# the controller names a worker's tests by their place in it.) The CPU-seconds are what each took
# alone in a cpuacct cgroup on the project's two-core machine.
LONGEST_FILES = [
    "tests/test_eval.py",               # 91: the Done-when matrix
    "tests/test_export.py",             # 53: an export of the book, Chromium on its page
    "tests/security/test_results.py",   # 40: 123 tests, a sandboxed pytest each
    "tests/test_org_babel.py",          # 26: Emacs and kernels (45 s of wall time)
    "tests/test_acp.py",                # 26: an `mlplcode acp` process each
    "tests/test_tangle_parity.py",      # 16: Emacs tangles the book and the corpus
]


def longest_first(files):
    """FILES, in the order xdist would hand them out, in the order they are handed out:
    LONGEST_FILES first, in their order, then the others in the order given."""
    return sorted(files, key=lambda name: LONGEST_FILES.index(name) if name in LONGEST_FILES
                  else len(LONGEST_FILES))  # sorted keeps the order of equals


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With --dist loadfile, xdist's scheduler with its queue of files in longest_first's order."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        ordered = False

        def _assign_work_unit(self, node):
            # Called first when the queue holds every file (by number of tests, most first).
            if not self.ordered:
                self.workqueue = type(self.workqueue)(
                    (name, self.workqueue[name]) for name in longest_first(list(self.workqueue)))
                self.ordered = True
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
