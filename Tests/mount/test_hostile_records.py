"""Hostile and damaged journal records on real mounts (issue #8 part 2).

Two devices (own XDG_DATA_HOME each) mount the drive of one folder store. The
test writes records straight into the store's journal as the next number, the
way a hostile or broken client would (published with link(2), so no reader
sees half a file), then checks on both devices that:

* the root still lists, with no bogus entry (`ls -a` exactly as expected,
  every name stat-able);
* `status --json` reports the record in `quarantinedRecords` with its number
  and a reason naming the problem;
* sync goes on: a file made on device A after it reaches device B.

The cases are grouped by kind (names, fields, whole records, references), one
mount session per group, to keep the run short; a group stops at its first
failing case (the others would only time out behind it). Then: the committer
of the next number skips a bad record (a device offline while it is written
commits after it, without touching it), and a quarantine survives a remount
and is logged once.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from test_sync import StoreLink, eventually, new_device, read, status_json, wait_offline, write

pytestmark = pytest.mark.daemon

CONTAINER = "com.ubiquityfs.default"
HOSTILE_DEVICE = "0badc0de-0000-4000-8000-00000000beef"
NOW = 1_700_000_000_000_000_000
# Seconds within which both devices must have seen a record (they are woken by
# inotify, and poll every second regardless).
SEEN_TIMEOUT = 10


def new_id() -> str:
    return str(uuid.uuid4())


def node(id, kind="file", **fields) -> dict:
    n = {"op": "node", "id": id, "kind": kind, "mode": 0o644, "uid": 0, "gid": 0, "size": 0, "rdev": 0,
         "mtime": NOW, "ctime": NOW, "btime": NOW, "xattrs": {}, "base": 0}
    n.update(fields)
    return {k: v for k, v in n.items() if v is not None}


def entry(name, child, parent="root") -> dict:
    e = {"op": "entry", "parent": parent, "name": name}
    if child is not None:
        e["child"] = child
    return e


def record(*changes, **top) -> bytes:
    r = {"version": 1, "device": HOSTILE_DEVICE, "deviceName": "hostile", "date": NOW, "changes": list(changes)}
    r.update(top)
    return json.dumps({k: v for k, v in r.items() if v is not None}).encode()


def new_file_named(name, **fields) -> bytes:
    """A record making an empty file `name` at the root, with `fields` changed."""
    id = new_id()
    return record(node(id, **fields), entry(name, id))


def b64(data: bytes) -> dict:
    return {"base64": base64.b64encode(data).decode()}


# --------------------------------------------------------------------------
# The store's journal, as a hostile client sees it
# --------------------------------------------------------------------------


class Journal:
    def __init__(self, store: Path):
        self.store = store
        self.dir = store / "containers" / CONTAINER / "journal"
        self.written: dict[int, bytes] = {}

    def head(self) -> int:
        return max((int(n) for n in os.listdir(self.dir) if n.isdigit()), default=0)

    def path(self, seq: int) -> Path:
        return self.dir / f"{seq:016d}"

    def publish(self, data: bytes | None = None, *, make=None) -> int:
        """Put `data` (or what `make(path)` creates) at the next free number."""
        while True:
            seq = self.head() + 1
            target = self.path(seq)
            try:
                if make is not None:
                    make(target)
                else:
                    tmp = self.store / "tmp" / f"hostile-{uuid.uuid4()}"
                    tmp.write_bytes(data)
                    try:
                        os.link(tmp, target)
                    finally:
                        os.unlink(tmp)
                    self.written[seq] = data
                return seq
            except FileExistsError:
                continue   # a device committed meanwhile: take the next number

    def ids(self) -> dict[str, str]:
        """Name at the root -> node ID, from the valid records."""
        names: dict[str, str] = {}
        for seq in range(1, self.head() + 1):
            try:
                changes = json.loads(self.path(seq).read_bytes())["changes"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            for c in changes if isinstance(changes, list) else []:
                if isinstance(c, dict) and c.get("op") == "entry" and c.get("parent") == "root" and isinstance(c.get("name"), str):
                    if c.get("child"):
                        names[c["name"]] = c["child"]
                    else:
                        names.pop(c["name"], None)
        return names

    def untouched(self) -> list[str]:
        """Records this test wrote that are no longer what it wrote."""
        bad = []
        for seq, data in self.written.items():
            try:
                now = self.path(seq).read_bytes()
            except OSError as e:
                bad.append(f"record {seq}: {e}")
                continue
            if now != data:
                bad.append(f"record {seq} was overwritten: {now[:80]!r}")
        return bad


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


def listing(dev) -> list[str]:
    """`ls -a` of the device's root, in order (an extra `.` would show)."""
    res = subprocess.run(["ls", "-1a", str(dev.mountpoint)], capture_output=True, timeout=30)
    assert res.returncode == 0, f"{dev.name}: ls of the root failed: {res.stderr.decode(errors='replace').strip()}"
    return sorted(os.fsdecode(n) for n in res.stdout.split(b"\n") if n)


def quarantined(dev) -> list[dict]:
    return status_json(dev).get("quarantinedRecords", [])


class Session:
    """Two mounted devices and what their roots must list."""

    def __init__(self, make_device, store: Path, b_store=None):
        self.a = new_device(make_device, "a")
        self.b = new_device(make_device, "b", store=b_store)
        self.journal = Journal(store)
        self.names: set[str] = set()
        self.passed = 0

    def put(self, name: str, data: bytes) -> None:
        """Write `name` on A and wait until B has it."""
        write(self.a.mountpoint / name, data)
        self.names.add(name)
        b = self.b.mountpoint / name

        def arrived():
            assert read(b) == data, f"{name} on B: {read(b)[:40]!r}"

        eventually(arrived, SEEN_TIMEOUT, 0.1, f"{name}, written on A, reaches B")

    def check_root(self) -> None:
        expected = sorted([".", ".."] + list(self.names))
        for dev in (self.a, self.b):
            names = listing(dev)
            assert names == expected, f"{dev.name}'s root lists {names}, expected {expected}"
            for name in names:
                os.lstat(dev.mountpoint / name)

    def expect_quarantined(self, seq: int, reason: str) -> None:
        for dev in (self.a, self.b):
            def seen():
                records = quarantined(dev)
                match = [r for r in records if r.get("seq") == seq]
                assert match, f"record {seq} not in {dev.name}'s quarantinedRecords: {records}"
                assert match[0].get("container") == CONTAINER, match[0]
                assert reason in match[0].get("reason", ""), f"reason {match[0].get('reason')!r} does not say {reason!r}"

            eventually(seen, SEEN_TIMEOUT, 0.1, f"{dev.name} quarantines record {seq}")

    def case(self, label: str, reason: str, data: bytes | None = None, *, make=None) -> int:
        """Publish one bad record, check both devices, and that sync goes on."""
        seq = self.journal.publish(data, make=make)
        try:
            # A's file is committed after the record, so once B has it both
            # devices are past the record.
            self.put(f"after-{seq}.txt", f"made after record {seq} ({label})\n".encode())
            self.check_root()
            self.expect_quarantined(seq, reason)
        except AssertionError as e:
            raise AssertionError(f"case {label!r} (record {seq}), after {self.passed} cases passed:\n{e}") from None
        self.passed += 1
        return seq

    def run(self, cases) -> None:
        for label, reason, data in cases:
            self.case(label, reason, data)
        assert not self.journal.untouched()


@pytest.fixture
def store_link(make_device, tmp_path, store):
    link = StoreLink(tmp_path / "store-link", store)
    yield link
    link.restore()


# --------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------


def test_bad_names_are_quarantined(make_device, store):
    s = Session(make_device, store)
    s.put("seed.txt", b"seed\n")
    s.run([
        ("name a/b", "entry name contains '/'", new_file_named("a/b")),
        ("empty name", "entry name is empty", new_file_named("")),
        ("name .", "entry name is '.'", new_file_named(".")),
        ("name ..", "entry name is '..'", new_file_named("..")),
        ("256-byte name", "entry name is 256 bytes (at most 255)", new_file_named("n" * 256)),
        ("name with NUL", "entry name contains NUL", new_file_named("x\0y")),
        ("base64 name with /", "entry name contains '/'", new_file_named(b64(b"x/y"))),
        ("base64 name of 256 bytes", "entry name is 256 bytes", new_file_named(b64(b"\xff" * 256))),
    ])


def test_bad_fields_are_quarantined(make_device, store):
    s = Session(make_device, store)
    s.put("seed.txt", b"seed\n")
    id = new_id()
    s.run([
        ("negative size", "size: -5 is negative", new_file_named("neg", size=-5)),
        ("huge size", "is larger than 1125899906842624", new_file_named("huge", size=2**64 - 1, hash="a" * 64)),
        ("bad hash", "is not 64 lower-case hex digits", new_file_named("hash", size=5, hash="xyz")),
        ("size without content", "size 5 with no content hash", new_file_named("nohash", size=5)),
        ("directory bits on a file", "mode 40755 has bits beyond the permissions", new_file_named("mode", mode=0o040755)),
        ("unknown kind", "unknown kind \"whiteout\"", new_file_named("kind", kind="whiteout")),
        ("malformed node ID", "ID is not well-formed", record(node("../../etc"), entry("id", "../../etc"))),
        ("symlink with NUL", "symlink target contains NUL",
         record(node(id, kind="symlink", mode=0o777, size=3, target="a\0b"), entry("link", id))),
        ("xattr outside user.*", "is not in the user.* namespace",
         new_file_named("xattr", xattrs={"security.selinux": base64.b64encode(b"x").decode()})),
        ("base not earlier", "is not an earlier record", new_file_named("base", base=10**9)),
        ("bad device name", "device name contains a control character",
         record(node(id), entry("devname", id), deviceName="evil\x1b[2J")),
        ("pack beyond 4 MiB", "lie beyond the largest pack",
         record(node(new_id(), size=5, hash="a" * 64, pack={"hash": "b" * 64, "offset": 4 * 2**20 - 2}), version=2)),
        ("pack in a version 1 record", "record version 1 cannot name packs",
         record(node(new_id(), size=5, hash="a" * 64, pack={"hash": "b" * 64, "offset": 0}))),
        ("pack on a chunked file", "only a file's unchunked content can be in a pack",
         record(node(new_id(), size=5, hash="a" * 64, chunked=True, pack={"hash": "b" * 64, "offset": 0}), version=2)),
    ])


def test_damaged_records_are_quarantined_and_logged_once(make_device, store):
    s = Session(make_device, store)
    s.put("seed.txt", b"seed\n")
    valid = new_file_named("truncated")
    id = new_id()
    seqs = []
    for label, reason, data in [
        ("invalid JSON", "not valid JSON", b"this is not JSON at all"),
        ("truncated JSON", "not valid JSON", valid[: len(valid) // 2]),
        ("empty file", "not valid JSON", b""),
        ("record version 3", "record version 3 is not supported", record(node(id), entry("v3", id), version=3)),
        ("not an object", "not a JSON object", b"[1, 2, 3]"),
        ("missing changes", "missing field changes", record(changes=None)),
    ]:
        seqs.append(s.case(label, reason, data))
    seqs.append(s.case("a folder at the number", "not a regular file", make=lambda p: os.mkdir(p)))
    seqs.append(s.case("a symlink at the number", "a symbolic link, not a file",
                       make=lambda p: os.symlink("/etc/hostname", p)))
    assert not s.journal.untouched()

    # The text status says it too.
    res = s.b.cli("status", s.b.mountpoint, timeout=30)
    assert res.returncode == 0, res
    assert f"Quarantined:  record {seqs[0]} of {CONTAINER}: not valid JSON" in res.stdout, res.stdout

    # Logged once each, however many polls since; a remount neither tries them
    # again nor forgets them.
    time.sleep(2.5)
    s.b.remount()
    assert sorted(r["seq"] for r in quarantined(s.b)) == sorted(seqs)
    s.put("after-remount.txt", b"still syncing\n")
    s.check_root()
    for dev in (s.a, s.b):
        log = "\n".join(p.read_text(errors="replace") for p in Path(dev.data_home).rglob("daemon.log"))
        for seq in seqs:
            lines = [l for l in log.splitlines() if f"quarantined journal record {seq} of {CONTAINER}" in l]
            assert len(lines) == 1, f"{dev.name}'s log has {len(lines)} lines for record {seq}: {lines}"


def test_records_referring_to_what_is_not_there_are_quarantined(make_device, store):
    s = Session(make_device, store)
    s.put("victim.txt", b"must survive\n")
    os.mkdir(s.a.mountpoint / "folder")
    s.names.add("folder")
    eventually(lambda: os.stat(s.b.mountpoint / "folder"), SEEN_TIMEOUT, 0.1, "folder reaches B")
    ids = s.journal.ids()
    victim, folder = ids["victim.txt"], ids["folder"]
    unknown = new_id()
    id = new_id()
    s.run([
        ("unknown parent", f"entry parent {unknown} is not a known folder",
         record(node(id), entry("orphan", id), entry("orphan", id, parent=unknown))),
        ("unknown child over a file", "entry child 0badc0de-0000-4000-8000-000000000000 is not a known node",
         record(entry("victim.txt", "0badc0de-0000-4000-8000-000000000000"))),
        ("entry inside a file", f"entry parent {victim} is a file, not a folder",
         record(node(id), entry("inside", id, parent=victim))),
        ("a folder made a file", f"node {folder} is a directory here, the record makes it a file",
         record(node(folder, base=1))),
        ("the root as a child", "entry names the root as a child", record(entry("loop", "root", parent=folder))),
        ("the root deleted", "deletes the root", record({"op": "delete", "id": "root", "base": 1})),
        ("the root made a file", "the root must be a directory", record(node("root"))),
    ])
    for dev in (s.a, s.b):
        assert read(dev.mountpoint / "victim.txt") == b"must survive\n"

    # A valid record that would put two folders inside each other: not
    # quarantined; the applier breaks the cycle and both stay reachable.
    os.mkdir(s.a.mountpoint / "x")
    os.mkdir(s.a.mountpoint / "y")
    write(s.a.mountpoint / "x" / "in-x", b"x\n")
    write(s.a.mountpoint / "y" / "in-y", b"y\n")
    eventually(lambda: read(s.b.mountpoint / "y" / "in-y"), SEEN_TIMEOUT, 0.1, "x and y reach B")
    ids = s.journal.ids()
    x, y = ids["x"], ids["y"]
    before = {r["seq"] for r in quarantined(s.b)}
    seq = s.journal.publish(record(entry("x", None), entry("y", None), entry("y", y, parent=x), entry("x", x, parent=y)))

    def cycle_broken(dev):
        def check():
            found = {}
            for dirpath, _, files in os.walk(dev.mountpoint):
                for f in files:
                    found[f] = os.path.relpath(os.path.join(dirpath, f), dev.mountpoint)
            assert "in-x" in found and "in-y" in found, f"{dev.name}: {found}"
            assert "x" not in os.listdir(dev.mountpoint) or "y" not in os.listdir(dev.mountpoint), "record not applied"
        return check

    for dev in (s.a, s.b):
        eventually(cycle_broken(dev), SEEN_TIMEOUT, 0.2, f"{dev.name} applies record {seq} without a cycle")
        assert {r["seq"] for r in quarantined(dev)} <= before, f"{dev.name} quarantined the valid record {seq}"
    s.names.discard("x")
    s.names.discard("y")
    s.put("after-cycle.txt", b"after the cycle\n")
    assert not s.journal.untouched()


def test_the_next_commit_skips_a_bad_record(make_device, store, store_link):
    """B is offline while a bad record takes the number B will commit next:
    back online, B's commit loses, B quarantines the record and commits after
    it; the record is left as it was, and A gets B's file."""
    s = Session(make_device, store, b_store=store_link.path)
    s.put("seed.txt", b"seed\n")
    store_link.cut()
    wait_offline(s.b)
    write(s.b.mountpoint / "offline.txt", b"written offline\n")
    s.names.add("offline.txt")
    bad = s.journal.publish(new_file_named("a/b"))
    time.sleep(0.5)
    store_link.restore()

    def arrived():
        assert read(s.a.mountpoint / "offline.txt") == b"written offline\n"

    eventually(arrived, SEEN_TIMEOUT, 0.2, "B's offline file reaches A")
    s.expect_quarantined(bad, "entry name contains '/'")
    assert not s.journal.untouched()
    assert s.journal.head() > bad, "B committed after the bad record"
    s.put("after.txt", b"after\n")
    s.check_root()
