"""The grammar of RUN's commands: which programs, subcommands and options are
allowed."""

import re
import shlex

# A word that is a shell operator (&&, |, ;, >, 2>&1, ...) or holds a substitution.
SHELL_SYNTAX = re.compile(r"^\d*[<>|&;]|\$\(|`")
PYTEST_PREFIXES = (["pytest"], ["python", "-m", "pytest"], ["python3", "-m", "pytest"])
GIT_SUBCOMMANDS = ("status", "diff")


class CommandRefused(Exception):
    """A RUN command is not on the allow-list; the message says which word and why."""

NUMBER = re.compile(r"\d{1,4}")
TRACEBACKS = re.compile(r"auto|long|short|line|native|no")
EXPRESSION = re.compile(r"[^-].*", re.DOTALL)
PYTEST_OPTIONS = {
    "-q": None,
    "-qq": None,
    "-v": None,
    "-vv": None,
    "-x": None,
    "-s": None,
    "-l": None,
    "--lf": None,
    "--last-failed": None,
    "--ff": None,
    "--failed-first": None,
    "--showlocals": None,
    "-k": EXPRESSION,
    "-m": EXPRESSION,
    "--maxfail": NUMBER,
    "--tb": TRACEBACKS,
    "--durations": NUMBER,
}
GIT_OPTIONS = {
    "status": {
        "-s": None,
        "--short": None,
        "-b": None,
        "--branch": None,
        "--long": None,
        "--porcelain": None,
        "-uno": None,
        "-unormal": None,
        "-uall": None,
    },
    "diff": {
        "--stat": None,
        "--numstat": None,
        "--shortstat": None,
        "--name-only": None,
        "--name-status": None,
        "--cached": None,
        "--staged": None,
        "--no-color": None,
        "-w": None,
        "--ignore-all-space": None,
        "-R": None,
        "--check": None,
        "-U": NUMBER,
        "--unified": NUMBER,
    },
}
REVISION = re.compile(
    r"(?:HEAD|[0-9a-f]{4,40})(?:[~^]\d*)*"
    r"(?:\.\.\.?(?:HEAD|[0-9a-f]{4,40})(?:[~^]\d*)*)?"
)

def check_pytest_words(words: list[str]) -> None:
    """Refuse what pytest reads beyond the allow-list: an @FILE anywhere, an option
    after --."""
    for word in words:
        if word.startswith("@"):
            raise CommandRefused(
                f"{word}: pytest would read more arguments from that file;"
                " write the arguments themselves"
            )
    for word in words[words.index("--") + 1 :] if "--" in words else []:
        if word.startswith("-"):
            raise CommandRefused(
                f"{word} after --: pytest reads options there too (-p loads a"
                " plugin); put options before --"
            )


def split_options(words: list[str], allowed: dict) -> list[str]:
    """Check each option in WORDS against ALLOWED and give the other words, the
    operands.

    An option is allowed only if it is listed; one that takes a value (a pattern in
    ALLOWED) takes it as --name=value or as the next word, and the value must match.
    Everything after -- is an operand. Raises CommandRefused naming the first
    word that is not allowed.
    """
    operands, index = [], 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            return operands + words[index:]
        if not word.startswith("-") or word == "-":
            operands.append(word)
            continue
        name, equals, value = word.partition("=")
        if name not in allowed:
            raise CommandRefused(
                f"option {name} is not allowed; allowed: {' '.join(allowed)}"
            )
        pattern = allowed[name]
        if pattern is None and equals:
            raise CommandRefused(f"option {name} takes no value")
        if pattern is not None and not equals:
            if index == len(words):
                raise CommandRefused(f"option {name} needs a value")
            value, index = words[index], index + 1
        if pattern is not None and not pattern.fullmatch(value):
            raise CommandRefused(f"{value!r} is not a value {name} accepts")
    return operands

def parse_command(command: str) -> tuple[str, list[str], list[str]]:
    """Split a RUN command and check it word by word: (kind, argv, paths).

    kind is "run" for pytest and "git" for git status or diff; paths are the
    operands that name files, for the tools to check like any other path.
    Raises CommandRefused for anything written for a shell, any other
    program or subcommand, and any option not on the allow-list.
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        raise CommandRefused(
            "cannot be split into words (an unclosed quote?)"
        ) from None
    if any(SHELL_SYNTAX.search(word) for word in argv):
        raise CommandRefused(
            "holds shell syntax; there is no shell, so send one plain command"
        )
    for prefix in PYTEST_PREFIXES:
        if argv[: len(prefix)] == prefix:
            check_pytest_words(argv[len(prefix) :])
            operands = split_options(argv[len(prefix) :], PYTEST_OPTIONS)
            return "run", argv, [operand.split("::")[0] for operand in operands]
    if argv[:1] == ["git"] and argv[1:2] and argv[1] in GIT_SUBCOMMANDS:
        operands = split_options(argv[2:], GIT_OPTIONS[argv[1]])
        return "git", argv, [word for word in operands if not REVISION.fullmatch(word)]
    raise CommandRefused(
        "not an allowed program; RUN accepts pytest, python -m pytest,"
        " git status, git diff"
    )

def command_refusal(command: str) -> str:
    """Why RUN refuses a command, or "" when the command is allowed."""
    try:
        parse_command(command)
    except CommandRefused as refusal:
        return str(refusal)
    return ""


def classify_command(command: str) -> str:
    """The kind of a RUN command for the policy: "run", "git", or "shell" for anything
    refused."""
    return "shell" if command_refusal(command) else parse_command(command)[0]

RESULTS_PLUGIN = ("-p", "mlplcode_results")
GIT_HARDENING = (
    "--no-pager",
    "-c",
    "core.fsmonitor=false",
    "-c",
    "core.hooksPath=/dev/null",
    "-c",
    "protocol.allow=never",
    "-c",
    "log.showSignature=false",
    "-c",
    "core.untrackedCache=false",
)


def program_argv(
    kind: str, argv: list[str], paths: list[str], programs: dict
) -> list[str]:
    """Give the argv actually started: pytest under the agent's own Python with the
    plugin that records its results, git hardened and limited to the root, each
    program by the path PROGRAMS holds for it."""
    if kind == "run":
        arguments = argv[1:] if argv[0] == "pytest" else argv[3:]
        return [programs["python"], "-P", "-m", "pytest", *RESULTS_PLUGIN, *arguments]
    subcommand, arguments = argv[1], argv[2:]
    safety = (
        ["--no-ext-diff", "--no-textconv", "--relative"] if subcommand == "diff" else []
    )
    scope = [] if paths else ["."] if "--" in arguments else ["--", "."]
    return [programs["git"], *GIT_HARDENING, subcommand, *safety, *arguments, *scope]
