"""Parity of tangle/tangle.py with Emacs's org-babel-tangle (Org 9.5.5 on Debian 12).

Corpus (tests/tangle/corpus/):

* accept/*.org -- every feature the tangler supports.  Each file is tangled by
  our tangler and by batch Emacs in two fresh directories; both must succeed
  and leave byte-identical trees with identical file modes (our hash database
  `.FILE.org.tangle.json` is ignored).
* refuse/*.org -- one refusal each.  Line 1 is `# refuse: LINE: TEXT`: our
  tangler must exit 1, name `FILE.org:LINE:` and TEXT on stderr, and write
  nothing.
* edge/*.org -- corner cases found while probing.  Our tangler must either
  refuse cleanly (as above, any line) or write exactly what Emacs writes; when
  Emacs fails on a file, we must refuse it.

A file whose second line starts with `# known mismatch:` (edge) or
`# known issue:` (refuse) documents a bug in tangle.py that is not fixed yet;
its test is a strict xfail, so it turns red as soon as the bug is fixed and the
line should then be removed.

Emacs runs once per org file.  The corpus files are tangled by a few batch
Emacs processes, 40 files each (`org-babel-tangle-file` on each file, in its
own directory); test_batched_emacs_matches_the_plain_command checks on two
files that this gives the same trees as the plain per-file command line.  Our
tangler is run on the corpus the same way, by one Python process that calls
its main() in each file's directory as the command line would (a process of
its own for each of the 170 files spent 12 CPU-seconds starting Python and
compiling tangle.py); test_batched_ours_matches_the_plain_command checks on
files of each kind that this gives the same status, output and trees as the
command line.  Without emacs on PATH the parity tests are skipped with a
warning, unless MLPLCODE_REQUIRE_TOOLS=1, which makes them fail.
"""
import concurrent.futures
import difflib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import HANG, require_tool

ROOT = Path(__file__).resolve().parents[1]
TANGLE = ROOT / "tangle" / "tangle.py"
CORPUS = ROOT / "tests" / "tangle" / "corpus"
BOOK = ROOT / "mlplcode.org"
EMACS = shutil.which("emacs")
# Batch Emacs collects its garbage after every 800 kB of Lisp data it allocates; tangling this book
# it spent about 60% of its time so (69 CPU-seconds, 26 at 64 MB, measured on the project's
# machine, peak memory 128 MB). When it collects cannot change what it writes, so every Emacs these
# tests start gets 64 MB between collections.
EMACS_REQUIRES = ["--eval", "(setq gc-cons-threshold (* 64 1024 1024))",
                  "--eval", "(require 'org)", "--eval", "(require 'ob-python)"]
# Org 9.5 parses the element at point again each time it looks for a block or a reference, unless
# its element cache is on (off by default in Org 9.5, on from Org 9.6). Tangling this book, whose
# blocks refer to one another hundreds of times, took 24 CPU-seconds without it and 9.5 with it
# (cpuacct cgroup, the project's machine). It is a cache and wrote the same here: the book and every
# accept/ and edge/ file of the corpus tangled to the same trees, and the same errors, with it and
# without it when it was turned on. It is turned on for the book only: the corpus, which tries each
# feature, is tangled by Org as it comes.
EMACS_CACHE = ["--eval", "(setq org-element-use-cache t)"]
TIMEOUT = HANG
EMACS_CHUNK = 40


def corpus(kind):
    return sorted((CORPUS / kind).glob("*.org"))


def database(org_name):
    return "." + org_name + ".tangle.json"


def header_lines(path):
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        return [f.readline().rstrip("\n"), f.readline().rstrip("\n")]


def known_problem(path, label):
    """The reason given on line 2 as '# LABEL: reason', or None."""
    second = header_lines(path)[1]
    prefix = f"# {label}:"
    return second[len(prefix):].strip() if second.startswith(prefix) else None


def params(kind, label=None):
    """pytest params for a corpus directory; known problems become strict xfails."""
    result = []
    for path in corpus(kind):
        reason = label and known_problem(path, label)
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        result.append(pytest.param(path, id=path.stem, marks=marks))
    return result


def require_emacs():
    require_tool("emacs", "Emacs parity")


# ---------------------------------------------------------------- running

@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run_ours(directory, org_name, *args):
    proc = subprocess.run(
        [sys.executable, str(TANGLE), *args, org_name], cwd=directory,
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


OURS_BATCH = r"""
import contextlib, importlib.util, io, json, os, sys, traceback

spec = importlib.util.spec_from_file_location("tangle", sys.argv[1])
tangle = importlib.util.module_from_spec(spec)
sys.modules["tangle"] = tangle  # its dataclasses look their module up here
spec.loader.exec_module(tangle)
results = []
for directory, org_name in json.load(sys.stdin):
    os.chdir(directory)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            status = tangle.main([org_name])
        except SystemExit as leaving:  # as the interpreter reads the code of sys.exit
            status = leaving.code
            if status is not None and not isinstance(status, int):
                print(status, file=sys.stderr)
                status = 1
        except BaseException:  # as the interpreter reports an uncaught exception
            traceback.print_exc()
            status = 1
    results.append([status or 0, stdout.getvalue(), stderr.getvalue()])
sys.stdout.write(json.dumps(results))
"""


def run_ours_batch(jobs):
    """Our tangler on each (directory, org name) of JOBS, in one process that imports
    tangle.py once and runs its main() as `python tangle.py ORG_NAME` in DIRECTORY would:
    {(directory, org name): Result}."""
    proc = subprocess.run(
        [sys.executable, "-c", OURS_BATCH, str(TANGLE)],
        input=json.dumps([[str(directory), name] for directory, name in jobs]),
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    assert proc.returncode == 0, "the batch of our tangler failed:\n" + proc.stderr[-3000:]
    return {job: Result(*result) for job, result in zip(jobs, json.loads(proc.stdout))}


def run_emacs_plain(directory, org_name, *settings):
    """The documented batch command, in DIRECTORY (with EMACS_REQUIRES's room between collections,
    and SETTINGS, more --eval arguments, before it tangles)."""
    proc = subprocess.run(
        [EMACS, "--batch", "-Q", *EMACS_REQUIRES, *settings,
         "--eval", f'(org-babel-tangle-file "{org_name}")'],
        cwd=directory, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=TIMEOUT,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


EMACS_BATCH = r"""
(dolist (file command-line-args-left)
  (let ((default-directory (file-name-directory file)))
    (condition-case err
        (progn (org-babel-tangle-file file)
               (princ (format "OK\t%s\n" file)))
      (error (princ (format "ERROR\t%s\t%S\n" file err))))))
(setq command-line-args-left nil)
"""


def run_emacs_batch(org_paths, scratch):
    """Tangle each org file (absolute paths, one per directory) in one Emacs.

    Returns {path: Result}; an Emacs error in one file does not stop the others.
    Some inputs make batch Emacs exit (a prompt that reads the closed stdin):
    that file counts as failed, and a new Emacs tangles the files after it.
    One Emacs takes at most EMACS_CHUNK files, so that each run stays well
    within TIMEOUT on a busy machine.
    """
    script = scratch / "tangle-all.el"
    script.write_text(EMACS_BATCH, encoding="utf-8")
    status, remaining = {}, [str(p) for p in org_paths]
    while remaining:
        chunk = remaining[:EMACS_CHUNK]
        proc = subprocess.run(
            [EMACS, "--batch", "-Q", *EMACS_REQUIRES, "-l", str(script), *chunk],
            cwd=scratch, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=TIMEOUT,
        )
        for line in proc.stdout.splitlines():
            word, _, rest = line.partition("\t")
            if word in ("OK", "ERROR"):
                file, _, error = rest.partition("\t")
                status[file] = Result(0 if word == "OK" else 255, "", error)
        unfinished = [p for p in chunk if p not in status]
        if unfinished:
            status[unfinished[0]] = Result(255, "", "Emacs exited while tangling it: "
                                           + proc.stderr[-300:])
        remaining = [p for p in remaining if p not in status]
    return {Path(p): status[str(p)] for p in org_paths}


# ------------------------------------------------------------- comparing

def snapshot(directory, org_name):
    """{relative path: (kind, bytes or link, mode)} for everything under DIRECTORY."""
    tree = {}
    for base, dirs, files in os.walk(directory):
        for name in dirs + files:
            full = os.path.join(base, name)
            rel = os.path.relpath(full, directory)
            if rel == database(org_name):
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                tree[rel] = ("link", os.readlink(full), None)
            elif stat.S_ISDIR(st.st_mode):
                tree[rel] = ("dir", None, stat.S_IMODE(st.st_mode))
            else:
                with open(full, "rb") as f:
                    tree[rel] = ("file", f.read(), stat.S_IMODE(st.st_mode))
    return tree


def describe_difference(ours, theirs, their_name="emacs"):
    lines = []
    for rel in sorted(set(ours) | set(theirs)):
        a, b = ours.get(rel), theirs.get(rel)
        if a == b:
            continue
        if a is None or b is None:
            lines.append(f"{rel}: only written by {'ours' if b is None else their_name}")
            continue
        if a[0] != b[0]:
            lines.append(f"{rel}: ours is a {a[0]}, {their_name}'s a {b[0]}")
            continue
        if a[2] != b[2]:
            lines.append(f"{rel}: mode ours {oct(a[2])} vs {their_name} {oct(b[2])}")
        if a[1] != b[1]:
            lines.append(f"{rel}: contents differ")
            old = b[1].decode("utf-8", "replace").splitlines(keepends=True)
            new = a[1].decode("utf-8", "replace").splitlines(keepends=True)
            lines += [repr(line) for line in difflib.unified_diff(
                old, new, f"{rel} ({their_name})", f"{rel} (ours)", n=2)]
    return "\n".join(lines)


def assert_same_tree(our_dir, their_dir, org_name, their_name="emacs"):
    ours, theirs = snapshot(our_dir, org_name), snapshot(their_dir, org_name)
    assert ours == theirs, "trees differ:\n" + describe_difference(ours, theirs, their_name)
    return ours


def assert_clean_refusal(directory, org_name, result, line=None, text=None):
    """Exit 1, a FILE:LINE: message, no traceback, and nothing written beside the org file."""
    where = f"{org_name}:{line if line is not None else ''}"
    assert result.returncode == 1, (
        f"exit status {result.returncode}, expected a refusal\n{result.stdout}{result.stderr}")
    assert "Traceback" not in result.stderr, "the tangler crashed:\n" + result.stderr
    if line is None:
        assert re.search(rf"^{re.escape(org_name)}:\d+: \S", result.stderr, re.M), (
            "no 'FILE.org:LINE: reason' message on stderr:\n" + result.stderr)
    else:
        assert f"{where}:" in result.stderr, f"stderr does not name {where}:\n{result.stderr}"
    if text is not None:
        assert text in result.stderr, f"stderr lacks {text!r}:\n{result.stderr}"
    written = sorted(set(os.listdir(directory)) - {org_name})
    assert not written, f"a refusal must write nothing, found {written}"


# ----------------------------------------------------- shared corpus runs

@dataclass
class Case:
    org: Path
    ours_dir: Path
    emacs_dir: Path
    ours: Result
    emacs: Result | None


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """Tangle every accept/ and edge/ file with both tanglers, and every refuse/ file
    with ours, the two tanglers at once; each in fresh directories."""
    root = tmp_path_factory.mktemp("tangle-corpus")
    cases, emacs_orgs, dirs = {}, [], {}
    for kind in ("accept", "edge", "refuse"):
        for org in corpus(kind):
            ours_dir = root / kind / org.stem / "ours"
            emacs_dir = root / kind / org.stem / "emacs"
            ours_dir.mkdir(parents=True)
            shutil.copy(org, ours_dir / org.name)
            if kind != "refuse":
                emacs_dir.mkdir(parents=True)
                shutil.copy(org, emacs_dir / org.name)
                emacs_orgs.append(emacs_dir / org.name)
            dirs[org] = (ours_dir, emacs_dir)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ours_job = pool.submit(run_ours_batch, [(ours_dir, org.name) for org, (ours_dir, _) in dirs.items()])
        emacs = run_emacs_batch(emacs_orgs, root) if EMACS else {}
        ours = ours_job.result()
    for org, (ours_dir, emacs_dir) in dirs.items():
        cases[org] = Case(org, ours_dir, emacs_dir, ours[ours_dir, org.name],
                          emacs.get(emacs_dir / org.name))
    return cases


# ------------------------------------------------------------------ tests

def test_corpus_is_complete():
    assert len(corpus("accept")) >= 40
    assert len(corpus("edge")) >= 30
    assert len(corpus("refuse")) >= 85
    for path in corpus("accept") + corpus("edge"):
        first = header_lines(path)[0]
        assert first.startswith("# "), f"{path.name}: line 1 must say what the file exercises"
        n = len(path.read_text(encoding="utf-8").splitlines())
        low = 10 if path.parent.name == "accept" else 3
        assert low <= n <= 60, f"{path.name}: keep corpus files small ({n} lines)"
    for path in corpus("refuse"):
        assert re.fullmatch(r"# refuse: \d+: .+", header_lines(path)[0]), path.name


@pytest.mark.parametrize("org", params("accept"))
def test_accept_matches_emacs(org, runs):
    require_emacs()
    case = runs[org]
    assert case.ours.returncode == 0, f"our tangler failed:\n{case.ours.stdout}{case.ours.stderr}"
    assert "Traceback" not in case.ours.stderr
    assert case.emacs.returncode == 0, f"Emacs failed on an accept file: {case.emacs.stderr}"
    tree = assert_same_tree(case.ours_dir, case.emacs_dir, org.name)
    written = [rel for rel, entry in tree.items() if entry[0] == "file" and rel != org.name]
    assert written, "an accept file must tangle at least one file"
    assert tree[org.name][1] == org.read_bytes(), "the org file itself was modified"
    assert (case.ours_dir / database(org.name)).is_file(), "our database was not written"


@pytest.mark.parametrize("org", params("edge", "known mismatch"))
def test_edge_refused_or_matches_emacs(org, runs):
    require_emacs()
    case = runs[org]
    if case.ours.returncode != 0:
        assert_clean_refusal(case.ours_dir, org.name, case.ours)
        return
    assert case.emacs.returncode == 0, (
        f"Emacs fails on this file ({case.emacs.stderr}), so our tangler must refuse it; "
        f"it exited 0:\n{case.ours.stdout}")
    assert_same_tree(case.ours_dir, case.emacs_dir, org.name)


@pytest.mark.parametrize("org", params("refuse", "known issue"))
def test_refuse(org, runs):
    line, text = re.fullmatch(r"# refuse: (\d+): (.+)", header_lines(org)[0]).groups()
    case = runs[org]
    assert_clean_refusal(case.ours_dir, org.name, case.ours, int(line), text)
    for target in re.findall(r":tangle (/\S+)", org.read_bytes().decode("utf-8", "replace")):
        assert not os.path.exists(target), f"wrote {target} outside the org file's directory"


def test_refuse_mixed_line_ends(tmp_path):
    """A file whose lines end in both \\n and \\r\\n is refused at the first line that differs."""
    name = "mixed-line-ends.org"
    (tmp_path / name).write_bytes(
        b"* H\n#+begin_src python :tangle out.py\r\nx = 1\r\n#+end_src\r\n")
    result = run_ours(tmp_path, name)
    assert_clean_refusal(tmp_path, name, result, 2, "ends differently from line 1")


@pytest.mark.parametrize("newline", [b"\r\n", b"\r"], ids=["crlf", "cr"])
def test_one_kind_of_line_end_matches_emacs(tmp_path, newline):
    """A book whose every line ends in \\r\\n (or \\r) tangles as Emacs tangles it (with \\n)."""
    require_emacs()
    org = CORPUS / "accept" / "17-combined.org"
    data = org.read_bytes().replace(b"\n", newline)
    for side in ("ours", "emacs"):
        (tmp_path / side).mkdir()
        (tmp_path / side / org.name).write_bytes(data)
    assert run_ours(tmp_path / "ours", org.name).returncode == 0
    assert run_emacs_plain(tmp_path / "emacs", org.name).returncode == 0
    tree = assert_same_tree(tmp_path / "ours", tmp_path / "emacs", org.name)
    assert any(rel.endswith(".py") for rel in tree)


@pytest.mark.parametrize("name", ["08-comments-link.org", "09-shebang-modes.org"])
def test_batched_emacs_matches_the_plain_command(name, runs, tmp_path):
    """The batch Emacs used for the corpus gives what the plain command gives."""
    require_emacs()
    org = CORPUS / "accept" / name
    shutil.copy(org, tmp_path / org.name)
    result = run_emacs_plain(tmp_path, org.name)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_tree(tmp_path, runs[org].emacs_dir, org.name, "batched emacs")


@pytest.mark.parametrize("kind, name", [
    ("accept", "09-shebang-modes.org"), ("accept", "17-combined.org"), ("edge", "space-in-path.org"),
    ("edge", "setuid-mode.org"), ("refuse", "absolute-path.org"), ("refuse", "duplicate-name.org")])
def test_batched_ours_matches_the_plain_command(kind, name, runs, tmp_path):
    """The batch our tangler is run in for the corpus gives what `python tangle.py FILE.org`
    gives: the same exit status, output and messages, and the same tree."""
    org = CORPUS / kind / name
    shutil.copy(org, tmp_path / org.name)
    plain, batched = run_ours(tmp_path, org.name), runs[org].ours
    assert plain == batched
    assert_same_tree(tmp_path, runs[org].ours_dir, org.name, "batched ours")


def test_book_matches_emacs(tmp_path):
    if not BOOK.is_file():
        pytest.skip(f"{BOOK.name} does not exist yet")
    require_emacs()
    ours_dir, emacs_dir = tmp_path / "ours", tmp_path / "emacs"
    for directory in (ours_dir, emacs_dir):
        directory.mkdir()
        shutil.copy(BOOK, directory / BOOK.name)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        ours_job = pool.submit(run_ours, ours_dir, BOOK.name)
        emacs = run_emacs_plain(emacs_dir, BOOK.name, *EMACS_CACHE)
        ours = ours_job.result()
    assert ours.returncode == 0, f"our tangler failed on the book:\n{ours.stdout}{ours.stderr}"
    assert emacs.returncode == 0, f"Emacs failed on the book:\n{emacs.stderr[-3000:]}"
    assert_same_tree(ours_dir, emacs_dir, BOOK.name)


def identities(directory, org_name):
    return {
        rel: (st.st_ino, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
        for rel in snapshot(directory, org_name) if rel != org_name
        for st in [os.stat(directory / rel)] if stat.S_ISREG(st.st_mode)
    }


def test_second_run_leaves_unchanged_files_alone(tmp_path):
    org = CORPUS / "accept" / "09-shebang-modes.org"
    shutil.copy(org, tmp_path / org.name)
    first = run_ours(tmp_path, org.name)
    assert first.returncode == 0, first.stderr
    before = identities(tmp_path, org.name)
    db = tmp_path / database(org.name)
    db_before = (db.stat().st_ino, db.stat().st_mtime_ns)
    assert len(before) >= 4, before

    second = run_ours(tmp_path, org.name)
    assert second.returncode == 0, second.stderr
    assert identities(tmp_path, org.name) == before, "an unchanged file was rewritten"
    assert (db.stat().st_ino, db.stat().st_mtime_ns) == db_before, "the database was rewritten"

    # Changing one block rewrites its file only.
    text = (tmp_path / org.name).read_text(encoding="utf-8")
    (tmp_path / org.name).write_text(text.replace('echo "run"', 'echo "run!"'), encoding="utf-8")
    third = run_ours(tmp_path, org.name)
    assert third.returncode == 0, third.stderr
    after = identities(tmp_path, org.name)
    assert set(after) == set(before)
    changed = {rel for rel in before if after[rel] != before[rel]}
    assert changed == {"bin/run.sh"}, changed
    assert after["bin/run.sh"][2] == 0o755
    assert b'echo "run!"' in (tmp_path / "bin" / "run.sh").read_bytes()


def test_refuse_header_args_under_a_heading_on_line_1(tmp_path):
    """Org 9.5 applies such a drawer to the whole file; we refuse rather than copy the quirk."""
    name = "first-line-heading.org"
    book = "* A\n:PROPERTIES:\n:header-args:python: :tangle a.py\n:END:\n* B\n#+begin_src python\nx = 1\n#+end_src\n"
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / name).write_text(book)
    assert_clean_refusal(tmp_path / "ours", name, run_ours(tmp_path / "ours", name), 3, "heading on line 1")
    require_emacs()
    (tmp_path / "emacs").mkdir()
    (tmp_path / "emacs" / name).write_text(book)
    assert run_emacs_plain(tmp_path / "emacs", name).returncode == 0
    assert (tmp_path / "emacs" / "a.py").read_text() == "x = 1\n", "the quirk this refusal exists for"
