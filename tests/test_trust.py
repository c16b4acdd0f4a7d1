"""Tests for trust.py: visible escapes, redaction, the child's environment and the sandbox's argv."""
import os
import subprocess
import sys

import pytest

from conftest import require_tool
from mlplcode import trust


@pytest.mark.parametrize("text, shown", [
    ("plain\ttext\n", "plain\ttext\n"),
    ("\x1b[2J", "\\x1b[2J"),
    ("\x1b]8;;http://x\x07", "\\x1b]8;;http://x\\x07"),
    ("a\rb", "a\\x0db"),
    ("\x9b31m", "\\x9b31m"),
    ("calc\u202e.py", "calc\\u202e.py"),
    ("\u2066x\u2069", "\\u2066x\\u2069"),
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("line\u2028sep", "line\\u2028sep"),
    ("tag\U000e0041", "tag\\U000e0041"),
    ("caf\u00e9 \u4e2d", "caf\u00e9 \u4e2d"),
])
def test_visible_escapes_what_a_terminal_would_obey(text, shown):
    assert trust.visible(text) == shown


@pytest.mark.parametrize("text, redacted", [
    ("key AKIAABCDEFGHIJKLMNOP here", "key [redacted] here"),
    ("ghp_" + "a1" * 18, "[redacted]"),
    ("sk-" + "x" * 30, "[redacted]"),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\nafter",
     "[redacted]\nafter"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIE cut", "[redacted]"),
    ("API_TOKEN=Zx81kq0Pw2Lm4Nv7Rt9", "API_TOKEN=[redacted]"),
    ("password: 'hunter2hunter2hunter2x'", "password: '[redacted]'"),
    ('token = os.environ["TOKEN"]', 'token = os.environ["TOKEN"]'),
    ("def get_api_key(settings):", "def get_api_key(settings):"),
])
def test_redact_finds_secret_shapes_and_spares_code(text, redacted):
    assert trust.redact(text) == redacted


def test_redact_removes_known_values_longest_first():
    assert trust.redact("a secret-long and secret", {"secret", "secret-long"}) == (
        "a [redacted] and [redacted]")


def test_environment_secrets_are_the_long_values_of_secret_names(monkeypatch):
    monkeypatch.setenv("SOME_API_KEY", "value-123456")
    monkeypatch.setenv("SHORT_TOKEN", "abc")
    monkeypatch.setenv("EDITOR", "value-not-secret")
    secrets = trust.environment_secrets()
    assert "value-123456" in secrets
    assert "abc" not in secrets and "value-not-secret" not in secrets


def test_child_environment_is_an_allow_list(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    monkeypatch.setenv("PYTHONPATH", "/x")
    monkeypatch.setenv("LANG", "C.UTF-8")
    environment = trust.child_environment(str(tmp_path), "/fresh")
    assert sorted(environment) == sorted(["LANG", "PATH", "HOME", "TMPDIR", *trust.GIT_SAFETY])
    assert environment["HOME"] == environment["TMPDIR"] == "/fresh"


def test_limit_resources_sets_the_three_limits(monkeypatch):
    monkeypatch.setattr(trust, "RUN_FILE_BYTES", 4096)
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_FSIZE))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=trust.limit_resources).stdout
    assert out.strip() == "(4096, 4096)"


def test_sandbox_argv_layers_mounts_in_order(tmp_path):
    root, empty = str(tmp_path / "root"), str(tmp_path / "empty")
    argv = trust.sandbox_argv("/usr/bin/bwrap", ["pytest"], root, ["/opt/python"], [f"{root}/.git"],
                              [f"{root}/.env"], empty, 7)
    joined = " ".join(argv)
    assert joined.index("--ro-bind /usr /usr") < joined.index("--proc /proc")
    assert joined.index("--proc /proc") < joined.index("--ro-bind /proc/sys /proc/sys")
    assert joined.index("--tmpfs /tmp") < joined.index("--ro-bind /opt/python /opt/python")
    assert joined.index("--ro-bind /opt/python") < joined.index(f"--bind {root} {root}")
    assert joined.index(f"--bind {root} {root}") < joined.index(f"--ro-bind {root}/.git")
    assert f"--ro-bind {empty} {root}/.env" in joined
    assert joined.index(f"--ro-bind {empty} {root}/.env") < joined.index("--seccomp 7")
    assert argv[-2:] == ["--", "pytest"]


def test_sandbox_argv_shows_only_what_tests_need():
    argv = trust.sandbox_argv("/usr/bin/bwrap", ["pytest"], "/p", [], [], [], "/empty", None)
    sources = {argv[index + 1] for index, word in enumerate(argv) if word in ("--ro-bind", "--bind")}
    assert "/" not in sources
    for hidden in ("/run", "/var", "/home", "/root", "/tmp", "/srv", "/mnt", "/opt", "/media"):
        assert hidden not in sources
    if os.path.exists("/etc/shadow"):  # only its owner may read it: the sandbox gets an empty one
        assert "--ro-bind /empty /etc/shadow" in " ".join(argv)


def test_sandbox_argv_drops_every_privilege():
    argv = trust.sandbox_argv("/usr/bin/bwrap", ["pytest"], "/p", [], [], [], "/empty", None)
    flags = " ".join(argv[argv.index("--unshare-all"):])
    assert flags.startswith("--unshare-all --unshare-user --disable-userns --uid 65534 --gid 65534"
                            " --cap-drop ALL --die-with-parent")
    assert "--share-net" not in argv
    # A session of the sandbox's own would be a process group that run_process's kill misses.
    assert "--new-session" not in argv


def test_child_environment_never_passes_pytest_or_python_variables(monkeypatch, tmp_path):
    for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME",
                 "GIT_DIR", "GIT_CONFIG_PARAMETERS", "GIT_EXTERNAL_DIFF"):
        monkeypatch.setenv(name, "-p evil")
    environment = trust.child_environment(str(tmp_path), "/fresh")
    assert not [name for name in environment if name.startswith(("PYTEST", "PYTHON"))]
    assert "GIT_DIR" not in environment and "GIT_CONFIG_PARAMETERS" not in environment
    assert environment["GIT_NO_LAZY_FETCH"] == "1" and environment["GIT_ATTR_NOSYSTEM"] == "1"


def test_bubblewrap_runs_here_when_required():
    require_tool("bwrap", "the sandbox")
    result = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent",
                             "true"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_sandbox_banner_names_the_mode():
    assert trust.sandbox_banner(None).startswith("unsandboxed")
    assert trust.sandbox_banner("/usr/bin/bwrap").startswith("sandboxed by bubblewrap")


def test_find_program_ignores_a_program_inside_the_root(monkeypatch, tmp_path):
    fake = tmp_path / "bin" / "bwrap"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(fake.parent))
    assert trust.find_program("bwrap", str(tmp_path)) is None
    assert trust.find_program("bwrap", str(tmp_path / "elsewhere")) == str(fake)


def test_find_python_refuses_an_interpreter_inside_the_root(monkeypatch, tmp_path):
    venv = tmp_path / "project" / ".venv"
    (venv / "bin").mkdir(parents=True)
    monkeypatch.setattr(trust.sys, "prefix", str(venv))
    assert trust.find_python(str(tmp_path / "project")) is None
    assert trust.find_python(str(tmp_path / "elsewhere")) == sys.executable


def test_find_program_skips_empty_relative_and_project_entries(monkeypatch, tmp_path):
    root = tmp_path / "project"
    for directory in (root / ".venv" / "bin", root / "node_modules" / ".bin", root):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "rg").write_text("#!/bin/sh\n")
        (directory / "rg").chmod(0o755)
    monkeypatch.chdir(root)
    monkeypatch.setenv("PATH", f"{root}/.venv/bin:{root}/node_modules/.bin::.:bin")
    assert trust.find_program("rg", str(root)) is None


def test_holds_invisible_finds_what_is_invisible_finds_char_by_char():
    for code in [*range(0x250), *range(0x2000, 0x2070), 0x3000, 0x3164, 0xfeff, 0xe0041, 0x1f600]:
        char = chr(code)
        assert trust.holds_invisible(f"a/{char}/b") == trust.is_invisible(char), hex(code)
    assert not trust.holds_invisible("src/tests/test_calc.py") and trust.holds_invisible("a\u202eb")
