"""Models: functions from chat messages to reply text, built from a spec string."""

import io
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

from .journal import read_events

class ModelError(Exception):
    """A model could not give a reply; the message is one line a person can act on."""

def echo_model(messages):
    """Reply with the last message's content, so tests can see the exact prompt.

    Refuses an empty conversation: there is no prompt to echo.
    """
    if not messages:
        raise ModelError("echo model got no messages")
    return messages[-1]["content"]


echo_model.summarizes = False

def model_from_replies(replies, kind, used=0):
    """Answer each call with the next of `replies`, in order, after the first `used`.

    Refuses a call after the last reply rather than wrapping around, because
    a run that asks for more replies than were written has gone off script.
    """
    replies = list(replies)

    def model(messages):
        nonlocal used
        if used == len(replies):
            raise ModelError(f"{kind} model has no reply left ({used} used)")
        used += 1
        return replies[used - 1]

    model.reads_prompt = False
    return model

def read_text(path, label):
    """Read a UTF-8 file for a model, turning any failure into one ModelError line."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelError(f"{label}: cannot read: {error}") from error

def scripted_model(path, used=0):
    """A model whose replies are the strings of the JSON array in `path`, after the
    first `used`.

    Refuses, when built, a file that is not a JSON array of strings, so a
    broken script stops the CLI before the run starts.
    """
    label = f"scripted:{path}"
    try:
        replies = json.loads(read_text(path, label))
    except json.JSONDecodeError as error:
        raise ModelError(f"{label}: not valid JSON: {error}") from error
    if not isinstance(replies, list) or not all(isinstance(r, str) for r in replies):
        raise ModelError(f"{label}: must be a JSON array of strings")
    model = model_from_replies(replies, "scripted", used)
    model.summarizes = False  # its replies are actions; a summary is made without it
    return model

def replay_model(path, used=0):
    """A model that gives again the replies a recorded run received, in order, after the
    first `used`."""
    try:
        events = read_events(path)
    except (OSError, ValueError) as error:
        raise ModelError(f"replay:{path}: {error}") from error
    replies = [
        event["text"] if event["type"] == "reply" else event["summary"]
        for event in events
        if event["type"] in ("reply", "compact")
    ]
    return model_from_replies(replies, "replay", used)

def replies_used(spec, steps, summaries):
    """The replies a list-backed model of SPEC gave a run of STEPS steps and SUMMARIES
    summaries."""
    return steps + (summaries if spec.startswith("replay:") else 0)

DEFAULT_TIMEOUT = 600.0  # seconds for a whole call, retries included
DEFAULT_MAX_REPLY_BYTES = 2**20  # 1 MiB: the most of an answer's body that is read
DEFAULT_MAX_TOKENS = 4096  # the longest reply asked of the server
RETRIES = 3  # attempts after the first, for failures another attempt may mend
RETRY_BACKOFF = 0.5  # seconds before the first retry, doubled before each next one
RETRY_AFTER_LIMIT = 30.0  # the longest wait a 429's Retry-After is granted
OLLAMA_BASE_URL = "http://127.0.0.1:11434/v1"

def check_limits(timeout, max_reply_bytes, max_tokens):
    """Refuse, with ValueError, limits that no call could keep."""
    if not 0 < timeout <= 24 * 3600:
        raise ValueError(
            f"timeout must be above 0 and at most a day, in seconds, not {timeout!r}"
        )
    for name, value in (
        ("max_reply_bytes", max_reply_bytes),
        ("max_tokens", max_tokens),
    ):
        if not (isinstance(value, int) and value > 0):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")

def api_key(api_key_env, label):
    """The API key from the environment variable named `api_key_env`, or None if none is
    named.

    Refuses a named variable that is unset, empty, or holds what a header
    cannot carry; the message names the variable, never a value.
    """
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise ModelError(f"{label}: environment variable {api_key_env} is not set")
    if not (key.isascii() and key.isprintable()):
        raise ModelError(
            f"{label}: environment variable {api_key_env} holds characters "
            "an HTTP header cannot carry"
        )
    return key

def excerpt(text, secret):
    """A short one-line excerpt of server text, with `secret` blotted out.

    Server text is the only part of an error we did not write, and a server
    may echo the key it was sent.
    """
    line = " ".join(text.split())
    if secret:
        line = line.replace(secret, "[api key]")
    return line[:200] + ("..." if len(line) > 200 else "")


def described(error):
    """An exception's message on one line, or its type's name when it has none."""
    return " ".join(str(error).split()) or type(error).__name__

class ChatRequest(NamedTuple):
    """One chat-completions request, ready to send, and the key it carries."""

    url: str
    payload: bytes
    headers: dict
    secret: str | None


def chat_request(url, model_name, messages, max_tokens, key, extra):
    """The request that asks the model at `url` for one whole reply to `messages`.

    EXTRA holds fields that only some servers read, such as a grammar (chapter "The
    grammar").
    """
    body = {
        "model": model_name,
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        **extra,
    }
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return ChatRequest(url, json.dumps(body).encode("ascii"), headers, key)

def time_left(deadline):
    """Seconds until `deadline` on the monotonic clock; raises TimeoutError once it has
    passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline has passed")
    return left

class DeadlineReader(io.RawIOBase):
    """The bytes arriving on a socket, as a file on which no read waits past
    `deadline`."""

    def __init__(self, sock, deadline):
        super().__init__()
        self.sock, self.deadline = sock, deadline

    def readable(self):
        return True

    def readinto(self, buffer):
        self.sock.settimeout(time_left(self.deadline))
        return self.sock.recv_into(buffer)

    def makefile(self, mode):
        """The buffered file that http.client.HTTPResponse asks its socket for."""
        return io.BufferedReader(self)

def open_socket(parts, deadline):
    """A socket connected to the host of the split URL `parts`, in TLS for https, before
    `deadline`."""
    import socket
    import ssl

    port = parts.port or (443 if parts.scheme == "https" else 80)
    sock = socket.create_connection((parts.hostname, port), timeout=time_left(deadline))
    if parts.scheme == "https":
        sock.settimeout(time_left(deadline))
        sock = ssl.create_default_context().wrap_socket(
            sock, server_hostname=parts.hostname
        )
    return sock

def read_body(response, limit):
    """At most `limit` bytes of the body of `response`, read 64 KiB at most at a
    time."""
    body = bytearray()
    while len(body) < limit and (
        piece := response.read1(min(65536, limit - len(body)))
    ):
        body += piece
    return body

def post(request, deadline, limit):
    """POST `request` and read the answer before `deadline`: (status, Retry-After, body
    up to `limit`).

    Raises OSError or http.client.HTTPException when no whole answer came:
    a refused or broken connection, the deadline, a malformed answer.
    """
    import http.client

    parts = urlsplit(request.url)
    with open_socket(parts, deadline) as sock:
        sender = http.client.HTTPConnection(parts.netloc)
        sender.sock = sock  # so that it writes on our socket instead of opening its own
        sock.settimeout(time_left(deadline))
        sender.request(
            "POST",
            parts.path,
            request.payload,
            {"Host": parts.netloc, **request.headers},
        )
        response = http.client.HTTPResponse(
            DeadlineReader(sock, deadline), method="POST"
        )
        response.begin()
        return (
            response.status,
            response.getheader("Retry-After"),
            read_body(response, limit),
        )

LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def reply_content(body, label, secret):
    """The reply text of a chat-completions answer's body, every character writable as
    UTF-8.

    Refuses a body that is not JSON, is nested too deeply to decode, or has
    no string at choices[0].message.content.
    """
    text = body.decode("utf-8", errors="replace")
    try:
        content = json.loads(text)["choices"][0]["message"]["content"]
    except RecursionError:
        raise ModelError(f"{label}: reply is JSON nested too deeply to read") from None
    except ValueError:
        raise ModelError(
            f"{label}: reply is not JSON: {excerpt(text, secret)}"
        ) from None
    except (KeyError, IndexError, TypeError):
        raise ModelError(
            f"{label}: reply has no choices[0].message.content: {excerpt(text, secret)}"
        ) from None
    if not isinstance(content, str):
        raise ModelError(f"{label}: choices[0].message.content is not a string")
    return LONE_SURROGATE.sub("\N{REPLACEMENT CHARACTER}", content)

class Retryable(Exception):
    """A failure another attempt may mend; `wait` is the seconds a server asked us to
    wait, or None."""

    def __init__(self, reason, wait=None):
        super().__init__(reason)
        self.wait = wait

def retry_after_seconds(header):
    """The seconds a Retry-After header asks for, or None when it is missing or a
    date."""
    try:
        return max(0, int(header))
    except (TypeError, ValueError):
        return None

def answer_text(status, retry_after, body, label, secret):
    """The reply in an HTTP answer; raises Retryable for a 5xx or a 429 that asks no
    long wait."""
    if status < 400:
        return reply_content(body, label, secret)
    failure = (
        f"HTTP {status}: {excerpt(body.decode('utf-8', errors='replace'), secret)}"
    )
    if status < 500 and status != 429:
        raise ModelError(f"{label}: {failure}")
    if retry_after is not None and retry_after > RETRY_AFTER_LIMIT:
        raise ModelError(f"{label}: {failure} (asks to wait {retry_after} s)")
    raise Retryable(failure, retry_after)

def attempt(request, deadline, timeout, max_reply_bytes, label):
    """POST `request` once: the reply text; raises Retryable when another attempt may
    mend the failure.

    Every other failure is a ModelError: the deadline passed, the body is
    over `max_reply_bytes`, or the answer is not a chat reply.
    """
    import http.client

    try:
        status, retry_after, body = post(request, deadline, max_reply_bytes + 1)
    except ConnectionError as error:
        raise Retryable(f"connection failed: {described(error)}") from None
    except TimeoutError:
        raise ModelError(
            f"{label}: no complete reply within the {timeout:g} s deadline"
        ) from None
    except (OSError, ValueError, http.client.HTTPException) as error:
        # ValueError: a host name or a path that cannot be sent, such as one outside
        # ASCII
        raise ModelError(f"{label}: request failed: {described(error)}") from None
    if len(body) > max_reply_bytes:
        raise ModelError(f"{label}: reply is longer than {max_reply_bytes} bytes")
    return answer_text(
        status, retry_after_seconds(retry_after), body, label, request.secret
    )

def print_retry(line):
    """Show a retry on standard error: the default `on_retry`."""
    print(line, file=sys.stderr, flush=True)

def retries_note(retry):
    """The end of a failure's line: the retries made, and whether the deadline stopped
    them."""
    made = f"after {retry} {'retry' if retry == 1 else 'retries'}"
    if retry == RETRIES:
        return f" ({made})"
    if retry:
        return f" ({made}; the deadline leaves no time for another)"
    return " (the deadline leaves no time to retry)"

def with_retries(attempt_once, deadline, on_retry, label):
    """The reply of `attempt_once()`, called again after each Retryable failure, RETRIES
    times at most."""
    for retry in range(RETRIES + 1):
        try:
            return attempt_once()
        except Retryable as failure:
            wait = RETRY_BACKOFF * 2**retry if failure.wait is None else failure.wait
            if retry == RETRIES or time.monotonic() + wait >= deadline:
                raise ModelError(f"{label}: {failure}{retries_note(retry)}") from None
            on_retry(
                f"{label}: {failure}; retry {retry + 1} of {RETRIES} in {wait:g} s"
            )
            time.sleep(wait)

def grammar_fields(notation):
    """The request fields that carry the protocol's grammar in NOTATION, or none for
    None."""
    if notation is None:
        return {}
    from .grammar import REQUEST_FIELD, grammar_text

    if notation not in REQUEST_FIELD:
        raise ValueError(
            f"grammar {notation!r} is not one of {', '.join(REQUEST_FIELD)}"
        )
    return {REQUEST_FIELD[notation]: grammar_text(notation)}

def openai_model(
    model_name,
    base_url,
    api_key_env,
    timeout,
    max_reply_bytes,
    max_tokens,
    on_retry,
    grammar,
):
    """A model served by any OpenAI-compatible chat-completions server, within the
    limits given.

    The key is read from the environment at each call, so it lives in no
    file, flag or closure; errors carry the spec, never the key. GRAMMAR, a
    notation or None, sends the protocol's grammar in the field that notation's
    servers read (chapter "The grammar").
    """
    check_limits(timeout, max_reply_bytes, max_tokens)
    label = f"openai:{model_name}@{base_url}"
    url = base_url.rstrip("/") + "/chat/completions"
    extra = grammar_fields(grammar)

    def model(messages):
        request = chat_request(
            url, model_name, messages, max_tokens, api_key(api_key_env, label), extra
        )
        deadline = time.monotonic() + timeout
        return with_retries(
            lambda: attempt(request, deadline, timeout, max_reply_bytes, label),
            deadline,
            on_retry,
            label,
        )

    model.unconstrained = (
        model
        if grammar is None
        else openai_model(
            model_name,
            base_url,
            api_key_env,
            timeout,
            max_reply_bytes,
            max_tokens,
            on_retry,
            None,
        )
    )
    return model

SPEC_KINDS = (
    "scripted:FILE.json, replay:JOURNAL, echo, openai:MODEL@URL or ollama:MODEL"
)
SPEC_USAGE = f"use {SPEC_KINDS}"


def has_valid_port(parts):
    """Whether the split URL `parts` has no port, or one from 1 to 65535."""
    try:
        return parts.port != 0
    except ValueError:  # not a number, or out of range
        return False


def openai_target(rest, spec):
    """Split the MODEL@URL of an openai spec.

    Refuses a missing model, and a URL that is not HTTP, has no host, has a
    bad port, or carries a user name or password.
    """
    model_name, _, base_url = rest.partition("@")
    parts = urlsplit(base_url)
    if not (
        model_name
        and parts.scheme in ("http", "https")
        and parts.hostname
        and "@" not in parts.netloc
        and has_valid_port(parts)
    ):
        raise ValueError(f"malformed model spec {spec!r}; {SPEC_USAGE}")
    return model_name, base_url

def model_from_spec(
    spec,
    api_key_env=None,
    used=0,
    *,
    timeout=DEFAULT_TIMEOUT,
    max_reply_bytes=DEFAULT_MAX_REPLY_BYTES,
    max_tokens=DEFAULT_MAX_TOKENS,
    on_retry=print_retry,
    grammar=None,
    context=None,
):
    """Build the model a spec string names; a list-backed one starts after `used`
    replies.

    Refuses an unknown spec, or limits no call could keep, with ValueError;
    `api_key_env`, the limits, `on_retry` and `grammar` matter only to the HTTP
    models, and `context` (the server's context window) only to the agent.
    """
    kind, _, rest = spec.partition(":")
    http_options = {
        "timeout": timeout,
        "max_reply_bytes": max_reply_bytes,
        "max_tokens": max_tokens,
        "on_retry": on_retry,
        "grammar": grammar,
    }
    if spec == "echo":
        return echo_model
    if kind == "scripted" and rest:
        return scripted_model(Path(rest), used)
    if kind == "replay" and rest:
        return replay_model(Path(rest), used)
    if kind == "openai":
        return openai_model(*openai_target(rest, spec), api_key_env, **http_options)
    if kind == "ollama" and rest:
        return openai_model(rest, OLLAMA_BASE_URL, api_key_env, **http_options)
    raise ValueError(f"unknown model spec {spec!r}; {SPEC_USAGE}")

def lasting_spec(spec):
    """SPEC as a journal keeps it: a scripted or replay file named by its absolute
    path."""
    kind, _, rest = spec.partition(":")
    if kind in ("scripted", "replay") and rest:
        return f"{kind}:{os.path.abspath(rest)}"
    return spec

PROBE_SECONDS = 3.0
OLLAMA_SMALLEST_CONTEXT = 2048


def fetch_json(url, body=None):
    """The JSON that a GET of URL (a POST of BODY, when given) answers, or None for any
    failure."""
    import http.client

    parts = urlsplit(url)
    kind = (
        http.client.HTTPSConnection
        if parts.scheme == "https"
        else http.client.HTTPConnection
    )
    try:
        connection = kind(parts.netloc, timeout=PROBE_SECONDS)
        try:
            payload = None if body is None else json.dumps(body).encode()
            connection.request(
                "GET" if body is None else "POST",
                parts.path,
                payload,
                {"Content-Type": "application/json"},
            )
            response = connection.getresponse()
            data = response.read(DEFAULT_MAX_REPLY_BYTES)
        finally:
            connection.close()
        return json.loads(data) if response.status == 200 else None
    except (OSError, ValueError, RecursionError, http.client.HTTPException):
        return None

def probe_server(spec):
    """What the server of an HTTP SPEC says of itself: {"server", "context"}, or {} for
    any other."""
    kind, _, rest = spec.partition(":")
    if kind == "ollama" and rest:
        model_name, base_url = rest, OLLAMA_BASE_URL
    elif kind == "openai":
        model_name, base_url = openai_target(rest, spec)
    else:
        return {}
    base = base_url.rstrip("/")
    root = base.removesuffix("/v1")
    props = fetch_json(root + "/props")
    if isinstance(props, dict) and isinstance(
        props.get("default_generation_settings"), dict
    ):
        return {
            "server": "llama.cpp",
            "context": props["default_generation_settings"].get("n_ctx"),
        }
    listed = fetch_json(base + "/models")
    cards = listed.get("data") if isinstance(listed, dict) else None
    card = next(
        (
            card
            for card in cards or []
            if isinstance(card, dict) and card.get("id") == model_name
        ),
        None,
    )
    if card and "max_model_len" in card:
        return {"server": "vllm", "context": card["max_model_len"]}
    shown = fetch_json(root + "/api/show", {"model": model_name})
    if isinstance(shown, dict) and "model_info" in shown:
        setting = re.search(
            r"^num_ctx\s+(\d+)", str(shown.get("parameters", "")), re.MULTILINE
        )
        return {
            "server": "ollama",
            "context": int(setting.group(1)) if setting else OLLAMA_SMALLEST_CONTEXT,
        }
    return {}

DEFAULT_CONTEXT = 8192
GRAMMAR_OF_SERVER = {"llama.cpp": "gbnf", "vllm": "lark"}
GRAMMAR_CHOICES = ("auto", "gbnf", "lark", "none")


def settled_options(spec, options):
    """OPTIONS with `grammar`, `context` and `max_tokens` made definite, asking SPEC's
    server if need be."""
    grammar = options.get("grammar", "auto") or "none"
    if grammar not in GRAMMAR_CHOICES:
        raise ValueError(
            f"grammar {grammar!r} is not one of {', '.join(GRAMMAR_CHOICES)}"
        )
    said = probe_server(spec) if grammar == "auto" or not options.get("context") else {}
    if grammar == "auto":
        grammar = GRAMMAR_OF_SERVER.get(said.get("server"), "none")
    context = options.get("context") or said.get("context")
    context = context if isinstance(context, int) and context > 0 else DEFAULT_CONTEXT
    reply = min(options.get("max_tokens", DEFAULT_MAX_TOKENS), context // 4)
    return {
        **options,
        "grammar": None if grammar == "none" else grammar,
        "context": context,
        "max_tokens": reply,
    }
