"""Writing and patching: whole files replaced atomically, and one exact occurrence replaced."""
import difflib
import os
import stat
import tempfile

from . import PathRefused, failure, observation
from .paths import resolve_path
from .read import READ_CAP_BYTES, check_regular, count_lines, read_text

def write_atomically(path: str, content: str) -> None:
    """Replace a file's content so that a crash leaves either the old file or the new one.

    The temporary file sits in the same directory, since os.replace is atomic only
    within one file system, and is removed if anything fails. The old file's mode
    is kept; a new file gets 0644.
    """
    mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.exists(path) else 0o644
    descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".mlplcode-",
                                             suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8", newline="") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise

# The agent's own files: the user's list of what it may not see, and its policy files.
AGENT_FILES = (".mlplcodeignore", ".mlplcode")


def writable_path(project, shown: str) -> str:
    """Resolve a path for WRITE or PATCH.

    Besides what resolve_path refuses, refuses a directory, a file that is not
    regular or has other names, and the agent's own files: the agent may not
    unhide what the user hid from it, nor change its own policy.
    """
    path = resolve_path(project, shown)
    relative = os.path.relpath(path, project.root).replace(os.sep, "/")
    if relative.split("/")[0].casefold() in AGENT_FILES:
        raise PathRefused(f"{shown}: {relative.split('/')[0]} holds the agent's own rules;"
                          " the agent may not change it")
    if os.path.lexists(path):
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):
            raise PathRefused(f"{shown}: is a directory; WRITE and PATCH take a file path")
        check_regular(info, shown)
    return path

WRITE_CAP_BYTES = READ_CAP_BYTES


def check_size(content: str, shown: str) -> None:
    """Refuse content over the write cap: what the agent writes, it must be able to READ back."""
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > WRITE_CAP_BYTES:
        raise PathRefused(f"{shown}: {size} bytes is over the write cap of {WRITE_CAP_BYTES}"
                          " bytes; split the file")

def write_file(action: dict, project) -> dict:
    """WRITE: create or replace a whole file, making missing parent directories.

    The parents are inside the root because the resolved path is.
    """
    shown, content = action["path"], action["content"]
    path = writable_path(project, shown)
    check_size(content, shown)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomically(path, content)
    return observation(f"wrote {shown} ({count_lines(content)} lines)")

def line_number(text: str, index: int) -> int:
    """Give the 1-based number of the line on which a character index of text falls."""
    return text.count("\n", 0, index) + 1

def occurrences(text: str, old: str) -> list[int]:
    """Give every index where OLD starts in text; overlapping ones count, as each is a candidate."""
    starts = []
    index = text.find(old)
    while index != -1:
        starts.append(index)
        index = text.find(old, index + 1)
    return starts

def closest_window(lines: list[str], old_lines: list[str]) -> int:
    """Give the start of the run of len(old_lines) lines most similar to OLD.

    Windows are compared as text, so a line with one wrong character still
    counts as close; the first of equally close windows wins.
    """
    size = len(old_lines)
    matcher = difflib.SequenceMatcher(b="\n".join(old_lines))  # OLD is analysed once

    def similarity(start: int) -> float:
        """Score one window against OLD, from 0 (nothing alike) to 1 (equal)."""
        matcher.set_seq1("\n".join(lines[start:start + size]))
        return matcher.ratio()

    return max(range(max(1, len(lines) - size + 1)), key=similarity)

def not_found_message(shown: str, text: str, old: str) -> str:
    """Explain a missed OLD and show the most similar lines, numbered, for the model to copy."""
    lines = text.split("\n")
    old_lines = old.removesuffix("\n").split("\n")
    start = closest_window(lines, old_lines)
    window = lines[start:start + len(old_lines)]
    numbered = "\n".join(f"{start + offset + 1:>5} | {line}" for offset, line in enumerate(window))
    return (f"OLD was not found in {shown}. The most similar lines are:\n{numbered}\n"
            "Copy OLD exactly from the file, whitespace included, or READ it again.")

def ambiguous_message(shown: str, text: str, starts: list[int]) -> str:
    """Say how often and on which lines OLD occurs; the first 20 lines are enough to locate it."""
    numbers = [str(line_number(text, start)) for start in starts]
    listed = ", ".join(numbers[:20]) + (", ..." if len(numbers) > 20 else "")
    return (f"OLD occurs {len(starts)} times in {shown}, at lines {listed};"
            " include more surrounding lines in OLD so it occurs once")

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
    patched = text[:start] + new + text[start + len(old):]
    check_size(patched, shown)
    write_atomically(path, patched)
    first, last = line_number(text, start), line_number(text, start + len(old) - 1)
    return observation(f"patched {shown}: replaced lines {first}-{last}")

def check_write(action: dict, project) -> None:
    """Refuse, as WRITE would, a target it cannot write or content over the cap."""
    writable_path(project, action["path"])
    check_size(action["content"], action["path"])


def check_patch(action: dict, project) -> None:
    """Refuse, as PATCH would, a target it cannot write."""
    writable_path(project, action["path"])
