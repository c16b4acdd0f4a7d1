"""Tools: the actions the agent can take, each confined to the project root.

An action is a dict the protocol parsed from the model's reply, such as
{"tool": "read", "path": "src/app.py"}. `execute` carries it out and returns an
observation, {"ok": bool, "text": str}. A failure is an observation too: ok is
False and the text starts with "ERROR: " and says what went wrong and what to
do instead, because the model can only recover from what it is told. Nothing
raised inside a tool escapes `execute`.
"""

def observation(text: str, **fields) -> dict:
    """Build a successful observation; RUN adds its exit code and kind as extra
    fields."""
    return {"ok": True, "text": text, **fields}

def failure(message: str) -> dict:
    """Build a failed observation; the ERROR prefix tells the model and the log it
    failed."""
    return {"ok": False, "text": f"ERROR: {message}"}

class PathRefused(Exception):
    """A tool cannot use a path; the message names the path, the reason and what to
    do."""
