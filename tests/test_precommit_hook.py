"""The book-code check as a pre-commit hook (.pre-commit-hooks.yaml), run by pre-commit itself.

The hook repository is a local clone of this tree with the working .pre-commit-hooks.yaml and
tangle/tangle.py committed in it, so the files under test are the ones on disk. The scratch
repositories are made in tmp_path; PRE_COMMIT_HOME is in tmp_path too, and pip and git are
pointed at nowhere, so a hook that needed to install anything would fail here.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TANGLER = ROOT / "tangle" / "tangle.py"

BOOK = """#+TITLE: A scratch book

* Code
#+begin_src python :tangle pkg/mod.py :mkdirp yes
def answer():
    return 42
#+end_src
"""


@pytest.fixture(scope="module")
def pre_commit():
    try:
        import pre_commit  # noqa: F401
    except ImportError:
        if os.environ.get("MLPLCODE_REQUIRE_TOOLS") == "1":
            pytest.fail("pre-commit is not installed (pip install -e '.[test]')")
        pytest.skip("pre-commit is not installed: the hook is NOT checked")
    return [sys.executable, "-m", "pre_commit"]


def git(directory, *args):
    return subprocess.run(["git", "-C", str(directory), "-c", "user.name=t",
                           "-c", "user.email=t@example.invalid", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def offline(tmp_path):
    """An environment in which nothing can be fetched: no index for pip, a dead proxy."""
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "cache"), PIP_NO_INDEX="1",
               http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
               GIT_CONFIG_NOSYSTEM="1", HOME=str(tmp_path / "home"))
    env.pop("PYTHONPATH", None)
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory):
    """A clone of this repository whose last commit holds the working hook and tangler (and
    nothing else: the index of a clone without checkout is empty)."""
    clone = tmp_path_factory.mktemp("hook") / "mlplcode"
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(clone)], check=True)
    (clone / "tangle").mkdir()
    for name in (".pre-commit-hooks.yaml", "tangle/tangle.py"):
        shutil.copy2(ROOT / name, clone / name)
    git(clone, "add", ".pre-commit-hooks.yaml", "tangle/tangle.py")
    git(clone, "commit", "-q", "--allow-empty", "-m", "the hook under test")
    return clone, git(clone, "rev-parse", "HEAD")


def scratch(tmp_path, books):
    """A git repository holding BOOKS ({org path: text}), tangled and committed."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q")
    for name, text in books.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
        subprocess.run([sys.executable, str(TANGLER), str(repo / name)], check=True,
                       capture_output=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "books and code")
    return repo


def config(repo, hook_repo, args):
    clone, rev = hook_repo
    hooks = "{id: tangle-check" + (f", args: {args}" if args else "") + "}"
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {clone}\n  rev: {rev}\n  hooks: [{hooks}]\n")
    git(repo, "add", ".pre-commit-config.yaml")
    git(repo, "commit", "-q", "-m", "the hook")


def run(command, repo, tmp_path, *args):
    return subprocess.run([*command, *args], cwd=repo, env=offline(tmp_path),
                          capture_output=True, text=True, timeout=300)


def test_try_repo_passes_then_fails_with_the_diff(pre_commit, hook_repo, tmp_path):
    repo = scratch(tmp_path, {"mlplcode.org": BOOK})
    clone, rev = hook_repo
    ok = run(pre_commit, repo, tmp_path, "try-repo", str(clone), "tangle-check", "--ref", rev,
             "--all-files")
    assert ok.returncode == 0 and "Passed" in ok.stdout, ok.stdout + ok.stderr
    (repo / "pkg" / "mod.py").write_text("def answer():\n    return 41\n")
    bad = run(pre_commit, repo, tmp_path, "try-repo", str(clone), "tangle-check", "--ref", rev,
              "--all-files")
    assert bad.returncode == 1 and "Failed" in bad.stdout, bad.stdout + bad.stderr
    assert "-    return 41" in bad.stdout and "+    return 42" in bad.stdout
    assert "mlplcode.org:6" in bad.stdout
    # language: script: no environment was installed for the hook.
    assert not list((tmp_path / "cache").glob("repo*/py_env-*"))


def test_a_config_names_its_books(pre_commit, hook_repo, tmp_path):
    other = BOOK.replace("pkg/mod.py", "lib/other.py").replace("42", "43")
    repo = scratch(tmp_path, {"docs/book.org": BOOK, "other.org": other})
    config(repo, hook_repo, "[docs/book.org, other.org]")
    ok = run(pre_commit, repo, tmp_path, "run", "--all-files")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # The book changed and the code did not: that fails too, and names the book's line.
    (repo / "other.org").write_text(other.replace("43", "44"))
    bad = run(pre_commit, repo, tmp_path, "run", "--all-files")
    assert bad.returncode == 1 and "other.org:6" in bad.stdout, bad.stdout + bad.stderr
    assert "docs/book.org: 1 file, all match the book" in bad.stdout


def test_the_hook_stops_a_commit(pre_commit, hook_repo, tmp_path):
    repo = scratch(tmp_path, {"mlplcode.org": BOOK})
    config(repo, hook_repo, None)
    installed = run(pre_commit, repo, tmp_path, "install")
    assert installed.returncode == 0, installed.stderr
    (repo / "pkg" / "mod.py").write_text("def answer():\n    return 0\n")
    git(repo, "add", "-A")
    commit = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid",
                             "commit", "-m", "code only"], cwd=repo, env=offline(tmp_path),
                            capture_output=True, text=True, timeout=300)
    assert commit.returncode != 0, commit.stdout + commit.stderr
    assert "1 problem" in commit.stdout + commit.stderr
    assert git(repo, "rev-list", "--count", "HEAD") == "2"


def test_without_args_it_checks_mlplcode_org_and_says_when_there_is_none(
        pre_commit, hook_repo, tmp_path):
    repo = scratch(tmp_path, {"book.org": BOOK})
    config(repo, hook_repo, None)
    result = run(pre_commit, repo, tmp_path, "run", "--all-files")
    assert result.returncode != 0 and "mlplcode.org: no such file" in result.stdout, (
        result.stdout + result.stderr)
