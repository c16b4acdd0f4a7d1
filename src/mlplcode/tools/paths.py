"""Paths: which paths inside the root the tools may use, and the real path each one names."""
import contextlib
import fnmatch
import os
import re

import pathspec

from ..trust import inside, is_invisible, visible
from . import PathRefused

# Matched case-insensitively against every component of a path.
SECRET_NAME_PATTERNS = (
    ".env", ".env.*", "id_rsa", "id_ed25519", "*.pem", "*.key", "*.p12", "*.pfx",
    ".npmrc", ".pypirc", ".netrc", "credentials*.json", "secrets.y*ml",
)


def is_secret_name(name: str) -> bool:
    """Say whether a file or directory name looks like it holds keys or credentials.

    Case and trailing dots and spaces are ignored: .ENV and ".env." are as secret
    as .env, and some file systems agree.
    """
    folded = name.casefold().rstrip(" .")
    return any(fnmatch.fnmatchcase(folded, pattern) for pattern in SECRET_NAME_PATTERNS)

def load_ignore_rules(root: str, name: str) -> pathspec.PathSpec:
    """Read the gitignore-style rules of a file at the root; no file means no rules.

    Refuses a file that is not UTF-8 or holds an invalid pattern rather than
    skipping it, since a dropped rule would show what the user meant to hide.
    """
    try:
        with open(os.path.join(root, name), encoding="utf-8") as rules:
            return pathspec.GitIgnoreSpec.from_lines(rules)
    except FileNotFoundError:
        return pathspec.GitIgnoreSpec.from_lines([])
    except ValueError as problem:  # UnicodeDecodeError is a ValueError too
        raise PathRefused(f"{name}: cannot be parsed ({problem}); fix or delete it") from None

def ignore_rules(project, name: str) -> pathspec.PathSpec:
    """The rules of the rules file NAME in PROJECT; refuses a file that could not be parsed."""
    if name in project.broken:
        raise PathRefused(project.broken[name])
    return project.ignore[name]

def denial_reason(relative: str, mlplcodeignore: pathspec.PathSpec) -> str | None:
    """Say why a path relative to the root is off limits, or None when it is not.

    Every component is checked, so a .git or secret directory hides all it holds.
    `relative` uses / and ends with / for a directory, as gitignore rules expect.
    """
    for part in relative.rstrip("/").split("/"):
        if part.casefold() == ".git":
            return ".git is protected; use RUN git status or git diff to look at the repository"
        if is_secret_name(part):
            return f"{part} may hold secrets, so tools never touch it; work without it"
    if mlplcodeignore.match_file(relative):
        return "excluded by .mlplcodeignore; work without it"
    return None

PATH_MAX_CHARS = 1024
DRIVE = re.compile(r"^[A-Za-z]:")


def spelling_problem(path: str) -> str | None:
    """Say what is wrong with how a path is written, before the file system is asked."""
    if not path or "\0" in path:
        return "not a usable path"
    if len(path) > PATH_MAX_CHARS:
        return f"longer than {PATH_MAX_CHARS} characters"
    if any(is_invisible(char) for char in path):
        return "holds control or invisible characters; write the path in plain text"
    if os.path.isabs(path) or DRIVE.match(path) or path.startswith("\\\\"):
        return "absolute paths are refused (drive and UNC forms too)"
    if "\\" in path:
        return "holds a backslash; separate directories with /"
    return None

def resolve_path(project, path: str) -> str:
    """Turn a path from the model into the real absolute path it names inside the root.

    Symlinks are resolved before any rule is applied, so a link can neither lead
    out of the root nor give a harmless name to a protected file. The path as
    written is judged too: a denial of either spelling wins. Refuses what
    spelling_problem finds, paths that leave the root, and paths that
    denial_reason denies.
    """
    problem = spelling_problem(path)
    if problem:
        raise PathRefused(f"{visible(path[:PATH_MAX_CHARS])!r}: {problem};"
                          " give a path relative to the project root")
    target = os.path.realpath(os.path.join(project.root, path))
    if os.path.commonpath([project.root, target]) != project.root:
        raise PathRefused(f"{path}: leaves the project root; use a path inside the project")
    mlplcodeignore = ignore_rules(project, ".mlplcodeignore")
    written = os.path.normpath(path).replace(os.sep, "/")
    relative = os.path.relpath(target, project.root).replace(os.sep, "/")
    for spelling in (written, relative):
        reason = denial_reason(spelling, mlplcodeignore)
        if reason:
            raise PathRefused(f"{path}: {reason}")
    return target

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_directory(path: str, make_below: str | None = None) -> int:
    """A descriptor of the directory at PATH, a real absolute path, reached one component at
    a time from / without following a symlink; missing directories below MAKE_BELOW (the
    root) are made on the way. Raises OSError when a component is a link or not a directory.
    """
    descriptor, reached = os.open("/", DIRECTORY_FLAGS), "/"
    try:
        for part in filter(None, path.split("/")):
            reached = os.path.join(reached, part)
            if make_below and reached != make_below and inside(reached, make_below):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=descriptor)
            following = os.open(part, DIRECTORY_FLAGS, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = following
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor
