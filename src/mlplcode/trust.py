"""Trust: terminal-safe text, secrets kept from the model, and the sandbox RUN executes
in."""

import base64
import errno
import functools
import os
import platform
import re
import resource
import shutil
import socket
import stat
import struct
import sys
import unicodedata
import urllib.parse

INVISIBLE_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")
# Other_Default_Ignorable_Code_Point and Variation_Selector of Unicode's PropList.txt.
DEFAULT_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u2065\u3164"
    "\ufe00-\ufe0f\uffa0\ufff0-\ufff8\U000e0000-\U000e0fff]"
)


def is_invisible(char):
    """Whether CHAR would act on a terminal or hide itself instead of showing: controls,
    escapes, bidi overrides, zero-width and tag characters, fillers, variation
    selectors.
    """
    return char not in "\n\t" and (
        unicodedata.category(char) in INVISIBLE_CATEGORIES
        or DEFAULT_IGNORABLE.match(char) is not None
    )

def escape(char):
    """CHAR as a Python-style escape: \\x1b, \\u202e, \\U000e0041."""
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"

# Org link types that run code or a program when followed (Org 9.5, ol.el and its
# modules).
ACTING_LINK_TYPES = r"elisp|shell|eshell|man|file\+sys|docview"
ACTING_IN_EMACS = re.compile(
    rf"(?i)(?:(?<=\[\[)|(?<=<))(?:{ACTING_LINK_TYPES}):"
    rf"|(?<![a-z0-9])(?:{ACTING_LINK_TYPES}):(?=\S)|local variables:"
)

OUTSIDE_PRINTABLE_ASCII = re.compile(r"[^\t\n\x20-\x7e]")


def visible(text):
    """TEXT with every invisible character shown as its escape, and the colon of what
    Emacs would act on (an Org link that runs code, a Local Variables block) escaped
    too."""
    shown = OUTSIDE_PRINTABLE_ASCII.sub(
        lambda match: escape(match[0]) if is_invisible(match[0]) else match[0], text
    )
    return ACTING_IN_EMACS.sub(lambda match: match[0][:-1] + "\\x3a", shown)

def holds_invisible(text):
    """Whether TEXT holds a character that visible would show as an escape."""
    return any(map(is_invisible, OUTSIDE_PRINTABLE_ASCII.findall(text)))

def org_verbatim(text):
    """TEXT made visible, as Org fixed-width lines, which Org shows as they are: no
    markup, link, macro, keyword or code is read in them."""
    return "\n".join(f": {line}" if line else ":" for line in visible(text).split("\n"))

MARKDOWN_MARKUP = re.compile(r"[\\`*_~\[\]<>&#|$]")


def markdown_text(text):
    """TEXT made visible, as one line of Markdown that shows as it reads: each character
    that could open markup, HTML or LaTeX escaped, and a newline shown as \\n."""
    return MARKDOWN_MARKUP.sub(r"\\\g<0>", visible(text)).replace("\n", "\\n")

def markdown_block(text, language):
    """TEXT made visible, in a Markdown fence that nothing inside it can close."""
    text = visible(text)
    runs = [len(run) for run in re.findall("`+", text)]
    fence = "`" * max(3, 1 + max(runs, default=0))
    return f"{fence}{language}\n{text.rstrip(chr(10))}\n{fence}"

PRIVATE_KEY = re.compile(
    r"----[- ]?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}"
    r"|-----BEGIN OpenVPN Static key V1-----|PuTTY-User-Key-File-\d+:"
)
SECRET_SHAPES = tuple(
    re.compile(pattern, re.DOTALL)
    for pattern in (
        r"----[- ]?BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}.*?"
        r"(?:----[- ]?END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)? ?-{4,5}|\Z)",
        (
            r"-----BEGIN OpenVPN Static key V1-----.*?(?:-----END OpenVPN Static key"
            r" V1-----|\Z)"
        ),
        r"PuTTY-User-Key-File-\d+:.*?(?:Private-MAC: *[0-9a-fA-F]+|\Z)",
        r"(?:AKIA|ASIA|ABIA|ACCA)(?<=\b....)[0-9A-Z]{16}\b",
        r"gh[pousr]_(?<=\bgh._)[A-Za-z0-9]{30,}",
        r"github_pat_(?<=\bgithub_pat_)[A-Za-z0-9_]{30,}",
        r"glpat-(?<=\bglpat-)[A-Za-z0-9_-]{20,}",
        r"sk-(?<=\bsk-)[A-Za-z0-9_-]{20,}",
        r"sk_(?:live|test)_(?<=\bsk_...._)[A-Za-z0-9]{10,}",
        r"rk_(?:live|test)_(?<=\brk_...._)[A-Za-z0-9]{10,}",
        r"xox[abprs]-(?<=\bxox.-)[A-Za-z0-9-]{10,}",
        r"AIza(?<=\bAIza)[0-9A-Za-z_-]{35}",
        r"npm_(?<=\bnpm_)[A-Za-z0-9]{36}",
        r"pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}",
        r"hf_(?<=\bhf_)[A-Za-z0-9]{34,}",
        r"dckr_pat_(?<=\bdckr_pat_)[A-Za-z0-9_-]{20,}",
        r"eyJ(?<=\beyJ)[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}",
    )
)

ASSIGNED_SECRET = re.compile(
    r"(?i)\b(\w*(?:secret|token|passw(?:or)?d|api_?key)\w*)(\s*[:=]\s*[\"']?)"
    r"(?=[A-Za-z0-9+/=_.-]*\d)(?=[A-Za-z0-9+/=_.-]*[A-Za-z])([A-Za-z0-9+/=_.-]{16,})"
)
REDACTED = "[redacted]"

SHORTEST_ENCODED_SECRET = 8


def encoded_forms(value):
    """The forms VALUE takes when a program encodes it: hex, base64 (standard and
    URL-safe, at each of the three offsets it can have inside a longer text),
    percent-encoding."""
    data = value.encode("utf-8", "surrogateescape")
    if len(data) < SHORTEST_ENCODED_SECRET:
        return set()
    forms = {
        data.hex(),
        data.hex().upper(),
        urllib.parse.quote(data, safe=""),
        urllib.parse.quote_plus(data),
    }
    for offset in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(bytes(offset) + data).decode("ascii")
            forms.add(encoded[-(-8 * offset // 6) : 8 * (offset + len(data)) // 6])
    return forms - {value}


@functools.lru_cache(maxsize=4)
def secret_forms(values):
    """VALUES, a frozenset, with every encoded form of each: what redaction looks
    for."""
    return frozenset(
        form for value in values for form in (value, *encoded_forms(value))
    )

BASE64_LINES = re.compile(
    r"(?m)^(?:[A-Za-z0-9+/_-]{16,}={0,2}\r?\n)+[A-Za-z0-9+/_-]+={0,2}(?=\r?$)"
)


def unwrapped_if_secret(block, values):
    """A block of base64 lines, joined and redacted if it held a secret; as it was if
    not."""
    joined = re.sub(r"\r?\n", "", block)
    redacted = replace_values(joined, values)
    return redacted if redacted != joined else block

FEW_VALUES = 200
SHORTEST_LOOKED_FOR = 6


@functools.lru_cache(maxsize=4)
def values_by_start(values):
    """VALUES, a frozenset, filed by their first SHORTEST_LOOKED_FOR characters; and
    those shorter."""
    filed, short = {}, []
    for value in values:
        if len(value) < SHORTEST_LOOKED_FOR:
            short.append(value)
        else:
            filed.setdefault(value[:SHORTEST_LOOKED_FOR], []).append(value)
    return filed, short


def possible_values(text, values):
    """Those of VALUES that may occur in TEXT: all of few; of many, those whose start
    does."""
    if len(values) <= FEW_VALUES:
        return values
    filed, short = values_by_start(values)
    starts = {
        text[at : at + SHORTEST_LOOKED_FOR]
        for at in range(len(text) - SHORTEST_LOOKED_FOR + 1)
    }
    return short + [value for start in starts & filed.keys() for value in filed[start]]


def replace_values(text, values):
    """TEXT with each of VALUES that occurs in it replaced, longest first."""
    for value in sorted(possible_values(text, values), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text

def redact(text, values=()):
    """TEXT with known secret VALUES and anything shaped like a key or token
    replaced."""
    if values:
        text = BASE64_LINES.sub(
            lambda block: unwrapped_if_secret(block[0], values), text
        )
        text = replace_values(text, values)
    for shape in SECRET_SHAPES:
        text = shape.sub(REDACTED, text)
    return ASSIGNED_SECRET.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)

SECRET_VARIABLE_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
SECRET_VARIABLES = frozenset({"AWS_ACCESS_KEY_ID", "PGPASSWORD", "MYSQL_PWD"})
SHORTEST_SECRET = 6


def is_secret_variable(name):
    """Say whether an environment variable's name marks it as a secret, ignoring
    case."""
    upper = name.upper()
    return (
        upper in SECRET_VARIABLES
        or upper.endswith(SECRET_VARIABLE_SUFFIXES)
        or "API_KEY" in upper
    )


def environment_secrets():
    """The values of the agent's secret-named variables, long enough to be worth
    finding."""
    return {
        value
        for name, value in os.environ.items()
        if is_secret_variable(name) and len(value) >= SHORTEST_SECRET
    }

CHILD_VARIABLES = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
GIT_SAFETY = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",
    "GIT_NO_LAZY_FETCH": "1",
}

def inside(path, directory):
    """Whether PATH is DIRECTORY or lies under it; both must be real absolute paths."""
    return os.path.commonpath([path, directory]) == directory


def safe_path(root):
    """The agent's PATH without relative entries and entries inside ROOT, which the
    model could fill with a program named git."""
    real_root = os.path.realpath(root)
    entries = os.environ.get("PATH", os.defpath).split(os.pathsep)
    return os.pathsep.join(
        entry
        for entry in entries
        if os.path.isabs(entry) and not inside(os.path.realpath(entry), real_root)
    )


def child_environment(root, home):
    """The whole environment of a program RUN starts: an allow-list, a fresh HOME, git
    tamed."""
    kept = {name: os.environ[name] for name in CHILD_VARIABLES if name in os.environ}
    return {**kept, "PATH": safe_path(root), "HOME": home, "TMPDIR": home, **GIT_SAFETY}


def find_program(name, root):
    """The absolute path of program NAME on the safe PATH of ROOT, or None."""
    return shutil.which(name, path=safe_path(root))

def interpreter_directories():
    """The real directories of the Python that runs the tests: its prefixes."""
    return sorted(
        {
            os.path.realpath(path)
            for path in (
                sys.prefix,
                sys.base_prefix,
                sys.exec_prefix,
                sys.base_exec_prefix,
            )
        }
    )


def find_python(root):
    """sys.executable, unless it or one of its prefixes lies inside ROOT: then None."""
    real_root = os.path.realpath(root)
    candidates = [os.path.realpath(sys.executable), *interpreter_directories()]
    return (
        None if any(inside(path, real_root) for path in candidates) else sys.executable
    )

RUN_CPU_SECONDS = 120
RUN_FILE_BYTES = 64 * 1024 * 1024
RUN_MEMORY_BYTES = 4 * 1024 * 1024 * 1024


def limit_resources():
    """Set the child's rlimits, between fork and exec: CPU time, file size, address
    space."""
    for limit, value in (
        (resource.RLIMIT_CPU, RUN_CPU_SECONDS),
        (resource.RLIMIT_FSIZE, RUN_FILE_BYTES),
        (resource.RLIMIT_AS, RUN_MEMORY_BYTES),
    ):
        resource.setrlimit(limit, (value, value))

SANDBOX_TMP_BYTES = 256 * 1024 * 1024
SYSTEM_DIRECTORIES = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
)
# What /proc holds that acts on the whole machine (made read-only) or shows the kernel's
# memory, timers and keys (hidden): the lists container runtimes use.
PROC_READ_ONLY = (
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/fs",
    "/proc/irq",
    "/proc/bus",
)
PROC_HIDDEN = (
    "/proc/kcore",
    "/proc/keys",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/acpi",
    "/proc/scsi",
    "/proc/latency_stats",
)
ISOLATION = (
    "--unshare-all",
    "--unshare-user",
    "--disable-userns",
    "--uid",
    "65534",
    "--gid",
    "65534",
    "--cap-drop",
    "ALL",
    "--die-with-parent",
)

def private_files(directory):
    """What under DIRECTORY others may not read (a directory: read and enter), links
    aside."""
    found = []
    for parent, subdirectories, files in os.walk(directory):
        for name in subdirectories + files:
            path = os.path.join(parent, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            needed = 0o005 if stat.S_ISDIR(mode) else 0o004
            if not stat.S_ISLNK(mode) and mode & needed != needed:
                found.append(path)
        subdirectories[:] = [
            name for name in subdirectories if os.path.join(parent, name) not in found
        ]
    return found


def hide(path, empty):
    """The bubblewrap arguments that put an empty directory, or the EMPTY file, over
    PATH."""
    return ["--tmpfs", path] if os.path.isdir(path) else ["--ro-bind", empty, path]

def system_mounts(empty):
    """The machine's programs, libraries and settings, read-only, laid out as on the
    host, with what only its owner may read in /etc replaced by an empty file or
    directory."""
    command = []
    for path in SYSTEM_DIRECTORIES:
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    for path in private_files("/etc"):
        command += hide(path, empty)
    return command


def proc_mounts(empty):
    """A fresh /dev and /proc, with what in /proc acts on the machine read-only or
    hidden."""
    command = ["--dev", "/dev", "--proc", "/proc"]
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            command += ["--ro-bind", path, path]
    for path in PROC_HIDDEN:
        if os.path.exists(path):
            command += hide(path, empty)
    return command

def sandbox_argv(
    bwrap, argv, root, interpreter, protected, masked, empty, socket_filter
):
    """ARGV wrapped in bubblewrap: only system files, the INTERPRETER's directories and
    the root shown; no network, its own /tmp, PIDs and user, no capabilities.

    PROTECTED paths in the root are read-only; MASKED ones are replaced by an empty
    directory or the EMPTY file. SOCKET_FILTER is the descriptor of the seccomp
    program that refuses a Unix socket, or None where there is none.
    """
    command = [
        bwrap,
        *system_mounts(empty),
        *proc_mounts(empty),
        "--size",
        str(SANDBOX_TMP_BYTES),
        "--tmpfs",
        "/tmp",
    ]
    for path in interpreter:
        command += ["--ro-bind", path, path]
    command += ["--bind", root, root]
    for path in protected:
        command += ["--ro-bind", path, path]
    for path in masked:
        command += hide(path, empty)
    if socket_filter is not None:
        command += ["--seccomp", str(socket_filter)]
    return command + [*ISOLATION, "--chdir", root, "--", *argv]

def sandbox_banner(bwrap):
    """One line for the top of a run: whether RUN is sandboxed (BWRAP found), and what
    that means."""
    if bwrap:
        return (
            "sandboxed by bubblewrap (no network, nothing of the machine but its system"
            " files, no leftover process)"
        )
    return (
        "unsandboxed: bubblewrap (bwrap) not found; tests run with your user's files"
        " and network"
    )

# seccomp's verdicts, and where struct seccomp_data keeps what the filter reads.
SECCOMP_ALLOW, SECCOMP_ERRNO = 0x7FFF0000, 0x00050000
NUMBER, ARCHITECTURE, FIRST_ARGUMENT, SECOND_ARGUMENT = 0, 4, 16, 24
X32_CALLS, SOCKET_TYPE = 0x40000000, 0xF
# Per platform.machine(): the architecture, the numbers of socket, socketpair and
# io_uring_setup.
SOCKET_CALLS = {
    "x86_64": (0xC000003E, 41, 53, 425),
    "aarch64": (0xC00000B7, 198, 199, 425),
}
LOAD, AND, JUMP_IF_EQUAL, JUMP_IF_AT_LEAST, GIVE = 0x20, 0x54, 0x15, 0x35, 0x06


def socket_filter_program(machine):
    """The seccomp program, as bytes, that refuses a Unix socket, a pair of any type but
    a stream, io_uring and every call of another architecture on MACHINE; None where
    its call numbers are not known."""
    if machine not in SOCKET_CALLS:
        return None
    architecture, socket_call, socketpair_call, io_uring_setup = SOCKET_CALLS[machine]
    refused = SECCOMP_ERRNO | errno.ENOSYS
    program = [
        (LOAD, 0, 0, ARCHITECTURE),
        (JUMP_IF_EQUAL, 1, 0, architecture),
        (GIVE, 0, 0, refused),
        (LOAD, 0, 0, NUMBER),
        (JUMP_IF_AT_LEAST, 0, 1, X32_CALLS),
        (GIVE, 0, 0, refused),
        (JUMP_IF_EQUAL, 0, 1, io_uring_setup),
        (GIVE, 0, 0, refused),
        (JUMP_IF_EQUAL, 2, 0, socket_call),
        (JUMP_IF_EQUAL, 4, 0, socketpair_call),
        (GIVE, 0, 0, SECCOMP_ALLOW),
        # socket: refused for AF_UNIX
        (LOAD, 0, 0, FIRST_ARGUMENT),
        (JUMP_IF_EQUAL, 4, 0, socket.AF_UNIX),
        (GIVE, 0, 0, SECCOMP_ALLOW),
        # socketpair: allowed for a stream alone
        (LOAD, 0, 0, SECOND_ARGUMENT),
        (AND, 0, 0, SOCKET_TYPE),
        (JUMP_IF_EQUAL, 1, 0, socket.SOCK_STREAM),
        (GIVE, 0, 0, SECCOMP_ERRNO | errno.EAFNOSUPPORT),
        (GIVE, 0, 0, SECCOMP_ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)

def socket_filter_descriptor():
    """A descriptor from which bubblewrap reads this machine's socket filter, or None
    where there is none; the caller closes it."""
    program = socket_filter_program(platform.machine())
    if program is None:
        return None
    reading, writing = os.pipe()
    os.write(writing, program)
    os.close(writing)
    return reading
