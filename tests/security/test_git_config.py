"""Every settings file git reads for a repository, attacked: a filter that a setting names and
.gitattributes turns on, with an fsmonitor, an external diff, a diff driver and a pager beside
it, planted in .git/config, .git/config.worktree, a file an include names, a linked worktree's
own settings or its common directory's, a separate git directory, a .git or a settings file
that is a link, a submodule's settings, the environment, and the system's and user's settings.
Each writes a marker in the project when git runs it (where a sandboxed program may write);
RUN git status and git diff, in the sandbox and without it, and the git that mlplcode itself
runs when it opens the project, must never run it."""
import os
import subprocess

import pytest

from conftest import require_tool
from mlplcode import trust
from mlplcode.tools import project as project_module
from mlplcode.tools.project import open_project
from mlplcode.verbs import execute


def git(directory, *arguments, check=True):
    return subprocess.run(["git", "-C", str(directory), "-c", "user.name=t", "-c", "user.email=t@x",
                           "-c", "protocol.file.allow=always", *arguments],
                          check=check, capture_output=True, text=True)


def evil(marker):
    """Settings that run a program, each of which writes MARKER: a filter's (then passing the file
    through), an fsmonitor, an external diff, a diff driver's and a pager."""
    return {"filter.evil.clean": f"touch {marker}; cat", "filter.evil.smudge": f"touch {marker}; cat",
            "filter.evil.process": f"touch {marker}", "core.fsmonitor": f"touch {marker}",
            "diff.external": f"touch {marker}", "diff.evil.textconv": f"touch {marker}; cat",
            "diff.evil.command": f"touch {marker}", "core.pager": f"touch {marker}; cat"}


def committed(directory):
    """A repository in DIRECTORY with a.txt committed and then changed (same size), so that git
    status must read it through its filter."""
    git(directory, "init", "-q")
    (directory / "a.txt").write_text("one\n")
    git(directory, "add", "a.txt")
    git(directory, "commit", "-qm", "a")
    (directory / "a.txt").write_text("two\n")
    (directory / ".gitattributes").write_text("* filter=evil diff=evil\n")


def set_all(directory, settings, *where):
    for name, value in settings.items():
        git(directory, "config", *where, name, value)


# Each variant makes the project at ROOT a repository whose settings, somewhere git reads them,
# name the filter; OUTSIDE is a directory beside the project.
def in_config(root, outside, marker):
    committed(root)
    set_all(root, evil(marker))


def in_config_worktree(root, outside, marker):
    committed(root)
    git(root, "config", "extensions.worktreeConfig", "true")
    set_all(root, evil(marker), "--worktree")


def include_from_config_worktree(root, outside, marker):
    committed(root)
    git(root, "config", "extensions.worktreeConfig", "true")
    set_all(root, evil(marker), "--file", str(root / "settings.cfg"))
    git(root, "config", "--worktree", "include.path", str(root / "settings.cfg"))


def include_if_from_config(root, outside, marker):
    committed(root)
    set_all(root, evil(marker), "--file", str(outside / "settings.cfg"))
    git(root, "config", "includeIf.gitdir:/.path", str(outside / "settings.cfg"))


def worktree_of_main(root, outside):
    """ROOT made a linked work tree of a repository outside, main; give main."""
    main = outside / "main"
    main.mkdir()
    committed(main)
    git(main, "add", ".gitattributes")
    git(main, "commit", "-qm", "attributes")
    git(main, "worktree", "add", "-q", str(root))
    (root / "a.txt").write_text("six\n")
    return main


def linked_worktree(root, outside, marker):
    main = worktree_of_main(root, outside)
    git(main, "config", "extensions.worktreeConfig", "true")
    set_all(root, evil(marker), "--worktree")  # main/.git/worktrees/<id>/config.worktree


def linked_worktree_common_config(root, outside, marker):
    main = worktree_of_main(root, outside)
    set_all(main, evil(marker))  # main/.git/config, the common directory's


def separate_git_directory(root, outside, marker):
    (root / "a.txt").write_text("one\n")
    git(root, "init", "-q", "--separate-git-dir", str(outside / "elsewhere.git"))
    git(root, "add", "a.txt")
    git(root, "commit", "-qm", "a")
    (root / "a.txt").write_text("two\n")
    (root / ".gitattributes").write_text("* filter=evil diff=evil\n")
    set_all(outside / "elsewhere.git", evil(marker), "--file", str(outside / "elsewhere.git" / "config"))


def hooks(root, outside, marker):
    committed(root)
    for directory in (root / ".git" / "hooks", root / "hooks"):
        directory.mkdir(exist_ok=True)
        (directory / "post-index-change").write_text(f"#!/bin/sh\ntouch {marker}\n")
        os.chmod(directory / "post-index-change", 0o755)
    git(root, "config", "extensions.worktreeConfig", "true")
    git(root, "config", "--worktree", "core.hooksPath", str(root / "hooks"))


def git_directory_through_a_link(root, outside, marker):
    committed(root)
    os.rename(root / ".git", outside / "real.git")
    os.symlink(outside / "real.git", root / ".git")
    set_all(root, evil(marker))  # outside/real.git/config, read through the link


def settings_file_through_a_link(root, outside, marker):
    committed(root)
    git(root, "config", "extensions.worktreeConfig", "true")
    set_all(root, evil(marker), "--file", str(outside / "settings.cfg"))
    os.symlink(outside / "settings.cfg", root / ".git" / "config.worktree")


def submodule(root, outside, marker):
    source = outside / "source"
    source.mkdir()
    committed(source)
    git(source, "checkout", "-q", "a.txt")
    git(root, "init", "-q")
    git(root, "submodule", "add", "-q", str(source), "sub")
    git(root, "commit", "-qm", "sub")
    (root / "sub" / "a.txt").write_text("two\n")
    (root / "sub" / ".gitattributes").write_text("* filter=evil diff=evil\n")
    set_all(root / "sub", evil(marker))  # root/.git/modules/sub/config


def in_the_environment(root, outside, marker, monkeypatch):
    committed(root)
    for index, (name, value) in enumerate(evil(marker).items()):
        monkeypatch.setenv(f"GIT_CONFIG_KEY_{index}", name)
        monkeypatch.setenv(f"GIT_CONFIG_VALUE_{index}", value)
    monkeypatch.setenv("GIT_CONFIG_COUNT", str(len(evil(marker))))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", " ".join(f"'{name}={value}'"
                                                         for name, value in evil(marker).items()))


def system_and_global(root, outside, marker, monkeypatch):
    committed(root)
    for name in ("system.cfg", "global.cfg"):
        set_all(root, evil(marker), "--file", str(outside / name))
    monkeypatch.delenv("GIT_CONFIG_NOSYSTEM", raising=False)
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(outside / "system.cfg"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(outside / "global.cfg"))
    monkeypatch.setenv("GIT_CONFIG", str(outside / "global.cfg"))


VARIANTS = [in_config, in_config_worktree, include_from_config_worktree, include_if_from_config,
            linked_worktree, linked_worktree_common_config, separate_git_directory,
            git_directory_through_a_link, settings_file_through_a_link, hooks, submodule,
            in_the_environment, system_and_global]
FROM_THE_ENVIRONMENT = (in_the_environment, system_and_global)


@pytest.fixture
def world(tmp_path, monkeypatch, request):
    """The project and a directory beside it, and the marker a filter would write: in the project,
    where a sandboxed program may write too."""
    require_tool("git", "git's settings files")
    root, outside = tmp_path / "project", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    return root, outside, root / "filter-ran"


@pytest.fixture(params=["sandboxed", "unsandboxed"])
def mode(request, monkeypatch):
    if request.param == "sandboxed":
        require_tool("bwrap", "RUN git inside bubblewrap")
    else:
        real = trust.find_program
        monkeypatch.setattr(project_module, "find_program",
                            lambda name, root: None if name == "bwrap" else real(name, root))
    return request.param


def plant(variant, world, monkeypatch):
    root, outside, marker = world
    if variant in FROM_THE_ENVIRONMENT:
        variant(root, outside, marker, monkeypatch)
    else:
        variant(root, outside, marker)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.__name__)
def test_the_attack_is_real_for_a_plain_git(world, monkeypatch, variant):
    """Each planted setting does make a plain git status run the filter."""
    root, outside, marker = world
    plant(variant, world, monkeypatch)
    subprocess.run(["git", "-C", str(root), "status"], capture_output=True, env=dict(os.environ))
    assert marker.exists()


@pytest.mark.parametrize("command", ["git status", "git diff", "git status --short sub", "git diff HEAD"])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.__name__)
def test_run_git_never_runs_a_program_that_a_setting_names(world, monkeypatch, mode, variant, command):
    root, outside, marker = world
    if command.endswith("sub") and variant is not submodule:
        return
    plant(variant, world, monkeypatch)
    assert not marker.exists()
    result = execute({"tool": "run", "command": command}, open_project(str(root)))
    assert not marker.exists(), result["text"]
    assert result["ok"] is False or result["kind"] == "git"


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda variant: variant.__name__)
def test_the_git_that_mlplcode_runs_when_it_opens_the_project_runs_no_such_program(world, monkeypatch,
                                                                                   variant):
    root, outside, marker = world
    plant(variant, world, monkeypatch)
    assert not marker.exists()
    open_project(str(root))  # reads the history of the secret files: git log, ls-files, cat-file
    assert not marker.exists()


@pytest.mark.parametrize("variant, file", [
    (in_config_worktree, "project/.git/config.worktree"),
    (include_from_config_worktree, "project/.git/config.worktree"),
    (linked_worktree, "outside/main/.git/worktrees/project/config.worktree"),
    (submodule, "project/.git/modules/sub/config"),
])
def test_the_refusal_names_the_setting_and_the_file_it_is_in(world, monkeypatch, mode, variant, file):
    root, outside, marker = world
    plant(variant, world, monkeypatch)
    result = execute({"tool": "run", "command": "git status"}, open_project(str(root)))
    assert result["ok"] is False and "RUN git is refused in this repository" in result["text"]
    assert f" in {os.path.join(os.path.dirname(root), file)}" in result["text"]


def test_an_ordinary_repository_with_a_worktree_file_still_runs_git_status(world, mode):
    root, outside, marker = world
    committed(root)
    git(root, "config", "extensions.worktreeConfig", "true")
    git(root, "config", "--worktree", "core.ignoreCase", "false")
    git(root, "config", "remote.origin.url", "https://example.invalid/x.git")
    result = execute({"tool": "run", "command": "git status --short"}, open_project(str(root)))
    assert result["ok"] and result["exit_code"] == 0 and " M a.txt" in result["text"]


@pytest.mark.parametrize("settings", [
    '[diff "x y"]\n\ttextconv = touch {marker}\n',
    '[submodule "a b"]\n\tupdate = !touch {marker}\n',
    '[remote "o p"]\n\tuploadpack = touch {marker}\n',
    '[filter "e"]\n\tclean = touch {marker}\n[broken\n',
])
def test_a_setting_whose_name_holds_a_space_or_a_file_git_cannot_read_refuses_run_git(world, mode, settings):
    root, outside, marker = world
    committed(root)
    git(root, "config", "extensions.worktreeConfig", "true")
    (root / ".git" / "config.worktree").write_text(settings.format(marker=marker))
    result = execute({"tool": "run", "command": "git status"}, open_project(str(root)))
    assert result["ok"] is False and "RUN git is refused" in result["text"]
    assert not marker.exists()
