"""Tests for trust.py: visible escapes, redaction, the child's environment and the sandbox's argv."""
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
    argv = trust.sandbox_argv("/usr/bin/bwrap", ["pytest"], root, [f"{root}/.git"],
                              [f"{root}/.env"], empty)
    joined = " ".join(argv)
    assert joined.index("--tmpfs /tmp") < joined.index(f"--bind {root} {root}")
    assert joined.index(f"--bind {root} {root}") < joined.index(f"--ro-bind {root}/.git")
    assert f"--ro-bind {empty} {root}/.env" in joined
    assert "--unshare-all" in argv and "--die-with-parent" in argv and "--share-net" not in argv
    assert argv[-2:] == ["--", "pytest"]


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
