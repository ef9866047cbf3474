"""Failures that used to be swallowed reach `ubiquityfs status` (issue #41, bug 9).

A push that cannot open a file's cache file said nothing and tried again
every round, for ever: now the file is a failing upload, and the error is
in the status's "Recent errors" (and the daemon's log).
"""

from __future__ import annotations

import os
import time

import pytest

from conftest import store_args, wait_until

pytestmark = pytest.mark.daemon


def test_a_push_that_cannot_open_the_cache_file_shows_in_status(make_device):
    dev = make_device("a")
    content = b"unique content %d\n" % time.time_ns()
    path = dev.mountpoint / "doc.txt"
    # Open for writing: nothing is pushed before the last writer closes.
    with open(path, "wb") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
        # The cache file goes from under the daemon (a disk error, an rm in the data home).
        cached = [os.path.join(root, name) for root, _, names in os.walk(dev.data_home)
                  for name in names if "/cache/" in os.path.join(root, name)
                  and os.path.getsize(os.path.join(root, name)) == len(content)
                  and open(os.path.join(root, name), "rb").read() == content]
        assert len(cached) == 1, f"the cache file is not found in {dev.data_home}: {cached}"
        os.unlink(cached[0])

    def status_names_it() -> bool:
        res = dev.cli("status", str(dev.mountpoint), timeout=30)
        return res.returncode == 0 and "doc.txt" in res.stdout and "cannot upload" in res.stdout

    assert wait_until(status_names_it, 20, 0.5), (
        "status does not say that doc.txt cannot be uploaded:\n" + dev.cli("status", str(dev.mountpoint), timeout=30).stdout)
    # Nothing left to push: teardown's unmount (which waits for the pushes) ends.
    os.unlink(path)


def test_an_unreadable_known_store_marker_is_an_error_not_none(make_device):
    """The marker that records which store this device used at an address
    (`known-stores/HASH`) stops an emptied store from being taken for a new
    one: one that cannot be read is an error, not "never used"."""
    dev = make_device("a")
    dev.unmount()
    known = dev.data_home / "ubiquityfs" / "known-stores"
    markers = list(known.iterdir())
    assert markers, f"no marker in {known}"
    for marker in markers:
        marker.unlink()
        marker.mkdir()   # unreadable as a file, whoever runs the test
    res = dev.cli("query", "--container", "com.ubiquityfs.default", *store_args(dev.store), timeout=30)
    assert res.returncode != 0, f"query went on without the marker:\n{res}"
    assert "records the store" in res.text, f"the error does not name the unreadable marker:\n{res}"

    # Mounting: refused with the marker named, the store left as it is.
    res = dev.mount(check=False)
    assert res.returncode != 0, f"mounted without being able to read the marker:\n{res}"
    assert "records the store" in res.text, f"the mount's error does not name the unreadable marker:\n{res}"


def test_a_drive_whose_folder_numbers_cannot_be_recorded_says_so_in_status(make_device, store):
    """The drive keeps its container folders' numbers in drive-slots.json;
    when that file cannot be written, every mount's status says so."""
    import subprocess
    from conftest import BIN
    dev = make_device("a")
    replicas = next((dev.data_home / "ubiquityfs" / "replicas").iterdir())
    slots = replicas / "drive-slots.json"
    if slots.exists():
        slots.unlink()
    slots.mkdir()   # cannot be replaced by a file
    made = subprocess.run([str(BIN), "container", "create", "com.example.shown", "--name", "Shown", "--public",
                           *store_args(store)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert wait_until(lambda: (dev.mountpoint / "Shown").is_dir(), 20), "the container's folder did not appear"

    def status_says_so() -> bool:
        res = dev.cli("status", str(dev.mountpoint), timeout=30)
        return res.returncode == 0 and "cannot record the drive's folder numbers" in res.stdout

    assert wait_until(status_says_so, 10), dev.cli("status", str(dev.mountpoint), timeout=30).stdout
