"""The daemon's memory on a real mount: what a burst leaves resident.

libfuse gives each worker thread a receive buffer as large as the largest
request (about 1 MiB) and the kernel copies every WRITE's bytes into it; the
daemon gives those pages back once the worker's large writes are a second old
(`ReceiveBufferPages`). Measured from outside, in /proc/PID/smaps.
"""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from conftest import wait_until

pytestmark = pytest.mark.daemon

MiB = 1 << 20


def receive_buffers_resident_kib(pid: int) -> int:
    """Resident KiB of the daemon's anonymous mappings a little over 1 MiB
    long: libfuse's receive buffers (1 MiB of payload, a header, malloc's)."""
    total, size = 0, None
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(\S*)$", line)
            if m:
                start, end, name = int(m.group(1), 16), int(m.group(2), 16), m.group(3)
                size = (end - start) if name == "" else None
            elif line.startswith("Rss:") and size is not None and MiB <= size <= MiB + 64 * 1024:
                total += int(line.split()[1])
    return total


def test_large_writes_leave_no_receive_buffer_resident(device):
    pid = device.pid
    before = receive_buffers_resident_kib(pid)

    # Writers at once, so that several workers serve 1 MiB writes.
    def write(i: int) -> None:
        with open(device.mountpoint / f"big{i}", "wb", buffering=0) as f:
            for _ in range(32):
                f.write(os.urandom(MiB))

    writers = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    filled = receive_buffers_resident_kib(pid)
    assert filled >= before + 1000, f"no worker's buffer filled by the writes? {before} -> {filled} KiB"

    # A second later, small requests reach every worker (the kernel hands a
    # request to the worker that has waited longest), and each gives its pages back.
    time.sleep(1.2)

    def released() -> bool:
        for _ in range(100):
            os.close(os.open(device.mountpoint / "big0", os.O_RDONLY))
        return receive_buffers_resident_kib(pid) <= before + 256

    assert wait_until(released, 10, interval=0.2), (
        f"receive buffers still resident: {before} KiB before, {filled} after the writes, "
        f"{receive_buffers_resident_kib(pid)} after small requests")
    # What was written is still there.
    for i in range(4):
        assert os.path.getsize(device.mountpoint / f"big{i}") == 32 * MiB
