"""Control-socket clients that misbehave do not hold up the mount (issue #41, bug 5).

A `query --watch` client that stops reading fills its socket: the daemon's
send then blocks. It gives up after its send timeout (10 s): the client is
dropped (its connection ends, the daemon's thread is gone), and `unmount`
still completes, and the daemon exits.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from conftest import CONTROL_PROTOCOL, EXIT_TIMEOUT, is_mounted, wait_pid_exit
from test_safety import control_socket

pytestmark = pytest.mark.daemon


def request_threads(pid: int) -> int:
    """The daemon's threads serving a control request (named ubq-request)."""
    count = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "ubq-request":
                count += 1
        except OSError:
            pass
    return count


def test_a_watch_client_that_never_reads_does_not_hold_up_unmount(make_device):
    dev = make_device("a")
    mp = dev.mountpoint
    # Enough items that the first answer (one result line each) is far more
    # than a Unix socket holds.
    folder = mp / "many"
    folder.mkdir()
    for i in range(3000):
        (folder / f"file-{i:05d}-{'x' * 40}.txt").write_bytes(b"x")

    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        client.connect(control_socket(dev))
        request = {"protocol": CONTROL_PROTOCOL, "command": "query", "predicate": "TRUEPREDICATE",
                   "scopes": ["all"], "watch": True, "throttle": 0.05}
        client.sendall(json.dumps(request).encode() + b"\n")
        # More changes while the client reads nothing: more lines to send.
        for i in range(500):
            (folder / f"later-{i:05d}.txt").write_bytes(b"y")
        # The daemon has sent all the socket holds (the client's side is full).
        time.sleep(1)
        pending = client.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        assert len(pending) > 0, "the daemon sent nothing: the test does not block its send"

        # The daemon's send timeout is 10 s; a send that moved some bytes
        # may wait once more. Give it 25 s.
        deadline = time.monotonic() + 25
        while request_threads(dev.pid) > 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert request_threads(dev.pid) == 0, "a thread still sends to a client that read nothing for 25 s"
        # Dropped: what was sent is there to read, then the end (no more
        # results, gathering-finished marker or heartbeats).
        client.settimeout(8)
        try:
            while client.recv(1 << 20):
                pass
        except socket.timeout:
            pytest.fail("the connection of a client that read nothing for 25 s is still open")

        start = time.monotonic()
        res = dev.cli("unmount", str(mp), timeout=90)
        elapsed = time.monotonic() - start
        assert res.returncode == 0, f"unmount failed after {elapsed:.1f} s (rc {res.returncode}):\n{res}"
        assert elapsed < 40, f"unmount took {elapsed:.1f} s with a watch client that does not read"
        assert not is_mounted(mp), f"still mounted after unmount:\n{res}"
        assert wait_pid_exit(dev.pid, EXIT_TIMEOUT), f"daemon pid {dev.pid} still running after unmount"
        dev.pid = None
    finally:
        client.close()
