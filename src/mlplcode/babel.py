"""Org-babel's bridge to Jupyter: run a block in its session's kernel, kept alive
between blocks.

    python3 -m mlplcode.babel [--session NAME] [--org-file FILE] [--kernel NAME]
    [--timeout SECONDS]
                              [--output FILE] < BLOCK
    python3 -m mlplcode.babel --session NAME [--org-file FILE] --stop
    python3 -m mlplcode.babel --lisp-file
    python3 -m mlplcode.babel --init

This file is tangled from mlplcode.org (chapter "Org-babel"); edit the book,
not this file.
"""

import argparse
import hashlib
import json
import os
import queue
import re
import secrets
import signal
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import resources

from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
from jupyter_core.paths import jupyter_runtime_dir

from .trust import visible

DEFAULT_TIMEOUT = 600
START_TIMEOUT = 60
ANSWER_TIMEOUT = 10

class BridgeError(Exception):
    """A failure of the bridge, not of the block: exit status 2."""

SESSION_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")

@dataclass
class Session:
    name: str
    connection_file: str
    pid_file: str
    log_file: str

def find_session(name, org_file=None):
    """The files of session NAME of ORG_FILE (or of no file), in a private folder of
    Jupyter's runtime directory."""
    if not SESSION_NAME.fullmatch(name):
        raise BridgeError(
            f"session {name!r}: a session name is letters, digits and . _ + -"
        )
    directory = os.path.join(os.path.realpath(jupyter_runtime_dir()), "mlplcode-babel")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if org_file:
        directory = os.path.join(
            directory,
            hashlib.sha256(os.fsencode(os.path.realpath(org_file))).hexdigest()[:16],
        )
        os.makedirs(directory, mode=0o700, exist_ok=True)
    base = os.path.join(directory, name)
    return Session(name, base + ".json", base + ".pid", base + ".log")

def running_pid(session):
    """The pid of the session's kernel while that kernel runs, else None."""
    try:
        with open(session.pid_file) as f:
            pid = int(f.read())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().split(b"\0")
    except OSError:
        return pid
    if state == "Z" or session.connection_file.encode() not in command:
        return None
    return pid

def remove_files(session, *, log=False):
    for path in (session.connection_file, session.pid_file) + (
        (session.log_file,) if log else ()
    ):
        try:
            os.remove(path)
        except FileNotFoundError:
            pass

def kernel_spec(kernel):
    try:
        return KernelSpecManager().get_kernel_spec(kernel)
    except NoSuchKernel:
        raise BridgeError(
            f"no Jupyter kernel named {kernel!r} (`jupyter kernelspec list` shows "
            "the installed ones; `mlplcode kernel install` installs mlplcode)"
        ) from None

def kernel_command(spec, connection_file):
    """The kernelspec's argv with its {fields} filled in, as jupyter_client fills
    them."""
    fields = {
        "connection_file": connection_file,
        "resource_dir": spec.resource_dir,
        "prefix": sys.prefix,
    }
    argv = [
        re.sub(r"\{(\w+)\}", lambda m: fields.get(m.group(1), m.group(0)), arg)
        for arg in spec.argv
    ]
    if argv and argv[0] in (
        "python",
        "python3",
        f"python{sys.version_info[0]}.{sys.version_info[1]}",
    ):
        argv[0] = sys.executable
    return argv

def kernel_environment(spec):
    env = {key: value for key, value in os.environ.items() if key != "JPY_PARENT_PID"}
    env.update(
        {
            key: string.Template(value).safe_substitute(env)
            for key, value in spec.env.items()
        }
    )
    return env

def start_kernel(session, kernel):
    """Launch KERNEL for SESSION, detached from this process; return a client once it
    answers."""
    spec = kernel_spec(kernel)
    remove_files(session)
    write_connection_file(
        session.connection_file,
        ip="127.0.0.1",
        key=secrets.token_hex(32).encode(),
        kernel_name=kernel,
    )
    with open(session.log_file, "ab") as log:
        process = subprocess.Popen(
            kernel_command(spec, session.connection_file),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=kernel_environment(spec),
            start_new_session=True,
        )
    with open(session.pid_file, "w") as f:
        f.write(str(process.pid))
    client = connect(session)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if answers(client, 1):
            return client
        if process.poll() is not None or time.monotonic() > deadline:
            client.stop_channels()
            stop(session, keep_log=True)
            how = (
                f"exited with status {process.returncode}"
                if process.returncode is not None
                else f"did not answer in {START_TIMEOUT} s"
            )
            raise BridgeError(
                f"the {kernel} kernel {how} while starting: "
                f"{last_line(session.log_file)!r}; its output is in {session.log_file}"
            )

def last_line(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else ""

def connect(session):
    client = BlockingKernelClient(connection_file=session.connection_file)
    client.load_connection_file()
    client.start_channels(stdin=False, hb=False)
    return client

def answers(client, seconds):
    """Whether the kernel answers a kernel_info request, on the output channel too,
    within SECONDS."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if collect(
            client,
            client.kernel_info(),
            min(0.5, deadline - time.monotonic()),
            Outputs(),
        ):
            return True
    return False

def attach(session, kernel):
    """A client of the session's kernel, started first when the session has none
    running."""
    if running_pid(session) is None:
        restarted = os.path.exists(session.pid_file)
        return start_kernel(session, kernel), restarted
    with open(session.connection_file) as f:
        running = json.load(f).get("kernel_name")
    if running != kernel:
        raise BridgeError(
            f"session {session.name} runs the {running} kernel, not {kernel}; "
            "stop it first (M-x ob-mlplcode-stop-session, or --stop)"
        )
    client = connect(session)
    if not answers(client, ANSWER_TIMEOUT):
        client.stop_channels()
        raise BridgeError(
            f"the kernel of session {session.name} did not answer in {ANSWER_TIMEOUT}"
            " s; it may still be running another block (--stop ends it)"
        )
    return client, False

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

def plain(content):
    """The text/plain of a display, or a note saying which kinds of output it had
    instead."""
    data = content.get("data", {})
    if "text/plain" in data:
        return data["text/plain"]
    return f"[{', '.join(sorted(data))} output, not shown as text]"

def error_text(content):
    traceback = [ANSI.sub("", line) for line in content.get("traceback") or []]
    return (
        "\n".join(traceback)
        if traceback
        else f"{content.get('ename')}: {content.get('evalue')}"
    )

class Outputs:
    """The outputs of one cell as text, kept the way a notebook keeps them."""

    def __init__(self):
        self.items = []
        self.clear_pending = False
        self.error = False

    def add(self, text, display_id=None):
        if self.clear_pending:
            self.items.clear()
            self.clear_pending = False
        self.items.append([display_id, text])

    def hook(self, message):
        kind, content = message["msg_type"], message["content"]
        display_id = content.get("transient", {}).get("display_id")
        stream = ("stream", content.get("name"))
        joins = self.items and self.items[-1][0] == stream and not self.clear_pending
        if kind == "stream" and joins:
            self.items[-1][1] += content["text"]
        elif kind == "stream":
            self.add(content["text"], stream)
        elif kind in ("display_data", "execute_result"):
            self.add(plain(content), display_id)
        elif kind == "update_display_data":
            for item in self.items:
                if display_id is not None and item[0] == display_id:
                    item[1] = plain(content)
        elif kind == "clear_output":
            if content.get("wait"):
                self.clear_pending = True
            else:
                self.items.clear()
        elif kind == "error":
            self.error = True
            self.add(error_text(content))

    def text(self):
        return "".join(
            text if text.endswith("\n") else text + "\n" for _, text in self.items
        )

def execute(session, client, code, timeout, outputs):
    """Run CODE, collecting OUTPUTS; return how it ended: ok, error, aborted, timeout or
    interrupted."""
    request = client.execute(code, allow_stdin=False)
    try:
        stopped = None if collect(client, request, timeout, outputs) else "timeout"
    except KeyboardInterrupt:
        stopped = "interrupted"
    if stopped:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        interrupt(session, client)
        collect(client, request, ANSWER_TIMEOUT, outputs)
        return stopped
    content = reply_to(client, request)
    if content["status"] == "error" and not outputs.error:
        outputs.add(error_text(content))
    elif content["status"] == "aborted":
        outputs.add("[the kernel aborted this block]")
    return content["status"]

def collect(client, request, seconds, outputs):
    """Pass REQUEST's output messages to OUTPUTS until the kernel is idle; False if
    SECONDS pass first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            message = client.iopub_channel.get_msg(
                timeout=max(0.0, deadline - time.monotonic())
            )
        except queue.Empty:
            return False
        if message["parent_header"].get("msg_id") != request:
            continue
        if (
            message["msg_type"] == "status"
            and message["content"]["execution_state"] == "idle"
        ):
            return True
        outputs.hook(message)

def reply_to(client, request):
    deadline = time.monotonic() + ANSWER_TIMEOUT
    while True:
        try:
            message = client.shell_channel.get_msg(
                timeout=max(0.0, deadline - time.monotonic())
            )
        except queue.Empty:
            raise BridgeError(
                f"the kernel sent no reply to the block in {ANSWER_TIMEOUT} s"
            ) from None
        if message["parent_header"].get("msg_id") == request:
            return message["content"]

def interrupt(session, client):
    """Interrupt the cell that the session's kernel is running, as Jupyter's interrupt
    button does."""
    with open(session.connection_file) as f:
        spec = kernel_spec(json.load(f).get("kernel_name"))
    if spec.interrupt_mode == "message":
        client.control_channel.send(client.session.msg("interrupt_request", content={}))
    else:
        pid = running_pid(session)
        if pid:
            os.killpg(pid, signal.SIGINT)

def run_block(session, kernel, timeout, output):
    code = sys.stdin.buffer.read().decode("utf-8")
    client, restarted = attach(session, kernel)
    outputs = Outputs()
    try:
        status = execute(session, client, code, timeout, outputs)
    finally:
        client.stop_channels()
    text = outputs.text()
    if restarted:
        text = (
            f"[session {session.name}: its kernel had stopped; this block ran in a new"
            " one]\n"
            + text
        )
    if status in ("timeout", "interrupted"):
        stopped = (
            f"the block ran for more than {timeout:g} s and was interrupted"
            if status == "timeout"
            else "interrupted; the kernel was interrupted too"
        )
        write_text(visible(text) + f"[{stopped}]\n", output)
        print(f"mlplcode.babel: {stopped}", file=sys.stderr)
        return 3
    write_text(visible(text), output)
    return 0 if status == "ok" else 1

def write_text(text, output):
    """TEXT, as UTF-8, to the file OUTPUT, or to standard output when there is none."""
    if output:
        with open(output, "wb") as file:
            file.write(text.encode("utf-8"))
    else:
        sys.stdout.buffer.write(text.encode("utf-8"))

def wait_gone(session, pid, seconds):
    deadline = time.monotonic() + seconds
    while running_pid(session) == pid:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True

def stop(session, *, keep_log=False):
    """Stop the session's kernel: ask it to shut down, then signal its process group;
    return its pid."""
    pid = running_pid(session)
    if pid and os.path.exists(session.connection_file):
        client = connect(session)
        request = client.shutdown()
        try:
            while (
                client.control_channel.get_msg(timeout=5)["parent_header"].get("msg_id")
                != request
            ):
                pass
        except queue.Empty:
            pass
        client.stop_channels()
    if pid:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if wait_gone(session, pid, 5):
                break
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
    remove_files(session, log=not keep_log)
    return pid

def lisp_file():
    return str(resources.files("mlplcode") / "ob-mlplcode.el")

def init_lines():
    """The lines for Emacs's init file that load ob-mlplcode.el and run its bridge with
    this Python."""
    return "\n".join([
        (
            ";; mlplcode's org-babel blocks (these lines are printed by python3 -m"
            " mlplcode.babel --init)"
        ),
        f"(setq ob-mlplcode-python {lisp_string(sys.executable)})",
        f"(load {lisp_string(lisp_file())})",
        "(ob-mlplcode-allow-stepping-blocks)",
        "",
    ])


def lisp_string(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

def build_parser():
    parser = argparse.ArgumentParser(
        prog="python3 -m mlplcode.babel",
        description=(
            "Run the cells read from standard input in the Jupyter kernel of an"
            " org-babel session."
        ),
    )
    parser.add_argument(
        "--session",
        default="default",
        metavar="NAME",
        help="the session (default: default)",
    )
    parser.add_argument(
        "--org-file",
        metavar="FILE",
        help="the org file the session belongs to (default: none)",
    )
    parser.add_argument(
        "--kernel",
        default="mlplcode",
        metavar="NAME",
        help="the kernel a new session starts (default: mlplcode)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"interrupt a block that runs longer (default: {DEFAULT_TIMEOUT})",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="write the block's text to FILE (default: standard output)",
    )
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--stop", action="store_true", help="stop the session's kernel")
    action.add_argument(
        "--lisp-file", action="store_true", help="print where ob-mlplcode.el is"
    )
    action.add_argument(
        "--init", action="store_true", help="print the lines for Emacs's init file"
    )
    return parser

def seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = 0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a positive number of seconds"
        )
    return value

def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.lisp_file or args.init:
            print(
                lisp_file() if args.lisp_file else init_lines(),
                end="\n" if args.lisp_file else "",
            )
            return 0
        session = find_session(args.session, args.org_file)
        if args.stop:
            pid = stop(session)
            write_text(
                (
                    f"session {session.name}: stopped its kernel (pid {pid})\n"
                    if pid
                    else f"session {session.name}: no kernel was running\n"
                ),
                args.output,
            )
            return 0
        return run_block(session, args.kernel, args.timeout, args.output)
    except BridgeError as error:
        print(f"mlplcode.babel: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        write_text(
            "[interrupted before the block reached the kernel; nothing ran]\n",
            args.output,
        )
        print("mlplcode.babel: interrupted", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
