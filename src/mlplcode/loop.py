"""The loop: one step per model turn, every fact recorded as an event."""

from .commands import command_refusal
from .compaction import compact, needs_compaction
from .guards import guard, repeated
from .journal import waiting_step
from .models import CUT_OFF, ModelError
from .policy import authorize, category
from .prompt import build_context
from .protocol import headline, parse_action
from .tools.project import after_action, current
from .verbs import check_action, execute, fingerprint
from .verify import test_changes, verify_done, verify_tests

def stop(reason, message):
    return {"type": "stop", "reason": reason, "message": message}

def observation(number, ok, text, **details):
    return {"type": "observation", "step": number, "ok": ok, "text": text, **details}

def step(state, model, project, record, rendered=None):
    """Take one turn: ask, parse, guard, authorize, execute, each recorded; an ask is
    left waiting.

    RECORD appends an event to the journal and applies it to STATE. Returns
    the project as the step left it.
    """
    project = current(project)
    if len(state.steps) >= state.budget:
        record(stop("budget", f"all {state.budget} steps used"))
        return project
    try:
        if needs_compaction(state, rendered):
            compact(state, model, record)
        reply = model(
            build_context(state, rendered)
            if getattr(model, "reads_prompt", True)
            else []
        )
    except ModelError as error:
        record(stop("error", str(error)))
        return project
    number, action = len(state.steps) + 1, parse_action(reply)
    verdict, reason = judge(state, reply, action, project)
    target = fingerprint(action, project) if verdict == "ask" else None
    cut = {"cut": True} if getattr(reply, "cut", False) else {}
    record({"type": "reply", "step": number, "text": str(reply), **cut})
    record({"type": "action", "step": number, "action": action})
    event = {"type": "verdict", "step": number, "verdict": verdict, "reason": reason}
    record({**event, "target": target} if target is not None else event)
    if verdict in ("stuck", "deny"):
        record(
            stop(
                "stuck" if verdict == "stuck" else "denied", f"step {number}: {reason}"
            )
        )
    elif verdict != "ask":
        project = carry_out(state, project, record)
    return project

def judge(state, reply, action, project):
    """The verdict on ACTION and why: a stuck run, a parse error, the tools' own refusal
    of its paths, the read-first guard, then the policy."""
    refusal, reason = guard(state, reply, action, project)
    if refusal == "stuck":
        return refusal, reason
    if getattr(reply, "cut", False):
        limit = state.start["model_options"].get("max_tokens", "its")
        return "refused", CUT_OFF.format(limit=limit)
    if "error" in action:
        return "refused", f"PARSE ERROR: {action['error']}"
    path_refusal = check_action(action, project)
    if path_refusal:
        return "refused", path_refusal
    if refusal:
        return refusal, reason
    verdict, kind = authorize(action, state.policy), category(action)
    why = f" ({command_refusal(action['command'])})" if kind == "shell" else ""
    return verdict, f"{headline(action)} is {kind}: {verdict}{why}"

def carry_out(state, project, record):
    """Execute the last step's action, now that it is allowed or decided; record what
    happened, and return the project as the action left it."""
    last = state.steps[-1]
    flags = {"repeat": True} if repeated(state) else {}
    if last.verdict == "refused":
        record(observation(last.number, False, last.reason, **flags))
    elif last.action["tool"] == "done":
        conclude(state, project, record, flags)
    elif last.approved is False:
        record(
            observation(
                last.number,
                False,
                "DECLINED: the human said no to this action;"
                " their reason follows as a note",
                **flags
            )
        )
    elif last.target is not None and fingerprint(last.action, project) != last.target:
        record(
            observation(
                last.number,
                False,
                "CHANGED: the target is not what the human"
                " approved, so nothing was done; send the action again",
                **flags
            )
        )
    else:
        result = execute(last.action, project)
        record(observation(last.number, **result, **flags))
        return after_action(project, last.action)
    return project

NOT_VERIFIED = "NOT VERIFIED: "
TESTS_ADVICE = (
    "Make the code pass the tests as they were; change a test only where the task asks"
    " for it, and then only a person can accept DONE."
)

def conclude(state, project, record, flags):
    """Verify the DONE of the last step (chapter "Verification"), asking a person when
    the tests as they were fail; or settle the person's answer to that ask."""
    last = state.steps[-1]
    if last.approved is None:
        accepted, why = verify_done(state)
        if not accepted:
            text = NOT_VERIFIED + why
        else:
            accepted, why, changes = verify_tests(state, project)
            if not accepted:
                record(
                    {
                        "type": "verdict",
                        "step": last.number,
                        "verdict": "ask",
                        "reason": NOT_VERIFIED + why,
                        "target": changes,
                    }
                )
                return
            text = f"DONE accepted{why}"
    elif not last.approved:
        accepted, text = False, f"{last.reason}. {TESTS_ADVICE}\n{last.target['diff']}"
    elif test_changes(state, project) != last.target:
        accepted, text = False, (
            "CHANGED: the tests changed while the person was deciding,"
            " so nothing was accepted; send DONE again"
        )
    else:
        accepted, text = (
            True,
            "DONE accepted by a person, although "
            + last.reason.removeprefix(NOT_VERIFIED),
        )
    record(observation(last.number, accepted, text, **flags))
    if accepted:
        record(stop("done", last.action["summary"]))

def decide(state, approved, reason, project, record):
    """Decide the ask that waits in STATE; return the project as the decision left
    it."""
    waiting = waiting_step(state)
    if waiting is None:
        raise ValueError("no action is waiting for a decision")
    event = {"type": "decision", "step": waiting.number, "approved": approved}
    record({**event, "reason": reason} if reason and not approved else event)
    if not approved and not reason and waiting.action["tool"] != "done":
        record(
            stop(
                "denied",
                f"step {waiting.number}: the human declined {headline(waiting.action)}",
            )
        )
        return project
    return carry_out(state, current(project), record)
