"""The mlplcode kernel: each notebook cell holds commands that drive an Agent."""

import argparse
import difflib
import os
import signal
import tempfile
import traceback

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

from . import __version__, cli
from .agent import Agent, AgentError, StrangersJournal, claims, runs_directory
from .agent import vouch_problem
from .journal import DEFAULT_BUDGET, fold, read_events, waiting_step
from .models import GRAMMAR_CHOICES, SPEC_KINDS, ModelError, model_from_spec
from .policy import DEFAULT_POLICY, merge_policy
from .show import (
    as_text,
    bundle,
    compact_view,
    note_view,
    policy_view,
    prompt_view,
    state_view,
    step_title,
    verdict_text,
)
from .tools.read import copy_tree
from .transcript import save, transcript_view
from .trust import visible

COMMANDS = {
    "root": (
        "DIR | --copy DIR",
        (
            "the project the next run works on; --copy: a fresh copy of DIR in a new"
            " temporary directory"
        ),
    ),
    "model": (
        "SPEC [--grammar auto|gbnf|lark|none] [--context TOKENS] [--timeout S]",
        f"the next run's model: {SPEC_KINDS}; the options as for mlplcode run",
    ),
    "budget": ("N", "the next run takes at most N model turns"),
    "policy": (
        "CATEGORY=VERDICT ...",
        "change the next run's policy, e.g. write=ask run=allow",
    ),
    "task": (
        "TEXT | --next TEXT",
        (
            "start a run with TEXT as its task (%%task: the task is the rest of the"
            " cell); --next TEXT keeps TEXT as the next run's task, and %task alone"
            " starts that run"
        ),
    ),
    "step": (
        "[N]",
        (
            "take up to N steps (default 1), stopping early at an ask or at the end of"
            " the run"
        ),
    ),
    "run": ("", "take steps until an ask or the end of the run"),
    "approve": (
        "",
        (
            "carry out the action that waits for a decision (a DONE: accept it although"
            " the tests as they were fail; a journal this machine did not start: take"
            " it as yours)"
        ),
    ),
    "deny": (
        "[REASON]",
        (
            "decline the action that waits: with a REASON the model reads it and the"
            " run goes on; without one the run ends (denied), except at a DONE, which"
            " is refused and the run goes on (a journal this machine did not start:"
            " leave it)"
        ),
    ),
    "show": (
        "state|prompt|transcript|policy|journal|tree|runs",
        (
            "show how the run stands, or part of it; runs: the runs kept in the runs"
            " directory"
        ),
    ),
    "save": (
        "FILE.ipynb|FILE.org|FILE.md",
        "write the run's transcript, rendered from its journal",
    ),
    "compact": (
        "",
        "fold the steps so far into a summary that stands for them in the prompt",
    ),
    "fork": (
        "N",
        (
            "branch the run before its step N, in a copy of its project; the branch"
            " becomes the run"
        ),
    ),
    "resume": (
        "[JOURNAL]",
        (
            "take up the run recorded in JOURNAL where it stopped; without JOURNAL,"
            " this kernel's run after an interrupt, or, in a kernel with no run yet,"
            " the unfinished run last written in the runs directory; a journal this"
            " machine did not start is shown first, for %approve or %deny"
        ),
    ),
    "help": ("[COMMAND]", "list the commands, or explain one"),
}
SHOW_TOPICS = ("state", "prompt", "transcript", "policy", "journal", "tree", "runs")
KERNEL_WORDS = {
    "step": "%step",
    "decide": "%approve or %deny [reason]",
    "start": "%task TEXT",
    "resume": "%resume",
}

class UsageError(Exception):
    """A cell the kernel cannot carry out as written; the message says how to write
    it."""

ASK_EXIT = {"source": "ask_exit", "keepkernel": False}

CELL_BODIES = ["%%task", "%%note"]
LEAVING = ("exit", "quit", "exit()", "quit()")


def parse_cell(code):
    """The commands of a cell, [(name, argument)], all checked before any is carried
    out.

    A cell whose first line does not start with % is one note. Otherwise every
    line that is not blank is a command, and %%task or %%note takes the rest of
    the cell as its task or note. Refuses a line that is not a command, and an
    unknown command.
    """
    text = code.strip()
    if not text:
        return []
    if not text.startswith("%"):
        return [("leave" if text in LEAVING else "note", text)]
    lines = text.splitlines()
    commands = []
    for number, line in enumerate(lines, 1):
        first = line.split(maxsplit=1)[:1]
        if first and first[0] in CELL_BODIES:
            if line.strip() != first[0]:
                raise UsageError(
                    f"{first[0]} stands alone on its line; the {first[0][2:]} goes on"
                    " the lines below it"
                )
            return commands + [(first[0][2:], "\n".join(lines[number:]).strip())]
        if not line.strip():
            continue
        if not line.startswith("%"):
            raise UsageError(
                f"line {number} is not a command: {line!r}; a note for the model goes"
                " in a cell of its own"
            )
        name, _, argument = line[1:].partition(" ")
        if name not in COMMANDS:
            raise UsageError(unknown_command(name))
        commands.append((name, argument.strip()))
    return commands

def unknown_command(name):
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    guess = f"did you mean %{close[0]}? " if close else ""
    return f"unknown command %{name}; {guess}%help lists the commands"

def positive(text, usage):
    try:
        return cli.positive(text)
    except (argparse.ArgumentTypeError, ValueError):
        raise UsageError(
            f"{usage}: N is a positive whole number, not {text!r}"
        ) from None

def help_view(name=""):
    """The help for one command, or for all of them."""
    if name:
        name = name.lstrip("%")
        if name not in COMMANDS:
            raise UsageError(unknown_command(name))
        return [("line", f"%{name} {COMMANDS[name][0]}".rstrip(), COMMANDS[name][1])]
    return [(
        "title",
        "",
        "mlplcode: one command per line; a cell of plain text is a note for the"
        " model; %%task or %%note takes the rest of the cell",
    )] + [
        ("line", f"%{command} {arguments}".rstrip(), purpose)
        for command, (arguments, purpose) in COMMANDS.items()
    ]

class MlplcodeKernel(Kernel):
    """A Jupyter kernel whose cells are mlplcode commands."""
    implementation = "mlplcode"
    implementation_version = __version__
    banner = "mlplcode: a coding agent, one step per cell (%help lists the commands)"
    language_info = {
        "name": "mlplcode",
        "mimetype": "text/plain",
        "file_extension": ".txt",
        "pygments_lexer": "mlplcode",
        "codemirror_mode": "text/plain",
    }

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.settings = {
            "root": None,
            "model": None,
            "model_options": {},
            "budget": DEFAULT_BUDGET,
            "policy": DEFAULT_POLICY,
            "task": None,
        }
        self.agent = None
        self.silent = False
        self.confirming = None

    async def do_execute(
        self, code, silent, store_history=True, user_expressions=None, allow_stdin=False
    ):
        """Carry out the cell's commands in order; every failure becomes an error reply."""
        self.silent, self.leaving = silent, False
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            for name, argument in parse_cell(code):
                if name not in ("approve", "deny", "show", "help"):
                    self.confirming = None  # an ask of trust is answered next, or not
                getattr(self, "command_" + name)(argument)
        except KeyboardInterrupt:
            if self.agent:
                self.show(self.state_view(), "state")
            return self.fail(
                "KeyboardInterrupt",
                "interrupted; the run stopped as interrupted, and the"
                " journal keeps it as far as it got: %resume takes it up again",
            )
        except AgentError as error:
            return self.fail("AgentError", error.said(KERNEL_WORDS))
        except (UsageError, ValueError, OSError, ModelError) as error:
            return self.fail(type(error).__name__, str(error))
        except Exception as error:
            return self.fail(
                type(error).__name__, str(error), traceback.format_exception(error)
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": [ASK_EXIT] if self.leaving else [],
            "user_expressions": {},
        }

    def fail(self, name, message, lines=None):
        """Send an error output and return the error reply for it."""
        message, lines = visible(message), [visible(line) for line in lines or []]
        content = {
            "ename": name,
            "evalue": message,
            "traceback": lines or [f"{name}: {message}"],
        }
        if not self.silent:
            self.send_response(self.iopub_socket, "error", content)
        return {"status": "error", "execution_count": self.execution_count, **content}

    def show(self, view, kind, step=None, result=False):
        """Send VIEW as a rich output tagged with the run, the step and KIND."""
        if self.silent:
            return
        run = self.agent.run_id if self.agent else None
        content = {
            "data": bundle(view),
            "metadata": {"mlplcode": {"run": run, "step": step, "kind": kind}},
        }
        if result:
            self.send_response(
                self.iopub_socket,
                "execute_result",
                {**content, "execution_count": self.execution_count},
            )
        else:
            self.send_response(self.iopub_socket, "display_data", content)

    def say(self, text):
        if not self.silent:
            self.send_response(
                self.iopub_socket,
                "stream",
                {"name": "stdout", "text": visible(text) + "\n"},
            )

    def warn(self, text):
        if not self.silent:
            self.send_response(
                self.iopub_socket,
                "stream",
                {"name": "stderr", "text": visible(text) + "\n"},
            )

    def show_report(self, report):
        for kind, number, view in report.views(KERNEL_WORDS):
            self.show(view, kind, number)

    def show_decision(self, report):
        for kind, number, view in report.views(KERNEL_WORDS):
            if kind == "step":
                kind, view = "decision", decision_view(report.state.steps[number - 1])
            self.show(view, kind, number)

    def ask_trust(self, error, then):
        """Show what a journal that no kept copy vouches for says, and wait: %approve does
        THEN, %deny drops it."""
        self.confirming = then
        self.show(trust_view(error), "ask")

    def command_root(self, argument):
        """%root DIR, or %root --copy DIR."""
        copy = argument.startswith("--copy ")
        path = argument.removeprefix("--copy ").strip()
        if not os.path.isdir(path):
            raise UsageError(
                f"%root: {path!r} is not a directory; use %root DIR or %root --copy DIR"
            )
        left_out = []
        if copy:
            name = os.path.basename(os.path.realpath(path))
            target = os.path.join(tempfile.mkdtemp(prefix="mlplcode-"), name)
            left_out, path = copy_tree(path, target), target
        self.settings["root"] = os.path.realpath(path)
        self.say(
            f"root: {self.settings['root']}"
            + (" (a fresh copy)" if copy else "")
            + "".join(f"\nleft out of the copy: {entry}" for entry in left_out)
        )

    def command_model(self, argument):
        spec, options = model_setting(argument)
        model_from_spec(spec, **{**options, "grammar": None})
        self.settings["model"], self.settings["model_options"] = spec, options
        self.say(f"model: {argument}")

    def command_budget(self, argument):
        self.settings["budget"] = positive(argument, "%budget N")
        self.say(f"budget: {self.settings['budget']}")

    def command_policy(self, argument):
        """%policy CATEGORY=VERDICT ...: change rows of the next run's policy."""
        pairs = [word.partition("=") for word in argument.split()]
        if not pairs or not all(equals for _, equals, _ in pairs):
            raise UsageError(
                "%policy takes CATEGORY=VERDICT pairs, such as write=ask run=allow"
            )
        self.settings["policy"] = merge_policy(
            self.settings["policy"], {k: v for k, _, v in pairs}, "%policy"
        )
        self.say(
            "policy: " + " ".join(f"{k}={v}" for k, v in self.settings["policy"].items())
        )

    def command_task(self, argument):
        if argument == "--next" or argument.startswith("--next "):
            self.settings["task"] = argument.removeprefix("--next").strip() or None
            if self.settings["task"] is None:
                raise UsageError("%task --next needs the task: %task --next TEXT")
            self.say(f"task of the next run: {self.settings['task']}")
            return
        task = argument or self.settings["task"]
        if not task:
            raise UsageError(
                "%task needs a task: %task TEXT, or %%task with the task on the lines below"
            )
        for name in ("root", "model"):
            if self.settings[name] is None:
                raise UsageError(
                    f"no {name} for the run yet: use %{name} {COMMANDS[name][0]} first"
                )
        self.agent = Agent.start(
            task,
            self.settings["root"],
            self.settings["model"],
            budget=self.settings["budget"],
            policy=self.settings["policy"],
            model_options=self.settings["model_options"],
            on_retry=self.warn,
        )
        self.show(self.state_view(), "task")

    def current(self):
        """The agent of the run in progress; refuses when there is none."""
        if self.agent is None:
            raise UsageError("no run yet: use %task TEXT to start one, or %resume JOURNAL")
        return self.agent

    def state_view(self):
        agent = self.current()
        return state_view(agent.state.start, agent.state, agent.journal)

    def command_step(self, argument):
        self.show_report(
            self.current().step(positive(argument, "%step N") if argument else 1)
        )

    def command_run(self, argument):
        self.no_argument("run", argument)
        self.show_report(self.current().run())

    def command_approve(self, argument):
        self.no_argument("approve", argument)
        if self.confirming:
            then, self.confirming = self.confirming, None
            return then()
        self.show_decision(self.current().approve())

    def command_deny(self, argument):
        if self.confirming:
            self.confirming = None
            return self.say("the journal is left as it is; nothing was taken from it")
        self.show_decision(self.current().deny(argument))

    def command_note(self, text):
        if not text:
            raise UsageError("%%note needs its note on the lines below it")
        self.current().note(text)
        self.show(note_view(text), "note", len(self.agent.state.steps))

    def command_leave(self, word):
        self.leaving = True
        self.say(
            f"{word}: the run is kept in its journal, and %resume takes it up again; a"
            " console closes now, a notebook from its own menu"
        )

    def command_fork(self, argument, trust_journal=False):
        from .branch import untold_warning
    
        at = positive(argument, "%fork N")
        try:
            self.agent = self.current().fork(at, trust_journal=trust_journal)
        except StrangersJournal as error:
            return self.ask_trust(error, lambda: self.command_fork(argument, True))
        self.show(self.state_view(), "state")
        if self.agent.state.branch["untold"]:
            self.warn(untold_warning(self.agent.state.branch["untold"]))

    def command_compact(self, argument):
        self.no_argument("compact", argument)
        state = self.current().compact().state
        self.show(
            compact_view(state.summarized, state.summary), "compact", len(state.steps)
        )

    def no_argument(self, name, argument):
        if argument:
            raise UsageError(f"%{name} takes no argument")

    def command_resume(self, argument, trust_journal=False):
        try:
            if argument:
                self.agent = Agent(
                    argument, on_retry=self.warn, trust_journal=trust_journal
                )
            elif self.agent is None:
                self.agent = Agent(unfinished_journal(runs_directory()), on_retry=self.warn)
        except StrangersJournal as error:
            return self.ask_trust(error, lambda: self.command_resume(argument, True))
        if goes_on(self.agent.state):
            self.agent.resume()
        self.show(self.state_view(), "state")
        waiting = waiting_step(self.agent.state)
        if waiting:
            self.show_report(self.agent.report([waiting.number]))

    def command_show(self, topic):
        if topic not in SHOW_TOPICS:
            raise UsageError(f"%show takes one of {', '.join(SHOW_TOPICS)}")
        self.show(getattr(self, "view_" + topic)(), topic, result=True)

    def view_state(self):
        if self.agent:
            return self.state_view()
        return settings_view(self.settings) + [
            ("line", "run", "none yet: use %task TEXT to start one, or %resume [JOURNAL]")
        ]

    def view_prompt(self):
        return prompt_view(self.current().prompt())

    def view_transcript(self):
        return transcript_view(self.current().events)

    def view_policy(self):
        return policy_view(
            self.agent.state.policy if self.agent else self.settings["policy"]
        )

    def view_journal(self):
        journal = self.current().journal
        return [
            ("line", "journal", journal),
            ("line", "events", str(len(read_events(journal)))),
        ]

    def view_tree(self):
        from .branch import tree_view
    
        return tree_view(self.current().journal)

    def view_runs(self):
        directory = runs_directory()
        runs = list(runs_on_disk(directory))
        return [
            ("title", "", f"{len(runs)} runs in {directory}, the last written first")
        ] + [
            (
                "block",
                os.path.basename(journal).removesuffix(".jsonl"),
                run_summary(journal, state),
            )
            for journal, state in runs
        ]

    def command_save(self, path):
        if not path:
            raise UsageError(f"%save {COMMANDS['save'][0]}")
        steps = save(self.current().journal, path)
        self.show(
            [("line", "saved", f"{path} ({steps} steps, from {self.agent.journal})")],
            "saved",
        )

    def command_help(self, name):
        if len(name.split()) > 1:
            raise UsageError(
                f"%help {COMMANDS['help'][0]}: one command at a time, not {name!r}"
            )
        self.show(help_view(name), "help", result=True)

    async def do_complete(self, code, cursor_pos):
        """Complete a command name, a %show topic or a %help command at the cursor."""
        start = code.rfind("\n", 0, cursor_pos) + 1
        line = code[start:cursor_pos]
        command, space, word = line.partition(" ")
        if not space:
            word, options = command, ["%" + name for name in COMMANDS] + CELL_BODIES
        elif command == "%show" and " " not in word:
            options = SHOW_TOPICS
        elif command == "%help" and " " not in word:
            options = list(COMMANDS)
        else:
            options = []
        return {
            "status": "ok",
            "matches": [option for option in options if option.startswith(word)],
            "cursor_start": cursor_pos - len(word),
            "cursor_end": cursor_pos,
            "metadata": {},
        }

    async def do_inspect(self, code, cursor_pos, detail_level=0, omit_sections=()):
        """The help for the command on the cursor's line."""
        start = code.rfind("\n", 0, cursor_pos) + 1
        name = code[start:].split("\n", 1)[0].split(" ", 1)[0].lstrip("%")
        if name not in COMMANDS:
            return {"status": "ok", "found": False, "data": {}, "metadata": {}}
        return {
            "status": "ok",
            "found": True,
            "data": {"text/plain": as_text(help_view(name))},
            "metadata": {},
        }

    async def do_is_complete(self, code):
        try:
            commands = parse_cell(code)
        except UsageError:
            return {"status": "invalid"}
        if commands[-1:] in ([("task", "")], [("note", "")]):
            return {"status": "incomplete", "indent": ""}
        return {"status": "complete"}

def trust_view(error):
    """The ask of a journal this machine did not start: why, and what it says."""
    return [
        ("title", "", "a journal this machine did not start"),
        ("line", "journal", error.journal),
        ("line", "why", error.why),
        *[("line", name, text) for name, text in claims(error.start)],
        (
            "line",
            "next",
            "%approve takes it as yours, with each line above; %deny leaves it",
        ),
    ]

def decision_view(step):
    """A decided step: its title, its verdict with the human's decision, and its
    observation."""
    view = [
        ("title", "", f"step {step.number}: {step_title(step)}"),
        ("line", "verdict", verdict_text(step)),
    ]
    if step.observation:
        view.append(("block", "observation", step.observation["text"]))
    return view

class ModelArguments(argparse.ArgumentParser):
    """The words after %model, read as mlplcode run reads its options."""

    def error(self, message):
        raise UsageError(f"%model: {message}; use %model {COMMANDS['model'][0]}")


def model_setting(argument):
    """The spec and the options given in %model's ARGUMENT; refuses what mlplcode run
    would."""
    parser = ModelArguments(
        prog="%model", add_help=False, argument_default=argparse.SUPPRESS
    )
    parser.add_argument("spec")
    parser.add_argument("--grammar", choices=GRAMMAR_CHOICES)
    parser.add_argument("--context", type=cli.positive)
    parser.add_argument("--timeout", type=cli.seconds)
    options = vars(parser.parse_args(argument.split()))
    return options.pop("spec"), options

def settings_view(settings):
    """The settings of the next run, in the words of the commands that set them."""
    options = "".join(
        f" --{name} {value}" for name, value in settings["model_options"].items()
    )
    view = [
        (
            "line",
            "root",
            settings["root"] or "none yet: use %root DIR or %root --copy DIR",
        ),
        (
            "line",
            "model",
            (
                settings["model"] + options
                if settings["model"]
                else "none yet: use %model SPEC"
            ),
        ),
        ("line", "budget", f"{settings['budget']} steps"),
        (
            "line",
            "policy",
            " ".join(
                f"{category}={verdict}"
                for category, verdict in settings["policy"].items()
            ),
        ),
    ]
    return view + ([("line", "task", settings["task"])] if settings["task"] else [])

def runs_on_disk(directory):
    """Each journal in DIRECTORY with its state, or why it cannot be read, the last
    written first."""
    try:
        entries = [
            entry
            for entry in os.scandir(directory)
            if entry.name.endswith(".jsonl") and entry.is_file()
        ]
    except FileNotFoundError:
        return
    entries.sort(key=lambda entry: (entry.stat().st_mtime_ns, entry.name), reverse=True)
    for entry in entries:
        try:
            yield entry.path, fold(read_events(entry.path))
        except (OSError, ValueError) as error:
            yield entry.path, str(error)

def goes_on(state):
    return state.stop is None or state.stop["reason"] == "interrupted"


def run_summary(journal, state):
    """The lines that %show runs gives a run: task, project, steps, stop and journal."""
    if isinstance(state, str):
        return f"unreadable: {state}"
    start, stop = state.start, state.stop
    how = (stop["reason"] if stop else "none yet") + (
        " (unfinished: %resume takes it up)" if goes_on(state) else ""
    )
    root = start["root"] + ("" if os.path.isdir(start["root"]) else " (gone)")
    task = (start["task"].splitlines() or [""])[0]
    return "\n".join(
        [
            f"task: {task}",
            f"root: {root}",
            f"steps: {len(state.steps)} of {state.budget}",
            f"stop: {how}",
            f"journal: {journal}",
        ]
        + (["started here: no (%resume asks first)"] if vouch_problem(start) else [])
    )


def unfinished_journal(directory):
    """The journal of the unfinished run last written in DIRECTORY whose project is
    still there, and which is the person's own."""
    for journal, state in runs_on_disk(directory):
        if (
            not isinstance(state, str)
            and goes_on(state)
            and os.path.isdir(state.start["root"])
            and not vouch_problem(state.start)
        ):
            return journal
    raise UsageError(
        f"no unfinished run in {directory} to take up: %show runs lists the runs there,"
        " %resume JOURNAL takes up one of them, %task TEXT starts a new one"
    )

if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=MlplcodeKernel)
