"""The journal: every fact of a run as one JSON line, and the state as their fold."""
import json
import os
from dataclasses import dataclass, field

def append_event(path, event, sync=True):
    """Append EVENT to the journal at PATH, flushed, and with SYNC on the disk, before returning.

    One event per line, written whole with one write call: a crash loses at
    most the event being written, never one already reported.
    """
    line = json.dumps(event, ensure_ascii=False, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as journal:
        journal.write(line)
        journal.flush()
        if sync:
            os.fsync(journal.fileno())

def sync_journal(path):
    """Put every event appended to the journal at PATH on the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)

def read_events(path):
    """The events of the journal at PATH, in order.

    A torn last line (a crash in the middle of a write) is dropped; any other
    line that is not a JSON event is an error that names the line.
    """
    with open(path, encoding="utf-8") as journal:
        lines = journal.read().split("\n")
    events = []
    for number, line in enumerate(lines[:-1], 1):
        try:
            event = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: line {number}: not JSON ({error.msg})") from None
        if not isinstance(event, dict) or "type" not in event:
            raise ValueError(f"{path}: line {number}: not an event")
        events.append(event)
    return events

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
    """A run as its events describe it; made only by `fold`."""
    task: str = ""
    budget: int = 0
    policy: dict = field(default_factory=dict)
    steps: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    stop: dict | None = None

def fold(events):
    """Replay EVENTS into a State: the only way a run's state is ever made."""
    state = State()
    for event in events:
        kind = event["type"]
        if kind == "start":
            state.task, state.budget, state.policy = event["task"], event["budget"], event["policy"]
        elif kind == "note":
            state.notes.append((len(state.steps), event["text"]))
        elif kind == "reply":
            state.steps.append(Step(event["step"], reply=event["text"]))
        elif kind == "action":
            state.steps[-1].action = event["action"]
        elif kind == "verdict":
            state.steps[-1].verdict, state.steps[-1].reason = event["verdict"], event["reason"]
            state.steps[-1].target = event.get("target")
        elif kind == "decision":
            state.steps[-1].approved = event["approved"]
        elif kind == "observation":
            state.steps[-1].observation = observed = dict(event)
            del observed["type"], observed["step"]
        elif kind == "stop":
            state.stop = {"reason": event["reason"], "message": event["message"]}
    return state

def known_paths(state):
    """Paths this run has read, or written whole: the files whose content the model has seen."""
    return {
        step.action["path"] for step in state.steps
        if step.action.get("tool") in ("read", "write")
        and step.observation and step.observation["ok"]
    }

def waiting_step(state):
    """The step whose ask waits for a person's decision, or None."""
    last = state.steps[-1] if state.steps else None
    if last and last.verdict == "ask" and last.approved is None and state.stop is None:
        return last
    return None
