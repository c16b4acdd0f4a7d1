"""The agent as an object: one run of the loop, kept in its journal, driven one call at a time."""
import contextlib
import os
import secrets
import time
from dataclasses import dataclass

from .journal import State, append_event, fold, read_events, sync_journal, waiting_step
from .loop import DEFAULT_BUDGET, observation, resolve, step
from .models import model_from_spec
from .policy import DEFAULT_POLICY
from .prompt import build_context
from .show import as_html, as_markdown, as_text, report_views

PYTHON_WORDS = {"step": "step()", "decide": "approve() or deny(reason)",
                "start": "Agent.start(task, root, model)"}


class AgentError(Exception):
    """A call the run cannot take now; `said(words)` tells what to do instead, in a front end's words."""

    def __init__(self, problem, remedy):
        super().__init__(problem, remedy)
        self.problem, self.remedy = problem, remedy

    def said(self, words):
        return f"{self.problem}: use {words[self.remedy]}"

    def __str__(self):
        return self.said(PYTHON_WORDS)

def new_run_id():
    """An id such as 20250130-142501-3fa2: the start time, then four random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)

class Agent:
    """One run of the loop, kept in its journal, driven one call at a time."""

    @classmethod
    def start(cls, task, root, model, journal=None, budget=DEFAULT_BUDGET, policy=DEFAULT_POLICY):
        """Start a new run and return its Agent; refuses, before anything is written, a root
        that is not a directory, a journal that already exists and a model spec that names no model."""
        if not os.path.isdir(root):
            raise ValueError(f"{root}: not a directory")
        run = new_run_id()
        journal = journal or f"mlplcode-{run}.jsonl"
        if os.path.exists(journal):
            raise ValueError(f"{journal} already exists; a journal holds one run")
        model_from_spec(model)
        append_event(journal, {"type": "start", "task": task, "budget": budget, "policy": policy,
                               "model": model, "root": os.path.realpath(root), "run": run})
        return cls(journal)

    def __init__(self, journal):
        """The run recorded in JOURNAL, taken up where it stopped."""
        self.journal = os.path.abspath(journal)
        self.load()

    def load(self):
        """Become what the journal says: its events, its root, and a model past the replies used."""
        self.events, self.folded = read_events(self.journal), (None, None)
        start = self.events[0] if self.events else {}
        if start.get("type") != "start" or "root" not in start or "run" not in start:
            raise ValueError(f"{self.journal}: not a run an Agent started (no start event with root and run)")
        self.run_id, self.root, self.model_spec = start["run"], start["root"], start["model"]
        used = sum(1 for event in self.events if event["type"] == "reply")
        self.model = model_from_spec(self.model_spec, used=used)

    def record(self, event):
        """Append EVENT to the journal, flushed, then to the list that mirrors it."""
        append_event(self.journal, event, sync=False)
        self.events.append(event)

    @property
    def state(self):
        """The run as its events describe it, folded again only when an event has been recorded."""
        if self.folded[0] != len(self.events):
            self.folded = (len(self.events), fold(self.events))
        return self.folded[1]

    def prompt(self):
        """The messages the model will be sent at the next step."""
        return build_context(self.state)

    def check_can_step(self):
        """The state, if a step may be taken: refuses after the stop, or while an ask waits."""
        state = self.state
        if state.stop:
            raise AgentError(f"the run has stopped ({state.stop['reason']})", "start")
        waiting = waiting_step(state)
        if waiting:
            raise AgentError(f"step {waiting.number} is waiting for a decision", "decide")
        return state

    def step(self, count=1):
        """Take up to COUNT steps, stopping early at an ask or at the end of the run."""
        return self.advance(count, self.check_can_step())

    def run(self):
        """Take steps until an ask waits or the run stops."""
        return self.advance(None, self.check_can_step())

    def advance(self, count, state):
        """From STATE, take COUNT steps (any number for None), stopping when an ask waits or the run stops."""
        first, taken = len(state.steps) + 1, 0
        with self.interruptible():
            while (count is None or taken < count) and not (state.stop or waiting_step(state)):
                step(self.events, self.model, self.root, None, self.record)
                state, taken = self.state, taken + 1
        return Report(self.run_id, state, tuple(range(first, len(state.steps) + 1)))

    def waiting(self):
        """The step that waits for a decision; refuses when none does."""
        state = self.state
        waiting = waiting_step(state)
        if waiting is None:
            raise AgentError("nothing is waiting for a decision", "start" if state.stop else "step")
        return waiting

    def approve(self):
        """Approve the action that waits, and carry it out."""
        return self.decide(True)

    def decide(self, approved):
        """Record the decision on the step that waits and carry it out (or decline it)."""
        number = self.waiting().number
        with self.interruptible():
            resolve(self.events, approved, self.root, self.record)
        return self.report([number])

    def deny(self, reason=""):
        """Decline the action that waits; a REASON is recorded first, as a note the model will read."""
        self.waiting()
        if reason:
            self.record({"type": "note", "text": reason})
        return self.decide(False)

    def note(self, text):
        """Record a note from the human; the model sees it in its next prompt."""
        if self.state.stop:
            raise AgentError(f"the run has stopped ({self.state.stop['reason']}); no model will read a note", "start")
        with self.interruptible():
            self.record({"type": "note", "text": text})

    @contextlib.contextmanager
    def interruptible(self):
        """Sync the journal when the work ends; on an interrupt, first reload, close the step cut short."""
        try:
            yield
        except KeyboardInterrupt:
            self.load()
            self.close_cut_step()
            raise
        finally:
            sync_journal(self.journal)

    def close_cut_step(self):
        """Give the last step an observation if an interrupt left it without one."""
        state = self.state
        last = state.steps[-1] if state.steps else None
        if last and last.observation is None and state.stop is None and not waiting_step(state):
            self.record(observation(last.number, False,
                                    "INTERRUPTED: the human stopped this step before it finished"))

    def report(self, numbers):
        """A Report of the steps NUMBERS, in the state as it is now."""
        return Report(self.run_id, self.state, tuple(numbers))

@dataclass(frozen=True)
class Report:
    """What one call did: the steps it took or finished, seen in the state after it."""
    run: str
    state: State
    numbers: tuple

    def views(self, words):
        return report_views(self.state, self.numbers, words)

    def _repr_html_(self):
        return "".join(as_html(view) for _, _, view in self.views(PYTHON_WORDS))

    def _repr_markdown_(self):
        return "\n".join(as_markdown(view) for _, _, view in self.views(PYTHON_WORDS))

    def __repr__(self):
        return "\n".join(as_text(view) for _, _, view in self.views(PYTHON_WORDS))
