"""Paths: which paths inside the root the tools may use, and the real path each one
names."""

import contextlib
import os
import re

import pathspec

from ..trust import holds_invisible, inside, visible
from . import PathRefused

SECRET_NAMES = (
    # Environment files, every naming: .env, .env.local, .envrc (direnv),
    # .env_production,
    # .envs/ (cookiecutter), prod.env, and wrangler's .dev.vars.
    ".env*",
    "*.env",
    ".dev.vars",
    # SSH: private keys of every algorithm, renamed or hardware-backed (_sk), PuTTY's,
    # a server's host keys, and the directory that holds them.
    "id_{rsa,dsa,ecdsa,ed25519,xmss}*",
    "*_{rsa,dsa,ecdsa,ed25519}",
    "*.ppk",
    "ssh_host_*",
    ".ssh",
    # Private keys and the containers that hold them: PEM, PKCS#8, PKCS#12, Java and
    # Android
    # key stores, KeePass and Apple keychains; GnuPG's home.
    "*.{pem,key,p8,pk8,pkcs8,p12,pfx,pkcs12,jks,keystore,bks,kdb,kdbx,keychain}",
    ".gnupg",
    # Cloud and registry credentials: AWS, Azure, gcloud and Firebase service accounts,
    # Google OAuth clients, Docker's old config, boto, s3cmd, Vault.
    ".aws",
    ".azure",
    "credentials",
    "*credentials*.{json,toml,xml,db,yaml,yml,csv,ini,txt}",
    "access_tokens.db",
    "*service?account*.json",
    "*adminsdk*.json",
    "client_secret*.json",
    ".dockercfg",
    ".boto",
    ".s3cfg",
    ".vault-token",
    # Package managers' and git's tokens: npm, Yarn, PyPI, pip, Composer, netrc, git's
    # store.
    ".npmrc",
    ".yarnrc*",
    ".pypirc",
    "pip.{conf,ini}",
    "auth.json",
    ".netrc",
    "_netrc",
    ".git-credentials",
    # Databases' password files.
    ".pgpass",
    ".my.cnf",
    ".mylogin.cnf",
    # Kubernetes and Terraform: kubeconfigs, variable files, state (which keeps every
    # secret
    # it was given, in plain text), and the CLI's token files.
    "kubeconfig*",
    "*.kubeconfig",
    "*.tfvars",
    "*.tfvars.json",
    "*.tfstate",
    "*.tfstate.*",
    ".terraformrc",
    "terraform.rc",
    "credentials.tfrc.json",
    # Web servers' password files, VPN profiles with their keys, Azure Functions' local
    # secrets.
    ".htpasswd",
    ".htdigest",
    "*.ovpn",
    "local.settings.json",
    # Files named for what they hold, in a data format (secrets.py is a module, not a
    # secret).
    "{secret,secrets,password,passwords}"
    ".{json,toml,xml,yaml,yml,ini,txt,csv,properties}",
)
SECRET_PATHS = (
    ".docker/config.json",
    ".kube/config",
    ".config/gcloud",
    "gh/hosts.yml",
    ".m2/settings*.xml",
    ".gradle/gradle.properties",
    ".bundle/config",
    ".cargo/credentials*",
)

def glob_pattern(glob: str) -> str:
    """The regular expression of a glob: * any run, ? any one character, {a,b}
    either."""
    parts = re.split(r"(\*|\?|\{[^{}]*\})", glob)
    return "".join(
        (
            ".*"
            if part == "*"
            else (
                "."
                if part == "?"
                else (
                    "(?:" + "|".join(map(re.escape, part[1:-1].split(","))) + ")"
                    if part.startswith("{")
                    else re.escape(part)
                )
            )
        )
        for part in parts
    )


def any_of(globs) -> re.Pattern:
    return re.compile("(?s:" + "|".join(map(glob_pattern, globs)) + r")\Z")


SECRET_NAME = any_of(SECRET_NAMES)
SECRET_PATH_PARTS = tuple(
    tuple(any_of([glob]) for glob in path.split("/")) for path in SECRET_PATHS
)
SECRET_PATH_END = any_of(path.split("/")[-1] for path in SECRET_PATHS)
# Every secret name and path as a ripgrep glob, for SEARCH's excluding globs.
SECRET_NAME_PATTERNS = SECRET_NAMES + tuple(f"**/{path}" for path in SECRET_PATHS)


def folded(name: str) -> str:
    """NAME as the file systems that ignore case and trailing dots and spaces see it."""
    return name.casefold().rstrip(" .")


def is_secret_name(name: str) -> bool:
    """Say whether a file or directory name looks like it holds keys or credentials.

    Case and trailing dots and spaces are ignored: .ENV and ".env." are as secret
    as .env, and some file systems agree.
    """
    return SECRET_NAME.match(folded(name)) is not None

def secret_at(parts: list[str], index: int) -> str | None:
    """The name, or trailing run of names, of PARTS[:INDEX + 1] that marks it secret, or
    None."""
    if is_secret_name(parts[index]):
        return parts[index]
    if not SECRET_PATH_END.match(folded(parts[index])):
        return None
    for globs in SECRET_PATH_PARTS:
        start = index + 1 - len(globs)
        if start >= 0 and all(
            glob.match(folded(part)) for glob, part in zip(globs, parts[start:])
        ):
            return "/".join(parts[start : index + 1])
    return None

def load_ignore_rules(root: str, name: str) -> pathspec.PathSpec:
    """Read the gitignore-style rules of a file at the root; no file means no rules.

    Refuses a file that is not UTF-8 or holds an invalid pattern rather than
    skipping it, since a dropped rule would show what the user meant to hide.
    """
    try:
        with open(os.path.join(root, name), encoding="utf-8") as rules:
            return pathspec.GitIgnoreSpec.from_lines(rules)
    except FileNotFoundError:
        return pathspec.GitIgnoreSpec.from_lines([])
    except ValueError as problem:  # UnicodeDecodeError is a ValueError too
        raise PathRefused(
            f"{name}: cannot be parsed ({problem}); fix or delete it"
        ) from None

def ignore_rules(project, name: str) -> pathspec.PathSpec:
    """The rules of the rules file NAME in PROJECT; refuses a file that could not be
    parsed."""
    if name in project.broken:
        raise PathRefused(project.broken[name])
    return project.ignore[name]

def denial_reason(relative: str, mlplcodeignore: pathspec.PathSpec) -> str | None:
    """Say why a path relative to the root is off limits, or None when it is not.

    Every component is checked, so a .git or secret directory hides all it holds.
    `relative` uses / and ends with / for a directory, as gitignore rules expect.
    """
    parts = relative.rstrip("/").split("/")
    for index, part in enumerate(parts):
        if part.casefold() == ".git":
            return (
                ".git is protected; use RUN git status or git diff to look at the"
                " repository"
            )
        secret = secret_at(parts, index)
        if secret:
            return (
                f"{secret} may hold secrets, so tools never touch it; work without it"
            )
    if mlplcodeignore.match_file(relative):
        return "excluded by .mlplcodeignore; work without it"
    return None

PATH_MAX_CHARS = 1024
DRIVE = re.compile(r"^[A-Za-z]:")


def spelling_problem(path: str) -> str | None:
    """Say what is wrong with how a path is written, before the file system is asked."""
    if not path or "\0" in path:
        return "not a usable path"
    if len(path) > PATH_MAX_CHARS:
        return f"longer than {PATH_MAX_CHARS} characters"
    if holds_invisible(path):
        return "holds control or invisible characters; write the path in plain text"
    if os.path.isabs(path) or DRIVE.match(path) or path.startswith("\\\\"):
        return "absolute paths are refused (drive and UNC forms too)"
    if "\\" in path:
        return "holds a backslash; separate directories with /"
    return None

def resolve_path(project, path: str) -> str:
    """Turn a path from the model into the real absolute path it names inside the root.

    Symlinks are resolved before any rule is applied, so a link can neither lead
    out of the root nor give a harmless name to a protected file. The path as
    written is judged too: a denial of either spelling wins. Refuses what
    spelling_problem finds, paths that leave the root, and paths that
    denial_reason denies.
    """
    problem = spelling_problem(path)
    if problem:
        raise PathRefused(
            f"{visible(path[:PATH_MAX_CHARS])!r}: {problem};"
            " give a path relative to the project root"
        )
    target = os.path.realpath(os.path.join(project.root, path))
    if os.path.commonpath([project.root, target]) != project.root:
        raise PathRefused(
            f"{path}: leaves the project root; use a path inside the project"
        )
    mlplcodeignore = ignore_rules(project, ".mlplcodeignore")
    written = os.path.normpath(path).replace(os.sep, "/")
    relative = os.path.relpath(target, project.root).replace(os.sep, "/")
    for spelling in (written, relative):
        reason = denial_reason(spelling, mlplcodeignore)
        if reason:
            raise PathRefused(f"{path}: {reason}")
    if target in project.secret_files:
        raise PathRefused(
            f"{path}: holds a private key, so tools never touch it; work without it"
        )
    return target

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_directory(path: str, make_below: str | None = None) -> int:
    """A descriptor of the directory at PATH, a real absolute path, reached one
    component at a time from / without following a symlink; missing directories below
    MAKE_BELOW (the root) are made on the way. Raises OSError when a component is a link
    or not a directory.
    """
    descriptor, reached = os.open("/", DIRECTORY_FLAGS), "/"
    try:
        for part in filter(None, path.split("/")):
            reached = os.path.join(reached, part)
            if make_below and reached != make_below and inside(reached, make_below):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=descriptor)
            following = os.open(part, DIRECTORY_FLAGS, dir_fd=descriptor)
            os.close(descriptor)
            descriptor = following
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor
