"""FUSE passthrough: the kernel reads a large local file's cache file itself.

A read-only open of local content of 1 MiB or more is served by the kernel
from the cache file (Linux 6.9+, a daemon running as root). These tests check
that it happens (the kernel's fuse tracepoints count the READ requests that
reach this mount's connection) and that nothing a user relies on changes:
the bytes, a writer beside a reader, a newer version arriving from another
device while an old reader holds the file, a memory mapping, the push.
"""

from __future__ import annotations

import mmap
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import wait_until
from test_sync import MiB, content_is, eventually, new_device, read, wait_pushed, write

pytestmark = pytest.mark.daemon

TRACING = Path("/sys/kernel/tracing")
FUSE_READ = 15


@pytest.fixture(scope="module", autouse=True)
def tracefs():
    """Mount tracefs where a fresh machine has not (as root), for this module only."""
    mounted = False
    if os.geteuid() == 0 and not (TRACING / "events").exists():
        mounted = subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACING)], capture_output=True).returncode == 0
    yield
    if mounted:
        subprocess.run(["umount", str(TRACING)], check=False)


def need_passthrough():
    if os.geteuid() != 0:
        pytest.skip("passthrough needs a daemon running as root")
    if not (TRACING / "events/fuse/fuse_request_send/enable").exists():
        pytest.skip("no fuse tracepoints to count READ requests with (tracefs could not be mounted)")


def connection(dev) -> int:
    """The FUSE connection number of `dev`'s mount (its device's minor)."""
    return os.minor(os.stat(dev.mountpoint).st_dev)


def reads_reaching(dev, action) -> int:
    """Run `action`; how many READ requests the kernel sent to `dev`'s daemon meanwhile."""
    enable = TRACING / "events/fuse/fuse_request_send/enable"
    # Recording may have been left off by someone else's tracing: on for the action.
    recording = TRACING / "tracing_on"
    was_recording = recording.read_text().strip()
    (TRACING / "trace").write_text("")
    enable.write_text("1")
    recording.write_text("1")
    try:
        action()
    finally:
        enable.write_text("0")
        recording.write_text(was_recording)
    pattern = re.compile(rf"fuse_request_send: connection {connection(dev)} req \d+ opcode {FUSE_READ} ")
    return sum(1 for line in (TRACING / "trace").read_text().splitlines() if pattern.search(line))


def passing_through(dev, path, first: int = MiB, timeout: float = 10.0):
    """Open `path` for reading once the open passes through; the open file
    and its `first` bytes (all with -1), read with no READ reaching `dev`'s daemon.

    Two lags make the first open after another one's close() go through the
    daemon (DESIGN: what passthrough does not cover): the kernel sends that
    open's RELEASE after close() has returned, and the daemon counts the
    open until it arrives; a placeholder streamed to its end is installed
    as local content just after its last chunk was served. A later open
    must pass through.
    """
    deadline = time.monotonic() + timeout
    while True:
        f = open(path, "rb", buffering=0)
        head = {}
        reached = reads_reaching(dev, lambda: head.update(data=f.read(first)))
        if reached == 0:
            return f, head["data"]
        f.close()
        if time.monotonic() > deadline:
            raise AssertionError(f"no open of {path} passed through within {timeout:.0f}s ({reached} READs reached the daemon)")
        time.sleep(0.2)


def drop_caches():
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def two_devices_and_a_file(make_device, name: str, size: int):
    """Devices a and b on one store, and a file of `size` random bytes written on a."""
    need_passthrough()
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    path = a.mountpoint / name
    original = os.urandom(size)
    write(path, original)
    return a, b, path, original


def test_a_large_local_file_is_read_by_the_kernel_and_a_small_one_by_the_daemon(make_device):
    need_passthrough()
    a = new_device(make_device, "a")
    big = os.urandom(8 * MiB + 123)
    small = os.urandom(64 * 1024)
    write(a.mountpoint / "big.bin", big)
    write(a.mountpoint / "small.bin", small)
    drop_caches()
    got = {}
    reader, got["big"] = passing_through(a, a.mountpoint / "big.bin", first=-1)
    reader.close()
    assert got["big"] == big
    small_reads = reads_reaching(a, lambda: got.update(small=read(a.mountpoint / "small.bin")))
    assert got["small"] == small
    assert small_reads >= 1, "a small file is read through the daemon (the count works)"
    wait_pushed(a)


def test_a_writer_beside_a_passthrough_reader_is_seen_by_it_and_pushed(make_device):
    a, b, path, original = two_devices_and_a_file(make_device, "log.bin", 4 * MiB)
    drop_caches()
    reader, head = passing_through(a, path)
    with reader:
        assert head == original[:MiB]
        # A writer opened while the reader passes through: its writes go
        # through the daemon, into the file the reader reads.
        with open(path, "r+b", buffering=0) as writer:
            writer.write(b"EDITED")
            writer.seek(0, os.SEEK_END)
            writer.write(b"appended tail")
        assert os.pread(reader.fileno(), 6, 0) == b"EDITED"
        assert os.fstat(reader.fileno()).st_size == len(original) + 13
        assert os.pread(reader.fileno(), 13, len(original)) == b"appended tail"
    expected = b"EDITED" + original[6:] + b"appended tail"
    assert read(path) == expected
    wait_pushed(a)
    eventually(content_is(b.mountpoint / "log.bin", expected), 60, 0.5, "b reads the edited file")


def test_a_new_version_arriving_while_an_old_reader_holds_the_file(make_device):
    need_passthrough()
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    old = os.urandom(3 * MiB)
    new = os.urandom(5 * MiB)
    write(a.mountpoint / "doc.bin", old)
    wait_pushed(a)
    eventually(content_is(b.mountpoint / "doc.bin", old), 60, 0.5, "b has the first version")
    held, head = passing_through(b, b.mountpoint / "doc.bin")
    with held:
        assert head == old[:MiB]
        write(a.mountpoint / "doc.bin", new)
        wait_pushed(a)
        # A new open on b sees the new version at once, though the old
        # reader still holds the inode in passthrough with the old file.
        eventually(content_is(b.mountpoint / "doc.bin", new), 60, 0.5, "b reads the new version")
        assert os.pread(held.fileno(), MiB, MiB) == old[MiB:2 * MiB], "the held reader keeps the version it opened"
    # Once the old reader is gone, a fresh open passes through again, with the new content.
    drop_caches()
    again, data = passing_through(b, b.mountpoint / "doc.bin", first=-1)
    again.close()
    assert data == new


def test_a_memory_mapping_of_a_passthrough_file(make_device):
    need_passthrough()
    a = new_device(make_device, "a")
    data = os.urandom(6 * MiB)
    write(a.mountpoint / "mapped.bin", data)
    drop_caches()
    with open(a.mountpoint / "mapped.bin", "rb") as f:
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[:] == data
            assert m[5 * MiB:5 * MiB + 10] == data[5 * MiB:5 * MiB + 10]


def test_a_file_read_as_soon_as_it_is_written_is_pushed_whole(make_device):
    """The push of a file runs while a program reads it back by passthrough
    (the daemon never sees those reads); the other device gets every byte."""
    need_passthrough()
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    data = os.urandom(40 * MiB + 7)
    write(a.mountpoint / "fresh.bin", data)
    for _ in range(3):
        assert read(a.mountpoint / "fresh.bin") == data
    wait_pushed(a)
    assert wait_until(lambda: (b.mountpoint / "fresh.bin").exists(), 60)
    assert read(b.mountpoint / "fresh.bin") == data


def test_a_shared_writable_mapping_beside_a_passthrough_reader_is_pushed(make_device):
    """A writer opened while a reader passes through maps the cache file
    itself: its stores bypass the daemon's write path, and the open still
    counts as a change, so the new bytes are pushed at its release."""
    a, b, path, original = two_devices_and_a_file(make_device, "mapped-edit.bin", 2 * MiB)
    wait_pushed(a)
    drop_caches()
    reader, _ = passing_through(a, path)
    with reader:
        with open(path, "r+b") as writer:
            with mmap.mmap(writer.fileno(), 0) as m:
                m[MiB:MiB + 7] = b"MAPPED!"
                m.flush()
        assert os.pread(reader.fileno(), 7, MiB) == b"MAPPED!"
    expected = original[:MiB] + b"MAPPED!" + original[MiB + 7:]
    assert read(path) == expected
    wait_pushed(a)
    eventually(content_is(b.mountpoint / "mapped-edit.bin", expected), 60, 0.5, "b reads the mapped edit")
