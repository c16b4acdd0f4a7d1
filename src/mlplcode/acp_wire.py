"""The Agent Client Protocol's wire: one JSON-RPC message a line, and the answer to
initialize; nothing here needs the SDK, so that it serves while the SDK loads."""

import importlib
import importlib.util
import itertools
import json
import os
import sys
import threading

from . import __version__
from .models import model_from_spec

def take_stdio():
    """The protocol's own files, copies of stdin and stdout; then stdin reads nothing
    and stdout writes to stderr, for everything else in the process and its children."""
    reading, writing = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    with open(os.devnull, "rb") as nothing:
        os.dup2(nothing.fileno(), 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return reading, writing

LINE_LIMIT = 50 * 1024 * 1024


def lines(reading, limit=LINE_LIMIT):
    """Each line of READING to its end; a line longer than LIMIT bytes is read to its
    end and given as None."""
    while line := reading.readline(limit + 1):
        if len(line) > limit and not line.endswith(b"\n"):
            while (rest := reading.readline(limit)) and not rest.endswith(b"\n"):
                pass
            line = None
        yield line

def error_response(code, message, id=None):
    return {"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}

def write_message(writing, message):
    writing.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    writing.flush()

def read_message(line):
    """LINE as (a JSON-RPC 2.0 message, None), or (None, the error response it
    deserves)."""
    if line is None:
        return None, error_response(
            -32700, f"Parse error: a message is one line of at most {LINE_LIMIT} bytes"
        )
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None, error_response(-32700, "Parse error: the line is not JSON")
    if not isinstance(message, dict):
        return None, error_response(
            -32600, "Invalid Request: a message is a JSON object"
        )
    problem = message_problem(message)
    if problem:
        id = message.get("id")
        return None, error_response(
            -32600, f"Invalid Request: {problem}", id if valid_id(id) else None
        )
    return message, None

def valid_id(id):
    return (
        id is None
        or isinstance(id, str)
        or (isinstance(id, int) and not isinstance(id, bool))
    )

def message_problem(message):
    """What keeps MESSAGE from being a JSON-RPC 2.0 request, notification or response,
    or ""."""
    if message.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    if not valid_id(message.get("id")):
        return "id must be a string, a whole number or null"
    if "method" in message:
        if not isinstance(message["method"], str):
            return "method must be a string"
        if not isinstance(message.get("params", {}), (dict, list, type(None))):
            return "params must be an object or an array"
    elif "id" not in message or ("result" in message) == ("error" in message):
        return (
            "a message is a request, a notification, or a response with a result or an"
            " error"
        )
    elif not isinstance(message.get("error", {}), dict):
        return "error must be an object"
    return ""

SDK_MISSING = "needs the Agent Client Protocol package: pip install 'mlplcode[acp]'"


def serve(model, policy, budget, model_options):
    """Speak ACP on stdin and stdout until the client closes stdin; return the exit
    status."""
    model_from_spec(model, **{**model_options, "grammar": None})  # settled at start
    if not sdk_installed():
        raise ValueError(SDK_MISSING)
    reading, writing = take_stdio()
    loaded = load_in_background("mlplcode.acp")
    try:
        incoming = answer_initialize(lines(reading), writing)
        acp = loaded()
    except KeyboardInterrupt:
        return 130
    return acp.speak_until_closed(
        model, policy, budget, model_options, incoming, writing
    )

def sdk_installed():
    try:
        return importlib.util.find_spec("acp") is not None
    except ValueError:
        return False

def load_in_background(name):
    """Import module NAME in a thread; give the function that waits for it and returns
    it, or raises what the import raised."""
    outcome = {}

    def load():
        try:
            outcome["module"] = importlib.import_module(name)
        except BaseException as error:  # raised again on the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=load, daemon=True)
    thread.start()

    def loaded():
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["module"]

    return loaded

PROTOCOL_VERSION = 1


def initialize_result():
    """What mlplcode answers to initialize, as the protocol's JSON."""
    return {
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": True,
            "promptCapabilities": {
                "image": False,
                "audio": False,
                "embeddedContext": False,
            },
        },
        "agentInfo": {"name": "mlplcode", "title": "mlplcode", "version": __version__},
    }

def is_initialize(message):
    """Whether MESSAGE is an initialize request that can be answered without the SDK."""
    params = message.get("params")
    return (
        message.get("method") == "initialize"
        and message.get("id") is not None
        and isinstance(params, dict)
        and type(params.get("protocolVersion")) is int
        and 0 <= params["protocolVersion"] <= 65535
    )


def answer_initialize(incoming, writing):
    """The lines of INCOMING still to be read, once the first has been answered here if
    it was an initialize request."""
    for line in incoming:
        message, _ = read_message(line)
        if message is not None and is_initialize(message):
            answer = {"jsonrpc": "2.0", "id": message["id"]}
            write_message(writing, {**answer, "result": initialize_result()})
            return incoming
        return itertools.chain([line], incoming)
    return incoming
