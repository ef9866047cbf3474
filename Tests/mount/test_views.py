"""Containers and scopes on real mounts: `container create`, `mount --scope
documents|data|all`, folder levels enforced in Documents, the status
attributes, and `versions`/`resolve` after a real two-device conflict."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from conftest import BIN, store_args

pytestmark = pytest.mark.daemon

CONTAINER = "com.example.notes"


def container(store, *args):
    return subprocess.run([str(BIN), "container", *args, *store_args(store)],
                          capture_output=True, text=True)


def scoped(make_device, name, scope, **kw):
    dev = make_device(name, mount=False, container=CONTAINER, **kw)
    dev.mount_args = ("--scope", scope, "--device-name", name)
    dev.mount()
    return dev


def test_container_configuration_is_validated_and_kept_in_the_store(store):
    assert container(store, "create", CONTAINER, "--name", "Notes", "--public", "--folder-levels", "one").returncode == 0
    again = container(store, "create", CONTAINER)
    assert again.returncode != 0 and "already exists" in again.stderr
    bad = container(store, "create", "bad..id")
    assert bad.returncode != 0 and "invalid container ID" in bad.stderr
    assert container(store, "set", CONTAINER, "--folder-levels", "none").returncode == 0
    listed = container(store, "list").stdout
    assert listed.splitlines()[0] == "ID\tNAME\tDOCUMENTS\tFOLDER LEVELS", listed
    assert f"{CONTAINER}\tNotes\tpublic\tnone" in listed


def test_documents_scope_enforces_folder_levels_and_data_scope_hides_documents(store, make_device):
    assert container(store, "create", CONTAINER, "--name", "Notes", "--folder-levels", "one").returncode == 0
    docs = scoped(make_device, "docs", "documents")
    root = docs.mountpoint
    (root / "todo.md").write_text("doc")
    os.mkdir(root / "level1")
    with pytest.raises(PermissionError):
        os.mkdir(root / "level1" / "level2")
    os.mkdir(root / "other")
    with pytest.raises(PermissionError):
        os.rename(root / "other", root / "level1" / "other")
    docs.unmount()

    data = scoped(make_device, "data", "data")
    (data.mountpoint / "app.db").write_text("data")
    assert sorted(os.listdir(data.mountpoint)) == ["app.db"]
    with pytest.raises(FileNotFoundError):
        os.stat(data.mountpoint / "Documents")
    with pytest.raises(PermissionError):
        os.mkdir(data.mountpoint / "Documents")
    data.unmount()

    everything = scoped(make_device, "all", "all")
    found = sorted(os.path.relpath(os.path.join(d, f), everything.mountpoint)
                   for d, dirs, files in os.walk(everything.mountpoint) for f in dirs + files)
    assert found == ["Documents", "Documents/level1", "Documents/other", "Documents/todo.md", "app.db"]


def test_status_attributes_are_readable_but_never_listed(make_device):
    dev = make_device("a")
    path = dev.mountpoint / "f.txt"
    path.write_text("x")
    os.setxattr(path, "user.app", b"1")
    assert os.listxattr(path) == ["user.app"]
    status = os.getxattr(path, "user.ubiquity.status")
    assert b'"downloadingStatus":"current"' in status
    assert os.getxattr(path, "user.ubiquity.percent") == b"100"
    assert os.getxattr(path, "user.ubiquity.conflicts") == b"0"
    with pytest.raises(OSError) as e:
        os.setxattr(path, "user.ubiquity.status", b"x")
    assert e.value.errno == errno.EPERM


def test_query_over_a_mount_and_its_watch(make_device):
    import json
    import queue
    import threading
    import time

    dev = make_device("a")
    root = dev.mountpoint
    os.mkdir(root / "Documents")
    for name, size in [("a.md", 10), ("B.MD", 2000), ("c.txt", 3000), ("big.md", 5000)]:
        (root / "Documents" / name).write_bytes(b"x" * size)

    def query(*args):
        res = dev.cli("query", str(root), *args, timeout=30)
        assert res.returncode == 0, res
        return [json.loads(line)["item"] for line in res.stdout.splitlines() if line.strip()]

    found = query("--predicate", "name LIKE[c] '*.md' AND size > 1000", "--sort", "-size", "--json")
    assert [(i["name"], i["size"]) for i in found] == [("big.md", 5000), ("B.MD", 2000)]
    assert all(i["mimeType"] == "text/markdown" and i["contentType"] == "net.daringfireball.markdown" and i["downloadingStatus"] == "current" for i in found)
    assert [i["path"] for i in query("--scope", "documents", "--predicate", "kMDItemFSName BEGINSWITH 'c'", "--json")] \
        == [f"{root}/Documents/c.txt"]

    bad = dev.cli("query", str(root), "--predicate", "size > 'big'", timeout=30)
    assert bad.returncode != 0 and "column 8" in bad.text, bad

    watch = subprocess.Popen([str(BIN), "query", str(root), "--watch", "--json", "--throttle", "0.2",
                              "--predicate", "name ENDSWITH '.log'"], env=dev.env(), stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(json.loads(line)) for line in watch.stdout], daemon=True).start()

    def wait_for(event, **item):
        """The next event of kind `event` whose item has these values; other
        updates (an item's upload finishing) may come first."""
        seen = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                got = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if got["event"] == event and all(got.get("item", {}).get(k) == v for k, v in item.items()):
                return got
            assert got["event"] in ("changed", "heartbeat"), f"unexpected {got} while waiting for {event} {item}"
            seen.append(got)
        raise AssertionError(f"no {event} {item} within 20 s; got {seen}")

    try:
        first = lines.get(timeout=20)
        assert first["event"] == "gatheringFinished" and first["count"] == 0, first
        (root / "new.log").write_text("x")
        wait_for("added", name="new.log")
        os.unlink(root / "new.log")
        wait_for("removed", name="new.log")
        # Moving a folder changes the path of what is inside: seen as a change of each item.
        os.makedirs(root / "logs" / "old")
        (root / "logs" / "old" / "a.log").write_text("a")
        wait_for("added", path=f"{root}/logs/old/a.log")
        os.rename(root / "logs" / "old", root / "logs" / "new")
        wait_for("changed", path=f"{root}/logs/new/a.log")
        with open(root / "logs" / "new" / "a.log", "a") as f:
            f.write("more")
        wait_for("changed", path=f"{root}/logs/new/a.log", size=5)
    finally:
        watch.terminate()
        watch.wait(10)


def whole_and_data_mounts(store, make_device):
    """The container made, then mounted twice on one device: whole (`--scope
    all`) and its Data scope, sharing one daemon and replica."""
    made = container(store, "create", CONTAINER, "--name", "Notes")
    assert made.returncode == 0, made.stderr
    whole = scoped(make_device, "a", "all")
    data = make_device("a", mount=False, container=CONTAINER, data_home=whole.data_home)
    data.mount_args = ("--scope", "data")
    data.mount()
    return whole, data


def test_a_mount_that_ends_gives_back_its_kernels_references(store, make_device):
    """Two mounts of one container on one device (a Data mount and a whole
    mount): what the kernel of the one that ends still held is given back,
    so a file deleted afterwards through the other is dropped with its local
    copy — not kept until the container closes."""
    from test_sync import eventually, wait_pushed
    whole, data = whole_and_data_mounts(store, make_device)
    size = 123_457
    (whole.mountpoint / "kept.bin").write_bytes(os.urandom(size))
    wait_pushed(whole)
    # The data mount's kernel looks the file up; a program keeps that mount
    # busy, so `unmount --force` detaches it lazily: the kernel forgets
    # nothing before the session ends.
    assert os.stat(data.mountpoint / "kept.bin").st_size == size
    holder = subprocess.Popen(["sleep", "60"], cwd=data.mountpoint)
    try:
        data.unmount(force=True)
    finally:
        holder.kill()
        holder.wait()
    replicas = whole.data_home / "ubiquityfs" / "replicas"
    assert [p for p in replicas.rglob("*") if "cache" in p.parts and p.is_file() and p.stat().st_size == size], \
        "the check below cannot see local copies"
    (whole.mountpoint / "kept.bin").unlink()
    wait_pushed(whole)

    def local_copy_gone():
        copies = [p for p in replicas.rglob("*") if "cache" in p.parts and p.is_file() and p.stat().st_size == size]
        assert not copies, f"the deleted file's local copy is kept: {copies}"

    eventually(local_copy_gone, timeout=15, what="the deleted file's local copy removed")


def test_a_slow_container_open_does_not_hold_up_other_mounts(store, make_device):
    """A container whose catch-up pull is slow (every journal read takes 8 s
    here) opens without holding up a mount of a container that is open
    already: each container opens and closes under its own lock (before,
    the second mount waited for the whole slow open)."""
    import threading
    import time
    for container_id in (CONTAINER, "com.example.slow"):
        made = container(store, "create", container_id, "--name", container_id)
        assert made.returncode == 0, made.stderr
    first = make_device("a", mount=False, container=CONTAINER)
    first.mount_args = ("--scope", "all")
    first.mount_env = {"UBIQUITYFS_FAULTS": "journal-delay=8"}
    first.mount()
    slow = make_device("a", mount=False, container="com.example.slow", data_home=first.data_home)
    slow.mount_args = ("--scope", "all")
    opening = threading.Thread(target=slow.mount)
    opening.start()
    try:
        time.sleep(1)   # the slow container's catch-up pull is under way
        again = make_device("a", mount=False, container=CONTAINER, data_home=first.data_home)
        again.mount_args = ("--scope", "documents")
        start = time.monotonic()
        again.mount()
        took = time.monotonic() - start
        assert opening.is_alive(), "the slow container opened too fast for this test to mean anything"
        assert took < 4, f"mounting an open container waited {took:.1f}s for another container's open"
    finally:
        opening.join(60)
    assert slow.is_mounted()


def test_two_mounts_of_a_container_see_each_others_folder_changes_at_once(store, make_device):
    """Each mount's kernel keeps its folder listings between opens; a change
    through the other mount of the same container, on the same device,
    shows in the next listing all the same (no attribute timeout to wait)."""
    whole, data = whole_and_data_mounts(store, make_device)
    os.mkdir(data.mountpoint / "cache")
    for i in range(50):
        (data.mountpoint / "cache" / f"f{i}").write_text("x")
    seen = whole.mountpoint / "cache"
    expected = {f"f{i}" for i in range(50)}
    for _ in range(3):  # listed and listed again: from the kernel's cache from the second time on
        assert set(os.listdir(seen)) == expected
    (data.mountpoint / "cache" / "new").write_text("n")
    assert set(os.listdir(seen)) == expected | {"new"}, "a file created through the other mount"
    os.unlink(data.mountpoint / "cache" / "f0")
    os.rename(data.mountpoint / "cache" / "f1", data.mountpoint / "moved")
    assert set(os.listdir(seen)) == expected - {"f0", "f1"} | {"new"}, "removed and moved out through the other mount"
    assert "moved" in os.listdir(whole.mountpoint)
    # And the other way round.
    assert "fromwhole" not in os.listdir(data.mountpoint / "cache")
    (whole.mountpoint / "cache" / "fromwhole").write_text("w")
    assert "fromwhole" in os.listdir(data.mountpoint / "cache")
