"""What an approval is bound to besides the action's text: the state of its target."""
import hashlib
import os
import shlex
import stat

from ..trust import find_program
from .read import READ_CAP_BYTES, kind_of

def file_target(action: dict, project) -> dict:
    """The file ACTION's path leads to now: where it really is, whether the path is a link,
    and the kind, size, link count and SHA-256 of what is there."""
    written = os.path.join(project.root, action["path"])
    real = os.path.realpath(written)
    target = {"path": os.path.relpath(real, project.root), "link": os.path.islink(written)}
    try:
        info = os.lstat(real)
    except OSError:
        return {**target, "exists": False}
    target.update(kind=kind_of(info.st_mode) if not stat.S_ISREG(info.st_mode) else "file",
                  size=info.st_size, links=info.st_nlink)
    if stat.S_ISREG(info.st_mode):
        with open(real, "rb") as file:
            target["sha256"] = hashlib.sha256(file.read(READ_CAP_BYTES + 1)).hexdigest()
    return target

def command_target(action: dict, project) -> dict:
    """ACTION's command as words, and whether it would run in the sandbox now."""
    return {"argv": shlex.split(action["command"]), "sandboxed": find_program("bwrap", project.root) is not None}
