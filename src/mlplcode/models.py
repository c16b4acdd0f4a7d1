"""Models: functions from chat messages to reply text, built from a spec string."""
import json
import os
from pathlib import Path

import httpx

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

    return model

def read_text(path, label):
    """Read a UTF-8 file for a model, turning any failure into one ModelError line."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ModelError(f"{label}: cannot read: {error}") from error

def scripted_model(path, used=0):
    """A model whose replies are the strings of the JSON array in `path`, after the first `used`.

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
    return model_from_replies(replies, "scripted", used)

def replay_model(path, used=0):
    """A model that gives again the replies a recorded run received, in order, after the first `used`."""
    try:
        events = read_events(path)
    except (OSError, ValueError) as error:
        raise ModelError(f"replay:{path}: {error}") from error
    return model_from_replies([e["text"] for e in events if e["type"] == "reply"], "replay", used)

CONNECT_TIMEOUT = 10.0  # seconds to open the connection
READ_TIMEOUT = 300.0  # seconds between bytes of the reply; a local model may think long
OLLAMA_BASE_URL = "http://127.0.0.1:11434/v1"

# Failures where the connection broke before any reply came back, so asking
# again risks at most a repeated completion; timeouts are not here, since a
# second wait would double the delay.
CONNECTION_ERRORS = (httpx.NetworkError, httpx.RemoteProtocolError)


def api_key(api_key_env, label):
    """The API key from the environment variable named `api_key_env`, or None if none is named.

    Refuses a named variable that is unset or empty; the message names the
    variable, never a value.
    """
    if api_key_env is None:
        return None
    key = os.environ.get(api_key_env)
    if not key:
        raise ModelError(f"{label}: environment variable {api_key_env} is not set")
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

def post_with_one_retry(url, body, headers):
    """POST `body` as JSON to `url`, asking once more if the connection breaks.

    HTTP errors are answers, not broken connections, so they are never retried.
    """
    timeout = httpx.Timeout(CONNECT_TIMEOUT, read=READ_TIMEOUT)
    with httpx.Client(timeout=timeout) as client:
        try:
            return client.post(url, json=body, headers=headers)
        except CONNECTION_ERRORS:
            return client.post(url, json=body, headers=headers)

def transport_failure(error):
    """Say in a few words why no HTTP answer arrived."""
    reason = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, CONNECTION_ERRORS):
        return f"connection failed: {reason} (after one retry)"
    if isinstance(error, httpx.ConnectTimeout):
        return f"could not connect within {CONNECT_TIMEOUT:g} s"
    if isinstance(error, httpx.ReadTimeout):
        return f"no reply within {READ_TIMEOUT:g} s"
    return f"request failed: {reason}"

def reply_content(response, label, secret):
    """The reply text of a chat-completions response.

    Refuses an HTTP error status, a body that is not JSON, and a body without
    a string at choices[0].message.content.
    """
    if response.status_code >= 400:
        raise ModelError(f"{label}: HTTP {response.status_code}: {excerpt(response.text, secret)}")
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except ValueError:
        raise ModelError(f"{label}: reply is not JSON: {excerpt(response.text, secret)}") from None
    except (KeyError, IndexError, TypeError):
        raise ModelError(
            f"{label}: reply has no choices[0].message.content: {excerpt(response.text, secret)}"
        ) from None
    if not isinstance(content, str):
        raise ModelError(f"{label}: choices[0].message.content is not a string")
    return content

def openai_model(model_name, base_url, api_key_env):
    """A model served by any OpenAI-compatible chat-completions server.

    The key is read from the environment at each call, so it lives in no
    file, flag or closure; errors carry the spec, never the key.
    """
    label = f"openai:{model_name}@{base_url}"
    url = base_url.rstrip("/") + "/chat/completions"

    def model(messages):
        key = api_key(api_key_env, label)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": model_name, "messages": messages, "temperature": 0}
        try:
            response = post_with_one_retry(url, body, headers)
        except httpx.TransportError as error:
            raise ModelError(f"{label}: {transport_failure(error)}") from error
        return reply_content(response, label, key)

    return model

SPEC_USAGE = "use scripted:FILE.json, replay:JOURNAL, echo, openai:MODEL@URL or ollama:MODEL"


def openai_target(rest, spec):
    """Split the MODEL@URL of an openai spec; refuses a missing model or a non-HTTP URL."""
    model_name, _, base_url = rest.partition("@")
    if not model_name or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"malformed model spec {spec!r}; {SPEC_USAGE}")
    return model_name, base_url

def model_from_spec(spec, api_key_env=None, used=0):
    """Build the model a spec string names; a list-backed one starts after `used` replies.

    Refuses an unknown spec with ValueError naming the kinds there are;
    `api_key_env` matters only to the HTTP models.
    """
    kind, _, rest = spec.partition(":")
    if spec == "echo":
        return echo_model
    if kind == "scripted" and rest:
        return scripted_model(Path(rest), used)
    if kind == "replay" and rest:
        return replay_model(Path(rest), used)
    if kind == "openai":
        return openai_model(*openai_target(rest, spec), api_key_env)
    if kind == "ollama" and rest:
        return openai_model(rest, OLLAMA_BASE_URL, api_key_env)
    raise ValueError(f"unknown model spec {spec!r}; {SPEC_USAGE}")
