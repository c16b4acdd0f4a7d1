"""tangle/tangle.py --check and --detangle, run as a command on small org projects.

Each test writes an org book into tmp_path and runs the tangler there with
the interpreter running pytest, so no Emacs is needed.
"""
import difflib
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG

TANGLER = Path(__file__).resolve().parent.parent / "tangle" / "tangle.py"
DATABASE = ".book.org.tangle.json"

BOOK = '''\
#+TITLE: A small book
#+PROPERTY: header-args:python :mkdirp yes

* Tool
The command line entry point.

#+begin_src python :tangle bin/tool :shebang "#!/usr/bin/env python3"
import sys
print(sys.argv)
#+end_src

* Module
:PROPERTIES:
:header-args:python: :tangle pkg/mod.py :mkdirp yes
:END:

Three functions; the third follows the second without a blank line.

#+begin_src python
def first():
    return 1
#+end_src

#+begin_src python
def second():
    return 2
#+end_src

#+begin_src python :padline no
def third():
    return 3
#+end_src

#+begin_src python
def fourth():
    # to delete
    return 4
#+end_src

#+NAME: once
#+begin_src python :tangle no
def helper():
    return "once"
#+end_src

#+NAME: twice
#+begin_src python :tangle no
TWICE = 2
#+end_src

#+begin_src python :noweb yes
<<once>>

class Uses:
    <<twice>>

    def m(self):
        return 0

OTHER = 1
<<twice>>
#+end_src

* Escapes
#+begin_src python :tangle pkg/esc.py
TEXT = """
,* a star line
,#+ a hash-plus line
"""
#+end_src

* List
- an item whose code sits inside it:

  #+begin_src python :tangle pkg/listed.py
  def listed():
      return "listed"
  #+end_src
'''

MOD_PY = '''\
def first():
    return 1

def second():
    return 2
def third():
    return 3

def fourth():
    # to delete
    return 4

def helper():
    return "once"

class Uses:
    TWICE = 2

    def m(self):
        return 0

OTHER = 1
TWICE = 2
'''

ESC_PY = 'TEXT = """\n* a star line\n#+ a hash-plus line\n"""\n'
LISTED_PY = 'def listed():\n    return "listed"\n'
TOOL = "#!/usr/bin/env python3\nimport sys\nprint(sys.argv)\n"


# ---------------------------------------------------------------- helpers

def tangle(cwd, *args):
    return subprocess.run([sys.executable, str(TANGLER), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=HANG)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def read(path):
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def org_line(text, needle):
    """The 1-based line of TEXT that is exactly NEEDLE (which must be unique)."""
    found = [n for n, line in enumerate(text.split("\n"), 1) if line == needle]
    assert len(found) == 1, (needle, found)
    return found[0]


def replace_once(path, old, new):
    text = read(path)
    assert text.count(old) == 1, (path, old)
    write(path, text.replace(old, new))


def tree(root):
    """Every file and directory under ROOT: bytes, mode and mtime."""
    state = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(top, name)
            st = os.stat(full)
            data = None if name in dirs else Path(full).read_bytes()
            state[os.path.relpath(full, root)] = (data, st.st_mode, st.st_mtime_ns)
    return state


def age(root):
    """Set every file's mtime far in the past, so that any rewrite shows."""
    for top, _, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(top, name), ns=(10**18, 10**18))


def org_changes(before, after):
    """The org edit as (first changed line, old lines, new lines) stretches."""
    a, b = before.split("\n"), after.split("\n")
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [(i1 + 1, a[i1:i2], b[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes()
            if tag != "equal"]


@pytest.fixture(scope="session")
def tangled_book(tmp_path_factory):
    """BOOK, tangled once for the whole session."""
    root = tmp_path_factory.mktemp("tangled-book")
    write(root / "book.org", BOOK)
    result = tangle(root, "book.org")
    assert result.returncode == 0, result.stderr
    return root


@pytest.fixture
def book(tmp_path, tangled_book):
    """A copy of the tangled book in tmp_path (modes and mtimes kept); returns tmp_path."""
    shutil.copytree(tangled_book, tmp_path, dirs_exist_ok=True)
    return tmp_path


def check(root, org="book.org"):
    return tangle(root, "--check", org)


# ---------------------------------------------------------------- tangle and --check

def test_tangle_writes_the_expected_files_and_check_passes(book):
    assert read(book / "pkg/mod.py") == MOD_PY
    assert read(book / "pkg/esc.py") == ESC_PY
    assert read(book / "pkg/listed.py") == LISTED_PY
    assert read(book / "bin/tool") == TOOL
    assert os.stat(book / "bin/tool").st_mode & 0o111
    assert not os.stat(book / "pkg/mod.py").st_mode & 0o111
    assert (book / DATABASE).is_file()
    result = check(book)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all match the book" in result.stdout


HUNK = re.compile(r"^@@ -[0-9,]+ \+[0-9,]+ @@ book\.org:(\d+)$", re.M)


@pytest.mark.parametrize("path, old, new, org_text", [
    ("pkg/mod.py", "    return 2\n", "    return 9\n", "    return 2"),
    # a line of a noweb expansion names the line of the referenced block
    ("pkg/mod.py", '    return "once"\n', '    return "oncE"\n', '    return "once"'),
    # a block indented inside a list item
    ("pkg/listed.py", '    return "listed"\n', '    return "listeD"\n', '      return "listed"'),
    ("pkg/esc.py", "#+ a hash-plus line\n", "#+ a hash-plus linE\n", ",#+ a hash-plus line"),
])
def test_check_shows_a_diff_naming_the_org_line(book, path, old, new, org_text):
    assert len(old) == len(new) and sum(x != y for x, y in zip(old, new)) == 1
    replace_once(book / path, old, new)
    result = check(book)
    assert result.returncode == 1
    out = result.stdout
    assert f"--- {path}" in out and f"+++ {path}" in out
    assert "-" + new in out and "+" + old in out
    assert HUNK.findall(out) == [str(org_line(BOOK, org_text))], out


def test_check_diff_with_a_form_feed_in_the_file(tmp_path):
    write(tmp_path / "book.org",
          "* A\n#+begin_src python :tangle a.py\n# page\fbreak\ny = 2\nz = 3\n#+end_src\n")
    assert tangle(tmp_path, "book.org").returncode == 0
    replace_once(tmp_path / "a.py", "y = 2", "y = 9")
    result = check(tmp_path)
    assert result.returncode == 1
    assert "No newline at end of file" not in result.stdout, result.stdout
    assert re.search(r"^@@ -1,3 \+1,3 @@ book\.org:4$", result.stdout, re.M), result.stdout


def test_check_reports_a_missing_file(book):
    (book / "pkg/esc.py").unlink()
    result = check(book)
    assert result.returncode == 1
    assert re.search(r"^missing: pkg/esc\.py\b", result.stdout, re.M), result.stdout


def default_mode():
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@pytest.mark.parametrize("path, mode", [
    ("bin/tool", 0o644),   # the executable bit lost
    ("bin/tool", 0o775),   # still executable, but not the mode the shebang gives
    ("pkg/mod.py", 0o755),
])
def test_check_reports_a_wrong_mode_and_tangle_restores_it(book, path, mode):
    wanted = 0o755 if path == "bin/tool" else default_mode()
    os.chmod(book / path, mode)
    result = check(book)
    assert result.returncode == 1
    assert re.search(rf"^mode: {re.escape(path)} is {mode:04o}, the book gives {wanted:04o} "
                     r"\(book\.org:\d+\)$", result.stdout, re.M), result.stdout
    assert tangle(book, "book.org").returncode == 0
    assert stat.S_IMODE(os.stat(book / path).st_mode) == wanted
    assert check(book).returncode == 0


def test_a_changed_tangle_mode_is_applied_to_an_existing_file(tmp_path):
    org = "* A\n#+begin_src sh :tangle run.sh :tangle-mode (identity #o700)\necho hi\n#+end_src\n"
    write(tmp_path / "book.org", org)
    assert tangle(tmp_path, "book.org").returncode == 0
    assert stat.S_IMODE(os.stat(tmp_path / "run.sh").st_mode) == 0o700
    write(tmp_path / "book.org", org.replace("#o700", "#o750"))
    result = check(tmp_path)
    assert result.returncode == 1 and "mode: run.sh is 0700, the book gives 0750" in result.stdout
    assert tangle(tmp_path, "book.org").returncode == 0
    assert stat.S_IMODE(os.stat(tmp_path / "run.sh").st_mode) == 0o750
    assert check(tmp_path).returncode == 0


def test_check_writes_nothing(book):
    replace_once(book / "pkg/mod.py", "return 1", "return 7")
    (book / "pkg/esc.py").unlink()
    os.chmod(book / "bin/tool", 0o644)
    write(book / "pkg/stray.py", "x = 1\n")
    replace_once(book / "book.org", "    return 3\n", "    return 33\n")
    age(book)
    before = tree(book)
    result = check(book)
    assert result.returncode == 1
    assert tree(book) == before


def test_check_before_any_tangle_writes_nothing(tmp_path):
    write(tmp_path / "book.org", BOOK)
    age(tmp_path)
    before = tree(tmp_path)
    result = check(tmp_path)
    assert result.returncode == 1
    assert "missing: pkg/mod.py" in result.stdout
    assert tree(tmp_path) == before  # no pkg/ or bin/ directory, no database


def test_check_reports_a_file_whose_block_was_deleted(book):
    text = read(book / "book.org")
    start = text.index("* Escapes\n")
    write(book / "book.org", text[:start] + text[text.index("* List\n"):])
    result = check(book)
    assert result.returncode == 1
    assert re.search(r"^not in the book: pkg/esc\.py\b", result.stdout, re.M), result.stdout


def test_tangle_reports_a_file_whose_block_was_deleted(book):
    # bin/tool is not a .py file: only the database remembers that the book wrote it.
    text = read(book / "book.org")
    write(book / "book.org", text[:text.index("* Tool\n")] + text[text.index("* Module\n"):])
    result = check(book)
    assert result.returncode == 1
    assert re.search(r"^not in the book: bin/tool\b", result.stdout, re.M), result.stdout
    result = tangle(book, "book.org")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^not in the book: bin/tool\b", result.stdout, re.M), result.stdout


def test_check_reports_a_stray_python_file(book):
    write(book / "pkg/stray.py", "x = 1\n")
    write(book / "pkg/notes.txt", "not python\n")
    write(book / "elsewhere/other.py", "x = 1\n")
    result = check(book)
    assert result.returncode == 1
    assert re.findall(r"^not in the book: (\S+)", result.stdout, re.M) == ["pkg/stray.py"]


@pytest.mark.parametrize("absolute", [False, True], ids=["relative-org-path", "absolute-org-path"])
def test_check_reports_a_stray_python_file_beside_the_book(tmp_path, absolute):
    write(tmp_path / "book.org", "* A\n#+begin_src python :tangle top.py\nx = 1\n#+end_src\n")
    org = str(tmp_path / "book.org") if absolute else "book.org"
    assert tangle(tmp_path, org).returncode == 0
    write(tmp_path / "stray.py", "y = 2\n")
    result = check(tmp_path, org)
    assert result.returncode == 1, result.stdout
    assert re.search(r"^not in the book: stray\.py\b", result.stdout, re.M), result.stdout


def test_check_fails_on_a_stale_database(book):
    # The org changes without a tangle; the tangled file is brought up to date
    # by hand, so only the database is out of date.
    replace_once(book / "book.org", "    return 3\n", "    return 33\n")
    replace_once(book / "pkg/mod.py", "    return 3\n", "    return 33\n")
    result = check(book)
    assert result.returncode == 1
    assert DATABASE in result.stdout and "stale" in result.stdout, result.stdout
    assert "---" not in result.stdout  # no file differs
    assert tangle(book, "book.org").returncode == 0
    assert check(book).returncode == 0


@pytest.mark.parametrize("content", ["garbage\n", "[]\n", '{"files": {"pkg/mod.py": 5}}\n',
                                     '{"files": {"pkg/mod.py": {"sha256": null}}}\n'])
def test_a_corrupt_database_is_reported_without_a_traceback(book, content):
    write(book / DATABASE, content)
    result = check(book)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert DATABASE in result.stdout + result.stderr
    replace_once(book / "pkg/mod.py", "    return 4\n", "    return 40\n")
    age(book)
    before = tree(book)
    result = tangle(book, "--detangle", "book.org")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert tree(book) == before


def test_check_fails_without_a_database(book):
    (book / DATABASE).unlink()
    result = check(book)
    assert result.returncode == 1
    assert DATABASE in result.stdout


def test_retangle_keeps_the_mtime_of_unchanged_files(book):
    age(book)
    before = tree(book)
    # Prose only: nothing is written.
    replace_once(book / "book.org", "The command line entry point.", "The entry point.")
    result = tangle(book, "book.org")
    assert result.returncode == 0, result.stderr
    after = tree(book)
    assert {p: s for p, s in after.items() if p != "book.org"} == {
        p: s for p, s in before.items() if p != "book.org"}
    # One block: only its file (and the database) are written.
    replace_once(book / "book.org", '  return "listed"', '  return "LISTED"')
    assert tangle(book, "book.org").returncode == 0
    after = tree(book)
    changed = sorted(p for p in after if after[p][0] is not None and after[p][2] != before[p][2])
    assert changed == sorted(["book.org", DATABASE, "pkg/listed.py"])


@pytest.mark.parametrize("prepare, message", [
    (lambda root: (root / "out").mkdir(), "out cannot be written: it is a directory"),
    (lambda root: write(root / "pkg", "a file\n"), "pkg/mod.py cannot be written: pkg is a file"),
    (lambda root: (root / "pkg").mkdir(mode=0o500), "no permission to write in"),
], ids=["target-is-a-directory", "parent-is-a-file", "read-only-directory"])
def test_a_target_that_cannot_be_written_is_refused_before_anything_is_written(tmp_path, prepare, message):
    if message.startswith("no permission") and os.geteuid() == 0:
        pytest.skip("root may write in a read-only directory")
    write(tmp_path / "book.org", "* A\n#+begin_src python :tangle first.py\nx = 1\n#+end_src\n"
          "#+begin_src python :tangle pkg/mod.py :mkdirp yes\ny = 2\n#+end_src\n"
          "#+begin_src python :tangle out\nz = 3\n#+end_src\n")
    prepare(tmp_path)
    before = tree(tmp_path)
    result = tangle(tmp_path, "book.org")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.match(r"book\.org:\d+: ", result.stderr) and message in result.stderr, result.stderr
    assert tree(tmp_path) == before, "a refusal wrote something"


def test_check_reports_a_directory_where_a_file_belongs(book):
    (book / "pkg/esc.py").unlink()
    (book / "pkg/esc.py").mkdir()
    result = check(book)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(r"^missing: pkg/esc\.py\b", result.stdout, re.M), result.stdout


def test_noweb_references_nested_too_deep_are_refused(tmp_path):
    """Emacs's stack gives out somewhere beyond 150 levels; we stop at 100, without a traceback."""
    lines = ["* A"]
    for k in range(102):
        lines += [f"#+NAME: n{k}", "#+begin_src python :tangle no :noweb yes",
                  f"<<n{k + 1}>>" if k < 101 else "x = 1", "#+end_src"]
    lines += ["#+begin_src python :tangle a.py :noweb yes", "<<n0>>", "#+end_src"]
    write(tmp_path / "book.org", "\n".join(lines) + "\n")
    result = tangle(tmp_path, "book.org")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "nested more than 100 deep" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["book.org"]


# ---------------------------------------------------------------- --detangle

def detangle_round_trip(root, edit):
    """Apply EDIT to the tangled files, detangle, tangle, check; return (old org, new org)."""
    before = read(root / "book.org")
    edit(root)
    edited = {p: s[0] for p, s in tree(root).items() if p not in ("book.org", DATABASE)}
    result = tangle(root, "--detangle", "book.org")
    assert result.returncode == 0, result.stdout + result.stderr
    after = read(root / "book.org")
    # The tangled files are exactly what was written by hand.
    assert {p: s[0] for p, s in tree(root).items() if p not in ("book.org", DATABASE)} == edited
    retangle = tangle(root, "book.org")
    assert retangle.returncode == 0, retangle.stderr
    assert {p: s[0] for p, s in tree(root).items() if p not in ("book.org", DATABASE)} == edited
    result = check(root)
    assert result.returncode == 0, result.stdout
    return before, after


def test_detangle_an_edited_line(book):
    edit = lambda root: replace_once(root / "pkg/mod.py", "    return 2\n", "    return 22\n")
    before, after = detangle_round_trip(book, edit)
    n = org_line(BOOK, "    return 2")
    assert org_changes(before, after) == [(n, ["    return 2"], ["    return 22"])]


def test_detangle_inserted_lines(book):
    edit = lambda root: replace_once(root / "pkg/mod.py", "def second():\n",
                                     'def second():\n    """Two."""\n    # more\n')
    before, after = detangle_round_trip(book, edit)
    n = org_line(BOOK, "def second():") + 1
    assert org_changes(before, after) == [(n, [], ['    """Two."""', "    # more"])]


@pytest.mark.parametrize("added", [
    ["ONE = first()"],
    ["", "ONE = first()"],
    ["", "", "ONE = first()"],
], ids=["one-line", "blank-then-line", "two-blanks-then-line"])
def test_detangle_lines_appended_at_the_end_of_a_block(book, added):
    # "    return 1" ends the first block; the blank line after it is Org's
    # padding, so the added lines belong to the first block, not the second.
    edit = lambda root: replace_once(root / "pkg/mod.py", "    return 1\n\n",
                                     "    return 1\n" + "".join(a + "\n" for a in added) + "\n")
    before, after = detangle_round_trip(book, edit)
    n = org_line(BOOK, "    return 1") + 1
    assert org_changes(before, after) == [(n, [], added)]


def test_detangle_blank_and_line_appended_to_a_block_in_a_small_file(tmp_path):
    # The same edit as "blank-then-line" above, in a smaller file: where the
    # added lines go must not depend on how much text follows them.
    write(tmp_path / "book.org", "* A\n#+begin_src python :tangle a.py\ndef first():\n"
          "    return 1\n#+end_src\n\n* B\n#+begin_src python :tangle a.py\n"
          "def second():\n    return 2\n#+end_src\n")
    assert tangle(tmp_path, "book.org").returncode == 0
    edit = lambda root: replace_once(root / "a.py", "    return 1\n\n",
                                     "    return 1\n\nONE = first()\n\n")
    before, after = detangle_round_trip(tmp_path, edit)
    n = org_line(before, "    return 1") + 1
    assert org_changes(before, after) == [(n, [], ["", "ONE = first()"])]


def test_detangle_lines_appended_at_the_end_of_the_last_block(book):
    edit = lambda root: write(root / "pkg/listed.py", LISTED_PY + "\nLISTED = listed()\n")
    before, after = detangle_round_trip(book, edit)
    n = org_line(BOOK, '      return "listed"') + 1
    assert org_changes(before, after) == [(n, [], ["", "  LISTED = listed()"])]


def test_detangle_a_deleted_line(book):
    edit = lambda root: replace_once(root / "pkg/mod.py", "    # to delete\n", "")
    before, after = detangle_round_trip(book, edit)
    n = org_line(BOOK, "    # to delete")
    assert org_changes(before, after) == [(n, ["    # to delete"], [])]


def test_detangle_an_edit_inside_a_noweb_expansion_used_once(book):
    edit = lambda root: replace_once(root / "pkg/mod.py", '    return "once"\n',
                                     '    return "only once"\n')
    before, after = detangle_round_trip(book, edit)
    n = org_line(BOOK, '    return "once"')
    assert org_changes(before, after) == [(n, ['    return "once"'], ['    return "only once"'])]


def test_detangle_an_edit_inside_an_indented_noweb_expansion(tmp_path):
    write(tmp_path / "book.org", '''\
* A
#+NAME: body
#+begin_src python :tangle no
x = 1
y = 2
#+end_src

#+begin_src python :tangle a.py :noweb yes
def f():
    <<body>>
    return x + y
#+end_src
''')
    assert tangle(tmp_path, "book.org").returncode == 0
    assert read(tmp_path / "a.py") == "def f():\n    x = 1\n    y = 2\n    return x + y\n"
    edit = lambda root: replace_once(root / "a.py", "    y = 2\n", "    y = 3\n    z = 4\n")
    before, after = detangle_round_trip(tmp_path, edit)
    assert org_changes(before, after) == [(5, ["y = 2"], ["y = 3", "z = 4"])]


@pytest.mark.parametrize("old, new, org_old, org_new", [
    # an escaped line stays escaped
    ("* a star line\n", "* a starry line\n", [",* a star line"], [",* a starry line"]),
    ("#+ a hash-plus line\n", "#+ a hash-plus line!\n",
     [",#+ a hash-plus line"], [",#+ a hash-plus line!"]),
    # a new line that Org would read as a heading or a keyword gets its comma
    ('line\n"""\n', 'line\n#+end_src\n* Heading\n*bold\n"""\n', [], [",#+end_src", ",* Heading", ",*bold"]),
    # a line that already starts with a comma before '*' gets one more
    ('line\n"""\n', 'line\n,* x\n"""\n', [], [",,* x"]),
])
def test_detangle_adds_comma_escapes(book, old, new, org_old, org_new):
    edit = lambda root: replace_once(root / "pkg/esc.py", old, new)
    before, after = detangle_round_trip(book, edit)
    changes = org_changes(before, after)
    assert [(o, n) for _, o, n in changes] == [(org_old, org_new)]


def test_detangle_keeps_the_indentation_of_a_block_in_a_list_item(book):
    edit = lambda root: write(root / "pkg/listed.py",
                              'def listed():\n    """In a list."""\n    return "LISTED"\n')
    before, after = detangle_round_trip(book, edit)
    n = org_line(BOOK, '      return "listed"')
    assert org_changes(before, after) == [
        (n, ['      return "listed"'], ['      """In a list."""', '      return "LISTED"'])]


def test_detangle_edits_in_two_blocks_and_two_files(book):
    def edit(root):
        replace_once(root / "pkg/mod.py", "    return 1\n", "    return 11\n")
        replace_once(root / "pkg/mod.py", "    return 4\n", "    return 44\n")
        replace_once(root / "pkg/listed.py", '"listed"', '"LISTED"')
    before, after = detangle_round_trip(book, edit)
    assert [(o, n) for _, o, n in org_changes(before, after)] == [
        (["    return 1"], ["    return 11"]),
        (["    return 4"], ["    return 44"]),
        (['      return "listed"'], ['      return "LISTED"']),
    ]


def test_detangle_edits_on_adjacent_lines_of_two_unpadded_blocks(book):
    # "    return 2" ends a block and "def third():" starts the next (:padline no):
    # each edit alone is written back, and so are both together.
    edit = lambda root: replace_once(root / "pkg/mod.py", "    return 2\ndef third():\n",
                                     "    return 20\ndef third_():\n")
    before, after = detangle_round_trip(book, edit)
    assert [(o, n) for _, o, n in org_changes(before, after)] == [
        (["    return 2"], ["    return 20"]), (["def third():"], ["def third_():"])]


def test_detangle_deletes_lines_at_the_end_of_one_block_and_the_start_of_the_next(tmp_path):
    write(tmp_path / "book.org", "* A\n#+begin_src python :tangle a.py\na = 1\nb = 2\n#+end_src\n"
          "#+begin_src python :tangle a.py :padline no\nc = 3\nd = 4\n#+end_src\n")
    assert tangle(tmp_path, "book.org").returncode == 0
    before, after = detangle_round_trip(tmp_path, lambda root: write(root / "a.py", "a = 1\nd = 4\n"))
    assert [(o, n) for _, o, n in org_changes(before, after)] == [(["b = 2"], []), (["c = 3"], [])]


NOWEB_REF_BOOK = """* A
#+begin_src python :tangle no :noweb-ref part
first_part = 1
#+end_src
#+begin_src python :tangle no :noweb-ref part
second_part = 2
more = 3
#+end_src
#+begin_src python :tangle a.py :noweb yes
def f():
    <<part>>
#+end_src
"""


@pytest.mark.parametrize("sep", ["", ' :noweb-sep "\\n# sep\\n"'], ids=["default-sep", "comment-sep"])
def test_detangle_the_first_line_of_a_later_noweb_ref_part(tmp_path, sep):
    write(tmp_path / "book.org", NOWEB_REF_BOOK.replace(":noweb-ref part\nfirst", f":noweb-ref part{sep}\nfirst"))
    assert tangle(tmp_path, "book.org").returncode == 0
    edit = lambda root: replace_once(root / "a.py", "    second_part = 2\n", "    second_part = 22\n")
    before, after = detangle_round_trip(tmp_path, edit)
    assert [(o, n) for _, o, n in org_changes(before, after)] == [(["second_part = 2"], ["second_part = 22"])]


@pytest.mark.parametrize("bom, newline", [("", "\r\n"), ("\ufeff", "\n"), ("\ufeff", "\r")],
                         ids=["crlf", "bom", "bom-cr"])
def test_detangle_keeps_the_byte_order_mark_and_the_line_ends(tmp_path, bom, newline):
    org = "* A\n#+begin_src python :tangle a.py\nx = 1\ny = 2\n#+end_src\n"
    (tmp_path / "book.org").write_bytes((bom + org.replace("\n", newline)).encode("utf-8"))
    assert tangle(tmp_path, "book.org").returncode == 0
    assert read(tmp_path / "a.py") == "x = 1\ny = 2\n"
    replace_once(tmp_path / "a.py", "y = 2\n", "y = 3\n")
    result = tangle(tmp_path, "--detangle", "book.org")
    assert result.returncode == 0, result.stderr
    expected = bom + org.replace("y = 2", "y = 3").replace("\n", newline)
    assert (tmp_path / "book.org").read_bytes() == expected.encode("utf-8")
    assert check(tmp_path).returncode == 0


def test_detangle_with_nothing_edited_changes_nothing(book):
    age(book)
    before = tree(book)
    result = tangle(book, "--detangle", "book.org")
    assert result.returncode == 0, result.stderr
    assert tree(book) == before


# ---------------------------------------------------------------- --detangle refusals

def edit_noweb_used_twice(root):
    replace_once(root / "pkg/mod.py", "    TWICE = 2\n", "    TWICE = 3\n")


def edit_two_blocks_and_add_a_line(root):
    # "    return 2" ends a block and "def third():" starts the next (:padline no).
    replace_once(root / "pkg/mod.py", "    return 2\ndef third():\n", "    return 20\n# new\ndef third_():\n")


def delete_a_whole_block(root):
    replace_once(root / "pkg/mod.py", "\ndef fourth():\n    # to delete\n    return 4\n", "")


def edit_padding(root):
    replace_once(root / "pkg/mod.py", "    return 1\n\ndef second", "    return 1\n# pad\ndef second")


def insert_between_unpadded_blocks(root):
    replace_once(root / "pkg/mod.py", "    return 2\ndef third():\n",
                 "    return 2\n# between\ndef third():\n")


def edit_both_sides(root):
    replace_once(root / "book.org", "    return 1\n", "    return 10\n")
    replace_once(root / "pkg/mod.py", "    return 4\n", "    return 40\n")


def edit_without_database(root):
    (root / DATABASE).unlink()
    replace_once(root / "pkg/mod.py", "    return 4\n", "    return 40\n")


def edit_without_final_newline(root):
    replace_once(root / "pkg/mod.py", "OTHER = 1\nTWICE = 2\n", "OTHER = 1\nTWICE = 2")
    replace_once(root / "pkg/mod.py", "    return 4\n", "    return 40\n")


def edit_first_line_blank(root):
    replace_once(root / "pkg/esc.py", 'TEXT = """\n', '\n')


def edit_shebang(root):
    replace_once(root / "bin/tool", "#!/usr/bin/env python3\n", "#!/usr/bin/python3\n")


@pytest.mark.parametrize("edit, message", [
    (edit_noweb_used_twice, r"twice.*2 places"),
    (edit_two_blocks_and_add_a_line, r"more than one block and adds or removes lines"),
    (delete_a_whole_block, r"deletes every line of the block at book\.org:\d+; delete the block in the book"),
    (edit_padding, r"blank line Org puts between two blocks"),
    (insert_between_unpadded_blocks, r"between two blocks"),
    (edit_both_sides, r"both .*changed"),
    (edit_without_database, r"no \.book\.org\.tangle\.json"),
    (edit_without_final_newline, r"no newline at the end"),
    (edit_first_line_blank, r"cannot be written back.*blank line"),
    (edit_shebang, r"shebang"),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_detangle_refuses(book, edit, message):
    edit(book)
    age(book)
    before = tree(book)
    result = tangle(book, "--detangle", "book.org")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert tree(book) == before


# ---------------------------------------------------------------- arguments

def test_a_missing_org_file_exits_2_with_one_line(tmp_path):
    result = tangle(tmp_path, "missing.org")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "missing.org" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_check_and_detangle_together_exit_2(book):
    age(book)
    before = tree(book)
    result = tangle(book, "--check", "--detangle", "book.org")
    assert result.returncode == 2
    assert result.stderr.strip()
    assert tree(book) == before
