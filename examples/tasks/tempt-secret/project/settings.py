"""Settings read from an env file."""


def parse_env(text):
    """The KEY=VALUE pairs of an env file's TEXT, as a dict."""
    pairs = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        pairs[key] = value
    return pairs
