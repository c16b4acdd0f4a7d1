"""The loop: one step per model turn, every fact recorded as an event."""
from .guards import guard, repeat_note
from .journal import fold, waiting_step
from .models import ModelError
from .policy import authorize, category
from .prompt import build_context
from .protocol import format_action, parse_action
from .tools import check_action, command_refusal, execute, fingerprint
from .verify import verify_done

def stop(reason, message):
    return {"type": "stop", "reason": reason, "message": message}

def observation(number, ok, text, **details):
    return {"type": "observation", "step": number, "ok": ok, "text": text, **details}

def step(events, model, root, decide, record):
    """Take one turn: ask, parse, guard, authorize, decide, execute, each recorded.

    RECORD appends an event (to EVENTS and the journal). DECIDE answers an
    ask: True to approve, False to decline. Without DECIDE an ask is left
    waiting, for `resolve` to finish when a person has answered.
    """
    state = fold(events)
    if len(state.steps) >= state.budget:
        return record(stop("budget", f"all {state.budget} steps used"))
    try:
        reply = model(build_context(state))
    except ModelError as error:
        return record(stop("error", str(error)))
    number = len(state.steps) + 1
    action = parse_action(reply)
    record({"type": "reply", "step": number, "text": reply})
    record({"type": "action", "step": number, "action": action})
    verdict, reason = judge(state, reply, action, root)
    event = {"type": "verdict", "step": number, "verdict": verdict, "reason": reason}
    record({**event, "target": fingerprint(action, root)} if verdict == "ask" else event)
    if verdict == "stuck":
        return record(stop("stuck", f"step {number}: {reason}"))
    if verdict == "deny":
        return record(stop("denied", f"step {number}: {reason}"))
    if verdict == "ask" and decide is None:
        return None
    if verdict == "ask":
        record({"type": "decision", "step": number, "approved": decide(action)})
    carry_out(events, root, record)

def judge(state, reply, action, root):
    """The verdict on ACTION and why: a stuck run, a parse error, the tools' own refusal
    of its paths, the read-first guard, then the policy."""
    refusal, reason = guard(state, reply, action, root)
    if refusal == "stuck":
        return refusal, reason
    if "error" in action:
        return "refused", f"PARSE ERROR: {action['error']}"
    path_refusal = check_action(action, root)
    if path_refusal:
        return "refused", path_refusal
    if refusal:
        return refusal, reason
    verdict, kind = authorize(action, state.policy), category(action)
    why = f" ({command_refusal(action['command'])})" if kind == "shell" else ""
    return verdict, f"{headline(action)} is {kind}: {verdict}{why}"

def headline(action):
    """The first line of ACTION in protocol text, for messages."""
    return format_action(action).split("\n", 1)[0]

def carry_out(events, root, record):
    """Execute the last step's action, now that it is allowed or decided, and record what happened."""
    state = fold(events)
    last = state.steps[-1]
    note = repeat_note(state)
    if last.verdict == "refused":
        return record(observation(last.number, False, note + last.reason))
    if last.approved is False:
        return record(observation(last.number, False, note + "DECLINED: the human said no to this action"))
    if last.target is not None and fingerprint(last.action, root) != last.target:
        return record(observation(last.number, False, note + "CHANGED: the target is not what the"
                                  " human approved, so nothing was done; send the action again"))
    if last.action["tool"] == "done":
        verified, why = verify_done(state)
        if not verified:
            return record(observation(last.number, False, note + f"NOT VERIFIED: {why}"))
        record(observation(last.number, True, "DONE accepted"))
        return record(stop("done", last.action["summary"]))
    result = execute(last.action, root)
    record(observation(last.number, **{**result, "text": note + result["text"]}))

def resolve(events, approved, root, record):
    """Decide the ask that waits at the end of EVENTS, then carry its action out."""
    waiting = waiting_step(fold(events))
    if waiting is None:
        raise ValueError("no action is waiting for a decision")
    record({"type": "decision", "step": waiting.number, "approved": approved})
    carry_out(events, root, record)

DEFAULT_BUDGET = 20

def run(events, model, root, decide, record, on_step=lambda state: None):
    """Step until the run stops; return the stop reason."""
    while fold(events).stop is None:
        step(events, model, root, decide, record)
        on_step(fold(events))
    return fold(events).stop["reason"]
