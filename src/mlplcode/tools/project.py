"""The project: the facts about the root that every tool needs, found once per run."""

import os
import re
import stat
import subprocess
import time
from dataclasses import dataclass, replace

import pathspec

from ..commands import GIT_HARDENING
from ..trust import (
    PRIVATE_KEY,
    child_environment,
    environment_secrets,
    find_program,
    find_python,
    secret_forms,
)
from . import PathRefused
from .paths import load_ignore_rules, secret_at
from .read import READ_CAP_BYTES, decode_text, read_if_text

@dataclass(frozen=True)
class History:
    """What git would show of the secret files' past: their values, and when they were
    read."""

    # The repository's references and index then; None without a repository.
    stamp: tuple | None
    values: frozenset
    complete: bool  # False when reading stopped at its deadline


@dataclass(frozen=True)
class Project:
    """The root and what the tools need to know about it: rules, secrets, trusted
    programs."""

    root: str
    ignore: dict
    broken: dict
    stamps: tuple
    secret_files: tuple
    secret_values: frozenset
    history: History
    programs: dict

RULES_FILES = (".gitignore", ".mlplcodeignore")
TRUSTED_PROGRAMS = ("rg", "git", "bwrap")
NO_RULES = pathspec.GitIgnoreSpec.from_lines([])

def file_stamp(path: str) -> tuple | None:
    """What stat says of PATH, to tell when it has changed; None when there is no such
    file."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


def rules_stamps(root: str) -> tuple:
    """What stat says of each rules file at ROOT, to tell when one has changed."""
    return tuple(file_stamp(os.path.join(root, name)) for name in RULES_FILES)


def read_rules(root: str) -> dict:
    """The rules of each rules file at ROOT, the refusal of each that cannot be parsed,
    the stamps."""
    ignore, broken = {}, {}
    for name in RULES_FILES:
        try:
            ignore[name] = load_ignore_rules(root, name)
        except PathRefused as refusal:
            ignore[name], broken[name] = NO_RULES, str(refusal)
    return {"ignore": ignore, "broken": broken, "stamps": rules_stamps(root)}

KEY_FILE_BYTES = 16 * 1024
KEY_START_BYTES = 1024


def may_be_key(name: str) -> bool:
    """Whether a file named NAME is worth opening to see whether it is a private key."""
    return "." not in name.lstrip(".")


def starts_with_key(data: bytes) -> bool:
    return PRIVATE_KEY.search(data[:KEY_START_BYTES].decode("latin-1")) is not None


def is_key_file(path: str) -> bool:
    """Whether PATH is a small regular file that starts with a private key; never
    blocks."""
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > KEY_FILE_BYTES:
            return False
        descriptor = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        )
        with os.fdopen(descriptor, "rb") as file:
            return starts_with_key(file.read(KEY_START_BYTES))
    except OSError:
        return False

def find_secret_files(root: str) -> tuple:
    """Every file and directory in the root that is secret by its name or path, and
    every small file that starts with a private key, symlinks aside."""
    found, pending = [], [(root, [])]
    while pending:
        directory, parts = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.is_symlink() or entry.name.casefold() == ".git":
                continue
            here = parts + [entry.name]
            if secret_at(here, len(parts)):
                found.append(entry.path)
            elif entry.is_dir(follow_symlinks=False):
                pending.append((entry.path, here))
            elif may_be_key(entry.name) and is_key_file(entry.path):
                found.append(entry.path)
    return tuple(sorted(found))

SHORTEST_PLANTED_SECRET = 6
LONGEST_ORDINARY = 24
ORDINARY = re.compile(r"[A-Za-z]+(?:[._-][A-Za-z]+)*|[0-9.,:/-]+")
WORD_BREAKS = re.compile(r"[\s\"',;]+")
PART_BREAKS = re.compile(r"[:@/=]+")
INNER_SEPARATOR = re.compile(r"[=:][^=]")


def worth_finding(value: str) -> bool:
    """Whether VALUE, held in a secret file, is worth looking for: long, and not an
    ordinary word."""
    return len(value) >= SHORTEST_PLANTED_SECRET and not (
        len(value) < LONGEST_ORDINARY and ORDINARY.fullmatch(value)
    )


PEM_BOUNDARY = re.compile(r"----[- ]?(BEGIN|END) ([A-Z0-9 ]+?) ?-{4,5}")


def values_in(text: str) -> set:
    """The values a secret file's TEXT holds: what follows each line's first = or :, its
    words and their parts, a word or line with no = or : inside it whole; in a PEM
    block, the lines of a private one whole; those worth finding."""
    values, block = set(), None
    for line in text.splitlines():
        line = line.strip()
        boundary = PEM_BOUNDARY.match(line)
        if boundary:
            block = boundary[2] if boundary[1] == "BEGIN" else None
            continue
        if line.startswith("#") or (block and "PRIVATE" not in block):
            continue
        if block:
            values.add(line)
            continue
        candidates = {line.partition("=")[2], line.partition(":")[2]}
        for whole in [line, *WORD_BREAKS.split(line)]:
            if not INNER_SEPARATOR.search(whole):
                candidates.add(whole)
            candidates.update(PART_BREAKS.split(whole))
        values.update(candidate.strip().strip("'\"") for candidate in candidates)
    return {value for value in values if worth_finding(value)}

SECRET_TEXT_BYTES = 8 * 1024 * 1024


def planted_secrets(paths) -> set:
    """The values held in the root's secret files that are files, the first 8 MiB of
    them."""
    values, left = set(), SECRET_TEXT_BYTES
    for path in paths:
        text = read_if_text(path) if left > 0 else None
        if text:
            values |= values_in(text)
            left -= len(text)
    return values

HISTORY_SECONDS = 10


def git_output(
    git: str, root: str, arguments: list, data: bytes = b"", seconds: float = 5
) -> tuple[bytes, bool]:
    """What git ARGUMENTS prints in ROOT, and whether it finished; b"" if it failed."""
    environment = {**child_environment(root, root), "GIT_NO_LAZY_FETCH": "1"}
    try:
        done = subprocess.run(
            [git, *GIT_HARDENING, *arguments],
            cwd=root,
            env=environment,
            input=data,
            capture_output=True,
            timeout=seconds,
        )
    except subprocess.TimeoutExpired as cut:
        return cut.stdout or b"", False
    except OSError:
        return b"", True
    return (done.stdout, True) if done.returncode == 0 else (b"", True)

def history_stamp(git: str, root: str) -> tuple | None:
    """The repository's references and the stat of its index, or None where git finds
    none."""
    index, _ = git_output(git, root, ["rev-parse", "--git-path", "index"], seconds=5)
    if not index:
        return None
    references, _ = git_output(git, root, ["show-ref", "--head"], seconds=5)
    return (
        references,
        file_stamp(
            os.path.join(root, index.decode("utf-8", "surrogateescape").strip())
        ),
    )

def raw_paths(output: bytes) -> list[tuple[str, list[str]]]:
    """(path, blob hashes, the newer first) for each entry of `git log --raw -z` output;
    a cut last entry is left out."""
    fields, entries = output.split(b"\0"), []
    for header, path in zip(fields, fields[1:]):
        if header.startswith(b":") and header.count(b" ") == 4:
            blobs = [
                word.decode() for word in header.split(b" ")[3:1:-1] if word.strip(b"0")
            ]
            entries.append((path.decode("utf-8", "surrogateescape"), blobs))
    return entries


def index_paths(output: bytes) -> list[tuple[str, list[str]]]:
    """(path, [blob hash]) for each entry of `git ls-files --stage -z` output."""
    entries = []
    for entry in output.split(b"\0"):
        info, tab, path = entry.partition(b"\t")
        if tab and len(info.split(b" ")) == 3:
            entries.append(
                (
                    path.decode("utf-8", "surrogateescape"),
                    [info.split(b" ")[1].decode()],
                )
            )
    return entries

def path_cap(path: str) -> int:
    """How many bytes of a blob at PATH are worth reading: as many as READ would read at
    a secret path, as many as a key has at one that may hold a key, none elsewhere."""
    parts = path.split("/")
    if any(secret_at(parts, index) for index in range(len(parts))):
        return READ_CAP_BYTES
    return KEY_FILE_BYTES if may_be_key(parts[-1]) else 0


def candidate_blobs(entries) -> dict:
    """The blobs of ENTRIES worth reading, newest first, each with how many bytes of it
    are."""
    caps, judged = {}, {}
    for path, blobs in entries:
        cap = (
            judged[path] if path in judged else judged.setdefault(path, path_cap(path))
        )
        for blob in blobs:
            if cap > caps.get(blob, 0):
                caps[blob] = cap
    return caps

def blob_texts(git: str, root: str, caps: dict, seconds: float) -> tuple[dict, bool]:
    """The text of each blob of CAPS no larger than its cap, by hash; and whether all
    was read."""
    listing, listed = git_output(
        git,
        root,
        ["cat-file", "--batch-check"],
        "".join(f"{blob}\n" for blob in caps).encode(),
        seconds,
    )
    wanted, left = [], SECRET_TEXT_BYTES
    for fields in map(bytes.split, listing.splitlines()):
        if (
            len(fields) == 3
            and fields[1] == b"blob"
            and int(fields[2]) <= caps[fields[0].decode()]
        ):
            if int(fields[2]) > left:
                listed = False
                break
            wanted.append(fields[0].decode())
            left -= int(fields[2])
    contents, read = git_output(
        git,
        root,
        ["cat-file", "--batch"],
        "".join(f"{blob}\n" for blob in wanted).encode(),
        seconds,
    )
    texts, at = {}, 0
    while (header_end := contents.find(b"\n", at)) >= 0:
        header = contents[at:header_end].split()
        size = int(header[2]) if len(header) == 3 else -1
        data = contents[header_end + 1 : header_end + 1 + size]
        if len(data) == size:
            texts[header[0].decode()] = decode_text(data)
        at = header_end + 1 + (size + 1 if size >= 0 else 0)
    return texts, listed and read

NO_HISTORY = History(stamp=None, values=frozenset(), complete=True)


def read_history(git: str | None, root: str) -> History:
    """The values of every version of the secret files that git can show in ROOT."""
    stamp = history_stamp(git, root) if git else None
    if stamp is None:
        return NO_HISTORY
    deadline = time.monotonic() + HISTORY_SECONDS
    log, logged = git_output(
        git,
        root,
        [
            "log",
            "--all",
            "--reflog",
            "--format=",
            "--raw",
            "-z",
            "--no-abbrev",
            "--no-renames",
            "--diff-merges=first-parent",
            "--no-ext-diff",
            "--no-textconv",
            "--no-show-signature",
        ],
        seconds=HISTORY_SECONDS,
    )
    index, _ = git_output(git, root, ["ls-files", "--stage", "-z"], seconds=5)
    caps = candidate_blobs(index_paths(index) + raw_paths(log))
    texts, read = blob_texts(git, root, caps, max(1.0, deadline - time.monotonic()))
    values = {
        value
        for blob, text in texts.items()
        if text is not None
        and (caps[blob] == READ_CAP_BYTES or starts_with_key(text.encode()))
        for value in values_in(text)
    }
    return History(stamp=stamp, values=frozenset(values), complete=logged and read)

def open_project(root: str, previous: Project | None = None) -> Project:
    """The project at ROOT as the tools see it: real root, rules, secrets and trusted
    programs."""
    real_root = os.path.realpath(root)
    programs = {
        **{name: find_program(name, real_root) for name in TRUSTED_PROGRAMS},
        "python": find_python(real_root),
    }
    secret_files = find_secret_files(real_root)
    history = (
        previous.history
        if previous is not None
        and previous.history.stamp is not None
        and programs["git"]
        and history_stamp(programs["git"], real_root) == previous.history.stamp
        else read_history(programs["git"], real_root)
    )
    values = frozenset(
        environment_secrets() | planted_secrets(secret_files) | history.values
    )
    return Project(
        root=real_root,
        **read_rules(real_root),
        secret_files=secret_files,
        secret_values=secret_forms(values),
        history=history,
        programs=programs
    )

def current(project: Project) -> Project:
    """PROJECT, with its rules read again if a rules file changed since they were
    read."""
    if rules_stamps(project.root) == project.stamps:
        return project
    return replace(project, **read_rules(project.root))


def after_action(project: Project, action: dict) -> Project:
    """PROJECT as it is after ACTION was carried out: opened again after a RUN."""
    return (
        open_project(project.root, project)
        if action.get("tool") == "run"
        else current(project)
    )
