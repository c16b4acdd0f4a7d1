"""A Unix socket a host process listens on, reached from the sandbox: the sockets a case
cannot set up before the run (one made while the tests run), and the filter itself.

The cases of sockets present before the run, inside the project and out, are in
cases.py (sandbox-hides-host-sockets, sandbox-refuses-sockets-in-the-project) and in
test_hostile_repository.py (the sandbox run by an ordinary user).
"""
import os
import socket
import sys
import threading
import time

import pytest

from conftest import HANG, require_tool
from mlplcode import trust
from mlplcode.tools.project import open_project
from mlplcode.tools.run import run_process

# Waits for the host's socket to appear in the project, then tries every kind of Unix socket on it.
LATE_CLIENT = """import os, socket, time
open('ready', 'w').close()
deadline = time.monotonic() + {seconds}
while not os.path.exists('late.sock') and time.monotonic() < deadline:
    time.sleep(0.05)
print('SEEN' if os.path.exists('late.sock') else 'NOT SEEN')
for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM):
    try:
        client = socket.socket(socket.AF_UNIX, kind)
        client.connect('late.sock')
        print('CONNECTED', kind)
    except OSError as error:
        print('unreachable', kind, error.strerror)"""


def listen_when_ready(root, servers, stop):
    """The host process: bind late.sock in ROOT once the sandboxed program has started."""
    while not os.path.exists(os.path.join(root, "ready")) and not stop.is_set():
        time.sleep(0.02)
    server = socket.socket(socket.AF_UNIX)
    server.bind(os.path.join(root, "late.sock"))
    server.listen()
    server.setblocking(False)
    servers.append(server)


def test_a_socket_made_while_the_tests_run_is_unreachable(tmp_path):
    require_tool("bwrap", "the sandbox's socket filter")
    root = str(tmp_path / "project")
    os.mkdir(root)
    project = open_project(root)
    servers, stop = [], threading.Event()
    host = threading.Thread(target=listen_when_ready, args=(root, servers, stop))
    host.start()
    try:
        code = LATE_CLIENT.format(seconds=HANG)
        result = run_process([sys.executable, "-c", code], project, [], [], {})
    finally:
        stop.set()
        host.join()
    assert result is not None
    out = (result[1].head + result[1].tail).decode()
    assert "SEEN" in out and "NOT SEEN" not in out, out
    assert "CONNECTED" not in out and out.count("Address family not supported") == 3, out
    for server in servers:
        with pytest.raises(BlockingIOError):
            server.accept()
        server.close()


def test_the_filter_keeps_ordinary_sockets_and_pairs(tmp_path):
    require_tool("bwrap", "the sandbox's socket filter")
    root = str(tmp_path / "project")
    os.mkdir(root)
    code = ("import asyncio, socket\n"
            "asyncio.run(asyncio.sleep(0))\n"
            "first, second = socket.socketpair()\n"
            "first.sendall(b'x')\n"
            "server = socket.socket()\n"
            "server.bind(('127.0.0.1', 0))\n"
            "server.listen()\n"
            "socket.create_connection(server.getsockname()).close()\n"
            "print('ORDINARY', second.recv(1))")
    result = run_process([sys.executable, "-c", code], open_project(root), [], [], {})
    assert result is not None and result[0] == 0 and b"ORDINARY b'x'" in result[1].head, result


# A pair of datagram sockets may send to any address: the way round a refused socket().
PAIRED_SENDER = """import socket
for kind in (socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC):
    try:
        first, _ = socket.socketpair(socket.AF_UNIX, kind)
        first.sendto(b'forged', 'host.sock')
        print('SENT', kind)
    except OSError as error:
        print('refused', kind, error.strerror)
first, second = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
first.sendall(b'x')
print('STREAM PAIR', second.recv(1))"""


def test_a_pair_of_datagram_sockets_cannot_send_to_a_host_socket(tmp_path):
    require_tool("bwrap", "the sandbox's socket filter")
    root = tmp_path / "project"
    root.mkdir()
    host = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    here = os.getcwd()
    os.chdir(root)  # bound by its short name: a socket's path may hold only 107 bytes
    try:
        host.bind("host.sock")
    finally:
        os.chdir(here)
    host.setblocking(False)
    try:
        result = run_process([sys.executable, "-c", PAIRED_SENDER], open_project(str(root)), [], [], {})
        out = (result[1].head + result[1].tail).decode()
        assert "SENT" not in out and out.count("Address family not supported") == 3, out
        assert "STREAM PAIR b'x'" in out, out
        with pytest.raises(BlockingIOError):
            host.recv(100)
    finally:
        host.close()


def test_a_machine_whose_call_numbers_are_unknown_gets_no_filter():
    assert trust.socket_filter_program("riscv64") is None
    argv = trust.sandbox_argv("/usr/bin/bwrap", ["pytest"], "/p", [], [], [], "/empty", None)
    assert "--seccomp" not in argv
    for machine in trust.SOCKET_CALLS:
        assert len(trust.socket_filter_program(machine)) == 19 * 8
