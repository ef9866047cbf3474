"""Placeholders that stream: reads at any offset are served as soon as their
chunk is verified (the chunks a reader waits for are fetched first), a bounded
pool of download workers however many placeholders are pinned, and an
interrupted out-of-order download that resumes after `kill -9`, and a stream
that the kernel does not cache twice.

Device B's blob fetches are slowed with UBIQUITYFS_FAULTS=fetch-delay=S (the
daemon's test-only fault injection), so the order in which chunks arrive is
observable: a whole download cannot be quicker than (chunks + 1) × S / (fetches
at a time).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import STORE_KIND, folder_store_only
from test_sync import MiB, SYNC_TIMEOUT, eventually, fresh_blocks, new_device, read, status_json, wait_pushed, write

pytestmark = pytest.mark.daemon

CHUNK = 4 * MiB
# Fetches at a time per download (Store.downloadConcurrency): 4 on a folder store, 8 on S3.
FETCHES = 8 if STORE_KIND == "s3" else 4
# Large and slow enough that a whole download takes several times as long as two fetches.
DELAY = 2.0 if STORE_KIND == "s3" else 0.5
SIZE = 200 * MiB + 12345


def thread_tids(pid: int, names: dict) -> list:
    """The threads of `pid` alive now; `names` learns each one's name as
    /proc shows it now (ended threads are left out)."""
    tids = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names[tid] = f.read().strip()
        except FileNotFoundError:
            continue
        tids.append(tid)
    return tids


def count_by_name(tids: list, names: dict) -> dict:
    counts = {}
    for tid in tids:
        counts[names[tid]] = counts.get(names[tid], 0) + 1
    return counts


def listed_on(dev, rel: str, size: int):
    def check():
        assert os.stat(dev.mountpoint / rel).st_size == size

    eventually(check, SYNC_TIMEOUT, what=f"{dev.name} lists {rel}")


def test_reads_at_the_end_and_middle_jump_the_queue(make_device):
    """`tail`, a seek to the middle: served after their own chunk, long before
    the whole (slowed) download could be in."""
    delay, size = DELAY, SIZE   # the last chunk short
    a = new_device(make_device, "a")
    b = new_device(make_device, "b", env={"UBIQUITYFS_FAULTS": f"fetch-delay={delay}"})
    chunks = (size + CHUNK - 1) // CHUNK
    one, two = os.urandom(size), os.urandom(size)
    write(a.mountpoint / "one.bin", one)
    write(a.mountpoint / "two.bin", two)
    wait_pushed(a, 120)
    listed_on(b, "one.bin", size)
    listed_on(b, "two.bin", size)
    # In order, everything (and the manifest) takes at least this long.
    whole = (chunks + 1) * delay / FETCHES

    # Python: open, seek to the last 4 KiB, read; then a read in the middle.
    t0 = time.monotonic()
    fd = os.open(b.mountpoint / "one.bin", os.O_RDONLY)
    try:
        tail = os.pread(fd, 4096, size - 4096)
        t_tail = time.monotonic() - t0
        assert fresh_blocks(b.mountpoint / "one.bin") == 0, "one.bin was all downloaded already: nothing measured"
        middle_at = 61 * MiB + 777
        t1 = time.monotonic()
        middle = os.pread(fd, 100_000, middle_at)
        t_middle = time.monotonic() - t1
        assert fresh_blocks(b.mountpoint / "one.bin") == 0, "one.bin was all downloaded already: nothing measured"
        print(f"one.bin: last 4 KiB after {t_tail:.2f}s, middle after {t_middle:.2f}s more; whole >= {whole:.1f}s")
        assert tail == one[-4096:], "the last 4 KiB on B differ from A's"
        assert middle == one[middle_at:middle_at + 100_000], "the middle on B differs from A's"
        # Manifest, then the last chunk (perhaps after waiting for a busy worker).
        assert t_tail < 3 * delay + 1, f"the last 4 KiB took {t_tail:.2f}s (whole download >= {whole:.1f}s)"
        assert t_middle < 2 * delay + 1, f"a read in the middle took {t_middle:.2f}s (whole download >= {whole:.1f}s)"
        # All of it, through the same descriptor, is right.
        t2 = time.monotonic()
        got = bytearray()
        while part := os.pread(fd, MiB, len(got)):
            got += part
        t_all = time.monotonic() - t0
        assert bytes(got) == one, f"one.bin on B differs from A's ({len(got)} bytes read)"
        assert t_all > whole * 0.8, f"the whole file took only {t_all:.2f}s with a {delay}s fetch delay: no delay measured"
        print(f"one.bin: the rest after {time.monotonic() - t2:.2f}s")
    finally:
        os.close(fd)

    # `tail -c`, as a user would.
    t0 = time.monotonic()
    res = subprocess.run(["tail", "-c", "4096", str(b.mountpoint / "two.bin")], capture_output=True, timeout=120)
    t_tail = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert res.stdout == two[-4096:], "`tail -c 4096` on B differs from A's last 4 KiB"
    print(f"two.bin: tail -c 4096 after {t_tail:.2f}s")
    assert t_tail < 3 * delay + 1, f"`tail -c 4096` took {t_tail:.2f}s (whole download >= {whole:.1f}s)"
    eventually(lambda: read(b.mountpoint / "two.bin") == two or (_ for _ in ()).throw(AssertionError("differs")),
               120, what="two.bin complete and right on B")


class CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def cache_stat(fd: int, offset: int, length: int) -> CacheStat:
    """cachestat(2) (Linux 6.5) of `fd`'s range, on the reader's own descriptor
    (a new open may drop the cache)."""
    rng = (ctypes.c_uint64 * 2)(offset, length)
    stat = CacheStat()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(451, fd, ctypes.byref(rng), ctypes.byref(stat), 0) != 0:
        err = ctypes.get_errno()
        pytest.skip(f"cachestat(2): {os.strerror(err)}")
    return stat


def cached_pages(fd: int, offset: int, length: int) -> int:
    """Pages of `fd`'s range in the page cache."""
    return cache_stat(fd, offset, length).cache


def test_the_mount_answers_while_readers_wait_for_downloads(make_device):
    """Two programs read placeholders whose fetches take seconds; meanwhile
    another creates, stats, lists and removes files in the same mount, and is
    answered at once (the worker that waits hands the reading of requests
    over: CFuseWire's loop)."""
    delay = 4.0
    a = new_device(make_device, "a")
    b = new_device(make_device, "b", env={"UBIQUITYFS_FAULTS": f"fetch-delay={delay}"})
    contents = {name: os.urandom(MiB + 4321) for name in ("one.bin", "two.bin")}
    for name, data in contents.items():
        write(a.mountpoint / name, data)
    wait_pushed(a, 120)
    for name, data in contents.items():
        listed_on(b, name, len(data))

    got, errors = {}, []

    def reader(name):
        try:
            got[name] = read(b.mountpoint / name)
        except Exception as e:   # reported below
            errors.append(f"{name}: {e!r}")

    readers = [threading.Thread(target=reader, args=(name,)) for name in contents]
    t0 = time.monotonic()
    for r in readers:
        r.start()
    time.sleep(0.5)   # both reads are waiting for their fetches now
    work = b.mountpoint / "meanwhile"
    t1 = time.monotonic()
    work.mkdir()
    for i in range(200):
        path = work / f"f{i}"
        with open(path, "wb") as f:
            f.write(b"x" * 100)
        assert os.stat(path).st_size == 100
        assert f"f{i}" in os.listdir(work)
        os.unlink(path)
    meanwhile = time.monotonic() - t1
    still_waiting = [r.is_alive() for r in readers]
    for r in readers:
        r.join(60)
    waited = time.monotonic() - t0
    print(f"200 create/stat/list/unlink in {meanwhile:.2f}s while the reads waited {waited:.1f}s")
    assert not errors, errors
    assert got == contents, "a placeholder read on B differs from A's content"
    assert meanwhile < delay / 2, f"200 operations took {meanwhile:.2f}s while two reads waited for downloads"
    assert all(still_waiting), "a read was over before the other program finished: nothing measured"
    assert waited >= delay, f"the reads took {waited:.1f}s with a {delay}s fetch delay: no delay measured"


def daemon_cpu_seconds(pid: int) -> float:
    """User and system CPU time of process `pid` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("poll_us", [None, "1000000"], ids=["default", "one-second-window"])
def test_the_fuse_loop_polls_only_while_requests_come(make_device, poll_us):
    """During a burst of requests the worker that reads them polls /dev/fuse
    briefly before it sleeps (CFuseWire's loop); once the program stops, the
    daemon sleeps: an idle mount costs no CPU. With a window of a second
    (UBIQUITYFS_FUSE_POLL_US) the worker polls on for that second after the
    burst, which this test must see: that is its check on itself."""
    env = {"UBIQUITYFS_FUSE_POLL_US": poll_us} if poll_us else {}
    a = new_device(make_device, "a", env=env)
    path = a.mountpoint / "f"
    write(path, b"x")
    time.sleep(1.0)
    before = daemon_cpu_seconds(a.pid)
    for _ in range(5000):
        os.listxattr(path)   # each one a request: the kernel caches no xattr list
    during = daemon_cpu_seconds(a.pid) - before
    time.sleep(0.2)          # past any polling window of the default
    quiet_from = daemon_cpu_seconds(a.pid)
    time.sleep(0.7)
    idle = daemon_cpu_seconds(a.pid) - quiet_from
    print(f"poll window {poll_us or 'default'} µs: {during:.2f} s of CPU for 5,000 requests, {idle:.2f} s in 0.7 s after")
    assert during > 0, "the burst cost the daemon no CPU: its requests did not reach it"
    if poll_us is None:
        assert idle < 0.1, f"the daemon used {idle:.2f} s of CPU in 0.7 s after the burst: it polls on while idle"
    else:
        assert idle > 0.3, f"a one-second polling window used {idle:.2f} s of CPU in 0.7 s after the burst: no polling measured"


def test_a_streamed_placeholder_is_not_cached_twice(make_device):
    """The download puts a placeholder's bytes in B's cache file; the kernel
    caches them again for the mounted file. Behind a reader that streams the
    placeholder, the mounted file's pages are dropped (16 MiB behind it, 8 MiB
    at a time); what it reads stays right, also read again. A reader that
    jumps about keeps its pages."""
    size = 96 * MiB + 4321
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    data = os.urandom(size)
    write(a.mountpoint / "stream.bin", data)
    write(a.mountpoint / "jumps.bin", data[::-1])
    wait_pushed(a, 120)
    listed_on(b, "stream.bin", size)
    listed_on(b, "jumps.bin", size)

    fd = os.open(b.mountpoint / "stream.bin", os.O_RDONLY)
    try:
        assert fresh_blocks(b.mountpoint / "stream.bin") == 0, "stream.bin was downloaded already: nothing measured"
        got = bytearray()
        while part := os.read(fd, MiB):
            got += part
        assert bytes(got) == data, f"stream.bin on B differs from A's ({len(got)} bytes read)"
        kept = cached_pages(fd, 0, size) * 4096
        print(f"stream.bin: {kept / MiB:.1f} MiB of {size / MiB:.0f} MiB in the kernel's cache after reading it all")
        assert kept <= 32 * MiB, f"{kept / MiB:.1f} MiB of the streamed file stayed in the kernel's cache"
        assert cached_pages(fd, size - 8 * MiB, 8 * MiB) > 0, "the pages just read were dropped too"
        # Read again, through FUSE from the cache file: the same bytes.
        assert os.pread(fd, size, 0) == data, "stream.bin read again on B differs from A's"
    finally:
        os.close(fd)

    fd = os.open(b.mountpoint / "jumps.bin", os.O_RDONLY)
    try:
        rng = random.Random(7)
        offsets = [rng.randrange(0, size - 4096) & ~4095 for _ in range(64)]
        for at in offsets:
            assert os.pread(fd, 4096, at) == data[::-1][at:at + 4096], f"jumps.bin at {at} differs from A's"
        # A page the kernel reclaimed (memory pressure, not this daemon) leaves a
        # shadow entry, which cachestat counts as evicted; one the daemon had
        # dropped (fuse_lowlevel_notify_inval_inode) leaves none.
        gone = [(at, cache_stat(fd, at, 4096)) for at in offsets]
        dropped = [at for at, st in gone if st.cache == 0 and st.evicted == 0]
        reclaimed = [at for at, st in gone if st.cache == 0 and st.evicted > 0]
        if reclaimed:
            print(f"jumps.bin: {len(reclaimed)} of {len(offsets)} pages reclaimed by the kernel: {reclaimed[:5]}")
        assert not dropped, f"a reader jumping about lost its cached pages at {dropped[:5]}"
        assert len(reclaimed) <= len(offsets) // 8, f"{len(reclaimed)} of {len(offsets)} pages reclaimed: {reclaimed[:5]}"
    finally:
        os.close(fd)


def partial_bytes(dev) -> int:
    """Bytes on disk of the device's partial downloads (cache/…/*.part)."""
    return sum(p.stat().st_blocks * 512 for p in dev.data_home.rglob("*.part") if p.is_file())


def stream(dev, rel: str, data: bytes) -> int:
    """Read placeholder `rel` on `dev` through, 1 MiB at a time (it must not be
    downloaded yet, and must read as `data`); the most bytes `dev`'s partial
    downloads held on disk meanwhile."""
    got = bytearray()
    written = []
    with open(dev.mountpoint / rel, "rb", buffering=0) as f:
        assert fresh_blocks(dev.mountpoint / rel) == 0, f"{rel} was downloaded already: nothing measured"
        while part := f.read(MiB):
            got += part
            written.append(partial_bytes(dev))
    assert bytes(got) == data, f"{rel} on {dev.name} differs from the original ({len(got)} bytes read)"
    return max(written)


@folder_store_only("chunks are held in memory for a stream only where fetching again is cheap (a folder store)")
def test_a_stream_is_served_from_memory_and_downloaded_after_it(make_device):
    """On a folder store (cheap to fetch from again), B streams a placeholder
    from chunks its download holds in memory: nothing reaches B's cache while
    it reads, and once it closes the file is downloaded in the background.
    Evicting a placeholder stops its download: at once when its reader has
    closed, else when the reader closes."""
    size = 64 * MiB + 777
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    data = os.urandom(size)
    write(a.mountpoint / "movie.bin", data)
    write(a.mountpoint / "other.bin", data[::-1])
    wait_pushed(a, 120)
    listed_on(b, "movie.bin", size)
    listed_on(b, "other.bin", size)

    written = stream(b, "movie.bin", data)
    print(f"movie.bin: at most {written / MiB:.1f} MiB in B's partial file while it streamed")
    assert written == 0, f"{written / MiB:.1f} MiB of the stream written to B's cache while B read it"
    eventually(lambda: fresh_blocks(b.mountpoint / "movie.bin") > 0 or (_ for _ in ()).throw(AssertionError("placeholder")),
               SYNC_TIMEOUT, what="movie.bin downloaded on B after the stream closed")
    assert read(b.mountpoint / "movie.bin") == data, "movie.bin downloaded on B differs from A's"
    assert partial_bytes(b) == 0

    # Evicted after its reader closed: the download that went on stops.
    with open(b.mountpoint / "other.bin", "rb", buffering=0) as f:
        assert f.read(4 * MiB) == data[::-1][:4 * MiB]
    res = b.cli("evict", b.mountpoint / "other.bin", timeout=60)
    assert res.returncode == 0, f"evict failed:\n{res}"
    time.sleep(SYNC_TIMEOUT / 10)
    assert fresh_blocks(b.mountpoint / "other.bin") == 0, "other.bin was downloaded although evicted"
    assert partial_bytes(b) == 0, "other.bin's partial file stayed after the eviction"
    assert status_json(b)["downloadingItems"] == 0, "other.bin is still downloading after the eviction"


@folder_store_only("the store is a folder behind a FUSE mount")
def test_a_stream_from_a_folder_store_across_a_fuse_mount_is_written_as_it_arrives(make_device, tmp_path):
    """A folder store on a network or FUSE filesystem (here bindfs over a
    folder: `statfs` says FUSE, as it does for sshfs or rclone) is not cheap
    to fetch from again: B's download writes each chunk to its cache as it
    arrives, as on S3, instead of holding it for the stream and fetching it
    a second time, and B reads the file right."""
    size = 24 * MiB + 777
    backing, store = tmp_path / "store-backing", tmp_path / "store-over-fuse"
    backing.mkdir()
    store.mkdir()
    subprocess.run(["bindfs", "--no-allow-other", str(backing), str(store)], check=True, timeout=30)
    try:
        a = new_device(make_device, "a", store=store)
        b = new_device(make_device, "b", store=store)
        data = os.urandom(size)
        write(a.mountpoint / "movie.bin", data)
        wait_pushed(a, 120)
        listed_on(b, "movie.bin", size)
        assert stream(b, "movie.bin", data) > 0, "nothing reached B's partial file while it streamed: the chunks were held"
        eventually(lambda: fresh_blocks(b.mountpoint / "movie.bin") > 0 or (_ for _ in ()).throw(AssertionError("placeholder")),
                   SYNC_TIMEOUT, what="movie.bin downloaded on B after the stream closed")
        assert read(b.mountpoint / "movie.bin") == data, "movie.bin downloaded on B differs from A's"
        b.unmount()
        a.unmount()
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(store)], timeout=30)


def test_pinning_many_placeholders_keeps_threads_bounded(make_device):
    """Pinning a folder of 200 placeholders (and a few chunked files) queues
    downloads on a fixed pool; the daemon's thread count stays bounded and
    every file arrives right."""
    a = new_device(make_device, "a")
    b = new_device(make_device, "b", env={"UBIQUITYFS_FAULTS": "fetch-delay=0.02"})
    (a.mountpoint / "many").mkdir()
    files = {}
    for i in range(200):
        files[f"many/f{i:03d}.bin"] = os.urandom(1000 + i * 97)
    for i in range(3):
        files[f"many/big{i}.bin"] = os.urandom(9 * MiB + i)
    for rel, data in files.items():
        write(a.mountpoint / rel, data)
    wait_pushed(a, 180)
    eventually(lambda: len(os.listdir(b.mountpoint / "many")) == len(files)
               or (_ for _ in ()).throw(AssertionError(len(os.listdir(b.mountpoint / "many")))),
               SYNC_TIMEOUT * 3, what="B lists every file")
    # A new thread carries the name of the thread that started it until it
    # names itself, a moment later. So each sample keeps which threads were
    # alive, and they are counted by name at the end, by the name each last had.
    names = {}
    before_tids = thread_tids(b.pid, names)
    samples = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append(thread_tids(b.pid, names))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        res = b.cli("pin", str(b.mountpoint / "many"), timeout=60)
        assert res.returncode == 0, f"pin failed:\n{res}"

        def all_downloaded():
            missing = [rel for rel in files if fresh_blocks(b.mountpoint / rel) == 0]
            assert not missing, f"{len(missing)} not downloaded yet, e.g. {missing[:3]}"

        eventually(all_downloaded, 180, 0.2, "every pinned file downloaded on B")
    finally:
        stop.set()
        sampler.join()
    before = count_by_name(before_tids, names)
    most = dict(before)      # the most threads seen with each name
    for tids in samples:
        for name, count in count_by_name(tids, names).items():
            most[name] = max(most.get(name, 0), count)
    peak = max(len(tids) for tids in samples)
    print(f"threads: {sum(before.values())} before pinning, at most {peak} while 203 files downloaded;"
          f" by name, before: {before}, most seen: {most}")
    # Every kind of thread has its bound, whatever the load: the download pool
    # 8 workers, Parallel.map's helpers 16, the FUSE session 16 workers (kept
    # once started, so they grow with the kernel's concurrency) plus the thread
    # that runs libfuse's loop and only waits for it to end (CI saw 17). Every other
    # thread is started once, except a thread per control connection open at
    # the time (the pin, and what the harness asks meanwhile: CI saw 4).
    bounds = {"ubq-download": 8, "ubq-io": 16, "ubq-fuse": 1 + 16, "ubq-request": 8}
    for name, count in most.items():
        bound = bounds.get(name, before.get(name, 0))
        assert count <= bound, (f"{count} threads named {name!r} while downloading 203 pinned files"
                                f" (at most {bound}); before: {before}, most seen: {most}")
    assert most.get("ubq-download", 0) > 0, f"no download worker seen: {most}"
    for rel, data in files.items():
        assert read(b.mountpoint / rel) == data, f"{rel} on B differs from A's"


def in_partial_file(dev, data: bytes, chunks: list) -> bool:
    """Whether `dev`'s one partial download holds each of `chunks` of `data`
    whole (its last bytes: a chunk is written in order)."""
    parts = list(Path(dev.data_home).rglob("*.part"))
    if len(parts) != 1:
        return False
    with open(parts[0], "rb") as f:
        for i in chunks:
            end = min(len(data), (i + 1) * CHUNK)
            f.seek(end - 4096)
            if f.read(4096) != data[end - 4096:end]:
                return False
    return True


@folder_store_only("loses a blob and damages the partial download on disk")
def test_out_of_order_download_resumes_after_kill9(make_device):
    """A download interrupted with chunks in the middle and at the end in (and
    holes between) resumes after `kill -9`: chunks in the partial file are
    re-verified (one whose blob the store has lost since is used from there;
    one damaged on disk is fetched again), holes are fetched, and B reads A's
    bytes."""
    delay = 0.5
    a = new_device(make_device, "a")
    b = new_device(make_device, "b", env={"UBIQUITYFS_FAULTS": f"fetch-delay={delay}"})
    size = 96 * MiB
    data = os.urandom(size)
    write(a.mountpoint / "big.bin", data)
    wait_pushed(a, 120)
    listed_on(b, "big.bin", size)
    hashes = [hashlib.sha256(data[i:i + CHUNK]).hexdigest() for i in range(0, size, CHUNK)]
    last, middle = len(hashes) - 1, 14

    fd = os.open(b.mountpoint / "big.bin", os.O_RDONLY)
    try:
        assert os.pread(fd, 4096, size - 4096) == data[-4096:]
        assert os.pread(fd, 4096, middle * CHUNK + 5) == data[middle * CHUNK + 5:middle * CHUNK + 4101]
    finally:
        os.close(fd)
    # On a folder store a stream's chunks are held in memory and written once
    # it closes: wait for those two (not for the rest: each fetch takes `delay`).
    deadline = time.monotonic() + 10
    while not in_partial_file(b, data, [middle, last]):
        assert time.monotonic() < deadline, "the last and the middle chunk never reached B's partial file"
        time.sleep(0.01)
    assert fresh_blocks(b.mountpoint / "big.bin") == 0, "big.bin was all downloaded already: nothing interrupted"
    b.kill9()

    parts = list(Path(b.data_home).rglob("*.part"))
    assert len(parts) == 1, f"partial downloads in B's data home: {parts}"
    part = parts[0]
    # Out of order: the last and the middle chunk are in, with a hole before the middle one.
    with open(part, "r+b") as f:
        assert os.fstat(f.fileno()).st_size == size, f"partial file of {os.fstat(f.fileno()).st_size} bytes"
        f.seek(last * CHUNK)
        assert f.read(4096) == data[last * CHUNK:last * CHUNK + 4096], "the last chunk is not in the partial file"
        f.seek(middle * CHUNK)
        assert f.read(4096) == data[middle * CHUNK:middle * CHUNK + 4096], "the middle chunk is not in the partial file"
        hole = os.lseek(f.fileno(), (middle - 1) * CHUNK, os.SEEK_DATA)
        assert hole >= middle * CHUNK, "no hole before the middle chunk: the download was not out of order"
        # Damage the last chunk on disk: it must be fetched again, not trusted.
        f.seek(last * CHUNK + 1000)
        f.write(b"\0damaged\0" * 100)
    # The store loses the middle chunk: only the partial file still has it.
    blob = Path(a.store) / "blobs" / hashes[middle][:2] / hashes[middle]
    assert blob.exists(), f"no blob {blob}"
    blob.unlink()

    b.mount_env = {}
    b.mount()
    got = read(b.mountpoint / "big.bin")
    assert len(got) == size, f"read {len(got)} bytes of big.bin on B after the restart"
    bad = [i for i in range(len(hashes)) if hashlib.sha256(got[i * CHUNK:(i + 1) * CHUNK]).hexdigest() != hashes[i]]
    assert not bad, f"chunks {bad} of big.bin on B differ from A's after resuming"
    eventually(lambda: fresh_blocks(b.mountpoint / "big.bin") > 0 or (_ for _ in ()).throw(AssertionError("placeholder")),
               30, what="big.bin installed on B")


def test_small_files_read_in_directory_order_have_the_next_ones_asked_of_the_disk(make_device):
    """Cold small files opened one after another in the order they were added
    to their directory: the daemon asks the disk for the next ones' cache
    files before the reader gets to them (`SiblingPrefetch`). A reader that
    jumps about has nothing asked for it. What is read is right either way."""
    a = make_device("a")
    src = a.mountpoint / "src"
    src.mkdir()
    files = [src / f"f{i:03d}" for i in range(60)]
    contents = [os.urandom(8192) for _ in files]
    for path, data in zip(files, contents):
        path.write_bytes(data)
    wait_pushed(a)
    replicas = Path(a.data_home) / "ubiquityfs" / "replicas"

    def cache_file(path: Path) -> Path:
        found = list(replicas.glob(f"*/*/cache/*/{path.stat().st_ino}"))
        assert len(found) == 1, f"cache file of {path.name}: {found}"
        return found[0]

    caches = [cache_file(p) for p in files]

    def cached(i: int) -> int:
        fd = os.open(caches[i], os.O_RDONLY)
        try:
            return cached_pages(fd, 0, 8192)
        finally:
            os.close(fd)

    def drop_caches():
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")

    # Jumping about: nothing after the files read is asked for.
    drop_caches()
    for i in (40, 10, 55, 25):
        assert files[i].read_bytes() == contents[i]
    time.sleep(1)
    asked = [i for i in (41, 42, 11, 12, 56, 57, 26, 27) if cached(i)]
    assert asked == [], f"a reader jumping about had files {asked} read ahead"

    # In order: after two files, the next ones come from the disk before they are opened.
    drop_caches()
    assert files[0].read_bytes() == contents[0]
    assert files[1].read_bytes() == contents[1]
    ahead = range(2, 2 + 24)
    eventually(lambda: sum(cached(i) == 2 for i in ahead) >= 20 or (_ for _ in ()).throw(
        AssertionError(f"{sum(cached(i) == 2 for i in ahead)} of the next 24 cached")), 10,
        what="the next files read ahead")
    for path, data in zip(files, contents):
        assert path.read_bytes() == data, f"{path.name} read back wrong"
