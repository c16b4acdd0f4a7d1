"""Transcripts: a run rendered from its journal as Markdown, Org or a notebook."""

import os

from .journal import fold, read_events, waiting_step
from .show import (
    as_markdown,
    bundle,
    compact_view,
    note_view,
    safe_view,
    step_view,
    stop_view,
    waiting_view,
)
from .trust import markdown_text, org_verbatim, visible
from .verbs import VERB_OF_TOOL

TRANSCRIPT_WORDS = {"decide": "a decision on the last step"}

def start_view(start):
    """The facts of a run's start: its task, root, model, budget and policy."""
    policy = " ".join(
        f"{category}={verdict}" for category, verdict in start["policy"].items()
    )
    return [
        ("title", "", f"mlplcode run {start['run']}"),
        ("block", "task", start["task"]),
        ("line", "root", start["root"]),
        ("line", "model", start["model"]),
        ("line", "budget", str(start["budget"])),
        ("line", "policy", policy),
    ]


def branch_view(branch):
    """Where a branch comes from: its parent's journal and the step it was left at."""
    return [
        ("line", "branched from", f"{branch['parent']}, before step {branch['at']}")
    ]

def sections(events):
    """The run of EVENTS as [(kind, step number, view)], each view titled, in the order
    things happened."""
    state = fold(events)
    result = [
        (
            "task",
            None,
            start_view(state.start)
            + (branch_view(state.branch) if state.branch else []),
        )
    ]
    steps = 0
    for event in events:
        text = event.get("text") if event["type"] == "note" else event.get("reason")
        if event["type"] in ("note", "decision") and text:
            result.append(
                (
                    "note",
                    steps,
                    [("title", "", "note from the human")] + note_view(text),
                )
            )
        elif event["type"] == "compact":
            result.append(
                (
                    "compact",
                    steps,
                    [("title", "", "compaction")]
                    + compact_view(event["upto"], event["summary"]),
                )
            )
        elif event["type"] == "reply":
            steps = event["step"]
            result.append(("step", steps, step_view(state, state.steps[steps - 1])))
    waiting = waiting_step(state)
    if waiting:
        result.append(
            (
                "ask",
                waiting.number,
                [("title", "", "waiting")] + waiting_view(TRANSCRIPT_WORDS),
            )
        )
    if state.stop:
        result.append(("stop", steps, [("title", "", "stop")] + stop_view(state.stop)))
    return result

def transcript_view(events):
    return [part for _, _, view in sections(events) for part in view]

def markdown(events):
    parts = [
        as_markdown(view, level=1 if kind == "task" else 2)
        for kind, _, view in sections(events)
    ]
    return "\n".join(parts)

def one_line(text):
    return text.replace("\n", "\\n")


ORG_HEADINGS = {
    "note": "note from the human",
    "compact": "compaction",
    "ask": "waiting",
    "stop": "stop",
}


def org_heading(kind, number, state):
    """The heading of a section of KIND: its words, or a step's number and verb."""
    if kind != "step":
        return f"* {ORG_HEADINGS[kind]}"
    tool = state.steps[number - 1].action.get("tool")
    return f"* step {number}: {VERB_OF_TOOL[tool].name if tool else 'reply not parsed'}"


def org(events):
    """The run of EVENTS as an Org document: a title, then a section per note, step and
    stop."""
    lines, state = [], fold(events)
    for kind, number, view in sections(events):
        title, body = view[0][2], view[1:]
        if kind == "task":
            lines += ["#+TITLE: mlplcode run", org_verbatim(one_line(title))]
        else:
            lines.append(org_heading(kind, number, state))
        if kind == "step":
            lines.append(org_verbatim(one_line(title)))
        for part, label, text in body:
            if part == "line":
                lines.append(org_verbatim(f"{label}: {one_line(text)}"))
            else:
                lines += [f"{visible(label)}:", org_verbatim(text.rstrip("\n"))]
        lines.append("")
    return "\n".join(lines)

def note_source(text):
    """A note as the source of a cell that the kernel reads as that very note."""
    return "%%note\n" + text if text.strip().startswith("%") else text

def notebook(events):
    """The run of EVENTS as a notebook of the cells that would have driven it."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    state = fold(events)
    start = state.start
    cells = [
        new_markdown_cell(
            f"# mlplcode run {markdown_text(start['run'])}\n\nRendered from the run's"
            " journal."
        ),
        new_code_cell(visible(settings_source(start))),
    ]
    views = {(kind, number): view for kind, number, view in sections(events)}

    def output(kind, number, view):
        return new_output(
            "display_data",
            data=bundle(view),
            metadata={"mlplcode": {"run": start["run"], "step": number, "kind": kind}},
        )

    cells.append(
        new_code_cell(
            visible("%%task\n" + start["task"]),
            outputs=[output("task", None, views["task", None])],
        )
    )
    number, step_cell = 0, None
    for event in events:
        if event["type"] == "note":
            cells.append(
                new_code_cell(
                    visible(note_source(event["text"])),
                    outputs=[output("note", number, note_view(event["text"]))],
                )
            )
        elif event["type"] == "reply":
            number = event["step"]
            step_cell = new_code_cell(
                "%step", outputs=[output("step", number, views["step", number])]
            )
            cells.append(step_cell)
        elif event["type"] == "decision" and cells[-1] is step_cell:
            step_cell.source += "\n" + visible(decision_command(event))
        elif event["type"] == "decision":
            cells.append(new_code_cell(visible(decision_command(event))))
        elif event["type"] == "compact":
            cells.append(new_markdown_cell(as_markdown(views["compact", number])))
    waiting = waiting_step(state)
    if waiting:
        cells[-1].outputs.append(
            output(
                "ask",
                waiting.number,
                waiting_view({"decide": "%approve or %deny [reason]"}),
            )
        )
    if state.stop:
        cells[-1].outputs.append(
            output("stop", len(state.steps), stop_view(state.stop))
        )
    notebook = new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {
                "name": "mlplcode",
                "display_name": "mlplcode",
                "language": "mlplcode",
            },
            "language_info": {"name": "mlplcode"},
        },
    )
    nbformat.validate(notebook)
    return nbformat.writes(notebook)

def settings_source(start):
    policy = " ".join(
        f"{category}={verdict}" for category, verdict in start["policy"].items()
    )
    return (
        f"%root {start['root']}\n%model {start['model']}{model_words(start)}\n"
        f"%budget {start['budget']}\n%policy {policy}"
    )

MODEL_COMMAND_OPTIONS = ("grammar", "context", "timeout")


def model_words(start):
    """The options of START's model, as words that %model reads after the spec."""
    options = start["model_options"]
    return "".join(
        f" --{name} {'none' if options[name] is None else options[name]}"
        for name in MODEL_COMMAND_OPTIONS
        if name in options
    )

def decision_command(decision):
    """%approve, or %deny with the reason given with the "no", if any."""
    if decision["approved"]:
        return "%approve"
    return f"%deny {decision['reason']}" if decision.get("reason") else "%deny"

WRITERS = {".md": markdown, ".org": org, ".ipynb": notebook}


def save(journal, path):
    """Write the transcript of the run in JOURNAL to PATH, in the format its extension
    names.

    Returns the number of steps written. Refuses an extension other than .ipynb, .org
    and .md.
    """
    writer = WRITERS.get(os.path.splitext(path)[1])
    if writer is None:
        raise ValueError(
            f"{path}: a transcript is saved as FILE.ipynb, FILE.org or FILE.md"
        )
    events = read_events(journal)
    with open(path, "w", encoding="utf-8") as file:
        file.write(writer(events))
    return len(fold(events).steps)
