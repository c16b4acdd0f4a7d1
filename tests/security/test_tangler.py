"""Attacks on tangle/tangle.py by a book someone sends: writes out of the tree, into .git,
through links and hard links, special modes, an expansion that explodes, and --detangle
reading a file replaced by a link.

Each book has a first, harmless target (first.py) so that "nothing written" is checked: a
refused book must leave the tree exactly as it was, database included. Tests run as root,
so modes are checked by reading them back, not by a failing write.
"""
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TANGLER = ROOT / "tangle" / "tangle.py"
sys.path.insert(0, str(ROOT / "tangle"))
import tangle  # noqa: E402

HARMLESS = "#+begin_src python :tangle first.py\nprint('first')\n#+end_src\n\n"


def book(target, extra="", body="x = 1"):
    """A book whose second block tangles into TARGET with header arguments EXTRA."""
    return (f"#+TITLE: An attack\n\n{HARMLESS}"
            f"#+begin_src python :tangle {target} {extra}\n{body}\n#+end_src\n")


def run(directory, *args):
    return subprocess.run([sys.executable, str(TANGLER), *args, "book.org"], cwd=directory,
                          capture_output=True, text=True, timeout=60)


def snapshot(directory):
    """Everything under DIRECTORY (links not followed): kind, bytes or link, mode."""
    tree = {}
    for path in sorted(Path(directory).rglob("*")):
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode):
            tree[str(path)] = ("link", os.readlink(path))
        elif path.is_dir():
            tree[str(path)] = ("dir", stat.S_IMODE(info.st_mode))
        else:
            tree[str(path)] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
    return tree


@pytest.fixture
def world(tmp_path):
    """A book directory and a directory outside it, with a file the attacker wants."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("canary-tangler-5e1f\n")
    os.chmod(outside / "secret.txt", 0o600)
    return tree, outside


def assert_refused(tree, outside, org, line, fragment, *args, prepare=None):
    (tree / "book.org").write_text(org)
    if prepare:
        prepare(tree, outside)
    before = snapshot(tree.parent)
    result = run(tree, *args)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"book.org:{line}:" in result.stderr and fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(tree.parent) == before, "a refused book changed the disk"


def link_directory(name, to):
    def prepare(tree, outside):
        target = outside if to == "outside" else tree / to
        target.mkdir(parents=True, exist_ok=True)
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, tree / name)
    return prepare


@pytest.mark.parametrize("target, extra, prepare", [
    ("src/evil.py", "", link_directory("src", "outside")),
    ("src/new/deep/evil.py", ":mkdirp yes", link_directory("src", "outside")),
    ("a/b/evil.py", ":mkdirp yes", link_directory("a/b", "outside")),
    ("src/evil.py", "", link_directory("src", "inside")),
    ("src/sub/evil.py", ":mkdirp yes", link_directory("src", "inside")),
], ids=["dir-link-out", "mkdirp-below-link", "deeper-link", "dir-link-in", "mkdirp-in"])
def test_no_write_through_a_directory_link(world, target, extra, prepare):
    tree, outside = world
    assert_refused(tree, outside, book(target, extra), 7, "is a symbolic link", prepare=prepare)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def link_file(name, to, content=None):
    def prepare(tree, outside):
        target = outside / "secret.txt" if to == "outside" else tree / to
        if content is not None:
            target.write_text(content)
        os.symlink(target, tree / name)
    return prepare


@pytest.mark.parametrize("extra, prepare", [
    ("", link_file("evil.py", "outside")),
    # The same bytes as the output: the old tangler only set the mode, through the link.
    (':shebang "#!/bin/sh"', link_file("evil.py", "outside", "#!/bin/sh\nx = 1\n")),
    (":tangle-mode (identity #o644)", link_file("evil.py", "outside", "x = 1\n")),
    ("", link_file("evil.py", "inside.py", "old\n")),
], ids=["to-secret", "same-bytes-chmod", "tangle-mode-chmod", "to-file-inside"])
def test_no_write_or_chmod_through_a_file_link(world, extra, prepare):
    tree, outside = world
    assert_refused(tree, outside, book("evil.py", extra), 7, "evil.py is a symbolic link",
                   prepare=prepare)
    assert stat.S_IMODE((outside / "secret.txt").stat().st_mode) in (0o600, 0o644)


@pytest.mark.parametrize("target", [
    ".git/hooks/pre-commit", ".git/config", ".GIT/hooks/pre-commit", ".Git/hooks/post-checkout",
    "vendor/lib/.git/hooks/pre-commit", "./.git/hooks/pre-commit",
    ".g\u200cit/hooks/pre-commit", ".git./hooks/pre-commit", ".git /config", "GIT~1/config",
    ".\u200dGiT/hooks/pre-commit",
])
def test_nothing_into_git(world, target):
    tree, outside = world
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    assert_refused(tree, outside, book(target, ':mkdirp yes :shebang "#!/bin/sh"'), 7,
                   "inside .git")
    assert not (tree / ".git" / "hooks" / "pre-commit").exists()


@pytest.mark.parametrize("mode", ["4755", "2755", "1755", "6777", "777", "666", "0646"])
def test_special_modes_need_the_flag(world, mode):
    tree, outside = world
    org = book("evil.py", f":tangle-mode (identity #o{mode})")
    assert_refused(tree, outside, org, 7, "--allow-special-modes")
    result = run(tree, "--allow-special-modes")
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE((tree / "evil.py").stat().st_mode) == int(mode, 8)


def test_the_flag_is_in_help():
    result = subprocess.run([sys.executable, str(TANGLER), "--help"], capture_output=True,
                            text=True, timeout=60)
    assert "--allow-special-modes" in result.stdout and "setuid" in result.stdout


def test_plain_modes_are_still_accepted(world):
    tree, _ = world
    (tree / "book.org").write_text(book("run.sh", ":tangle-mode (identity #o750)"))
    assert run(tree).returncode == 0
    assert stat.S_IMODE((tree / "run.sh").stat().st_mode) == 0o750


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_no_write_into_a_file_with_another_name(world, where):
    tree, outside = world
    other = (outside if where == "outside" else tree) / "other-name.py"

    def prepare(tree, outside):
        (tree / "evil.py").write_text("x = 1\n")
        os.link(tree / "evil.py", other)
        os.chmod(other, 0o644)
    assert_refused(tree, outside, book("evil.py", ":tangle-mode (identity #o755)",
                                       body="y = 2"), 7, "hard links", prepare=prepare)
    assert other.read_text() == "x = 1\n"


@pytest.mark.parametrize("target", ["../evil.py", "/tmp/evil-tangle.py", "a/../../evil.py",
                                    "~/evil.py", '"./../evil.py"', "a//b.py"])
def test_no_path_out_of_the_tree(world, target):
    tree, outside = world
    assert_refused(tree, outside, book(target, ":mkdirp yes"), 7, "plain path inside")
    assert not Path("/tmp/evil-tangle.py").exists()


@pytest.mark.parametrize("shape", ["lines", "one-line", "three-way"])
def test_noweb_that_doubles_is_refused_quickly(world, shape):
    tree, outside = world
    text = ["#+TITLE: bomb\n", HARMLESS, "#+NAME: l0\n#+begin_src python\nx = 1\n#+end_src\n"]
    for k in range(1, 31):
        refs = {"lines": f"<<l{k - 1}>>\n<<l{k - 1}>>", "one-line": f"<<l{k - 1}>> <<l{k - 1}>>",
                "three-way": f"<<l{k - 1}>>\n<<l{k - 1}>>\n<<l{k - 1}>>"}[shape]
        text.append(f"#+NAME: l{k}\n#+begin_src python :noweb yes\n{refs}\n#+end_src\n")
    text.append("#+begin_src python :tangle out.py :noweb yes\n<<l30>>\n#+end_src\n")
    start = time.monotonic()
    (tree / "book.org").write_text("\n".join(text))
    result = run(tree)
    assert time.monotonic() - start < 30
    assert result.returncode == 1 and "noweb expansion passes" in result.stderr, result.stderr
    assert sorted(p.name for p in tree.iterdir()) == ["book.org"]


def tangled(tree):
    (tree / "book.org").write_text(book("src/mod.py", ":mkdirp yes"))
    assert run(tree).returncode == 0


def replace_tangled(tree, outside, swap):
    """Put a link where the tangled src/mod.py was, or where its directory was."""
    if swap == "file-to-secret":
        (tree / "src" / "mod.py").unlink()
        os.symlink(outside / "secret.txt", tree / "src" / "mod.py")
    elif swap == "file-to-inside":
        (tree / "notes.txt").write_text("canary-tangler-5e1f\n")
        (tree / "src" / "mod.py").unlink()
        os.symlink(tree / "notes.txt", tree / "src" / "mod.py")
    else:
        (outside / "mod.py").write_text("canary-tangler-5e1f\n")
        os.rename(tree / "src", tree / "src-old")
        os.symlink(outside, tree / "src")


@pytest.mark.parametrize("swap", ["file-to-secret", "file-to-inside", "directory-to-outside"])
def test_detangle_does_not_follow_a_replaced_file(world, swap):
    tree, outside = world
    tangled(tree)
    replace_tangled(tree, outside, swap)
    before = snapshot(tree.parent)
    result = run(tree, "--detangle")
    assert result.returncode == 1 and "symbolic link" in result.stderr, result.stderr
    assert "book.org:7:" in result.stderr
    assert snapshot(tree.parent) == before
    assert "canary" not in (tree / "book.org").read_text()


def test_detangle_refuses_a_hard_linked_file(world):
    tree, outside = world
    tangled(tree)
    (tree / "src" / "mod.py").unlink()
    os.link(outside / "secret.txt", tree / "src" / "mod.py")
    result = run(tree, "--detangle")
    assert result.returncode == 1 and "hard links" in result.stderr, result.stderr
    assert "canary" not in (tree / "book.org").read_text()


def swap_after_check(monkeypatch, swap):
    """Make the world change right after the checks: a link where a directory was checked."""
    checked = tangle.check_writable

    def then_swap(book, files):
        checked(book, files)
        swap()
    monkeypatch.setattr(tangle, "check_writable", then_swap)


def test_a_directory_swapped_for_a_link_after_the_check(world, monkeypatch):
    tree, outside = world
    (tree / "src").mkdir()
    (tree / "book.org").write_text(book("src/evil.py"))

    def swap():
        (tree / "src").rmdir()
        os.symlink(outside, tree / "src")
    swap_after_check(monkeypatch, swap)
    book_ = tangle.open_book(str(tree / "book.org"))
    with pytest.raises(OSError):
        tangle.write_outputs(book_, tangle.tangle_book(book_))
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_target_swapped_for_a_link_after_the_check(world, monkeypatch):
    tree, outside = world
    (tree / "book.org").write_text(book("evil.py", ":tangle-mode (identity #o755)"))

    def swap():
        os.symlink(outside / "secret.txt", tree / "evil.py")
    swap_after_check(monkeypatch, swap)
    book_ = tangle.open_book(str(tree / "book.org"))
    tangle.write_outputs(book_, tangle.tangle_book(book_))
    # The rename replaced the link; the secret behind it kept its bytes and its mode.
    assert not (tree / "evil.py").is_symlink()
    assert (outside / "secret.txt").read_text() == "canary-tangler-5e1f\n"
    assert stat.S_IMODE((outside / "secret.txt").stat().st_mode) == 0o600


@pytest.mark.parametrize("swap", ["file-to-secret", "file-to-inside", "directory-to-outside"])
def test_check_does_not_print_what_a_link_points_to(world, swap):
    tree, outside = world
    tangled(tree)
    replace_tangled(tree, outside, swap)
    result = run(tree, "--check")
    assert result.returncode == 1 and "unsafe: book.org:7:" in result.stdout, result.stdout
    assert "canary" not in result.stdout + result.stderr


@pytest.mark.parametrize("args", [(), ("--check",), ("--detangle",)])
def test_a_fifo_at_a_target_neither_hangs_nor_is_written(world, args):
    tree, outside = world
    tangled(tree)
    (tree / "src" / "mod.py").unlink()
    os.mkfifo(tree / "src" / "mod.py")
    result = run(tree, *args)
    assert result.returncode == 1 and "not a plain file" in result.stdout + result.stderr
    assert stat.S_ISFIFO((tree / "src" / "mod.py").lstat().st_mode)
