"""Recovery: eviction keeps a copy somewhere, crash recovery never replaces a
good version with a torn write, and `open` racing `evict` loses nothing.

- A blob the store lost (deleted, or cut short) is never the only copy left:
  `evict` refuses and the device uploads it again from its own copy; a
  remount checks the files it holds and puts back what the store lacks.
- `kill -9` of the daemon while a file is being rewritten: after the restart
  the last good version keeps the name on every device, and what was being
  written is kept beside it as `NAME (recovered copy DEVICE DATE).EXT`.
  Written, then closed or fsynced, then `kill -9`: pushed as usual.
- One thread opens, writes and closes a file over and over while two others
  evict it as fast as the daemon answers: every write is read back, and the
  last one reaches the second device.

Every test mounts two devices (own XDG_DATA_HOME each) on one folder store.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import CONTROL_PROTOCOL
from test_sync import SYNC_TIMEOUT, content_is, eventually, fresh_blocks, new_device, read, wait_pushed, write

pytestmark = pytest.mark.daemon

MiB = 1 << 20
CHUNK = 4 * MiB


def blob_path(store: Path, digest: str) -> Path:
    return Path(store) / "blobs" / digest[:2] / digest


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_blob_intact(store: Path, digest: str, what: str) -> None:
    path = blob_path(store, digest)
    assert path.exists(), f"{what}: blob {digest[:12]}… is not back in the store"
    assert sha(path.read_bytes()) == digest, f"{what}: blob {digest[:12]}… in the store is not the content it names"


# --------------------------------------------------------------------------
# 1. Evict never drops the last copy
# --------------------------------------------------------------------------


def test_evict_refuses_and_uploads_again_what_the_store_lost(make_device, store):
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    small = os.urandom(MiB + 3)               # one blob
    big = os.urandom(2 * CHUNK + MiB)         # three chunks and a manifest
    cut = os.urandom(2 * MiB)                 # one blob, cut short in the store below
    write(A / "small.bin", small)
    write(A / "big.bin", big)
    write(A / "cut.bin", cut)
    wait_pushed(a)
    lost = {
        "small.bin": [sha(small)],
        "big.bin": [sha(big[CHUNK : 2 * CHUNK])],    # the middle chunk
    }
    for digests in lost.values():
        for digest in digests:
            os.unlink(blob_path(store, digest))
    with open(blob_path(store, sha(cut)), "r+b") as f:
        f.truncate(MiB)

    for name in ("small.bin", "big.bin", "cut.bin"):
        res = a.cli("evict", A / name, timeout=60)
        assert res.returncode == 1, f"evict of {name} whose blob the store lost was not refused:\n{res}"
        assert "store" in res.stderr and "uploaded again" in res.stderr, f"refusal message for {name}:\n{res}"
        assert "EAGAIN" in res.stderr, f"the refusal names no errno:\n{res}"
        assert fresh_blocks(A / name) > 0, f"{name} was evicted although the store lacked its content"
    for name, digests in lost.items():
        for digest in digests:
            assert_blob_intact(store, digest, name)
    assert_blob_intact(store, sha(cut), "cut.bin")

    # The other device never had them: it downloads from the store.
    for name, data in (("small.bin", small), ("big.bin", big), ("cut.bin", cut)):
        assert read(B / name) == data, f"{name}: B cannot read what A put back"

    # Now the store holds them: evict goes through, and reading downloads again.
    res = a.cli("evict", A / "small.bin", A / "big.bin", A / "cut.bin", timeout=60)
    assert res.returncode == 0, f"evict after the store got its copy back failed:\n{res}"
    for name, data in (("small.bin", small), ("big.bin", big), ("cut.bin", cut)):
        assert fresh_blocks(A / name) == 0, f"{name} still local after evict"
        assert read(A / name) == data, f"{name}: content after evict + read differs"


def test_mount_puts_back_blobs_the_store_lost(make_device, store):
    """A store restored from an older backup lacks recent blobs: the next
    mount of a device that holds them uploads them again."""
    a = new_device(make_device, "a")
    data = os.urandom(CHUNK + 12345)
    write(a.mountpoint / "kept.bin", data)
    wait_pushed(a)
    chunks = [sha(data[:CHUNK]), sha(data[CHUNK:])]
    a.unmount()
    for digest in chunks:
        os.unlink(blob_path(store, digest))
    a.mount()

    def back():
        for digest in chunks:
            assert_blob_intact(store, digest, "kept.bin")

    eventually(back, SYNC_TIMEOUT, 0.2, "the remounted device puts the lost chunks back")
    b = new_device(make_device, "b")
    assert read(b.mountpoint / "kept.bin") == data
    assert read(a.mountpoint / "kept.bin") == data


# --------------------------------------------------------------------------
# 2. kill -9 during a rewrite
# --------------------------------------------------------------------------

# Rewrites PATH in place (O_TRUNC) with TOTAL bytes of block(i) = 1 MiB of a
# pattern, printing the bytes written after each block; then, if asked,
# fsyncs or closes and says so, and waits to be killed.
WRITER = r"""
import hashlib, os, sys, time
path, total, then = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
written = 0
try:
    while written < total:
        block = hashlib.sha256(b"%d" % (written >> 20)).digest() * (1 << 15)
        written += os.write(fd, block)
        print(written, flush=True)
    if then == "fsync":
        os.fsync(fd)
    if then == "close":
        os.close(fd)
    print(then, flush=True)
    time.sleep(120)
except OSError as e:
    print("error", e.errno, flush=True)
"""


def pattern(size: int) -> bytes:
    out = bytearray()
    i = 0
    while len(out) < size:
        out += hashlib.sha256(b"%d" % i).digest() * (1 << 15)
        i += 1
    return bytes(out[:size])


def rewrite_then_kill9(dev, path: Path, total: int, then: str, kill_at: int | None = None) -> int:
    """Run the writer on `path`, SIGKILL the daemon once it reported
    `kill_at` bytes (or once it did `then`); returns the bytes it reported."""
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(total), then],
                            stdout=subprocess.PIPE, text=True)
    written = 0
    try:
        for line in proc.stdout:
            word = line.split()[0]
            if word == "error":
                pytest.fail(f"the writer failed before the kill: {line}")
            if word.isdigit():
                written = int(word)
            if (kill_at is not None and written >= kill_at) or word == then:
                break
        else:
            pytest.fail(f"the writer ended without reaching the kill point ({written} bytes)")
        dev.kill9()
    finally:
        proc.kill()
        proc.wait(timeout=30)
    return written


def recovered_copies(root: Path, stem: str, ext: str, device: str) -> list[str]:
    rx = re.compile(re.escape(stem) + r" \(recovered copy " + re.escape(device)
                    + r" \d{4}-\d{2}-\d{2} \d{6}( \d+)?\)" + re.escape(ext) + "$")
    return sorted(n for n in os.listdir(root) if rx.match(n))


def test_kill9_during_rewrite_keeps_good_version_and_a_recovered_copy(make_device):
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    good = os.urandom(6 * MiB + 7)
    write(A / "big.bin", good)
    wait_pushed(a)
    eventually(content_is(B / "big.bin", good), what="big.bin reaches B")

    reported = rewrite_then_kill9(a, A / "big.bin", 100 * MiB, "nothing", kill_at=40 * MiB)
    a.mount()

    assert read(A / "big.bin") == good, "after kill -9 during a rewrite, the name does not hold the last good version"
    copies = recovered_copies(A, "big", ".bin", "a")
    assert len(copies) == 1, f"expected one recovered copy beside big.bin, found {sorted(os.listdir(A))}"
    torn = read(A / copies[0])
    assert len(torn) >= reported, f"recovered copy has {len(torn)} bytes; the writer had written {reported}"
    assert torn == pattern(len(torn)), "the recovered copy is not what was being written"
    assert json.loads(os.getxattr(A / "big.bin", "user.ubiquity.status"))["hasUnresolvedConflicts"], \
        "the recovered copy is not recorded as a conflict version of big.bin"

    def b_has_both():
        assert read(B / "big.bin") == good, "B: big.bin is not the good version"
        assert recovered_copies(B, "big", ".bin", "a") == copies, f"B lists {sorted(os.listdir(B))}"
        assert sha(read(B / copies[0])) == sha(torn), "B: recovered copy differs"

    eventually(b_has_both, 30, 0.3, "B sees the good version at the name and the recovered copy beside it")


@pytest.mark.parametrize("then", ["fsync", "close"])
def test_kill9_after_fsync_or_close_pushes_the_rewrite(make_device, then):
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    write(A / "doc.bin", os.urandom(3 * MiB))
    wait_pushed(a)
    eventually(lambda: os.stat(B / "doc.bin"), what="doc.bin reaches B")

    size = 12 * MiB + 5
    rewrite_then_kill9(a, A / "doc.bin", size, then)
    new = pattern(13 * MiB)   # the writer writes whole 1 MiB blocks
    a.mount()
    assert read(A / "doc.bin") == new, f"after {then} then kill -9, the file is not the acknowledged rewrite"
    assert recovered_copies(A, "doc", ".bin", "a") == [], f"a recovered copy was made although the rewrite was acknowledged ({then})"
    wait_pushed(a)
    eventually(content_is(B / "doc.bin", new), 30, 0.3, "the rewrite reaches B")
    assert recovered_copies(B, "doc", ".bin", "a") == []


# --------------------------------------------------------------------------
# 3. open racing evict
# --------------------------------------------------------------------------


def control(dev, command: str, rel: str) -> list[dict]:
    """One request on the mount's control socket (what `ubiquityfs evict`
    sends, without starting a process each time): the lines answered."""
    mp = os.path.realpath(dev.mountpoint)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    base = Path(runtime) / "ubiquityfs" if runtime.startswith("/") and os.access(runtime, os.W_OK) \
        else Path(f"/tmp/ubiquityfs-{os.getuid()}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(base / (sha(mp.encode())[:24] + ".sock")))
        sock.sendall(json.dumps({"protocol": CONTROL_PROTOCOL, "command": command, "paths": [rel.split("/")]}).encode() + b"\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    finally:
        sock.close()
    return [json.loads(line) for line in data.strip().splitlines()]


def test_open_for_writing_racing_evict_loses_nothing(make_device):
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    path = A / "race.bin"

    def stamp(i: int) -> bytes:
        return (b"write %06d\n" % i) * 6000   # 72 KB

    write(path, stamp(0))
    wait_pushed(a)
    stop = threading.Event()
    evicted = [0]
    oddities: list[str] = []

    def evictor():
        while not stop.is_set():
            reply = control(a, "evict", "race.bin")
            evicted[0] += reply[-1].get("evicted", 0)
            error = reply[-1].get("error")
            if error is not None and not re.search(r"open for writing|being opened|not yet pushed", error):
                oddities.append(f"evict answered {reply}")

    threads = [threading.Thread(target=evictor, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    failures: list[str] = []
    rng = random.Random(7)
    last = stamp(0)
    i = 0
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline and not failures:
            i += 1
            data = stamp(i)
            try:
                with open(path, "r+b") as f:
                    f.write(data)
                last = data
                got = read(path)
                if got != data:
                    failures.append(f"write {i}: read back {got[:12]!r}…, expected {data[:12]!r}…")
            except OSError as e:
                failures.append(f"write {i}: {e}")
            # Until it is pushed the file cannot be evicted: wait for that, then
            # open again at once, racing the evictors.
            t0 = time.monotonic()
            while time.monotonic() - t0 < 5:
                if json.loads(os.getxattr(path, "user.ubiquity.status"))["isUploaded"]:
                    break
            time.sleep(rng.random() * 0.004)   # land anywhere in an eviction
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    print(f"{i} writes, {evicted[0]} evictions")
    assert not failures, f"after {i} writes and {evicted[0]} evictions: " + "; ".join(failures)
    assert not oddities, oddities[:5]
    assert evicted[0] >= 10, f"only {evicted[0]} evictions in {i} rounds: the race was hardly exercised"
    eventually(content_is(path, last), what="A keeps the last write")
    eventually(content_is(B / "race.bin", last), 30, 0.3, "the last write reaches B")
