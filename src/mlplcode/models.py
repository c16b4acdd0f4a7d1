"""Models: functions from chat messages to reply text, built from a spec string."""

import io
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote, urlsplit

from .journal import read_events

class ModelError(Exception):
    """A model could not give a reply; the message is one line a person can act on."""

class Cut(str):
    """A reply the server cut off at the reply limit (its finish_reason was
    "length")."""

    cut = True


CUT_OFF = (
    "CUT OFF: your reply reached the reply limit of {limit} tokens before it ended,"
    " so none of it was carried out. Send a shorter action: change a file with a PATCH"
    " of the few lines that change rather than a WRITE of all of it, write a long file"
    " in parts, and put no words around the action."
)

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
        (Cut if event.get("cut") else str)(
            event["text"] if event["type"] == "reply" else event["summary"]
        )
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
WAIT_NOTICE = 15.0  # seconds of silence from the server before a line says so
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

def excerpt(text, secret, limit=200):
    """A short one-line excerpt of server text, at most LIMIT characters, with `secret`
    blotted out.

    Server text is the only part of an error we did not write, and a server
    may echo the key it was sent.
    """
    line = " ".join(text.split())
    if secret:
        line = line.replace(secret, "[api key]")
    return line[:limit] + ("..." if len(line) > limit else "")


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
    `deadline`, and that calls ON_WAIT after each WAIT_NOTICE seconds of silence."""

    def __init__(self, sock, deadline, on_wait=None):
        super().__init__()
        self.sock, self.deadline, self.on_wait = sock, deadline, on_wait

    def readable(self):
        return True

    def readinto(self, buffer):
        while True:
            left = time_left(self.deadline)
            self.sock.settimeout(min(left, WAIT_NOTICE) if self.on_wait else left)
            try:
                return self.sock.recv_into(buffer)
            except TimeoutError:
                if self.on_wait is None or left <= WAIT_NOTICE:
                    raise
                self.on_wait(time_left(self.deadline))

    def makefile(self, mode):
        """The buffered file that http.client.HTTPResponse asks its socket for."""
        return io.BufferedReader(self)

def still_waiting(label, timeout, on_line):
    """The ON_WAIT of a model's calls: a line for ON_LINE that says how long the reply
    has been waited for."""
    return lambda left: on_line(
        f"{label}: waiting for the reply, {timeout - left:.0f} s so far of the"
        f" {timeout:g} s deadline"
    )

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

def post(request, deadline, limit, on_wait):
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
            DeadlineReader(sock, deadline, on_wait), method="POST"
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
        choice = json.loads(text)["choices"][0]
        content = choice["message"]["content"]
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
    content = LONE_SURROGATE.sub("\N{REPLACEMENT CHARACTER}", content)
    if choice.get("finish_reason") == "length":
        return Cut(content)
    return content

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

CONTEXT_SAID = re.compile(
    r"(?:context (?:length|size|window)|n_ctx)\D{0,40}?(\d+)", re.IGNORECASE
)


def context_advice(text, context):
    """What to do about a refusal whose TEXT names the server's context, for a run that
    took CONTEXT tokens; or ""."""
    said = CONTEXT_SAID.search(text)
    if not said:
        return ""
    size = int(said.group(1))
    if context and size < context:
        return (
            f"; the server's context is {size} tokens, not the {context} this run"
            f" took: run again with --context {size}"
        )
    return (
        f"; the server counted more tokens than this run estimated: run again with a"
        f" --context below {size}"
    )

def answer_text(status, retry_after, body, label, secret, context=None):
    """The reply in an HTTP answer; raises Retryable for a 5xx or a 429 that asks no
    long wait."""
    if status < 400:
        return reply_content(body, label, secret)
    text = body.decode("utf-8", errors="replace")
    if status < 500 and status != 429:
        advice = context_advice(text, context)
        quoted = excerpt(text, secret, 600)
        raise ModelError(f"{label}: HTTP {status}: {quoted}{advice}")
    failure = f"HTTP {status}: {excerpt(text, secret)}"
    if retry_after is not None and retry_after > RETRY_AFTER_LIMIT:
        raise ModelError(f"{label}: {failure} (asks to wait {retry_after} s)")
    raise Retryable(failure, retry_after)

def attempt(request, deadline, timeout, max_reply_bytes, label, on_wait, context):
    """POST `request` once: the reply text; raises Retryable when another attempt may
    mend the failure.

    Every other failure is a ModelError: the deadline passed, the body is
    over `max_reply_bytes`, or the answer is not a chat reply.
    """
    import http.client

    try:
        status, retry_after, body = post(
            request, deadline, max_reply_bytes + 1, on_wait
        )
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
        status, retry_after_seconds(retry_after), body, label, request.secret, context
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

def grammar_fields(notation, field=None):
    """The request fields that carry the protocol's grammar in NOTATION, in FIELD or the
    field of its notation; none for None."""
    if notation is None:
        return {}
    from .grammar import REQUEST_FIELD, grammar_text

    if notation not in REQUEST_FIELD:
        raise ValueError(
            f"grammar {notation!r} is not one of {', '.join(REQUEST_FIELD)}"
        )
    field, text = field or REQUEST_FIELD[notation], grammar_text(notation)
    return {field: {"grammar": text} if field == "structured_outputs" else text}

def openai_model(
    model_name,
    base_url,
    api_key_env,
    timeout,
    max_reply_bytes,
    max_tokens,
    on_retry,
    grammar,
    grammar_field=None,
    context=None,
):
    """A model served by any OpenAI-compatible chat-completions server, within the
    limits given.

    The key is read from the environment at each call, so it lives in no
    file, flag or closure; errors carry the spec, never the key. GRAMMAR, a
    notation or None, sends the protocol's grammar in GRAMMAR_FIELD, or the field
    that notation's servers read (chapter "The grammar").
    """
    check_limits(timeout, max_reply_bytes, max_tokens)
    label = f"openai:{model_name}@{base_url}"
    url = base_url.rstrip("/") + "/chat/completions"
    extra, waiting = grammar_fields(grammar, grammar_field), still_waiting(
        label, timeout, on_retry
    )

    def model(messages):
        request = chat_request(
            url, model_name, messages, max_tokens, api_key(api_key_env, label), extra
        )
        deadline = time.monotonic() + timeout
        return with_retries(
            lambda: attempt(
                request, deadline, timeout, max_reply_bytes, label, waiting, context
            ),
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
            context=context,
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
    grammar_field=None,
    server=None,
    context_from=None,
):
    """Build the model a spec string names; a list-backed one starts after `used`
    replies.

    Refuses an unknown spec, or limits no call could keep, with ValueError;
    `api_key_env`, the limits, `on_retry`, `grammar`, `grammar_field` and `context`
    matter only to the HTTP models; `server` and `context_from` say how the run
    settled them (chapter "The grammar").
    """
    kind, _, rest = spec.partition(":")
    http_options = {
        "timeout": timeout,
        "max_reply_bytes": max_reply_bytes,
        "max_tokens": max_tokens,
        "on_retry": on_retry,
        "grammar": grammar,
        "grammar_field": grammar_field,
        "context": context,
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
SAFE_CONTEXT = 2048


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

def dig(value, *path):
    """VALUE[path[0]][path[1]]..., or None where a key is missing or a value of the
    wrong kind."""
    for key in path:
        if isinstance(value, dict) and isinstance(key, str):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and key < len(value):
            value = value[key]
        else:
            return None
    return value

def llama_cpp(root, base, name):
    props = fetch_json(root + "/props")
    settings = dig(props, "default_generation_settings")
    if isinstance(settings, dict):
        return {"server": "llama.cpp", "context": settings.get("n_ctx")}


def listed(root, base, name):
    cards = dig(fetch_json(base + "/models"), "data")
    cards = [card for card in cards or [] if isinstance(card, dict)]
    card = next((c for c in cards if c.get("id") == name), cards[0] if cards else {})
    owner = card.get("owned_by")
    if owner in ("vllm", "sglang"):
        said = {"server": owner, "context": card.get("max_model_len")}
        version = dig(fetch_json(root + "/version"), "version")
        return {**said, "version": version} if owner == "vllm" else said
    if owner == "me" and isinstance(card.get("permissions"), list):
        return {"server": "llama-cpp-python", "context": None}
    if owner == "llamacpp":
        return {"server": "llama.cpp", "context": None}


def ollama(root, base, name):
    shown = fetch_json(root + "/api/show", {"model": name})
    if isinstance(shown, dict) and "model_info" in shown:
        setting = re.search(
            r"^num_ctx\s+(\d+)", str(shown.get("parameters", "")), re.MULTILINE
        )
        context = int(setting.group(1)) if setting else None
        return {"server": "ollama", "context": context}


def lm_studio(root, base, name):
    models = dig(fetch_json(root + "/api/v1/models"), "models")
    if isinstance(models, list) and all(dig(m, "key") for m in models) and models:
        entry = next((m for m in models if m["key"] == name), models[0])
        context = dig(entry, "loaded_instances", 0, "config", "context_length")
        return {"server": "lm-studio", "context": context}
    shown = fetch_json(f"{root}/api/v0/models/{quote(name, safe='')}")
    if dig(shown, "state") and dig(shown, "max_context_length"):
        return {"server": "lm-studio", "context": dig(shown, "loaded_context_length")}

GRAMMAR_OF_SERVER = {
    "llama.cpp": ("gbnf", "grammar"),
    "llama-cpp-python": ("gbnf", "grammar"),
    "sglang": ("gbnf", "ebnf"),
    "vllm": ("lark", "guided_grammar"),
}


def grammar_of(said):
    """The notation and the request field of the grammar the server SAID takes, or
    (None, None)."""
    notation, field = GRAMMAR_OF_SERVER.get(said.get("server"), (None, None))
    numbers = re.match(r"(\d+)\.(\d+)", str(said.get("version")))
    if notation == "lark" and numbers and tuple(map(int, numbers.groups())) >= (0, 12):
        field = "structured_outputs"
    return notation, field

def probe_server(spec):
    """What the server of an HTTP SPEC says of itself: {"server", "context", "grammar",
    "field"}, or {}."""
    kind, _, rest = spec.partition(":")
    if kind == "ollama" and rest:
        model_name, base_url = rest, OLLAMA_BASE_URL
    elif kind == "openai":
        model_name, base_url = openai_target(rest, spec)
    else:
        return {}
    base = base_url.rstrip("/")
    root = base.removesuffix("/v1")
    for ask in (llama_cpp, listed, ollama, lm_studio):
        said = ask(root, base, model_name)
        if said:
            context = said["context"]
            notation, field = grammar_of(said)
            return {
                "server": said["server"],
                "context": context if type(context) is int and context > 0 else None,
                "grammar": notation,
                "field": field,
            }
    return {}

DEFAULT_CONTEXT = 8192
GRAMMAR_CHOICES = ("auto", "gbnf", "lark", "none")


def settled_options(spec, options):
    """OPTIONS with `grammar`, `context` and `max_tokens` made definite, asking SPEC's
    server if need be, and for a server, what settled them."""
    grammar = options.get("grammar", "auto") or "none"
    if grammar not in GRAMMAR_CHOICES:
        raise ValueError(
            f"grammar {grammar!r} is not one of {', '.join(GRAMMAR_CHOICES)}"
        )
    served = spec.partition(":")[0] in ("openai", "ollama")
    asked = served and (grammar == "auto" or not options.get("context"))
    said = probe_server(spec) if asked else {}
    if grammar == "auto":
        notation, field = said.get("grammar"), said.get("field")
    else:
        notation = None if grammar == "none" else grammar
        field = said.get("field") if said.get("grammar") == notation else None
    if options.get("context"):
        context, source = options["context"], "option"
    elif said.get("context"):
        context, source = said["context"], "server"
    else:
        context, source = SAFE_CONTEXT if served else DEFAULT_CONTEXT, "assumed"
    reply = min(options.get("max_tokens", DEFAULT_MAX_TOKENS), context // 4)
    settled = {**options, "grammar": notation, "context": context, "max_tokens": reply}
    if served:
        settled["server"] = said.get("server", "unknown" if asked else "not asked")
        settled["context_from"] = source
        settled.update({"grammar_field": field} if field else {})
    return settled

SERVER_NAMES = {
    "llama.cpp": "llama.cpp's server",
    "llama-cpp-python": "llama-cpp-python's server",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "ollama": "Ollama",
    "lm-studio": "LM Studio",
    "unknown": "a server that does not say what it is",
    "not asked": "not asked, since --context and --grammar were given",
}
CONTEXT_FROM = {
    "option": "from --context",
    "server": "as the server says",
    "assumed": "assumed: the server does not say (--context TOKENS gives it)",
}


def settled_line(options):
    """The line that says what a run settled of its model's OPTIONS, or "" for a model
    without a server."""
    if "server" not in options:
        return ""
    grammar = options.get("grammar")
    if grammar:
        from .grammar import REQUEST_FIELD

        field = options.get("grammar_field") or REQUEST_FIELD[grammar]
        words = f"{grammar}, in the field {field}"
    elif options["server"] in GRAMMAR_OF_SERVER:
        words = "none (--grammar none)"
    else:
        words = "none: the server is not known to take one (--grammar gives one)"
    server = SERVER_NAMES.get(options["server"], options["server"])
    source = CONTEXT_FROM.get(options.get("context_from"), "")
    return (
        f"model: {server}; context {options['context']} tokens, {source}; replies of"
        f" at most {options['max_tokens']} tokens; grammar {words}"
    )
