"""The Agent Client Protocol: mlplcode as an agent that an editor starts and talks to on
stdio."""

import asyncio
import concurrent.futures
import contextlib
import os
import queue
import re
import signal
import sys
import threading
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from acp import RequestError, run_agent
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ContentToolCallContent,
    FileEditToolCallContent,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptResponse,
    TextContentBlock,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolCallUpdate,
    UserMessageChunk,
)

from .acp_wire import PROTOCOL_VERSION, initialize_result, read_message, write_message
from .agent import (
    Agent,
    AgentError,
    StrangersJournal,
    new_run_id,
    run_id_problem,
    runs_directory,
)
from .journal import State, apply, waiting_step
from .models import ModelError, settled_line
from .protocol import headline
from .show import seen_files
from .trust import inside, visible
from .verbs import VERB_OF_TOOL

class LineTransport:
    """The SDK's message transport over the protocol's files: one JSON-RPC message a
    line, each way; a line that is not a JSON-RPC message is answered here."""

    def __init__(self, incoming, writing):
        self.writing, self.closed, self.messages = writing, False, asyncio.Queue()
        loop = asyncio.get_running_loop()
        threading.Thread(target=self.feed, args=(incoming, loop), daemon=True).start()

    def feed(self, incoming, loop):
        """Check each line of INCOMING in a thread of its own, since a read blocks; None
        at the end."""
        for line in incoming:
            loop.call_soon_threadsafe(self.messages.put_nowait, read_message(line))
        loop.call_soon_threadsafe(self.messages.put_nowait, (None, None))

    async def receive(self):
        """The next message, or None when the client has closed its end."""
        while True:
            message, error = await self.messages.get()
            if error is None:
                return message
            await self.send(error)

    async def send(self, message):
        if self.closed:
            raise ConnectionError("the client has gone")
        try:
            write_message(self.writing, message)
        except OSError as error:
            self.closed = True
            raise ConnectionError("the client has gone") from error

    async def close(self):
        self.closed = True

class Cancelled(KeyboardInterrupt):
    """A cancel from the client, raised as the interrupt that the Agent already
    handles."""


CANCEL_SIGNAL = signal.SIGUSR1
INTERRUPTED = "interrupted"

class AgentThread:
    """The main thread, which makes every call on an Agent, one at a time, so that a
    cancel can interrupt the call with a signal, as Ctrl-C interrupts the command line.
    """

    def __init__(self):
        self.calls, self.finished = queue.SimpleQueue(), threading.Event()
        self.running, self.interrupted = None, False

    def submit(self, session, function):
        """Queue FUNCTION for SESSION; the future of its result (INTERRUPTED, if
        cancelled)."""
        future = concurrent.futures.Future()
        self.calls.put((session, function, future))
        return future

    def stop(self):
        self.calls.put(None)

    def serve(self):
        """Make the calls as they come, until stop."""
        signal.signal(CANCEL_SIGNAL, self.on_cancel)
        try:
            while (call := self.calls.get()) is not None:
                self.make(*call)
        finally:
            self.finished.set()

    def make(self, session, function, future):
        if not future.set_running_or_notify_cancel():
            return
        result, error = INTERRUPTED, None
        try:
            try:
                self.running, self.interrupted = session, False
                if not session.cancelled:
                    result = function()
            finally:
                self.running = None
        except Cancelled:
            pass
        except Exception as problem:
            error = problem
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def interrupt(self, session):
        """Interrupt SESSION's call, if it is the one running (called from the
        protocol's thread)."""
        if self.running is session:
            signal.pthread_kill(threading.main_thread().ident, CANCEL_SIGNAL)

    def on_cancel(self, number, frame):
        if self.running is not None and self.running.cancelled and not self.interrupted:
            self.interrupted = True
            raise Cancelled

def text(words):
    return TextContentBlock(type="text", text=words)

def fenced(words):
    """WORDS made visible, in a code fence longer than any run of backticks in them, so
    that a client shows them as they are instead of rendering them as Markdown."""
    words = visible(words)
    fence = "`" * max(
        3, 1 + max((len(run) for run in re.findall("`+", words)), default=0)
    )
    return f"{fence}\n{words}\n{fence}\n"

def code(words):
    """WORDS made visible, as a Markdown code span."""
    words = visible(words)
    ticks = "`" * (1 + max((len(run) for run in re.findall("`+", words)), default=0))
    pad = " " if words.startswith("`") or words.endswith("`") else ""
    return f"{ticks}{pad}{words}{pad}{ticks}"

def agent_says(words):
    return AgentMessageChunk(session_update="agent_message_chunk", content=text(words))

def thought(words):
    return AgentThoughtChunk(
        session_update="agent_thought_chunk", content=text(code(words) + "\n")
    )

def person_said(words):
    return UserMessageChunk(
        session_update="user_message_chunk", content=text(visible(words))
    )

def shown_text(words):
    return ContentToolCallContent(type="content", content=text(fenced(words)))

def call_id(step):
    return f"step-{step.number}"

def location(state, step):
    """Where STEP's action acts, or None: its path under the root, with, for a PATCH,
    the line where its OLD lines start in the file as the run last saw it."""
    action, root = step.action, state.start["root"]
    if VERB_OF_TOOL[action["tool"]].argument != "path":
        return None
    path = os.path.normpath(os.path.join(root, action["path"]))
    if not inside(path, root):
        return None
    if action["tool"] == "patch":
        seen = seen_files(state.steps[: step.number - 1]).get(action["path"])
        if seen and action["old"] in seen:
            return ToolCallLocation(
                path=path, line=seen[: seen.index(action["old"])].count("\n") + 1
            )
    return ToolCallLocation(path=path)

def change(state, step, place):
    """STEP's WRITE or PATCH as ACP's diff: OLD and NEW lines, or the file as the run
    last saw it (nothing, for a new file) and its new content."""
    action = step.action
    if action["tool"] == "patch":
        before, after = action["old"], action["new"]
    else:
        before, after = (
            seen_files(state.steps[: step.number - 1]).get(action["path"]),
            action["content"],
        )
    return FileEditToolCallContent(
        type="diff",
        path=place.path,
        new_text=visible(after),
        old_text=None if before is None else visible(before),
    )

def tool_fields(state, step):
    """How a tool call shows STEP's action: a title, a kind, where it acts, and the
    change."""
    action = step.action
    if "tool" not in action:
        return {"title": "reply not parsed", "kind": "other"}
    verb, place = VERB_OF_TOOL[action["tool"]], location(state, step)
    fields = {"title": code(headline(action)), "kind": verb.kind, "raw_input": action}
    if place:
        fields["locations"] = [place]
    if place and verb.shown == "diff":
        fields["content"] = [change(state, step, place)]
    return fields

def result(state, step):
    """The content that shows STEP's observation: the change it made, if any, then its
    text."""
    made = tool_fields(state, step).get("content", []) if step.observation["ok"] else []
    return made + [shown_text(step.observation["text"])]

def progress(step, **changes):
    return ToolCallProgress(
        session_update="tool_call_update", tool_call_id=call_id(step), **changes
    )

def updates(event, state):
    """The session updates that show EVENT; STATE is the run just after it."""
    kind, step = event["type"], state.steps[-1] if state.steps else None
    called = bool(step and step.action)
    settled = settled_line(event.get("model_options", {})) if kind == "start" else ""
    if settled:
        return [person_said(event["task"]), thought(settled)]
    if kind in ("start", "note"):
        return [person_said(event["task" if kind == "start" else "text"])]
    if kind == "compact":
        return [thought(f"Steps 1 to {event['upto']} were folded into a summary.")]
    if kind == "reply":
        return [agent_says(fenced(event["text"]))]
    if kind == "action":
        return [
            ToolCallStart(
                session_update="tool_call",
                tool_call_id=call_id(step),
                status="pending",
                **tool_fields(state, step),
            )
        ]
    if kind == "verdict" and event["verdict"] == "allow":
        return [progress(step, status="in_progress")]
    if kind == "decision":
        shown = [progress(step, status="in_progress")] if event["approved"] else []
        return shown + ([person_said(event["reason"])] if event.get("reason") else [])
    if kind == "observation" and called:
        status = "completed" if event["ok"] else "failed"
        return [progress(step, status=status, content=result(state, step))]
    if kind == "observation":
        return [agent_says(fenced(event["text"]))]
    if kind == "stop":
        said = agent_says(
            f"stop: {code(event['reason'])}\n\n" + fenced(event["message"])
        )
        if not called or step.observation is not None:
            return [said]
        content = [shown_text(event["message"])]
        return [progress(step, status="failed", content=content), said]
    if kind == "resume":
        return [agent_says("The run was taken up again.\n")]
    return []

def live(shown):
    """The updates of a run as it happens: without the person's own words, which the
    client already shows."""
    return [update for update in shown if not isinstance(update, UserMessageChunk)]

STOP_REASONS = {
    "done": "end_turn",
    "stuck": "end_turn",
    "budget": "max_turn_requests",
    "denied": "refusal",
    "interrupted": "cancelled",
}


def stop_reason(stop):
    """The ACP stopReason of a run's stop; a run that failed is an error response
    instead."""
    if stop["reason"] in STOP_REASONS:
        return STOP_REASONS[stop["reason"]]
    raise RequestError(
        -32603,
        f"the run stopped ({stop['reason']}): {visible(stop['message'])}",
        {"stop": stop["reason"]},
    )

def answers(allow, explain, reject):
    """The three answers to an ask, with the names a client shows for them."""
    return [
        PermissionOption(option_id="allow", name=allow, kind="allow_once"),
        PermissionOption(option_id="explain", name=explain, kind="reject_once"),
        PermissionOption(option_id="reject", name=reject, kind="reject_once"),
    ]


OPTIONS = answers(
    "Allow", "Reject, and say why in your next message", "Reject, and end the run"
)
DONE_OPTIONS = answers(
    "Accept this DONE",
    "Refuse it, and say why in your next message",
    "Refuse it; the run goes on",
)


def permission_options(action):
    """The options offered for the ask of ACTION."""
    return DONE_OPTIONS if action.get("tool") == "done" else OPTIONS

ACP_WORDS = {
    "start": "a new session",
    "step": "a new prompt",
    "decide": "a new prompt",
    "resume": "a new prompt",
}


def refused(message):
    return RequestError(-32602, visible(message))

def prompt_text(blocks, root):
    """The text of a prompt: its text blocks, and a link as its URI, or as its path in
    the root."""
    parts = []
    for block in blocks:
        if block.type == "text":
            parts.append(block.text)
        elif block.type == "resource_link":
            parts.append(link_text(block.uri, root))
        else:
            raise refused(
                f"a prompt is text; this agent does not take {block.type} blocks"
            )
    words = "".join(parts).strip()
    if not words:
        raise refused("the prompt is empty")
    try:
        words.encode("utf-8")
    except UnicodeEncodeError:
        raise refused("the prompt holds a lone surrogate, which is not text") from None
    return words

def link_text(uri, root):
    """A resource link as the model can use it: a file in the root as its relative
    path."""
    parts = urlparse(uri)
    path = unquote(parts.path)
    if (
        parts.scheme == "file"
        and os.path.isabs(path)
        and inside(os.path.normpath(path), root)
    ):
        return os.path.relpath(path, root)
    return uri

@dataclass(eq=False)
class Session:
    """One ACP session: one run in one root. The run is its journal; these fields say
    where the conversation with the client stands."""

    id: str
    root: str
    agent: Agent | None = None
    answering: bool = False
    explaining: bool = False
    cancelled: bool = False
    asking: asyncio.Task | None = None

class FrontEnd:
    """The ACP agent: the client's requests, answered with each session's Agent."""

    def __init__(self, worker, settings):
        self.worker, self.settings = worker, settings
        self.sessions, self.client, self.loop = {}, None, None

    async def speak(self, incoming, writing):
        """Answer the client until it closes its end; then interrupt what runs, and stop."""
        self.loop = asyncio.get_running_loop()
        try:
            await run_agent(self, LineTransport(incoming, writing))
        finally:
            for session in self.sessions.values():
                self.stop_turn(session)
            self.worker.stop()
            await asyncio.to_thread(self.worker.finished.wait)

    def on_connect(self, client):
        self.client = client

    async def initialize(self, protocol_version, **_):
        return InitializeResponse.model_validate(initialize_result())

    async def new_session(self, cwd, **_):
        run = new_run_id()
        while run in self.sessions or os.path.lexists(
            os.path.join(runs_directory(), f"{run}.jsonl")
        ):
            run = new_run_id()
        session = Session(run, self.root(cwd))
        if inside(os.path.realpath(runs_directory()), session.root):
            raise refused(
                f"the journals of mlplcode, in {runs_directory()}, would lie inside"
                f" {session.root}, where a run could change them; set XDG_STATE_HOME to a"
                " directory outside it"
            )
        self.sessions[session.id] = session
        print(
            f"mlplcode acp: session {session.id} in {session.root}",
            file=sys.stderr,
            flush=True,
        )
        return NewSessionResponse(session_id=session.id)

    def root(self, cwd):
        if not (os.path.isabs(cwd) and os.path.isdir(cwd)):
            raise refused(f"cwd {cwd!r} is not an absolute path to a directory")
        return os.path.realpath(cwd)

    def session(self, session_id):
        if session_id not in self.sessions:
            raise refused(
                f"no session {session_id!r}: start one with session/new or session/load"
            )
        return self.sessions[session_id]

    async def prompt(self, prompt, session_id, **_):
        session = self.session(session_id)
        words = prompt_text(prompt, session.root)
        if session.answering:
            raise refused("this session is already answering a prompt; cancel it first")
        session.answering, session.cancelled = True, False
        try:
            return PromptResponse(stop_reason=await self.take_turn(session, words))
        finally:
            session.answering = False

    async def take_turn(self, session, words):
        """Run until the run stops, an ask waits for a reason, or the client cancels."""
        report = await self.call(session, lambda: self.begin(session, words))
        while report is not INTERRUPTED and not session.cancelled:
            state = report.state
            if state.stop:
                return stop_reason(state.stop)
            waiting = waiting_step(state)
            if waiting is None:
                report = await self.call(session, session.agent.step)
                continue
            answer = await self.ask(session, state, waiting)
            if answer == "cancelled":
                break
            if answer == "explain":
                session.explaining = True
                return "end_turn"
            decide = (
                session.agent.approve
                if answer == "allow"
                else lambda: session.agent.deny("")
            )
            report = await self.call(session, decide)
        return "cancelled"

    def begin(self, session, words):
        """Take WORDS as the task of a new run, the reason for a no, or a note (on the
        Agent's thread)."""
        agent = session.agent
        if agent is None:
            session.agent = Agent.start(
                words,
                session.root,
                run=session.id,
                **self.settings,
                **self.watchers(session)
            )
            start = session.agent.state.start  # recorded before the watchers were told
            self.tell(session, live(updates(start, session.agent.state)))
            return session.agent.report([])
        if session.explaining:
            session.explaining = False
            return agent.deny(words)
        if agent.state.stop and agent.state.stop["reason"] == "interrupted":
            agent.resume()
        agent.note(words)
        return agent.report([])

    async def ask(self, session, state, step):
        """The option the person chose for STEP's action, or "cancelled"."""
        request = self.client.request_permission(
            session_id=session.id,
            options=permission_options(step.action),
            tool_call=ToolCallUpdate(
                tool_call_id=call_id(step), status="pending", **tool_fields(state, step)
            ),
        )
        session.asking = asyncio.ensure_future(request)
        try:
            response = await session.asking
        except asyncio.CancelledError:
            if not session.cancelled:
                raise
            return "cancelled"
        except RequestError as error:
            raise RequestError(
                -32603,
                visible(
                    f"the client failed session/request_permission ({error.code} {error});"
                    f" step {step.number} still waits for a decision: the next prompt, or"
                    " mlplcode resume, asks again"
                ),
            ) from None
        finally:
            session.asking = None
        outcome = response.outcome
        return outcome.option_id if outcome.outcome == "selected" else "cancelled"

    async def cancel(self, session_id, **_):
        if session_id in self.sessions:
            self.stop_turn(self.sessions[session_id])

    def stop_turn(self, session):
        session.cancelled = True
        if session.asking:
            session.asking.cancel()
        self.worker.interrupt(session)

    async def load_session(self, cwd, session_id, **_):
        root, journal = self.root(cwd), self.journal(session_id)
        if session_id in self.sessions and self.sessions[session_id].answering:
            raise refused("this session is answering a prompt; cancel it first")
        session = Session(session_id, root)
    
        def take_up(trust):
            try:
                return Agent(journal, trust_journal=trust, **self.watchers(session))
            except StrangersJournal as error:
                return error
    
        agent = await self.call(session, lambda: take_up(False))
        if isinstance(agent, StrangersJournal):
            if agent.start["root"] != root:
                raise refused(f"session {session_id} works in {agent.start['root']}")
            if await self.ask_trust(session, agent) != "allow":
                raise refused(f"{agent.journal}: {agent.why}; it was left as it is")
            agent = await self.call(session, lambda: take_up(True))
        if agent.root != root:
            raise refused(f"session {session_id} works in {agent.root}, not in {root}")
        session.agent, self.sessions[session_id], state = agent, session, State()
        for event in agent.events:
            for update in updates(event, apply(state, event)):
                await self.client.session_update(session_id=session_id, update=update)
        return LoadSessionResponse()

    async def ask_trust(self, session, error):
        """The person's answer, "allow" or another, to taking up the journal of ERROR."""
        request = self.client.request_permission(
            session_id=session.id,
            options=TRUST_OPTIONS,
            tool_call=ToolCallUpdate(
                tool_call_id=f"journal-{session.id}",
                status="pending",
                title=code(f"take up {error.journal}"),
                kind="other",
                content=[shown_text(error.said("Allow"))],
            ),
        )
        try:
            outcome = (await request).outcome
        except RequestError:
            return "reject"
        return outcome.option_id if outcome.outcome == "selected" else "cancelled"

    def journal(self, session_id):
        """The journal of the run SESSION_ID names, in the directory of runs, and nowhere
        else."""
        if run_id_problem(session_id) or not os.path.isfile(
            os.path.join(runs_directory(), f"{session_id}.jsonl")
        ):
            raise refused(f"no run {session_id!r} in {runs_directory()}")
        return os.path.join(runs_directory(), f"{session_id}.jsonl")

    async def call(self, session, function):
        """FUNCTION's result, made on the Agent's thread: INTERRUPTED if a cancel cut it
        short; a refusal becomes a JSON-RPC error."""
        try:
            return await asyncio.wrap_future(self.worker.submit(session, function))
        except AgentError as error:
            raise refused(error.said(ACP_WORDS)) from None
        except (ValueError, OSError, ModelError) as error:
            raise refused(str(error)) from None

    def watchers(self, session):
        """What the Agent of SESSION calls as it records events and as its model retries."""
        return {
            "on_event": lambda event, state: self.tell(
                session, live(updates(event, state))
            ),
            "on_retry": lambda line: self.tell(session, [thought(line)]),
        }

    def tell(self, session, shown):
        """Send the updates SHOWN, in order, and wait until they are written (on the Agent's
        thread); a client that has gone is told nothing."""
    
        async def send():
            for update in shown:
                await self.client.session_update(session_id=session.id, update=update)
    
        with contextlib.suppress(ConnectionError):
            asyncio.run_coroutine_threadsafe(send(), self.loop).result()

TRUST_OPTIONS = [
    PermissionOption(
        option_id="allow", name="Allow: take it as mine", kind="allow_once"
    ),
    PermissionOption(option_id="reject", name="Leave it", kind="reject_once"),
]

def speak_until_closed(model, policy, budget, model_options, incoming, writing):
    """Speak ACP on the lines INCOMING and on WRITING until the client closes its end;
    return the exit status."""
    print(
        f"mlplcode acp: protocol version {PROTOCOL_VERSION} on stdin and stdout;"
        f" journals in {runs_directory()}",
        file=sys.stderr,
        flush=True,
    )
    worker = AgentThread()
    front = FrontEnd(
        worker,
        {
            "model": model,
            "policy": policy,
            "budget": budget,
            "model_options": model_options,
        },
    )
    threading.Thread(
        target=asyncio.run, args=(front.speak(incoming, writing),), daemon=True
    ).start()
    try:
        worker.serve()
    except KeyboardInterrupt:
        return 130
    return 0
