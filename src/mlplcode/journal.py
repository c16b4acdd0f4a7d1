"""The journal: every fact of a run as one JSON line, and the state as their fold."""

import json
import os
import re
from dataclasses import dataclass, field, replace

DEFAULT_BUDGET = 20

def runs_directory():
    """Where journals are kept unless a run names its own:
    $XDG_STATE_HOME/mlplcode/runs."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "mlplcode", "runs")

def append_event(path, event):
    """Append EVENT to the journal at PATH as one line, in one write call.

    A crash loses at most the event being written, never one already reported.
    """
    line = (json.dumps(event, ensure_ascii=False, sort_keys=True) + "\n").encode(
        "utf-8"
    )
    descriptor = os.open(
        path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        while line:
            line = line[os.write(descriptor, line) :]
    finally:
        os.close(descriptor)

def sync_journal(path):
    """Put every event appended to the journal at PATH on the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

EVENT_FIELDS = {
    "start": {
        "task": str,
        "budget": int,
        "policy": dict,
        "model": str,
        "model_options": dict,
        "root": str,
        "run": str,
    },
    "note": {"text": str},
    "reply": {"step": int, "text": str},
    "action": {"step": int, "action": dict},
    "verdict": {"step": int, "verdict": str, "reason": str},
    "decision": {"step": int, "approved": bool},
    "observation": {"step": int, "ok": bool, "text": str},
    "stop": {"reason": str, "message": str},
    "resume": {},
    "compact": {"upto": int, "summary": str},
    "branch": {"parent": str, "sha256": str, "at": int},
    "tests": {"sha256": str, "files": int},
}

def event_problem(event, index, steps, start_index=0):
    """What is wrong with EVENT, the INDEX-th of a journal that has seen STEPS replies,
    or "".

    START_INDEX is where the start event must be: 1 after a branch event, else 0.
    """
    if not isinstance(event, dict) or event.get("type") not in EVENT_FIELDS:
        return "not an event"
    kind = event["type"]
    for name, expected in EVENT_FIELDS[kind].items():
        if type(event.get(name)) is not expected:
            return f"a {kind} event needs {name} ({expected.__name__})"
    if kind == "branch" and index != 0:
        return "a branch event is the first line of a journal"
    if kind == "branch" and not untold_steps(event.get("untold", [])):
        return "a branch event's untold is a list of step numbers"
    if kind != "branch" and (kind == "start") != (index == start_index):
        return (
            "a journal has one start event, on its first line (its second, after a"
            " branch event)"
        )
    if kind == "start":
        return start_problem(event)
    if kind == "decision" and not event.get("reason", "").isprintable():
        return "a decision's reason is one line of printable text"
    if kind == "reply" and event["step"] != steps + 1:
        return f"step {event['step']} follows step {steps}"
    if (
        kind in ("action", "verdict", "decision", "observation")
        and event["step"] != steps
    ):
        return f"a {kind} of step {event['step']} after the reply of step {steps}"
    if kind == "compact" and not 0 < event["upto"] <= steps:
        return f"a summary of steps 1 to {event['upto']} after {steps} steps"
    if kind == "tests" and (steps or not DIGEST.fullmatch(event["sha256"])):
        return "a record of the tests is named by its SHA-256, before the first step"
    return ""

def start_problem(start):
    """What is wrong with a start event beyond the types of its fields, or ""."""
    for name in ("root", "model"):
        if not start[name].isprintable():
            return f"a start event's {name} is one line of printable text"
    for category, verdict in start["policy"].items():
        if not category.isidentifier() or verdict not in ("allow", "ask", "deny"):
            return "a start event's policy maps each category to allow, ask or deny"
    for name, value in start["model_options"].items():
        if not (
            value is None
            or type(value) in (int, float)
            or isinstance(value, str) and value.isprintable()
        ):
            return f"a start event's model option {name} is a number or one line"
    may_change = start.get("may_change", [])
    if not isinstance(may_change, list) or not all(
        isinstance(path, str) and not outside_root(path) for path in may_change
    ):
        return "a start event's may_change is a list of paths inside the root"
    return ""

def untold_steps(untold):
    return isinstance(untold, list) and all(type(n) is int and n > 0 for n in untold)

DIGEST = re.compile("[0-9a-f]{64}")
TEST_ENTRY_FIELDS = {"sha256", "text", "link", "other"}


def outside_root(path):
    """Whether PATH, as a journal gives it, is not a normal relative path inside the
    root."""
    return (
        os.path.isabs(path)
        or os.path.normpath(path) != path
        or path.split("/")[0] == ".."
        or "\0" in path
    )


def tests_problem(tests):
    """What is wrong with a record of the tests as they were, or ""."""
    for path, entry in tests.items():
        if outside_root(path):
            return f"tests: {path!r} is not a path inside the root"
        if (
            not isinstance(entry, dict)
            or not entry
            or set(entry) - TEST_ENTRY_FIELDS
            or not all(isinstance(value, str) for value in entry.values())
        ):
            return f"tests: the entry of {path} is not one verification wrote"
    return ""

def read_events(path):
    """The events of the journal at PATH, in order, each checked; a ValueError names a
    bad line.

    A torn last line (a crash in the middle of a write) is dropped.
    """
    with open(path, encoding="utf-8") as journal:
        lines = journal.read().split("\n")
    events, steps = [], 0
    for number, line in enumerate(lines[:-1], 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: line {number}: not JSON ({error.msg})") from None
        except RecursionError:
            raise ValueError(
                f"{path}: line {number}: nested too deeply to be an event"
            ) from None
        start_index = 1 if events and events[0]["type"] == "branch" else 0
        problem = event_problem(event, len(events), steps, start_index)
        if problem:
            raise ValueError(f"{path}: line {number}: {problem}")
        steps += event["type"] == "reply"
        events.append(event)
    if not any(event["type"] == "start" for event in events):
        raise ValueError(f"{path}: no start event; a journal starts with one")
    return events

def cut_torn_line(path):
    """Truncate the journal at PATH after its last newline, dropping a torn last
    line."""
    with open(path, "rb+") as journal:
        data = journal.read()
        if data and not data.endswith(b"\n"):
            journal.truncate(data.rfind(b"\n") + 1)

@dataclass
class Step:
    """One turn of the loop as the events describe it."""

    number: int
    reply: str = ""
    action: dict = field(default_factory=dict)
    verdict: str = ""
    reason: str = ""
    target: dict | None = None
    approved: bool | None = None
    observation: dict | None = None

@dataclass
class State:
    """A run as its events describe it; made only by applying events."""

    start: dict = field(default_factory=dict)
    task: str = ""
    budget: int = 0
    policy: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    seen: set = field(default_factory=set)
    summary: str = ""
    summarized: int = 0
    compactions: int = 0
    stop: dict | None = None
    branch: dict | None = None
    tests: str | None = None

def apply(state, event):
    """Change STATE by one EVENT, and return it: the meaning of every event, in one
    place."""
    kind, last = event["type"], state.steps[-1] if state.steps else None
    if kind == "start":
        state.start = event
        state.task, state.budget, state.policy = (
            event["task"],
            event["budget"],
            event["policy"],
        )
    elif kind == "note":
        state.notes.append((len(state.steps), event["text"]))
    elif kind == "reply":
        state.steps.append(Step(event["step"], reply=event["text"]))
    elif kind == "action":
        last.action = event["action"]
    elif kind == "verdict":
        last.verdict, last.reason, last.target = (
            event["verdict"],
            event["reason"],
            event.get("target"),
        )
    elif kind == "decision":
        last.approved = event["approved"]
        if event.get("reason"):
            state.notes.append((len(state.steps), event["reason"]))
    elif kind == "observation":
        last.observation = {
            name: value for name, value in event.items() if name not in ("type", "step")
        }
        if event["ok"] and last.action.get("tool") in ("read", "write"):
            state.seen.add(os.path.normpath(last.action["path"]))
    elif kind == "stop":
        state.stop = {"reason": event["reason"], "message": event["message"]}
    elif kind == "resume":
        state.stop = None
    elif kind == "compact":
        state.summary, state.summarized = event["summary"], event["upto"]
        state.compactions += 1
    elif kind == "branch":
        state.branch = {
            "parent": event["parent"],
            "at": event["at"],
            "untold": event.get("untold", []),
        }
    elif kind == "tests":
        state.tests = event["sha256"]
    return state

def fold(events):
    """The state that EVENTS describe: each applied in turn to an empty state."""
    state = State()
    for event in events:
        apply(state, event)
    return state

def snapshot(state):
    """A copy of STATE that later events leave as it is."""
    steps = list(state.steps)
    if steps:
        steps[-1] = replace(steps[-1])
    return replace(
        state,
        steps=steps,
        notes=list(state.notes),
        seen=set(state.seen),
        stop=state.stop and dict(state.stop),
    )

def waiting_step(state):
    """The step whose ask waits for a person's decision, or None."""
    last = state.steps[-1] if state.steps else None
    if last and last.verdict == "ask" and last.approved is None and state.stop is None:
        return last
    return None
