"""Verification: DONE is a claim, the journal is the evidence, and the tests as they
were are the judge."""

import difflib
import fnmatch
import hashlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import replace

from .commands import PYTEST_PREFIXES, parse_command
from .journal import runs_directory, sync_journal, tests_problem
from .policy import test_configuration
from .tools.paths import ignore_rules, is_secret_name
from .tools.project import open_project
from .tools.read import COPY, EMPTY, OUT, copied_link, copy_tree
from .tools.run import counted
from .tools.write import write_atomically
from .trust import redact
from .verbs import execute

def succeeded(step, tools):
    """Whether STEP used one of TOOLS and its observation says it worked."""
    return step.action.get("tool") in tools and bool(
        step.observation and step.observation["ok"]
    )

def verify_done(state):
    """(True, "") when a file was edited and the last test run after the edit passed.

    Otherwise (False, reason): the model sees NOT VERIFIED and the reason,
    and the run goes on. A claim of success is not success.
    """
    edits = [
        n for n, step in enumerate(state.steps) if succeeded(step, ("write", "patch"))
    ]
    if not edits:
        return (
            False,
            "no file was edited; DONE needs an edit followed by a passing test run",
        )
    runs = [
        step.observation
        for step in state.steps[edits[-1] + 1 :]
        if step.action.get("tool") == "run"
        and step.observation
        and step.observation.get("kind") == "run"
    ]
    if not runs:
        return False, "no test run since the last edit; RUN the tests first"
    if not runs[-1].get("passed"):
        return (
            False,
            "the last test run did not pass; fix the failure and RUN the tests again",
        )
    return True, ""

TEST_MODULES = ("test_*.py", "*_test.py")
TEST_DIRECTORIES = ("test", "tests")


def decides_tests(path):
    """Whether the file at PATH (relative to the root, with /) decides what the tests
    check:
    pytest's configuration, a conftest.py or a root __init__.py, a test module, or
    anything in a test directory.
    """
    *directories, name = path.casefold().split("/")
    return (
        test_configuration(path)
        or any(fnmatch.fnmatchcase(name, pattern) for pattern in TEST_MODULES)
        or any(directory in TEST_DIRECTORIES for directory in directories)
    )

def test_module(path):
    """Whether PATH, one of the files that decide the tests, is a module of tests."""
    name = path.rsplit("/", 1)[-1].casefold()
    return name.endswith(".py") and name not in ("conftest.py", "__init__.py")

UNCOLLECTED = (
    "*.egg",
    ".*",
    "_darcs",
    "build",
    "CVS",
    "dist",
    "node_modules",
    "venv",
    "{arch}",
    "__pycache__",
)


def collected_directory(parent, name):
    """Whether pytest looks into the directory NAME in PARENT by default; secret
    directories aside."""
    path = os.path.join(parent, name)
    return not (
        any(fnmatch.fnmatchcase(name, pattern) for pattern in UNCOLLECTED)
        or is_secret_name(name)
        or os.path.islink(path)
        or os.path.isfile(os.path.join(path, "pyvenv.cfg"))
        or os.path.isfile(os.path.join(path, "conda-meta", "history"))
    )

def test_files(root):
    """The paths, relative to ROOT and sorted, of the files that decide the tests, where
    pytest looks."""
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [
            name for name in subdirectories if collected_directory(directory, name)
        ]
        for name in files:
            path = os.path.relpath(os.path.join(directory, name), root).replace(
                os.sep, "/"
            )
            if decides_tests(path) and not is_secret_name(name):
                found.append(path)
    return sorted(found)

KEPT_TEXT_BYTES = 4 * 1024 * 1024


def open_regular(path):
    """The regular file at PATH opened for reading in binary, or None for anything
    else."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    file = os.fdopen(descriptor, "rb")
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        file.close()
        return None
    return file

def file_state(root, path):
    """(entry, bytes) of the file at PATH in ROOT, or (None, None) when there is none.

    The entry is {"sha256": ...} for a regular file, whose bytes come with it unless
    there are more than KEPT_TEXT_BYTES of them, {"link": target} for a link, and
    {"other": why} for anything else.
    """
    full = os.path.join(root, path)
    if os.path.realpath(os.path.dirname(full)) != os.path.dirname(full):
        return {"other": "a directory on its path is a link"}, None
    if os.path.islink(full):
        return {"link": os.readlink(full)}, None
    if not os.path.lexists(full):
        return None, None
    file = open_regular(full)
    if file is None:
        return {"other": "not a regular file"}, None
    digest, parts, size = hashlib.sha256(), [], 0
    with file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
            size += len(chunk)
            if size <= KEPT_TEXT_BYTES:
                parts.append(chunk)
    return {"sha256": digest.hexdigest()}, (
        b"".join(parts) if size <= KEPT_TEXT_BYTES else None
    )

def writable_as_text(*texts):
    """Whether every one of TEXTS can be written as UTF-8: a name read from a file
    system may hold bytes that are not, kept by Python as lone surrogates."""
    try:
        for text in texts:
            text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True

def snapshot_tests(root):
    """The files under ROOT that decide the tests, as the start event records them:
    {path: entry}, with each file's "text" while the text kept stays within
    KEPT_TEXT_BYTES.
    """
    snapshot, kept = {}, 0
    for path in test_files(root):
        entry, data = file_state(root, path)
        if entry is None or not writable_as_text(path, *entry.values()):
            continue
        try:
            text = data.decode("utf-8") if data is not None else None
        except UnicodeDecodeError:
            text = None
        if text is not None and kept + len(data) <= KEPT_TEXT_BYTES:
            entry["text"], kept = text, kept + len(data)
        snapshot[path] = entry
    return snapshot

def tests_directory():
    """Where the records of the tests are kept: tests/ beside runs/."""
    return os.path.join(os.path.dirname(runs_directory()), "tests")


def keep_tests(record):
    """Keep RECORD, as snapshot_tests made it, under the SHA-256 of its text, unless it
    is kept already; return that digest."""
    text = json.dumps(record, ensure_ascii=False, sort_keys=True)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    directory = tests_directory()
    path = os.path.join(directory, f"{digest}.json")
    if not os.path.lexists(path):
        os.makedirs(directory, mode=0o700, exist_ok=True)
        real = os.path.realpath(directory)
        write_atomically(os.path.join(real, f"{digest}.json"), text, real, path)
        sync_journal(real)
    return digest

def kept_tests(digest):
    """The record kept under DIGEST, or None when none is, or what is there is not
    it."""
    file = open_regular(os.path.join(tests_directory(), f"{digest}.json"))
    if file is None:
        return None
    with file:
        data = file.read()
    if hashlib.sha256(data).hexdigest() != digest:
        return None
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and not tests_problem(record) else None


def tests_at_start(state):
    """The record of the tests as the run found them at its start, or None when this
    machine keeps none for it."""
    return kept_tests(state.tests) if state.tests else None

def allowed_changes(state):
    """The test files a person allowed the run to change, once it has changed code
    too."""
    return set(state.start.get("may_change", ())) if edited_code(state) else set()


def changed_files(state, root, start):
    """[(path, entry at the start, entry now, bytes now)] for each file deciding the
    tests that differs from START, the record, but those a person allowed to change."""
    allowed = allowed_changes(state)
    changed = []
    for path in sorted((set(start) | set(test_files(root))) - allowed):
        now, data = file_state(root, path)
        before = start.get(path)
        kept = before and {
            name: value for name, value in before.items() if name != "text"
        }
        if kept != now:
            changed.append((path, before, now, data))
    return changed

SELECTING_OPTIONS = ("-k", "-m", "--lf", "--last-failed")


def passed_tests(observation):
    """How many tests passed in a test run, by the plugin's count in its OBSERVATION; 0
    when the count is not there or was not believed."""
    return (observation.get("results") or {}).get("passed", 0)


def partial_run(step):
    """Why the test run of STEP is not evidence that the whole suite passed, or ""."""
    command = step.action["command"]
    _, argv, paths = parse_command(command)
    words = next(
        argv[len(prefix) :]
        for prefix in PYTEST_PREFIXES
        if argv[: len(prefix)] == prefix
    )
    if (
        {word.partition("=")[0] for word in words} & set(SELECTING_OPTIONS)
        or "::" in command
        or any(os.path.normpath(path) != "." for path in paths)
    ):
        return f"its last test run chose a part of the tests ({command})"
    if not passed_tests(step.observation):
        return f"its last test run counted no passed test ({command})"
    return ""

def printable_name(name):
    """NAME, from the file system, with any byte that is not UTF-8 written as an escape
    such as \\xff."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")

def touches(state, changed):
    """What the run did to what decides the tests, as phrases; empty when it did
    nothing."""
    words = [
        f"{'created' if before is None else 'deleted' if now is None else 'changed'}"
        f" {printable_name(path)}"
        for path, before, now, _ in changed
    ]
    paths = {path for path, _, _, _ in changed}
    written = sorted(
        {
            os.path.normpath(step.action["path"]).replace(os.sep, "/")
            for step in state.steps
            if succeeded(step, ("write", "patch"))
        }
        - paths
        - allowed_changes(state)
    )
    words += [f"wrote {path}" for path in written if decides_tests(path)]
    runs = [
        step
        for step in state.steps
        if step.action.get("tool") == "run"
        and step.observation
        and step.observation.get("kind") == "run"
    ]
    why = partial_run(runs[-1]) if runs else ""
    return words + [why] if why else words

DIFF_CAP_CHARS = 20000


def shown_lines(entry, data):
    """The lines of a file's side of the diff: its text, or what it is in words."""
    if entry is None:
        return []
    if "link" in entry:
        return [f"(a link to {printable_name(entry['link'])})\n"]
    if "other" in entry:
        return [f"({entry['other']})\n"]
    text = entry.get("text") if data is None else data.decode("utf-8", "replace")
    if text is None:
        return ["(not shown: not text, or more than the 4 MiB kept)\n"]
    return [
        line if line.endswith("\n") else line + "\n"
        for line in text.splitlines(keepends=True)
    ]

def tests_diff(changed, project):
    """The files in CHANGED as one unified diff from the start to now, hidden files
    named only, cut."""
    hidden, parts = ignore_rules(project, ".mlplcodeignore"), []
    for path, before, now, data in changed:
        shown = printable_name(path)
        if hidden.match_file(path):
            parts.append(
                f"{shown}: differs (excluded by .mlplcodeignore, so not shown)\n"
            )
            continue
        names = (
            f"{shown} (at the start)" if before else "/dev/null",
            f"{shown} (now)" if now else "/dev/null",
        )
        parts += difflib.unified_diff(
            shown_lines(before, None), shown_lines(now, data), *names
        )
    text = (
        redact("".join(parts), project.secret_values)
        or "(no file that decides the tests differs)\n"
    )
    if len(text) > DIFF_CAP_CHARS:
        text = (
            text[:DIFF_CAP_CHARS]
            + f"[... {len(text) - DIFF_CAP_CHARS} characters of the diff cut ...]\n"
        )
    return text

UNRECORDED = "this machine keeps no record of the tests as they were before this run"


def test_changes(state, project, changed=None):
    """What this run did to what decides the tests: {"touched": [phrases], "diff":
    text}."""
    if changed is None:
        start = tests_at_start(state)
        if start is None:
            return {"touched": [UNRECORDED], "diff": f"({UNRECORDED})\n"}
        changed = changed_files(state, project.root, start)
    return {"touched": touches(state, changed), "diff": tests_diff(changed, project)}

LEFT_OUT = (".git", "__pycache__", ".pytest_cache")


def treated_in_copy(relative):
    """How the copy of the tests treats the path RELATIVE: caches and .git left out,
    secrets emptied."""
    name = os.path.basename(relative)
    return OUT if name in LEFT_OUT else EMPTY if is_secret_name(name) else COPY


def copy_project(source, target):
    """Copy the project at SOURCE to the new directory TARGET, as a test run would see
    it."""
    copy_tree(source, target, treated_in_copy)

def remove(path):
    """Remove whatever is at PATH, if anything: a link, never what it leads to."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def real_directories(root, parts):
    """ROOT joined with PARTS, each directory on the way made a real one: a link or a
    file where one should be is removed first. Returns the last."""
    directory = root
    for part in parts:
        directory = os.path.join(directory, part)
        if os.path.islink(directory) or (
            os.path.lexists(directory) and not os.path.isdir(directory)
        ):
            remove(directory)
        if not os.path.lexists(directory):
            os.mkdir(directory)
    return directory

def put_back(source, copy, path, entry):
    """Make PATH in the scratch COPY of SOURCE what ENTRY recorded at the start; remove
    it when ENTRY is None."""
    real_directories(copy, path.split("/")[:-1])
    target = os.path.join(copy, path)
    remove(target)
    if entry is None:
        return
    if "link" in entry:
        os.symlink(copied_link(source, copy, path, entry["link"]), target)
    else:
        with open(target, "w", encoding="utf-8", newline="") as file:
            file.write(entry["text"])

def lost_files(changed):
    """The files in CHANGED whose content at the start was not kept, so they cannot be
    put back."""
    return [
        path
        for path, before, _, _ in changed
        if before and "text" not in before and "link" not in before
    ]

STARTING_COMMAND = "python -m pytest -q"


def run_starting_tests(project, changed):
    """Run the tests as they were at the start against the code as it is now; give the
    observation."""
    with tempfile.TemporaryDirectory(
        prefix="mlplcode-verify-", ignore_cleanup_errors=True
    ) as scratch:
        copy = os.path.join(scratch, os.path.basename(project.root))
        try:
            copy_project(project.root, copy)
            for path, before, _, _ in changed:
                put_back(project.root, copy, path, before)
        except OSError as error:
            return {
                "ok": False,
                "text": f"ERROR: the project could not be copied to run them ({error})",
            }
        copied = replace(open_project(copy), secret_values=project.secret_values)
        return execute({"tool": "run", "command": STARTING_COMMAND}, copied)

def passed_as_they_were(result):
    """Whether the run of the starting tests passed, a passed test among them."""
    return bool(result.get("passed")) and passed_tests(result) > 0

def failures(result):
    """The names of the starting tests that failed, or what happened when the record
    named none."""
    results = result.get("results") or {}
    names = results.get("failures", [])
    if names:
        more = results.get("failed", 0) + results.get("error", 0) - len(names)
        return ", ".join(names) + (f" and {more} more" if more > 0 else "")
    if "exit_code" not in result:
        return result["text"].removeprefix("ERROR: ").split(";")[0]
    return f"exit code {result['exit_code']}; {result['text'].splitlines()[1]}"

def edited_code(state):
    """Whether the run wrote or patched a file that does not decide the tests."""
    return any(
        succeeded(step, ("write", "patch")) and not decides_tests(step.action["path"])
        for step in state.steps
    )

def verify_tests(state, project):
    """(True, note, changes) when the tests as they were pass, or need no run; else
    (False, why, changes)."""
    start = tests_at_start(state)
    if start is None:
        return False, UNRECORDED, test_changes(state, project)
    changed = changed_files(state, project.root, start)
    changes = test_changes(state, project, changed)
    if not changes["touched"]:
        return True, allowed_note(state), changes
    done = ", ".join(changes["touched"])
    only_tests = (
        f"this run changed only what decides the tests ({done}), none of the code they"
        " test"
    )
    if not any(test_module(path) for path in start):
        if not edited_code(state):
            return False, only_tests, changes
        return True, "; there were no tests before this run", changes
    lost = lost_files(changed)
    if lost:
        return (
            False,
            (
                "the tests as they were before this run cannot be rebuilt"
                f" ({', '.join(lost)} changed, and was not kept at the start); this run"
                f" {done}"
            ),
            changes,
        )
    result = run_starting_tests(project, changed)
    if not passed_as_they_were(result):
        return (
            False,
            (
                f"the tests as they were before this run fail ({failures(result)});"
                f" this run {done}"
            ),
            changes,
        )
    if not edited_code(state):
        return False, only_tests, changes
    return (
        True,
        (
            f"; this run {done}, and the tests as they were before it pass"
            f" ({counted(result['results'])}){allowed_note(state)}"
        ),
        changes,
    )

def allowed_note(state):
    """The words of an accepted DONE for the test files a person allowed the run to
    change, or ""."""
    allowed = allowed_changes(state)
    if not allowed:
        return ""
    return f"; a person allowed this run to change {', '.join(sorted(allowed))}"
