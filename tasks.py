#!/usr/bin/env python3
"""The two set-up commands of the README, with nothing but python3.

    python3 tasks.py demo    replay the example run through the real agent loop
    python3 tasks.py test    run the test suite

Each creates .venv on first use and reinstalls the package into it only when
pyproject.toml has changed since the last install.
"""
import hashlib
import os
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(ROOT, ".venv")
BIN = os.path.join(VENV, "Scripts" if os.name == "nt" else "bin")
STAMP = os.path.join(VENV, ".installed-from")


def ensure_venv():
    """Create .venv and install mlplcode with its test, export, acp and eval extras, once per pyproject.toml."""
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        wanted = hashlib.sha256(f.read()).hexdigest()
    if not os.path.isdir(VENV):
        print("tasks: creating .venv (first run only)", flush=True)
        venv.create(VENV, with_pip=True)
    installed = open(STAMP).read() if os.path.exists(STAMP) else ""
    if installed != wanted:
        print("tasks: installing mlplcode with its test, export, acp and eval extras into .venv (first run, or pyproject.toml changed)", flush=True)
        # pip's own lines say what it fetches and installs: a first install takes minutes.
        subprocess.run([os.path.join(BIN, "python"), "-m", "pip", "install",
                        "--disable-pip-version-check", "-e", ROOT + "[test,export,acp,eval]"], check=True)
        with open(STAMP, "w") as f:
            f.write(wanted)


def main(argv):
    commands = {
        "demo": [os.path.join(BIN, "mlplcode"), "demo"],
        # A worker more than the cores (a worker waiting for a kernel or Emacs to start
        # leaves its core to the others: 3:54 against 4:26 with one a core, on 2 cores),
        # a file to a worker (so a file's shared fixtures are made once), counting the
        # tests as they pass.
        "test": [os.path.join(BIN, "python"), "-m", "pytest", "-n", str((os.cpu_count() or 1) + 1),
                 "--dist", "loadfile", "-o", "console_output_style=count"],
    }
    if len(argv) != 1 or argv[0] not in commands:
        print(f"usage: python3 tasks.py {{{'|'.join(commands)}}}", file=sys.stderr)
        return 2
    ensure_venv()
    return subprocess.run(commands[argv[0]], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
