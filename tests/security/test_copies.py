"""Copies of a project: every place mlplcode copies a tree (the kernel's %root --copy, a fork's
branch, the demo, the scratch copy of the tests as they were, an evaluation's task) copies links
as links and reads no special file, so READ and SEARCH refuse in the copy what they refuse in the
project, and no copy hangs. Run as root here, which may make devices and hard links anywhere."""
import json
import os
import resource
import shutil
import signal
import socket
import stat
import tempfile
import threading
import types

import pytest

from mlplcode import Agent, cli
from mlplcode.branch import fork
from mlplcode.eval import load_task, pack, unpack
from mlplcode.kernel import MlplcodeKernel
from mlplcode.tools.project import open_project
from mlplcode.tools.read import copy_tree
from mlplcode.verbs import execute
from mlplcode.verify import copy_project

SECRET = "canary-copies-5d1e9b7a3c2f"
HANG_SECONDS = 60
# A copy that reads /dev/zero would fill the disk: while a copy runs, a file may not pass this.
FILE_LIMIT_BYTES = 16 * 1024 * 1024


def shadow_line():
    """The first line of /etc/shadow, which only root reads: what must never show."""
    with open("/etc/shadow") as file:
        return file.readline().strip()


# Each variant plants something in the project and names the paths a READ tries in the copy.
def file_link_out(project, outside):
    os.symlink(outside / "secret.txt", project / "notes.txt")
    return ["notes.txt"]


def directory_link_out(project, outside):
    os.symlink(outside / "dir", project / "docs")
    return ["docs/inner.txt"]


def link_to_shadow(project, outside):
    os.symlink("/etc/shadow", project / "shadow.txt")
    return ["shadow.txt"]


def relative_link_up(project, outside):
    # Enough ../ to reach / from wherever the copy lies, then the secret's absolute path.
    os.symlink("../" * 40 + str(outside / "secret.txt").lstrip("/"), project / "up.txt")
    os.symlink(os.path.relpath(outside / "secret.txt", project), project / "sibling.txt")
    return ["up.txt", "sibling.txt"]


def link_in_a_subdirectory(project, outside):
    (project / "pkg" / "deep").mkdir(parents=True)
    os.symlink("../../" * 20 + str(outside / "secret.txt").lstrip("/"), project / "pkg" / "deep" / "a.txt")
    os.symlink(outside / "dir", project / "pkg" / "data")
    return ["pkg/deep/a.txt", "pkg/data/inner.txt"]


def hard_link(project, outside):
    os.link(outside / "secret.txt", project / "hard.txt")
    return ["hard.txt"]


def fifo(project, outside):
    os.mkfifo(project / "pipe")
    os.mkfifo(project / "pipe.py")
    return ["pipe", "pipe.py"]


def device(project, outside):
    os.mknod(project / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero: never ends
    os.mknod(project / "secret-disk", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    return ["zero", "secret-disk"]


def unix_socket(project, outside):
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(project / "s"))
    return ["s"]


def link_loops(project, outside):
    os.symlink("b", project / "a")
    os.symlink("a", project / "b")
    (project / "sub").mkdir()
    os.symlink("..", project / "sub" / "up")  # a walk that followed it would never end
    return ["a", "sub/up/calc.py"]


VARIANTS = [file_link_out, directory_link_out, link_to_shadow, relative_link_up, link_in_a_subdirectory,
            hard_link, fifo, device, unix_socket, link_loops]


@pytest.fixture
def world(project, tmp_path):
    """The example project, with a secret file and directory beside it."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "secret.txt").write_text(SECRET + "\n")
    (outside / "dir" / "inner.txt").write_text(SECRET + "\n")
    project = tmp_path / "add"
    (project / "lib").mkdir()
    os.symlink("../calc.py", project / "lib" / "alias.py")  # a link that stays inside works in the copy
    return project, outside


# Each entry point copies PROJECT and calls SEE(copy) on the copy while it exists; SEE returns
# what the checks found, or None when the entry point refused the project as a whole.
def through_copy_tree(project, tmp_path, see):
    target = tmp_path / "copies" / "add"
    copy_tree(str(project), str(target))
    return see(str(target))


def through_the_kernel(project, tmp_path, see, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the kernel's copy outlives it
    said, kernel = [], types.SimpleNamespace(settings={})
    kernel.say = said.append
    MlplcodeKernel.command_root(kernel, f"--copy {project}")
    assert kernel.settings["root"] != os.path.realpath(project)
    return see(kernel.settings["root"])


def through_a_fork(project, tmp_path, see):
    script = tmp_path / "replies.json"
    script.write_text(json.dumps(["READ calc.py", "DONE read it"]))
    journal = str(tmp_path / "parent.jsonl")
    Agent.start("Read calc.py", str(project), f"scripted:{script}", journal=journal).drive(lambda a: (True, ""))
    _, copy, _ = fork(journal, 1)
    return see(copy)


def through_the_demo(project, tmp_path, see, monkeypatch):
    examples = tmp_path / "examples"
    examples.mkdir()
    os.symlink(project, examples / "add")  # the demo's examples/add is the hostile project
    (examples / "add.journal.jsonl").write_text("")
    found = []
    monkeypatch.setattr(cli, "EXAMPLES", str(examples))
    monkeypatch.setattr(cli, "replay", lambda journal, root, *rest, **named: found.append(see(root)) or (0, [], []))
    assert cli.command_demo(None) == 0
    return found[0]


def through_the_tests_as_they_were(project, tmp_path, see):
    target = tmp_path / "verify" / "add"
    target.parent.mkdir()
    copy_project(str(project), str(target))
    return see(str(target))


def through_an_evaluation(project, tmp_path, see):
    task = tmp_path / "task"
    shutil.copytree(os.path.join(cli.EXAMPLES, "tasks", "add-function"), task, symlinks=True)
    shutil.rmtree(task / "project")
    os.rename(project, task / "project")  # what the trial copies is the hostile project
    try:
        load_task(str(task))
    except ValueError:
        return None
    unpack(pack(str(task), leave_out=("check",)), str(tmp_path / "trial"))
    return see(str(tmp_path / "trial" / "project"))


ENTRY_POINTS = [through_copy_tree, through_the_kernel, through_a_fork, through_the_demo,
                through_the_tests_as_they_were, through_an_evaluation]
NEED_MONKEYPATCH = (through_the_kernel, through_the_demo)


def in_time(call):
    """CALL's result, or a failure if it does not return within HANG_SECONDS (a FIFO read hangs);
    no file written meanwhile may grow past FILE_LIMIT_BYTES (a device read never ends)."""
    outcome, limits = {}, resource.getrlimit(resource.RLIMIT_FSIZE)
    thread = threading.Thread(target=lambda: outcome.update(value=call()), daemon=True)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT_BYTES, limits[1]))
    try:
        thread.start()
        thread.join(HANG_SECONDS)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert not thread.is_alive(), "the copy hangs"
    assert "value" in outcome, "the copy raised"
    return outcome["value"]


def seen(paths):
    """A SEE that READs each of PATHS in the copy, searches it for the secret, and READs the link
    that stays inside."""
    def see(root):
        project = open_project(root)
        reads = [execute({"tool": "read", "path": path}, project) for path in paths]
        search = execute({"tool": "search", "query": SECRET[:20]}, project)  # its echo is not SECRET
        alias = execute({"tool": "read", "path": "lib/alias.py"}, project)
        return reads, search, alias
    return see


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.__name__)
@pytest.mark.parametrize("entry", ENTRY_POINTS, ids=lambda entry: entry.__name__)
def test_a_copy_refuses_what_the_project_refuses(world, tmp_path, monkeypatch, entry, variant):
    project, outside = world
    try:
        paths = variant(project, outside)
    except PermissionError:
        pytest.skip("making this file needs root")
    for path in paths:  # the attack is real: the project itself refuses each path
        result = execute({"tool": "read", "path": path}, open_project(str(project)))
        assert not result["ok"] or SECRET not in result["text"]
    arguments = (project, tmp_path, seen(paths)) + ((monkeypatch,) if entry in NEED_MONKEYPATCH else ())
    found = in_time(lambda: entry(*arguments))
    if found is None:
        assert entry is through_an_evaluation  # the task was refused as a whole
        return
    reads, search, alias = found
    hidden = [SECRET, shadow_line()]
    for path, result in zip(paths, reads):
        assert not result["ok"] or not any(text in result["text"] for text in hidden), path
    assert SECRET not in search["text"]
    assert alias["ok"] and "def add" in alias["text"]


def test_a_root_given_as_a_link_copies_the_directory_and_a_link_leading_into_it(world, tmp_path):
    project, outside = world
    os.symlink(project / "calc.py", project / "absolute.py")  # absolute, into the project
    os.symlink(project, tmp_path / "named")
    left_out = copy_tree(str(tmp_path / "named"), str(tmp_path / "copy"))
    assert left_out == [] and not os.path.islink(tmp_path / "copy")
    assert os.readlink(tmp_path / "copy" / "absolute.py") == str(tmp_path / "copy" / "calc.py")
    assert os.readlink(tmp_path / "copy" / "lib" / "alias.py") == "../calc.py"  # relative, kept


def test_the_copy_names_what_it_left_out_and_keeps_hard_links_inside_as_hard_links(world, tmp_path):
    project, outside = world
    os.mkfifo(project / "pipe")
    os.link(outside / "secret.txt", project / "hard.txt")
    os.link(project / "calc.py", project / "calc2.py")
    left_out = copy_tree(str(project), str(tmp_path / "copy"))
    assert left_out == ["hard.txt: a file with a hard link outside the tree, left out", "pipe: a FIFO, left out"]
    copied = os.stat(tmp_path / "copy" / "calc.py")
    assert copied.st_nlink == 2 and copied.st_ino == os.stat(tmp_path / "copy" / "calc2.py").st_ino
    assert copied.st_ino != os.stat(project / "calc.py").st_ino


def test_the_kernel_says_what_its_copy_left_out(world, tmp_path, monkeypatch):
    project, outside = world
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    os.mkfifo(project / "pipe")
    said, kernel = [], types.SimpleNamespace(settings={})
    kernel.say = said.append
    MlplcodeKernel.command_root(kernel, f"--copy {project}")
    assert said == [f"root: {kernel.settings['root']} (a fresh copy)\nleft out of the copy: pipe: a FIFO, left out"]
