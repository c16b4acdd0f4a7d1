"""Reading: text files of modest size, opened without following a link, and copies of
a tree."""

import collections
import os
import shutil
import stat

from ..trust import inside
from . import PathRefused, observation
from .paths import open_directory, resolve_path

def count_lines(text: str) -> int:
    """Count lines as editors and PATCH number them: a last line without a newline
    counts."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)

READ_CAP_BYTES = 256 * 1024
BINARY_SNIFF_BYTES = 8 * 1024


def decode_text(data: bytes) -> str | None:
    """Decode file bytes as UTF-8 text, or give None for a file that is not text.

    A NUL byte in the first 8 KiB is the usual mark of a binary file; bytes that
    are not UTF-8 could not be shown or patched faithfully either.
    """
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None

def kind_of(mode: int) -> str:
    """Name the kind of a file that is not a regular file, for a refusal."""
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "a device"


def check_regular(info: os.stat_result, shown: str) -> None:
    """Refuse all but a regular file with one name: a FIFO blocks, a device never ends,
    and a second hard link may be a name for a file outside the project."""
    if not stat.S_ISREG(info.st_mode):
        raise PathRefused(
            f"{shown}: is {kind_of(info.st_mode)}, not a regular file;"
            " the tools take text files"
        )
    if info.st_nlink > 1:
        raise PathRefused(
            f"{shown}: has {info.st_nlink} hard links, and another name may lie"
            " outside the project; the tools refuse it"
        )

def read_bytes(path: str, shown: str) -> bytes:
    """Read a resolved file whole, after checking that it is a regular file of modest
    size.

    The file and every directory on its way are opened without following a symlink,
    the file without blocking, and the checks are repeated on what was opened, so a
    file or directory swapped after resolve_path is refused, not read.
    """
    missing = PathRefused(f"{shown}: no such file; use SEARCH to find the right path")
    changed = PathRefused(f"{shown}: changed while it was being opened; try again")
    try:
        directory = open_directory(os.path.dirname(path))
    except OSError:
        # A directory on the way is missing, or is now a link: it was judged real.
        moved = os.path.realpath(os.path.dirname(path)) != os.path.dirname(path)
        raise (changed if moved else missing) from None
    try:
        name = os.path.basename(path)
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            raise missing from None
        check_regular(info, shown)
        if info.st_size > READ_CAP_BYTES:
            raise PathRefused(
                f"{shown}: {info.st_size} bytes is over the read cap of"
                f" {READ_CAP_BYTES} bytes; use SEARCH to find the lines you need"
            )
        try:
            descriptor = os.open(
                name,
                os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                dir_fd=directory,
            )
        except OSError:
            raise changed from None
    finally:
        os.close(directory)
    with os.fdopen(descriptor, "rb") as file:
        opened = os.fstat(file.fileno())
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            raise changed
        check_regular(opened, shown)
        data = file.read(READ_CAP_BYTES + 1)
    if len(data) > READ_CAP_BYTES:
        raise PathRefused(f"{shown}: grew over the read cap of {READ_CAP_BYTES} bytes")
    return data

def read_text(path: str, shown: str) -> str:
    """Read a resolved file as text, for READ and PATCH; refuses what read_bytes
    refuses, and binary files, each with a hint of what to do instead."""
    text = decode_text(read_bytes(path, shown))
    if text is None:
        raise PathRefused(
            f"{shown}: binary or not UTF-8; READ and PATCH take text files only"
        )
    return text

def read_file(action: dict, project) -> dict:
    """READ: show a text file under a header with its line count, so lines can be
    cited."""
    shown = action["path"]
    text = read_text(resolve_path(project, shown), shown)
    return observation(f"{shown} ({count_lines(text)} lines)\n{text}")

def check_read(action: dict, project) -> None:
    """Refuse, as READ would, a path it cannot use or a file that is not regular."""
    path = resolve_path(project, action["path"])
    if os.path.lexists(path):
        check_regular(os.lstat(path), action["path"])

def read_if_text(path: str) -> str | None:
    """Give a file's text, or None for a file a READ would refuse, or that cannot be
    read."""
    try:
        return decode_text(read_bytes(path, path))
    except (PathRefused, OSError):
        return None

LINK, DIRECTORY, FILE = "a link", "a directory", "a file"


def copied_as(info: os.stat_result, names_inside: int) -> str:
    """What a copy makes of an entry with the lstat INFO and NAMES_INSIDE names in the
    tree: LINK, DIRECTORY or FILE, or, for an entry left out, why."""
    if stat.S_ISLNK(info.st_mode):
        return LINK
    if stat.S_ISDIR(info.st_mode):
        return DIRECTORY
    if not stat.S_ISREG(info.st_mode):
        return kind_of(info.st_mode)
    if info.st_nlink > names_inside:
        return "a file with a hard link outside the tree"
    return FILE

def copied_link(source: str, target: str, path: str, link: str) -> str:
    """What a link at PATH (relative) in the copy TARGET holds, for a link LINK at PATH
    in SOURCE: the same place in the copy when LINK leads into SOURCE, LINK itself
    otherwise."""
    real = os.path.realpath(os.path.join(source, os.path.dirname(path), link))
    if not inside(real, source):
        return link
    written = os.path.normpath(os.path.join(os.path.dirname(path), link))
    if os.path.isabs(link) or written.split("/")[0] == "..":
        return os.path.join(target, os.path.relpath(real, source))
    return link

def copy_regular(path: str, info: os.stat_result, copy: str) -> bool:
    """Copy the regular file at PATH, whose lstat the walk gave as INFO, to the new file
    COPY with its mode and times; False, and nothing made, when PATH is no longer it."""
    try:
        descriptor = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
    except OSError:
        return False
    with os.fdopen(descriptor, "rb") as source:
        opened = os.fstat(descriptor)
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino) or not (
            stat.S_ISREG(opened.st_mode)
        ):
            return False
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(copy, flags, 0o600), "wb") as target:
            shutil.copyfileobj(source, target)
            os.fchmod(target.fileno(), stat.S_IMODE(opened.st_mode))
    os.utime(copy, ns=(opened.st_atime_ns, opened.st_mtime_ns))
    return True

COPY, OUT, EMPTY = "copy", "out", "empty"


def walk_tree(source: str, treat) -> list[tuple[str, os.stat_result, str]]:
    """Each entry under SOURCE that TREAT does not leave OUT, as (its relative path, its
    lstat, its treatment), parents first; no link is followed."""
    entries = []
    for parent, subdirectories, files in os.walk(source):
        entered = []
        for name in sorted(subdirectories + files):
            path = os.path.join(parent, name)
            relative, info = os.path.relpath(path, source), os.lstat(path)
            treatment = treat(relative)
            if treatment != OUT:
                entries.append((relative, info, treatment))
            if name in subdirectories and treatment == COPY:
                entered.append(name)
        subdirectories[:] = entered
    return entries

def judge_tree(source: str, treat) -> list[tuple[str, os.stat_result, str, str]]:
    """Each entry of walk_tree(SOURCE, TREAT), with what a copy makes of it, as
    (relative path, lstat, treatment, copied_as)."""
    entries = walk_tree(source, treat)
    names = collections.Counter((info.st_dev, info.st_ino) for _, info, _ in entries)
    return [
        (relative, info, treatment, copied_as(info, names[info.st_dev, info.st_ino]))
        for relative, info, treatment in entries
    ]

def copy_tree(source: str, target: str, treat=lambda relative: COPY) -> list[str]:
    """Copy the tree at SOURCE to the new directory TARGET without following a link or
    reading a special file; give what was left out, each with why."""
    source, left_out, directories, copies = os.path.realpath(source), [], [], {}
    entries = judge_tree(source, treat)
    os.makedirs(target)
    for relative, info, treatment, kind in entries:
        path, copy, inode = (
            os.path.join(source, relative),
            os.path.join(target, relative),
            (info.st_dev, info.st_ino),
        )
        if kind == LINK:
            os.symlink(copied_link(source, target, relative, os.readlink(path)), copy)
        elif kind == DIRECTORY:
            os.mkdir(copy)
            directories.append((copy, stat.S_IMODE(info.st_mode)))
        elif kind == FILE and treatment == EMPTY:
            open(copy, "x").close()
        elif kind == FILE and inode in copies:
            os.link(copies[inode], copy)
        elif kind == FILE and copy_regular(path, info, copy):
            copies[inode] = copy
        else:
            why = "changed while it was copied" if kind == FILE else kind
            left_out.append(f"{relative}: {why}, left out")
    for copy, mode in reversed(directories):
        os.chmod(copy, mode)
    return left_out
