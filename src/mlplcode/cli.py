"""The mlplcode command line: run, replay, resume, fork, demo, eval, kernel install,
grammar, export and acp."""

import argparse
import contextlib
import json
import os
import sys
import tempfile

from .export import DEFAULT_DIRECTORY, command_export
from .journal import DEFAULT_BUDGET, waiting_step
from .models import (
    DEFAULT_TIMEOUT,
    GRAMMAR_CHOICES,
    SPEC_KINDS,
    ModelError,
    settled_line,
)
from .tools.read import copy_tree
from .trust import visible

EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "examples",
)

def step_line(step):
    """One line per step: number, action, verdict, and the observation's first line;
    below it, for a reply that did not parse, the reply's first lines."""
    from .protocol import headline

    action = headline(step.action) if "tool" in step.action else "(reply not parsed)"
    verdict = step.verdict or "none"
    if step.approved is not None:
        verdict += ", approved" if step.approved else ", declined"
    text = step.observation["text"] if step.observation else ""
    summary = text.split("\n", 1)[0][:70]
    line = visible(
        f"step {step.number:>2}  {action[:40]:<40}  {verdict:<15}  {summary}"
    )
    return line if "tool" in step.action else line + "\n" + reply_excerpt(step.reply)

REPLY_LINES_SHOWN = 3
REPLY_LINE_CHARS = 100


def reply_excerpt(reply):
    """The first lines of REPLY, made visible and indented under its step's line."""
    lines = reply.strip("\n").split("\n") if reply.strip() else ["(an empty reply)"]
    shown = [
        f"         | {visible(line)[:REPLY_LINE_CHARS]}"
        for line in lines[:REPLY_LINES_SHOWN]
    ]
    left = len(lines) - REPLY_LINES_SHOWN
    if left > 0:
        shown.append(f"         | ({left} more line{'s' if left > 1 else ''})")
    return "\n".join(shown)

def print_event(event, state):
    """Print a step when its observation is recorded, the ask of a DONE when it is
    raised, and the stop when the run stops."""
    last = state.steps[-1] if state.steps else None
    if event["type"] == "observation":
        print(step_line(last), flush=True)
    elif (
        event["type"] == "verdict"
        and event["verdict"] == "ask"
        and last.action["tool"] == "done"
    ):
        print(
            visible(
                f"step {last.number:>2}  {event['reason']}\n{event['target']['diff']}"
            ),
            end="",
            flush=True,
        )
    elif event["type"] == "compact":
        print(
            f"compact: steps 1 to {event['upto']} folded into a summary, so that the"
            " prompt fits the model's context of"
            f" {state.start['model_options'].get('context')} tokens",
            flush=True,
        )
    elif event["type"] == "stop":
        if last and last.observation is None:
            print(step_line(last))
        print(visible(f"{event['reason']}: {event['message']}"))
        print(f"stop: {event['reason']}", flush=True)

def drive(agent, decider):
    """Run AGENT to its stop, printing as it goes; return the exit status."""
    from .trust import sandbox_banner

    print(visible(f"task: {agent.state.task}"))
    if settled_line(agent.state.start["model_options"]):
        print(visible(settled_line(agent.state.start["model_options"])))
    print(f"RUN: {sandbox_banner(agent.project.programs['bwrap'])}")
    if not agent.project.history.complete:
        print(
            "secrets: git history read for the newest commits only; values of secret"
            " files in older commits are not redacted"
        )
    print(f"journal: {agent.journal}", flush=True)
    waiting = waiting_step(agent.state)
    if waiting:
        print_waiting(waiting)
    try:
        agent.drive(decider)
    except KeyboardInterrupt:
        return 130
    return 0 if agent.state.stop["reason"] == "done" else 1

def command_run(args):
    from .agent import Agent
    from .policy import DEFAULT_POLICY, load_policy

    policy = load_policy(args.policy) if args.policy else DEFAULT_POLICY
    agent = Agent.start(
        args.task,
        existing_directory(args.root),
        args.model,
        journal=args.journal,
        budget=args.budget,
        policy=policy,
        model_options=model_options(args),
        on_event=print_event,
        on_retry=print_retry,
        may_change=args.may_change,
    )
    return drive(agent, decider(args))

def model_options(args):
    """The options of the model, from the command line of run, eval or acp."""
    return {
        "timeout": args.timeout,
        "grammar": args.grammar,
        **({"api_key_env": args.api_key_env} if args.api_key_env else {}),
        **({"context": args.context} if args.context else {}),
    }

def print_retry(line):
    print(visible(line), file=sys.stderr, flush=True)

def decider(args):
    """Who answers an ask: --yes, --no, the person at the terminal, or no one (a no)."""
    from .policy import always

    return always(args.yes) if args.yes or args.no else person()


def person():
    """The person at the terminal, or, without one on standard input, a constant no."""
    from .policy import always, terminal_decider

    return terminal_decider() if sys.stdin.isatty() else always(False)

def replayed_decisions(events):
    """A decider that gives the recorded answers to asks, in order, reasons and all;
    then no."""
    answers = iter(
        [
            (event["approved"], event.get("reason", ""))
            for event in events
            if event["type"] == "decision"
        ]
    )
    return lambda action: next(answers, (False, ""))

def replay(journal, root, output=None, trust_journal=False):
    """Drive a new run with a journal's replies and decisions; return (status, old
    events, new events). TRUST_JOURNAL: the person takes the journal as theirs."""
    from .agent import Agent, under_defaults, vouch_problem
    from .journal import read_events

    recorded = read_events(journal)
    start = next(event for event in recorded if event["type"] == "start")
    why = "" if trust_journal else vouch_problem(start)
    settings = under_defaults(start) if why else start
    if why:
        print(
            visible(
                f"replay: {journal}: {why}; its policy holds only where it is stricter"
                " than the default, and its asks are yours (--trust-journal takes its"
                " answers)"
            )
        )
    agent = Agent.start(
        start["task"],
        root,
        "replay:" + journal,
        journal=output,
        budget=start["budget"],
        policy=settings["policy"],
        model_options=settings["model_options"],
        on_event=print_event,
    )
    status = drive(agent, person() if why else replayed_decisions(recorded))
    return status, recorded, agent.events

def after_start(events):
    """The events of a run after its start event (and the branch event before it, for a
    branch)."""
    return events[[event["type"] for event in events].index("start") + 1 :]

def command_replay(args):
    status, recorded, events = replay(
        args.journal, existing_directory(args.root), args.output, args.trust_journal
    )
    same = after_start(recorded) == after_start(events)
    print(
        "replay: the events are the same as the journal's"
        if same
        else "replay: the events differ from the journal's"
    )
    return status if same else 1

CLI_WORDS = {
    "start": "mlplcode run",
    "step": "mlplcode resume",
    "decide": "mlplcode resume",
    "resume": "mlplcode resume",
}


def command_resume(args):
    from .agent import Agent, AgentError

    with trusting(args):
        agent = Agent(
            args.journal,
            on_event=print_event,
            on_retry=print_retry,
            trust_journal=args.trust_journal,
        )
    try:
        agent.resume()
    except AgentError as error:
        raise ValueError(error.said(CLI_WORDS)) from None
    return drive(agent, decider(args))


@contextlib.contextmanager
def trusting(args, other=""):
    """Say a StrangersJournal refusal in the command line's words: the flag that
    confirms it, and OTHER, another way on."""
    from .agent import StrangersJournal

    try:
        yield
    except StrangersJournal as error:
        again = f"run mlplcode {args.command} again with --trust-journal"
        raise ValueError(visible(error.said(again + other))) from None

def print_waiting(step):
    """Say which step of a run taken up waits for a decision, and for a DONE's ask,
    why it asks."""
    from .protocol import headline

    if step.action["tool"] == "done":
        shown = f"step {step.number:>2}  {step.reason}\n{step.target['diff']}"
        print(visible(shown), end="")
    else:
        print(visible(f"step {step.number:>2}  waits: {headline(step.action)}"))

def command_fork(args):
    from .agent import vouch_problem
    from .branch import fork, untold_warning
    from .journal import read_events

    with trusting(args, "; or name the project with --root DIR, for the defaults"):
        journal, root, untold = fork(
            args.journal, args.at, args.to, args.root, args.trust_journal
        )
    print(f"branch: {journal}")
    print(f"root: {root} (a copy, with the files as they were before step {args.at})")
    if untold:
        print(untold_warning(untold))
    if vouch_problem(read_events(journal)[1]):
        print(
            "warning: the parent is not a run this machine started, so neither is the"
            " branch: its policy is no looser than the default, it has no key"
            " variable, and resume shows its model and asks for --trust-journal"
        )
    print(f"go on with: mlplcode resume {journal}")
    return 0

def command_demo(args):
    project, journal = os.path.join(EXAMPLES, "add"), os.path.join(
        EXAMPLES, "add.journal.jsonl"
    )
    if not os.path.isfile(journal):
        raise ValueError(
            f"the demo needs the examples of a source checkout; {journal} not found"
        )
    with tempfile.TemporaryDirectory(prefix="mlplcode-demo-") as scratch:
        root = os.path.join(scratch, "add")
        copy_tree(project, root)
        print(
            f"demo: replaying {os.path.relpath(journal)} on a fresh copy of"
            " examples/add"
        )
        status, _, _ = replay(
            journal, root, os.path.join(scratch, "demo.jsonl"), trust_journal=True
        )
    return status

def command_grammar(args):
    from .grammar import grammar_text

    sys.stdout.write(grammar_text(args.format))
    return 0

def command_eval(args):
    from .eval import evaluate, overview

    try:
        report = evaluate(
            args.suite,
            args.model,
            args.reps,
            args.out,
            workers=args.workers,
            dask=args.dask,
            model_options=model_options(args),
            names=args.task,
        )
    except KeyboardInterrupt:
        print(
            "eval: interrupted; no report was written, the finished trials' journals"
            f" are in {args.out}",
            file=sys.stderr,
        )
        return 130
    print(overview(report))
    print(
        f"eval: the report is in {os.path.join(args.out, 'report.md')}, report.html and"
        " report.json"
    )
    return 0

def kernelspec():
    """The kernel.json that starts the mlplcode kernel with this very Python."""
    return {
        "argv": [sys.executable, "-m", "mlplcode.kernel", "-f", "{connection_file}"],
        "display_name": "mlplcode",
        "language": "mlplcode",
    }

def install_kernel(user, prefix):
    """Write the kernelspec for the user, or under PREFIX; return the directory
    written."""
    from jupyter_client.kernelspec import KernelSpecManager

    with tempfile.TemporaryDirectory() as source:
        with open(os.path.join(source, "kernel.json"), "w", encoding="utf-8") as file:
            json.dump(kernelspec(), file, indent=1)
        return KernelSpecManager().install_kernel_spec(
            source, "mlplcode", user=user, prefix=prefix
        )

def command_kernel_install(args):
    prefix = sys.prefix if args.sys_prefix else args.prefix
    where = install_kernel(user=prefix is None, prefix=prefix)
    print(f"installed the mlplcode kernel in {where}")
    return 0

def command_acp(args):
    from .acp_wire import serve
    from .policy import DEFAULT_POLICY, load_policy

    policy = load_policy(args.policy) if args.policy else DEFAULT_POLICY
    return serve(args.model, policy, args.budget, model_options(args))

def existing_directory(path):
    if not os.path.isdir(path):
        raise ValueError(f"--root {path}: not a directory")
    return os.path.realpath(path)

class OneLineErrors(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")

def build_parser():
    parser = OneLineErrors(
        prog="mlplcode", description="A coding agent small enough to understand."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_parser = commands.add_parser(
        "run",
        help="run the agent on a task",
        description="Run the agent on TASK in the project at --root.",
    )
    run_parser.add_argument("task", metavar="TASK", help="what the agent should do")
    run_parser.add_argument(
        "--root", required=True, metavar="DIR", help="the project directory"
    )
    run_parser.add_argument("--model", required=True, metavar="SPEC", help=SPEC_KINDS)
    run_parser.add_argument(
        "--journal",
        metavar="FILE",
        help=(
            "write the run's events to FILE, outside the root (default: a new file"
            " in $XDG_STATE_HOME/mlplcode/runs)"
        ),
    )
    run_parser.add_argument(
        "--budget",
        type=positive,
        default=DEFAULT_BUDGET,
        metavar="N",
        help=f"at most N model turns (default {DEFAULT_BUDGET})",
    )
    run_parser.add_argument(
        "--policy", metavar="FILE", help="a JSON policy, e.g. {\"write\": \"allow\"}"
    )
    run_parser.add_argument(
        "--may-change",
        action="append",
        default=[],
        metavar="PATH",
        help="a test file the task may change, so that no person must accept its DONE"
        " (repeatable)",
    )
    add_model_arguments(run_parser)
    add_answers(run_parser)
    run_parser.set_defaults(handler=command_run)
    replay_parser = commands.add_parser(
        "replay",
        help="drive the loop again with a journal's replies",
        description=(
            "Replay JOURNAL's model replies and decisions through the real loop."
        ),
    )
    replay_parser.add_argument("journal", metavar="JOURNAL")
    replay_parser.add_argument(
        "--root", required=True, metavar="DIR", help="the project directory"
    )
    replay_parser.add_argument(
        "--output", metavar="FILE", help="write the replay's events to FILE"
    )
    add_trust(replay_parser)
    replay_parser.set_defaults(handler=command_replay)
    resume_parser = commands.add_parser(
        "resume",
        help="take up an interrupted run where it stopped",
        description="Take up the run recorded in JOURNAL where it stopped.",
    )
    resume_parser.add_argument("journal", metavar="JOURNAL")
    add_answers(resume_parser)
    add_trust(resume_parser)
    resume_parser.set_defaults(handler=command_resume)
    fork_parser = commands.add_parser(
        "fork",
        help="branch a run before one of its steps",
        description=(
            "Start a new run that takes up JOURNAL as it stood before"
            " step N, in a copy of its project."
        ),
    )
    fork_parser.add_argument("journal", metavar="JOURNAL")
    fork_parser.add_argument(
        "--at",
        type=positive,
        required=True,
        metavar="N",
        help="the step to branch before",
    )
    fork_parser.add_argument(
        "--journal",
        dest="to",
        metavar="NEW",
        help="the branch's journal (default: a new file in the state directory)",
    )
    fork_parser.add_argument(
        "--root",
        metavar="DIR",
        help="the project to branch from (default: the run's own, where it was)",
    )
    add_trust(fork_parser)
    fork_parser.set_defaults(handler=command_fork)
    demo_parser = commands.add_parser(
        "demo",
        help="replay the example run on a fresh copy of examples/add",
        description="Replay the committed example run on a fresh copy of examples/add.",
    )
    demo_parser.set_defaults(handler=command_demo)
    eval_parser = commands.add_parser(
        "eval",
        help="measure the agent on a suite of tasks",
        description=(
            "Run every task of --suite with each --model, --reps times,"
            " each on a fresh copy judged by the task's hidden check; write the"
            " report into --out."
        ),
    )
    eval_parser.add_argument(
        "--suite", required=True, metavar="DIR", help="a directory of task directories"
    )
    eval_parser.add_argument(
        "--model",
        required=True,
        action="append",
        metavar="SPEC",
        help=f"{SPEC_KINDS}; {{task}} stands for the task's directory; repeat for more",
    )
    eval_parser.add_argument(
        "--reps",
        required=True,
        type=positive,
        metavar="N",
        help="trials of each task and model",
    )
    eval_parser.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help="a new or empty directory for the report",
    )
    eval_where = eval_parser.add_mutually_exclusive_group()
    eval_where.add_argument(
        "--workers",
        type=positive,
        default=1,
        metavar="N",
        help="run N trials at a time in local processes (default 1, in this one)",
    )
    eval_where.add_argument(
        "--dask",
        metavar="ADDRESS",
        help="run the trials on the Dask scheduler at ADDRESS",
    )
    eval_parser.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="NAME",
        help="run only the suite's task NAME (repeatable; default: every task)",
    )
    add_model_arguments(eval_parser)
    eval_parser.set_defaults(handler=command_eval)
    kernel_parser = commands.add_parser(
        "kernel",
        help="install the Jupyter kernel",
        description="Manage the mlplcode Jupyter kernel.",
    )
    kernel_commands = kernel_parser.add_subparsers(
        dest="kernel_command", required=True, metavar="COMMAND"
    )
    install_parser = kernel_commands.add_parser(
        "install",
        help="install the kernelspec",
        description="Install the kernelspec of the mlplcode kernel.",
    )
    where = install_parser.add_mutually_exclusive_group()
    where.add_argument(
        "--user", action="store_true", help="for this user (the default)"
    )
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help=f"in this Python environment ({sys.prefix})",
    )
    where.add_argument(
        "--prefix", metavar="DIR", help="under DIR/share/jupyter/kernels"
    )
    install_parser.set_defaults(handler=command_kernel_install)
    grammar_parser = commands.add_parser(
        "grammar",
        help="print the protocol's grammar",
        description=(
            "Print the protocol's grammar, for constrained"
            " decoding: GBNF (llama.cpp) or Lark (vLLM)."
        ),
    )
    grammar_parser.add_argument(
        "--format",
        choices=("gbnf", "lark"),
        default="gbnf",
        help="the notation (default gbnf)",
    )
    grammar_parser.set_defaults(handler=command_grammar)
    export_parser = commands.add_parser(
        "export",
        help="write the book as HTML, PDF, Markdown and text",
        description=(
            "Write mlplcode.org as HTML, PDF, Markdown and plain "
            "text into DIR; nothing in the book is run."
        ),
    )
    export_parser.add_argument(
        "--to",
        default=DEFAULT_DIRECTORY,
        metavar="DIR",
        help="the directory to write into (default: export/build in the checkout)",
    )
    export_parser.set_defaults(handler=command_export)
    acp_parser = commands.add_parser(
        "acp",
        help="be an agent for an editor, over the Agent Client Protocol",
        description=(
            "Speak the Agent Client Protocol on stdin and stdout: each"
            " session the editor opens is a run in its directory."
        ),
    )
    acp_parser.add_argument("--model", required=True, metavar="SPEC", help=SPEC_KINDS)
    acp_parser.add_argument(
        "--policy", metavar="FILE", help="a JSON policy, e.g. {\"write\": \"ask\"}"
    )
    acp_parser.add_argument(
        "--budget",
        type=positive,
        default=DEFAULT_BUDGET,
        metavar="N",
        help=f"at most N model turns a run (default {DEFAULT_BUDGET})",
    )
    add_model_arguments(acp_parser)
    acp_parser.set_defaults(handler=command_acp)
    return parser

def add_model_arguments(parser):
    """--api-key-env, --timeout, --context and --grammar, for run, eval and acp."""
    parser.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="read the API key from environment variable VAR",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help=(
            "at most S seconds for each model call, retries included"
            f" (default {DEFAULT_TIMEOUT:g})"
        ),
    )
    parser.add_argument(
        "--context",
        type=positive,
        metavar="TOKENS",
        help=(
            "the model's context window (default: what the server says; 2048 for a"
            " server that does not say)"
        ),
    )
    parser.add_argument(
        "--grammar",
        choices=GRAMMAR_CHOICES,
        default="auto",
        help=(
            "constrain the model's replies to the protocol's grammar, in the"
            " notation its server takes (default auto: when the server is known to)"
        ),
    )

def add_answers(parser):
    """--yes and --no, for the subcommands that decide asks."""
    answers = parser.add_mutually_exclusive_group()
    answers.add_argument(
        "--yes",
        action="store_true",
        help="approve every ask, but a DONE whose tests changed (that needs a person)",
    )
    answers.add_argument(
        "--no",
        action="store_true",
        help="decline every ask (the default without a terminal): a declined action"
        " ends the run, a declined DONE is refused and the run goes on",
    )

def add_trust(parser):
    """--trust-journal, for the subcommands that read a journal."""
    parser.add_argument(
        "--trust-journal",
        action="store_true",
        help="take a journal this machine did not start as yours: its root, policy,"
        " model, key variable and answers, which the refusal without it shows",
    )

def seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number of seconds from 0 to 86400"
        )
    return value

def positive(text):
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)

def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, OSError, ModelError) as error:
        print(f"mlplcode {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
