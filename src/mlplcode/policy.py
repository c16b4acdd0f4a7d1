"""Policy as data: which actions are allowed, asked about, or denied."""

import difflib
import json
import os

from .commands import classify_command, parse_command, program_argv
from .protocol import format_action
from .trust import visible
from .verbs import VERB_OF_TOOL

DEFAULT_POLICY = {
    "read": "allow",
    "search": "allow",
    "write": "ask",
    "interpreter": "ask",
    "run": "allow",
    "git": "ask",
    "shell": "deny",
}
VERDICTS = ("allow", "ask", "deny")

def load_policy(path):
    """Read a policy from a JSON file; unknown keys or verdicts are a ValueError."""
    with open(path, encoding="utf-8") as f:
        try:
            overrides = json.load(f)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: not JSON ({error.msg} at line {error.lineno})")
    return merge_policy(DEFAULT_POLICY, overrides, path)

def merge_policy(policy, overrides, source):
    """POLICY with OVERRIDES applied, each checked: a typo must not silently allow."""
    if not isinstance(overrides, dict):
        raise ValueError(
            f"{source}: a policy is an object such as {{\"write\": \"ask\"}}"
        )
    for key, verdict in overrides.items():
        if key not in DEFAULT_POLICY:
            raise ValueError(
                f"{source}: unknown category {key!r}; use {', '.join(DEFAULT_POLICY)}"
            )
        if verdict not in VERDICTS:
            raise ValueError(
                f"{source}: {key}: {verdict!r} is not one of {', '.join(VERDICTS)}"
            )
    return {**policy, **overrides}

def whole_policy(policy, source):
    """POLICY, checked to name every category with a verdict; a ValueError says what is
    missing."""
    missing = [key for key in DEFAULT_POLICY if key not in policy]
    if missing:
        raise ValueError(
            f"{source}: the policy names no verdict for {', '.join(missing)}"
        )
    return merge_policy(DEFAULT_POLICY, policy, source)

def category(action):
    """The policy category of ACTION: read, search, write, interpreter, run, git, shell,
    or done."""
    verb = VERB_OF_TOOL[action["tool"]]
    return (
        verb.category
        if isinstance(verb.category, str)
        else verb.category(action[verb.argument])
    )

def authorize(action, policy):
    """allow, ask or deny for ACTION under POLICY; pure, so it can be tested row by row.

    DONE is always allowed (verification judges it). A shell command is
    denied even when the policy says allow: there is no shell underneath.
    """
    kind = category(action)
    if kind == "done":
        return "allow"
    if kind == "shell":
        return "deny"
    return policy[kind]

# Files that RUN executes or obeys when it runs the tests, though they do not look like
# tests:
# conftest.py, and the configuration files pytest 9.2 looks for
# (_pytest/config/findpaths.py).
TEST_CONFIGURATION = (
    "conftest.py",
    "pytest.toml",
    ".pytest.toml",
    "pytest.ini",
    ".pytest.ini",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)
# A file that is test configuration at the root alone: an __init__.py there makes the
# root a package, which pytest imports before each test module and conftest.py in it.
ROOT_TEST_CONFIGURATION = ("__init__.py",)
# How the preview names the programs a RUN starts; RUN starts them by their absolute
# paths.
PROGRAM_NAMES = {"python": "python", "git": "git"}


def test_configuration(path):
    """Whether PATH, relative to the root, is a file that pytest obeys or runs as
    configuration: a name of TEST_CONFIGURATION anywhere, or a root __init__.py."""
    normal = os.path.normpath(path).replace(os.sep, "/").casefold()
    *directories, name = normal.split("/")
    return name in TEST_CONFIGURATION or (
        not directories and name in ROOT_TEST_CONFIGURATION
    )


def warning(action):
    """A line that tells the human what the action's text does not show, or ""."""
    if action["tool"] in ("write", "patch"):
        name = action["path"].rsplit("/", 1)[-1].casefold()
        if category(action) == "interpreter":
            return (
                f"WARNING: {name} runs at every start of the Python it belongs to, on"
                " this machine and outside the sandbox: approve it as you would a"
                " program\n"
            )
        if test_configuration(action["path"]):
            return (
                f"WARNING: {name} is code that RUN executes: approve it as you would a"
                " program\n"
            )
    if action["tool"] == "run" and classify_command(action["command"]) != "shell":
        kind, argv, paths = parse_command(action["command"])
        return (
            f"runs: {' '.join(program_argv(kind, argv, paths, PROGRAM_NAMES))}\nin: the"
            " project root\n"
        )
    return ""

def preview(action):
    """What a human sees before approving ACTION, whole and with invisible characters
    escaped.

    A PATCH is shown as a diff, anything else as the protocol writes it, below a
    warning for test configuration and the exact argv of a RUN.
    """
    if action["tool"] == "patch":
        diff = difflib.unified_diff(
            action["old"].splitlines(keepends=True),
            action["new"].splitlines(keepends=True),
            f"{action['path']} (now)",
            f"{action['path']} (patched)",
        )
        shown = f"PATCH {action['path']}\n" + "".join(diff)
    else:
        shown = format_action(action)
    return visible(warning(action) + shown)

QUESTIONS = {
    "done": (
        "accept this DONE although the tests as they were fail? [y/N] ",
        "reason for the model (empty: none; the run goes on): ",
    ),
    "": ("approve? [y/N] ", "reason for the model (empty: end the run): "),
}


def terminal_decider(ask=input, show=print):
    """Decide asks at a terminal: show the action, approve only on 'y' or 'yes', and
    after a no, take a reason for the model (none ends the run, except at a DONE)."""

    def decide(action):
        approve, why = QUESTIONS["done" if action["tool"] == "done" else ""]
        show(preview(action))
        try:
            if ask(approve).strip().lower() in ("y", "yes"):
                return True, ""
            return False, ask(why).strip()
        except EOFError:
            return False, ""

    return decide

def always(approved):
    """A decider that answers every ask the same way, with no reason (--yes and --no),
    but declines to accept a DONE whose tests changed, which needs a person."""
    return lambda action: (approved and action["tool"] != "done", "")
