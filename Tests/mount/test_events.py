"""Events for remote changes on real mounts: what another device changes
reaches the programs on this device as the inotify (and GIO) events a local
program's change raises — `inotifywait` and `gio monitor` on device B see
A's creates, writes, attribute changes, renames, deletes and folders, on the
drive, on a container's Documents mount and on its Data-scope mount; an
editor watching a file is told before it writes; a conflicted copy appears
with IN_CREATE; a 10,000-file burst arrives with its events (or a look-again
event per folder). docs/SEMANTICS.md "Events" says what is promised.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, Background, store_args

pytestmark = pytest.mark.daemon

# Seconds within which B's watcher must see A's change (the bound: 2 s
# after B has the change; A's push and B's pull come first).
EVENT_TIMEOUT = 12
CONTAINER = "com.example.events"


def need(tool: str):
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed (Packaging/install-deps.sh test installs it)")


def has(watcher: Background, events: str, path: str, timeout=EVENT_TIMEOUT):
    """Wait for an inotifywait line (format '%e %w%f') with all of `events` for `path`."""
    wanted = set(events.split(","))

    def match(line):
        parts = line.split(" ", 1)
        return len(parts) == 2 and parts[1] == path and wanted <= set(parts[0].split(","))
    return watcher.wait_for(match, timeout, what=f"{events} for {path}")


def inotifywait(start, *paths, recursive=True) -> Background:
    need("inotifywait")
    argv = ["inotifywait", "-m", "--format", "%e %w%f"] + (["-r"] if recursive else []) + [str(p) for p in paths]
    return start(argv, ready="Watches established")


def wait_for_path(path: Path, timeout=20, gone=False):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() != gone:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} {'still there' if gone else 'not there'} after {timeout}s")


def two_drives(make_device):
    a = make_device("a")
    b = make_device("b")
    return a, b


def test_every_kind_of_remote_change_raises_its_inotify_event(make_device, background):
    a, b = two_drives(make_device)
    A, B = a.mountpoint, b.mountpoint
    for d in ("docs", "docs/old", "elsewhere", "elsewhere/folder"):
        (A / d).mkdir()
    for name in ("edit.txt", "attr.txt", "rename.txt", "move.txt", "delete.txt"):
        (A / "docs" / name).write_text(name)
    (A / "elsewhere" / "folder" / "inside.txt").write_text("inside")
    wait_for_path(B / "docs" / "delete.txt")
    wait_for_path(B / "elsewhere" / "folder" / "inside.txt")
    w = inotifywait(background, B / "docs")
    docs = f"{B}/docs/"

    (A / "docs" / "new.txt").write_text("new")
    has(w, "CREATE", docs + "new.txt")
    has(w, "CLOSE_WRITE,CLOSE", docs + "new.txt")
    with open(A / "docs" / "edit.txt", "a") as f:
        f.write(" more")
    has(w, "MODIFY", docs + "edit.txt")
    has(w, "CLOSE_WRITE,CLOSE", docs + "edit.txt")
    os.chmod(A / "docs" / "attr.txt", 0o600)
    has(w, "ATTRIB", docs + "attr.txt")
    os.rename(A / "docs" / "rename.txt", A / "docs" / "renamed.txt")
    has(w, "MOVED_FROM", docs + "rename.txt")
    has(w, "MOVED_TO", docs + "renamed.txt")
    os.rename(A / "docs" / "move.txt", A / "docs" / "old" / "moved.txt")
    has(w, "MOVED_FROM", docs + "move.txt")
    has(w, "MOVED_TO", docs + "old/moved.txt")
    os.unlink(A / "docs" / "delete.txt")
    has(w, "DELETE", docs + "delete.txt")
    (A / "docs" / "made").mkdir()
    has(w, "CREATE,ISDIR", docs + "made")
    (A / "docs" / "old").rename(A / "docs" / "older")   # a folder renamed
    has(w, "MOVED_FROM,ISDIR", docs + "old")
    has(w, "MOVED_TO,ISDIR", docs + "older")
    (A / "docs" / "made").rmdir()
    has(w, "DELETE,ISDIR", docs + "made")
    # A folder moved in from outside the watched tree arrives whole, as a move does here.
    (A / "elsewhere" / "folder").rename(A / "docs" / "folder")
    has(w, "MOVED_TO,ISDIR", docs + "folder")
    wait_for_path(B / "docs" / "folder" / "inside.txt")
    # The tree B's watcher was told about is the tree B has.
    assert sorted(os.listdir(B / "docs")) == ["attr.txt", "edit.txt", "folder", "new.txt", "older", "renamed.txt"]
    assert (B / "docs" / "edit.txt").read_text() == "edit.txt more"
    # Replayed changes are not pushed back: A's tree is unchanged by B.
    time.sleep(1.5)
    assert sorted(os.listdir(A / "docs")) == sorted(os.listdir(B / "docs"))
    assert not any("conflicted copy" in n for n in os.listdir(A / "docs"))


def test_events_never_download_placeholders(make_device, background):
    a, b = two_drives(make_device)
    (a.mountpoint / "big.bin").write_bytes(os.urandom(3 << 20))
    (a.mountpoint / "folder").mkdir()
    wait_for_path(b.mountpoint / "folder")
    w = inotifywait(background, b.mountpoint)
    (a.mountpoint / "folder" / "placeholder.bin").write_bytes(os.urandom(2 << 20))
    with open(a.mountpoint / "big.bin", "r+b") as f:
        f.write(b"changed")
    has(w, "CREATE", f"{b.mountpoint}/folder/placeholder.bin")
    has(w, "CLOSE_WRITE,CLOSE", f"{b.mountpoint}/big.bin")
    assert os.stat(b.mountpoint / "folder" / "placeholder.bin").st_size == 2 << 20
    status = subprocess.run(["getfattr", "-n", "user.ubiquity.status", "--only-values",
                             str(b.mountpoint / "folder" / "placeholder.bin")], capture_output=True, text=True)
    if status.returncode == 0:
        assert "placeholder" in status.stdout or "notDownloaded" in status.stdout or "cloud" in status.stdout, status.stdout


def test_gio_monitor_follows_remote_changes(make_device, background):
    need("gio")
    a, b = two_drives(make_device)
    (a.mountpoint / "docs").mkdir()
    (a.mountpoint / "docs" / "existing.txt").write_text("x")
    wait_for_path(b.mountpoint / "docs" / "existing.txt")
    w = background(["gio", "monitor", "-d", str(b.mountpoint / "docs")], settle=1.0)   # it prints nothing when ready
    docs = b.mountpoint / "docs"
    (a.mountpoint / "docs" / "created.txt").write_text("new")
    w.wait_for(lambda l: l.endswith(f"{docs}/created.txt: created"), what="created")
    with open(a.mountpoint / "docs" / "existing.txt", "a") as f:
        f.write("more")
    w.wait_for(lambda l: l.endswith(f"{docs}/existing.txt: changes done"), what="changes done")
    os.rename(a.mountpoint / "docs" / "created.txt", a.mountpoint / "docs" / "renamed.txt")
    w.wait_for(lambda l: f"{docs}/created.txt: renamed to {docs}/renamed.txt" in l, what="renamed")
    os.unlink(a.mountpoint / "docs" / "renamed.txt")
    w.wait_for(lambda l: l.endswith(f"{docs}/renamed.txt: deleted"), what="deleted")


def test_an_editor_watching_its_file_is_told_before_it_writes(make_device, background):
    a, b = two_drives(make_device)
    (a.mountpoint / "notes.txt").write_text("version 1\n")
    (a.mountpoint / "saved.txt").write_text("version 1\n")
    wait_for_path(b.mountpoint / "notes.txt")
    wait_for_path(b.mountpoint / "saved.txt")
    assert (b.mountpoint / "notes.txt").read_text() == "version 1\n"   # the editor opened it
    on_file = inotifywait(background, b.mountpoint / "notes.txt", recursive=False)   # a watch on the file itself
    on_folder = inotifywait(background, b.mountpoint, recursive=False)               # an editor that watches the folder
    # An edit in place on A: the watch on the file gets IN_MODIFY and IN_CLOSE_WRITE.
    with open(a.mountpoint / "notes.txt", "a") as f:
        f.write("version 2 from A\n")
    has(on_file, "MODIFY", f"{b.mountpoint}/notes.txt")
    has(on_file, "CLOSE_WRITE,CLOSE", f"{b.mountpoint}/notes.txt")
    # Told before it can save over A's edit: what it reads now is A's text.
    assert (b.mountpoint / "notes.txt").read_text() == "version 1\nversion 2 from A\n"
    # An atomic save on A (write a temporary file, rename it over): IN_MOVED_TO.
    (a.mountpoint / ".saved.txt.tmp").write_text("version 2 saved atomically\n")
    os.rename(a.mountpoint / ".saved.txt.tmp", a.mountpoint / "saved.txt")
    has(on_folder, "MOVED_TO", f"{b.mountpoint}/saved.txt")
    assert (b.mountpoint / "saved.txt").read_text() == "version 2 saved atomically\n"


def test_a_conflicted_copy_appears_with_in_create(make_device, background):
    a, b = two_drives(make_device)
    (a.mountpoint / "shared.txt").write_text("base\n")
    wait_for_path(b.mountpoint / "shared.txt")
    w = inotifywait(background, b.mountpoint)
    # B writes and keeps the file open (not pushed until closed); A's edit arrives meanwhile.
    with open(b.mountpoint / "shared.txt", "r+") as held:
        held.write("B's edit\n")
        held.flush()
        with open(a.mountpoint / "shared.txt", "a") as f:
            f.write("A's edit\n")
        w.wait_for(lambda l: l.startswith("CREATE ") and "conflicted copy" in l, what="CREATE of the conflicted copy")
        held.write("still writing\n")
    names = os.listdir(b.mountpoint)
    assert any("conflicted copy" in n for n in names), names


def test_container_and_data_scope_mounts_get_events(store, make_device, background):
    created = subprocess.run([str(BIN), "container", "create", CONTAINER, "--name", "Events", *store_args(store)],
                             capture_output=True, text=True)
    assert created.returncode == 0, created.stderr
    a = make_device("a", mount=False, container=CONTAINER)
    a.mount_args = ("--scope", "all", "--device-name", "a")
    a.mount()
    docs = make_device("docs", mount=False, container=CONTAINER)
    docs.mount_args = ("--scope", "documents", "--device-name", "b-docs")
    docs.mount()
    data = make_device("data", mount=False, container=CONTAINER)
    data.mount_args = ("--scope", "data", "--device-name", "b-data")
    data.mount()
    wait_for_path(a.mountpoint / "Documents")   # made by the Documents mount, with its well-known ID
    on_docs = inotifywait(background, docs.mountpoint)
    on_data = inotifywait(background, data.mountpoint)
    (a.mountpoint / "Documents" / "report.md").write_text("doc")
    (a.mountpoint / "app.db").write_text("data")
    has(on_docs, "CREATE", f"{docs.mountpoint}/report.md")
    has(on_data, "CREATE", f"{data.mountpoint}/app.db")
    os.rename(a.mountpoint / "Documents" / "report.md", a.mountpoint / "Documents" / "final.md")
    has(on_docs, "MOVED_TO", f"{docs.mountpoint}/final.md")
    os.unlink(a.mountpoint / "app.db")
    has(on_data, "DELETE", f"{data.mountpoint}/app.db")
    # The Documents folder is not in the Data scope: nothing about it there.
    assert "Documents" not in on_data.text()


def test_a_burst_of_10000_files_arrives_with_its_events(make_device, background):
    a, b = two_drives(make_device)
    (a.mountpoint / "burst").mkdir()
    wait_for_path(b.mountpoint / "burst")
    w = inotifywait(background, b.mountpoint / "burst")
    count = 10_000
    for i in range(count):
        (a.mountpoint / "burst" / f"f{i:05d}").write_bytes(b"x")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(os.listdir(b.mountpoint / "burst")) < count:
        time.sleep(0.5)
    assert len(os.listdir(b.mountpoint / "burst")) == count
    # Local programs are not stalled meanwhile: a stat answers at once.
    start = time.monotonic()
    os.stat(b.mountpoint / "burst" / "f00000")
    assert time.monotonic() - start < 1.0
    folder = f"{b.mountpoint}/burst/"

    def complete():
        lines = w.lines
        created = {l.split(" ", 1)[1] for l in lines if l.startswith("CREATE ")}
        overflow = any(l.startswith("ATTRIB,ISDIR ") for l in lines)
        return len(created) == count or overflow
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not complete():
        time.sleep(0.5)
    assert complete(), f"{sum(1 for l in w.lines if l.startswith('CREATE '))} CREATE events of {count}, no overflow"
    assert all(l.split(" ", 1)[1].startswith(folder) for l in w.lines if l.startswith("CREATE "))


def test_a_burst_beyond_the_queue_limit_tells_each_folder_to_look_again(make_device, background):
    """Above the queue's limit the per-item events are dropped and each folder
    gets one IN_ATTRIB on itself (here the limit is lowered to 50 steps)."""
    a = make_device("a")
    b = make_device("b", mount=False)
    b.mount_env = {"UBIQUITYFS_EVENT_QUEUE_LIMIT": "50"}
    b.mount()
    for folder in ("one", "two"):
        (a.mountpoint / folder).mkdir()
    wait_for_path(b.mountpoint / "two")
    w = inotifywait(background, b.mountpoint)
    os.kill(b.pid, signal.SIGSTOP)   # B pulls everything in one go when it resumes
    try:
        for i in range(200):
            (a.mountpoint / ("one" if i % 2 else "two") / f"f{i:03d}").write_bytes(b"x")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "Uploads:      0 items" not in a.cli("status", a.mountpoint, timeout=30).stdout:
            time.sleep(0.2)
    finally:
        os.kill(b.pid, signal.SIGCONT)
    for folder in ("one", "two"):
        has(w, "ATTRIB,ISDIR", f"{b.mountpoint}/{folder}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(os.listdir(b.mountpoint / "one")) + len(os.listdir(b.mountpoint / "two")) < 200:
        time.sleep(0.2)
    assert len(os.listdir(b.mountpoint / "one")) + len(os.listdir(b.mountpoint / "two")) == 200
    creates = [l for l in w.lines if l.startswith("CREATE ")]
    assert len(creates) < 200, "the queue did not overflow"


def test_container_folders_coming_and_going_in_the_drive_raise_events(store, make_device, background):
    drive = make_device("drive")
    root = drive.mountpoint
    w = inotifywait(background, root, recursive=False)

    def container(*args):
        res = subprocess.run([str(BIN), "container", *args, *store_args(store)], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr

    container("create", "com.example.notes", "--name", "Notes", "--public")
    has(w, "CREATE,ISDIR", f"{root}/Notes", timeout=30)
    container("set", "com.example.notes", "--name", "Journal")
    has(w, "MOVED_FROM,ISDIR", f"{root}/Notes", timeout=30)
    has(w, "MOVED_TO,ISDIR", f"{root}/Journal", timeout=30)
    container("set", "com.example.notes", "--public", "false")
    has(w, "DELETE,ISDIR", f"{root}/Journal", timeout=30)
    assert "Journal" not in os.listdir(root)
