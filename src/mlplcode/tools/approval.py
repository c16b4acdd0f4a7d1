"""What an approval is bound to besides the action's text: the state of its target."""

import hashlib
import os
import shlex
import stat

from ..trust import find_program
from .paths import open_directory
from .read import READ_CAP_BYTES, kind_of

def file_target(action: dict, project) -> dict:
    """The file ACTION's path leads to now: where it really is, whether the path is a
    link, and the kind, size, link count and SHA-256 of what is there."""
    written = os.path.join(project.root, action["path"])
    real = os.path.realpath(written)
    target = {
        "path": os.path.relpath(real, project.root),
        "link": os.path.islink(written),
    }
    try:
        info = os.lstat(real)
    except OSError:
        return {**target, "exists": False}
    target.update(
        kind=kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else "file",
        size=info.st_size,
        links=info.st_nlink,
    )
    if stat.S_ISREG(info.st_mode):
        target["sha256"] = content_hash(real)
    return target


def content_hash(path: str) -> str | None:
    """The SHA-256 of the file at PATH as far as the read cap and a byte, or None when
    it cannot be opened without following a link."""
    try:
        directory = open_directory(os.path.dirname(path))
        try:
            descriptor = os.open(
                os.path.basename(path),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=directory,
            )
        finally:
            os.close(directory)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as file:
        return hashlib.sha256(file.read(READ_CAP_BYTES + 1)).hexdigest()

def command_target(action: dict, project) -> dict:
    """ACTION's command as words, and whether it would run in the sandbox now."""
    return {
        "argv": shlex.split(action["command"]),
        "sandboxed": find_program("bwrap", project.root) is not None,
    }
