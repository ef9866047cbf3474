"""Full disks on real mounts: the replica's disk, and the store's.

(a) A device whose data home (replica: index and content cache) is on a
small tmpfs filled with a ballast file: every operation either succeeds —
and then survives a remount and reaches the other device — or fails with
ENOSPC and leaves no trace anywhere (this device now and after a remount,
the store's journal, the other device). `rm` works while the disk is full.
Once space is freed everything works again and the devices converge.

(b) A store on a small tmpfs: a large file that does not fit is retried with
back-off and named in `status` (`failingUploads`), small files written after
it still reach the other device, nothing partial is committed and no
temporary file is left in the store; once space is freed the large file
arrives too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from conftest import current_umask, digest_diff, tree_digest
from test_sync import eventually, status_json, wait_quiet

pytestmark = pytest.mark.daemon

MiB = 1 << 20


class SmallDisk:
    """A tmpfs of `size` mounted at `path`, and a ballast file that fills it."""

    def __init__(self, path: Path, size: str):
        self.path = path
        self.ballast = path / "ballast"
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Grow the ballast until at most `leave` bytes are free (0: until ENOSPC)."""
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (MiB, 64 << 10, 4096):
                block = b"\0" * chunk
                while self.free_bytes() - chunk >= leave:
                    try:
                        os.write(fd, block)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)
        assert self.free_bytes() <= max(leave, 4096), f"{self.path} still has {self.free_bytes()} bytes free"

    def free(self) -> None:
        if self.ballast.exists():
            self.ballast.unlink()

    def close(self) -> None:
        self.free()
        if subprocess.run(["umount", str(self.path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    """Factory of small tmpfs disks. Requested before `make_device`, so the
    devices on them are unmounted before the disks are."""
    disks: list[SmallDisk] = []

    def factory(name: str, size: str) -> SmallDisk:
        disk = SmallDisk(tmp_path / name, size)
        disks.append(disk)
        return disk

    yield factory
    for disk in reversed(disks):
        disk.close()


def device(make_device, name: str, **kw):
    dev = make_device(name, mount=False, **kw)
    dev.mount_args = ("--device-name", name)
    dev.mount()
    return dev


def journal_text(store: Path) -> str:
    """Every journal record of every container, concatenated."""
    texts = []
    for record in sorted(store.glob("containers/*/journal/*")):
        texts.append(record.read_text())
    return "\n".join(texts)


def attempt(what: str, outcomes: dict, fn) -> bool:
    """Run `fn`; record and return whether it succeeded. A failure must be ENOSPC."""
    try:
        fn()
    except OSError as e:
        assert e.errno == errno.ENOSPC, f"{what} on a full replica disk: {e!r}, expected ENOSPC"
        outcomes[what] = False
        return False
    outcomes[what] = True
    return True


# --------------------------------------------------------------------------
# (a) The replica's disk is full
# --------------------------------------------------------------------------


def test_full_replica_disk_fails_cleanly_and_converges(small_disk, make_device, store):
    disk = small_disk("a-home", "8m")
    a = device(make_device, "a", data_home=disk.path)
    b = device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint

    os.mkdir(A / "dir1")
    os.mkdir(A / "empty")
    (A / "a.txt").write_bytes(b"move me\n")
    (A / "b.txt").write_bytes(b"remove me\n")
    (A / "c.txt").write_bytes(b"append to me\n")
    (A / "big.bin").write_bytes(random.Random(1).randbytes(MiB))
    wait_quiet(a, b)
    assert tree_digest(B) == tree_digest(A)

    before = tree_digest(A)
    umask = current_umask()
    disk.fill()
    outcomes: dict[str, bool] = {}

    # Operations that need room in the index: each may fail, with ENOSPC only.
    attempt("mkdir newdir", outcomes, lambda: os.mkdir(A / "newdir"))
    attempt("create new.txt", outcomes, lambda: os.close(os.open(A / "new.txt", os.O_CREAT | os.O_WRONLY, 0o644)))

    def write(path: Path, flags: int, data: bytes, created: str | None = None):
        fd = os.open(path, flags, 0o644)
        if created:
            outcomes[created] = True
        try:
            os.write(fd, data)
        except OSError:
            os.close(fd)   # nothing was written: closing records nothing new
            raise
        os.close(fd)       # the disk took the bytes: closing must record them

    attempt("append to c.txt", outcomes, lambda: write(A / "c.txt", os.O_WRONLY | os.O_APPEND, b"more\n"))
    attempt("write w.txt", outcomes, lambda: write(A / "w.txt", os.O_CREAT | os.O_WRONLY, b"hello\n", "create w.txt"))
    attempt("mv a.txt dir1/a.txt", outcomes, lambda: os.rename(A / "a.txt", A / "dir1/a.txt"))
    # Removing is how a user gets out of a full disk: it must work.
    os.unlink(A / "b.txt")
    os.rmdir(A / "empty")
    os.unlink(A / "big.bin")
    # The freed space goes to the reserve first; creating may still be refused.
    attempt("mkdir after rm", outcomes, lambda: os.mkdir(A / "after"))
    print("outcomes on the full disk:", outcomes)
    assert not all(outcomes.values()), f"nothing was refused: the disk was not full for the index ({outcomes})"

    # What A shows is exactly what succeeded: a failed operation left nothing.
    def file_entry(data: bytes, mode: int = 0o644 & ~umask):
        return ("file", mode, len(data), hashlib.sha256(data).hexdigest())

    expected = dict(before)
    for name in ("b.txt", "empty", "big.bin"):
        del expected[name]
    for what, name in [("mkdir newdir", "newdir"), ("mkdir after rm", "after")]:
        if outcomes[what]:
            expected[name] = ("dir", 0o777 & ~umask, None, None)
    if outcomes["create new.txt"]:
        expected["new.txt"] = file_entry(b"")
    if outcomes.get("create w.txt"):
        expected["w.txt"] = file_entry(b"hello\n" if outcomes["write w.txt"] else b"")
    c_text = b"append to me\n" + (b"more\n" if outcomes["append to c.txt"] else b"")
    expected["c.txt"] = file_entry(c_text, before["c.txt"][1])
    if outcomes["mv a.txt dir1/a.txt"]:
        expected["dir1/a.txt"] = expected.pop("a.txt")
    diff = digest_diff(expected, tree_digest(A))
    assert not diff, f"A does not show exactly what succeeded ({outcomes}):\n{diff}"

    # The other device gets exactly what succeeded, nothing that failed.
    eventually(same_tree(expected, B), 20, 0.25, "B shows what succeeded on A while A's disk is full")
    journal = journal_text(store)
    for what, name in [("mkdir newdir", "newdir"), ("create new.txt", "new.txt"), ("mkdir after rm", "after")]:
        if not outcomes[what]:
            assert f'"{name}"' not in journal, f"{what} failed, yet the store's journal names {name}"
    if not outcomes.get("create w.txt", False):
        assert '"w.txt"' not in journal, "the create of w.txt failed, yet the store's journal names it"

    # Space again: everything works, and the devices converge.
    disk.free()
    os.mkdir(A / "later")
    (A / "later/x.txt").write_bytes(b"after the disk had room again\n")
    with open(A / "c.txt", "ab") as f:
        f.write(b"again\n")
    final = dict(expected)
    final["later"] = ("dir", 0o777 & ~umask, None, None)
    final["later/x.txt"] = file_entry(b"after the disk had room again\n", 0o666 & ~umask)
    final["c.txt"] = file_entry(c_text + b"again\n", before["c.txt"][1])
    diff = digest_diff(final, tree_digest(A))
    assert not diff, f"once the disk has room, A shows more or less than what succeeded:\n{diff}"
    wait_quiet(a, b)
    eventually(same_tree(final, B), 20, 0.25, "A and B identical once A's disk has room")

    # What A's user saw succeed is what A's index holds.
    a.remount()
    diff = digest_diff(final, tree_digest(A))
    assert not diff, f"after a remount A differs from what its user saw:\n{diff}"
    wait_quiet(a, b)
    diff = digest_diff(final, tree_digest(B))
    assert not diff, f"B differs after A's remount:\n{diff}"


def same_tree(expected: dict, root: Path):
    """A check for `eventually`: the tree at `root` is `expected`."""
    def check():
        diff = digest_diff(expected, tree_digest(root))
        assert not diff, f"{root} differs from what A's user saw:\n{diff}"

    return check


def content_is(path: Path, expected: bytes):
    def check():
        assert path.read_bytes() == expected, f"{path} does not hold the expected {len(expected)} bytes (yet)"

    return check


# --------------------------------------------------------------------------
# (b) The store's disk is full
# --------------------------------------------------------------------------


def blob_path(store: Path, digest: str) -> Path:
    return store / "blobs" / digest[:2] / digest


def check_journal_complete(store: Path) -> None:
    """Every content a journal record names is wholly in the store."""
    for record in sorted(store.glob("containers/*/journal/*")):
        for change in json.loads(record.read_text())["changes"]:
            digest = change.get("hash") if change.get("op") == "node" else None
            if not digest:
                continue
            if change.get("pack"):
                # Small content packed with others: its pack blob must be there.
                pack = change["pack"]["hash"]
                assert blob_path(store, pack).exists(), f"{record.name} names pack {pack}, which the store lacks"
                continue
            path = blob_path(store, digest)
            assert path.exists(), f"{record.name} names blob {digest}, which the store lacks"
            if change.get("chunked"):
                manifest = json.loads(path.read_bytes())
                missing = [c for c in manifest["chunks"] if not blob_path(store, c).exists()]
                assert not missing, f"{record.name}: chunks missing from the store: {missing}"
            else:
                assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"blob {digest} is damaged"


def test_full_store_retries_the_large_file_and_lets_small_ones_through(small_disk, make_device):
    disk = small_disk("store-disk", "16m")
    store = disk.path / "store"
    store.mkdir()
    a = device(make_device, "a", store=store)
    b = device(make_device, "b", store=store)
    A, B = a.mountpoint, b.mountpoint
    rng = random.Random(2)

    (A / "first.txt").write_bytes(b"before the store was full\n")
    eventually(content_is(B / "first.txt", b"before the store was full\n"), what="first.txt reaches B")
    disk.fill(leave=6 * MiB)

    # 12 MiB (three chunks) do not fit in 6: one chunk goes in, the next does not.
    big = rng.randbytes(12 * MiB)
    (A / "big.bin").write_bytes(big)

    def big_is_failing():
        failing = status_json(a)["failingUploads"]
        assert [f["path"] for f in failing] == ["/big.bin"], failing
        return failing[0]

    first = eventually(big_is_failing, 10, 0.2, "status names big.bin in failingUploads")
    assert "space" in first["error"].lower(), f"the error should say the store is full: {first}"

    # Small files written after the large one still go through.
    small = {f"small{i}.txt": rng.randbytes(20_000) for i in range(5)}
    for name, data in small.items():
        (A / name).write_bytes(data)

    for name, data in small.items():
        eventually(content_is(B / name, data), 15, 0.25, f"{name}, written after the large file, reaches B")

    # Nothing partial: B does not see the large file at all, every record's
    # content is whole in the store, no temporary file is left behind.
    assert not (B / "big.bin").exists(), "B shows big.bin before its content is in the store"
    check_journal_complete(store)
    leftovers = [p.name for p in (store / "tmp").iterdir()]
    assert not leftovers, f"temporary files left in the store after ENOSPC: {leftovers}"

    # Retried with back-off: a few tries, not one per push round.
    time.sleep(3)
    later = big_is_failing()
    assert 2 <= later["attempts"] <= 4, f"tries after ~{3 + 1}s: {later}"
    assert status_json(a)["storeReachable"] is True

    # A graceful unmount must not claim that everything is in the store: it
    # refuses, names the file, and the mount (and its queue) stays.
    res = a.unmount(check=False)
    assert res.returncode != 0, f"unmount succeeded while big.bin is not in the store:\n{res}"
    assert "big.bin" in res.stderr and "--force" in res.stderr, f"unmount should name big.bin and --force:\n{res}"
    assert a.is_mounted(), "the refused unmount unmounted anyway"
    assert not (B / "big.bin").exists(), "B shows big.bin before its content is in the store"

    disk.free()
    t0 = time.monotonic()

    eventually(content_is(B / "big.bin", big), 30, 0.5, "big.bin reaches B once the store has room")
    print(f"big.bin arrived {time.monotonic() - t0:.1f}s after space was freed")

    def nothing_failing():
        assert status_json(a)["failingUploads"] == []

    eventually(nothing_failing, 10, 0.2, "failingUploads is empty once big.bin is pushed")
    check_journal_complete(store)
    wait_quiet(a, b)
    diff = digest_diff(tree_digest(A), tree_digest(B))
    assert not diff, f"A and B differ:\n{diff}"
