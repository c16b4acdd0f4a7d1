"""The project: the facts about the root that every tool needs, found once per run."""
import os
from dataclasses import dataclass, replace

import pathspec

from ..trust import environment_secrets, find_program, find_python
from . import PathRefused
from .paths import is_secret_name, load_ignore_rules
from .read import read_if_text

@dataclass(frozen=True)
class Project:
    """The root and what the tools need to know about it: rules, secrets, trusted programs."""
    root: str
    ignore: dict
    broken: dict
    stamps: tuple
    secret_files: tuple
    secret_values: frozenset
    programs: dict

RULES_FILES = (".gitignore", ".mlplcodeignore")
TRUSTED_PROGRAMS = ("rg", "git", "bwrap")
NO_RULES = pathspec.GitIgnoreSpec.from_lines([])

def rules_stamps(root: str) -> tuple:
    """What stat says of each rules file at ROOT, to tell when one has changed."""
    stamps = []
    for name in RULES_FILES:
        try:
            info = os.stat(os.path.join(root, name))
            stamps.append((info.st_ino, info.st_size, info.st_mtime_ns))
        except OSError:
            stamps.append(None)
    return tuple(stamps)


def read_rules(root: str) -> dict:
    """The rules of each rules file at ROOT, the refusal of each that cannot be parsed, the stamps."""
    ignore, broken = {}, {}
    for name in RULES_FILES:
        try:
            ignore[name] = load_ignore_rules(root, name)
        except PathRefused as refusal:
            ignore[name], broken[name] = NO_RULES, str(refusal)
    return {"ignore": ignore, "broken": broken, "stamps": rules_stamps(root)}

def find_secret_files(root: str) -> tuple:
    """Every file and directory in the root whose name marks it secret, symlinks aside."""
    found = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if name.casefold() != ".git"]
        for name in subdirectories + files:
            path = os.path.join(directory, name)
            if is_secret_name(name) and not os.path.islink(path):
                found.append(path)
        subdirectories[:] = [name for name in subdirectories if not is_secret_name(name)]
    return tuple(sorted(found))

SHORTEST_PLANTED_SECRET = 6


def planted_secrets(paths) -> set:
    """The values held in the root's secret files: each line, and what follows its = sign."""
    values = set()
    for path in paths:
        for line in (read_if_text(path) or "").splitlines():
            for value in (line, line.partition("=")[2]):
                value = value.strip().strip("'\"")
                if len(value) >= SHORTEST_PLANTED_SECRET:
                    values.add(value)
    return values

def open_project(root: str) -> Project:
    """The project at ROOT as the tools see it: real root, rules, secrets and trusted programs."""
    real_root = os.path.realpath(root)
    secret_files = find_secret_files(real_root)
    return Project(root=real_root, **read_rules(real_root), secret_files=secret_files,
                   secret_values=frozenset(environment_secrets() | planted_secrets(secret_files)),
                   programs={**{name: find_program(name, real_root) for name in TRUSTED_PROGRAMS},
                             "python": find_python(real_root)})

def current(project: Project) -> Project:
    """PROJECT, with its rules read again if a rules file changed since they were read."""
    if rules_stamps(project.root) == project.stamps:
        return project
    return replace(project, **read_rules(project.root))


def after_action(project: Project, action: dict) -> Project:
    """PROJECT as it is after ACTION was carried out: opened again after a RUN."""
    return open_project(project.root) if action.get("tool") == "run" else current(project)
