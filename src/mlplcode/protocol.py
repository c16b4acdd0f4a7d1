"""The protocol: one model reply in, exactly one action record out.

The model answers with one of the verbs of the table. `parse_action` reads that
verb and its arguments out of the reply, tolerating the habits of real models,
and turns everything it cannot read into an error record whose reason the model
sees on its next turn. `format_action` writes an action back as text.
"""

import re

from .verbs import VERB_OF_TOOL, VERBS

ACTION_VERBS = tuple(verb.name for verb in VERBS)
VERB_CHOICES = ", ".join(ACTION_VERBS[:-1]) + " or " + ACTION_VERBS[-1]
VERB_OF_NAME = {verb.name: verb for verb in VERBS}


class ParseError(Exception):
    """A reply we cannot read; its message is the reason shown to the model."""

def parse_action(reply):
    """Turn one model reply into one action record, or {"error": reason}.

    Never raises: every reply it refuses becomes a one-sentence reason that
    tells the model what to send instead.
    """
    try:
        lines = reply_lines(reply)
        start = action_start(lines)
        lines = drop_outer_fence(lines, start)
        verb, argument = verb_line(lines[start]).groups(default="")
        if VERB_OF_NAME[verb].body:
            body, rest = split_at_end(lines[start + 1 :])
        else:
            body, rest = [], lines[start + 1 :]
        reject_second_action(rest)
        return build_action(verb, argument, body)
    except ParseError as error:
        return {"error": str(error)}

def reply_lines(reply):
    """Split a raw reply into lines, without BOM, CRLF, outer blanks or a leading
    <think> block.

    Refuses an empty reply, and a <think> block that is never closed: every
    line of it is reasoning, and a verb inside it is not an action.
    """
    text = reply.lstrip("\ufeff").replace("\r\n", "\n").strip()
    if text.startswith("<think>"):
        end = text.find("</think>")
        if end == -1:
            raise ParseError(
                "unclosed <think> block; close it with </think>, then send one action"
            )
        text = text[end + len("</think>") :].strip()
    if not text:
        raise ParseError("empty reply; send exactly one action, such as READ <path>")
    return text.split("\n")

def action_start(lines):
    """Find the line where the action begins: the first line that starts with a verb.

    Whatever comes before it (prose, an ACTION: header, an opening fence) is
    dropped. Refuses a reply in which no line starts with a verb.
    """
    for number, line in enumerate(lines):
        if verb_line(line):
            return number
    raise ParseError(no_action_reason(lines))

VERB_LINE = re.compile(
    rf"(?:\[[0-9a-f]{{8}}\]\s*)?(?:ACTION(?: \d+)?:\s*)?({'|'.join(ACTION_VERBS)})"
    r"(?:\s+(.*))?"
)


def verb_line(line):
    """Match a line that starts with an upper-case verb, after an optional copied
    ACTION: header.

    Returns the match (verb, argument) or None; `read x` and `READ: x` are not verb
    lines.
    """
    return VERB_LINE.fullmatch(line.strip())

def no_action_reason(lines):
    """Say why no line starts with a verb, judging by the first word of the reply.

    A verb in the wrong case and an invented verb get reasons of their own,
    because the model can fix those in one step.
    """
    words = [
        re.sub(r"^ACTION(?: \d+)?:", "", line.strip()).split()
        for line in lines
        if not is_fence(line)
    ]
    first = next((line_words[0] for line_words in words if line_words), "")
    if first.upper() in ACTION_VERBS:
        return f"verbs are upper case; write {first.upper()}, not {first}"
    if re.fullmatch(r"[A-Z]{2,}", first):
        return f"unknown verb {first}; use one of {VERB_CHOICES}"
    return f"no action found; start a line with one of {VERB_CHOICES}"

def drop_outer_fence(lines, start):
    """Drop the closing line of a fence wrapped around the whole action.

    Only when a fence sits just before the verb line. Without this, a WRITE
    whose END is missing would keep the closing fence as its last line.
    """
    fenced = start > 0 and is_fence(lines[start - 1])
    if fenced and len(lines) > start + 1 and is_closing_fence(lines[-1]):
        return lines[:-1]
    return lines

def split_at_end(lines):
    """Split the lines after a WRITE or PATCH header into the body and what follows END.

    Only a line that is exactly END ends a body, so `  END` and `END;` are
    content. Without an END the body runs to the end of the reply, as it
    does when END was the model's stop sequence.
    """
    if "END" not in lines:
        return lines, []
    end = lines.index("END")
    return lines[:end], lines[end + 1 :]

def reject_second_action(rest):
    """Refuse a second verb line after a complete action.

    A model that writes OBSERVATION: is inventing the tool's answer, so that
    line and everything after it are dropped unread. Other text after the
    action, such as a closing fence or a remark, is dropped too.
    """
    for line in rest:
        if re.match(r"(?:\[[0-9a-f]{8}\]\s*)?OBSERVATION(?: \d+)?:", line.strip()):
            return
        if verb_line(line):
            raise ParseError(
                "two actions in one reply; send exactly one and wait for its result"
            )

def missing_argument(verb):
    """The reason for a verb line without its argument: what it needs, and its whole
    form."""
    return f"{verb.name} needs {verb.needs}: {verb.form.replace(chr(10), ', then ')}"


def build_action(name, argument, body):
    """Make the action record for a verb, its argument and its body lines.

    Refuses an empty argument. Paths are only unquoted, not checked: the
    tools decide which paths are allowed.
    """
    verb = VERB_OF_NAME[name]
    if verb.argument == "path":
        argument = unquote(argument)
    if verb.argument == "command":
        argument = re.sub(r"^(`+)([^`]+)\1$", r"\2", argument).strip()
    if not argument:
        raise ParseError(missing_argument(verb))
    action = {"tool": name.lower(), verb.argument: argument}
    if verb.body == "content":
        action["content"] = body_text(unwrap_body(body))
    elif verb.body == "patch":
        action["old"], action["new"] = split_patch(unwrap_body(body))
    return action

def unquote(path):
    """Remove one pair of backticks or quotes around a path, which models copy from
    prose."""
    if len(path) >= 2 and path[0] == path[-1] and path[0] in "`\"'":
        return path[1:-1].strip()
    return path

def split_patch(lines):
    """Split a PATCH body into its old and new text at the marker lines OLD and NEW.

    Blank lines before OLD are skipped. Refuses a body that does not start
    with OLD, or has no NEW after it. The first NEW ends the old text, so
    old text cannot contain a line that is exactly NEW.
    """
    while lines and not lines[0].strip():
        lines = lines[1:]
    if not lines or lines[0] != "OLD":
        raise ParseError(
            "PATCH needs OLD after the path line, then the old lines, NEW, the new"
            " lines, END"
        )
    if "NEW" not in lines:
        raise ParseError(
            "PATCH needs a line NEW between the old lines and the new lines"
        )
    middle = lines.index("NEW")
    return body_text(unwrap_body(lines[1:middle])), body_text(
        unwrap_body(lines[middle + 1 :])
    )

def unwrap_body(lines):
    """Remove a Markdown fence that a model put around a body, and keep every other
    fence.

    The opening fence counts only as the body's first line, after at most
    one blank line. Its partner is the body's last line (blank lines after
    it aside) only if the fences left inside are odd in number, so that the
    last one closes nothing of the body's own; if they are even, the partner
    came after END or never came. A body that does not open with a fence is
    kept whole, so a Markdown file ending in a code block keeps its fence.
    """
    if len(lines) > 1 and not lines[0].strip() and is_fence(lines[1]):
        lines = lines[1:]
    if not lines or not is_fence(lines[0]):
        return lines
    inner = lines[1:]
    end = len(inner)
    while end and not inner[end - 1].strip():
        end -= 1
    if end and is_closing_fence(inner[end - 1]) and sum(map(is_fence, inner)) % 2 == 1:
        return inner[: end - 1]
    return inner

FENCE = re.compile(r"```[\w.+-]*")


def is_fence(line):
    """Tell whether a line is a Markdown fence, with or without a language tag."""
    return bool(FENCE.fullmatch(line.strip()))

def is_closing_fence(line):
    """Tell whether a line is a bare fence, the only kind that can close a block."""
    return line.strip() == "```"

def body_text(lines):
    """Join body lines into file text that ends with a newline, unless it is empty."""
    return "".join(line + "\n" for line in lines)

def format_action(action):
    """Write an action record back as the protocol text the model should have sent.

    Bodies are written as they are, so they must end with a newline or be
    empty, as parse_action leaves them; a body that opens with a fence line
    would not read back the same. An error record raises KeyError.
    """
    verb = VERB_OF_TOOL[action["tool"]]
    line = f"{verb.name} {action[verb.argument]}"
    if verb.body == "content":
        return f"{line}\n{action['content']}END"
    if verb.body == "patch":
        return f"{line}\nOLD\n{action['old']}NEW\n{action['new']}END"
    return line

def headline(action):
    """The first line of ACTION in protocol text, for messages."""
    return format_action(action).split("\n", 1)[0]
