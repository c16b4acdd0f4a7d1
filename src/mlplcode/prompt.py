"""The prompt: what the model sees at each step."""
from dataclasses import dataclass, field
from itertools import chain

from .protocol import format_action
from .verbs import VERBS

PROTOCOL_RULES = (
    "Reply with exactly one action. Never write an OBSERVATION: the tools answer your"
    " action, and you will see their answer on your next turn.",
    "Paths are relative to the project root.",
)
SYSTEM_PROMPT = (
    "You are a coding agent working on a project. You act by replying with exactly one"
    " action, in one of these forms:\n\n"
    + "\n".join(verb.form for verb in VERBS)
    + "\n\nRules:\n"
    + "".join(f"- {rule}\n" for rule in (*PROTOCOL_RULES, *(verb.rule for verb in VERBS if verb.rule)))
)

OBSERVATION_LIMIT = 4000


def cut(text, limit):
    """TEXT, or its head and tail with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"

def shown_action(step):
    """An earlier action as the model wrote it: canonical when parsed, raw when not."""
    if "tool" not in step.action:
        return cut(step.reply, OBSERVATION_LIMIT)
    return format_action(step.action).rstrip("\n")

REPEAT_NOTE = "NOTE: this reply is identical to your previous one.\n"


def shown_observation(observation):
    """An observation as the model reads it: the repeat note, then the text, cut."""
    note = REPEAT_NOTE if observation.get("repeat") else ""
    return note + cut(observation["text"], OBSERVATION_LIMIT)

def segment(state, number, next_note):
    """The paragraphs of segment NUMBER (0: the task) and the index of the first note after it."""
    if number == 0:
        paragraphs = [f"TASK: {state.task}"]
    else:
        step = state.steps[number - 1]
        paragraphs = [f"ACTION {number}:\n{shown_action(step)}"]
        if step.observation:
            paragraphs.append(f"OBSERVATION {number}:\n{shown_observation(step.observation)}")
    while next_note < len(state.notes) and state.notes[next_note][0] == number:
        paragraphs.append(f"NOTE FROM THE HUMAN: {state.notes[next_note][1]}")
        next_note += 1
    return paragraphs, next_note

@dataclass
class Rendered:
    """The paragraphs of the prompt's final segments, kept from one step to the next."""
    segments: int = 0
    next_note: int = 0
    paragraphs: list = field(default_factory=list)

def build_context(state, rendered=None):
    """The messages for the next model turn: the system prompt, then one user message.

    The user message holds the task, every earlier ACTION/OBSERVATION pair,
    the human's notes where they were written, and the steps left. RENDERED,
    when given, keeps the segments that can no longer change between calls.
    """
    rendered = Rendered() if rendered is None else rendered
    while rendered.segments < len(state.steps):
        paragraphs, rendered.next_note = segment(state, rendered.segments, rendered.next_note)
        rendered.paragraphs += paragraphs
        rendered.segments += 1
    last, _ = segment(state, len(state.steps), rendered.next_note)
    left = state.budget - len(state.steps)
    budget = f"You have {left} of {state.budget} steps left. Reply with exactly one action."
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "\n\n".join(chain(rendered.paragraphs, last, [budget]))}]
