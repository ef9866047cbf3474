"""The drive view on real mounts: `ubiquityfs mount MOUNTPOINT` shows this
device's own container at the root and a folder per container whose
Documents scope is public, by display name; it follows container changes
live; it never shows a Data scope; and one daemon serves it together with
other mounts of the same store on the same device."""

from __future__ import annotations

import errno
import json
import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from conftest import BIN, EXIT_TIMEOUT, S3StoreRef, folder_store_only, store_args, MOUNT_TIMEOUT, pid_alive, wait_pid_exit, wait_until

pytestmark = pytest.mark.daemon

NOTES = "com.example.notes"
LIVE = 10   # seconds within which the drive must follow a container change (it polls every second)


def container(store, *args):
    res = subprocess.run([str(BIN), "container", *args, *store_args(store)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res


def same_device(make_device, dev, name, container, scope):
    """A second mountpoint of `dev`'s device (same data home): served by its daemon."""
    other = make_device(name, data_home=dev.data_home, mount=False, container=container)
    other.mount_args = ("--scope", scope)
    other.mount()
    assert other.pid == dev.pid, "a second mount of one device and store must join its daemon"
    return other


def expect_errno(code, call, *args):
    with pytest.raises(OSError) as info:
        call(*args)
    assert info.value.errno == code, f"{call.__name__}{args}: {info.value!r}, expected {errno.errorcode[code]}"


def test_drive_shows_public_containers_by_display_name_and_never_a_data_scope(store, make_device):
    container(store, "create", NOTES, "--name", "Notes", "--public")
    container(store, "create", "com.example.game", "--name", "Game saves")             # private
    container(store, "create", "com.zzz.notes", "--name", "Notes", "--public")         # same display name
    # The app's own device puts files in both scopes of Notes.
    app = make_device("app", mount=False, container=NOTES)
    app.mount_args = ("--scope", "all")
    app.mount()
    os.makedirs(app.mountpoint / "Documents" / "ideas")
    (app.mountpoint / "Documents" / "todo.md").write_text("buy milk\n")
    (app.mountpoint / "Documents" / "ideas" / "x.txt").write_text("x\n")
    os.makedirs(app.mountpoint / "cache")
    (app.mountpoint / "cache" / "state.db").write_text("private to the app\n")
    app.unmount()

    drive = make_device("drive")
    root = drive.mountpoint
    assert sorted(os.listdir(root)) == ["Notes", "Notes (com.zzz.notes)"]
    assert sorted(os.listdir(root / "Notes")) == ["ideas", "todo.md"]
    assert (root / "Notes" / "todo.md").read_text() == "buy milk\n"
    assert os.listdir(root / "Notes (com.zzz.notes)") == []
    expect_errno(errno.ENOENT, os.stat, root / "Game saves")
    expect_errno(errno.ENOENT, os.stat, root / "Notes" / "Documents")
    expect_errno(errno.ENOENT, os.stat, root / "cache")
    found = [os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root) for f in dirs + files]
    assert not any("state.db" in p or p.startswith("cache") for p in found), found

    # The root is the home container: ordinary files work there.
    (root / "letter.txt").write_text("dear\n")
    # A container's folder behaves like a mount point.
    expect_errno(errno.EBUSY, os.rmdir, root / "Notes")
    expect_errno(errno.EBUSY, os.rename, root / "Notes", root / "Renamed")
    os.mkdir(root / "empty")
    expect_errno(errno.EBUSY, os.rename, root / "empty", root / "Notes")
    os.rmdir(root / "empty")
    expect_errno(errno.EEXIST, os.mkdir, root / "Notes")
    # Moves and links between containers are EXDEV; `mv` copies instead.
    expect_errno(errno.EXDEV, os.rename, root / "letter.txt", root / "Notes" / "letter.txt")
    expect_errno(errno.EXDEV, os.link, root / "letter.txt", root / "Notes" / "letter.txt")
    subprocess.run(["mv", str(root / "letter.txt"), str(root / "Notes" / "letter.txt")], check=True)
    assert not (root / "letter.txt").exists()
    assert (root / "Notes" / "letter.txt").read_text() == "dear\n"
    os.rename(root / "Notes" / "letter.txt", root / "Notes" / "ideas" / "letter.txt")   # within one container

    # What the drive wrote is in the container's Documents on another device.
    drive.unmount()
    docs = make_device("docs", mount=False, container=NOTES)
    docs.mount_args = ("--scope", "documents")
    docs.mount()
    assert (docs.mountpoint / "ideas" / "letter.txt").read_text() == "dear\n"
    assert sorted(os.listdir(docs.mountpoint)) == ["ideas", "todo.md"]


def test_drive_follows_container_changes_live(store, make_device):
    drive = make_device("drive")
    root = drive.mountpoint
    assert os.listdir(root) == []
    os.mkdir(root / "Photos")                      # the user's own folder, in the home container
    (root / "Photos" / "mine.jpg").write_bytes(b"jpeg")

    container(store, "create", NOTES, "--name", "Notes", "--public")
    assert wait_until(lambda: "Notes" in os.listdir(root), LIVE), os.listdir(root)
    (root / "Notes" / "a.md").write_text("a")

    # A container named like the user's folder: the user's folder keeps its name.
    container(store, "create", "com.example.photos", "--name", "Photos", "--public")
    assert wait_until(lambda: "Photos (com.example.photos)" in os.listdir(root), LIVE), os.listdir(root)
    assert os.listdir(root / "Photos") == ["mine.jpg"]
    assert os.listdir(root / "Photos (com.example.photos)") == []

    container(store, "set", NOTES, "--name", "Journal")
    assert wait_until(lambda: sorted(os.listdir(root)) == ["Journal", "Photos", "Photos (com.example.photos)"], LIVE), \
        os.listdir(root)
    assert (root / "Journal" / "a.md").read_text() == "a"
    expect_errno(errno.ENOENT, os.stat, root / "Notes")

    container(store, "set", NOTES, "--public", "false")
    assert wait_until(lambda: "Journal" not in os.listdir(root), LIVE), os.listdir(root)
    expect_errno(errno.ENOENT, os.stat, root / "Journal")
    # Nothing was lost: the container keeps its Documents.
    container(store, "set", NOTES, "--public", "true")
    assert wait_until(lambda: "Journal" in os.listdir(root), LIVE), os.listdir(root)
    assert (root / "Journal" / "a.md").read_text() == "a"


def test_drive_folders_enforce_folder_levels(store, make_device):
    container(store, "create", NOTES, "--name", "Flat", "--public", "--folder-levels", "none")
    container(store, "create", "com.example.one", "--name", "One", "--public", "--folder-levels", "one")
    drive = make_device("drive")
    root = drive.mountpoint
    (root / "Flat" / "note.txt").write_text("ok")
    expect_errno(errno.EPERM, os.mkdir, root / "Flat" / "sub")
    os.mkdir(root / "One" / "level1")
    expect_errno(errno.EPERM, os.mkdir, root / "One" / "level1" / "level2")
    os.makedirs(root / "deep" / "er")                 # the home container has no limit
    expect_errno(errno.EXDEV, os.rename, root / "deep", root / "One" / "deep")


def test_drive_and_data_scope_mounted_together_on_one_device(store, make_device):
    container(store, "create", NOTES, "--name", "Notes", "--public")
    drive = make_device("drive")
    data = same_device(make_device, drive, "data", NOTES, "data")
    (drive.mountpoint / "Notes" / "todo.md").write_text("todo\n")
    os.mkdir(data.mountpoint / "cache")
    (data.mountpoint / "cache" / "state.db").write_text("state\n")
    assert sorted(os.listdir(data.mountpoint)) == ["cache"]
    assert sorted(os.listdir(drive.mountpoint / "Notes")) == ["todo.md"]

    def query(*args):
        res = drive.cli("query", *args, "--json", timeout=60)
        assert res.returncode == 0, res
        return sorted(json.loads(line)["item"]["path"] for line in res.stdout.splitlines() if line.strip())

    # Through a mount, paths are absolute; with --container, from the container's root.
    assert query(str(drive.mountpoint)) == [f"{drive.mountpoint}/Notes/todo.md"]
    assert query("--container", NOTES, "--scope", "data") == ["/cache", "/cache/state.db"]
    bad = drive.cli("query", str(drive.mountpoint), "--scope", "data", timeout=60)
    assert bad.returncode != 0 and "--container" in bad.text, bad

    status = drive.cli("status", str(drive.mountpoint), "--json", timeout=60)
    assert status.returncode == 0, status
    report = json.loads(status.stdout)
    assert report["view"] == "drive"
    per = {c["id"]: c for c in report["containers"]}
    assert per[NOTES]["folder"] == "Notes" and per[NOTES]["documentsItems"] == 1 and per[NOTES]["dataItems"] == 2, per

    # A second device sees both scopes' changes.
    other = make_device("other", mount=False, container=NOTES)
    other.mount_args = ("--scope", "all")
    other.mount()
    assert wait_until(lambda: (other.mountpoint / "cache" / "state.db").exists(), LIVE)
    assert (other.mountpoint / "Documents" / "todo.md").read_text() == "todo\n"
    other.unmount()

    # Each mount unmounts on its own; the daemon ends with the last.
    data.unmount()
    assert pid_alive(drive.pid)
    assert (drive.mountpoint / "Notes" / "todo.md").read_text() == "todo\n"
    drive.unmount()

    # With no mount, the query reads this device's replica (read-only); --watch needs a mount.
    assert query("--container", NOTES, *store_args(store), "--scope", "data") == ["/cache", "/cache/state.db"]
    assert query("--container", NOTES, *store_args(store), "--scope", "documents") == ["/Documents/todo.md"]
    watch = drive.cli("query", "--container", NOTES, *store_args(store), "--watch", timeout=60)
    assert watch.returncode != 0 and "running mount" in watch.text, watch


def test_sigterm_and_kill9_end_every_mount_of_a_daemon(store, make_device):
    container(store, "create", NOTES, "--name", "Notes", "--public")
    drive = make_device("drive")
    data = same_device(make_device, drive, "data", NOTES, "data")
    (drive.mountpoint / "Notes" / "one.txt").write_text("1")
    (data.mountpoint / "db").write_text("d")
    os.kill(drive.pid, signal.SIGTERM)
    problems = drive.wait_gone(EXIT_TIMEOUT)
    assert not problems, problems
    assert wait_until(lambda: not data.is_mounted(), EXIT_TIMEOUT)
    data.pid = None

    drive.mount()
    data.mount()
    assert data.pid == drive.pid
    assert (drive.mountpoint / "Notes" / "one.txt").read_text() == "1"
    assert (data.mountpoint / "db").read_text() == "d"
    (drive.mountpoint / "Notes" / "two.txt").write_text("2")
    with open(data.mountpoint / "db", "a") as f:
        f.write("d2")
    drive.kill9()
    data.pid = None
    from conftest import lazy_unmount
    assert lazy_unmount(data.mountpoint)
    drive.mount()
    data.mount()
    assert (drive.mountpoint / "Notes" / "two.txt").read_text() == "2"
    assert (data.mountpoint / "db").read_text() == "dd2"


def test_watch_on_the_drive_follows_another_device(store, make_device):
    container(store, "create", NOTES, "--name", "Notes", "--public")
    drive = make_device("drive")
    writer = make_device("writer", mount=False, container=NOTES)
    writer.mount_args = ("--scope", "documents")
    writer.mount()
    watch = subprocess.Popen([str(BIN), "query", str(drive.mountpoint), "--watch", "--json", "--throttle", "0.2",
                              "--predicate", "name ENDSWITH '.md'"], env=drive.env(), stdout=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(json.loads(l)) for l in watch.stdout], daemon=True).start()

    def next_event():
        while True:
            event = lines.get(timeout=LIVE)
            if event["event"] != "heartbeat":
                return event

    try:
        assert next_event() == {"event": "gatheringFinished", "count": 0}
        start = time.monotonic()
        (writer.mountpoint / "remote.md").write_text("from the other device")
        added = next_event()
        latency = time.monotonic() - start
        assert added["event"] == "added" and added["item"]["path"] == f"{drive.mountpoint}/Notes/remote.md", added
        print(f"drive watch: added {latency:.2f}s after the remote write")
        os.unlink(writer.mountpoint / "remote.md")
        removed = next_event()
        assert removed["event"] == "removed" and removed["item"]["path"] == f"{drive.mountpoint}/Notes/remote.md", removed
    finally:
        watch.terminate()
        watch.wait(10)


def test_drive_offline_keeps_its_folders_and_queues_changes(store, make_device, tmp_path):
    """Started with the store unreachable, the drive shows the folders it knew
    (from the container list last seen) and queues what is written."""
    from test_sync import S3StoreLink, StoreLink, status_json
    container(store, "create", NOTES, "--name", "Notes", "--public")
    link = S3StoreLink(store) if isinstance(store, S3StoreRef) else StoreLink(tmp_path / "store-link", store)
    try:
        drive = make_device("drive", store=link.path)
        (drive.mountpoint / "Notes" / "before.txt").write_text("before")
        drive.unmount()

        link.cut()
        drive.mount()
        assert sorted(os.listdir(drive.mountpoint)) == ["Notes"]
        assert (drive.mountpoint / "Notes" / "before.txt").read_text() == "before"
        (drive.mountpoint / "Notes" / "offline.txt").write_text("queued")
        s = status_json(drive)
        assert s["storeReachable"] is False and s["pendingItems"] >= 1, s

        link.restore()
        assert wait_until(lambda: status_json(drive)["pendingItems"] == 0, 30), status_json(drive)
        other = make_device("other", mount=False, container=NOTES)
        other.mount_args = ("--scope", "documents")
        other.mount()
        assert (other.mountpoint / "offline.txt").read_text() == "queued"
    finally:
        link.restore()


@folder_store_only("damages container.json in place (StoreConformanceTests covers S3)")
def test_a_damaged_container_configuration_loses_nothing(store, make_device):
    """A container.json that no longer parses: `container list` names it and
    still lists the others; the drive keeps that container's folder as last
    seen and keeps following the other containers."""
    container(store, "create", NOTES, "--name", "Notes", "--public")
    container(store, "create", "com.example.other", "--name", "Other", "--public")
    drive = make_device("drive")
    (drive.mountpoint / "Notes" / "kept.txt").write_text("kept")
    assert sorted(os.listdir(drive.mountpoint)) == ["Notes", "Other"]

    config = store / "containers" / NOTES / "container.json"
    config.write_text('{"id": "com.example.notes", "displayName": ')   # torn
    listed = subprocess.run([str(BIN), "container", "list", *store_args(store)], capture_output=True, text=True)
    assert listed.returncode != 0 and NOTES in listed.stderr and "damaged" in listed.stderr, listed
    assert "com.example.other\tOther\tpublic" in listed.stdout, listed

    container(store, "set", "com.example.other", "--name", "Renamed")
    assert wait_until(lambda: sorted(os.listdir(drive.mountpoint)) == ["Notes", "Renamed"], LIVE), \
        os.listdir(drive.mountpoint)
    assert (drive.mountpoint / "Notes" / "kept.txt").read_text() == "kept"
    (drive.mountpoint / "Notes" / "still-writable.txt").write_text("yes")


def test_concurrent_mounts_of_one_device_share_one_daemon(store, make_device):
    """Three `mount` commands at once on one device and store: one daemon
    starts, the others join it; every mount works and unmounts on its own."""
    container(store, "create", NOTES, "--name", "Notes", "--public")
    first = make_device("drive", mount=False)
    devices = [first,
               make_device("data", data_home=first.data_home, mount=False, container=NOTES),
               make_device("docs", data_home=first.data_home, mount=False, container=NOTES)]
    devices[1].mount_args = ("--scope", "data")
    devices[2].mount_args = ("--scope", "documents")
    results = [None] * 3
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, devices[i].mount(check=False)))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(MOUNT_TIMEOUT)
    assert all(r is not None and r.returncode == 0 for r in results), results
    assert len({d.pid for d in devices}) == 1, [d.pid for d in devices]
    (devices[2].mountpoint / "from-docs.txt").write_text("d")
    assert (devices[0].mountpoint / "Notes" / "from-docs.txt").read_text() == "d"
    (devices[1].mountpoint / "db").write_text("x")
    assert os.listdir(devices[1].mountpoint) == ["db"]
    for dev in devices[1:]:
        res = dev.cli("unmount", str(dev.mountpoint), timeout=60)
        assert res.returncode == 0, res
        dev.pid = None
    assert pid_alive(first.pid)
    first.unmount()


def test_inode_numbers_in_container_folders_survive_a_remount(store, make_device):
    """git and rsync compare inode numbers: a container's items keep theirs
    across remounts, even when other containers appear in between."""
    container(store, "create", NOTES, "--name", "Notes", "--public")
    drive = make_device("drive")
    (drive.mountpoint / "Notes" / "a.txt").write_text("a")
    before = {p: os.stat(drive.mountpoint / p).st_ino for p in ["Notes", "Notes/a.txt", "."]}
    drive.unmount()
    container(store, "create", "com.aaa.first", "--name", "Aaa", "--public")   # opened first next time
    drive.mount()
    assert sorted(os.listdir(drive.mountpoint)) == ["Aaa", "Notes"]
    after = {p: os.stat(drive.mountpoint / p).st_ino for p in before}
    assert after == before
    assert os.stat(drive.mountpoint / "Aaa").st_ino not in before.values()
