"""The mlplcode command line: run, replay, demo, kernel install and export."""
import argparse
import json
import os
import shutil
import sys
import tempfile

from .export import DEFAULT_DIRECTORY, command_export
from .journal import append_event, read_events
from .loop import DEFAULT_BUDGET, headline, run
from .models import ModelError, model_from_spec
from .policy import DEFAULT_POLICY, always, load_policy, terminal_decider
from .trust import sandbox_banner, visible

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")

def recorder(events, journal):
    """A RECORD function: append the event to EVENTS and, if given, to the JOURNAL file."""
    def record(event):
        events.append(event)
        if journal:
            append_event(journal, event)
    return record

def step_line(step):
    """One line per step: number, action, verdict, and the observation's first line."""
    action = "(reply not parsed)" if "error" in step.action else headline(step.action)
    verdict = step.verdict
    if step.approved is not None:
        verdict += ", approved" if step.approved else ", declined"
    text = step.observation["text"] if step.observation else ""
    summary = text.split("\n", 1)[0][:70]
    return visible(f"step {step.number:>2}  {action[:40]:<40}  {verdict:<15}  {summary}")

def drive(start, model, root, decide, journal=None):
    """Run the loop from a START event, printing each step; return the events."""
    events = []
    record = recorder(events, journal)
    record(start)
    print(visible(f"task: {start['task']}"))
    print(f"RUN: {sandbox_banner(root)}")
    reason = run(events, model, root, decide, record,
                 on_step=lambda state: state.steps and print(step_line(state.steps[-1]), flush=True))
    print(visible(f"{reason}: {events[-1]['message']}"))
    print(f"stop: {reason}")
    return events

def command_run(args):
    root = existing_directory(args.root)
    if args.journal and os.path.exists(args.journal):
        raise ValueError(f"{args.journal} already exists; a journal holds one run")
    policy = load_policy(args.policy) if args.policy else DEFAULT_POLICY
    model = model_from_spec(args.model, args.api_key_env)
    if args.yes or args.no:
        decide = always(args.yes)
    else:
        decide = terminal_decider() if sys.stdin.isatty() else always(False)
    start = {"type": "start", "task": args.task, "budget": args.budget,
             "policy": policy, "model": args.model}
    events = drive(start, model, root, decide, args.journal)
    return 0 if events[-1]["reason"] == "done" else 1

def replayed_decisions(events):
    """A decider that gives the recorded answers to asks, in order; then no."""
    answers = iter([e["approved"] for e in events if e["type"] == "decision"])
    return lambda action: next(answers, False)

def replay(journal, root, output=None):
    """Drive the real loop with a journal's replies and decisions; return (old, new) events."""
    recorded = read_events(journal)
    if not recorded or recorded[0]["type"] != "start":
        raise ValueError(f"{journal}: not a journal (no start event)")
    model = model_from_spec("replay:" + journal)
    events = drive(recorded[0], model, root, replayed_decisions(recorded), output)
    return recorded, events

def command_replay(args):
    recorded, events = replay(args.journal, existing_directory(args.root), args.output)
    same = recorded == events
    print("replay: the events are the same as the journal's" if same
          else "replay: the events differ from the journal's")
    return 0 if same and events[-1]["reason"] == "done" else 1

def command_demo(args):
    project, journal = os.path.join(EXAMPLES, "add"), os.path.join(EXAMPLES, "add.journal.jsonl")
    if not os.path.isfile(journal):
        raise ValueError(f"the demo needs the examples of a source checkout; {journal} not found")
    with tempfile.TemporaryDirectory(prefix="mlplcode-demo-") as scratch:
        root = shutil.copytree(project, os.path.join(scratch, "add"))
        print(f"demo: replaying {os.path.relpath(journal)} on a fresh copy of examples/add")
        _, events = replay(journal, root)
    return 0 if events[-1]["reason"] == "done" else 1

def kernelspec():
    """The kernel.json that starts the mlplcode kernel with this very Python."""
    return {"argv": [sys.executable, "-m", "mlplcode.kernel", "-f", "{connection_file}"],
            "display_name": "mlplcode", "language": "mlplcode"}

def install_kernel(user, prefix):
    """Write the kernelspec for the user, or under PREFIX; return the directory written."""
    from jupyter_client.kernelspec import KernelSpecManager
    with tempfile.TemporaryDirectory() as source:
        with open(os.path.join(source, "kernel.json"), "w", encoding="utf-8") as file:
            json.dump(kernelspec(), file, indent=1)
        return KernelSpecManager().install_kernel_spec(source, "mlplcode", user=user, prefix=prefix)

def command_kernel_install(args):
    prefix = sys.prefix if args.sys_prefix else args.prefix
    where = install_kernel(user=prefix is None, prefix=prefix)
    print(f"installed the mlplcode kernel in {where}")
    return 0

def existing_directory(path):
    if not os.path.isdir(path):
        raise ValueError(f"--root {path}: not a directory")
    return os.path.realpath(path)

class OneLineErrors(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")

def build_parser():
    parser = OneLineErrors(prog="mlplcode", description="A coding agent small enough to understand.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run_parser = commands.add_parser("run", help="run the agent on a task",
                                     description="Run the agent on TASK in the project at --root.")
    run_parser.add_argument("task", metavar="TASK", help="what the agent should do")
    run_parser.add_argument("--root", required=True, metavar="DIR", help="the project directory")
    run_parser.add_argument("--model", required=True, metavar="SPEC",
                            help="scripted:FILE.json, replay:JOURNAL, echo, openai:MODEL@URL or ollama:MODEL")
    run_parser.add_argument("--journal", metavar="FILE", help="write the run's events to FILE (JSON Lines)")
    run_parser.add_argument("--budget", type=positive, default=DEFAULT_BUDGET, metavar="N",
                            help=f"at most N model turns (default {DEFAULT_BUDGET})")
    run_parser.add_argument("--policy", metavar="FILE", help="a JSON policy, e.g. {\"write\": \"allow\"}")
    run_parser.add_argument("--api-key-env", metavar="VAR", help="read the API key from environment variable VAR")
    answers = run_parser.add_mutually_exclusive_group()
    answers.add_argument("--yes", action="store_true", help="approve every ask")
    answers.add_argument("--no", action="store_true", help="decline every ask (the default without a terminal)")
    run_parser.set_defaults(handler=command_run)
    replay_parser = commands.add_parser("replay", help="drive the loop again with a journal's replies",
                                        description="Replay JOURNAL's model replies and decisions through the real loop.")
    replay_parser.add_argument("journal", metavar="JOURNAL")
    replay_parser.add_argument("--root", required=True, metavar="DIR", help="the project directory")
    replay_parser.add_argument("--output", metavar="FILE", help="write the replay's events to FILE")
    replay_parser.set_defaults(handler=command_replay)
    demo_parser = commands.add_parser("demo", help="replay the example run on a fresh copy of examples/add",
                                      description="Replay the committed example run on a fresh copy of examples/add.")
    demo_parser.set_defaults(handler=command_demo)
    kernel_parser = commands.add_parser("kernel", help="install the Jupyter kernel",
                                        description="Manage the mlplcode Jupyter kernel.")
    kernel_commands = kernel_parser.add_subparsers(dest="kernel_command", required=True, metavar="COMMAND")
    install_parser = kernel_commands.add_parser("install", help="install the kernelspec",
                                                description="Install the kernelspec of the mlplcode kernel.")
    where = install_parser.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user (the default)")
    where.add_argument("--sys-prefix", action="store_true", help=f"in this Python environment ({sys.prefix})")
    where.add_argument("--prefix", metavar="DIR", help="under DIR/share/jupyter/kernels")
    install_parser.set_defaults(handler=command_kernel_install)
    export_parser = commands.add_parser("export", help="write the book as HTML, PDF, Markdown and text",
                                        description="Write mlplcode.org as HTML, PDF, Markdown and plain "
                                        "text into DIR; nothing in the book is run.")
    export_parser.add_argument("--to", default=DEFAULT_DIRECTORY, metavar="DIR",
                               help="the directory to write into (default: export/build in the checkout)")
    export_parser.set_defaults(handler=command_export)
    return parser

def positive(text):
    if not text.isdigit() or int(text) < 1:
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
