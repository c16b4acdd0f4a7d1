"""Guards: what the loop refuses before any policy is consulted."""

import os

def repeats(state, reply):
    """How many replies in a row, ending with REPLY, are identical."""
    count = 1
    for step in reversed(state.steps):
        if step.reply != reply:
            break
        count += 1
    return count

def guard(state, reply, action, project):
    """Refuse ACTION before authorization: ("stuck" | "refused", why), or (None, "").

    The third identical reply in a row stops the run as stuck (the second is
    only flagged, see `repeated`). Writing or patching an existing file
    the run has not read is refused: the model would change what it has not seen.
    """
    if repeats(state, reply) >= 3:
        return "stuck", "the same reply three times in a row"
    if action.get("tool") in ("write", "patch"):
        path = os.path.normpath(action["path"])
        if path not in state.seen and os.path.lexists(os.path.join(project.root, path)):
            return (
                "refused",
                f"REFUSED: read it first: READ {action['path']} before you change it",
            )
    return None, ""

def repeated(state):
    """Whether the last reply of STATE repeats the one before."""
    steps = state.steps
    return len(steps) >= 2 and steps[-1].reply == steps[-2].reply
