"""Writing and patching: whole files replaced atomically, and one exact occurrence
replaced."""

import difflib
import errno
import os
import secrets
import stat

from . import PathRefused, failure, observation
from .paths import open_directory, resolve_path
from .read import READ_CAP_BYTES, check_regular, count_lines, read_text

def write_atomically(path: str, content: str, root: str, shown: str) -> None:
    """Replace a file's content so that a crash leaves either the old file or the new
    one.

    Every step is taken relative to the directory, reached from / without following a
    link (missing directories below ROOT are made), so no swap on the way can move
    the write elsewhere. The old file's mode is kept; a new file gets 0644.
    """
    try:
        directory = open_directory(os.path.dirname(path), make_below=root)
    except OSError as problem:
        if problem.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PathRefused(
                f"{shown}: changed while it was being written; try again"
            ) from None
        raise
    try:
        name, temporary = (
            os.path.basename(path),
            f".mlplcode-{secrets.token_hex(8)}.tmp",
        )
        try:
            info = os.stat(name, dir_fd=directory, follow_symlinks=False)
            check_regular(info, shown)
            mode = stat.S_IMODE(info.st_mode)
        except FileNotFoundError:
            mode = 0o644
        descriptor = os.open(
            temporary,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=directory,
        )
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as file:
                file.write(content)
                file.flush()
                os.fsync(file.fileno())
                os.fchmod(file.fileno(), mode)
            os.replace(temporary, name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            os.unlink(temporary, dir_fd=directory)
            raise
    finally:
        os.close(directory)

# The agent's own files: the user's list of what it may not see, and its policy files.
AGENT_FILES = (".mlplcodeignore", ".mlplcode")
# What git obeys besides .git: attributes (filters, diff drivers) and submodules.
GIT_FILES = (".gitattributes", ".gitmodules")
# A directory holding all three is a repository to git, whatever its name.
GIT_DIRECTORY_NAMES = frozenset({"HEAD", "objects", "refs"})

def git_directory_made(root: str, relative: str) -> str | None:
    """The directory on the way to RELATIVE (the root included) that holds, or would
    hold once RELATIVE is written, HEAD, objects and refs; None when there is none."""
    directory = root
    for part in relative.split("/"):
        present = {
            name
            for name in GIT_DIRECTORY_NAMES
            if os.path.lexists(os.path.join(directory, name))
        }
        if GIT_DIRECTORY_NAMES <= present | {part}:
            return os.path.relpath(directory, root)
        directory = os.path.join(directory, part)
    return None

def writable_path(project, shown: str) -> str:
    """Resolve a path for WRITE or PATCH.

    Besides what resolve_path refuses, refuses a directory, a file that is not
    regular or has other names, the agent's own files, git's metadata (attributes,
    submodules, a directory that is or would become a repository), and a link that
    gives the file another name.
    """
    path = resolve_path(project, shown)
    relative = os.path.relpath(path, project.root).replace(os.sep, "/")
    name = relative.rsplit("/", 1)[-1]
    if relative.split("/")[0].casefold() in AGENT_FILES:
        raise PathRefused(
            f"{shown}: {relative.split('/')[0]} holds the agent's own rules;"
            " the agent may not change it"
        )
    if name.casefold() in GIT_FILES:
        raise PathRefused(
            f"{shown}: git obeys {name} (its filters and drivers run programs);"
            " the agent does not write git's metadata"
        )
    repository = git_directory_made(project.root, relative)
    if repository:
        raise PathRefused(
            f"{shown}: {repository} would hold HEAD, objects and refs, which makes"
            " it a repository git obeys; the agent does not write git's metadata"
        )
    if name != shown.rstrip("/").rsplit("/", 1)[-1]:
        raise PathRefused(
            f"{shown}: leads to {relative}; write it by its own name, so the"
            " approval shows what it is"
        )
    if os.path.lexists(path):
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            raise PathRefused(
                f"{shown}: is a directory; WRITE and PATCH take a file path"
            )
        check_regular(info, shown)
    return path

INTERPRETER_FILES = ("sitecustomize.py", "usercustomize.py")


def write_category(path: str) -> str:
    """The policy category of a WRITE or PATCH of PATH: "interpreter" for a file Python
    runs at every start (.pth, sitecustomize.py, usercustomize.py), else "write"."""
    name = path.rstrip("/").rsplit("/", 1)[-1].casefold()
    return (
        "interpreter" if name.endswith(".pth") or name in INTERPRETER_FILES else "write"
    )

WRITE_CAP_BYTES = READ_CAP_BYTES


def check_content(content: str, shown: str) -> None:
    """Refuse content that READ could not read back: over the write cap, or holding a
    NUL."""
    if "\0" in content:
        raise PathRefused(
            f"{shown}: the content holds a NUL byte, which makes a file that READ"
            " and PATCH refuse as binary; write text only"
        )
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > WRITE_CAP_BYTES:
        raise PathRefused(
            f"{shown}: {size} bytes is over the write cap of {WRITE_CAP_BYTES}"
            " bytes; split the file"
        )

def write_file(action: dict, project) -> dict:
    """WRITE: create or replace a whole file, making missing parent directories.

    The parents are inside the root because the resolved path is.
    """
    shown, content = action["path"], action["content"]
    path = writable_path(project, shown)
    check_content(content, shown)
    write_atomically(path, content, project.root, shown)
    return observation(f"wrote {shown} ({count_lines(content)} lines)")

def closest_window(lines: list[str], old_lines: list[str]) -> int:
    """Give the start of the run of len(old_lines) lines most similar to OLD.

    Windows are compared as text, so a line with one wrong character still
    counts as close; the first of equally close windows wins.
    """
    size = len(old_lines)
    matcher = difflib.SequenceMatcher(b="\n".join(old_lines))  # OLD is analysed once

    def similarity(start: int) -> float:
        """Score one window against OLD, from 0 (nothing alike) to 1 (equal)."""
        matcher.set_seq1("\n".join(lines[start : start + size]))
        return matcher.ratio()

    return max(range(max(1, len(lines) - size + 1)), key=similarity)

def not_found_message(shown: str, text: str, old: str) -> str:
    """Explain a missed OLD and show the most similar lines, numbered, for the model to
    copy."""
    lines = text.split("\n")
    old_lines = old.removesuffix("\n").split("\n")
    start = closest_window(lines, old_lines)
    window = lines[start : start + len(old_lines)]
    numbered = "\n".join(
        f"{start + offset + 1:>5} | {line}" for offset, line in enumerate(window)
    )
    return (
        f"OLD was not found in {shown}. The most similar lines are:\n{numbered}\n"
        "Copy OLD exactly from the file, whitespace included, or READ it again."
    )

def line_number(text: str, index: int) -> int:
    """Give the 1-based number of the line on which a character index of text falls."""
    return text.count("\n", 0, index) + 1

def occurrences(text: str, old: str) -> list[int]:
    """Give every index where OLD starts in text; overlapping ones count, as each is a
    candidate."""
    starts = []
    index = text.find(old)
    while index != -1:
        starts.append(index)
        index = text.find(old, index + 1)
    return starts

def ambiguous_message(shown: str, text: str, starts: list[int]) -> str:
    """Say how often and on which lines OLD occurs; the first 20 lines are enough to
    locate it."""
    numbers = [str(line_number(text, start)) for start in starts]
    listed = ", ".join(numbers[:20]) + (", ..." if len(numbers) > 20 else "")
    return (
        f"OLD occurs {len(starts)} times in {shown}, at lines {listed};"
        " include more surrounding lines in OLD so it occurs once"
    )

def patch_file(action: dict, project) -> dict:
    """PATCH: replace the one occurrence of OLD with NEW, written atomically like WRITE.

    Refuses an empty OLD, a missing OLD (showing the closest lines) and an OLD
    that occurs more than once (saying where): a guessed edit is worse than none.
    """
    shown, old, new = action["path"], action["old"], action["new"]
    path = writable_path(project, shown)
    text = read_text(path, shown)
    if not old:
        return failure(f"OLD is empty; copy the lines to replace from {shown}")
    starts = occurrences(text, old)
    if not starts:
        return failure(not_found_message(shown, text, old))
    if len(starts) > 1:
        return failure(ambiguous_message(shown, text, starts))
    start = starts[0]
    patched = text[:start] + new + text[start + len(old) :]
    check_content(patched, shown)
    write_atomically(path, patched, project.root, shown)
    first, last = line_number(text, start), line_number(text, start + len(old) - 1)
    return observation(f"patched {shown}: replaced lines {first}-{last}")

def check_write(action: dict, project) -> None:
    """Refuse, as WRITE would, a target it cannot write or content it would refuse."""
    writable_path(project, action["path"])
    check_content(action["content"], action["path"])


def check_patch(action: dict, project) -> None:
    """Refuse, as PATCH would, a target it cannot write or a NEW it would refuse."""
    writable_path(project, action["path"])
    check_content(action["new"], action["path"])
