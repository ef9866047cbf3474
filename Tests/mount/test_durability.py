"""Durability, remounts, second devices, refusals and external unmounts.

All of these need the real daemon (skipped with UBQ_TEST_PLAIN=1).
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import (
    store_args,
    EXIT_TIMEOUT,
    MOUNT_TIMEOUT,
    UNMOUNT_TIMEOUT,
    mount_fstype,
    pid_alive,
    current_umask,
    digest_diff,
    hardlink_groups,
    make_tree,
    mounts_under,
    mtimes,
    processes_with_data_home,
    run,
    tree_digest,
    wait_until,
    xattrs,
)

pytestmark = pytest.mark.daemon

MiB = 1 << 20


# --------------------------------------------------------------------------
# Writing a known workload and remembering exactly what was acknowledged
# --------------------------------------------------------------------------


class Workload:
    """Applies operations to a mounted tree and keeps the expected result.

    `expected` is in tree_digest() form, `expected_xattrs` in xattrs() form.
    Every operation has returned (files are closed, some also fsynced)
    before it is recorded, so everything recorded is acknowledged.
    """

    def __init__(self, root: Path, seed: int):
        self.root = root
        self.rng = random.Random(seed)
        umask = current_umask()
        self.fmode = 0o666 & ~umask
        self.dmode = 0o777 & ~umask
        self.expected: dict[str, tuple] = {}
        self.expected_xattrs: dict[str, dict[str, bytes]] = {}
        self.fsynced: set[str] = set()

    def note(self, rel: str) -> str:
        return "(fsynced)" if rel in self.fsynced else "(closed, not fsynced)"

    def mkdir(self, rel: str) -> None:
        os.mkdir(self.root / rel)
        self.expected[rel] = ("dir", self.dmode, None, None)

    def write(self, rel: str, data: bytes, *, fsync: bool = False) -> None:
        fd = os.open(self.root / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            view, chunk = memoryview(data), self.rng.choice([4096, 65536, 1 << 20, 3 * MiB])
            while view:
                n = os.write(fd, view[:chunk])
                view = view[n:]
            if fsync:
                os.fsync(fd)
                self.fsynced.add(rel)
        finally:
            os.close(fd)
        self._file(rel, data)

    def _file(self, rel: str, data: bytes, mode: int | None = None) -> None:
        old = self.expected.get(rel)
        mode = mode if mode is not None else (old[1] if old else self.fmode)
        self.expected[rel] = ("file", mode, len(data), hashlib.sha256(data).hexdigest())

    def content(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def rename(self, old: str, new: str) -> None:
        os.rename(self.root / old, self.root / new)
        for key in sorted(self.expected):
            if key == old or key.startswith(old + "/"):
                moved = new + key[len(old):]
                self.expected[moved] = self.expected.pop(key)
                if key in self.expected_xattrs:
                    self.expected_xattrs[moved] = self.expected_xattrs.pop(key)
                if key in self.fsynced:
                    self.fsynced.add(moved)

    def unlink(self, rel: str) -> None:
        os.unlink(self.root / rel)
        del self.expected[rel]
        self.expected_xattrs.pop(rel, None)

    def chmod(self, rel: str, mode: int) -> None:
        os.chmod(self.root / rel, mode)
        t, _, size, digest = self.expected[rel]
        self.expected[rel] = (t, mode, size, digest)

    def setxattr(self, rel: str, name: str, value: bytes) -> None:
        os.setxattr(self.root / rel, name, value)
        self.expected_xattrs.setdefault(rel, {})[name] = value

    def removexattr(self, rel: str, name: str) -> None:
        os.removexattr(self.root / rel, name)
        del self.expected_xattrs[rel][name]
        if not self.expected_xattrs[rel]:
            del self.expected_xattrs[rel]

    def symlink(self, target: str, rel: str) -> None:
        os.symlink(target, self.root / rel)
        self.expected[rel] = ("symlink", 0o777, len(target.encode()), target)

    def link(self, existing: str, rel: str) -> None:
        os.link(self.root / existing, self.root / rel)
        self.expected[rel] = self.expected[existing]

    # -- the standard mix ---------------------------------------------------

    def populate(self, n_files: int = 200) -> None:
        rng = self.rng
        dirs = ["", "d0", "d1", "d1/n1", "d1/n1/n2", "d2", "d3", "d4", "d5", "d6", "d7", "d7/sub"]
        for d in dirs[1:]:
            self.mkdir(d)
        boundary = [0, 1, 4095, 4096, 4097, 65535, 65536, 131073, MiB, MiB + 1, 2 * MiB - 1, 2 * MiB]
        files = []
        for i in range(n_files):
            if i < len(boundary):
                size = boundary[i]
            else:
                r = rng.random()
                size = (
                    rng.randrange(0, 65536) if r < 0.7
                    else rng.randrange(65536, 512 * 1024) if r < 0.95
                    else rng.randrange(512 * 1024, 2 * MiB + 1)
                )
            rel = f"{dirs[i % len(dirs)]}/f{i:03d}.bin".lstrip("/")
            self.write(rel, rng.randbytes(size), fsync=(i % 4 == 0))
            files.append(rel)

        # Sparse file: a hole, then data near the end.
        rel = "d2/sparse.bin"
        with open(self.root / rel, "wb") as f:
            f.truncate(2 * MiB)
            f.seek(MiB + MiB // 2)
            f.write(b"after the hole")
        data = bytearray(2 * MiB)
        data[MiB + MiB // 2 : MiB + MiB // 2 + 14] = b"after the hole"
        self._file(rel, bytes(data))

        # Patch in the middle of an existing file.
        rel = "d3/patched.bin"
        self.write(rel, rng.randbytes(300_000))
        with open(self.root / rel, "r+b") as f:
            os.pwrite(f.fileno(), b"P" * 1000, 100_000)
        self._file(rel, self.content(rel))

        # Shrink with truncate(2).
        rel = "d4/shrunk.bin"
        self.write(rel, rng.randbytes(500_000))
        os.truncate(self.root / rel, 1234)
        self._file(rel, self.content(rel)[:1234])

        # Append in several opens.
        rel = "d5/log.txt"
        for i in range(20):
            fd = os.open(self.root / rel, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
            os.write(fd, b"log line %d\n" % i)
            os.close(fd)
        self._file(rel, b"".join(b"log line %d\n" % i for i in range(20)))

        # Atomic replace: write a temp file, rename it over the old one.
        rel = "d6/replaced.bin"
        self.write(rel, b"old version\n")
        new = rng.randbytes(70_000)
        self.write("d6/.replaced.tmp", new, fsync=True)
        self.rename("d6/.replaced.tmp", rel)

        # One rename across directories, one delete.
        self.rename(files[5], "d6/renamed.bin")
        self.unlink(files[10])
        # chmods (file and directory).
        self.chmod(files[11], 0o600)
        self.chmod(files[12], 0o755)
        self.chmod("d5", 0o700)
        # Extended attributes: binary value, a large one, one set then removed.
        self.setxattr(files[13], "user.app.test", b"\x00binary\xffvalue")
        self.setxattr(files[14], "user.big", bytes(range(256)) * 8)
        self.setxattr(files[15], "user.gone", b"x")
        self.setxattr(files[15], "user.kept", b"kept")
        self.removexattr(files[15], "user.gone")
        # Empty directory, a symlink, a hard link.
        self.mkdir("empty")
        self.symlink("../f000.bin", "d0/link")
        self.link(files[20], "d2/hardlink.bin")
        # Last: rename a directory holding files (incl. chmodded/deleted ones above).
        self.rename("d7", "d7-renamed")

    def check(self, root: Path, label: str) -> None:
        d = digest_diff(self.expected, tree_digest(root), note=self.note)
        assert not d, f"{label}: tree differs from what was acknowledged:\n{d}"
        d = digest_diff(self.expected_xattrs, xattrs(root))
        assert not d, f"{label}: user.* xattrs differ:\n{d}"


# --------------------------------------------------------------------------
# kill -9
# --------------------------------------------------------------------------


def test_kill9_keeps_every_acknowledged_write(make_device):
    a = make_device("a")
    work = Workload(a.mountpoint, seed=1)
    work.populate(200)
    a.kill9()  # immediately; kill9() also lazily detaches the dead mount
    assert os.listdir(a.mountpoint) == [], "the daemon wrote into the bare mountpoint"

    a.mount()
    work.check(a.mountpoint, "same device after kill -9")
    digest_a = tree_digest(a.mountpoint)

    a.unmount()  # graceful: returns once every change is pushed
    b = make_device("b")
    d = digest_diff(digest_a, tree_digest(b.mountpoint))
    assert not d, f"second device differs from the first:\n{d}"
    work.check(b.mountpoint, "second device")


def test_kill9_right_after_a_burst_of_metadata_changes(make_device):
    """Creates, renames, removals and folders as fast as one process makes
    them, then kill -9 at once: the operation log holds what SQLite had not
    taken yet, and the next mount replays it (the log says how many records)."""
    a = make_device("a")
    root = a.mountpoint / "burst"
    root.mkdir()
    for i in range(1500):
        (root / f"f{i:04d}").write_bytes(f"content {i}\n".encode())
    for i in range(0, 1500, 2):
        os.rename(root / f"f{i:04d}", root / f"r{i:04d}")
    for i in range(1, 1500, 4):
        os.unlink(root / f"f{i:04d}")
    for i in range(100):
        (root / f"d{i:03d}").mkdir()
        os.chmod(root / f"d{i:03d}", 0o700)
    expected = tree_digest(a.mountpoint)
    a.kill9()

    a.mount()
    d = digest_diff(expected, tree_digest(a.mountpoint))
    replayed = [line for p in Path(a.data_home).glob("ubiquityfs/replicas/*/daemon.log")
                for line in p.read_text(errors="replace").splitlines() if "replayed them" in line]
    assert not d, f"after kill -9 the tree differs from what was acknowledged ({replayed}):\n{d}"


def spare_cache_files(dev) -> list[Path]:
    """The emptied cache files a device keeps for new files (the replica's `spare/`)."""
    return [p for d in Path(dev.data_home).glob("ubiquityfs/replicas/*/*/spare") for p in d.iterdir()]


def cache_file_inodes(dev) -> set[int]:
    return {p.stat().st_ino for p in Path(dev.data_home).glob("ubiquityfs/replicas/*/*/cache/*/*")
            if p.is_file()}


def test_new_files_take_the_emptied_cache_files_of_removed_ones(make_device):
    """Files removed (their removal pushed) leave their cache files, emptied, for
    the next new files; with the spares the daemon makes ahead, creates
    allocate no inode on the replica's disk. The new files hold their own bytes
    only, after kill -9 and a remount too, and another device gets them right."""
    from test_sync import wait_pushed
    a = make_device("a")

    def settled_spares() -> set[int]:
        """The spares' inodes once the background filler has stopped adding."""
        last = None
        for _ in range(100):
            now = {p.stat().st_ino for p in spare_cache_files(a)}
            if now == last:
                return now
            last = now
            time.sleep(0.3)
        raise AssertionError("the spares never stopped changing")

    ahead = settled_spares()
    assert ahead, "no spares made ahead for the first creates"
    old = {f"old/f{i:03d}": os.urandom(5000 + i) for i in range(40)}
    (a.mountpoint / "old").mkdir()
    for rel, data in old.items():
        (a.mountpoint / rel).write_bytes(data)
    wait_pushed(a)
    old_inodes = cache_file_inodes(a)
    assert len(old_inodes) == 40 and old_inodes <= ahead, "the first creates did not take the spares made ahead"
    shutil.rmtree(a.mountpoint / "old")
    wait_pushed(a)
    assert wait_until(lambda: old_inodes <= {p.stat().st_ino for p in spare_cache_files(a)}, 10), \
        "the removed files' cache files were not kept as spares"
    spares = spare_cache_files(a)
    assert all(p.stat().st_size == 0 for p in spares), "a spare still holds bytes"
    spare_inodes = {p.stat().st_ino for p in spares}

    (a.mountpoint / "new").mkdir()
    new = {f"new/g{i:03d}": os.urandom(100 + i) for i in range(40)}
    for rel, data in new.items():
        (a.mountpoint / rel).write_bytes(data)
    new_inodes = cache_file_inodes(a)
    assert len(new_inodes) == 40 and new_inodes <= spare_inodes, "the new files' cache files are not spares"
    for rel, data in new.items():
        assert (a.mountpoint / rel).read_bytes() == data, f"{rel} is not what was written"
    a.kill9()

    a.mount()
    for rel, data in new.items():
        assert (a.mountpoint / rel).read_bytes() == data, f"{rel} after kill -9 is not what was written"
    wait_pushed(a)
    b = make_device("b")
    for rel, data in new.items():
        assert wait_until(lambda: (b.mountpoint / rel).exists(), 30), f"{rel} never reached b"
        assert (b.mountpoint / rel).read_bytes() == data, f"{rel} on b is not what a wrote"


def test_kill9_right_after_closing_new_files_keeps_their_content_and_times(make_device):
    """A new file's close does not reach the daemon (FOPEN_NOFLUSH): its
    writes are kept as they are made. kill -9 right after the last close:
    every file is there with its bytes and size, its mtime as seen before
    (to the file system's clock granularity), and a time set by utime
    (as tar and cp -p do after writing) exactly."""
    a = make_device("a")
    root = a.mountpoint / "new"
    root.mkdir()
    rng = random.Random(7)
    for i in range(300):
        data = rng.randbytes(rng.choice([0, 1, 100, 4096, 70_000, 300_000]))
        fd = os.open(root / f"f{i:03d}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        for off in range(0, len(data), 65536):
            os.write(fd, data[off:off + 65536])
        os.close(fd)
    os.utime(root / "f007", ns=(1_000_000_000_123_456_789, 1_000_000_000_123_456_789))
    expected = tree_digest(a.mountpoint)
    seen = mtimes(a.mountpoint)
    a.kill9()

    a.mount()
    d = digest_diff(expected, tree_digest(a.mountpoint))
    assert not d, f"after kill -9 the new files differ from what close() acknowledged:\n{d}"
    after = mtimes(a.mountpoint)
    assert after["new/f007"] == 1_000_000_000_123_456_789
    off = {rel: after[rel] - t for rel, t in seen.items() if rel.startswith("new/f") and abs(after[rel] - t) > 20_000_000}
    assert not off, f"mtimes moved by more than 20 ms after kill -9 (ns): {off}"


# --------------------------------------------------------------------------
# clean unmount / remount
# --------------------------------------------------------------------------


def test_clean_unmount_then_remount_shows_everything(make_device, tmp_path):
    """A remount of the same device shows the whole tree at once.

    This only checks what a user sees (names, contents, modes, mtimes, hard
    links, xattrs, read right after the remount).  It does NOT prove that the
    replica's cache was reused instead of re-downloading from the store.
    """
    a = make_device("a")
    src = make_tree(tmp_path / "src", seed=5, hardlinks=True)
    run(["cp", "-a", src, a.mountpoint / "tree"])
    (a.mountpoint / "big.bin").write_bytes(random.Random(9).randbytes(5 * MiB + 7))
    os.setxattr(a.mountpoint / "big.bin", "user.note", b"hello")
    before = (
        tree_digest(a.mountpoint),
        mtimes(a.mountpoint),
        hardlink_groups(a.mountpoint),
        xattrs(a.mountpoint),
    )
    assert before[0]["tree/a/b/c/d"][0] == "dir"

    a.unmount()
    assert os.listdir(a.mountpoint) == [], "the daemon wrote into the bare mountpoint"
    a.mount()
    names = ["tree_digest", "mtimes", "hardlink_groups", "xattrs"]
    after = (
        tree_digest(a.mountpoint),
        mtimes(a.mountpoint),
        hardlink_groups(a.mountpoint),
        xattrs(a.mountpoint),
    )
    for name, x, y in zip(names, before, after):
        if isinstance(x, dict):
            d = digest_diff(x, y)
            assert not d, f"{name} differs after remount:\n{d}"
        else:
            assert x == y, f"{name} differs after remount"


def test_force_unmount_then_remount(make_device):
    a = make_device("a")
    work = Workload(a.mountpoint, seed=3)
    work.populate(40)
    res = a.unmount(force=True)
    assert not a.is_mounted(), res
    a.mount()
    work.check(a.mountpoint, "after unmount --force")
    a.unmount()
    b = make_device("b")
    work.check(b.mountpoint, "second device")


# --------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------


def assert_refused(dev, tmp_path, what: str):
    """dev.mount() must fail with a message and leave nothing mounted or running."""
    mounts_before = mounts_under(tmp_path)
    procs_before = set(processes_with_data_home(dev.data_home))
    res = dev.mount(check=False)
    assert res.returncode is not None, f"{what}: mount hung\n{res}"
    assert res.returncode != 0, f"{what}: mount should have been refused\n{res}"
    assert res.text.strip(), f"{what}: refused without any message\n{res}"
    assert mounts_under(tmp_path) == mounts_before, f"{what}: something was left mounted"
    assert wait_until(
        lambda: set(processes_with_data_home(dev.data_home)) <= procs_before, EXIT_TIMEOUT
    ), f"{what}: a process was left running"
    return res


@pytest.mark.parametrize("kind", ["missing", "non-empty", "regular-file"])
def test_refuses_bad_mountpoint(make_device, tmp_path, kind):
    dev = make_device("a", mount=False)
    mp = dev.mountpoint
    if kind == "missing":
        mp.rmdir()
    elif kind == "non-empty":
        (mp / "precious.txt").write_text("keep me\n")
    else:
        mp.rmdir()
        mp.write_text("a file\n")
    assert_refused(dev, tmp_path, f"{kind} mountpoint")

    # Nothing under the mountpoint was touched ...
    if kind == "non-empty":
        assert os.listdir(mp) == ["precious.txt"]
        assert (mp / "precious.txt").read_text() == "keep me\n"
        (mp / "precious.txt").unlink()
    elif kind == "regular-file":
        assert mp.read_text() == "a file\n"
        mp.unlink()
        mp.mkdir()
    else:
        if mp.exists():  # creating it is tolerated, mounting on it is not
            assert mp.is_dir() and os.listdir(mp) == []
        else:
            mp.mkdir()
    # ... and the refusal left no lock or state behind: a proper mount works.
    dev.mount()
    assert os.listdir(mp) == []


@pytest.mark.parametrize("kind", ["non-empty-dir", "regular-file"])
def test_refuses_store_that_is_not_a_store(make_device, tmp_path, store, kind):
    bogus = tmp_path / "not-a-store"
    if kind == "non-empty-dir":
        (bogus / "sub").mkdir(parents=True)
        (bogus / "notes.txt").write_text("my own files\n")
        (bogus / "sub" / "photo.jpg").write_bytes(random.Random(2).randbytes(10_000))
    else:
        bogus.write_text("not a directory\n")
    before = tree_digest(bogus) if bogus.is_dir() else bogus.read_bytes()
    dev = make_device("a", store=bogus, mount=False)
    assert_refused(dev, tmp_path, f"store is a {kind}")
    after = tree_digest(bogus) if bogus.is_dir() else bogus.read_bytes()
    assert after == before, "the refused mount modified the foreign directory"
    dev.store = store
    dev.mount()


def test_second_mount_of_same_device_joins_its_daemon(make_device):
    """One daemon per device and store: a second mountpoint is served by the
    same process and the same replica; each unmounts on its own."""
    a = make_device("a")
    (a.mountpoint / "hello.txt").write_text("hello\n")
    twin = make_device("a-twin", data_home=a.data_home, mount=False)
    res = twin.cli("mount", str(twin.mountpoint), *store_args(twin.store), timeout=MOUNT_TIMEOUT)
    assert res.returncode == 0, res
    assert f"pid {a.pid}" in res.text, f"the second mount started another daemon:\n{res}"
    assert (twin.mountpoint / "hello.txt").read_text() == "hello\n"
    # A change through one mountpoint is seen through the other at the next open.
    (twin.mountpoint / "second.txt").write_text("through the twin\n")
    assert (a.mountpoint / "second.txt").read_text() == "through the twin\n"
    with open(a.mountpoint / "hello.txt", "a") as f:
        f.write("more\n")
    assert (twin.mountpoint / "hello.txt").read_text() == "hello\nmore\n"
    assert sorted(os.listdir(a.mountpoint)) == sorted(os.listdir(twin.mountpoint)) == ["hello.txt", "second.txt"]
    # Unmounting one leaves the other served by the same daemon.
    res = a.cli("unmount", str(a.mountpoint), timeout=UNMOUNT_TIMEOUT)
    assert res.returncode == 0, res
    assert mount_fstype(a.mountpoint) is None or not mount_fstype(a.mountpoint).startswith("fuse")
    assert pid_alive(a.pid)
    (twin.mountpoint / "third.txt").write_text("still served\n")
    twin.pid, a.pid = a.pid, None
    twin.unmount()
    b = make_device("b")
    assert sorted(os.listdir(b.mountpoint)) == ["hello.txt", "second.txt", "third.txt"]
    assert (b.mountpoint / "hello.txt").read_text() == "hello\nmore\n"


# --------------------------------------------------------------------------
# External unmount and SIGTERM
# --------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["fusermount3 -u", "SIGTERM"])
def test_external_unmount_or_sigterm_ends_daemon_cleanly(make_device, how):
    a = make_device("a")
    work = Workload(a.mountpoint, seed=4)
    work.populate(60)
    pid = a.pid
    if how == "SIGTERM":
        os.kill(pid, signal.SIGTERM)
    else:
        res = subprocess.run(["fusermount3", "-u", str(a.mountpoint)], capture_output=True,
                             text=True, timeout=30)
        assert res.returncode == 0, res.stderr
    problems = a.wait_gone(EXIT_TIMEOUT)
    assert not problems, f"after {how}: " + "; ".join(problems)

    a.mount()
    work.check(a.mountpoint, f"remount after {how}")
    a.unmount()
    b = make_device("b")
    work.check(b.mountpoint, f"second device after {how} + remount + unmount")
