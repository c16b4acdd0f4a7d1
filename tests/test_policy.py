import json

import pytest

from mlplcode.policy import (DEFAULT_POLICY, always, authorize, category, load_policy,
                             preview, terminal_decider)

READ = {"tool": "read", "path": "calc.py"}
SEARCH = {"tool": "search", "query": "def add"}
WRITE = {"tool": "write", "path": "calc.py", "content": "x = 1\n"}
PATCH = {"tool": "patch", "path": "calc.py", "old": "a\n", "new": "b\n"}
PYTEST = {"tool": "run", "command": "pytest -q"}
PY_PYTEST = {"tool": "run", "command": "python -m pytest -q"}
GIT_STATUS = {"tool": "run", "command": "git status"}
GIT_DIFF = {"tool": "run", "command": "git diff"}
SHELL = {"tool": "run", "command": "rm -rf /"}
DONE = {"tool": "done", "summary": "finished"}


@pytest.mark.parametrize("action, expected", [
    (READ, "allow"), (SEARCH, "allow"), (WRITE, "ask"), (PATCH, "ask"),
    (PYTEST, "allow"), (PY_PYTEST, "allow"), (GIT_STATUS, "ask"), (GIT_DIFF, "ask"),
    (SHELL, "deny"), (DONE, "allow"),
])
def test_default_policy_row_by_row(action, expected):
    assert authorize(action, DEFAULT_POLICY) == expected


@pytest.mark.parametrize("action, expected", [
    (READ, "read"), (SEARCH, "search"), (WRITE, "write"), (PATCH, "write"),
    (PYTEST, "run"), (GIT_DIFF, "git"), (SHELL, "shell"),
    ({"tool": "run", "command": "git push"}, "shell"),
    ({"tool": "run", "command": "pytest -q && rm -rf /"}, "shell"),
])
def test_category(action, expected):
    assert category(action) == expected


def test_policy_values_are_used():
    policy = {**DEFAULT_POLICY, "write": "allow", "read": "deny", "git": "allow"}
    assert authorize(WRITE, policy) == "allow"
    assert authorize(READ, policy) == "deny"
    assert authorize(GIT_STATUS, policy) == "allow"


def test_shell_is_denied_even_when_the_policy_allows_it():
    assert authorize(SHELL, {**DEFAULT_POLICY, "shell": "allow"}) == "deny"


def test_load_policy_overrides_the_default(tmp_path):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"write": "allow"}))
    assert load_policy(str(path)) == {**DEFAULT_POLICY, "write": "allow"}


@pytest.mark.parametrize("text, message", [
    ('{"wrte": "allow"}', "unknown category 'wrte'"),
    ('{"write": "yes"}', "'yes' is not one of allow, ask, deny"),
    ('["write"]', "a policy is an object"),
    ("{write: allow}", "not JSON"),
])
def test_load_policy_refuses_mistakes(tmp_path, text, message):
    path = tmp_path / "policy.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_policy(str(path))


@pytest.mark.parametrize("answer, approved", [
    ("y", True), ("yes", True), (" YES ", True), ("n", False), ("", False), ("sure", False),
])
def test_terminal_decider_accepts_only_y_or_yes(answer, approved):
    shown = []
    decide = terminal_decider(ask=lambda prompt: answer if prompt.startswith("approve") else "",
                              show=shown.append)
    assert decide(WRITE) == (approved, "")
    assert shown == ["WRITE calc.py\nx = 1\nEND"]


def test_after_a_no_the_terminal_asks_for_a_reason():
    answers, asked = iter(["n", "  use PATCH  "]), []
    decide = terminal_decider(ask=lambda prompt: asked.append(prompt) or next(answers), show=lambda text: None)
    assert decide(WRITE) == (False, "use PATCH")
    assert asked == ["approve? [y/N] ", "reason for the model (empty: end the run): "]


def test_at_a_done_the_terminal_asks_whether_to_accept_it_and_a_no_does_not_end_the_run():
    answers, asked = iter(["n", ""]), []
    decide = terminal_decider(ask=lambda prompt: asked.append(prompt) or next(answers), show=lambda text: None)
    assert decide({"tool": "done", "summary": "fixed"}) == (False, "")
    assert asked == ["accept this DONE although the tests as they were fail? [y/N] ",
                     "reason for the model (empty: none; the run goes on): "]


def test_terminal_decider_says_no_at_end_of_input():
    def closed(prompt):
        raise EOFError
    assert terminal_decider(ask=closed, show=lambda text: None)(WRITE) == (False, "")


def test_preview_shows_a_patch_as_a_diff():
    text = preview(PATCH)
    assert text.splitlines()[0] == "PATCH calc.py"
    assert "-a" in text.splitlines() and "+b" in text.splitlines()


def test_always():
    assert always(True)(WRITE) == (True, "")
    assert always(False)(WRITE) == (False, "")


@pytest.mark.parametrize("path", ["conftest.py", "tests/conftest.py", "pytest.ini", "pyproject.toml",
                                  "setup.cfg", "tox.ini", "PYTEST.INI", "pytest.toml", ".pytest.toml",
                                  ".pytest.ini", "__init__.py", "./__init__.py", "sub/../__init__.py"])
def test_preview_flags_test_configuration_as_code(path):
    shown = preview({"tool": "write", "path": path, "content": "x\n"})
    assert shown.splitlines()[0].startswith("WARNING: ")
    assert "is code that RUN executes" in shown.splitlines()[0]


@pytest.mark.parametrize("path", ["calc.py", "pkg/__init__.py"])
def test_preview_of_an_ordinary_file_has_no_warning(path):
    assert preview({**WRITE, "path": path}) == f"WRITE {path}\nx = 1\nEND"


def test_preview_shows_the_argv_that_runs():
    shown = preview(GIT_DIFF).splitlines()
    assert shown[0] == ("runs: git --no-pager -c core.fsmonitor=false -c core.hooksPath=/dev/null"
                        " -c protocol.allow=never -c log.showSignature=false -c core.untrackedCache=false"
                        " diff --no-ext-diff --no-textconv --relative -- .")
    assert shown[1] == "in: the project root"


def test_preview_escapes_and_never_cuts():
    content = "\x1b[2J" + "line\n" * 50_000
    shown = preview({"tool": "write", "path": "a.txt", "content": content})
    assert "\x1b" not in shown and shown.startswith("WRITE a.txt\n\\x1b[2J")
    assert shown.count("line\n") == 50_000


@pytest.mark.parametrize("command", ["pytest --junitxml=x", "git diff --output=x", "pytest -p evil"])
def test_options_off_the_allow_list_are_denied_before_any_ask(command):
    assert authorize({"tool": "run", "command": command}, {**DEFAULT_POLICY, "run": "ask"}) == "deny"
