"""Power cuts: what fsync covers survives, what it does not is whole or absent.

Issue #39 item 5, tested the way Jepsen tests databases: the device's replica
(its data home: the index, the operation log, the cache files) lives on
Tests/powercut/lazyfs.py, a filesystem that keeps every file's data written
since its last fsync apart and throws it away on command. A cut here is:
`kill -9` of the daemon, a lazy unmount of its dead mount, then lazyfs drops
every unsynced write; the device then mounts again from what was left. The
store is an ordinary folder outside lazyfs (another machine, in effect).

After the cut, as on ext4:
- a file written and fsynced (its folder fsynced too) is there under its name, whole;
- an editor's atomic save (write a temporary file, fsync, rename over, fsync
  the folder) shows the new content;
- SQLite (rollback journal, and WAL, both synchronous=FULL) has every
  committed row and passes integrity_check;
- git (core.fsync=all) passes fsck --full and shows every commit;
- what was written without fsync is, under its name, either absent or whole:
  the old content or the new one, never a mix, never zeros in the middle
  (a file being rewritten may become a recovered copy beside it: SEMANTICS.md,
  "A crash during a rewrite never replaces the good version");
- what was pushed before the cut is back on the device (the store and the
  other devices have it: losing it here for good is a divergence);
- the daemon still reads large cache files by FUSE passthrough on lazyfs.

`test_harness_*` prove lazyfs has teeth: written straight to it without fsync
is lost by a cut, fsynced is not.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import run
from test_passthrough import drop_caches, need_passthrough, passing_through, reads_reaching, tracefs  # noqa: F401
from test_sync import eventually, store_link, wait_offline, wait_pushed  # noqa: F401 (store_link: a fixture)

pytestmark = pytest.mark.daemon

KiB = 1 << 10
MiB = 1 << 20


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def fsync_path(path, *, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    """Write `path`, fsync it and its folder (durable, as on ext4)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_path(path.parent, directory=True)


def fsync_tree(top: Path) -> None:
    """fsync every file and folder at and below `top`, and `top`'s folder."""
    for folder, _, files in os.walk(top):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder, directory=True)
    fsync_path(top.parent, directory=True)


def write_unsynced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def pattern(tag: str, size: int) -> bytes:
    """`size` bytes of `tag` repeated in lines: two tags' contents mixed equal neither."""
    line = (tag * 64)[:63].encode() + b"\n"
    return (line * (size // len(line) + 1))[:size]


def power_cut(dev, lazy) -> dict:
    """kill -9 the daemon, detach its dead mount, drop every unsynced write, mount
    again, as after a restart of the machine (another boot: the daemon plays back
    its journaled fsyncs and checks its local copies)."""
    dev.kill9()
    result = lazy.cut()
    print("lazyfs cut reverted:", *(f"  {f['path']}: {f['size']} -> {f['durable_size']} bytes" for f in result["files"]),
          sep="\n")   # shown with a failure
    power_cut.boots += 1
    dev.mount_env = {**(dev.mount_env or {}), "UBIQUITYFS_TEST_BOOT_ID": f"after-cut-{power_cut.boots}"}
    dev.mount()
    return result


power_cut.boots = 0


@pytest.fixture
def lazy_device(lazyfs, make_device):
    """A mounted device whose data home (its replica) is on lazyfs; (device, lazyfs)."""
    dev = make_device("a", data_home=lazyfs.mountpoint / "data")
    return dev, lazyfs


def daemon_log(dev) -> str:
    logs = list(Path(dev.data_home, "ubiquityfs", "replicas").glob("*/daemon.log"))
    return "\n".join(p.read_text(errors="replace") for p in logs)


# --------------------------------------------------------------------------
# The harness itself
# --------------------------------------------------------------------------


def test_harness_loses_unsynced_data_and_keeps_synced(lazyfs):
    root = lazyfs.mountpoint
    (root / "dir").mkdir()
    write_synced(root / "dir/old.txt", b"old content\n")
    write_synced(root / "dir/synced.txt", b"synced\n")
    write_unsynced(root / "dir/new.txt", b"never synced\n")
    write_unsynced(root / "dir/old.txt", b"rewritten, not synced\n")
    big = random.Random(1).randbytes(3 * 1024 * KiB)
    write_synced(root / "big.bin", big)
    with open(root / "big.bin", "r+b") as f:        # overwrite the middle, then cut it short
        f.seek(1024 * KiB)
        f.write(b"\xff" * 300 * KiB)
        f.truncate(2 * 1024 * KiB)
    fd = os.open(root / "dir/synced.txt", os.O_WRONLY | os.O_APPEND)
    os.write(fd, b"appended and synced\n")
    os.fdatasync(fd)
    os.close(fd)
    assert lazyfs.status()["unsynced_files"] == 3

    result = lazyfs.cut()

    assert result["reverted"] == 3, result
    assert (root / "dir/old.txt").read_bytes() == b"old content\n"
    assert (root / "dir/synced.txt").read_bytes() == b"synced\nappended and synced\n"
    assert (root / "dir/new.txt").read_bytes() == b"", "a file never fsynced keeps its name (metadata) but no data"
    assert (root / "big.bin").read_bytes() == big
    assert lazyfs.status()["unsynced_files"] == 0


def test_harness_sqlite_without_sync_loses_commits(lazyfs, tmp_path):
    """SQLite directly on lazyfs: synchronous=FULL keeps every commit, OFF loses them."""
    counts = {}
    for sync in ("FULL", "OFF"):
        db = lazyfs.mountpoint / f"{sync}.db"
        sqlite_commits(db, "delete", sync, 20)
        lazyfs.cut()
        counts[sync] = sqlite_rows(db)
    assert counts["FULL"] == (20, "ok")
    assert counts["OFF"][0] < 20, counts


class FileModel:
    """Files written, cut and synced at random, with what each holds now and
    what it held at its last fsync: after a power cut, every file must hold
    exactly the latter."""

    def __init__(self, names, rng, sizes):
        self.names, self.rng, self.sizes = names, rng, sizes
        self.current = {p: b"" for p in names}
        self.durable = dict(self.current)
        self.fds = {}

    def open(self, flags=os.O_RDWR):
        self.fds = {p: os.open(p, flags, 0o644) for p in self.names}

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def step(self) -> bool:
        """One random write, truncation or sync; False: time for a cut."""
        p, op = self.rng.choice(self.names), self.rng.random()
        if op < 0.55:
            size = self.sizes(self.rng)
            off = self.rng.randrange(0, len(self.current[p]) + 4 * KiB)
            data = self.rng.randbytes(size)
            os.pwrite(self.fds[p], data, off)
            old = self.current[p]
            self.current[p] = old[:off].ljust(off, b"\0") + data + old[off + size:]
        elif op < 0.67:
            size = self.rng.randrange(0, len(self.current[p]) + 16 * KiB)
            os.ftruncate(self.fds[p], size)
            self.current[p] = self.current[p][:size].ljust(size, b"\0")
        elif op < 0.92:
            (os.fdatasync if self.rng.random() < 0.5 else os.fsync)(self.fds[p])
            self.durable[p] = self.current[p]
        else:
            return False
        return True

    def check_after_cut(self, step: int) -> None:
        self.current = dict(self.durable)
        for q in self.names:
            got = os.pread(self.fds[q], 1 << 30, 0)
            assert got == self.durable[q], (
                f"step {step}: {q.name} is not what it was at its last fsync "
                f"({len(got)} bytes, {len(self.durable[q])} synced)")


def test_harness_matches_a_model_of_a_power_cut(lazyfs):
    """Random writes, truncations, fsyncs and cuts on a few files straight on
    lazyfs, against the model: after each cut every file holds exactly what
    it held at its last fsync (empty if never fsynced)."""
    model = FileModel([lazyfs.mountpoint / f"m{i}.bin" for i in range(3)], random.Random(5),
                      lambda rng: rng.randrange(1, 150 * KiB))
    model.open(os.O_RDWR | os.O_CREAT)
    try:
        for step in range(400):
            if not model.step():
                lazyfs.cut()
                model.check_after_cut(step)
    finally:
        model.close()


# --------------------------------------------------------------------------
# Through the mount
# --------------------------------------------------------------------------


def test_fsynced_file_survives_under_its_name(lazy_device):
    dev, lazy = lazy_device
    root = Path(dev.mountpoint)
    (root / "docs").mkdir()
    fsync_path(root, directory=True)
    small = random.Random(2).randbytes(200 * KiB)
    large = random.Random(3).randbytes(3 * MiB + 17)
    write_synced(root / "docs/report.bin", small)
    write_synced(root / "docs/large.bin", large)
    # Small changes are journaled (their bytes go into the operation log):
    # a new note, and a log appended to and fdatasynced line by line.
    note = b"a short note\n" * 40
    write_synced(root / "docs/note.txt", note)
    lines = [f"entry {i}\n".encode() * 30 for i in range(12)]
    fd = os.open(root / "docs/app.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for line in lines:
            os.write(fd, line)
            os.fdatasync(fd)
        os.write(fd, b"never synced\n")
    finally:
        os.close(fd)

    power_cut(dev, lazy)

    assert sorted(os.listdir(root)) == ["docs"]
    assert sorted(os.listdir(root / "docs")) == ["app.log", "large.bin", "note.txt", "report.bin"]
    assert (root / "docs/report.bin").read_bytes() == small
    assert (root / "docs/large.bin").read_bytes() == large
    assert (root / "docs/note.txt").read_bytes() == note
    got = (root / "docs/app.log").read_bytes()
    assert got in (b"".join(lines), b"".join(lines) + b"never synced\n"), got[-80:]
    assert "played back the journaled fsyncs of" in daemon_log(dev), "the journaled path was not taken"


def test_every_file_is_as_its_last_fsync_left_it_after_each_cut(lazyfs, make_device, store_link):
    """The model through the mount, under power cuts: random writes,
    truncations and fsyncs on a few files (small changes are journaled in the
    operation log, big ones sync the cache file), a cut now and then; after
    each, every file is exactly what it was at its last fsync. The store is
    cut off, so nothing is pushed: no version on the store side can stand in
    for one the replica lost."""
    dev = make_device("a", store=store_link.path, data_home=lazyfs.mountpoint / "data")
    store_link.cut()
    wait_offline(dev)
    root = Path(dev.mountpoint)
    model = FileModel([root / f"f{i}.bin" for i in range(3)], random.Random(7),
                      lambda rng: rng.choice([rng.randrange(1, 600), rng.randrange(1, 20 * KiB),
                                              rng.randrange(1, 200 * KiB)]))
    for p in model.names:
        write_synced(p, b"")
    model.open()
    played = 0   # (read after each remount: the next cut may take the daemon's log with it)
    try:
        for step in range(160):
            if not model.step():
                model.close()
                power_cut(dev, lazyfs)
                wait_offline(dev)
                played += "played back the journaled fsyncs of" in daemon_log(dev)
                model.open()
                model.check_after_cut(step)
    finally:
        model.close()
    assert played, "no cut found journaled content to play back"


def test_editor_atomic_save_survives(lazy_device):
    dev, lazy = lazy_device
    root = Path(dev.mountpoint)
    write_synced(root / "notes.txt", b"first version\n")
    new = pattern("second version ", 40 * KiB)
    write_synced(root / "notes.txt.tmp", new)
    os.rename(root / "notes.txt.tmp", root / "notes.txt")
    fsync_path(root, directory=True)

    power_cut(dev, lazy)

    assert (root / "notes.txt").read_bytes() == new
    assert not (root / "notes.txt.tmp").exists()


def sqlite_commits(path: Path, journal: str, synchronous: str, n: int) -> None:
    """`n` committed transactions in a child process that then dies without
    closing the database (no checkpoint, no cleanup, as at a power cut)."""
    script = f"""
import os, sqlite3
db = sqlite3.connect({str(path)!r}, isolation_level=None)
assert db.execute("PRAGMA journal_mode={journal}").fetchone()[0] == {journal!r}
db.execute("PRAGMA synchronous={synchronous}")
db.execute("CREATE TABLE IF NOT EXISTS t(i INTEGER PRIMARY KEY, v BLOB)")
for i in range({n}):
    db.execute("BEGIN")
    db.execute("INSERT INTO t VALUES (?, randomblob(3000))", (i,))
    db.execute("COMMIT")
os._exit(0)
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def sqlite_rows(path: Path) -> tuple[int, str]:
    """(rows in t, integrity_check's first line); no table t counts as 0 rows."""
    import sqlite3
    db = sqlite3.connect(path)
    try:
        integrity = db.execute("PRAGMA integrity_check").fetchone()[0]
        has_table = db.execute("SELECT count(*) FROM sqlite_master WHERE name = 't'").fetchone()[0]
        return (db.execute("SELECT count(*) FROM t").fetchone()[0] if has_table else 0), integrity
    finally:
        db.close()


@pytest.mark.parametrize("journal,synchronous", [("delete", "FULL"), ("delete", "EXTRA"), ("wal", "FULL")])
def test_sqlite_keeps_every_committed_transaction(lazy_device, journal, synchronous):
    dev, lazy = lazy_device
    db = Path(dev.mountpoint) / "app.db"
    sqlite_commits(db, journal, synchronous, 25)

    power_cut(dev, lazy)

    rows, integrity = sqlite_rows(db)
    assert integrity == "ok"
    if (journal, synchronous) == ("delete", "FULL"):
        # SQLite commits a rollback-journal transaction by unlinking the journal
        # and syncs the folder after that only with EXTRA: with FULL the last
        # transaction may roll back after a power cut, on ext4 as here.
        assert rows in (24, 25), f"{rows} of 25 committed transactions"
    else:
        assert rows == 25, f"{rows} of 25 committed transactions"


def test_git_commits_survive(lazy_device, tool_env):
    dev, lazy = lazy_device
    repo = Path(dev.mountpoint) / "repo"
    repo.mkdir()
    git = ["git", "-c", "core.fsync=all", "-c", "core.fsyncMethod=fsync",
           "-c", "user.name=T", "-c", "user.email=t@example.com"]
    run([*git, "init", "-q", "-b", "main"], cwd=repo, env=tool_env)
    # git init writes HEAD and config without fsync (core.fsync does not cover
    # them): make them durable as sync(1) would, as on any filesystem.
    fsync_tree(repo)
    for i in range(3):
        (repo / f"file{i}.txt").write_text(f"content {i}\n" * 100)
        run([*git, "add", f"file{i}.txt"], cwd=repo, env=tool_env)
        run([*git, "commit", "-q", "-m", f"commit {i}"], cwd=repo, env=tool_env)
    # git syncs what it writes, not the folders it renames into; its last
    # renames (the branch, the index) are made durable as on ext4 by a folder fsync.
    for folder in (repo / ".git/refs/heads", repo / ".git"):
        fsync_path(folder, directory=True)

    power_cut(dev, lazy)

    fsck = run([*git, "fsck", "--full", "--strict"], cwd=repo, env=tool_env, check=False)
    assert fsck.returncode == 0 and not fsck.stderr.strip(), f"git fsck:\n{fsck.stdout}{fsck.stderr}"
    log = run([*git, "log", "--format=%s"], cwd=repo, env=tool_env, check=False)
    assert log.returncode == 0 and log.stdout.split("\n")[:3] == ["commit 2", "commit 1", "commit 0"], (
        f"git log:\n{log.stdout}{log.stderr}")


def test_unsynced_changes_are_whole_or_absent(lazy_device):
    dev, lazy = lazy_device
    root = Path(dev.mountpoint)
    old_small, old_big = pattern("old ", 3 * KiB), pattern("OLD ", 300 * KiB)
    write_synced(root / "small.txt", old_small)
    write_synced(root / "big.bin", old_big)
    new_small, new_big, fresh = pattern("new ", 5 * KiB), pattern("NEW ", 260 * KiB), pattern("fresh ", 70 * KiB)
    write_unsynced(root / "small.txt", new_small)
    write_unsynced(root / "big.bin", new_big)
    write_unsynced(root / "fresh.bin", fresh)

    power_cut(dev, lazy)

    problems = []
    for name, allowed in (("small.txt", [old_small, new_small]), ("big.bin", [old_big, new_big]),
                          ("fresh.bin", [None, b"", fresh])):
        try:
            got = (root / name).read_bytes()
        except FileNotFoundError:
            got = None
        except OSError as e:
            problems.append(f"{name}: {e}")
            continue
        if got in allowed:
            continue
        if got is None:
            problems.append(f"{name}: absent, though its old version was fsynced (and its folder)")
        else:
            problems.append(f"{name}: torn: {len(got)} bytes, starting {got[:40]!r}, "
                            f"{sum(1 for b in range(0, len(got), 4096) if not got[b:b + 4096].strip(bytes(1)))} "
                            "blocks of zeros")
    assert not problems, "\n".join(problems) + f"\nfolder: {sorted(os.listdir(root))}"


def test_changes_pushed_before_the_cut_stay_in_step_with_the_store(lazy_device, make_device):
    """Written without fsync but pushed: the store (and so every other device)
    has it, so this device must show it again after the cut, not lose it for good."""
    dev, lazy = lazy_device
    root = Path(dev.mountpoint)
    data = pattern("pushed ", 100 * KiB)
    (root / "folder").mkdir()
    write_unsynced(root / "folder/pushed.bin", data)
    wait_pushed(dev)

    power_cut(dev, lazy)
    other = make_device("b")

    assert (Path(other.mountpoint) / "folder/pushed.bin").read_bytes() == data, "the store has it"

    def same_on_this_device():
        assert (root / "folder/pushed.bin").read_bytes() == data

    eventually(same_on_this_device, 10, 0.2, "the device that pushed folder/pushed.bin shows it again")


def test_a_rewrite_whose_mark_the_cut_lost_is_not_taken_for_the_stores_version(lazyfs, make_device, store_link):
    """The disk wrote back a pushed file's new bytes (its cache file) but not the
    operation log record that marked the rewrite, which was never synced. After
    the cut, a restart of the machine, the device must not take those bytes for
    the store's version, which would show them here for ever and push them never:
    it checks its local copies, the name gets the store's version back and the
    bytes are kept as a recovered copy, on every device."""
    a = make_device("a", store=store_link.path, data_home=lazyfs.mountpoint / "data", mount=False)
    a.mount_env = {"UBIQUITYFS_TEST_BOOT_ID": "boot-1"}
    a.mount()
    b = make_device("b")
    root, other = Path(a.mountpoint), Path(b.mountpoint)
    old, new = pattern("OLD ", 300 * KiB), pattern("NEW ", 200 * KiB)
    write_synced(root / "big.bin", old)
    wait_pushed(a)
    lazyfs.sync()
    store_link.cut()            # nothing of the rewrite reaches the store before the cut
    wait_offline(a)
    write_unsynced(root / "big.bin", new)

    a.kill9()
    result = lazyfs.cut(keep="/cache/")
    assert result["kept"] >= 1, result
    a.mount_env = {"UBIQUITYFS_TEST_BOOT_ID": "boot-2"}
    a.mount()
    store_link.restore()

    def settled():
        here, there = sorted(os.listdir(root)), sorted(os.listdir(other))
        assert here == there and len(here) == 2, (here, there)
        copy = next(n for n in here if "recovered copy" in n)
        for folder in (root, other):
            assert (folder / "big.bin").read_bytes() == old, f"{folder}: big.bin is not the store's version"
            assert (folder / copy).read_bytes() == new, f"{folder}: {copy} is not what was written"

    eventually(settled, 30, 0.5, "both devices show the store's big.bin and the rewrite as a recovered copy")
    assert "the machine went down while this replica was open" in daemon_log(a)


def test_the_daemon_reads_its_cache_files_on_lazyfs_by_passthrough(lazy_device):
    """FUSE passthrough works when the cache file is on another FUSE filesystem
    (lazyfs does not pass through itself, so the stack is one deep): the reads
    of a large file never reach the daemon, and they reach lazyfs instead."""
    need_passthrough()
    dev, lazy = lazy_device
    path = Path(dev.mountpoint) / "large.bin"
    data = random.Random(4).randbytes(4 * MiB)
    write_synced(path, data)
    drop_caches()
    reader, got = passing_through(dev, path, first=-1)   # no READ reached the daemon
    with reader:
        assert got == data
        drop_caches()
        again = {}
        lazy_reads = reads_reaching(SimpleNamespace(mountpoint=lazy.mountpoint),
                                    lambda: again.update(data=os.pread(reader.fileno(), len(data), 0)))
        assert again["data"] == data
        assert lazy_reads > 0, "the kernel read the cache file through lazyfs"
    assert "refused a backing file" not in daemon_log(dev)
