"""The store's collector on real mounts (issue #39, item 4), on the folder
store and (UBQ_TEST_STORE=s3) on S3: `ubiquityfs gc` run as of a date past
the retention period removes the content of versions and deleted files
that period no longer covers — marked by one run, removed by the next —
while every current file still reads on a device that joins afterwards, and
restoring a collected version fails with a clear message.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timedelta, timezone

from conftest import BIN, store_args
from test_history import history
from test_sync import eventually, new_device, read, until, wait_pushed, write

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
