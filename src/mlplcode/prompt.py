"""The prompt: what the model sees at each step."""
from .protocol import format_action

SYSTEM_PROMPT = """\
You are a coding agent working on a project. You act by replying with exactly \
one action, in one of these six forms:

READ <path>
SEARCH <text>
WRITE <path>
<complete file contents>
END
PATCH <path>
OLD
<exact existing lines>
NEW
<replacement lines>
END
RUN <command>
DONE <summary>

Rules:
- Reply with exactly one action. Never write an OBSERVATION: the tools \
answer your action, and you will see their answer on your next turn.
- Paths are relative to the project root.
- READ a file before you WRITE or PATCH it. WRITE replaces the whole file. \
PATCH replaces the OLD lines, which must occur exactly once in the file.
- RUN runs the tests or looks at git, without a shell: pytest, \
python -m pytest, git status, git diff.
- DONE is accepted only after you have edited a file and a test run has \
passed since that edit.
"""

OBSERVATION_LIMIT = 4000


def cut(text, limit):
    """TEXT, or its head and tail with a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"

def shown_action(step):
    """An earlier action as the model wrote it: canonical when parsed, raw when not."""
    if "error" in step.action:
        return cut(step.reply, OBSERVATION_LIMIT)
    return format_action(step.action).rstrip("\n")

def build_context(state):
    """The messages for the next model turn: the system prompt, then one user message.

    The user message holds the task, every earlier ACTION/OBSERVATION pair,
    the human's notes where they were written, and the steps left.
    """
    parts = [f"TASK: {state.task}"]
    notes = {}
    for after, text in state.notes:
        notes.setdefault(after, []).append(text)
    parts += [f"NOTE FROM THE HUMAN: {text}" for text in notes.get(0, [])]
    for step in state.steps:
        parts.append(f"ACTION {step.number}:\n{shown_action(step)}")
        if step.observation:
            parts.append(f"OBSERVATION {step.number}:\n"
                         f"{cut(step.observation['text'], OBSERVATION_LIMIT)}")
        parts += [f"NOTE FROM THE HUMAN: {text}" for text in notes.get(step.number, [])]
    left = state.budget - len(state.steps)
    parts.append(f"You have {left} of {state.budget} steps left. Reply with exactly one action.")
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "\n\n".join(parts)}]
