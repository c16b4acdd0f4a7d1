"""The verbs: each action the model can take, declared once, and what is derived from
the table."""

from collections.abc import Callable
from dataclasses import dataclass

from .commands import classify_command
from .tools import PathRefused, failure
from .tools.approval import command_target, file_target
from .tools.read import check_read, read_file
from .tools.run import check_run, run_command
from .tools.search import search_files
from .tools.write import (
    check_patch,
    check_write,
    patch_file,
    write_category,
    write_file,
)
from .trust import redact

@dataclass(frozen=True)
class Verb:
    """One verb of the protocol: how it is written, taught, judged, carried out and
    shown."""

    name: str
    argument: str
    needs: str
    form: str
    category: str | Callable
    body: str = ""
    rule: str = ""
    check: Callable | None = None
    run: Callable | None = None
    target: Callable | None = None
    shown: str = "text"
    kind: str = "other"

VERBS = (
    Verb(
        name="READ",
        argument="path",
        needs="a path",
        form="READ <path>",
        category="read",
        check=check_read,
        run=read_file,
        target=file_target,
        kind="read",
    ),
    Verb(
        name="SEARCH",
        argument="query",
        needs="the text to look for",
        form="SEARCH <text>",
        category="search",
        run=search_files,
        kind="search",
    ),
    Verb(
        name="WRITE",
        argument="path",
        needs="a path",
        body="content",
        form="WRITE <path>\n<complete file contents>\nEND",
        rule="READ a file before you WRITE or PATCH it. WRITE replaces the whole file.",
        category=write_category,
        check=check_write,
        run=write_file,
        target=file_target,
        shown="diff",
        kind="edit",
    ),
    Verb(
        name="PATCH",
        argument="path",
        needs="a path",
        body="patch",
        form="PATCH <path>\nOLD\n<exact existing lines>\nNEW\n<replacement lines>\nEND",
        rule="PATCH replaces the OLD lines, which must occur exactly once in the file.",
        category=write_category,
        check=check_patch,
        run=patch_file,
        target=file_target,
        shown="diff",
        kind="edit",
    ),
    Verb(
        name="RUN",
        argument="command",
        needs="a command",
        form="RUN <command>",
        rule=(
            "RUN runs the tests or looks at git, without a shell: pytest,"
            " python -m pytest, git status, git diff."
        ),
        category=classify_command,
        check=check_run,
        run=run_command,
        target=command_target,
        kind="execute",
    ),
    Verb(
        name="DONE",
        argument="summary",
        needs="a one-line summary",
        form="DONE <summary>",
        rule=(
            "DONE is accepted only after you have edited a file and a test run has"
            " passed since that edit; the project's tests as they were before your"
            " changes must pass too."
        ),
        category="done",
    ),
)

VERB_OF_TOOL = {verb.name.lower(): verb for verb in VERBS}
BODY_FIELDS = {"": (), "content": ("content",), "patch": ("old", "new")}


def fields(verb):
    """The text fields an action of VERB carries."""
    return (verb.argument, *BODY_FIELDS[verb.body])

def check_action(action: dict, project) -> str | None:
    """The refusal the tools would give an action's paths, found before anyone is asked.

    Gives the ERROR text, or None when the tools will not refuse on these grounds.
    """
    verb = VERB_OF_TOOL.get(action.get("tool"))
    if verb is None or verb.check is None:
        return None
    try:
        verb.check(action, project)
    except PathRefused as refusal:
        return f"ERROR: {refusal}"
    except OSError:
        pass  # not a refusal: the tool meets the same error when it runs, and says it
    return None

def fingerprint(action: dict, project) -> dict | None:
    """The target an approval of ACTION is bound to (chapter "Approvals bound to their
    target"), or None for a verb that has none."""
    verb = VERB_OF_TOOL[action["tool"]]
    return verb.target(action, project) if verb.target else None

TOOL_NAMES = [name for name, verb in VERB_OF_TOOL.items() if verb.run]


def execute(action: dict, project) -> dict:
    """Carry out one action in PROJECT and give back its observation.

    Refuses unknown tools and actions missing a text field, and turns what the
    tools raise (refused paths, OS errors, text that cannot be encoded) into
    ERROR observations: the loop must go on and the model must learn why.
    """
    name = action.get("tool")
    verb = VERB_OF_TOOL.get(name) if isinstance(name, str) else None
    if verb is None or verb.run is None:
        return failure(f"unknown tool {name!r}; use one of {', '.join(TOOL_NAMES)}")
    missing = [
        field for field in fields(verb) if not isinstance(action.get(field), str)
    ]
    if missing:
        return failure(f"{name} needs the text field(s) {', '.join(missing)}")
    try:
        result = verb.run(action, project)
    except PathRefused as refusal:
        result = failure(str(refusal))
    except (OSError, UnicodeError) as problem:
        result = failure(
            f"{name} failed: {problem}; check the path or content and try again"
        )
    return {**result, "text": redact(result["text"], project.secret_values)}
