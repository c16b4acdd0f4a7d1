"""Tests for the tools: each tool's success and failure, confinement, bounds and RUN's processes."""

import hashlib
import hmac
import json
import os
import signal
import stat
import subprocess
import time

import pytest

from conftest import require_tool

import re

import sys

from mlplcode import commands, trust
from mlplcode.tools import PathRefused, paths, read, run as run_module, search, write
from mlplcode.tools import project as project_module
from mlplcode.tools.project import open_project
from mlplcode.verbs import execute, fingerprint


@pytest.fixture
def project(tmp_path):
    """A project root with one file, next to a file outside it that no tool may touch."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "hello.txt").write_text("one\ntwo\nthree\n")
    (tmp_path / "outside.txt").write_text("outside secret\n")
    return root


def act(root, tool, **fields):
    """Execute one action in root, written as keyword fields."""
    return execute({"tool": tool, **fields}, open_project(root))


def without(program, monkeypatch):
    """Make the project find no PROGRAM on this machine, as where it is not installed."""
    real = trust.find_program
    monkeypatch.setattr(project_module, "find_program",
                        lambda name, root: None if name == program else real(name, root))


def assert_error(result, *fragments):
    """Check that an observation is a failure whose text holds every fragment."""
    assert result["ok"] is False
    assert result["text"].startswith("ERROR: ")
    for fragment in fragments:
        assert fragment in result["text"]


# --- execute ---------------------------------------------------------------

def test_unknown_tool_is_an_error(project):
    assert_error(act(project, "delete", path="hello.txt"), "unknown tool 'delete'", "read")


def test_missing_field_is_an_error(project):
    assert_error(act(project, "write", path="a.txt"), "write needs", "content")


# --- confinement -------------------------------------------------------------

DENIED_PATHS = [
    "../outside.txt",
    ".env",
    ".ENV",
    ".env.local",
    "config/.env.production",
    ".git/config",
    "id_rsa",
    ".ssh/id_ed25519",
    "certs/server.pem",
    "tls.key",
    "store.p12",
    ".npmrc",
    "credentials-prod.json",
    "deploy/secrets.yaml",
    "vault/.ENV/notes.txt",
    "private/notes.txt",  # excluded by .mlplcodeignore
]


@pytest.fixture
def guarded(project):
    """The project with a real file at every denied path, so refusals cannot be 'file missing'."""
    for relative in DENIED_PATHS[1:]:
        path = project / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("TOP SECRET\n")
    (project / ".mlplcodeignore").write_text("private/\n")
    return project


@pytest.mark.parametrize("path", DENIED_PATHS)
def test_read_refuses_denied_paths(guarded, path):
    result = act(guarded, "read", path=path)
    assert_error(result, path)
    assert "SECRET" not in result["text"]


@pytest.mark.parametrize("path", DENIED_PATHS)
def test_write_and_patch_refuse_denied_paths(guarded, path):
    target = guarded / path
    assert_error(act(guarded, "write", path=path, content="pwned\n"), path)
    assert_error(act(guarded, "patch", path=path, old="SECRET", new="pwned"), path)
    assert "pwned" not in target.read_text()


def test_absolute_path_is_refused_even_inside_the_root(project, tmp_path):
    refusal = "absolute paths are refused"
    assert_error(act(project, "read", path=str(tmp_path / "outside.txt")), refusal)
    assert_error(act(project, "write", path=str(tmp_path / "outside.txt"), content="x"), refusal)
    assert_error(act(project, "read", path=str(project / "hello.txt")), refusal)
    assert (tmp_path / "outside.txt").read_text() == "outside secret\n"


@pytest.mark.parametrize("path", ["", "a\0b"])
def test_empty_and_nul_paths_are_refused(project, path):
    assert_error(act(project, "read", path=path), "not a usable path")


def test_symlink_pointing_outside_is_refused(project, tmp_path):
    os.symlink(tmp_path / "outside.txt", project / "link.txt")
    os.symlink(tmp_path, project / "linkdir")
    assert_error(act(project, "read", path="link.txt"), "leaves the project root")
    assert_error(act(project, "write", path="link.txt", content="x"), "leaves the project root")
    assert_error(act(project, "write", path="linkdir/new.txt", content="x"), "leaves the project")
    assert (tmp_path / "outside.txt").read_text() == "outside secret\n"
    assert not (tmp_path / "new.txt").exists()


def test_symlink_pointing_inside_is_allowed(project):
    os.symlink(project / "hello.txt", project / "alias.txt")
    shown = act(project, "read", path="alias.txt")["text"]
    assert shown == "alias.txt (3 lines)\none\ntwo\nthree\n"
    os.mkdir(project / "src")
    os.symlink(project / "src", project / "lib")
    assert act(project, "write", path="lib/hello.txt", content="new\n")["ok"] is True
    assert (project / "src" / "hello.txt").read_text() == "new\n"
    assert os.path.islink(project / "lib")


def test_a_write_through_a_link_must_keep_the_name(project):
    # The approval warns by name and the policy's category comes from the name: a link
    # notes.txt -> conftest.py would have the person approve a note.
    (project / "conftest.py").write_text("")
    os.symlink(project / "conftest.py", project / "notes.txt")
    assert_error(act(project, "write", path="notes.txt", content="import os\n"),
                 "leads to conftest.py; write it by its own name")
    assert (project / "conftest.py").read_text() == ""


def test_symlink_to_a_secret_is_refused_by_its_target_name(project):
    (project / ".env").write_text("KEY=1\n")
    os.symlink(project / ".env", project / "harmless.txt")
    assert_error(act(project, "read", path="harmless.txt"), "secrets")


def test_resolve_path_gives_the_real_path_or_raises(project):
    assert paths.resolve_path(open_project(project), "sub/../hello.txt") == str(project / "hello.txt")
    with pytest.raises(PathRefused, match="leaves the project root"):
        paths.resolve_path(open_project(project), "sub/../../x")


def test_mlplcodeignore_can_be_read_but_not_changed(project):
    (project / ".mlplcodeignore").write_text("*.secret\n")
    assert act(project, "read", path=".mlplcodeignore")["ok"] is True
    assert_error(act(project, "write", path=".mlplcodeignore", content=""), "may not change")
    assert_error(act(project, "patch", path=".mlplcodeignore", old="*", new=""), "may not change")
    assert (project / ".mlplcodeignore").read_text() == "*.secret\n"


def test_unparsable_mlplcodeignore_fails_closed(project):
    (project / ".mlplcodeignore").write_bytes(b"\xff\xfe*.txt\n")
    assert_error(act(project, "read", path="hello.txt"), ".mlplcodeignore", "cannot be parsed")


# --- READ --------------------------------------------------------------------

def test_read_shows_header_and_content(project):
    result = act(project, "read", path="hello.txt")
    assert result == {"ok": True, "text": "hello.txt (3 lines)\none\ntwo\nthree\n"}


def test_read_counts_a_last_line_without_newline(project):
    (project / "short.txt").write_text("a\nb")
    assert act(project, "read", path="short.txt")["text"] == "short.txt (2 lines)\na\nb"


def test_read_missing_file_is_an_error(project):
    assert_error(act(project, "read", path="nope.txt"), "nope.txt", "no such file", "SEARCH")


def test_read_directory_is_an_error(project):
    (project / "src").mkdir()
    assert_error(act(project, "read", path="src"), "not a regular file")


@pytest.mark.parametrize("data", [b"PNG\x00\x01\x02text", "caf\u00e9".encode("latin-1")])
def test_read_refuses_binary_and_non_utf8(project, data):
    (project / "blob.bin").write_bytes(data)
    assert_error(act(project, "read", path="blob.bin"), "binary or not UTF-8")


def test_read_refuses_oversize_file_saying_size_and_cap(project):
    (project / "big.txt").write_text("x" * (read.READ_CAP_BYTES + 1))
    assert_error(act(project, "read", path="big.txt"),
                 f"{read.READ_CAP_BYTES + 1} bytes", f"cap of {read.READ_CAP_BYTES} bytes")


# --- SEARCH ------------------------------------------------------------------

@pytest.fixture(params=["python", "ripgrep"])
def backend(request, monkeypatch):
    """Run a search test once with each backend; the ripgrep half needs rg on PATH."""
    if request.param == "ripgrep":
        require_tool("rg", "SEARCH with ripgrep")
    if request.param == "python":
        without("rg", monkeypatch)
    return request.param


def test_search_finds_literal_text(project, backend):
    (project / "src").mkdir()
    (project / "src" / "calc.py").write_text("x = f(a.b)\ny = f(aXb)\n")
    result = act(project, "search", query="f(a.b)")
    assert result == {"ok": True, "text": "src/calc.py:1: x = f(a.b)"}


def test_search_is_case_sensitive(project, backend):
    assert act(project, "search", query="TWO")["text"] == "no matches for 'TWO'"
    assert act(project, "search", query="two")["text"] == "hello.txt:2: two"


def test_search_without_matches_is_ok(project, backend):
    assert act(project, "search", query="zebra") == {"ok": True, "text": "no matches for 'zebra'"}


@pytest.mark.parametrize("query", ["", "two\nthree"])
def test_search_refuses_empty_or_multiline_query(project, query):
    assert_error(act(project, "search", query=query), "one line")


def test_search_hides_ignored_secret_git_and_binary_files(project, backend):
    files = {
        ".gitignore": "*.log\nbuild/\n!keep.log\n",
        ".mlplcodeignore": "private/\n",
        "app.log": "needle", "keep.log": "needle", "build/out.txt": "needle",
        ".env": "needle in a secret", "sub/.env.local": "needle in a secret",
        ".git/config": "needle", "id_rsa": "needle in a secret", "private/plan.txt": "needle",
        "shown.txt": "needle",
    }
    for relative, text in files.items():
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_text(text)
    (project / "image.bin").write_bytes(b"needle\x00\x01")
    os.symlink(project.parent / "outside.txt", project / "link.txt")
    (project.parent / "outside.txt").write_text("needle\n")
    found = act(project, "search", query="needle")["text"]
    assert found == "keep.log:1: needle\nshown.txt:1: needle"


def test_search_caps_matches_and_cuts_long_lines(project, backend):
    (project / "many.txt").write_text("hit " + "y" * 300 + "\n" + "hit\n" * 59)
    lines = act(project, "search", query="hit")["text"].split("\n")
    assert len(lines) == search.SEARCH_MAX_MATCHES + 1
    assert lines[0] == "many.txt:1: " + ("hit " + "y" * 300)[:200]
    assert lines[-1] == "[... 10 more matches in 1 file(s) cut; narrow the query]"


def test_search_stops_after_the_file_cap(project, backend):
    for number in range(search.SEARCH_MAX_FILES + 5):
        (project / f"f{number:03}.txt").write_text("hit\n")
    lines = act(project, "search", query="hit")["text"].split("\n")
    assert lines[0] == "f000.txt:1: hit"
    assert lines[-1] == ("[... 150 more matches in 150 file(s) cut; more files match after the"
                         " first 200; narrow the query]")


@pytest.mark.parametrize("text", ["", "ab", "ab\n", "\nab", "ab\nab\n\nxabx", "aba\n\n\nb\r\n",
                                  "\n\n", "a\nb", "abab\nbab"])
@pytest.mark.parametrize("query", ["a", "b", "ab", "ba", "\r", "x"])
def test_lines_matching_is_every_line_holding_the_query(text, query):
    by_line = [search.Match("f", number, line)
               for number, line in enumerate(text.split("\n"), start=1) if query in line]
    assert list(search.lines_matching("f", text, query)) == by_line


def test_search_backends_agree(project, monkeypatch):
    require_tool("rg", "SEARCH with ripgrep")
    files = {
        "a/x.txt": "hit one\n", "a.txt": "hit\nno\nhit two\n", "a-b.txt": "hit",
        "B.txt": "hit", "_u.txt": "hit", "crlf.txt": "hit\r\nhit again\r\n",
        "bom.txt": "\ufeffhit first\n", "late_nul.txt": "x\n" * 5000 + "hit\0\n",
        ".gitignore": "*.log\n/top-only.txt\n", "deep/top-only.txt": "hit", "top-only.txt": "hit",
        "z.log": "hit", "long.txt": "hit" + "z" * 500, "\u00e9t\u00e9.txt": "hit \u00e9",
    }
    for relative, text in files.items():
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_bytes(text.encode("utf-8"))
    (project / "latin1.txt").write_bytes("hit caf\u00e9".encode("latin-1"))
    for number in range(search.SEARCH_MAX_FILES + 3):
        (project / "many" / f"{number}.txt").parent.mkdir(exist_ok=True)
        (project / "many" / f"{number}.txt").write_text("hit\n" if number % 2 else "miss\n")
    for query in ["hit", "hit again", "\u00e9", "one", "absent", "-e"]:
        with_ripgrep = act(project, "search", query=query)
        without("rg", monkeypatch)
        with_python = act(project, "search", query=query)
        monkeypatch.undo()
        assert with_ripgrep == with_python, query


def test_search_backends_agree_at_the_depth_bound(project, monkeypatch):
    require_tool("rg", "SEARCH with ripgrep")
    monkeypatch.setattr(search, "SEARCH_MAX_DEPTH", 3)
    for depth in range(1, 6):
        (project / ("d/" * depth)).mkdir(parents=True, exist_ok=True)
        (project / ("d/" * depth) / "f.txt").write_text("deep\n")
    with_ripgrep = act(project, "search", query="deep")["text"]
    without("rg", monkeypatch)
    assert act(project, "search", query="deep")["text"] == with_ripgrep
    assert with_ripgrep == "d/d/f.txt:1: deep\nd/f.txt:1: deep"


def test_search_stops_at_its_deadline_and_says_so(project, backend, monkeypatch):
    monkeypatch.setattr(search, "SEARCH_SECONDS", 0)
    lines = act(project, "search", query="two")["text"].split("\n")
    assert lines[-1] == "[... the search stopped after 0 s; narrow the query]"
    assert lines[:-1] in ([], ["hello.txt:2: two"])  # ripgrep may answer before it is killed


def test_search_skips_what_read_refuses(project, backend, tmp_path):
    os.mkfifo(project / "pipe.txt")
    os.link(tmp_path / "outside.txt", project / "linked.txt")
    (project / "big.txt").write_text("outside\n" * 40_000)
    assert act(project, "search", query="outside")["text"] == "no matches for 'outside'"


# --- special files, hard links, caps ----------------------------------------------

def test_tools_refuse_files_that_are_not_regular(project, tmp_path):
    os.mkfifo(project / "pipe")
    os.link(tmp_path / "outside.txt", project / "twin.txt")
    assert_error(act(project, "read", path="pipe"), "is a FIFO, not a regular file")
    assert_error(act(project, "write", path="pipe", content="x"), "is a FIFO")
    assert_error(act(project, "read", path="twin.txt"), "has 2 hard links")
    assert_error(act(project, "write", path="twin.txt", content="x"), "has 2 hard links")
    assert (tmp_path / "outside.txt").read_text() == "outside secret\n"


def test_read_refuses_a_file_swapped_after_the_check(project, tmp_path, monkeypatch):
    real_open = os.open

    def swap_then_open(path, flags, *args, **keywords):
        if path == "hello.txt":  # the file itself, opened in its directory
            os.unlink(project / "hello.txt")
            os.symlink(tmp_path / "outside.txt", project / "hello.txt")
        return real_open(path, flags, *args, **keywords)

    monkeypatch.setattr(os, "open", swap_then_open)
    assert_error(act(project, "read", path="hello.txt"), "changed while it was being opened")


def test_write_and_patch_refuse_content_over_the_cap(project):
    big = "x" * (write.WRITE_CAP_BYTES + 1)
    assert_error(act(project, "write", path="big.txt", content=big), "over the write cap")
    assert_error(act(project, "patch", path="hello.txt", old="two", new=big), "over the write cap")
    assert not (project / "big.txt").exists()


@pytest.mark.parametrize("path, refusal", [
    ("C:\\x.txt", "absolute paths are refused"), ("\\\\server\\share", "absolute paths are refused"),
    ("a\\b.txt", "holds a backslash"), ("a" * 1025, "longer than 1024 characters"),
    ("hello\u202e.txt", "control or invisible"), ("hel\x1blo.txt", "control or invisible"),
])
def test_spelling_problems_are_refused(project, path, refusal):
    assert_error(act(project, "read", path=path), refusal)


def test_a_denial_of_the_spelling_wins_over_an_allowed_target(project):
    os.symlink(project / "hello.txt", project / ".env")
    assert_error(act(project, "read", path=".env"), "may hold secrets")


def test_the_agent_s_own_files_cannot_be_written(project):
    assert_error(act(project, "write", path=".mlplcode/policy.json", content="{}"), "agent's own")
    assert_error(act(project, "write", path=".MLPLCODEIGNORE", content=""), "agent's own")
    assert not (project / ".mlplcode").exists()


def test_fingerprint_changes_with_the_target(project, tmp_path):
    action = {"tool": "write", "path": "hello.txt", "content": "x"}
    before = fingerprint(action, open_project(project))
    assert before["path"] == "hello.txt" and before["link"] is False and before["links"] == 1
    assert fingerprint(action, open_project(project)) == before
    (project / "hello.txt").write_text("one\ntwo\nthree!\n")
    assert fingerprint(action, open_project(project)) != before
    fresh = {"tool": "write", "path": "new.txt", "content": "x"}
    assert fingerprint(fresh, open_project(project)) == {"path": "new.txt", "link": False,
                                                      "exists": False}


def test_observations_are_redacted(project, monkeypatch):
    monkeypatch.setenv("SERVICE_TOKEN", "tok-0123456789")
    (project / "notes.txt").write_text("tok-0123456789 and AKIAABCDEFGHIJKLMNOP\n")
    assert act(project, "read", path="notes.txt")["text"] == (
        "notes.txt (1 lines)\n[redacted] and [redacted]\n")


# --- WRITE -------------------------------------------------------------------

def test_write_creates_file_and_parents_with_mode_0644(project):
    result = act(project, "write", path="pkg/sub/mod.py", content="a = 1\nb = 2\n")
    assert result == {"ok": True, "text": "wrote pkg/sub/mod.py (2 lines)"}
    assert (project / "pkg/sub/mod.py").read_text() == "a = 1\nb = 2\n"
    assert stat.S_IMODE(os.stat(project / "pkg/sub/mod.py").st_mode) == 0o644


def test_write_replaces_content_and_keeps_mode(project):
    script = project / "run.sh"
    script.write_text("old\n")
    script.chmod(0o750)
    assert act(project, "write", path="run.sh", content="new\n")["ok"] is True
    assert script.read_text() == "new\n"
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o750


def test_write_of_unencodable_text_is_an_error_and_leaves_nothing(project):
    assert_error(act(project, "write", path="bad.txt", content="half \ud800"), "write failed")
    assert sorted(os.listdir(project)) == ["hello.txt"]


def test_write_refuses_a_directory(project):
    (project / "src").mkdir()
    assert_error(act(project, "write", path="src", content="x"), "is a directory")


@pytest.mark.parametrize("crash_in", ["fsync", "replace"])
def test_write_crash_leaves_old_content_and_no_temp_file(project, monkeypatch, crash_in):
    def crash(*args, **keywords):
        """Fail the way a full disk or a lost device would."""
        raise OSError("disk on fire")

    monkeypatch.setattr(os, crash_in, crash)
    result = act(project, "write", path="hello.txt", content="half")
    monkeypatch.undo()
    assert_error(result, "disk on fire")
    assert (project / "hello.txt").read_text() == "one\ntwo\nthree\n"
    assert sorted(os.listdir(project)) == ["hello.txt"]


# --- PATCH -------------------------------------------------------------------

def test_patch_replaces_the_one_occurrence(project):
    result = act(project, "patch", path="hello.txt", old="two\nthree\n", new="2\n3\n")
    assert result == {"ok": True, "text": "patched hello.txt: replaced lines 2-3"}
    assert (project / "hello.txt").read_text() == "one\n2\n3\n"


def test_patch_missing_old_shows_the_closest_lines(project):
    (project / "code.py").write_text("def f():\n    return 1\n\ndef g():\n    return 2\n")
    result = act(project, "patch", path="code.py", old="def g():\n  return 2\n", new="x")
    assert_error(result, "OLD was not found in code.py", "    4 | def g():\n    5 |     return 2")
    assert (project / "code.py").read_text().startswith("def f():")


def test_patch_ambiguous_old_says_how_often_and_where(project):
    (project / "code.py").write_text("x = 1\ny\nx = 1\nz\nx = 1\n")
    result = act(project, "patch", path="code.py", old="x = 1", new="x = 2")
    assert_error(result, "OLD occurs 3 times in code.py, at lines 1, 3, 5")
    assert (project / "code.py").read_text() == "x = 1\ny\nx = 1\nz\nx = 1\n"


def test_patch_counts_overlapping_occurrences_as_ambiguous(project):
    (project / "row.txt").write_text("aaa\n")
    assert_error(act(project, "patch", path="row.txt", old="aa", new="b"), "OLD occurs 2 times")
    assert (project / "row.txt").read_text() == "aaa\n"


def test_patch_refuses_empty_old_and_missing_file(project):
    assert_error(act(project, "patch", path="hello.txt", old="", new="x"), "OLD is empty")
    assert_error(act(project, "patch", path="nope.py", old="a", new="b"), "no such file")


# --- RUN ---------------------------------------------------------------------

@pytest.mark.parametrize("command, kind", [
    ("pytest -q tests", "run"),
    ("python -m pytest -x", "run"),
    ("python3 -m pytest", "run"),
    ("pytest -k 'a and b' --maxfail=2 --tb short tests/test_x.py::test_a", "run"),
    ("git status --short", "git"),
    ("git diff HEAD", "git"),
    ("git diff --stat HEAD~1..HEAD -- src", "git"),
    ("git commit -m x", "shell"),
    ("pytest && rm -rf /", "shell"),
    ("pytest | tee log", "shell"),
    ("pytest ; ls", "shell"),
    ("pytest > out.txt", "shell"),
    ("pytest -q 2>&1", "shell"),
    ("pytest $(cat args)", "shell"),
    ("python script.py", "shell"),
    ("ls", "shell"),
    ("", "shell"),
    ("pytest 'unclosed", "shell"),
])
def test_classify_command(command, kind):
    assert commands.classify_command(command) == kind


@pytest.mark.parametrize("command, refusal", [
    ("pytest --junitxml=/tmp/x.xml", "option --junitxml is not allowed"),
    ("pytest --junit-x=/tmp/x.xml", "option --junit-x is not allowed"),
    ("pytest -p evil", "option -p is not allowed"),
    ("python -m pytest --basetemp=/tmp", "option --basetemp is not allowed"),
    ("pytest -c /etc/passwd", "option -c is not allowed"),
    ("pytest --rootdir=/", "option --rootdir is not allowed"),
    ("pytest --pastebin=all", "option --pastebin is not allowed"),
    ("pytest --pdb", "option --pdb is not allowed"),
    ("pytest -qx", "option -qx is not allowed"),
    ("pytest --maxfail=lots", "'lots' is not a value --maxfail accepts"),
    ("pytest --maxfail", "option --maxfail needs a value"),
    ("pytest -k --junitxml=x", "is not a value -k accepts"),
    ("pytest -q=1", "option -q takes no value"),
    ("git diff --output=../x", "option --output is not allowed"),
    ("git diff --no-index /etc/passwd x", "option --no-index is not allowed"),
    ("git diff --ext-diff", "option --ext-diff is not allowed"),
    ("git -c core.pager=sh status", "not an allowed program"),
    ("git -C / status", "not an allowed program"),
    ("git --git-dir=/x status", "not an allowed program"),
    ("git log -p", "not an allowed program"),
    ("git status -v", "option -v is not allowed"),
    ("pytest && ls", "holds shell syntax"),
    ("pytest 'a", "cannot be split"),
])
def test_parse_command_refuses_with_the_reason(command, refusal):
    with pytest.raises(commands.CommandRefused, match=refusal):
        commands.parse_command(command)


def test_parse_command_gives_the_path_operands():
    assert commands.parse_command("python -m pytest -k 'a and b' -q t/x.py::test_a ../y") == (
        "run", ["python", "-m", "pytest", "-k", "a and b", "-q", "t/x.py::test_a", "../y"],
        ["t/x.py", "../y"])
    assert commands.parse_command("git diff HEAD~2 src -- HEAD.txt")[2] == ["src", "HEAD.txt"]


PROGRAMS = {"python": "/trusted/python", "git": "/trusted/git"}
HARDENED = ["--no-pager", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
            "-c", "protocol.allow=never", "-c", "log.showSignature=false",
            "-c", "core.untrackedCache=false"]


def test_program_argv_starts_the_trusted_programs_by_their_paths():
    assert commands.program_argv("run", ["python3", "-m", "pytest", "-q"], [], PROGRAMS) == [
        "/trusted/python", "-P", "-m", "pytest", "-p", "mlplcode_results", "-q"]
    assert commands.program_argv("run", ["pytest", "-x"], [], PROGRAMS) == [
        "/trusted/python", "-P", "-m", "pytest", "-p", "mlplcode_results", "-x"]


def test_program_argv_hardens_git_and_keeps_it_to_the_root():
    assert commands.program_argv("git", ["git", "diff"], [], PROGRAMS) == [
        "/trusted/git", *HARDENED, "diff", "--no-ext-diff", "--no-textconv", "--relative", "--", "."]
    assert commands.program_argv("git", ["git", "status", "-s"], [], PROGRAMS) == [
        "/trusted/git", *HARDENED, "status", "-s", "--", "."]
    assert commands.program_argv("git", ["git", "diff", "HEAD", "--"], [], PROGRAMS)[-2:] == ["--", "."]
    assert commands.program_argv("git", ["git", "diff", "--", "calc.py"], ["calc.py"], PROGRAMS)[-2:] == [
        "--", "calc.py"]


def test_run_refuses_a_shell_command(project):
    result = act(project, "run", command="pytest && rm hello.txt")
    assert_error(result, "holds shell syntax")
    assert (project / "hello.txt").exists()


def test_run_refuses_a_path_operand_outside_the_root(project):
    assert_error(act(project, "run", command="pytest ../outside.txt"), "leaves the project root")
    assert_error(act(project, "run", command="git diff -- .env"), "may hold secrets")


@pytest.fixture(params=["sandboxed", "unsandboxed"])
def mode(request, monkeypatch):
    """Run a RUN test once in bubblewrap's sandbox (bwrap needed) and once without it."""
    if request.param == "sandboxed":
        require_tool("bwrap", "RUN inside bubblewrap")
    else:
        without("bwrap", monkeypatch)
    return request.param


def write_test(root, body):
    """Put a test module into the project for RUN to run."""
    (root / "test_it.py").write_text("import os, subprocess, sys, time\n\n" + body)


def test_run_pytest_pass(project, mode):
    write_test(project, "def test_ok():\n    assert True\n")
    result = act(project, "run", command="pytest -q")
    assert result["ok"] is True and result["kind"] == "run"
    assert result["exit_code"] == 0 and result["passed"] is True
    assert result["sandboxed"] is (mode == "sandboxed")
    assert result["text"].startswith(f"exit code 0 ({mode})\nresults: 1 passed\n")
    assert result["results"] == {"failed": 0, "passed": 1, "skipped": 0, "xfailed": 0, "xpassed": 0,
                                 "error": 0, "unreported": 0, "failures": []}


def test_run_pytest_failure(project, mode):
    write_test(project, "def test_bad():\n    assert 1 == 2\n")
    result = act(project, "run", command="python3 -m pytest -q")
    assert result["exit_code"] == 1 and result["passed"] is False
    assert result["text"].startswith(f"exit code 1 ({mode})\nresults: 1 failed\n")
    assert result["results"]["failures"] == ["test_it.py::test_bad"]


def test_the_plugin_counts_every_outcome_as_pytest_does(project, mode):
    write_test(project, "import pytest, unittest\n\n\n@pytest.fixture\ndef broken():\n    raise OSError\n\n\n"
               "def test_ok():\n    pass\n\n\ndef test_error(broken):\n    pass\n\n\n"
               "@pytest.mark.skip\ndef test_skip():\n    pass\n\n\n@pytest.mark.xfail\ndef test_xfail():\n"
               "    assert False\n\n\n@pytest.mark.xfail\ndef test_xpass():\n    pass\n\n\n"
               "class Case(unittest.TestCase):\n    def test_fails(self):\n        self.fail()\n")
    (project / "test_broken.py").write_text("import nowhere\n")
    result = act(project, "run", command="pytest -q test_it.py")
    assert result["text"].splitlines()[1] == (
        "results: 1 failed, 1 passed, 1 skipped, 1 xfailed, 1 xpassed, 1 error")
    assert result["results"]["failures"] == ["test_it.py::test_error", "test_it.py::Case::test_fails"]
    broken = act(project, "run", command="pytest -q")
    said = broken["text"].splitlines()[1]  # the collection error ended the session before a test ran
    assert broken["passed"] is False and re.fullmatch(
        r"results: 1 error, \d+ never ran; pytest stopped before the end", said), said
    assert broken["results"]["failures"] == ["test_broken.py"]


def test_a_configuration_that_asks_for_xdist_workers_runs_the_tests_here(project, mode):
    """The plugin counts only the tests of its own process: -n in addopts is set back to none."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed: -n NOT checked")
    write_test(project, "def test_ok():\n    assert True\n")
    (project / "pytest.ini").write_text("[pytest]\naddopts = -n 2\n")
    result = act(project, "run", command="pytest -q test_it.py")
    assert result["passed"] is True and result["text"].splitlines()[1] == "results: 1 passed"
    assert "bringing up nodes" not in result["text"]


CANARIES = [["function", "test_it.py", "failed"], ["unittest", "test_it.py", "failed"],
            ["collector", "test_it.py", "failed"]]
RECORD = {"finished": True, "counts": {"passed": 2}, "failures": [], "canaries": CANARIES}


def test_a_record_is_judged_by_its_counts_and_its_canaries():
    judge = run_module.judge_results
    assert judge(0, RECORD, []) == {"passed": True, "line": "results: 2 passed", "results": {
        "failed": 0, "passed": 2, "skipped": 0, "xfailed": 0, "xpassed": 0, "error": 0, "unreported": 0,
        "failures": []}}
    assert judge(1, RECORD, [])["passed"] is False  # an exit status that is not 0 is no pass either
    assert judge(0, {**RECORD, "finished": False}, [])["passed"] is False
    assert judge(0, {**RECORD, "counts": {"passed": 1, "unreported": 1}}, [])["line"] == (
        "results: 1 passed, 1 never ran")
    assert judge(0, {**RECORD, "counts": {}}, []) == {"passed": False, "line": "results: no tests ran",
                                                       "results": {**judge(0, RECORD, [])["results"], "passed": 0}}
    assert judge(0, {**RECORD, "counts": {"failed": 1}, "failures": ["t.py::secret-value-123"]},
                 ["secret-value-123"])["results"]["failures"] == ["t.py::[redacted]"]
    for canaries, said in [([["function", "", "passed"], ["collector", "", "failed"]], "function passed"),
                           ([*CANARIES[:1], ["unittest", "tests/test_b.py", "skipped"], *CANARIES[2:]],
                            "unittest in tests/test_b.py skipped"),
                           (CANARIES[:1], "collector never ran"),
                           ([*CANARIES, ["unittest", "tests/test_b.py", "not collected"]],
                            "unittest in tests/test_b.py not collected"),
                           ([], "function never ran, collector never ran")]:
        canary = "canaries" if "," in said else "canary"
        assert judge(0, {**RECORD, "canaries": canaries}, []) == {"passed": False, "results": None, "line": (
            f"results: none (the {canary} {said}: pytest was rewired)")}
    unfinished = judge(0, {**RECORD, "finished": False, "canaries": []}, [])  # stopped before they ran
    assert unfinished["line"] == "results: 2 passed; pytest stopped before the end" and not unfinished["passed"]


def test_a_record_is_read_only_when_its_tag_is_this_runs(tmp_path):
    key, payload = b"k" * 32, json.dumps(RECORD).encode()
    tag = hmac.new(key, payload, hashlib.sha256).hexdigest().encode()

    def read(data):
        path = tmp_path / "record"
        path.write_bytes(data)
        descriptor = os.open(path, os.O_RDONLY)
        try:
            return run_module.read_record(descriptor, key)
        finally:
            os.close(descriptor)

    assert read(tag + b" " + payload + b"\n") == RECORD
    assert read(b"") == run_module.NO_RECORD
    for forged in (b"0" * 64 + b" " + payload + b"\n",                          # no key
                   hmac.new(b"o" * 32, payload, hashlib.sha256).hexdigest().encode() + b" " + payload + b"\n",
                   tag + b" " + payload + b"\n" + tag + b" " + payload + b"\n",  # two records
                   b"1 passed\n" + tag + b" " + payload + b"\n",                 # a line before it
                   tag + b" " + payload):                                        # cut short
        assert read(forged) == run_module.NOT_SIGNED
    for odd in ({**RECORD, "counts": {"passed": "2"}}, {**RECORD, "canaries": [["function", "failed"]]},
                {**RECORD, "finished": 1}, [RECORD], "[" * 100000, "{not json"):
        odd = (odd if isinstance(odd, str) else json.dumps(odd)).encode()
        assert read(hmac.new(key, odd, hashlib.sha256).hexdigest().encode() + b" " + odd + b"\n") == (
            run_module.NOT_SIGNED)


def test_a_pytest_module_in_the_root_cannot_stand_in_for_pytest(project, mode):
    (project / "pytest.py").write_text("print('SHADOW PYTEST RAN')\n")
    write_test(project, "def test_ok():\n    assert True\n")
    result = act(project, "run", command="python -m pytest -q test_it.py")
    assert "SHADOW" not in result["text"] and result["passed"] is True


def test_run_timeout_kills_every_process(project, mode, monkeypatch):
    monkeypatch.setattr(run_module, "RUN_TIMEOUT_SECONDS", 2)
    marker = f"mlplcode-hang-{os.getpid()}"
    write_test(project, "def test_hang():\n"
               f"    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', '{marker}'])\n"
               "    time.sleep(60)\n")
    started = time.monotonic()
    result = act(project, "run", command="pytest -q")
    assert_error(result, f"timed out after 2 s and was killed ({mode})")
    assert time.monotonic() - started < 6
    assert wait_until_gone(marker) == []


def test_an_interrupt_while_the_program_starts_kills_it(project, mode, monkeypatch):
    # The stop as subprocess.Popen returns, the moment in which the process was once lost.
    marker = f"mlplcode-started-{mode}-{os.getpid()}"
    opened, real_popen = open_project(project), subprocess.Popen

    def popen_then_interrupt(*args, **options):
        process = real_popen(*args, **options)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # a handler that raises does so here, inside, as in Popen's wait for the exec
        return process
    monkeypatch.setattr(subprocess, "Popen", popen_then_interrupt)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_module.run_process([sys.executable, "-c", "import time; time.sleep(60)", marker],
                                   opened, [], [], {})
    finally:
        signal.signal(signal.SIGINT, previous)
    assert wait_until_gone(marker) == []


def test_signals_held_are_handed_on_at_release():
    came = []
    previous = signal.signal(signal.SIGUSR1, lambda number, frame: came.append(number))
    try:
        held = run_module.SignalsHeld()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert came == []
        held.release()
        assert came == [signal.SIGUSR1]
        os.kill(os.getpid(), signal.SIGUSR1)  # its handler is back
        assert came == [signal.SIGUSR1, signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_signals_held_gives_every_handler_back_when_one_raises_as_they_are_held(monkeypatch):
    def mine(number, frame):
        pass
    previous = {number: signal.signal(number, mine) for number in (signal.SIGUSR1, signal.SIGUSR2)}
    real_signal, calls = signal.signal, []

    def signal_then_interrupt(number, handler):
        calls.append(number)
        if len(calls) == 2:  # the first is held; another's handler raises before it is
            raise KeyboardInterrupt
        return real_signal(number, handler)
    try:
        before = {number: signal.getsignal(number) for number in signal.valid_signals()}
        monkeypatch.setattr(signal, "signal", signal_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            run_module.SignalsHeld()
        monkeypatch.undo()
        assert {number: signal.getsignal(number) for number in signal.valid_signals()} == before
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def test_the_sandbox_stays_in_the_group_that_is_killed(project):
    require_tool("bwrap", "RUN inside bubblewrap")
    write_test(project, "def test_group():\n    print('GROUP', os.getpgid(0), os.getsid(0))\n")
    # 0: the leaders lie outside the sandbox's PID namespace, in the group run_process kills.
    assert "GROUP 0 0" in act(project, "run", command="pytest -q -s")["text"]


def processes_with(marker):
    """The pids of running processes whose command line holds marker (zombies excepted)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if marker.encode() in cmdline.read() and process_is_running(pid):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def wait_until_gone(marker, seconds=3):
    """Give killed processes a moment to die; the pids still running with marker after that."""
    deadline = time.monotonic() + seconds
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return processes_with(marker)


def process_is_running(pid):
    """Say whether pid is alive; a zombie has exited and only waits to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            state = stat_file.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_show_output_keeps_head_and_tail_and_counts_the_bytes_cut(project):
    output = run_module.Output(head=b"h" * 4000, tail=b"t" * 4000, total=8100)
    assert run_module.show_output(output, str(project)) == (
        "h" * 4000 + "\n[... 100 bytes cut ...]\n" + "t" * 4000)
    assert run_module.show_output(run_module.Output(b"short", b"", 5), str(project)) == "short"


def test_run_output_is_capped(project, mode):
    write_test(project, "def test_loud():\n"
               "    print('START' + 'x' * 20_000_000 + 'END')\n")
    text = act(project, "run", command="pytest -q -s")["text"]
    assert "START" in text and "passed" in text
    assert "bytes cut ...]" in text
    assert len(text) < 8200


def test_run_git_status_in_a_real_repository(project, mode):
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    result = act(project, "run", command="git status --short")
    assert result == {"ok": True, "text": f"exit code 0 ({mode})\n?? hello.txt\n", "exit_code": 0,
                      "kind": "git", "sandboxed": mode == "sandboxed"}


def test_run_git_outside_a_repository_reports_the_exit_code(project):
    result = act(project, "run", command="git diff HEAD")
    assert result["ok"] is True and result["kind"] == "git"
    assert result["exit_code"] != 0 and "passed" not in result


def test_run_git_refuses_a_repository_whose_settings_run_programs(project, mode, tmp_path):
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    marker = tmp_path / "filter-ran"
    subprocess.run(["git", "-C", str(project), "config", "filter.evil.clean",
                    f"touch {marker}; cat"], check=True)
    (project / ".gitattributes").write_text("*.txt filter=evil\n")
    assert_error(act(project, "run", command="git status"), "filter.evil.clean")
    assert_error(act(project, "run", command="git diff"), "filter.evil.clean")
    assert not marker.exists()


def test_run_child_sees_only_the_allowed_environment(project, mode, monkeypatch):
    monkeypatch.setenv("FAKE_SERVICE_TOKEN", "planted-token-123")
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:terminal")
    monkeypatch.setenv("LANG", "C.UTF-8")
    write_test(project, "def test_env():\n    print(sorted(os.environ))\n"
               "    print('HOME', os.environ['HOME'], os.listdir(os.environ['HOME']))\n")
    text = act(project, "run", command="pytest -q -s")["text"]
    assert "'LANG'" in text and "'PATH'" in text and "'GIT_CONFIG_NOSYSTEM'" in text
    assert "FAKE_SERVICE_TOKEN" not in text and "PYTEST_ADDOPTS" not in text
    assert "planted-token-123" not in text
    home = re.search(r"^HOME (\S+) \[(.*)\]", text, re.MULTILINE)
    assert home.group(1) != os.path.expanduser("~")


def test_the_childs_path_keeps_no_entry_inside_the_root(project, monkeypatch):
    monkeypatch.setenv("PATH", f".:{project}/bin:/usr/bin")
    assert trust.child_environment(str(project), "/tmp")["PATH"] == "/usr/bin"


@pytest.mark.parametrize("name, secret", [
    ("OPENAI_API_KEY", True), ("anthropic_api_key", True), ("AWS_SECRET_ACCESS_KEY", True),
    ("GITHUB_TOKEN", True), ("DB_PASSWORD", True), ("MY_SECRET", True),
    ("X_API_KEY_2", True), ("PGPASSWORD", True), ("PATH", False), ("HOME", False),
    ("KEYBOARD", False),
])
def test_is_secret_variable(name, secret):
    assert trust.is_secret_variable(name) is secret


def test_check_action_gives_the_tools_refusal_and_leaves_an_error_of_the_system_to_the_tool(project, monkeypatch):
    import dataclasses

    from mlplcode import verbs

    opened = open_project(project)
    assert verbs.check_action({"tool": "read", "path": "../outside.txt"}, opened).startswith("ERROR: ")
    assert verbs.check_action({"tool": "read", "path": "hello.txt"}, opened) is None

    def failing(action, project):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setitem(verbs.VERB_OF_TOOL, "read", dataclasses.replace(verbs.VERB_OF_TOOL["read"], check=failing))
    assert verbs.check_action({"tool": "read", "path": "hello.txt"}, opened) is None
