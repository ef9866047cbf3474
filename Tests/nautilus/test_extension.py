"""The file-manager extension (Packaging/nautilus/ubiquityfs_nautilus.py).

1. Without mounts, each test twice (real Nautilus 4.0 introspection and the
   stub, see conftest.py): the mount table, the status -> emblem mapping, the
   provider's interfaces, and the controller driven by a fake `ubiquityfs`
   (a script that replays JSON lines): the status map fed by the watch,
   live invalidation on the main loop only for changed emblems, restart with
   back-off, another device's mount left alone, a mount disappearing, menus
   by status, actions (arguments, multi-selection, failures notified, never
   raised), the conflict version check, and no subprocess ever started from
   update_file_info or the menu.
2. Real mounts (two devices on one store, Tests/mount/conftest.py): a file
   made on A is a placeholder on B with the cloud emblem; `ubiquityfs
   download` on B moves it to downloaded within 2 s; the menu's actions
   really act on the mount (download, keep, stop keeping, free up space,
   multi-selection, a refusal notified); a conflicted file offers Resolve
   Conflict and Show Versions, and resolving removes the conflicted copy.
3. A real `nautilus` under `xvfb-run -a dbus-run-session`, with the extension
   installed per-user by install.sh into a temporary HOME, opening a mounted
   folder: the extension loads, answers for the mount's files, and no Python
   traceback is printed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nautilus_support import EXTENSION, REPO, mount_conftest
from nautilus_support import best_flavour, flavour, make_device, mount_safety_net, private_data_home, store  # noqa: F401 (fixtures)

BIN = mount_conftest.BIN
EMBLEM = "emblem-ubiquityfs-"


def item(path, **fields) -> dict:
    """A query item as the daemon prints it (the status keys; defaults: a downloaded file)."""
    base = {
        "path": str(path), "name": os.path.basename(str(path)), "isDirectory": False, "size": 3,
        "downloadingStatus": "current", "isDownloading": False, "percentDownloaded": 100,
        "isUploaded": True, "isUploading": False, "percentUploaded": 100,
        "hasUnresolvedConflicts": False, "pinned": False, "downloadingError": None, "uploadingError": None,
    }
    base.update(fields)
    return base


def line(event, it=None, **extra) -> str:
    data = {"event": event, **extra}
    if it is not None:
        data["item"] = it
    return json.dumps(data)


def labels(items) -> list[str]:
    return [i.get_property("label") for i in items]


def find(items, label):
    for i in items:
        if i.get_property("label") == label:
            return i
    raise AssertionError(f"no menu item {label!r} in {labels(items)}")


def submenu_labels(menu_item) -> list[str]:
    menu = menu_item.get_property("menu")
    assert menu is not None, f"{menu_item.get_property('label')} has no submenu"
    return labels(menu.get_items())


def info(provider, file) -> list[str]:
    """update_file_info on a fresh slate; the emblems it added."""
    file.clear()
    provider.update_file_info(file)
    return list(file.emblems)


# ---------------------------------------------------------------------------
# 1. Pure parts
# ---------------------------------------------------------------------------


def test_mountinfo_finds_ubiquityfs_mounts_only(flavour):
    ext = flavour.ext
    text = (
        b"22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        b"42 27 0:39 / /home/me/Cloud rw,nosuid,nodev,relatime - fuse.ubiquityfs ubiquityfs:12629 rw,user_id=0\n"
        b"43 27 0:40 / /mnt/with\\040space\\134x rw - fuse.ubiquityfs ubiquityfs:77 rw\n"
        b"44 27 0:41 / /mnt/old rw - fuse ubiquityfs rw\n"
        b"45 27 0:42 / /mnt/ssh rw - fuse.sshfs me@host: rw\n"
        b"46 27 0:43 / /tmp rw shared:5 master:1 - tmpfs tmpfs rw\n"
        b"garbage line\n"
    )
    entries = ext.parse_mountinfo(text)
    assert [e.mountpoint for e in entries] == ["/", "/home/me/Cloud", "/mnt/with space\\x", "/mnt/old", "/mnt/ssh", "/tmp"]
    assert entries[5].fstype == "tmpfs", "optional fields before the separator are skipped"
    found = {e.mountpoint: e for e in entries if e.is_ubiquity}
    assert sorted(found) == ["/home/me/Cloud", "/mnt/old", "/mnt/with space\\x"]
    assert found["/home/me/Cloud"].source == "ubiquityfs:12629" and found["/home/me/Cloud"].mount_id == "42"


@pytest.mark.parametrize("fields, emblems, text", [
    ({"downloadingStatus": "notDownloaded", "percentDownloaded": 0}, ["cloud"], "In the cloud"),
    ({"downloadingStatus": "notDownloaded", "isDownloading": True, "percentDownloaded": 42}, ["downloading"], "Downloading (42 %)"),
    ({"downloadingStatus": "downloaded", "isDownloading": True}, ["downloading"], "Downloading"),
    ({}, ["downloaded"], "Downloaded"),
    ({"pinned": True}, ["pinned"], "Kept on this device"),
    ({"pinned": True, "downloadingStatus": "notDownloaded"}, ["cloud", "pinned"], "In the cloud, kept on this device"),
    ({"isUploaded": False, "isUploading": True}, ["uploading"], "Uploading"),
    ({"isUploaded": False, "isUploading": False}, ["uploading"], "Waiting to upload"),
    ({"hasUnresolvedConflicts": True}, ["conflict"], "Conflicting versions"),
    ({"hasUnresolvedConflicts": True, "pinned": True}, ["conflict", "pinned"], "Conflicting versions"),
    ({"downloadingError": "the store lost it"}, ["error"], "Sync error: the store lost it"),
    ({"isUploaded": False, "uploadingError": "store unreachable"}, ["error"], "Sync error: store unreachable"),
    ({"isDirectory": True}, [], "Up to date"),
    ({"isDirectory": True, "pinned": True}, ["pinned"], "Kept on this device"),
    ({"isDirectory": True, "isUploaded": False}, ["uploading"], "Waiting to upload"),
])
def test_status_to_emblems_and_text(flavour, fields, emblems, text):
    status = flavour.ext.ItemStatus(item("/m/x", **fields))
    assert list(status.emblems) == [EMBLEM + e for e in emblems]
    assert status.text.startswith(text)
    assert set(status.emblems) <= set(flavour.ext.EMBLEMS)


def test_every_emblem_has_an_icon():
    icons = REPO / "Packaging" / "nautilus" / "icons" / "hicolor" / "scalable" / "emblems"
    names = {p.stem for p in icons.glob("*.svg")}
    import xml.dom.minidom
    expected = {f"{EMBLEM}{s}" for s in ("cloud", "downloading", "downloaded", "pinned", "uploading", "conflict", "error")}
    assert names == expected
    for p in icons.glob("*.svg"):
        root = xml.dom.minidom.parse(str(p)).documentElement
        assert root.tagName == "svg" and root.getAttribute("viewBox") == "0 0 16 16", p


def test_provider_implements_the_interfaces(flavour):
    ext, FM = flavour.ext, flavour.FM
    cls = ext.UbiquityFSExtension
    for interface in (FM.InfoProvider, FM.MenuProvider, FM.ColumnProvider):
        assert issubclass(cls, interface)
    # nautilus-python instantiates every provider class of the module: exactly one.
    providers = [v for v in vars(ext).values()
                 if isinstance(v, type) and any(issubclass(v, i) for i in (FM.InfoProvider, FM.MenuProvider))]
    assert providers == [cls], providers
    controller = flavour.controller(mountinfo="/nonexistent", binary="/bin/false")
    provider = flavour.provider(controller)
    if flavour.name == "gi":
        from gi.repository import GObject
        for interface in (FM.InfoProvider, FM.MenuProvider, FM.ColumnProvider):
            assert GObject.type_is_a(cls.__gtype__, interface.__gtype__)
    columns = provider.get_columns()
    assert [c.get_property("attribute") for c in columns] == [ext.STATUS_ATTRIBUTE]
    outside = flavour.file("/etc/hostname")
    assert provider.update_file_info(outside) == FM.OperationResult.COMPLETE
    assert outside.emblems == [] and provider.get_file_items([outside]) == []
    assert provider.get_background_items(flavour.file("/etc", is_dir=True)) == []


def test_versions_table_and_predicate_strings(flavour):
    ext = flavour.ext
    table = (
        "VERSION  DEVICE            MODIFIED              SIZE        PATH\n"
        "current  b                 2026-11-28T14:07:27Z  4 B         /n.txt\n"
        "1        laptop one        2026-11-28T14:08:00Z  1.0 KiB     /n (conflicted copy laptop one 2026-11-28 140800).txt\n"
    )
    rows = ext.parse_versions(table)
    assert rows == [
        {"label": "current", "device": "b", "modified": "2026-11-28T14:07:27Z", "size": "4 B", "path": "/n.txt"},
        {"label": "1", "device": "laptop one", "modified": "2026-11-28T14:08:00Z", "size": "1.0 KiB",
         "path": "/n (conflicted copy laptop one 2026-11-28 140800).txt"},
    ]
    assert ext.parse_versions("something else") == []
    assert ext.predicate_string("/a/it's \\ here") == "'/a/it\\'s \\\\ here'"


# ---------------------------------------------------------------------------
# 1b. The controller with a fake `ubiquityfs`
# ---------------------------------------------------------------------------

FAKE_CLI = r'''
import json, os, sys, time
d = os.environ["FAKE_UBQ_DIR"]
args = sys.argv[1:]
with open(os.path.join(d, "calls.jsonl"), "a") as f:
    f.write(json.dumps(args) + "\n")

def lines(name):
    p = os.path.join(d, name)
    return open(p).read().splitlines() if os.path.exists(p) else None

if args[0] == "query" and "--watch" in args:
    slug = os.path.basename(args[1])
    counter = os.path.join(d, "count-" + slug)
    n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
    open(counter, "w").write(str(n))
    for text in lines("watch-%s-%d" % (slug, n)) or lines("watch-" + slug) or []:
        if text.startswith("@wait "):
            while not os.path.exists(os.path.join(d, text[6:])):
                time.sleep(0.02)
        elif text.startswith("@exit "):
            code, _, message = text[6:].partition(" ")
            sys.stderr.write("Error: " + message + "\n")
            sys.exit(int(code))
        else:
            print(text, flush=True)
    while True:
        time.sleep(1)
name = args[0]
delay = lines("sleep-" + name)
if delay:
    time.sleep(float(delay[0]))
failure = lines("fail-" + name)
if failure:
    sys.stderr.write("[####------] 40%\r" + "\n".join(failure[1:]) + "\n")
    sys.exit(int(failure[0]))
for text in lines("out-" + name) or []:
    print(text)
'''


class FakeCLI:
    """A scripted `ubiquityfs` and a mount table of our own."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path / "fake"
        self.dir.mkdir()
        self.binary = self.dir / "ubiquityfs"
        self.binary.write_text(f"#!{sys.executable}\n" + FAKE_CLI)
        self.binary.chmod(0o755)
        self.mountinfo = self.dir / "mountinfo"
        self.mounts: dict[str, int] = {}
        self.write_mounts()

    def env(self):
        return {**os.environ, "FAKE_UBQ_DIR": str(self.dir)}

    def mount(self, mountpoint: str, mount_id: int):
        self.mounts[mountpoint] = mount_id
        self.write_mounts()

    def unmount(self, mountpoint: str):
        del self.mounts[mountpoint]
        self.write_mounts()

    def write_mounts(self):
        text = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n" + "".join(
            f"{i} 22 0:{i} / {mp} rw - fuse.ubiquityfs ubiquityfs:{1000 + i} rw\n" for mp, i in self.mounts.items())
        self.mountinfo.write_text(text)

    def script(self, name: str, *lines_: str):
        (self.dir / name).write_text("\n".join(lines_) + "\n")

    def touch(self, name: str):
        (self.dir / name).write_text("")

    def calls(self) -> list[list[str]]:
        path = self.dir / "calls.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def watch_count(self, slug: str) -> int:
        path = self.dir / f"count-{slug}"
        return int(path.read_text()) if path.exists() else 0


@pytest.fixture
def fake(tmp_path):
    return FakeCLI(tmp_path)


def fake_controller(flavour, fake, **kw):
    return flavour.controller(binary=str(fake.binary), env=fake.env(), mountinfo=str(fake.mountinfo),
                              poll_interval=0.2, **kw)


def test_watch_feeds_the_map_and_invalidates_only_changed_files(flavour, fake):
    m = "/mnt/cloud"
    fake.mount(m, 50)
    fake.script("watch-cloud",
                line("result", item(f"{m}/a.txt", downloadingStatus="notDownloaded")),
                line("result", item(f"{m}/b.txt")),
                line("result", item(f"{m}/dir", isDirectory=True)),
                line("gatheringFinished", count=3),
                "@wait go1",
                # progress of a download: the emblem stays, the text moves
                line("changed", item(f"{m}/a.txt", downloadingStatus="notDownloaded", isDownloading=True, percentDownloaded=10)),
                "@wait go2",
                line("changed", item(f"{m}/a.txt", downloadingStatus="notDownloaded", isDownloading=True, percentDownloaded=10)),
                line("changed", item(f"{m}/a.txt")),
                line("added", item(f"{m}/new.txt", downloadingStatus="notDownloaded")),
                line("removed", item(f"{m}/b.txt")))
    c = fake_controller(flavour, fake).start()
    p = flavour.provider(c)
    files = {n: flavour.file(f"{m}/{n}", is_dir=(n == "dir")) for n in ("a.txt", "b.txt", "dir", "new.txt")}
    # Before the initial results: no emblem, but the files are remembered.
    flavour.pump(lambda: c.mount_for(f"{m}/a.txt") == m, 5, "the mount is found")
    for f in files.values():
        p.update_file_info(f)
    flavour.pump(lambda: c.is_ready(m), 5, "the watch's initial results")
    flavour.pump(lambda: all(files[n].invalidated for n in ("a.txt", "b.txt", "dir")), 5,
                 "files asked about before the results are invalidated when they come")
    assert files["new.txt"].invalidated == 0, "a file the results do not name is left alone"
    assert info(p, files["a.txt"]) == [EMBLEM + "cloud"]
    assert files["a.txt"].attributes == {flavour.ext.STATUS_ATTRIBUTE: "In the cloud"}
    assert info(p, files["b.txt"]) == [EMBLEM + "downloaded"]
    assert info(p, files["dir"]) == [] and files["dir"].attributes[flavour.ext.STATUS_ATTRIBUTE] == "Up to date"
    before = {n: f.invalidated for n, f in files.items()}

    fake.touch("go1")
    flavour.pump(lambda: files["a.txt"].invalidated > before["a.txt"], 5, "a.txt invalidated when it downloads")
    assert info(p, files["a.txt"]) == [EMBLEM + "downloading"]
    assert files["a.txt"].attributes[flavour.ext.STATUS_ATTRIBUTE] == "Downloading (10 %)"
    before = {n: f.invalidated for n, f in files.items()}
    fake.touch("go2")
    flavour.pump(lambda: c.status(f"{m}/b.txt") is None and files["new.txt"].invalidated, 5, "removed and added")
    flavour.pump(lambda: files["a.txt"].invalidated > before["a.txt"], 5, "a.txt invalidated when downloaded")
    assert info(p, files["a.txt"]) == [EMBLEM + "downloaded"]
    assert info(p, files["new.txt"]) == [EMBLEM + "cloud"]
    assert info(p, files["b.txt"]) == [], "a removed item has no emblem"
    assert files["b.txt"].invalidated > before["b.txt"]
    assert files["dir"].invalidated == before["dir"], "a file whose status did not change is left alone"
    # One watch process for the mount, started with the mount's path.
    watches = [a for a in fake.calls() if a[0] == "query"]
    assert watches == [["query", m, "--watch", "--json", "--throttle", "0.5"]]


def test_watch_restarts_with_backoff_keeps_the_map_and_leaves_foreign_mounts(flavour, fake):
    ours, theirs = "/mnt/ours", "/mnt/theirs"
    fake.mount(ours, 60)
    fake.mount(theirs, 61)
    fake.script("watch-ours-1", line("result", item(f"{ours}/f", downloadingStatus="notDownloaded")),
                line("gatheringFinished", count=1), "@exit 1 the daemon did not answer")
    fake.script("watch-ours-2", "@exit 1 the daemon did not answer")
    fake.script("watch-ours-3", line("result", item(f"{ours}/f")), line("gatheringFinished", count=1))
    fake.script("watch-theirs", f"@exit 1 {theirs} is a ubiquityfs mount of another device or user (its daemon is pid 5)")
    c = fake_controller(flavour, fake).start()
    p = flavour.provider(c)
    f = flavour.file(f"{ours}/f")
    start = time.monotonic()
    flavour.pump(lambda: c.status(f"{ours}/f") is not None, 5, "the first watch's results")
    p.update_file_info(f)
    flavour.pump(lambda: fake.watch_count("ours") >= 2, 5, "restarted after the first exit")
    # While the watch is down the map keeps what it knew.
    assert c.status(f"{ours}/f").emblems == (EMBLEM + "cloud",)
    flavour.pump(lambda: c.status(f"{ours}/f").emblems == (EMBLEM + "downloaded",), 8, "the third watch's results")
    took = time.monotonic() - start
    assert fake.watch_count("ours") == 3
    assert 2.5 < took < 7, f"back-off 1 s then 2 s expected; the third start came after {took:.1f}s"
    flavour.pump(lambda: f.invalidated, 5, "the file is invalidated when the restarted watch differs")
    assert info(p, f) == [EMBLEM + "downloaded"]
    # Another device's mount: asked once, then left alone; no emblems, no menu.
    assert c.watch_state(theirs) == "foreign"
    assert fake.watch_count("theirs") == 1
    other = flavour.file(f"{theirs}/x")
    assert info(p, other) == [] and p.get_file_items([other]) == []


def test_vanished_mount_stops_its_watch_and_clears_emblems(flavour, fake):
    m = "/mnt/gone"
    fake.mount(m, 70)
    fake.script("watch-gone", line("result", item(f"{m}/f", pinned=True)), line("gatheringFinished", count=1))
    c = fake_controller(flavour, fake).start()
    p = flavour.provider(c)
    f = flavour.file(f"{m}/f")
    flavour.pump(lambda: c.is_ready(m), 5, "results")
    assert info(p, f) == [EMBLEM + "pinned"]
    pid = c.watch_pid(m)
    assert pid and mount_conftest.pid_alive(pid)
    fake.unmount(m)
    flavour.pump(lambda: c.mount_for(f"{m}/f") is None, 5, "the mount is dropped")
    flavour.pump(lambda: f.invalidated, 5, "its files are invalidated")
    assert info(p, f) == []
    assert mount_conftest.wait_pid_exit(pid, 5), f"watch pid {pid} still running"
    # Mounted again (a new mount ID): watched again.
    fake.mount(m, 71)
    flavour.pump(lambda: c.is_ready(m) and fake.watch_count("gone") == 2, 5, "the new mount is watched")


def _menu_setup(flavour, fake, **kw):
    m = "/mnt/menu"
    fake.mount(m, 80)
    fake.script("watch-menu",
                line("result", item(f"{m}/cloud.txt", downloadingStatus="notDownloaded")),
                line("result", item(f"{m}/kept.txt", pinned=True)),
                line("result", item(f"{m}/local.txt")),
                line("result", item(f"{m}/doc.txt", hasUnresolvedConflicts=True)),
                line("result", item(f"{m}/dir", isDirectory=True)),
                line("gatheringFinished", count=5))
    c = fake_controller(flavour, fake, **kw).start()
    p = flavour.provider(c)
    flavour.pump(lambda: c.is_ready(m), 5, "results")
    return m, c, p


def test_menu_follows_the_status(flavour, fake):
    m, c, p = _menu_setup(flavour, fake)
    F = lambda n: flavour.file(f"{m}/{n}", is_dir=(n == "dir"))  # noqa: E731
    assert labels(p.get_file_items([F("cloud.txt")])) == ["Download Now", "Keep on This Device", "Show Versions"]
    assert labels(p.get_file_items([F("kept.txt")])) == ["Free Up Space", "Stop Keeping on This Device", "Show Versions"]
    assert labels(p.get_file_items([F("cloud.txt"), F("kept.txt")])) == [
        "Download Now", "Free Up Space", "Keep on This Device", "Stop Keeping on This Device"]
    assert labels(p.get_file_items([F("dir")])) == ["Download Now", "Free Up Space", "Keep on This Device"]
    items = p.get_file_items([F("doc.txt")])
    assert labels(items) == ["Free Up Space", "Keep on This Device", "Resolve Conflict", "Show Versions"]
    assert submenu_labels(find(items, "Resolve Conflict")) == ["Keep Current Version", "Keep All Versions"]
    # Files outside any mount are ignored; only outside: no menu.
    assert labels(p.get_file_items([F("local.txt"), flavour.file("/etc/hostname")])) == [
        "Free Up Space", "Keep on This Device", "Show Versions"]
    assert p.get_file_items([flavour.file("/etc/hostname")]) == []
    # A file the map does not know (yet): every action but the conflict's.
    assert labels(p.get_file_items([F("unknown.txt")])) == [
        "Download Now", "Free Up Space", "Keep on This Device", "Stop Keeping on This Device", "Show Versions"]
    background = p.get_background_items(flavour.file(f"{m}/dir", is_dir=True))
    assert labels(background) == ["Download Now", "Free Up Space", "Keep on This Device"]
    names = [i.get_property("name") for i in background]
    assert len(set(names)) == len(names) and all(n.startswith("UbiquityFS::") for n in names)


def test_actions_run_the_cli_and_report_failures(flavour, fake):
    m, c, p = _menu_setup(flavour, fake)
    notes = c.notify
    F = lambda n: flavour.file(f"{m}/{n}", is_dir=(n == "dir"))  # noqa: E731
    # Multi-selection with a folder: one download of both, recursive; then the status is read again.
    find(p.get_file_items([F("cloud.txt"), F("dir")]), "Download Now").activate()
    flavour.pump(lambda: any(a[0] == "query" and "--predicate" in a for a in fake.calls()), 5, "the refresh query")
    calls = [a for a in fake.calls() if a[0] != "query" or "--watch" not in a]
    assert calls[0] == ["download", "--recursive", f"{m}/cloud.txt", f"{m}/dir"]
    assert calls[1][:3] == ["query", m, "--json"]
    assert calls[1][4] == f"path BEGINSWITH '{m}/cloud.txt' OR path BEGINSWITH '{m}/dir'"
    find(p.get_file_items([F("cloud.txt")]), "Keep on This Device").activate()
    find(p.get_file_items([F("kept.txt"), F("local.txt")]), "Free Up Space").activate()
    find(p.get_file_items([F("kept.txt")]), "Stop Keeping on This Device").activate()
    items = p.get_file_items([F("doc.txt")])
    for sub in find(items, "Resolve Conflict").get_property("menu").get_items():
        if sub.get_property("label") == "Keep All Versions":
            sub.activate()
    wanted = [["pin", f"{m}/cloud.txt"], ["evict", f"{m}/kept.txt", f"{m}/local.txt"], ["unpin", f"{m}/kept.txt"],
              ["resolve", f"{m}/doc.txt", "--keep", "both"]]
    flavour.pump(lambda: all(w in fake.calls() for w in wanted), 5, f"the CLI runs {wanted}")
    flavour.pump(lambda: len([a for a in fake.calls() if "--predicate" in a]) >= 5, 5, "each action refreshes")
    time.sleep(0.2)
    flavour.iterate()
    assert notes == [], "successful actions notify nothing"
    # A refusal: notified with the CLI's message (no progress bar, no "Error:"), never raised.
    fake.script("fail-evict", "1", f"Error: {m}/local.txt: it has changes not yet pushed; try again later")
    find(p.get_file_items([F("local.txt")]), "Free Up Space").activate()
    flavour.pump(lambda: notes, 5, "a notification")
    assert notes == [("Free Up Space failed", f"{m}/local.txt: it has changes not yet pushed; try again later", True)]
    # The binary gone: notified too.
    c._binary = str(fake.dir / "missing")
    find(p.get_file_items([F("local.txt")]), "Keep on This Device").activate()
    flavour.pump(lambda: len(notes) == 2, 5, "a second notification")
    assert notes[1][0] == "Keep on This Device failed" and "missing" in notes[1][1] and notes[1][2]


def test_show_versions_and_keep_a_version(flavour, fake):
    m, c, p = _menu_setup(flavour, fake)
    notes = c.notify
    table = ["VERSION  DEVICE            MODIFIED              SIZE        PATH",
             "current  b                 2026-11-28T14:07:27Z  4 B         /doc.txt",
             "1        a                 2026-11-28T14:07:30Z  9 B         /doc (conflicted copy a 2026-11-28 140730).txt"]
    fake.script("out-versions", *table)
    doc = flavour.file(f"{m}/doc.txt")
    p.update_file_info(doc)      # a conflicted file shown: its versions are fetched in a worker
    flavour.pump(lambda: c.versions(f"{m}/doc.txt"), 5, "the versions are cached")
    resolve = find(p.get_file_items([doc]), "Resolve Conflict")
    assert submenu_labels(resolve) == ["Keep Current Version", "Keep All Versions",
                                       "Keep Version 1 (a, 2026-11-28T14:07:30Z)"]
    find(p.get_file_items([doc]), "Show Versions").activate()
    flavour.pump(lambda: notes, 5, "the versions shown")
    title, body, error = notes[0]
    assert title == "Versions of doc.txt" and not error
    assert body.splitlines() == ["current: b, 2026-11-28T14:07:27Z, 4 B (/doc.txt)",
                                 "1: a, 2026-11-28T14:07:30Z, 9 B (/doc (conflicted copy a 2026-11-28 140730).txt)"]
    keep1 = resolve.get_property("menu").get_items()[2]
    keep1.activate()
    flavour.pump(lambda: ["resolve", f"{m}/doc.txt", "--keep", "1"] in fake.calls(), 5, "resolve --keep 1")
    # The versions changed since the menu was made: nothing is resolved, the user is told.
    fake.script("out-versions", *table[:2], "1        c                 2026-11-28T15:00:00Z  2 B         /doc (other).txt")
    resolves = len([a for a in fake.calls() if a[0] == "resolve"])
    keep1.activate()
    flavour.pump(lambda: len(notes) == 2, 5, "a notification")
    assert notes[1][0] == "Resolve Conflict failed" and "changed" in notes[1][1]
    assert len([a for a in fake.calls() if a[0] == "resolve"]) == resolves


def test_file_info_and_menus_start_nothing_and_actions_never_block(flavour, fake):
    m, c, p = _menu_setup(flavour, fake)
    if flavour.name == "gi":
        assert isinstance(c.runner, flavour.ext.GLibRunner), "the file manager's runner is GLib's"
    started, inside = [], [False]
    spawn_stream, run = c.runner.spawn_stream, c.runner.run

    def recording(real):
        def call(argv, *rest):
            if inside[0]:
                started.append(argv)
            return real(argv, *rest)
        return call

    c.runner.spawn_stream, c.runner.run = recording(spawn_stream), recording(run)
    files = [flavour.file(f"{m}/{n}", is_dir=(n == "dir")) for n in ("cloud.txt", "kept.txt", "local.txt", "doc.txt",
                                                                     "dir", "zzz")]
    inside[0] = True
    for f in files:
        p.update_file_info(f)
        p.get_file_items([f])
    p.get_file_items(files)
    p.get_background_items(files[4])
    inside[0] = False
    assert started == [], f"started from update_file_info or a menu: {started}"
    # The conflicted file's versions are fetched after that turn of the main loop.
    flavour.pump(lambda: ["versions", f"{m}/doc.txt"] in fake.calls(), 5, "the versions fetched later")
    # A slow command: the activation returns at once and the main loop keeps turning.
    fake.script("sleep-download", "1.5")
    t0 = time.monotonic()
    find(p.get_file_items([files[0]]), "Download Now").activate()
    assert time.monotonic() - t0 < 0.2, "activating a menu item waited for the command"
    slowest = 0.0
    deadline = time.monotonic() + 10
    while not any(a[0] == "query" and "--predicate" in a and a[4].endswith("cloud.txt'") for a in fake.calls()):
        t = time.monotonic()
        flavour.iterate()
        slowest = max(slowest, time.monotonic() - t)
        assert time.monotonic() < deadline, "the download and its refresh never ran"
        time.sleep(0.01)
    assert slowest < 0.2, f"a main-loop turn took {slowest:.2f}s while the command ran"
    assert ["download", f"{m}/cloud.txt"] in fake.calls()


# ---------------------------------------------------------------------------
# 2. Real mounts
# ---------------------------------------------------------------------------

SYNC_TIMEOUT = 15


def eventually(check, timeout=SYNC_TIMEOUT, interval=0.1, what=""):
    start = time.monotonic()
    while True:
        try:
            result = check()
            if result is not False:
                return result
            error = AssertionError("check returned False")
        except (AssertionError, OSError) as e:
            error = e
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout:.0f}s: {what}\nlast: {error}")
        time.sleep(interval)


def device(make_device, name, **kw):
    dev = make_device(name, mount=False, **kw)
    dev.mount_args = ("--device-name", name)
    dev.mount()
    return dev


def xattr_status(path) -> dict:
    return json.loads(os.getxattr(path, "user.ubiquity.status"))


def mount_controller(flavour, dev, **kw):
    """A controller as device `dev` (its XDG_DATA_HOME), started, its watch of `dev`'s mount ready.
    (Tests take `make_device` before the flavour: the flavour's watches end before the devices unmount.)"""
    env = {**dev.env(), "UBIQUITYFS_BIN": str(BIN)}
    c = flavour.controller(binary=str(BIN), env=env, poll_interval=0.5, **kw).start()
    flavour.pump(lambda: c.is_ready(str(dev.mountpoint)), 20, f"the watch of {dev.mountpoint} is ready")
    return c


def test_mount_placeholder_then_download_moves_the_emblem(make_device, best_flavour):
    fl = best_flavour
    a, b = device(make_device, "a"), device(make_device, "b")
    c = mount_controller(fl, b)
    p = fl.provider(c)
    (a.mountpoint / "report.txt").write_bytes(b"quarterly numbers\n" * 100)
    target = str(b.mountpoint / "report.txt")
    on_b = fl.file(target)
    fl.pump(lambda: c.status(target) is not None, SYNC_TIMEOUT, "report.txt reaches B's status map")
    assert xattr_status(target)["downloadingStatus"] == "notDownloaded", "a placeholder on B"
    assert info(p, on_b) == [EMBLEM + "cloud"]
    assert on_b.attributes[fl.ext.STATUS_ATTRIBUTE] == "In the cloud"
    # A's mount is another device's for B's environment: left alone.
    on_a = fl.file(str(a.mountpoint / "report.txt"))
    fl.pump(lambda: c.watch_state(str(a.mountpoint)) == "foreign", 10, "A's mount is seen as another device's")
    assert info(p, on_a) == [] and p.get_file_items([on_a]) == []

    seen = on_b.invalidated
    res = b.cli("download", target, timeout=60)
    assert res.returncode == 0, res
    t0 = time.monotonic()
    fl.pump(lambda: on_b.invalidated > seen and info(p, on_b) == [EMBLEM + "downloaded"], 5,
            "the downloaded emblem after `ubiquityfs download`")
    took = time.monotonic() - t0
    print(f"download -> emblem change in {took:.2f}s")
    assert took < 2, f"the emblem moved {took:.2f}s after the download"


def test_mount_cli_evict_reaches_the_emblem_live(make_device, best_flavour):
    fl = best_flavour
    a, b = device(make_device, "a"), device(make_device, "b")
    (a.mountpoint / "f.txt").write_bytes(b"x" * 1000)
    target = str(b.mountpoint / "f.txt")
    eventually(lambda: os.path.exists(target), what="f.txt reaches B")
    assert b.cli("download", target, timeout=60).returncode == 0
    c = mount_controller(fl, b)
    p = fl.provider(c)
    f = fl.file(target)
    assert info(p, f) == [EMBLEM + "downloaded"]
    assert b.cli("evict", target, timeout=60).returncode == 0
    assert xattr_status(target)["downloadingStatus"] == "notDownloaded"
    fl.pump(lambda: f.invalidated and info(p, f) == [EMBLEM + "cloud"], 3, "the cloud emblem after a CLI evict")


def test_mount_menu_actions_act_on_the_mount(make_device, best_flavour):
    fl = best_flavour
    a, b = device(make_device, "a"), device(make_device, "b")
    for name in ("one.txt", "two.txt", "three.txt"):
        (a.mountpoint / name).write_bytes(name.encode() * 500)
    B = b.mountpoint
    eventually(lambda: all(os.path.exists(B / n) for n in ("one.txt", "two.txt", "three.txt")), what="files reach B")
    c = mount_controller(fl, b)
    notes = c.notify
    p = fl.provider(c)
    one, two, three = (fl.file(str(B / n)) for n in ("one.txt", "two.txt", "three.txt"))
    fl.pump(lambda: all(info(p, f) == [EMBLEM + "cloud"] for f in (one, two, three)), SYNC_TIMEOUT, "placeholders")

    def settle(f, emblems, xattr_check, what):
        fl.pump(lambda: info(p, f) == emblems and xattr_check(xattr_status(f.path)), 10, what)

    # Multi-selection: Download Now on two files downloads both.
    find(p.get_file_items([one, two]), "Download Now").activate()
    for f in (one, two):
        settle(f, [EMBLEM + "downloaded"], lambda s: s["downloadingStatus"] == "current", f"{f.path} downloaded")
    assert xattr_status(three.path)["downloadingStatus"] == "notDownloaded", "only the selection"
    # Keep on This Device, Stop Keeping.
    find(p.get_file_items([three]), "Keep on This Device").activate()
    settle(three, [EMBLEM + "pinned"], lambda s: s["pinned"] and s["downloadingStatus"] == "current", "three.txt kept")
    assert labels(p.get_file_items([three])) == ["Free Up Space", "Stop Keeping on This Device", "Show Versions"]
    find(p.get_file_items([three]), "Stop Keeping on This Device").activate()
    settle(three, [EMBLEM + "downloaded"], lambda s: not s["pinned"], "three.txt no longer kept")
    # Free Up Space: a placeholder again, on the mount and in the emblem.
    find(p.get_file_items([one, three]), "Free Up Space").activate()
    for f in (one, three):
        settle(f, [EMBLEM + "cloud"], lambda s: s["downloadingStatus"] == "notDownloaded", f"{f.path} freed")
    assert (B / "one.txt").read_bytes() == b"one.txt" * 500, "the content comes back when read"
    assert notes == []
    # A refusal is notified: evicting a file open for writing.
    with open(B / "two.txt", "r+b") as held:
        held.write(b"X")
        held.flush()
        find(p.get_file_items([two]), "Free Up Space").activate()
        fl.pump(lambda: notes, 15, "the refusal is notified")
    title, body, error = notes[0]
    assert title == "Free Up Space failed" and error and "two.txt" in body and "Traceback" not in body, notes


def test_mount_conflict_offers_resolve_and_resolves(make_device, store, tmp_path, best_flavour):
    fl = best_flavour
    if isinstance(store, mount_conftest.S3StoreRef):
        pytest.skip("the conflict is made by cutting a folder store's symlink")
    link = tmp_path / "store-link"
    os.symlink(store, link)
    a = device(make_device, "a")
    b = device(make_device, "b", store=link)
    A, B = a.mountpoint, b.mountpoint
    (A / "doc.txt").write_bytes(b"base\n")
    eventually(lambda: (B / "doc.txt").read_bytes() == b"base\n", what="doc.txt reaches B")
    try:
        os.unlink(link)
        eventually(lambda: json.loads(b.cli("status", B, "--json", timeout=30).stdout.splitlines()[0])["storeReachable"]
                   is False, 10, 0.2, "B offline")
        (A / "doc.txt").write_bytes(b"edited on a\n")
        (B / "doc.txt").write_bytes(b"edited on b, longer\n")
        eventually(lambda: json.loads(a.cli("status", A, "--json", timeout=30).stdout.splitlines()[0])["pendingItems"]
                   == 0, 30, 0.2, "A pushed")
        time.sleep(0.5)
    finally:
        if not os.path.lexists(link):
            os.symlink(store, link)

    def copies():
        names = os.listdir(A)
        conflicted = [n for n in names if n.startswith("doc (conflicted copy")]
        assert len(conflicted) == 1 and "doc.txt" in names, names
        return conflicted[0]

    copy = eventually(copies, 30, 0.25, "A shows doc.txt and one conflicted copy")
    eventually(lambda: os.getxattr(A / "doc.txt", "user.ubiquity.conflicts") == b"1", what="the conflict on A")
    c = mount_controller(fl, a)
    notes = c.notify
    p = fl.provider(c)
    doc = fl.file(str(A / "doc.txt"))
    fl.pump(lambda: info(p, doc) == [EMBLEM + "conflict"], 10, "the conflict emblem")
    assert doc.attributes[fl.ext.STATUS_ATTRIBUTE] == "Conflicting versions"
    fl.pump(lambda: c.versions(doc.path), 10, "the versions fetched in the background")
    resolve = find(p.get_file_items([doc]), "Resolve Conflict")
    offered = submenu_labels(resolve)
    assert offered[:2] == ["Keep Current Version", "Keep All Versions"]
    assert len(offered) == 3 and offered[2].startswith("Keep Version 1 ("), offered
    find(p.get_file_items([doc]), "Show Versions").activate()
    fl.pump(lambda: notes, 10, "the versions shown")
    assert notes[0][0] == "Versions of doc.txt" and copy in notes[0][1] and "current" in notes[0][1], notes
    kept = (A / "doc.txt").read_bytes()
    for sub in resolve.get_property("menu").get_items():
        if sub.get_property("label") == "Keep Current Version":
            sub.activate()
    eventually(lambda: sorted(os.listdir(A)) == ["doc.txt"], 15, 0.2, "the conflicted copy is deleted")
    assert (A / "doc.txt").read_bytes() == kept
    fl.pump(lambda: info(p, doc) == [EMBLEM + "downloaded"], 10, "the conflict emblem leaves")
    assert "Resolve Conflict" not in labels(p.get_file_items([doc]))
    eventually(lambda: sorted(os.listdir(B)) == ["doc.txt"], 20, 0.2, "the resolution reaches B")
    assert len(notes) == 1, notes


# ---------------------------------------------------------------------------
# 3. Real Nautilus
# ---------------------------------------------------------------------------


def _descendants(pid: int) -> list[int]:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    data = f.read()
                ppid = int(data[data.rfind(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def test_real_nautilus_loads_the_extension(make_device, tmp_path):
    missing = [t for t in ("nautilus", "xvfb-run", "xauth", "dbus-run-session") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (packages nautilus, xvfb, xauth, dbus)")
    if not list(Path("/usr/lib").glob("*/nautilus/extensions-4/libnautilus-python.so")):
        pytest.skip("nautilus-python 4 is not installed (package python3-nautilus)")
    home = tmp_path / "home"
    data_home = home / ".local" / "share"
    data_home.mkdir(parents=True)
    # The device's data home is the temporary HOME's: the extension inside
    # Nautilus (default XDG_DATA_HOME) is this device.
    b = make_device("b", data_home=data_home)
    (b.mountpoint / "hello.txt").write_text("hello\n")
    (b.mountpoint / "folder").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYENV", "VIRTUAL_ENV", "XDG_", "DISPLAY",
                                                                       "WAYLAND", "DBUS_"))}
    # The system's python3 first: nautilus-python's embedded interpreter finds
    # its prefix through PATH, and a pyenv/venv python3 there hides PyGObject.
    env.update(HOME=str(home), LANG="C.UTF-8", LC_ALL="C.UTF-8", XDG_DATA_HOME=str(data_home),
               PATH="/usr/bin:/bin:/usr/sbin:/sbin:" + env.get("PATH", ""))
    installed = subprocess.run(["bash", str(REPO / "Packaging/nautilus/install.sh"), "--user"], env=env,
                               capture_output=True, text=True, timeout=60)
    assert installed.returncode == 0, installed.stderr
    assert (data_home / "nautilus-python/extensions/ubiquityfs_nautilus.py").read_bytes() == EXTENSION.read_bytes()
    assert (data_home / "icons/hicolor/scalable/emblems/emblem-ubiquityfs-cloud.svg").exists()
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    env.update(UBIQUITYFS_NAUTILUS_DEBUG="1", UBIQUITYFS_BIN=str(BIN), GDK_BACKEND="x11", GSK_RENDERER="cairo",
               NO_AT_BRIDGE="1", GTK_A11Y="none", XDG_RUNTIME_DIR=str(runtime), XDG_CONFIG_HOME=str(home / ".config"),
               XDG_CACHE_HOME=str(home / ".cache"))
    log = tmp_path / "nautilus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["xvfb-run", "-a", "dbus-run-session", "--", "nautilus", "--new-window",
                                 str(b.mountpoint)], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    text = ""
    try:
        deadline = time.monotonic() + 45
        wanted = [f"update_file_info {b.mountpoint}/hello.txt: ['{EMBLEM}downloaded']",
                  f"update_file_info {b.mountpoint}/folder: []"]
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            if all(w in text for w in wanted) or proc.poll() is not None or \
                    "Traceback" in text or "nautilus_python_init_python failed" in text:
                break
            time.sleep(0.2)
        nautilus = [pid for pid in _descendants(proc.pid) if _comm(pid) == "nautilus"]
        watches = [pid for pid in _descendants(proc.pid) if "query" in mount_conftest._cmdline(pid)]
    finally:
        # Nautilus by its PID; xvfb-run and dbus-run-session then end their X server and bus.
        for pid in [pid for pid in _descendants(proc.pid) if _comm(pid) == "nautilus"]:
            os.kill(pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            for pid in reversed(_descendants(proc.pid)):
                os.kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    tail = "\n".join(text.splitlines()[-40:])
    assert "ubiquityfs-nautilus: loaded" in text, f"the extension did not load:\n{tail}"
    assert "ubiquityfs-nautilus: extension ready in Nautilus 4.0" in text, tail
    assert "Traceback" not in text, f"a Python traceback in Nautilus's output:\n{text[-4000:]}"
    assert nautilus, f"nautilus was not running:\n{tail}"
    for w in wanted:
        assert w in text, f"missing {w!r}:\n{tail}"
    assert watches, "no `ubiquityfs query --watch` under Nautilus"
    # The watch process ends with Nautilus (setpriv --pdeathsig).
    assert all(mount_conftest.wait_pid_exit(pid, 10) for pid in watches), f"watch processes left: {watches}"
