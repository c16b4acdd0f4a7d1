"""How the project finds its secrets: names, key files by content, values in every format, the
repository's history, and the encoded forms redaction looks for; found once, reused when nothing
changed. The adversarial cases in cases.py drive the same code through the whole loop."""
import base64
import json
import os
import subprocess
import urllib.parse

import pytest

from mlplcode import trust
from mlplcode.cli import main
from mlplcode.tools import paths, project as project_module
from mlplcode.tools.project import after_action, find_secret_files, open_project, values_in

KEY = "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkey-material-0123456789abcdef\n-----END EC PRIVATE KEY-----\n"


def git(root, *arguments):
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@x", *arguments],
                   check=True, capture_output=True)


@pytest.mark.parametrize("glob, matched, missed", [
    ("*.{pem,key}", ["a.pem", "b.c.key"], ["a.pem.txt", "pem"]),
    ("id_{rsa,dsa}*", ["id_rsa", "id_dsa.pub"], ["my_id_rsa"]),
    ("*service?account*.json", ["ci-service-account.json", "serviceXaccount.json"], ["serviceaccount.json"]),
    (".env*", [".env", ".envrc", ".env.local"], ["x.env.local", "env"]),
])
def test_a_glob_matches_as_a_shell_matches_it(glob, matched, missed):
    pattern = paths.any_of([glob])
    assert [name for name in matched + missed if pattern.match(name)] == matched


@pytest.mark.parametrize("path, secret", [
    ("a/.docker/config.json", ".docker/config.json"), ("docker/config.json", None),
    ("home/.kube/config", ".kube/config"), (".config/gcloud/legacy/adc.json", ".config/gcloud"),
    ("deploy/PROD.ENV", "PROD.ENV"), ("lib/secrets.py", None), ("id_utils.py", None),
    ("certs/ca.P12.", "ca.P12."), ("src/environment.yml", None),
])
def test_a_path_is_judged_by_its_names_and_by_its_trailing_directories(path, secret):
    parts = path.split("/")
    found = [paths.secret_at(parts, index) for index in range(len(parts))]
    assert next(filter(None, found), None) == secret


def test_the_walk_finds_names_paths_and_keys_by_content_and_enters_no_secret_directory(tmp_path):
    files = {".env.local": "A=b\n", "svc/.docker/config.json": "{}", "deploy": KEY, "notes": "no key\n",
             "big": KEY + "x" * 20_000, "key.md": KEY, ".ssh/id_ed25519": "k\n", ".ssh/inner/deep": KEY,
             "src/app.py": "print()\n"}
    for relative, content in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(content)
    os.symlink(tmp_path / "deploy", tmp_path / "link")
    found = [os.path.relpath(path, tmp_path) for path in find_secret_files(str(tmp_path))]
    # A key too big to be one, or named with an extension, is left to redaction by its shape.
    assert found == [".env.local", ".ssh", "deploy", "svc/.docker/config.json"]


@pytest.mark.parametrize("text, value", [
    ("machine example.com login me password hunter2-netrc\n", "hunter2-netrc"),
    ("db.example.com:5432:app:me:pgpass-Secret9\n", "pgpass-Secret9"),
    ('{"auths": {"r.io": {"auth": "dXNlcjpwYXNzd29yZA=="}}}\n', "dXNlcjpwYXNzd29yZA=="),
    ("users:\n- user:\n    token: kube-token-77\n", "kube-token-77"),
    ("DATABASE_URL=postgres://me:url-pass-42@db/app\n", "url-pass-42"),
    ("admin:$apr1$salt$hashvalue\n", "$apr1$salt$hashvalue"),
    ("export API_TOKEN='quoted-token-1'\n", "quoted-token-1"),
])
def test_values_are_found_in_every_format_secret_files_come_in(text, value):
    assert value in values_in(text)


def test_ordinary_settings_and_comments_are_not_values():
    values = values_in("# the production database\nAPP_ENV=production\nDB_HOST=db.internal.example\n"
                       "PORT=5432\nSTARTED=2024-01-01\nPASSPHRASE=correct-horse-battery-staple-x\n")
    assert values == {"correct-horse-battery-staple-x"}


@pytest.mark.parametrize("prefix", ["", "x", "xy", "API_TOKEN="])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode])
def test_base64_of_any_text_holding_a_value_holds_one_of_its_forms(prefix, encode):
    value = "s3cret~~??>>token-1234"
    encoded = encode((prefix + value + "\nmore").encode()).decode()
    assert trust.redact(encoded, trust.secret_forms(frozenset({value}))) != encoded


@pytest.mark.parametrize("shown", [
    lambda value: value.encode().hex(), lambda value: value.encode().hex().upper(),
    lambda value: urllib.parse.quote(value, safe=""), lambda value: urllib.parse.quote_plus(value),
    lambda value: base64.encodebytes(b"-" * 100 + value.encode() + b"-" * 100).decode(),
])
def test_hex_percent_and_wrapped_base64_forms_are_redacted(shown):
    value = "p@ss w/rd:0123-secret"
    assert "[redacted]" in trust.redact(shown(value), trust.secret_forms(frozenset({value})))


def test_short_values_have_no_encoded_forms_and_ordinary_text_is_left_alone():
    assert trust.encoded_forms("abc1234") == set()
    forms = trust.secret_forms(frozenset({"Zx81kq0Pw2Lm4Nv7"}))
    text = "def add(a, b):\n    return a + b\n" * 50 + base64.b64encode(b"unrelated data" * 10).decode()
    assert trust.redact(text, forms) == text


def test_history_values_are_read_once_and_again_only_when_the_repository_changed(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / ".env").write_text("TOKEN=first-history-value-1\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "one")
    (tmp_path / ".env").unlink()
    opened = open_project(str(tmp_path))
    assert "first-history-value-1" in opened.history.values and opened.history.complete
    assert "first-history-value-1" in opened.secret_values
    again = after_action(opened, {"tool": "run", "command": "pytest"})
    assert again.history is opened.history
    (tmp_path / ".env").write_text("TOKEN=second-staged-value-2\n")
    git(tmp_path, "add", ".env")
    changed = after_action(again, {"tool": "run", "command": "pytest"})
    assert changed.history is not opened.history
    assert {"first-history-value-1", "second-staged-value-2"} <= changed.history.values


def test_a_project_outside_any_repository_has_no_history(tmp_path):
    assert open_project(str(tmp_path)).history == project_module.NO_HISTORY


def test_a_history_cut_at_its_deadline_is_said_when_the_run_starts(tmp_path, monkeypatch, capsys):
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "one")
    monkeypatch.setattr(project_module, "HISTORY_SECONDS", 1e-6)
    assert not open_project(str(tmp_path)).history.complete
    script = tmp_path.parent / "script.json"
    script.write_text(json.dumps(["DONE nothing"]))
    main(["run", "t", "--root", str(tmp_path), "--model", f"scripted:{script}", "--budget", "1"])
    assert "secrets: git history read for the newest commits only" in capsys.readouterr().out


@pytest.mark.parametrize("char", ["\u3164", "\u115f", "\u1160", "\uffa0", "\u034f", "\u17b4", "\u180b",
                                  "\ufe0f", "\U000e0100", "\U000e0041", "\u200b", "\u2060", "\ufeff"])
def test_default_ignorable_characters_are_invisible(char):
    assert trust.is_invisible(char) and trust.visible(f"a{char}b") == f"a\\{'U' if ord(char) > 0xffff else 'u'}" \
        + f"{ord(char):0{8 if ord(char) > 0xffff else 4}x}b"


@pytest.mark.parametrize("text, shown", [
    ("[[elisp:(kill-emacs)]]", "[[elisp\\x3a(kill-emacs)]]"),
    ("[[shell: rm -rf x]]", "[[shell\\x3a rm -rf x]]"),
    ("<eshell:ls>", "<eshell\\x3als>"),
    ("see file+sys:/bin/sh now", "see file+sys\\x3a/bin/sh now"),
    ("# Local " "Variables:\n# eval: (x)\n# End:", "# Local Variables\\x3a\n# eval: (x)\n# End:"),
    ("Shell: bash, man: page, elisp is a lisp", "Shell: bash, man: page, elisp is a lisp"),
    ("human:x, https://x.org", "human:x, https://x.org"),
])
def test_what_emacs_would_act_on_loses_its_colon_and_nothing_else_does(text, shown):
    assert trust.visible(text) == shown
    assert trust.visible(shown) == shown  # made visible twice is made visible once


def test_among_many_values_each_one_in_the_text_is_still_found():
    values = frozenset(f"value-{n:04d}-Zx81kq" for n in range(500))
    text = "a value-0042-Zx81kq, its hex " + "value-0499-Zx81kq".encode().hex() + " and value-9999-Zx81kq"
    assert trust.redact(text, trust.secret_forms(values)) == "a [redacted], its hex [redacted] and value-9999-Zx81kq"


def test_the_walk_survives_a_tree_deeper_than_python_recursion(tmp_path):
    deep = tmp_path
    for _ in range(1200):  # one by one, and taken down so too: pathlib, makedirs and rmtree recurse
        deep = deep / "d"
        deep.mkdir()
    (deep / ".env").write_text("TOKEN=deep-down-value-1\n")
    try:
        assert [path[-5:] for path in find_secret_files(str(tmp_path))] == ["/.env"]
    finally:
        (deep / ".env").unlink()
        while deep != tmp_path:
            deep.rmdir()
            deep = deep.parent


def test_old_secret_files_are_read_newest_first_up_to_the_budget(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")
    for n in range(3):
        (tmp_path / ".env").write_text(f"TOKEN=version-{n}-of-the-value\n" + "#" * 1000 + "\n")
        git(tmp_path, "add", "-A")
        git(tmp_path, "commit", "-qm", f"version {n}")
    monkeypatch.setattr(project_module, "SECRET_TEXT_BYTES", 2500)
    history = open_project(str(tmp_path)).history
    assert history.values == {"version-2-of-the-value", "version-1-of-the-value"}
    assert not history.complete
