"""Reading: text files of modest size, opened without following a link."""

import os
import stat

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
