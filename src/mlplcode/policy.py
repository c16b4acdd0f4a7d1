"""Policy as data: which actions are allowed, asked about, or denied."""
import difflib
import json

from .protocol import format_action
from .tools import classify_command

DEFAULT_POLICY = {"read": "allow", "search": "allow", "write": "ask",
                  "run": "allow", "git": "ask", "shell": "deny"}
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
        raise ValueError(f"{source}: a policy is an object such as {{\"write\": \"ask\"}}")
    for key, verdict in overrides.items():
        if key not in DEFAULT_POLICY:
            raise ValueError(f"{source}: unknown category {key!r}; use {', '.join(DEFAULT_POLICY)}")
        if verdict not in VERDICTS:
            raise ValueError(f"{source}: {key}: {verdict!r} is not one of {', '.join(VERDICTS)}")
    return {**policy, **overrides}

def category(action):
    """The policy category of ACTION: read, search, write, run, git or shell."""
    tool = action["tool"]
    if tool == "patch":
        return "write"
    if tool == "run":
        return classify_command(action["command"])[0]
    return tool

def authorize(action, policy):
    """allow, ask or deny for ACTION under POLICY; pure, so it can be tested row by row.

    DONE is always allowed (verification judges it). A shell command is
    denied even when the policy says allow: there is no shell underneath.
    """
    if action["tool"] == "done":
        return "allow"
    kind = category(action)
    if kind == "shell":
        return "deny"
    return policy[kind]

def preview(action):
    """What a human sees before approving ACTION: a PATCH as a diff, anything else as written."""
    if action["tool"] != "patch":
        return format_action(action)
    diff = difflib.unified_diff(action["old"].splitlines(keepends=True),
                                action["new"].splitlines(keepends=True),
                                f"{action['path']} (now)", f"{action['path']} (patched)")
    return f"PATCH {action['path']}\n" + "".join(diff)

def terminal_decider(ask=input, show=print):
    """Decide asks at a terminal: show the action, approve only on 'y' or 'yes'."""
    def decide(action):
        show(preview(action))
        try:
            answer = ask("approve? [y/N] ")
        except EOFError:
            return False
        return answer.strip().lower() in ("y", "yes")
    return decide

def always(answer):
    """A decider that answers every ask the same way: --yes and --no."""
    return lambda action: answer
