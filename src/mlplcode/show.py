"""Showing a run: steps, stops, notes and state as views, written out as text, Markdown
and HTML."""

import difflib
import html

from .journal import waiting_step
from .protocol import format_action, headline
from .trust import markdown_block, markdown_text, visible
from .verbs import VERB_OF_TOOL

def step_view(state, step):
    """The view of one step of STATE: title, reply, action, verdict and, once there is
    one, observation."""
    view = [
        ("title", "", f"step {step.number}: {step_title(step)}"),
        ("block", "reply", step.reply),
        action_part(state, step),
        ("line", "verdict", verdict_text(step)),
    ]
    if step.action.get("tool") == "done" and step.target:
        view.append(
            ("diff", "the tests, as this run changed them", step.target["diff"])
        )
    if step.observation and step.observation.get("repeat"):
        view.append(("line", "note", "this reply is identical to the previous one"))
    if step.observation:
        view.append(("block", "observation", step.observation["text"]))
    return view

def step_title(step):
    if "tool" in step.action:
        return headline(step.action)
    first = step.reply.strip().split("\n", 1)[0]
    return (
        f"reply not parsed: {first[:60]}"
        if first
        else "reply not parsed (an empty reply)"
    )

def action_part(state, step):
    """The action of STEP as a view part: a diff for WRITE and PATCH, protocol text
    otherwise."""
    action = step.action
    if "tool" not in action:
        return (
            "line",
            "action",
            f"none ({action.get('error', 'the step was cut short')})",
        )
    if VERB_OF_TOOL[action["tool"]].shown == "diff":
        return ("diff", "action", change(state, step))
    return ("block", "action", format_action(action).rstrip("\n"))

def verdict_text(step):
    text = (
        f"{step.verdict} ({step.reason})"
        if step.verdict
        else "none (the step was interrupted)"
    )
    if step.approved is not None:
        text += (
            ", approved by the human" if step.approved else ", declined by the human"
        )
    return text

def seen_files(steps):
    """The text of each file as STEPS saw it: read, or written whole, then patched."""
    seen = {}
    for step in steps:
        if not (step.observation and step.observation["ok"]):
            continue
        tool, path = step.action.get("tool"), step.action.get("path")
        if tool == "read":
            seen[path] = step.observation["text"].split("\n", 1)[1]
        elif tool == "write":
            seen[path] = step.action["content"]
        elif tool == "patch" and path in seen:
            seen[path] = seen[path].replace(step.action["old"], step.action["new"], 1)
    return seen

def change(state, step):
    """STEP's WRITE or PATCH as a unified diff: OLD against NEW, or the file as last
    seen against the content."""
    action, path = step.action, step.action["path"]
    if action["tool"] == "patch":
        before, after, names = (
            action["old"],
            action["new"],
            (f"{path} (OLD)", f"{path} (NEW)"),
        )
    else:
        seen = seen_files(state.steps[: step.number - 1])
        before, after = seen.get(path, ""), action["content"]
        names = (
            f"{path} (as last seen)" if path in seen else "/dev/null",
            f"{path} (written)",
        )
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), *names
    )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text or f"{path}: no change\n"

def waiting_view(words):
    return [("line", "waiting", words["decide"])]

def stop_view(stop):
    return [("line", "stop", f"{stop['reason']}: {stop['message']}")]

def note_view(text):
    return [("block", "note for the model", text)]

def compact_view(upto, summary):
    return [
        ("line", "compacted", f"steps 1 to {upto} are summarized in the prompt"),
        ("block", "summary", summary),
    ]

def report_views(state, numbers, words):
    """[(kind, step number, view)] for the steps NUMBERS of STATE, then its ask or its
    stop."""
    views = [
        ("step", number, step_view(state, state.steps[number - 1]))
        for number in numbers
    ]
    waiting = waiting_step(state)
    if waiting:
        views.append(("ask", waiting.number, waiting_view(words)))
    if state.stop:
        views.append(("stop", len(state.steps), stop_view(state.stop)))
    return views

def state_view(start, state, journal):
    """How a run stands: its facts, its steps against the budget, and what comes
    next."""
    view = [
        ("title", "", f"run {start['run']}"),
        ("line", "task", start["task"]),
        ("line", "root", start["root"]),
        ("line", "model", start["model"]),
        ("line", "journal", journal),
        ("line", "steps", f"{len(state.steps)} of {state.budget}"),
        ("line", "notes", str(len(state.notes))),
    ]
    waiting = waiting_step(state)
    if state.stop:
        return view + stop_view(state.stop)
    if waiting:
        return view + [
            ("line", "waiting", f"step {waiting.number} asks for a decision")
        ]
    return view + [("line", "next", f"step {len(state.steps) + 1}")]

def prompt_view(messages):
    return [("block", message["role"], message["content"]) for message in messages]

def policy_view(policy):
    return [("line", category, verdict) for category, verdict in policy.items()]

def safe_view(view):
    """VIEW with every label and text made visible."""
    return [(kind, visible(label), visible(text)) for kind, label, text in view]

def as_text(view):
    """VIEW as plain text: labelled lines, and blocks indented under their label."""
    lines = []
    for kind, label, text in safe_view(view):
        if kind == "title":
            lines.append(text)
        elif kind == "line":
            lines.append(f"{label}: {text}")
        else:
            lines.append(f"{label}:")
            lines += ["    " + line if line else "" for line in text.splitlines()]
    return "\n".join(lines)

def as_markdown(view, level=4):
    """VIEW as Markdown: the title a heading of LEVEL, lines in bold labels, blocks
    fenced."""
    parts = []
    for kind, label, text in safe_view(view):
        if kind == "title":
            parts.append(f"{'#' * level} {markdown_text(text)}")
        elif kind == "line":
            parts.append(f"**{label}:** {markdown_text(text)}")
        else:
            language = "diff" if kind == "diff" else "text"
            parts.append(f"**{label}:**\n\n{markdown_block(text, language)}")
    return "\n\n".join(parts) + "\n"

DIFF_COLOURS = {"+": "#116329", "-": "#a40e26", "@": "#0550ae"}


def as_html(view):
    """VIEW as an HTML fragment: a bold title, labelled lines, and blocks in <pre>."""
    parts = [
        '<div class="mlplcode tex2jax_ignore mathjax_ignore"'
        ' style="font-family: monospace">'
    ]
    for kind, label, text in safe_view(view):
        if kind == "title":
            parts.append(f"<p><strong>{html.escape(text)}</strong></p>")
        elif kind == "line":
            parts.append(f"<div><b>{html.escape(label)}:</b> {html.escape(text)}</div>")
        else:
            body = diff_html(text) if kind == "diff" else html.escape(text)
            parts.append(f"<div><b>{html.escape(label)}:</b></div><pre>{body}</pre>")
    return "".join(parts) + "</div>"

def diff_html(text):
    """A unified diff's lines, escaped and coloured by their first character."""
    lines = []
    for line in text.splitlines():
        colour = DIFF_COLOURS.get(line[:1])
        escaped = html.escape(line)
        lines.append(
            f'<span style="color:{colour}">{escaped}</span>' if colour else escaped
        )
    return "\n".join(lines)

def bundle(view):
    """VIEW in the three MIME types of a notebook output."""
    return {
        "text/plain": as_text(view),
        "text/markdown": as_markdown(view),
        "text/html": as_html(view),
    }
