"""Verification: DONE is a claim, and the journal is the evidence."""

def succeeded(step, tools):
    """Whether STEP used one of TOOLS and its observation says it worked."""
    return step.action.get("tool") in tools and bool(step.observation and step.observation["ok"])

def verify_done(state):
    """(True, "") when a file was edited and the last test run after the edit passed.

    Otherwise (False, reason): the model sees NOT VERIFIED and the reason,
    and the run goes on. A claim of success is not success.
    """
    edits = [n for n, step in enumerate(state.steps) if succeeded(step, ("write", "patch"))]
    if not edits:
        return False, "no file was edited; DONE needs an edit followed by a passing test run"
    runs = [step.observation for step in state.steps[edits[-1] + 1 :]
            if step.action.get("tool") == "run" and step.observation
            and step.observation.get("kind") == "run"]
    if not runs:
        return False, "no test run since the last edit; RUN the tests first"
    if not runs[-1].get("passed"):
        return False, "the last test run did not pass; fix the failure and RUN the tests again"
    return True, ""
