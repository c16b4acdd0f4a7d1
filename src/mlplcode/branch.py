"""Branching: a new run that takes up an old one as it stood before one of its steps."""

import hashlib
import json
import os

from .agent import (
    StrangersJournal,
    journal_path,
    keep_start,
    new_run_id,
    runs_directory,
    state_problem,
    under_defaults,
    vouch_problem,
)
from .journal import append_event, fold, read_events
from .tools.read import copy_tree
from .trust import inside

def events_before(events, at):
    """The events of a run before the reply of step AT; refuses a step the run does not
    have."""
    for index, event in enumerate(events):
        if event["type"] == "reply" and event["step"] == at:
            return events[:index]
    steps = sum(event["type"] == "reply" for event in events)
    if not steps:
        raise ValueError("the run has no steps yet; a branch starts at one of them")
    raise ValueError(f"the run has steps 1 to {steps}; a branch starts at one of them")

def ran_tests(step):
    """Whether STEP ran a program, which may have changed any file: a RUN that was
    carried out, whatever its observation says."""
    return step.action.get("tool") == "run" and (
        step.verdict == "allow" or step.approved is True
    )

def tool_on(step, path):
    """The tool of STEP when it read, wrote or patched PATH (a normal path) and
    succeeded; else None."""
    action = step.action
    if (
        action.get("tool") in ("read", "write", "patch")
        and os.path.normpath(action["path"]) == path
        and step.observation
        and step.observation["ok"]
    ):
        return action["tool"]
    return None


def text_read(step):
    """The text a READ step showed: its observation without the header line."""
    return step.observation["text"].split("\n", 1)[1]

def known_before(state, path, at):
    """The text of PATH as the journal vouches for it before step AT (None: the file did
    not exist yet), or raises ValueError when the journal cannot tell."""
    path = os.path.normpath(path)
    text, known, seen, run = None, False, False, None
    for step in state.steps[: at - 1]:
        tool = tool_on(step, path)
        if ran_tests(step) and seen:
            known, run = False, step.number
        elif tool == "patch" and known:
            text = text.replace(step.action["old"], step.action["new"], 1)
        elif tool in ("read", "write"):
            text = text_read(step) if tool == "read" else step.action["content"]
            known, seen, run = True, True, None
    if not known:
        text, known, after = first_sight(state, path, at, seen)
        run = run or after
    if not known or (text is not None and "[redacted]" in text):
        why = f"; the test run at step {run} may have changed it" if run else ""
        raise ValueError(
            f"{path}: the journal does not say what it held before step {at}{why}"
        )
    return text

def first_sight(state, path, at, seen):
    """What the steps from AT on tell of PATH (a normal path) as it was at AT: (text or
    None, whether they tell, the test run that ended the search or None). SEEN says
    whether the run saw PATH before AT."""
    for step in state.steps[at - 1 :]:
        tool = tool_on(step, path)
        if ran_tests(step):
            return None, False, step.number
        if tool == "read":
            return text_read(step), True, None
        if tool:
            return None, tool == "write" and not seen, None
    return None, False, None

def changed_paths(state, at):
    """The paths, in normal form, that steps AT and later wrote or patched."""
    return sorted(
        {
            os.path.normpath(step.action["path"])
            for step in state.steps[at - 1 :]
            if step.action.get("tool") in ("write", "patch")
            and step.observation
            and step.observation["ok"]
        }
    )


def restore(root, texts):
    """Write each path's text under ROOT, or remove the path where its text is None."""
    for path, text in texts.items():
        target = os.path.join(root, path)
        if not inside(os.path.realpath(target), os.path.realpath(root)):
            raise ValueError(f"{path}: leads out of the branch's copy of the project")
        if text is None:
            if os.path.lexists(target):
                os.unlink(target)
            continue
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "w", encoding="utf-8", newline="") as file:
            file.write(text)

def fork(journal, at, new_journal=None, root=None, trust_journal=False):
    """Branch the run in JOURNAL before its step AT: (the new journal, its root, steps
    that ran tests). ROOT, when given, is the project to copy instead of the run's;
    TRUST_JOURNAL: the person takes JOURNAL as theirs."""
    with open(journal, "rb") as file:
        digest = hashlib.sha256(file.read()).hexdigest()
    events = read_events(journal)
    kept, state = events_before(events, at), fold(events)
    why = "" if trust_journal else vouch_problem(state.start)
    if why and root is None:
        raise StrangersJournal(journal, why, state.start)
    root = root or state.start["root"]
    if not os.path.isdir(root):
        raise ValueError(
            f"{journal}: the run's project {root} is gone; name the project to branch"
            " from (mlplcode fork --root DIR)"
        )
    if state_problem(root):
        raise ValueError(f"{journal}: {state_problem(root)}")
    texts = {path: known_before(state, path, at) for path in changed_paths(state, at)}
    run = new_run_id()
    copy = os.path.join(
        os.path.dirname(runs_directory()),
        "branches",
        run,
        os.path.basename(root),
    )
    new_journal = journal_path(new_journal, copy, run)
    untold = [step.number for step in state.steps[at - 1 :] if ran_tests(step)]
    copy_tree(root, copy)
    restore(copy, texts)
    os.makedirs(os.path.dirname(new_journal), exist_ok=True)
    after_start, start = kept[kept.index(state.start) + 1 :], {
        **(under_defaults(state.start) if why else state.start),
        "run": run,
        "root": copy,
    }
    for event in [
        {
            "type": "branch",
            "parent": os.path.abspath(journal),
            "sha256": digest,
            "at": at,
            "untold": untold,
        },
        start,
        *after_start,
    ]:
        append_event(new_journal, event)
    if not why:
        keep_start(start)
    return new_journal, copy, untold

def untold_warning(untold):
    """What a person is told of the steps from N on that ran tests; "" when none did."""
    if not untold:
        return ""
    return (
        f"warning: step(s) {', '.join(map(str, untold))} ran tests, which may have"
        " changed files the journal does not record; the copy has them as they"
        " are now"
    )

def first_event(journal):
    """The first event of JOURNAL, read alone, or None when it cannot be read."""
    try:
        with open(journal, encoding="utf-8") as file:
            return json.loads(file.readline())
    except (OSError, ValueError):
        return None

def tree_view(journal):
    """A view of JOURNAL's ancestors, JOURNAL, and the runs branched from it."""
    view, ancestors, here = [("title", "", "runs")], [], os.path.abspath(journal)
    event = first_event(here)
    while (
        isinstance(event, dict)
        and event.get("type") == "branch"
        and len(ancestors) < 100
    ):
        ancestors.append((event["parent"], event["at"]))
        event = first_event(event["parent"])
    for parent, at in reversed(ancestors):
        view.append(("line", "parent", f"{parent} (branched before step {at})"))
    view.append(("line", "this run", here))
    folders = {runs_directory(), os.path.dirname(here)}
    for folder in sorted(folder for folder in folders if os.path.isdir(folder)):
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            event = first_event(path) if name.endswith(".jsonl") else None
            if (
                isinstance(event, dict)
                and event.get("type") == "branch"
                and event.get("parent") == here
            ):
                view.append(("line", "branch", f"{path} (before step {event['at']})"))
    return view
