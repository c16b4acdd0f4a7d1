"""The agent as an object: the one driver of a run, kept in its journal, driven one call
at a time."""

import contextlib
import json
import os
import re
import secrets
import stat
import threading
import time
from dataclasses import dataclass

from . import compaction, loop
from .journal import (
    DEFAULT_BUDGET,
    State,
    append_event,
    apply,
    cut_torn_line,
    fold,
    read_events,
    runs_directory,
    snapshot,
    start_problem,
    sync_journal,
    waiting_step,
)
from .models import (
    ModelError,
    lasting_spec,
    model_from_spec,
    replies_used,
    settled_options,
)
from .policy import DEFAULT_POLICY, VERDICTS, whole_policy
from .prompt import Rendered, build_context
from .show import as_html, as_markdown, as_text, report_views
from .tools.project import open_project
from .trust import inside
from .verify import keep_tests, snapshot_tests

PYTHON_WORDS = {
    "step": "step()",
    "decide": "approve() or deny(reason)",
    "start": "Agent.start(task, root, model)",
    "resume": "resume()",
}


class AgentError(Exception):
    """A call the run cannot take now; `said(words)` tells what to do instead, in a
    front end's words."""

    def __init__(self, problem, remedy):
        super().__init__(problem, remedy)
        self.problem, self.remedy = problem, remedy

    def said(self, words):
        return f"{self.problem}: use {words[self.remedy]}"

    def __str__(self):
        return self.said(PYTHON_WORDS)

def new_run_id():
    """An id such as 20250130-142501-3fa2: the start time, then four random hex
    digits."""
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)

def starts_directory():
    """Where a copy of each run's start event is kept: starts/ beside runs/."""
    return os.path.join(os.path.dirname(runs_directory()), "starts")


RUN_ID = re.compile("[0-9]{8}-[0-9]{6}-[0-9a-f]{4}")


def run_id_problem(run):
    """Why RUN is not an id of the one shape new_run_id makes, or ""."""
    if isinstance(run, str) and RUN_ID.fullmatch(run):
        return ""
    shown = repr(run) if len(repr(run)) <= 60 else repr(run)[:60] + "..."
    return f"its run id {shown} is not one mlplcode makes"

def owned_alone(descriptor, what, kind):
    """Refuse, closing DESCRIPTOR, a file that is not of KIND (stat.S_ISDIR or S_ISREG),
    or that another user owns or may write; WHAT names it."""
    info = os.fstat(descriptor)
    if not kind(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(descriptor)
        raise ValueError(
            f"{what} is not a {'directory' if kind is stat.S_ISDIR else 'file'}"
            " of this user's alone"
        )

def open_starts(keeping=False):
    """A descriptor of the starts directory, opened through no link, or None when there
    is none; KEEPING makes it, and makes it this user's alone."""
    path = starts_directory()
    if keeping:
        os.makedirs(path, mode=0o700, exist_ok=True)
    try:
        descriptor = os.open(
            path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        )
    except FileNotFoundError:
        return None
    except OSError:
        raise ValueError(f"{path} is a link or not a directory") from None
    if keeping and os.fstat(descriptor).st_uid == os.geteuid():
        os.fchmod(descriptor, 0o700)
    owned_alone(descriptor, path, stat.S_ISDIR)
    return descriptor

def keep_start(start):
    """Keep a copy of the start event START, under its run id, in the starts
    directory."""
    if run_id_problem(start["run"]):
        raise ValueError(
            f"no copy of its start event can be kept: {run_id_problem(start['run'])}"
            " (a branch of it is a run of its own)"
        )
    line = json.dumps(start, ensure_ascii=False, sort_keys=True) + "\n"
    directory = open_starts(keeping=True)
    try:
        descriptor = os.open(
            f"{start['run']}.jsonl",
            os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK,
            0o600,
            dir_fd=directory,
        )
    finally:
        os.close(directory)
    owned_alone(descriptor, f"the kept copy of run {start['run']}", stat.S_ISREG)
    try:
        data = line.encode("utf-8")
        while data:
            data = data[os.write(descriptor, data) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def kept_starts(run):
    """The start events kept under RUN, read in the starts directory alone and through
    no link; [] when there are none."""
    directory = open_starts()
    if directory is None:
        return []
    try:
        descriptor = os.open(
            f"{run}.jsonl",
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
            dir_fd=directory,
        )
    except FileNotFoundError:
        return []
    finally:
        os.close(directory)
    owned_alone(descriptor, f"the kept copy of run {run}", stat.S_ISREG)
    with open(descriptor, encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]

def state_problem(root):
    """Why no run may work in ROOT, which holds the state directory; or ""."""
    state = os.path.realpath(os.path.dirname(runs_directory()))
    if inside(state, os.path.realpath(root)):
        return (
            f"{root} holds mlplcode's state directory {state}, where a run in it could"
            " rewrite its journals and the copies that vouch for them; set"
            " XDG_STATE_HOME to a directory outside it"
        )
    return ""


def vouch_problem(start):
    """Why no copy kept on this machine vouches for START as the person's own start
    event, or "" when one does."""
    run = start["run"]
    if run_id_problem(run):
        return run_id_problem(run)
    try:
        copies = [copy for copy in kept_starts(run) if isinstance(copy, dict)]
    except (OSError, ValueError, RecursionError) as error:
        return f"its kept copy cannot vouch for it: {error}"
    if not copies:
        return (
            f"this machine started no run {run} (no copy of its start event in"
            f" {starts_directory()})"
        )
    if start not in copies:
        changed = sorted(
            key
            for key in start.keys() | copies[0].keys()
            if start.get(key) != copies[0].get(key)
        )
        return (
            "its start event is not the one this run began with"
            f" ({', '.join(changed)} changed since)"
        )
    return ""


def claims(start):
    """What START would have a person accept, as (name, text) lines: each field that
    acts, and that a stranger may have chosen."""
    options, policy = start["model_options"], start["policy"]
    looser = [
        f"{name}={policy[name]}"
        for name, verdict in DEFAULT_POLICY.items()
        if VERDICTS.index(policy.get(name, verdict)) < VERDICTS.index(verdict)
    ]
    lines = [("root", f"{start['root']} (its tools write there, its tests run there)")]
    if looser:
        lines.append(("policy", f"{' '.join(looser)} (looser than the default)"))
    lines.append(("model", f"{start['model']} (it is sent the project's text)"))
    if options.get("api_key_env"):
        key = options["api_key_env"]
        lines.append(("key", f"the value of ${key}, sent to that model's server"))
    rest = [f"{n}={v}" for n, v in sorted(options.items()) if n != "api_key_env"]
    if rest:
        lines.append(("model options", " ".join(rest)))
    if start.get("may_change"):
        waived = " ".join(start["may_change"])
        lines.append(("may change", f"{waived} (a DONE over them needs no person)"))
    return lines

def stricter_policy(policy):
    """Each category's verdict: the default's, or POLICY's where that is stricter."""
    return {
        name: max(verdict, policy.get(name, verdict), key=VERDICTS.index)
        for name, verdict in DEFAULT_POLICY.items()
    }


def under_defaults(start):
    """START with what only a person may grant put back: a policy no looser than the
    default, no key variable, no test files spared a person at the DONE."""
    options = {n: v for n, v in start["model_options"].items() if n != "api_key_env"}
    kept = {name: value for name, value in start.items() if name != "may_change"}
    policy = stricter_policy(start["policy"])
    return {**kept, "policy": policy, "model_options": options}

class StrangersJournal(ValueError):
    """A journal whose start event no kept copy vouches for: why not, and what it says
    that a person must confirm before anything acts on it."""

    def __init__(self, journal, why, start):
        super().__init__(f"{journal}: {why}")
        self.journal, self.why, self.start = journal, why, start

    def said(self, confirm):
        """The refusal, each claim on a line of its own, and CONFIRM: how a person takes
        the journal as theirs, in a front end's words."""
        lines = [f"{self.journal}: {self.why}; what it says, its writer chose:"]
        lines += [f"  {name}: {text}" for name, text in claims(self.start)]
        return "\n".join(lines + [f"if each line is yours: {confirm}"])

    def __str__(self):
        return self.said("pass trust_journal=True")

def check_start(start, journal, confirmed=False):
    """Refuse to go on from START, JOURNAL's start event, unless a kept copy vouches for
    it or the person CONFIRMED it; keep a confirmed one, theirs from then on."""
    why = vouch_problem(start)
    if why and not confirmed:
        raise StrangersJournal(journal, why, start)
    if why:
        keep_start(start)

def journal_path(journal, root, run):
    """The absolute path for a new run's journal; refuses one that exists or lies in
    ROOT."""
    if run_id_problem(run):
        raise ValueError(f"cannot start a run named so: {run_id_problem(run)}")
    if state_problem(root):
        raise ValueError(state_problem(root))
    path = os.path.abspath(journal or os.path.join(runs_directory(), f"{run}.jsonl"))
    if os.path.lexists(path):
        raise ValueError(f"{path} already exists; a journal holds one run")
    if inside(os.path.realpath(path), os.path.realpath(root)):
        raise ValueError(
            f"{path} is inside the project; a journal must lie where the run cannot"
            " change it (leave it out to use the default place)"
        )
    return path

class Agent:
    """One run of the loop, kept in its journal, driven one call at a time."""

    @classmethod
    def start(
        cls,
        task,
        root,
        model,
        journal=None,
        budget=DEFAULT_BUDGET,
        policy=DEFAULT_POLICY,
        model_options=None,
        on_event=None,
        on_retry=None,
        run=None,
        may_change=(),
    ):
        """Start a new run and return its Agent; refuses, before anything is written, a root
        that is not a directory, a journal that exists or lies in the root, a model spec
        that names no model, and settings the journal would refuse to read back."""
        if not os.path.isdir(root):
            raise ValueError(f"{root}: not a directory")
        run, options = run or new_run_id(), settled_options(model, model_options or {})
        if compaction.context_problem(task, options):
            raise ValueError(compaction.context_problem(task, options))
        journal = journal_path(journal, root, run)
        built = model_from_spec(
            model, **options, **({"on_retry": on_retry} if on_retry else {})
        )
        root = os.path.realpath(root)
        start = {
            "type": "start",
            "task": task,
            "budget": budget,
            "policy": policy,
            "model": lasting_spec(model),
            "model_options": options,
            "root": root,
            "run": run,
            "marker": secrets.token_hex(4),
        }
        if may_change:
            start["may_change"] = sorted({os.path.normpath(path) for path in may_change})
        if start_problem(start):
            raise ValueError(f"cannot start this run: {start_problem(start)}")
        keep_start(start)  # first: if the starts directory refuses it, no journal is left
        os.makedirs(os.path.dirname(journal), exist_ok=True)
        append_event(journal, start)
        return cls(journal, on_event, on_retry, model=built)

    def __init__(
        self, journal, on_event=None, on_retry=None, model=None, trust_journal=False
    ):
        """The run recorded in JOURNAL, taken up where it stopped; TRUST_JOURNAL: the person
        takes what it says as theirs."""
        self.journal, self.on_event, self.on_retry = (
            os.path.abspath(journal),
            on_event,
            on_retry,
        )
        self.trust_journal, self.syncing = trust_journal, None
        cut_torn_line(self.journal)
        self.load(model)

    def load(self, model=None):
        """Become what the journal says: its events and their state, and, if the run can go
        on, its project and a model past the replies used (MODEL, when one was just built).
        """
        events = read_events(self.journal)
        state = fold(events)
        start = state.start
        whole_policy(start["policy"], self.journal)
        goes_on = state.stop is None or state.stop["reason"] == "interrupted"
        if goes_on:
            # Before the agent becomes what a forged journal says.
            if state_problem(start["root"]):
                raise ValueError(f"{self.journal}: {state_problem(start['root'])}")
            check_start(start, self.journal, self.trust_journal)
        self.events, self.state = events, state
        self.run_id, self.root, self.model_spec = (
            start["run"],
            start["root"],
            start["model"],
        )
        self.rendered, self.model = Rendered(), None
        self.opened, self.preparing = None, None
        if goes_on:
            if not os.path.isdir(self.root):
                raise ValueError(f"{self.journal}: the run's project {self.root} is gone")
            first = self.state.tests is None and not self.state.steps
            self.preparing = Preparing(self.root, record_tests=first)
            retry = {"on_retry": self.on_retry} if self.on_retry else {}
            used = replies_used(
                self.model_spec, len(self.state.steps), self.state.compactions
            )
            self.model = model or model_from_spec(
                self.model_spec, used=used, **start["model_options"], **retry
            )

    @property
    def project(self):
        """The project, once opened; the first use waits for it, and records the tests as
        they were when the run has no record of them yet."""
        if self.preparing:
            self.opened, tests = self.preparing.wait()
            self.preparing = None
            if tests:
                self.record(tests)
        return self.opened
    
    @project.setter
    def project(self, project):
        self.opened = project

    def record(self, event):
        """Append EVENT to the journal, flushed, then apply it to the state and tell the
        watcher."""
        append_event(self.journal, event)
        self.events.append(event)
        apply(self.state, event)
        if self.on_event:
            self.on_event(event, self.state)

    def prompt(self):
        """The messages the model will be sent at the next step."""
        return build_context(self.state, self.rendered)

    def check_can_step(self):
        """Refuse a step after the stop, while an ask waits, or after a step was cut
        short."""
        state = self.state
        if state.stop and state.stop["reason"] == "interrupted":
            raise AgentError("the run was interrupted", "resume")
        if state.stop:
            raise AgentError(f"the run has stopped ({state.stop['reason']})", "start")
        waiting = waiting_step(state)
        if waiting:
            raise AgentError(f"step {waiting.number} is waiting for a decision", "decide")
        if state.steps and state.steps[-1].observation is None:
            raise AgentError(f"step {state.steps[-1].number} was cut short", "resume")

    def step(self, count=1):
        """Take up to COUNT steps, stopping early at an ask or at the end of the run."""
        self.check_can_step()
        return self.advance(count)

    def run(self):
        """Take steps until an ask waits or the run stops."""
        self.check_can_step()
        return self.advance(None)

    def advance(self, count):
        """Take COUNT steps (any number for None), stopping when an ask waits or the run
        stops."""
        state, first, taken = self.state, len(self.state.steps) + 1, 0
        with self.interruptible():
            while (count is None or taken < count) and not (
                state.stop or waiting_step(state)
            ):
                self.project = loop.step(
                    state, self.model, self.project, self.record, self.rendered
                )
                taken += 1
        return self.report(range(first, len(state.steps) + 1))

    def drive(self, decider):
        """Run to the stop, answering each ask with DECIDER(action) -> (approved,
        reason)."""
        while not self.state.stop:
            waiting = waiting_step(self.state)
            if waiting:
                self.decide(*decider(waiting.action))
            else:
                self.run()
        return self.report([])

    def waiting(self):
        """The step that waits for a decision; refuses when none does."""
        waiting = waiting_step(self.state)
        if waiting is None:
            raise AgentError(
                "nothing is waiting for a decision", "start" if self.state.stop else "step"
            )
        return waiting

    def approve(self):
        """Approve the action that waits, and carry it out."""
        return self.decide(True, "")

    def decide(self, approved, reason):
        """Record the decision on the step that waits and do what it means (chapter "The
        loop")."""
        number = self.waiting().number
        reason = "".join(c for c in " ".join(reason.split()) if c.isprintable())
        with self.interruptible():
            self.project = loop.decide(
                self.state, approved, reason, self.project, self.record
            )
        return self.report([number])

    def deny(self, reason=""):
        """Decline the action that waits; with a REASON the model reads it and goes on.
        Without one the run ends as denied, but a declined DONE is only refused."""
        return self.decide(False, reason)

    def note(self, text):
        """Record a note from the human; the model sees it in its next prompt."""
        if self.state.stop:
            raise AgentError(
                f"the run has stopped ({self.state.stop['reason']}); no model will read a"
                " note",
                "start",
            )
        with self.interruptible():
            self.record({"type": "note", "text": text})

    def compact(self):
        """Fold every step so far into a summary that stands for them in the prompt."""
        self.check_can_step()
        if len(self.state.steps) == self.state.summarized:
            raise AgentError("there is nothing to compact yet", "step")
        with self.interruptible():
            try:
                compaction.compact(self.state, self.model, self.record, force=True)
            except ModelError as error:
                self.record(loop.stop("error", str(error)))
        return self.report([])

    def fork(self, at, journal=None, trust_journal=False):
        """A new run that takes this one up as it stood before step AT, in a copy of its
        project."""
        from .branch import fork
    
        sync_journal(self.journal)
        trust = trust_journal or self.trust_journal
        branch = fork(self.journal, at, journal, trust_journal=trust)[0]
        return Agent(branch, self.on_event, self.on_retry)

    def resume(self):
        """Take up a run that was interrupted or cut short; refuses one that has
        finished."""
        stopped = self.state.stop
        if stopped and stopped["reason"] != "interrupted":
            raise AgentError(
                f"the run has stopped ({stopped['reason']}) and cannot be taken up again",
                "start",
            )
        with self.interruptible():
            if stopped:
                self.record({"type": "resume"})
            self.close_cut_step(INTERRUPTED if stopped else ENDED)
        return self.report([])

    @contextlib.contextmanager
    def interruptible(self):
        """Sync the journal when the work ends, the last sync waited for first; on an
        interrupt, first reload, close the step cut short and stop the run as
        interrupted."""
        try:
            yield
        except KeyboardInterrupt:
            self.load()
            self.close_cut_step(INTERRUPTED)
            if not self.state.stop:
                self.record(
                    loop.stop(
                        "interrupted",
                        f"the human stopped the run after step {len(self.state.steps)}"
                        if self.state.steps
                        else "the human stopped the run before its first step",
                    )
                )
            raise
        finally:
            if self.syncing:
                self.syncing.wait()
            self.syncing = Syncing(self.journal)

    def close_cut_step(self, cause):
        """Give the last step an observation, saying CAUSE, if an interrupt or a crash left
        it without one."""
        state = self.state
        last = state.steps[-1] if state.steps else None
        if (
            last
            and last.observation is None
            and state.stop is None
            and not waiting_step(state)
        ):
            self.record(loop.observation(last.number, False, cut_step_text(last, cause)))

    def report(self, numbers):
        """A Report of the steps NUMBERS, in the state as it is now."""
        return Report(self.run_id, snapshot(self.state), tuple(numbers))

class Preparing:
    """What a run needs before its first step, made in a thread of its own: the project
    at ROOT opened and, when RECORD_TESTS, its tests recorded as they are. wait() gives
    (project, the tests event or None) and raises what the thread raised."""

    def __init__(self, root, record_tests):
        self.result, self.error = None, None
        self.thread = threading.Thread(target=self.prepare, args=(root, record_tests))
        self.thread.start()

    def prepare(self, root, record_tests):
        time.sleep(0)  # the thread that started this one goes on first
        try:
            tests = None
            if record_tests:
                record = snapshot_tests(root)
                digest, files = keep_tests(record), len(record)
                tests = {"type": "tests", "sha256": digest, "files": files}
            self.result = open_project(root), tests
        except Exception as error:  # raised again in the run's own thread
            self.error = error

    def wait(self):
        self.thread.join()
        if self.error:
            raise self.error
        return self.result

class Syncing:
    """The sync of the journal at PATH, in a thread of its own; wait() waits for it and
    raises what it raised."""

    def __init__(self, path):
        self.error = None
        self.thread = threading.Thread(target=self.sync, args=(path,))
        self.thread.start()

    def sync(self, path):
        try:
            sync_journal(path)
        except OSError as error:
            self.error = error

    def wait(self):
        self.thread.join()
        if self.error:
            raise self.error

INTERRUPTED = "INTERRUPTED: the human stopped this step before it finished"
ENDED = (
    "CUT SHORT: the process that ran this step ended before the step finished,"
    " and recorded no reason"
)


def cut_step_text(step, cause):
    """The observation of STEP, cut short by CAUSE: what is known of how far it got."""
    if step.action.get("tool") == "done" and (step.verdict == "allow" or step.approved):
        return f"{cause}; the DONE was not judged: send it again when it holds"
    if step.verdict == "allow" or step.approved:
        return (
            f"{cause}; its action may have been carried out, whole or in part: look"
            " before doing it again"
        )
    return f"{cause}; its action was not carried out"

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
