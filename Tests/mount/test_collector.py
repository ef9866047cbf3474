"""The store's collector on real mounts (issue #39, item 4), on the folder
store and (UBQ_TEST_STORE=s3) on S3: `ubiquityfs gc` run as of a date past
the retention period removes the content of versions and deleted files
that period no longer covers — marked by one run, removed by the next —
while every current file still reads on a device that joins afterwards, and
restoring a collected version fails with a clear message. It also removes
the journal records older than the period, up to a snapshot: a device that
was offline, and one that was not mounted, rejoin from that snapshot with
their own work kept.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

from conftest import BIN, store_args
from test_history import history
from test_sync import (digests_equal, eventually, new_device, read, store_link, store_objects, until,  # noqa: F401 (a fixture)
                       wait_offline, wait_pushed, write)

MiB = 1 << 20
CONTAINER = "com.ubiquityfs.default"


def gc(store, *args):
    res = subprocess.run([str(BIN), "gc", *store_args(store), "--json", *args], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_gc_removes_what_the_retention_period_no_longer_covers(make_device, store):
    a = new_device(make_device, "a")
    A = a.mountpoint
    old, current = os.urandom(2 * MiB), os.urandom(2 * MiB)
    gone = os.urandom(MiB + 12345)
    write(A / "report.bin", old)
    write(A / "deleted.bin", gone)
    wait_pushed(a)
    write(A / "report.bin", current)
    os.unlink(A / "deleted.bin")
    wait_pushed(a)
    versions = until(lambda: history(a, A / "report.bin"), lambda h: len(h) == 2, "two versions")

    res = subprocess.run([str(BIN), "container", "set", CONTAINER, "--retention-days", "1", *store_args(store)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and "retention:      1 days" in res.stdout, res

    # Now: everything is within the period; nothing is marked for removal.
    now = gc(store, "--grace-hours", "0")
    assert now["removed"] == 0 and now["marked"] == 0, now
    # Three days on: the old version and the deleted file are marked, then removed.
    later = (datetime.now(timezone.utc) + timedelta(days=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    first = gc(store, "--grace-hours", "0", "--as-of", later)
    assert first["marked"] >= 2 and first["removed"] == 0, first
    second = gc(store, "--grace-hours", "0", "--as-of", later)
    assert second["removed"] >= 2 and second["removedBytes"] >= len(old) + len(gone), second
    assert second["blobs"] - second["removed"] >= 1, second

    # The current file reads on a device that joins now.
    b = new_device(make_device, "b")
    until(lambda: read(b.mountpoint / "report.bin"), lambda got: got == current, "b reads the current version")
    # The collected version cannot be restored, and says why.
    res = a.cli("restore", str(A / "report.bin"), "--version", str(versions[0]["id"]), timeout=60)
    assert res.returncode == 1 and "no longer holds the content" in res.stderr, res
    assert read(A / "report.bin") == current


def test_gc_refuses_bad_input(store, make_device):
    new_device(make_device, "a")
    res = subprocess.run([str(BIN), "gc", *store_args(store), "--as-of", "tomorrow"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 64 and "ISO 8601" in res.stderr, res
    res = subprocess.run([str(BIN), "container", "set", CONTAINER, "--retention-days", "0", *store_args(store)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "invalid retention of 0 days" in res.stderr, res


def test_a_device_away_past_the_retention_period_rejoins(make_device, store, store_link):
    """A writes a history long enough for snapshots while B is offline with
    edits of its own and C is not mounted; `gc` as of 40 days later removes
    the records up to the newest snapshot. B, back online, and C, mounted
    again, cannot read the records they missed: each rejoins from the
    snapshot, and all three end with one tree holding every device's work
    (B's edit of a file A edited too kept as a conflicted copy, B's edit of
    a file A deleted kept, A's deletions and renames applied)."""
    env = {"UBIQUITYFS_SNAPSHOT_INTERVAL": "4"}
    objects = store_objects(store)
    a = new_device(make_device, "a", env=env)
    b = new_device(make_device, "b", store=store_link.path)
    c = new_device(make_device, "c")
    A, B = a.mountpoint, b.mountpoint
    for name in ["both.txt", "gone.txt", "edited-on-b.txt", "renamed.txt"]:
        write(A / name, f"first {name}\n".encode())
    (A / "d").mkdir()
    write(A / "d" / "x.txt", b"deep\n")
    wait_pushed(a)
    eventually(digests_equal(a, b), what="b has a's tree")
    eventually(digests_equal(a, c), what="c has a's tree")
    c.unmount()
    store_link.cut()
    wait_offline(b)
    write(B / "both.txt", b"b's both\n")
    write(B / "edited-on-b.txt", b"b's edit\n")
    write(B / "new-on-b.txt", b"made on b\n")

    for i in range(8):
        write(A / f"made-{i}.txt", f"made {i}\n".encode())
        wait_pushed(a)
    write(A / "both.txt", b"a's both\n")
    os.unlink(A / "gone.txt")
    os.unlink(A / "edited-on-b.txt")
    os.rename(A / "renamed.txt", A / "d" / "moved.txt")
    os.unlink(A / "d" / "x.txt")
    wait_pushed(a)
    deletions = max(int(k.rsplit("/", 1)[1]) for k in objects["keys"]("journal"))
    for i in range(6):
        write(A / f"later-{i}.txt", f"later {i}\n".encode())
        wait_pushed(a)
    newest = until(lambda: objects["keys"]("snapshots"), lambda keys: keys and int(keys[-1].rsplit("/", 1)[1]) >= deletions,
                   "a snapshot past the deletions")
    base = int(newest[-1].rsplit("/", 1)[1])

    later = (datetime.now(timezone.utc) + timedelta(days=40)).strftime("%Y-%m-%dT%H:%M:%SZ")
    report = gc(store, "--grace-hours", "0", "--as-of", later)
    assert report["recordsRemoved"] >= base and report["snapshotsRemoved"] == len(newest) - 1, report
    journal = [int(k.rsplit("/", 1)[1]) for k in objects["keys"]("journal")]
    assert journal == [] or min(journal) == base + 1, (journal, base)

    store_link.restore()
    c.mount()
    eventually(digests_equal(a, b), 60, 0.5, "b rejoins and converges with a")
    eventually(digests_equal(a, c), 60, 0.5, "c rejoins and converges with a")
    names = sorted(os.listdir(A))
    assert read(A / "both.txt") == b"a's both\n"
    copies = [n for n in names if n.startswith("both (conflicted copy")]
    assert len(copies) == 1 and read(A / copies[0]) == b"b's both\n", names
    assert read(A / "edited-on-b.txt") == b"b's edit\n", "b's edit of a file deleted on a is kept"
    assert read(A / "new-on-b.txt") == b"made on b\n"
    assert "gone.txt" not in names and "renamed.txt" not in names, names
    assert read(A / "d" / "moved.txt") == b"first renamed.txt\n"
    assert os.listdir(A / "d") == ["moved.txt"]
    assert read(c.mountpoint / "made-7.txt") == b"made 7\n"
    for dev in (b, c):
        log = "\n".join(p.read_text(errors="replace") for p in Path(dev.data_home).rglob("daemon.log"))
        assert f"rejoined from the snapshot of record {base}" in log, log[-3000:]
