"""UbiquityKit on real mounts: the seeds' samples (Examples/) built on the
library run against two devices of one store. A query on B reports A's
saves, edits and deletions as DidUpdate with the item in the added, changed
or removed items; the guide's AsyncStream query lists the Documents scope;
`FileManager.url(forUbiquityContainerIdentifier:)` mounts a container on
demand. docs/UBIQUITYKIT.md says what maps to what.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, store_args
from test_sync import eventually, store_link, until, wait_offline, wait_pushed  # noqa: F401 (store_link: a fixture)

pytestmark = pytest.mark.daemon

CONTAINER = "com.example.kit"
EXAMPLES = Path(BIN).parent


def example(name: str) -> Path:
    path = EXAMPLES / name
    if not path.exists():
        pytest.skip(f"{path} is not built (swift build builds the examples)")
    return path


def two_container_mounts(store, make_device, mount_env=None, b_store=None):
    res = subprocess.run([str(BIN), "container", "create", CONTAINER, "--name", "Kit", *store_args(store)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    devices = []
    for name in ("a", "b"):
        kw = {"store": b_store} if name == "b" and b_store is not None else {}
        dev = make_device(name, mount=False, container=CONTAINER, **kw)
        dev.mount_args = ("--scope", "all", "--device-name", name)
        dev.mount_env = mount_env
        dev.mount()
        devices.append(dev)
    a, b = devices
    deadline = time.monotonic() + 20
    while not (a.mountpoint / "Documents").is_dir() or not (b.mountpoint / "Documents").is_dir():
        assert time.monotonic() < deadline, "Documents did not appear on both devices"
        time.sleep(0.1)
    return a, b


def test_a_query_on_b_follows_saves_edits_and_deletions_on_a(store, make_device, background):
    a, b = two_container_mounts(store, make_device)
    (a.mountpoint / "Documents" / "first.txt").write_text("one")
    (a.mountpoint / "Documents" / "notes.md").write_text("not a text document")
    while not (b.mountpoint / "Documents" / "first.txt").exists():
        time.sleep(0.05)
    # The tutorial's query: text documents of the Documents scope.
    listing = background([example("ubiquitykit-document-list"), CONTAINER, "txt"], b.env())
    listing.wait_for(lambda l: l == "documents=[first.txt]", what="the gathered list")

    start = time.monotonic()
    (a.mountpoint / "Documents" / "second.txt").write_text("two")
    t, _ = listing.wait_for(lambda l: l == "update added=[second.txt] changed=[] removed=[]", after=start,
                            what="second.txt added")
    assert t - start < 2.0 + 1.0, f"the update came {t - start:.2f}s after A's save"
    start = time.monotonic()
    with open(a.mountpoint / "Documents" / "first.txt", "a") as f:
        f.write(" more")
    listing.wait_for(lambda l: l.startswith("update added=[] changed=[first.txt]"), after=start, what="first.txt changed")
    start = time.monotonic()
    os.rename(a.mountpoint / "Documents" / "second.txt", a.mountpoint / "Documents" / "renamed.txt")
    # A rename is a change of the same item (its name and path), not a removal and an addition.
    listing.wait_for(lambda l: l == "update added=[] changed=[renamed.txt] removed=[]", after=start, what="the rename")
    start = time.monotonic()
    os.unlink(a.mountpoint / "Documents" / "first.txt")
    listing.wait_for(lambda l: l == "update added=[] changed=[] removed=[first.txt]", after=start, what="first.txt removed")
    listing.wait_for(lambda l: l == "documents=[renamed.txt]", after=start, what="the list after the removal")
    assert not any("notes.md" in l for l in listing.lines), "the predicate let a .md file through"


def test_the_guides_async_stream_lists_the_documents_scope(store, make_device, background):
    a, b = two_container_mounts(store, make_device)
    (a.mountpoint / "Documents" / "hello.txt").write_text("hello world")
    (a.mountpoint / "Documents" / "folder").mkdir()
    (a.mountpoint / "data.db").write_text("the Data scope")
    while not (b.mountpoint / "Documents" / "folder").exists():
        time.sleep(0.05)
    query = background([example("ubiquitykit-item-query"), CONTAINER], b.env())
    query.wait_for(lambda l: l == "--- 2 items", what="the first list")
    query.wait_for(lambda l: l.startswith("hello.txt false 11"), what="hello.txt with its size")
    query.wait_for(lambda l: l.startswith("folder true"), what="the folder")
    (a.mountpoint / "Documents" / "new.txt").write_text("new")
    query.wait_for(lambda l: l == "--- 3 items", what="the list after A's save")
    assert not any("data.db" in l for l in query.lines), "a Data-scope item in a Documents-scope query"


def test_a_container_is_mounted_on_demand(tmp_path, background):
    """`url(forUbiquityContainerIdentifier:)` on a device with no mount of the
    container mounts it, on the device's default store, at
    $XDG_DATA_HOME/ubiquityfs/containers/ID."""
    data = tmp_path / "data"
    env = {**os.environ, "XDG_DATA_HOME": str(data), "UBIQUITYFS_BIN": str(BIN)}
    default_store = data / "ubiquityfs" / "store"
    default_store.mkdir(parents=True)
    res = subprocess.run([str(BIN), "container", "create", CONTAINER, "--store", str(default_store)],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    mountpoint = data / "ubiquityfs" / "containers" / CONTAINER
    query = background([example("ubiquitykit-item-query"), CONTAINER], env)
    try:
        query.wait_for(lambda l: l == "--- 0 items", timeout=30, what="the (empty) list of a new container")
        assert os.path.ismount(mountpoint), f"{mountpoint} is not mounted"
        (mountpoint / "Documents" / "made.txt").write_text("made here")
        query.wait_for(lambda l: l == "--- 1 items", what="the file made in the container mounted on demand")
    finally:
        query.stop()
        subprocess.run([str(BIN), "unmount", str(mountpoint)], env=env, capture_output=True, timeout=120)
    assert not os.path.ismount(mountpoint)


def test_the_books_monitor_watches_the_data_scope_and_stops(store, make_device, background):
    """Listing 18-1: monitoring the Data scope (the container outside Documents)
    reports Data files only; after stopMonitoring nothing more is reported."""
    a, b = two_container_mounts(store, make_device)
    monitor = background([example("ubiquitykit-folder-monitor"), CONTAINER, "data", "6"], b.env())
    time.sleep(2)   # gathering
    start = time.monotonic()
    (a.mountpoint / "state.json").write_text("{}")
    (a.mountpoint / "Documents" / "visible.txt").write_text("a document")
    _, line = monitor.wait_for(lambda l: l.startswith("names=[") and "state.json" in l, after=start,
                               what="the Data file in the names")
    assert "visible.txt" not in line and "Documents" not in line, line
    monitor.wait_for(lambda l: l == "stopped", timeout=15, what="the monitor stopping")
    stopped = time.monotonic()
    (a.mountpoint / "later.json").write_text("{}")
    time.sleep(3)
    assert not any(t > stopped and "later.json" in l for t, l in monitor.timed), "an update after stopMonitoring"


def test_coordinated_access_across_processes(store, make_device, background):
    """A coordinated writer in one process holds off a coordinated reader in
    another (and a reader holds off a writer); uncoordinated background are not held."""
    a, _ = two_container_mounts(store, make_device)
    path = a.mountpoint / "Documents" / "shared.txt"
    path.write_text("v1")
    handler = example("ubiquitykit-documents-handler")
    writer = background([handler, "write", path, "v2", "2"], a.env())
    t_writing, _ = writer.wait_for(lambda l: l.startswith("writing "), what="the writer's grant")
    assert path.read_text() == "v1"   # cat is not coordinated: it reads at once
    reader = background([handler, "read", path], a.env())
    _, wrote = writer.wait_for(lambda l: l.startswith("wrote "), what="the write")
    _, read = reader.wait_for(lambda l: l.startswith("read "), what="the read")
    assert float(read.split()[1]) >= float(wrote.split()[1]), (wrote, read)
    assert read.split(" ", 2)[2] == "v2", read

    # The other way: a held read (a reader's process holding it: a write with HOLD is the writer).
    holder = background([handler, "write", path, "v3", "2"], a.env())
    holder.wait_for(lambda l: l.startswith("writing "), what="the second writer's grant")
    second = background([handler, "write", path, "v4"], a.env())
    _, first_done = holder.wait_for(lambda l: l.startswith("wrote "), what="the first write")
    _, second_done = second.wait_for(lambda l: l.startswith("wrote "), what="the second write")
    assert float(second_done.split()[1]) >= float(first_done.split()[1])
    assert path.read_text() == "v4"

    # A process that dies holding an item lets go of it.
    dying = background([handler, "write", path, "v5", "30"], a.env())
    dying.wait_for(lambda l: l.startswith("writing "), what="the grant before the kill")
    dying.proc.kill()
    after = background([handler, "read", path], a.env())
    after.wait_for(lambda l: l.startswith("read "), timeout=10, what="a read after the holder died")


def stamp(line: str) -> float:
    return float(line.split()[-1])


def test_presenters_in_other_processes_let_go_before_accesses(store, make_device, background):
    """Another process's coordinated write asks this process's presenter to
    save and relinquish first and gives the item back after; a deletion asks
    it to accommodate; a reader asks it to relinquish to the reader; a
    presenter that never answers holds a writer back only as long as the
    timeout."""
    a, _ = two_container_mounts(store, make_device, mount_env={"UBIQUITYFS_PRESENTER_TIMEOUT": "2"})
    handler = example("ubiquitykit-documents-handler")
    path = a.mountpoint / "Documents" / "presented.txt"
    path.write_text("v1")
    monitor = background([handler, "monitor", path, "40"], a.env())
    monitor.wait_for(lambda l: l == "monitoring", what="the presenter's start")

    writer = background([handler, "write", path, "v2", "1"], a.env())
    _, saved = monitor.wait_for(lambda l: l.startswith("save "), what="savePresentedItemChanges")
    _, relinquished = monitor.wait_for(lambda l: l.startswith("relinquish to writer "), what="relinquishPresentedItem(toWriter:)")
    _, writing = writer.wait_for(lambda l: l.startswith("writing "), what="the write's grant")
    _, wrote = writer.wait_for(lambda l: l.startswith("wrote "), what="the write")
    _, reacquired = monitor.wait_for(lambda l: l.startswith("reacquired "), what="the reacquirer")
    assert stamp(saved) <= stamp(relinquished) <= stamp(writing), (saved, relinquished, writing)
    assert stamp(reacquired) >= stamp(wrote), (wrote, reacquired)
    assert path.read_text() == "v2"

    reader = background([handler, "read", path], a.env())
    _, to_reader = monitor.wait_for(lambda l: l.startswith("relinquish to reader "), what="relinquishPresentedItem(toReader:)")
    _, read = reader.wait_for(lambda l: l.startswith("read "), what="the read")
    assert stamp(to_reader) <= float(read.split()[1])
    monitor.wait_for(lambda l: l.startswith("reacquired from reader "), what="the reader's reacquirer")

    # The guide's write is a coordinated write .forDeleting: the presenter accommodates the deletion first.
    deleter = background([handler, "write", path, "v3"], a.env())
    _, deleted = monitor.wait_for(lambda l: l.startswith("file deleted "), what="accommodatePresentedItemDeletion")
    _, wrote = deleter.wait_for(lambda l: l.startswith("wrote "), what="the guide's write")
    assert stamp(deleted) <= stamp(wrote)

    # A presenter that never lets go: the writer goes ahead after the daemon's timeout (2 s here).
    other = a.mountpoint / "Documents" / "stubborn.txt"
    other.write_text("s1")
    stubborn = background([handler, "monitor", other, "30"], {**a.env(), "STUBBORN": "1"})
    stubborn.wait_for(lambda l: l == "monitoring", what="the stubborn presenter's start")
    start = time.time()
    late = background([handler, "write", other, "s2", "0"], a.env())
    stubborn.wait_for(lambda l: l.startswith("relinquish to writer "), what="the ask")
    _, writing = late.wait_for(lambda l: l.startswith("writing "), timeout=15, what="the write after the timeout")
    assert 1.5 <= stamp(writing) - start < 10, stamp(writing) - start
    late.wait_for(lambda l: l.startswith("wrote "), what="the write")


def test_a_pull_waits_for_a_coordinated_reader_and_asks_presenters(store, make_device, background):
    """The sync writes a pulled version as a coordinated writer: a coordinated
    reader on B reads one version from start to end while A's edit waits,
    and B's presenter relinquishes to the sync and gets the item back."""
    a, b = two_container_mounts(store, make_device)
    handler = example("ubiquitykit-documents-handler")
    on_a = a.mountpoint / "Documents" / "pulled.txt"
    on_b = b.mountpoint / "Documents" / "pulled.txt"
    on_a.write_text("v1")
    deadline = time.monotonic() + 15
    while not on_b.exists():
        assert time.monotonic() < deadline, "the file did not reach B"
        time.sleep(0.05)
    monitor = background([handler, "monitor", on_b, "40"], b.env())
    monitor.wait_for(lambda l: l == "monitoring", what="the presenter's start")
    reader = background([handler, "read", on_b, "4"], b.env())
    _, first = reader.wait_for(lambda l: l.startswith("reading "), what="the coordinated read")
    assert first.endswith(" v1"), first
    # While B's reader holds the file, A's edit arrives; the pull waits for the reader.
    _, reader_pid_line = monitor.wait_for(lambda l: l.startswith("relinquish to reader "), what="the reader's ask")
    on_a.write_text("v2 from A")
    _, again = reader.wait_for(lambda l: l.startswith("read again "), timeout=15, what="the second read")
    assert again.endswith(" v1"), f"the pull replaced the file under a coordinated reader: {again}"
    _, to_sync = monitor.wait_for(lambda l: l.startswith("relinquish to writer "), what="the sync's ask")
    _, back = monitor.wait_for(lambda l: l.startswith("reacquired ") and not l.startswith("reacquired from"),
                               what="the item given back after the pull")
    assert stamp(back) >= float(again.split()[2]) - 0.05, (again, back)
    deadline = time.monotonic() + 15
    while on_b.read_text() != "v2 from A":
        assert time.monotonic() < deadline, "A's edit did not arrive on B after the read"
        time.sleep(0.1)
    monitor.wait_for(lambda l: l == "file changed", what="presentedItemDidChange after the pull")


def test_a_presenter_is_told_of_another_devices_edit(store, make_device, background):
    a, b = two_container_mounts(store, make_device)
    (a.mountpoint / "Documents" / "watched.txt").write_text("first")
    while not (b.mountpoint / "Documents" / "watched.txt").exists():
        time.sleep(0.05)
    monitor = background([example("ubiquitykit-documents-handler"), "monitor", b.mountpoint / "Documents" / "watched.txt", "20"],
                      b.env())
    monitor.wait_for(lambda l: l == "monitoring", what="the presenter's start")
    start = time.monotonic()
    with open(a.mountpoint / "Documents" / "watched.txt", "a") as f:
        f.write(" and more")
    t, _ = monitor.wait_for(lambda l: l == "file changed", after=start, what="presentedItemDidChange")
    assert t - start < 3, f"told {t - start:.2f}s after A's save"
    start = time.monotonic()
    os.rename(a.mountpoint / "Documents" / "watched.txt", a.mountpoint / "Documents" / "renamed.txt")
    monitor.wait_for(lambda l: l == "file moved to renamed.txt", after=start, what="presentedItemDidMove")


def test_the_uidocument_sample_creates_opens_reloads_and_flags_conflicts(store, make_device, background):
    a, b = two_container_mounts(store, make_device)
    editor = example("ubiquitykit-document-editor")
    saved_a = a.mountpoint / "Documents" / "savefile.txt"
    # First run on B: no savefile.txt yet, so the post's flow creates it (UIDocument .forCreating).
    first = background([editor, CONTAINER], b.env())
    first.wait_for(lambda l: l == "iCloud create OK", what="the document created")
    first.wait_for(lambda l: l == "closed", what="the document closed")
    deadline = time.monotonic() + 15
    while not (saved_a.exists() and saved_a.read_text() == "Some Sample Text"):
        assert time.monotonic() < deadline, "B's new document did not reach A"
        time.sleep(0.1)

    # Open it on B and follow it: an unmodified document reloads A's edit.
    watcher = background([editor, CONTAINER, "--watch", "30"], b.env())
    watcher.wait_for(lambda l: l == "iCloud file open OK", what="the document opened")
    watcher.wait_for(lambda l: l == "text: Some Sample Text", what="its text")
    start = time.monotonic()
    saved_a.write_text("Edited on A")
    watcher.wait_for(lambda l: l == "loaded: Edited on A", after=start, what="the reload of A's edit")
    watcher.stop()

    # A document with unsaved changes is in conflict when A's edit arrives; closing saves it, and both versions stay.
    editing = background([editor, CONTAINER, "--set", "Edited on B", "--watch", "8"], b.env())
    editing.wait_for(lambda l: l == "edited", what="B's unsaved edit")
    start = time.monotonic()
    saved_a.write_text("Edited on A again")
    editing.wait_for(lambda l: l.startswith("state=") and "inConflict" in l, after=start, what="the conflict state")
    editing.wait_for(lambda l: l == "closed", timeout=20, what="the close (which saves B's text)")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        texts = sorted(p.read_text() for p in (a.mountpoint / "Documents").iterdir() if p.name.startswith("savefile"))
        if texts == ["Edited on A again", "Edited on B"]:
            break
        time.sleep(0.2)
    assert texts == ["Edited on A again", "Edited on B"], texts
    # B's version is a conflict version of the file, on A too (NSFileVersion, `ubiquityfs versions`).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = a.cli("versions", saved_a, timeout=30).stdout
        if "conflicted copy" in listed:
            break
        time.sleep(0.2)
    assert "conflicted copy" in listed, listed


def notes(dev, *args, timeout: float = 60) -> str:
    """Run the notes app on `dev`; its output."""
    done = subprocess.run([str(example("ubiquitykit-notes")), "--container", CONTAINER, *map(str, args)], env=dev.env(),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_the_notes_app_edits_on_two_devices_one_offline_and_resolves_once_for_both(store, make_device, store_link,
                                                                                     background):
    """The notes app (UIDocument, NSMetadataQuery, NSFileVersion, resource
    values): a note saved on both devices while B is offline ends in conflict
    on both, with both texts as the current and the unresolved version; an
    open document shows .inConflict; resolving on B clears it on both, and
    the document open on A hears it and returns to normal."""
    a, b = two_container_mounts(store, make_device, b_store=store_link.path)
    assert "saved" in notes(a, "write", "todo", "milk")
    listing = background([example("ubiquitykit-notes"), "--container", CONTAINER, "list", "--watch", "60"], b.env())
    listing.wait_for(lambda l: l.strip().startswith("✓ todo") or l.strip().startswith("☁ todo"), what="the note listed on B")
    def arrived():
        assert (b.mountpoint / "Documents" / "todo.txt").read_text() == "milk"
    eventually(arrived, what="the note on B")

    store_link.cut()
    wait_offline(b)
    assert "saved" in notes(b, "write", "todo", "milk, eggs (from B)")
    assert "saved" in notes(a, "write", "todo", "milk, bread (from A)")
    wait_pushed(a)
    # B's list shows its edit waiting to be uploaded.
    listing.wait_for(lambda l: "todo" in l and "↑" in l, what="B's unsent edit in the list")
    store_link.restore()

    texts = {"milk, eggs (from B)", "milk, bread (from A)"}

    def in_conflict(dev):
        out = notes(dev, "conflicts", "todo")
        assert "conflicts: 1" in out, out
        current = out.splitlines()[0].split(" ", 2)[2]
        other = out.splitlines()[2].split(": ", 2)[2]
        assert {current, other} == texts, out
        return out

    for dev in (a, b):
        eventually(lambda: in_conflict(dev), timeout=30, what=f"the conflict on {dev.name}")
    listing.wait_for(lambda l: "todo" in l and "⚠" in l and "(conflicted copy" not in l, what="the conflict in B's list")
    assert "state: inConflict" in notes(b, "show", "todo")

    # A keeps the note open while B resolves: A's document hears it.
    editor = background([example("ubiquitykit-notes"), "--container", CONTAINER, "edit", "todo"], a.env(), stdin=True)
    editor.wait_for(lambda l: l == "state: inConflict", what="A's open document in conflict")
    out = notes(b, "conflicts", "todo")
    b_text = "milk, eggs (from B)"
    version = next(line.split(":")[0].strip() for line in out.splitlines()[2:] if line.endswith(b_text))
    start = time.monotonic()
    assert "resolved" in notes(b, "resolve", "todo", version)

    def resolved(dev):
        out = notes(dev, "conflicts", "todo")
        assert "conflicts: 0" in out and out.splitlines()[0].endswith(b_text), out
        names = sorted(p.name for p in (dev.mountpoint / "Documents").iterdir())
        assert names == ["todo.txt"], names
        return True

    for dev in (a, b):
        eventually(lambda: resolved(dev), timeout=30, what=f"the resolution on {dev.name}")
    editor.wait_for(lambda l: l.startswith("state: normal") and l.endswith(b_text), after=start,
                    what="A's document back to normal with the kept text")
    editor.send(None)
    editor.wait_for(lambda l: l == "closed", what="A's document closed")


def test_the_notes_app_lists_earlier_versions_and_reverts_on_every_device(store, make_device):
    """NSFileVersion.otherVersionsOfItem returns the note's history (issue
    #39): every text saved, from either device, newest first, each with its
    device and readable through its url; replaceItem makes one current on
    both devices, and the replaced text stays among the other versions."""
    a, b = two_container_mounts(store, make_device)
    assert "saved" in notes(a, "write", "todo", "milk")
    wait_pushed(a)
    assert "saved" in notes(a, "write", "todo", "milk, eggs")
    wait_pushed(a)
    note_b = b.mountpoint / "Documents" / "todo.txt"
    until(note_b.read_text, lambda text: text == "milk, eggs", "B has A's second text")
    assert "saved" in notes(b, "write", "todo", "milk, eggs, bread")
    wait_pushed(b)

    def listed():
        out = notes(a, "history", "todo")
        assert "earlier versions: 2" in out, out
        return out

    out = eventually(listed, what="two earlier versions on A")
    lines = [l.strip() for l in out.splitlines() if l.strip()[:2] in ("1:", "2:")]
    assert lines[0].startswith("1: from a at ") and lines[0].endswith(": milk, eggs"), out
    assert lines[1].startswith("2: from a at ") and lines[1].endswith(": milk"), out

    assert "reverted" in notes(b, "revert", "todo", "2")
    note_a = a.mountpoint / "Documents" / "todo.txt"
    for note in (note_a, note_b):
        until(note.read_text, lambda text: text == "milk", f"{note} reverted")
    out = until(lambda: notes(a, "history", "todo"), lambda o: "earlier versions: 3" in o,
                "the replaced text among the earlier versions")
    assert "from b at" in out and ": milk, eggs, bread" in out, out
