#!/usr/bin/env python3
"""POSIX behaviour conformance suite (stdlib only).

Runs a set of small, independent checks against any directory and reports,
for each check, PASS / FAIL / SKIP (plus "EINVAL" for renameat2 flags that
the filesystem rejects with EINVAL).  Every check gets a fresh scratch
subdirectory of the target directory and asserts exact outcomes (values and
errnos), so the same suite run on a plain kernel filesystem and on a FUSE
mount can be compared side by side.

Usage:
    python3 posix_suite.py DIR [--json] [-k PATTERN]... [--timeout S]
    python3 posix_suite.py --compare DIR_A DIR_B [--json] [-k PATTERN]...
    python3 posix_suite.py --list

Library use:
    import posix_suite
    results = posix_suite.run_suite("/mnt/x", pattern="rename")
    # {"rename_file_over_file": ("PASS", ""), ...}

Linux-only (uses fork, xattrs, renameat2, utimensat, flock).  Some checks
need root (chown, mknod of devices, dropping to uid 65534) and are SKIPped
otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import fnmatch
import hashlib
import json
import mmap
import os
import pickle
import platform
import random
import select
import shutil
import signal
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
import traceback
from typing import Callable, Iterable

PASS, FAIL, SKIP, EINVAL = "PASS", "FAIL", "SKIP", "EINVAL"

KiB = 1024
MiB = 1024 * KiB

NOBODY_UID = 65534
NOBODY_GID = 65534
OTHER_UID = 4242  # an arbitrary non-root, non-nobody owner
OTHER_GID = 4343

#: slack (ns) allowed when comparing a file timestamp with "now"
NOW_SLACK_NS = 1_000_000_000
#: pause before an operation whose ctime/mtime effect we want to observe
TICK_S = 0.03

DEFAULT_TIMEOUT_S = 30.0

j = os.path.join


# --------------------------------------------------------------------------
# framework
# --------------------------------------------------------------------------

class CheckFailed(AssertionError):
    """An assertion in a check did not hold."""


class Skip(Exception):
    """The check cannot run here (e.g. needs root); the message says why."""


class FlagEinval(Exception):
    """The filesystem answered EINVAL to a renameat2 flag (distinct status)."""


class CheckTimeout(BaseException):
    """Raised by the per-check timer; BaseException so checks don't swallow it."""


CHECKS: list[tuple[str, Callable[[str], None]]] = []


def check(fn: Callable[[str], None]) -> Callable[[str], None]:
    """Register a check; its name is the function name without ``check_``."""
    assert fn.__name__.startswith("check_") and fn.__doc__, fn.__name__
    CHECKS.append((fn.__name__[len("check_"):], fn))
    return fn


def check_names() -> list[str]:
    return [name for name, _ in CHECKS]


def errname(n: int | None) -> str:
    if n is None:
        return "None"
    return errno.errorcode.get(n, str(n))


def _short(v, limit: int = 120) -> str:
    r = repr(v)
    if len(r) > limit:
        extra = f" (len {len(v)})" if hasattr(v, "__len__") else ""
        r = r[: limit - 3] + "..." + extra
    return r


def fail(msg: str):
    raise CheckFailed(msg)


def expect(cond, msg: str):
    if not cond:
        fail(msg)


def eq(actual, expected, what: str):
    if actual != expected:
        fail(f"{what}: expected {_short(expected)}, got {_short(actual)}")


def _label(fn, args) -> str:
    def show(a):
        if isinstance(a, (str, bytes)) and (os.sep in str(a) or "/" in str(a)):
            parts = str(a).rstrip("/").split("/")
            return "/".join(parts[-2:])
        return _short(a, 40)
    return f"{getattr(fn, '__name__', 'call')}({', '.join(show(a) for a in args)})"


def expect_errno(expected, fn, *args, what: str | None = None, **kw) -> int:
    """Call fn(*args, **kw) and require it to fail with one of `expected`."""
    exp = (expected,) if isinstance(expected, int) else tuple(expected)
    label = what or _label(fn, args)
    want = "/".join(errname(e) for e in exp)
    try:
        r = fn(*args, **kw)
    except OSError as e:
        if e.errno in exp:
            return e.errno
        fail(f"{label}: expected {want}, got {errname(e.errno)} ({e.strerror})")
    if fn is os.open and isinstance(r, int):
        os.close(r)
    fail(f"{label}: expected {want}, but it succeeded (returned {_short(r, 60)})")


def outcome(fn, *args, **kw) -> str:
    """'ok' if fn(*args) succeeds, else the errno name (for child processes)."""
    try:
        r = fn(*args, **kw)
    except OSError as e:
        return errname(e.errno)
    if fn is os.open and isinstance(r, int):
        os.close(r)
    return "ok"


def need_root():
    if os.geteuid() != 0:
        raise Skip("needs root")


def write_all(fd: int, data: bytes):
    mv = memoryview(data)
    while mv:
        n = os.write(fd, mv)
        if n <= 0:
            fail(f"write() returned {n}")
        mv = mv[n:]


def read_all(fd: int, chunk: int = 256 * KiB) -> bytes:
    out = []
    while True:
        b = os.read(fd, chunk)
        if not b:
            return b"".join(out)
        out.append(b)


def wfile(path, data: bytes = b"", mode: int = 0o644):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)


def rfile(path) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_all(fd)
    finally:
        os.close(fd)


def mode_of(path, follow=True) -> int:
    return stat.S_IMODE(os.stat(path, follow_symlinks=follow).st_mode)


def list_names(path, cap: int = 100_000) -> list[str]:
    """Names in a directory via scandir, refusing to loop forever."""
    names = []
    with os.scandir(path) as it:
        for e in it:
            names.append(e.name)
            if len(names) > cap:
                fail(f"readdir returned more than {cap} entries (looping offsets?)")
    return names


def no_dups(names: list, what: str):
    if len(set(names)) != len(names):
        seen, dups = set(), set()
        for n in names:
            (dups if n in seen else seen).add(n)
        fail(f"{what}: duplicate entries {_short(sorted(dups))}")


def pattern_bytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def now_ns() -> int:
    return time.time_ns()


def expect_near_now(ts_ns: int, t0: int, what: str):
    t1 = now_ns()
    expect(t0 - NOW_SLACK_NS <= ts_ns <= t1 + NOW_SLACK_NS,
           f"{what}: {ts_ns} not within [{t0}, {t1}] (+-1s)")


def ctime_advances(path, op: Callable[[], None], what: str, follow=True):
    before = os.stat(path, follow_symlinks=follow).st_ctime_ns
    time.sleep(TICK_S)
    op()
    after = os.stat(path, follow_symlinks=follow).st_ctime_ns
    expect(after > before, f"ctime not updated by {what} (before {before}, after {after})")


# ---- running code as another user in a forked child ----------------------

def in_child(fn: Callable[[], object], *, uid: int | None = None, gid: int | None = None,
             groups: Iterable[int] = (), timeout: float = 20.0):
    """Run fn() in a forked child (optionally after dropping to uid/gid) and
    return its (picklable) result.  Exceptions in the child become FAIL."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            try:
                if uid is not None:
                    os.setgroups(list(groups))
                    os.setgid(gid if gid is not None else uid)
                    os.setuid(uid)
                res = ("ok", fn())
            except BaseException as e:  # noqa: BLE001 - report everything
                res = ("error", f"{type(e).__name__}: {e}")
            try:
                data = pickle.dumps(res)
            except Exception as e:  # noqa: BLE001
                data = pickle.dumps(("error", f"unpicklable result: {e}"))
            write_all(w, data)
            os.close(w)
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    try:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                fail(f"child process did not finish within {timeout}s")
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            b = os.read(r, 65536)
            if not b:
                break
            chunks.append(b)
    except BaseException:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(r)
    os.waitpid(pid, 0)
    if not chunks:
        fail("child process died without reporting a result")
    status, val = pickle.loads(b"".join(chunks))
    if status != "ok":
        fail(f"in child process: {val}")
    return val


def as_nobody(fn: Callable[[], object]):
    return in_child(fn, uid=NOBODY_UID, gid=NOBODY_GID, groups=())


def require_reachable_by_nobody(path: str):
    """Skip unless every ancestor of `path` is searchable by uid 65534."""
    need_root()
    p = os.path.realpath(path)
    comps = []
    while True:
        comps.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    for c in reversed(comps):
        st = os.stat(c)
        m = st.st_mode
        ok = (m & 0o001) or (st.st_uid == NOBODY_UID and m & 0o100) or \
             (st.st_gid == NOBODY_GID and m & 0o010)
        if not ok:
            raise Skip(f"{c} (mode {oct(stat.S_IMODE(m))}) is not searchable by uid "
                       f"{NOBODY_UID}; run the suite on a directory whose ancestors are o+x")


def expect_one_of(actual: str, allowed: Iterable[str], what: str):
    allowed = tuple(allowed)
    expect(actual in allowed, f"{what}: expected {'/'.join(allowed)}, got {actual}")


# ---- ctypes helpers ------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2

_RENAMEAT2_NR = {
    "x86_64": 316, "aarch64": 276, "arm64": 276, "riscv64": 276,
    "i386": 353, "i686": 353, "armv7l": 382, "ppc64le": 357, "s390x": 347,
}


def renameat2(old, new, flags: int):
    """renameat2(AT_FDCWD, old, AT_FDCWD, new, flags) via syscall(2)."""
    nr = _RENAMEAT2_NR.get(platform.machine())
    if nr is None:
        raise Skip(f"renameat2 syscall number unknown for {platform.machine()}")
    res = _libc.syscall(ctypes.c_long(nr), ctypes.c_long(AT_FDCWD), ctypes.c_char_p(os.fsencode(old)),
                        ctypes.c_long(AT_FDCWD), ctypes.c_char_p(os.fsencode(new)), ctypes.c_ulong(flags))
    if res != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), old, None, new)


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _ts(v) -> _Timespec:
    if v == "now":
        return _Timespec(0, UTIME_NOW)
    if v == "omit":
        return _Timespec(0, UTIME_OMIT)
    s, ns = divmod(int(v), 1_000_000_000)
    return _Timespec(s, ns)


def utimensat(path, atime, mtime, follow=True):
    """utimensat(2); atime/mtime are ns ints or the strings 'now' / 'omit'."""
    ts = (_Timespec * 2)(_ts(atime), _ts(mtime))
    res = _libc.utimensat(ctypes.c_int(AT_FDCWD), ctypes.c_char_p(os.fsencode(path)), ts,
                          ctypes.c_int(0 if follow else AT_SYMLINK_NOFOLLOW))
    if res != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), path)


class _Dirent(ctypes.Structure):  # glibc struct dirent on LP64
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]


DT_UNKNOWN, DT_FIFO, DT_CHR, DT_DIR, DT_BLK, DT_REG, DT_LNK, DT_SOCK = 0, 1, 2, 4, 6, 8, 10, 12

_readdir = getattr(_libc, "readdir64", None) or _libc.readdir
_libc.opendir.restype = ctypes.c_void_p
_libc.opendir.argtypes = [ctypes.c_char_p]
_readdir.restype = ctypes.POINTER(_Dirent)
_readdir.argtypes = [ctypes.c_void_p]
_libc.closedir.argtypes = [ctypes.c_void_p]
_libc.telldir.restype = ctypes.c_long
_libc.telldir.argtypes = [ctypes.c_void_p]
_libc.seekdir.restype = None
_libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
_libc.rewinddir.restype = None
_libc.rewinddir.argtypes = [ctypes.c_void_p]


class RawDir:
    """opendir/readdir/telldir/seekdir/rewinddir through libc (exposes d_type, d_ino)."""

    def __init__(self, path):
        if ctypes.sizeof(ctypes.c_long) != 8:
            raise Skip("raw dirent layout only implemented for LP64")
        ctypes.set_errno(0)
        self.dirp = _libc.opendir(os.fsencode(path))
        if not self.dirp:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), path)

    def read(self):
        """Next entry as (name: bytes, d_ino, d_type) or None at the end."""
        ctypes.set_errno(0)
        p = _readdir(self.dirp)
        if not p:
            e = ctypes.get_errno()
            if e:
                raise OSError(e, os.strerror(e))
            return None
        d = p.contents
        return (d.d_name, d.d_ino, d.d_type)

    def read_all(self, cap: int = 100_000):
        out = []
        while (e := self.read()) is not None:
            out.append(e)
            if len(out) > cap:
                fail(f"readdir returned more than {cap} entries (looping offsets?)")
        return out

    def tell(self) -> int:
        return _libc.telldir(self.dirp)

    def seek(self, pos: int):
        _libc.seekdir(self.dirp, pos)

    def rewind(self):
        _libc.rewinddir(self.dirp)

    def close(self):
        if self.dirp:
            _libc.closedir(self.dirp)
            self.dirp = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def xattr_or_skip(path, name, value, flags=0, follow=True):
    """setxattr, turning 'not supported at all' into SKIP."""
    try:
        os.setxattr(path, name, value, flags, follow_symlinks=follow)
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise Skip(f"user xattrs not supported ({errname(e.errno)})")
        raise


def make_entries(d, n, prefix="entry-", width=60):
    """Create n files with long names (so listings span several getdents batches)."""
    names = []
    for i in range(n):
        name = f"{prefix}{i:05d}-".ljust(width, "x")
        fd = os.open(j(d, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.close(fd)
        names.append(name)
    return names


# ==========================================================================
# checks: file I/O
# ==========================================================================

@check
def check_io_create_read_write(d):
    """open(O_CREAT|O_EXCL) makes an empty regular file; write() returns the byte count
    and advances the offset; read() returns the data, then b'' at EOF."""
    p = j(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        st = os.fstat(fd)
        expect(stat.S_ISREG(st.st_mode), f"new file mode {oct(st.st_mode)} is not S_IFREG")
        eq(st.st_size, 0, "size of new file")
        eq(os.write(fd, b"hello world"), 11, "write() return value")
        eq(os.lseek(fd, 0, os.SEEK_CUR), 11, "offset after write")
        eq(os.fstat(fd).st_size, 11, "fstat size after write")
        os.lseek(fd, 0, os.SEEK_SET)
        eq(os.read(fd, 100), b"hello world", "read back")
        eq(os.read(fd, 100), b"", "read at EOF")
    finally:
        os.close(fd)
    eq(rfile(p), b"hello world", "content after reopen")
    eq(os.stat(p).st_size, 11, "stat size")


@check
def check_io_write_at_offsets(d):
    """Writes at arbitrary offsets (middle overwrite, append at SEEK_END, past EOF)
    land exactly there; the gap left by a write past EOF reads as zeros."""
    p = j(d, "f")
    wfile(p, b"0123456789")
    fd = os.open(p, os.O_RDWR)
    try:
        os.lseek(fd, 3, os.SEEK_SET)
        os.write(fd, b"abc")
        eq(os.lseek(fd, 0, os.SEEK_END), 10, "SEEK_END offset")
        os.write(fd, b"XY")
        eq(os.lseek(fd, 20, os.SEEK_SET), 20, "lseek past EOF")
        os.write(fd, b"Z")
        eq(os.lseek(fd, -1, os.SEEK_END), 20, "SEEK_END - 1")
        eq(os.fstat(fd).st_size, 21, "size")
    finally:
        os.close(fd)
    eq(rfile(p), b"012abc6789XY" + b"\0" * 8 + b"Z", "content")


@check
def check_io_o_append(d):
    """O_APPEND: every write goes to the current end of file, even after lseek(0)
    and even when another O_APPEND descriptor extended the file meanwhile."""
    p = j(d, "f")
    wfile(p, b"123")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    fd2 = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"abc")
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"def")
        eq(os.lseek(fd, 0, os.SEEK_CUR), 9, "offset after append write")
        os.write(fd2, b"G")
        os.write(fd, b"H")
        os.write(fd2, b"I")
    finally:
        os.close(fd)
        os.close(fd2)
    eq(rfile(p), b"123abcdefGHI", "content")


@check
def check_io_o_trunc(d):
    """open(O_TRUNC) on an existing file with write access truncates it to 0 bytes
    (for O_WRONLY and O_RDWR|O_CREAT) and keeps the inode."""
    p = j(d, "f")
    wfile(p, b"x" * 5000)
    ino = os.stat(p).st_ino
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    eq(os.fstat(fd).st_size, 0, "size right after O_TRUNC open")
    os.write(fd, b"ab")
    os.close(fd)
    eq(rfile(p), b"ab", "content after O_TRUNC + write")
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.close(fd)
    eq(os.stat(p).st_size, 0, "size after O_RDWR|O_CREAT|O_TRUNC")
    eq(os.stat(p).st_ino, ino, "inode number after O_TRUNC")


@check
def check_io_o_excl(d):
    """O_CREAT|O_EXCL fails with EEXIST on an existing file, directory or (even
    dangling) symlink, and succeeds on a new name."""
    f, sub, ln = j(d, "f"), j(d, "sub"), j(d, "dangling")
    wfile(f, b"keep")
    os.mkdir(sub)
    os.symlink("nowhere", ln)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    expect_errno(errno.EEXIST, os.open, f, flags, 0o644, what="O_EXCL on existing file")
    expect_errno(errno.EEXIST, os.open, sub, flags, 0o644, what="O_EXCL on existing dir")
    expect_errno(errno.EEXIST, os.open, ln, flags, 0o644, what="O_EXCL on dangling symlink")
    eq(rfile(f), b"keep", "existing file untouched")
    expect(not os.path.lexists(j(d, "nowhere")), "O_EXCL through dangling symlink created the target")
    fd = os.open(j(d, "new"), flags, 0o644)
    os.close(fd)
    expect(os.path.isfile(j(d, "new")), "O_EXCL on new name did not create the file")


@check
def check_io_sparse_hole(d):
    """A 1-byte write at offset 1 MiB gives size 1 MiB + 1; the hole reads back as zeros."""
    p = j(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        eq(os.pwrite(fd, b"!", MiB), 1, "pwrite at 1 MiB")
        eq(os.fstat(fd).st_size, MiB + 1, "size")
        eq(os.pread(fd, 4096, 512 * KiB), b"\0" * 4096, "hole middle")
    finally:
        os.close(fd)
    data = rfile(p)
    eq(len(data), MiB + 1, "bytes read")
    expect(data[:MiB] == bytes(MiB), "hole does not read as zeros")
    eq(data[MiB:], b"!", "byte after hole")


@check
def check_io_pread_pwrite(d):
    """pread/pwrite use the given offset and do not move the file offset."""
    p = j(d, "f")
    wfile(p, b"abcdefghij")
    fd = os.open(p, os.O_RDWR)
    try:
        os.lseek(fd, 2, os.SEEK_SET)
        eq(os.pwrite(fd, b"XYZ", 5), 3, "pwrite return")
        eq(os.lseek(fd, 0, os.SEEK_CUR), 2, "offset after pwrite")
        eq(os.pread(fd, 4, 4), b"eXYZ", "pread")
        eq(os.lseek(fd, 0, os.SEEK_CUR), 2, "offset after pread")
        eq(os.read(fd, 3), b"cde", "read continues from unchanged offset")
        eq(os.pwrite(fd, b"END", 10), 3, "pwrite at EOF")
    finally:
        os.close(fd)
    eq(rfile(p), b"abcdeXYZijEND", "content")


@check
def check_io_read_past_eof(d):
    """read() at EOF and pread() beyond EOF return b''; seeking past EOF
    without writing does not change the size."""
    p = j(d, "f")
    wfile(p, b"12345")
    fd = os.open(p, os.O_RDWR)
    try:
        eq(os.pread(fd, 10, 5), b"", "pread at EOF")
        eq(os.pread(fd, 10, 1000), b"", "pread beyond EOF")
        eq(os.pread(fd, 10, 3), b"45", "pread straddling EOF")
        os.lseek(fd, 4096, os.SEEK_SET)
        eq(os.read(fd, 10), b"", "read after lseek beyond EOF")
        eq(os.fstat(fd).st_size, 5, "size after lseek beyond EOF")
    finally:
        os.close(fd)


@check
def check_io_128k_boundaries(d):
    """Data written in odd-sized chunks across 128 KiB boundaries reads back exactly,
    including reads and overwrites that straddle the boundaries."""
    B = 128 * KiB
    size = 3 * B + 12345
    data = bytearray(pattern_bytes(size, 128))
    p = j(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        sizes = [1, 4095, 4097, 65537, B - 1, B + 1, 7, B]
        off, i = 0, 0
        while off < size:
            n = min(sizes[i % len(sizes)], size - off)
            eq(os.write(fd, data[off:off + n]), n, f"write of {n} bytes at {off}")
            off += n
            i += 1
        for o in (0, B - 1, B, B + 1, 2 * B - 3, 3 * B - 100, size - 50):
            eq(os.pread(fd, 200, o), bytes(data[o:o + 200]), f"pread(200) at {o}")
        patch = b"P" * 300
        os.pwrite(fd, patch, 2 * B - 150)
        data[2 * B - 150:2 * B + 150] = patch
        eq(os.pread(fd, 400, 2 * B - 200), bytes(data[2 * B - 200:2 * B + 200]), "read across patched boundary")
    finally:
        os.close(fd)
    fd = os.open(p, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, B)
            if not b:
                break
            chunks.append(b)
    finally:
        os.close(fd)
    got = b"".join(chunks)
    eq(len(got), size, "size read back")
    expect(got == bytes(data), "content read back in 128 KiB reads differs")


@check
def check_io_large_file_8mib(d):
    """An 8 MiB file written in 1 MiB chunks reads back with the same SHA-256,
    and random pread()s match."""
    size = 8 * MiB
    data = pattern_bytes(size, 8)
    p = j(d, "big")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, size, MiB):
            write_all(fd, data[off:off + MiB])
        os.fsync(fd)
    finally:
        os.close(fd)
    eq(os.stat(p).st_size, size, "size")
    fd = os.open(p, os.O_RDONLY)
    try:
        h = hashlib.sha256()
        while True:
            b = os.read(fd, 64 * KiB)
            if not b:
                break
            h.update(b)
        eq(h.hexdigest(), hashlib.sha256(data).hexdigest(), "sha256 of content")
        rng = random.Random(1)
        for _ in range(32):
            o = rng.randrange(size)
            n = rng.randrange(1, 100_000)
            eq(os.pread(fd, n, o), data[o:o + n], f"pread({n}) at {o}")
    finally:
        os.close(fd)


@check
def check_io_size_visible_across_fds(d):
    """Data written through one descriptor is immediately visible through another
    open file description: fstat size, lseek(SEEK_END) and read."""
    p = j(d, "f")
    fd1 = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    fd2 = os.open(p, os.O_RDONLY)
    try:
        eq(os.fstat(fd2).st_size, 0, "initial size via fd2")
        write_all(fd1, b"a" * 100)
        eq(os.fstat(fd2).st_size, 100, "size via fd2 after write via fd1")
        eq(os.lseek(fd2, 0, os.SEEK_END), 100, "SEEK_END via fd2")
        os.pwrite(fd1, b"tail", 200)
        eq(os.pread(fd2, 10, 198), b"\0\0tail", "read via fd2 after extending pwrite")
        eq(os.stat(p).st_size, 204, "stat(path) size")
    finally:
        os.close(fd1)
        os.close(fd2)


@check
def check_io_posix_fallocate(d):
    """posix_fallocate() extends the file with zeros and keeps existing data;
    allocating inside the file changes nothing."""
    p = j(d, "f")
    wfile(p, b"abc")
    fd = os.open(p, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 100_000)
        eq(os.fstat(fd).st_size, 100_000, "size after posix_fallocate")
        os.posix_fallocate(fd, 10, 1000)
        eq(os.fstat(fd).st_size, 100_000, "size after fallocate inside file")
    finally:
        os.close(fd)
    eq(rfile(p), b"abc" + bytes(100_000 - 3), "content")


@check
def check_io_copy_file_range(d):
    """copy_file_range() copies exactly the requested range, with and without offsets."""
    src, dst = j(d, "src"), j(d, "dst")
    data = pattern_bytes(300 * KiB + 7, 3)
    wfile(src, data)
    fi = os.open(src, os.O_RDONLY)
    fo = os.open(dst, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        done = 0
        while done < len(data):
            try:
                n = os.copy_file_range(fi, fo, len(data) - done)
            except OSError as e:
                if e.errno == errno.ENOSYS:
                    raise Skip("copy_file_range not available")
                raise
            expect(n > 0, f"copy_file_range returned {n} before the end")
            done += n
        n = os.copy_file_range(fi, fo, 5000, 1000, 5)
        eq(n, 5000, "copy_file_range with offsets")
    finally:
        os.close(fi)
        os.close(fo)
    expected = bytearray(data)
    expected[5:5005] = data[1000:6000]
    eq(rfile(dst), bytes(expected), "copied content")


@check
def check_io_seek_data_hole(d):
    """lseek SEEK_DATA/SEEK_HOLE obey the (possibly trivial) Linux contract:
    data at 0 is found at 0, a hole is reported at or after the data, at or before EOF;
    both give ENXIO at/after EOF."""
    p = j(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        write_all(fd, b"d" * 4096)
        os.pwrite(fd, b"e" * 4096, MiB)
        size = MiB + 4096
        eq(os.lseek(fd, 0, os.SEEK_DATA), 0, "SEEK_DATA from 0")
        h = os.lseek(fd, 0, os.SEEK_HOLE)
        expect(4096 <= h <= size, f"SEEK_HOLE from 0 = {h}, want in [4096, {size}]")
        dt = os.lseek(fd, 8192, os.SEEK_DATA)
        expect(8192 <= dt <= MiB, f"SEEK_DATA from 8192 = {dt}, want in [8192, {MiB}]")
        eq(os.lseek(fd, MiB, os.SEEK_DATA), MiB, "SEEK_DATA at start of 2nd extent")
        eq(os.lseek(fd, MiB + 10, os.SEEK_HOLE), size, "SEEK_HOLE in last extent = EOF")
        expect_errno(errno.ENXIO, os.lseek, fd, size, os.SEEK_DATA, what="SEEK_DATA at EOF")
        expect_errno(errno.ENXIO, os.lseek, fd, size + 1, os.SEEK_HOLE, what="SEEK_HOLE past EOF")
    finally:
        os.close(fd)


# ==========================================================================
# truncate / sync
# ==========================================================================

@check
def check_trunc_truncate_path(d):
    """truncate(path) grows with zeros and shrinks keeping the prefix."""
    p = j(d, "f")
    wfile(p, b"abcdef")
    os.truncate(p, 10)
    eq(rfile(p), b"abcdef\0\0\0\0", "after grow")
    os.truncate(p, 3)
    eq(rfile(p), b"abc", "after shrink")
    os.truncate(p, 0)
    eq(os.stat(p).st_size, 0, "size after truncate to 0")


@check
def check_trunc_ftruncate_fd(d):
    """ftruncate(fd) grows with zeros and shrinks; size visible via fstat and stat."""
    p = j(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        write_all(fd, b"0123456789")
        os.ftruncate(fd, 200_000)
        eq(os.fstat(fd).st_size, 200_000, "fstat after grow")
        eq(os.pread(fd, 20, 5), b"56789" + bytes(15), "grown area")
        eq(os.pread(fd, 10, 199_990), bytes(10), "end of grown area")
        os.ftruncate(fd, 4)
        eq(os.fstat(fd).st_size, 4, "fstat after shrink")
        eq(os.stat(p).st_size, 4, "stat after shrink")
        eq(os.pread(fd, 100, 0), b"0123", "content after shrink")
    finally:
        os.close(fd)


@check
def check_trunc_shrink_then_grow_zeroes(d):
    """After shrinking a file, growing it again (truncate or write past EOF) exposes
    zeros, never the old data that was cut off."""
    p = j(d, "f")
    wfile(p, b"A" * 10000)
    fd = os.open(p, os.O_RDWR)
    try:
        os.ftruncate(fd, 100)
        os.ftruncate(fd, 10000)
        eq(os.pread(fd, 10000, 0), b"A" * 100 + bytes(9900), "after shrink+grow via ftruncate")
        os.ftruncate(fd, 50)
        os.pwrite(fd, b"Z", 5000)
        eq(os.pread(fd, 10000, 0), b"A" * 50 + bytes(4950) + b"Z", "after shrink+write past EOF")
    finally:
        os.close(fd)


@check
def check_sync_fsync_fdatasync(d):
    """fsync() and fdatasync() succeed on written files (also read-only fds),
    and fsync() on a directory fd succeeds."""
    p = j(d, "f")
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        write_all(fd, b"data")
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    eq(rfile(p), b"data", "content")


# ==========================================================================
# directories
# ==========================================================================

@check
def check_dir_mkdir_rmdir(d):
    """mkdir creates an empty directory (S_IFDIR), rmdir removes it, then ENOENT."""
    p = j(d, "sub")
    os.mkdir(p, 0o755)
    st = os.stat(p)
    expect(stat.S_ISDIR(st.st_mode), f"mode {oct(st.st_mode)} not S_IFDIR")
    eq(list_names(p), [], "entries of new dir")
    os.rmdir(p)
    expect_errno(errno.ENOENT, os.stat, p, what="stat after rmdir")
    expect_errno(errno.ENOENT, os.rmdir, p, what="second rmdir")
    eq(list_names(d), [], "parent listing")


@check
def check_dir_mkdir_eexist(d):
    """mkdir on an existing directory, file or symlink fails with EEXIST."""
    os.mkdir(j(d, "sub"))
    wfile(j(d, "f"))
    os.symlink("nowhere", j(d, "ln"))
    for n in ("sub", "f", "ln"):
        expect_errno(errno.EEXIST, os.mkdir, j(d, n), what=f"mkdir over existing {n}")
    expect(os.path.isfile(j(d, "f")), "file replaced")


@check
def check_dir_rmdir_enotempty(d):
    """rmdir of a non-empty directory fails with ENOTEMPTY (POSIX also allows EEXIST);
    the directory and its content stay."""
    p = j(d, "sub")
    os.mkdir(p)
    wfile(j(p, "f"), b"x")
    expect_errno((errno.ENOTEMPTY, errno.EEXIST), os.rmdir, p, what="rmdir non-empty (file)")
    os.unlink(j(p, "f"))
    os.mkdir(j(p, "inner"))
    expect_errno((errno.ENOTEMPTY, errno.EEXIST), os.rmdir, p, what="rmdir non-empty (subdir)")
    expect(os.path.isdir(j(p, "inner")), "content disappeared")


@check
def check_dir_enotdir(d):
    """Using a regular file as a directory component gives ENOTDIR
    (rmdir file, mkdir file/x, open file/x, stat file/x)."""
    f = j(d, "f")
    wfile(f)
    expect_errno(errno.ENOTDIR, os.rmdir, f, what="rmdir on file")
    expect_errno(errno.ENOTDIR, os.mkdir, j(f, "x"), what="mkdir file/x")
    expect_errno(errno.ENOTDIR, os.open, j(f, "x"), os.O_CREAT | os.O_WRONLY, 0o644, what="open file/x O_CREAT")
    expect_errno(errno.ENOTDIR, os.stat, j(f, "x"), what="stat file/x")
    expect_errno(errno.ENOTDIR, os.listdir, f, what="listdir on file")


@check
def check_dir_nlink(d):
    """Directory st_nlink is 2 + number of subdirectories; files don't count;
    it drops again on rmdir."""
    p = j(d, "top")
    os.mkdir(p)
    eq(os.stat(p).st_nlink, 2, "nlink of empty dir")
    for n in ("a", "b", "c"):
        os.mkdir(j(p, n))
    wfile(j(p, "file"))
    eq(os.stat(p).st_nlink, 5, "nlink with 3 subdirs + 1 file")
    eq(os.stat(j(p, "a")).st_nlink, 2, "nlink of leaf subdir")
    os.rmdir(j(p, "b"))
    eq(os.stat(p).st_nlink, 4, "nlink after rmdir of one subdir")
    eq(os.stat(j(p, "file")).st_nlink, 1, "nlink of regular file")


# ==========================================================================
# unlink
# ==========================================================================

@check
def check_unlink_open_file(d):
    """An unlinked file stays usable through an open fd (read, write, extend) until
    close; its name is gone at once and fstat reports st_nlink == 0."""
    p = j(d, "f")
    wfile(p, b"original")
    fd = os.open(p, os.O_RDWR)
    try:
        os.unlink(p)
        expect_errno(errno.ENOENT, os.stat, p, what="stat after unlink")
        eq(list_names(d), [], "listing after unlink")
        eq(os.fstat(fd).st_nlink, 0, "fstat st_nlink after unlink")
        eq(os.pread(fd, 100, 0), b"original", "read after unlink")
        os.pwrite(fd, b"-more", 8)
        os.pwrite(fd, b"!", 100_000)
        eq(os.fstat(fd).st_size, 100_001, "size after writes to unlinked file")
        eq(os.pread(fd, 13, 0), b"original-more", "read back writes to unlinked file")
        # a new file under the same name is a different file
        wfile(p, b"new")
        eq(os.pread(fd, 13, 0), b"original-more", "old fd after name reuse")
        eq(rfile(p), b"new", "new file under the reused name")
        expect(os.stat(p).st_ino != os.fstat(fd).st_ino,
               "new file has the same st_ino as the still-open unlinked file")
    finally:
        os.close(fd)
    eq(rfile(p), b"new", "new file after closing the old fd")


# ==========================================================================
# rename
# ==========================================================================

@check
def check_rename_file_over_file(d):
    """rename(a, b) over an existing file atomically replaces b with a (same inode as a);
    an fd open on the old b still reads the old content; a is gone."""
    a, b = j(d, "a"), j(d, "b")
    wfile(a, b"AAAA")
    wfile(b, b"BBBBBB")
    ino_a = os.stat(a).st_ino
    fd = os.open(b, os.O_RDONLY)
    try:
        os.rename(a, b)
        eq(rfile(b), b"AAAA", "content of target")
        eq(os.stat(b).st_ino, ino_a, "inode of target after rename")
        expect_errno(errno.ENOENT, os.stat, a, what="stat source after rename")
        eq(os.pread(fd, 100, 0), b"BBBBBB", "fd on replaced file")
        eq(os.fstat(fd).st_nlink, 0, "nlink of replaced (open) file")
    finally:
        os.close(fd)
    eq(sorted(list_names(d)), ["b"], "listing")


@check
def check_rename_dir_over_empty_dir(d):
    """rename(dir, emptydir) replaces the empty directory; content moves along;
    the parent's nlink drops by one."""
    a, b = j(d, "a"), j(d, "b")
    os.mkdir(a)
    wfile(j(a, "f"), b"x")
    os.mkdir(b)
    eq(os.stat(d).st_nlink, 4, "parent nlink before")
    ino = os.stat(a).st_ino
    os.rename(a, b)
    eq(os.stat(b).st_ino, ino, "inode of moved dir")
    eq(rfile(j(b, "f")), b"x", "content of moved dir")
    expect_errno(errno.ENOENT, os.stat, a, what="stat old name")
    eq(os.stat(d).st_nlink, 3, "parent nlink after")


@check
def check_rename_dir_over_nonempty_dir(d):
    """rename(dir, nonemptydir) fails with ENOTEMPTY (or EEXIST); nothing changes."""
    a, b = j(d, "a"), j(d, "b")
    os.mkdir(a)
    os.mkdir(b)
    wfile(j(b, "keep"), b"k")
    expect_errno((errno.ENOTEMPTY, errno.EEXIST), os.rename, a, b, what="rename dir over non-empty dir")
    expect(os.path.isdir(a), "source vanished")
    eq(rfile(j(b, "keep")), b"k", "target content")


@check
def check_rename_file_over_dir(d):
    """rename(file, dir) fails with EISDIR."""
    wfile(j(d, "f"))
    os.mkdir(j(d, "sub"))
    expect_errno(errno.EISDIR, os.rename, j(d, "f"), j(d, "sub"), what="rename file over dir")
    expect(os.path.isfile(j(d, "f")) and os.path.isdir(j(d, "sub")), "entries changed")


@check
def check_rename_dir_over_file(d):
    """rename(dir, file) fails with ENOTDIR."""
    wfile(j(d, "f"))
    os.mkdir(j(d, "sub"))
    expect_errno(errno.ENOTDIR, os.rename, j(d, "sub"), j(d, "f"), what="rename dir over file")
    expect(os.path.isfile(j(d, "f")) and os.path.isdir(j(d, "sub")), "entries changed")


@check
def check_rename_into_own_subdir(d):
    """Renaming a directory into itself or its own subdirectory fails with EINVAL."""
    a = j(d, "a")
    os.makedirs(j(a, "b", "c"))
    expect_errno(errno.EINVAL, os.rename, a, j(a, "x"), what="rename a -> a/x")
    expect_errno(errno.EINVAL, os.rename, a, j(a, "b", "c", "x"), what="rename a -> a/b/c/x")
    expect(os.path.isdir(j(a, "b", "c")), "tree changed")


@check
def check_rename_to_itself(d):
    """rename(x, x) succeeds and changes nothing (file and dir); rename between two
    hard links of the same file is a successful no-op that keeps both names."""
    f, sub, ln = j(d, "f"), j(d, "sub"), j(d, "ln")
    wfile(f, b"same")
    os.mkdir(sub)
    os.rename(f, f)
    os.rename(sub, sub)
    eq(rfile(f), b"same", "content")
    expect(os.path.isdir(sub), "dir vanished")
    os.link(f, ln)
    os.rename(f, ln)
    expect(os.path.exists(f) and os.path.exists(ln), "rename between hard links removed a name")
    eq(os.stat(f).st_nlink, 2, "nlink after no-op rename")


@check
def check_rename_across_dirs(d):
    """Moving a file and a directory to another directory keeps their inodes,
    fixes both parents' nlink and '..', and an fd open on the moved file stays valid."""
    d1, d2 = j(d, "d1"), j(d, "d2")
    os.mkdir(d1)
    os.mkdir(d2)
    f = j(d1, "f")
    wfile(f, b"data")
    os.mkdir(j(d1, "sub"))
    ino_f, ino_sub = os.stat(f).st_ino, os.stat(j(d1, "sub")).st_ino
    fd = os.open(f, os.O_RDWR)
    try:
        os.rename(f, j(d2, "g"))
        os.pwrite(fd, b"DATA", 0)
    finally:
        os.close(fd)
    eq(os.stat(j(d2, "g")).st_ino, ino_f, "file inode after move")
    eq(rfile(j(d2, "g")), b"DATA", "write via fd opened before the move")
    eq(os.stat(d1).st_nlink, 3, "old parent nlink before dir move")
    os.rename(j(d1, "sub"), j(d2, "sub2"))
    eq(os.stat(j(d2, "sub2")).st_ino, ino_sub, "dir inode after move")
    eq(os.stat(d1).st_nlink, 2, "old parent nlink after dir move")
    eq(os.stat(d2).st_nlink, 3, "new parent nlink after dir move")
    eq(os.stat(j(d2, "sub2", "..")).st_ino, os.stat(d2).st_ino, "'..' of moved dir")
    eq(list_names(d1), [], "old parent listing")
    eq(sorted(list_names(d2)), ["g", "sub2"], "new parent listing")


def _renameat2_or_status(old, new, flags, flagname):
    try:
        renameat2(old, new, flags)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise FlagEinval(f"filesystem rejects {flagname} with EINVAL")
        if e.errno == errno.ENOSYS:
            raise Skip("renameat2 syscall not available (ENOSYS)")
        raise


@check
def check_rename_noreplace(d):
    """renameat2(RENAME_NOREPLACE) fails with EEXIST if the target exists (both
    files untouched) and renames normally otherwise."""
    a, b, c = j(d, "a"), j(d, "b"), j(d, "c")
    wfile(a, b"A")
    wfile(b, b"B")
    try:
        renameat2(a, b, RENAME_NOREPLACE)
    except OSError as e:
        if e.errno == errno.EINVAL:
            raise FlagEinval("filesystem rejects RENAME_NOREPLACE with EINVAL")
        if e.errno == errno.ENOSYS:
            raise Skip("renameat2 syscall not available (ENOSYS)")
        eq(errname(e.errno), "EEXIST", "RENAME_NOREPLACE onto existing file")
    else:
        fail("RENAME_NOREPLACE onto existing file succeeded")
    eq((rfile(a), rfile(b)), (b"A", b"B"), "contents after refused rename")
    _renameat2_or_status(a, c, RENAME_NOREPLACE, "RENAME_NOREPLACE")
    expect(not os.path.exists(a), "source still exists")
    eq(rfile(c), b"A", "renamed content")


@check
def check_rename_exchange(d):
    """renameat2(RENAME_EXCHANGE) atomically swaps two names (contents and inodes),
    also file<->directory; ENOENT if the second name does not exist."""
    a, b, sub = j(d, "a"), j(d, "b"), j(d, "sub")
    wfile(a, b"A")
    wfile(b, b"BB")
    os.mkdir(sub)
    wfile(j(sub, "inner"), b"i")
    ia, ib = os.stat(a).st_ino, os.stat(b).st_ino
    _renameat2_or_status(a, b, RENAME_EXCHANGE, "RENAME_EXCHANGE")
    eq((rfile(a), rfile(b)), (b"BB", b"A"), "contents after exchange")
    eq((os.stat(a).st_ino, os.stat(b).st_ino), (ib, ia), "inodes after exchange")
    _renameat2_or_status(a, sub, RENAME_EXCHANGE, "RENAME_EXCHANGE of a file with a directory")
    expect(os.path.isdir(a) and os.path.isfile(sub), "file<->dir exchange did not swap types")
    eq(rfile(j(a, "inner")), b"i", "content of exchanged dir")
    eq(rfile(sub), b"BB", "content of exchanged file")
    try:
        renameat2(a, j(d, "missing"), RENAME_EXCHANGE)
    except OSError as e:
        eq(errname(e.errno), "ENOENT", "RENAME_EXCHANGE with missing target")
    else:
        fail("RENAME_EXCHANGE with missing target succeeded")


# ==========================================================================
# inode numbers and hard links
# ==========================================================================

@check
def check_ino_stable(d):
    """st_ino is the same across repeated stat, fstat, lstat and renames
    (same dir and across dirs)."""
    p = j(d, "f")
    wfile(p, b"x")
    ino = os.stat(p).st_ino
    eq(os.stat(p).st_ino, ino, "second stat")
    eq(os.lstat(p).st_ino, ino, "lstat")
    fd = os.open(p, os.O_RDONLY)
    try:
        eq(os.fstat(fd).st_ino, ino, "fstat")
    finally:
        os.close(fd)
    os.rename(p, j(d, "g"))
    eq(os.stat(j(d, "g")).st_ino, ino, "after rename")
    os.mkdir(j(d, "sub"))
    os.rename(j(d, "g"), j(d, "sub", "h"))
    eq(os.stat(j(d, "sub", "h")).st_ino, ino, "after rename to other dir")
    dino = os.stat(j(d, "sub")).st_ino
    os.rename(j(d, "sub"), j(d, "sub2"))
    eq(os.stat(j(d, "sub2")).st_ino, dino, "dir inode after rename")
    eq(os.stat(j(d, "sub2", "h")).st_ino, ino, "file inode after parent rename")


@check
def check_ino_distinct(d):
    """Distinct files, directories and symlinks have distinct st_ino (same st_dev)."""
    inos = {}
    for i in range(40):
        wfile(j(d, f"f{i}"))
    for i in range(5):
        os.mkdir(j(d, f"d{i}"))
        os.symlink(f"f{i}", j(d, f"l{i}"))
    for n in os.listdir(d):
        st = os.lstat(j(d, n))
        inos.setdefault(st.st_ino, []).append(n)
    inos.setdefault(os.stat(d).st_ino, []).append(".")
    dups = {k: v for k, v in inos.items() if len(v) > 1}
    expect(not dups, f"shared inode numbers: {_short(dups)}")
    devs = {os.lstat(j(d, n)).st_dev for n in os.listdir(d)}
    eq(len(devs), 1, "number of distinct st_dev values")


@check
def check_link_hardlink(d):
    """link() creates a second name for the same inode: same st_ino, st_nlink 2 on
    both, writes through one visible through the other; EEXIST if the name exists."""
    a, b = j(d, "a"), j(d, "b")
    wfile(a, b"one")
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    eq(sb.st_ino, sa.st_ino, "st_ino of link")
    eq((sa.st_nlink, sb.st_nlink), (2, 2), "st_nlink of both names")
    wfile(b, b"two")
    eq(rfile(a), b"two", "write via b read via a")
    os.link(a, j(d, "c"))
    eq(os.stat(b).st_nlink, 3, "st_nlink after third link")
    expect_errno(errno.EEXIST, os.link, a, b, what="link onto existing name")
    expect_errno(errno.ENOENT, os.link, j(d, "missing"), j(d, "x"), what="link from missing")


@check
def check_link_unlink_one_keeps_other(d):
    """Unlinking one hard link leaves the other readable/writable with st_nlink 1."""
    a, b = j(d, "a"), j(d, "b")
    wfile(a, b"shared")
    os.link(a, b)
    os.unlink(a)
    eq(rfile(b), b"shared", "content via remaining link")
    eq(os.stat(b).st_nlink, 1, "st_nlink after unlink")
    wfile(b, b"still")
    eq(rfile(b), b"still", "write via remaining link")
    eq(list_names(d), ["b"], "listing")


@check
def check_link_dir_eperm(d):
    """link() of a directory fails with EPERM."""
    os.mkdir(j(d, "sub"))
    expect_errno(errno.EPERM, os.link, j(d, "sub"), j(d, "sub2"), what="link(dir)")
    expect(not os.path.lexists(j(d, "sub2")), "link name created")


# ==========================================================================
# symlinks
# ==========================================================================

@check
def check_symlink_readlink(d):
    """symlink/readlink round-trip the exact target string (relative, absolute, odd);
    lstat reports S_IFLNK with st_size == len(target)."""
    targets = ["target", "/absolute/path/that/does/not/exist", "../up/./x//y",
               "with space and \u00e9", "a" * 1000]
    for i, t in enumerate(targets):
        ln = j(d, f"l{i}")
        os.symlink(t, ln)
        eq(os.readlink(ln), t, f"readlink l{i}")
        st = os.lstat(ln)
        expect(stat.S_ISLNK(st.st_mode), f"lstat l{i} mode {oct(st.st_mode)} not S_IFLNK")
        eq(st.st_size, len(os.fsencode(t)), f"lstat st_size of l{i}")
    expect_errno(errno.EEXIST, os.symlink, "x", j(d, "l0"), what="symlink over existing")


@check
def check_symlink_long_target(d):
    """A 4095-byte symlink target (PATH_MAX - 1) round-trips exactly."""
    t = ("d" * 200 + "/") * 20
    t = (t + "z" * 4095)[:4095]
    ln = j(d, "l")
    os.symlink(t, ln)
    eq(os.readlink(ln), t, "readlink of 4095-byte target")


@check
def check_symlink_lstat_vs_stat(d):
    """stat follows a symlink (target's inode/type/size); lstat does not;
    a symlinked directory works as a path component."""
    f, sub = j(d, "f"), j(d, "sub")
    wfile(f, b"12345")
    os.mkdir(sub)
    wfile(j(sub, "inner"), b"in")
    os.symlink("f", j(d, "lf"))
    os.symlink("sub", j(d, "ld"))
    s, ls = os.stat(j(d, "lf")), os.lstat(j(d, "lf"))
    eq(s.st_ino, os.stat(f).st_ino, "stat(link).st_ino")
    expect(stat.S_ISREG(s.st_mode), "stat(link) not a regular file")
    eq(s.st_size, 5, "stat(link).st_size")
    expect(stat.S_ISLNK(ls.st_mode), "lstat(link) not a symlink")
    expect(ls.st_ino != s.st_ino, "lstat and stat give the same inode")
    eq(rfile(j(d, "lf")), b"12345", "read through symlink")
    expect(os.path.isdir(j(d, "ld")), "stat(dir link) not a dir")
    eq(rfile(j(d, "ld", "inner")), b"in", "read through dir symlink component")
    eq(os.readlink(j(d, "lf")), "f", "readlink")


@check
def check_symlink_dangling(d):
    """A dangling symlink: lstat works, stat/open give ENOENT, open(O_CREAT)
    through it creates the target."""
    ln = j(d, "ln")
    os.symlink("target", ln)
    expect(stat.S_ISLNK(os.lstat(ln).st_mode), "lstat of dangling link")
    expect_errno(errno.ENOENT, os.stat, ln, what="stat dangling")
    expect_errno(errno.ENOENT, os.open, ln, os.O_RDONLY, what="open dangling")
    fd = os.open(ln, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"t")
    os.close(fd)
    eq(rfile(j(d, "target")), b"t", "target created through dangling link")
    expect(stat.S_ISLNK(os.lstat(ln).st_mode), "link still a link")


@check
def check_symlink_loop_eloop(d):
    """Resolving a symlink loop (a->b->a, self-loop) fails with ELOOP."""
    os.symlink("b", j(d, "a"))
    os.symlink("a", j(d, "b"))
    os.symlink("self", j(d, "self"))
    expect_errno(errno.ELOOP, os.stat, j(d, "a"), what="stat a->b->a")
    expect_errno(errno.ELOOP, os.open, j(d, "b"), os.O_RDONLY, what="open b->a->b")
    expect_errno(errno.ELOOP, os.stat, j(d, "self"), what="stat self-loop")
    expect_errno(errno.ELOOP, os.stat, j(d, "a", "x"), what="stat a/x")


@check
def check_symlink_o_nofollow(d):
    """open(O_NOFOLLOW) on a symlink fails with ELOOP; on a regular file it works."""
    wfile(j(d, "f"), b"x")
    os.symlink("f", j(d, "ln"))
    expect_errno(errno.ELOOP, os.open, j(d, "ln"), os.O_RDONLY | os.O_NOFOLLOW, what="O_NOFOLLOW on symlink")
    expect_errno(errno.ELOOP, os.open, j(d, "ln"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644,
                 what="O_CREAT|O_NOFOLLOW on symlink")
    fd = os.open(j(d, "f"), os.O_RDONLY | os.O_NOFOLLOW)
    os.close(fd)


@check
def check_symlink_readlink_einval(d):
    """readlink on a regular file or directory fails with EINVAL."""
    wfile(j(d, "f"))
    os.mkdir(j(d, "sub"))
    expect_errno(errno.EINVAL, os.readlink, j(d, "f"), what="readlink(file)")
    expect_errno(errno.EINVAL, os.readlink, j(d, "sub"), what="readlink(dir)")
    expect_errno(errno.ENOENT, os.readlink, j(d, "missing"), what="readlink(missing)")


# ==========================================================================
# metadata: modes, owners, times
# ==========================================================================

@check
def check_meta_chmod(d):
    """chmod/fchmod set exactly the permission bits, including setuid/setgid/sticky;
    chmod on a symlink changes the target."""
    f, sub = j(d, "f"), j(d, "sub")
    wfile(f)
    os.mkdir(sub)
    for m in (0o000, 0o600, 0o644, 0o755, 0o4755, 0o2755, 0o1644, 0o777):
        os.chmod(f, m)
        eq(mode_of(f), m, f"mode after chmod {oct(m)}")
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o640)
        eq(stat.S_IMODE(os.fstat(fd).st_mode), 0o640, "mode after fchmod")
    finally:
        os.close(fd)
    for m in (0o700, 0o1777, 0o2755, 0o555):
        os.chmod(sub, m)
        eq(mode_of(sub), m, f"dir mode after chmod {oct(m)}")
    os.chmod(sub, 0o755)
    os.symlink("f", j(d, "ln"))
    os.chmod(j(d, "ln"), 0o604)
    eq(mode_of(f), 0o604, "target mode after chmod via symlink")
    expect(stat.S_ISREG(os.stat(f).st_mode), "file type changed by chmod")


@check
def check_meta_create_mode_umask(d):
    """New files/dirs/fifos get (requested mode & ~umask): 0666->0644 and 0777->0755
    under umask 022; exact mode under umask 0."""
    old = os.umask(0o022)
    try:
        fd = os.open(j(d, "f"), os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
        os.mkdir(j(d, "sub"), 0o777)
        os.mkfifo(j(d, "fifo"), 0o666)
        eq(mode_of(j(d, "f")), 0o644, "file mode under umask 022")
        eq(mode_of(j(d, "sub")), 0o755, "dir mode under umask 022")
        eq(mode_of(j(d, "fifo")), 0o644, "fifo mode under umask 022")
        fd = os.open(j(d, "g"), os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
        eq(mode_of(j(d, "g")), 0o600, "file mode 0600")
        os.umask(0)
        fd = os.open(j(d, "h"), os.O_CREAT | os.O_WRONLY, 0o666)
        os.close(fd)
        os.mkdir(j(d, "sub2"), 0o777)
        eq(mode_of(j(d, "h")), 0o666, "file mode under umask 0")
        eq(mode_of(j(d, "sub2")), 0o777, "dir mode under umask 0")
    finally:
        os.umask(old)


@check
def check_meta_chown(d):
    """(root) chown/fchown/lchown set st_uid/st_gid exactly; -1 keeps a value;
    chown follows symlinks, lchown changes the link itself."""
    need_root()
    f = j(d, "f")
    wfile(f)
    os.chown(f, OTHER_UID, OTHER_GID)
    st = os.stat(f)
    eq((st.st_uid, st.st_gid), (OTHER_UID, OTHER_GID), "owner after chown")
    os.chown(f, -1, 777)
    st = os.stat(f)
    eq((st.st_uid, st.st_gid), (OTHER_UID, 777), "owner after chown(-1, 777)")
    fd = os.open(f, os.O_RDONLY)
    try:
        os.fchown(fd, 1, 2)
        st = os.fstat(fd)
        eq((st.st_uid, st.st_gid), (1, 2), "owner after fchown")
    finally:
        os.close(fd)
    ln = j(d, "ln")
    os.symlink("f", ln)
    os.lchown(ln, 5, 6)
    eq((os.lstat(ln).st_uid, os.lstat(ln).st_gid), (5, 6), "link owner after lchown")
    eq((os.stat(f).st_uid, os.stat(f).st_gid), (1, 2), "target owner after lchown")
    os.chown(ln, 7, 8)
    eq((os.stat(f).st_uid, os.stat(f).st_gid), (7, 8), "target owner after chown via link")
    eq((os.lstat(ln).st_uid, os.lstat(ln).st_gid), (5, 6), "link owner after chown via link")
    os.mkdir(j(d, "sub"))
    os.chown(j(d, "sub"), OTHER_UID, OTHER_GID)
    eq((os.stat(j(d, "sub")).st_uid, os.stat(j(d, "sub")).st_gid), (OTHER_UID, OTHER_GID), "dir owner")


@check
def check_meta_chown_clears_setuid(d):
    """(root) chown of a regular file clears setuid and (group-exec) setgid bits;
    chown of a directory keeps its setgid bit."""
    need_root()
    f = j(d, "f")
    wfile(f)
    os.chmod(f, 0o6755)
    os.chown(f, OTHER_UID, -1)
    eq(mode_of(f), 0o755, "mode after chown of setuid/setgid file")
    sub = j(d, "sub")
    os.mkdir(sub)
    os.chmod(sub, 0o2755)
    os.chown(sub, OTHER_UID, OTHER_GID)
    eq(mode_of(sub), 0o2755, "mode after chown of setgid dir")


@check
def check_meta_utimens_ns_roundtrip(d):
    """utimensat with explicit nanosecond times (incl. > 2^31 s) round-trips
    st_atime_ns / st_mtime_ns exactly, for files, dirs and (lutimes) symlinks."""
    f = j(d, "f")
    wfile(f)
    os.mkdir(j(d, "sub"))
    os.symlink("f", j(d, "ln"))
    cases = [(1_600_000_000_123_456_789, 1_500_000_000_987_654_321),
             (1, 999_999_999),
             (2_500_000_000_000_000_001, 2_200_000_000_500_000_000),
             (1_700_000_000_000_000_000, 1_700_000_000_000_000_000)]
    for a, m in cases:
        os.utime(f, ns=(a, m))
        st = os.stat(f)
        eq((st.st_atime_ns, st.st_mtime_ns), (a, m), "file (atime_ns, mtime_ns)")
    os.utime(j(d, "sub"), ns=cases[0])
    st = os.stat(j(d, "sub"))
    eq((st.st_atime_ns, st.st_mtime_ns), cases[0], "dir (atime_ns, mtime_ns)")
    os.utime(j(d, "ln"), ns=cases[1], follow_symlinks=False)
    st = os.lstat(j(d, "ln"))
    eq((st.st_atime_ns, st.st_mtime_ns), cases[1], "symlink (atime_ns, mtime_ns)")
    st = os.stat(f)
    eq((st.st_atime_ns, st.st_mtime_ns), cases[-1], "target times after lutimes")
    fd = os.open(f, os.O_RDONLY)
    try:
        os.utime(fd, ns=cases[0])
        st = os.fstat(fd)
        eq((st.st_atime_ns, st.st_mtime_ns), cases[0], "futimens (atime_ns, mtime_ns)")
    finally:
        os.close(fd)


@check
def check_meta_utimens_pre_epoch(d):
    """Timestamps before 1970 (negative seconds) round-trip exactly."""
    f = j(d, "f")
    wfile(f)
    a, m = -1_000_000_000_000_000_000 + 5, -86_400_000_000_000
    os.utime(f, ns=(a, m))
    st = os.stat(f)
    eq((st.st_atime_ns, st.st_mtime_ns), (a, m), "pre-1970 (atime_ns, mtime_ns)")


@check
def check_meta_utime_now_omit(d):
    """utimensat UTIME_OMIT leaves that timestamp alone, UTIME_NOW sets it to the
    current time; utime(path, NULL) (touch) sets both to now; both OMIT changes nothing."""
    f = j(d, "f")
    wfile(f)
    A, M = 1_600_000_000_111_111_111, 1_500_000_000_222_222_222
    os.utime(f, ns=(A, M))
    utimensat(f, "omit", 1_400_000_000_333_333_333)
    st = os.stat(f)
    eq((st.st_atime_ns, st.st_mtime_ns), (A, 1_400_000_000_333_333_333), "after (OMIT, T)")
    utimensat(f, 1_300_000_000_444_444_444, "omit")
    st = os.stat(f)
    eq((st.st_atime_ns, st.st_mtime_ns), (1_300_000_000_444_444_444, 1_400_000_000_333_333_333),
       "after (T, OMIT)")
    ctime = st.st_ctime_ns
    time.sleep(TICK_S)
    utimensat(f, "omit", "omit")
    st = os.stat(f)
    eq((st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns),
       (1_300_000_000_444_444_444, 1_400_000_000_333_333_333, ctime), "after (OMIT, OMIT)")
    t0 = now_ns()
    utimensat(f, "now", "omit")
    st = os.stat(f)
    expect_near_now(st.st_atime_ns, t0, "atime after (NOW, OMIT)")
    eq(st.st_mtime_ns, 1_400_000_000_333_333_333, "mtime after (NOW, OMIT)")
    os.utime(f, ns=(A, M))
    t0 = now_ns()
    utimensat(f, "omit", "now")
    st = os.stat(f)
    eq(st.st_atime_ns, A, "atime after (OMIT, NOW)")
    expect_near_now(st.st_mtime_ns, t0, "mtime after (OMIT, NOW)")
    os.utime(f, ns=(A, M))
    t0 = now_ns()
    os.utime(f)  # touch: utimensat(NULL)
    st = os.stat(f)
    expect_near_now(st.st_atime_ns, t0, "atime after touch")
    expect_near_now(st.st_mtime_ns, t0, "mtime after touch")


@check
def check_meta_mtime_ctime_on_write(d):
    """write() (even one that doesn't change the size) updates mtime and ctime to now."""
    f = j(d, "f")
    wfile(f, b"0123456789")
    OLD = 1_000_000_000_000_000_000
    os.utime(f, ns=(OLD, OLD))
    c0 = os.stat(f).st_ctime_ns
    time.sleep(TICK_S)
    t0 = now_ns()
    fd = os.open(f, os.O_WRONLY)
    try:
        os.pwrite(fd, b"ab", 3)
        st = os.fstat(fd)
    finally:
        os.close(fd)
    st2 = os.stat(f)
    expect_near_now(st2.st_mtime_ns, t0, "mtime after write (stat)")
    expect_near_now(st.st_mtime_ns, t0, "mtime after write (fstat before close)")
    expect(st2.st_ctime_ns > c0, "ctime not updated by write")
    eq(st2.st_atime_ns, OLD, "atime after write (write must not touch atime)")


@check
def check_meta_mtime_on_truncate(d):
    """truncate/ftruncate that change the size update mtime and ctime."""
    f = j(d, "f")
    wfile(f, b"0123456789")
    OLD = 1_000_000_000_000_000_000
    os.utime(f, ns=(OLD, OLD))
    t0 = now_ns()
    os.truncate(f, 3)
    expect_near_now(os.stat(f).st_mtime_ns, t0, "mtime after truncate")
    os.utime(f, ns=(OLD, OLD))
    fd = os.open(f, os.O_RDWR)
    try:
        t0 = now_ns()
        os.ftruncate(fd, 100)
    finally:
        os.close(fd)
    expect_near_now(os.stat(f).st_mtime_ns, t0, "mtime after ftruncate")
    os.utime(f, ns=(OLD, OLD))
    t0 = now_ns()
    fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
    os.close(fd)
    expect_near_now(os.stat(f).st_mtime_ns, t0, "mtime after open(O_TRUNC)")


@check
def check_meta_ctime_on_chmod(d):
    """chmod updates ctime (and not mtime)."""
    f = j(d, "f")
    wfile(f)
    m = os.stat(f).st_mtime_ns
    ctime_advances(f, lambda: os.chmod(f, 0o600), "chmod")
    eq(os.stat(f).st_mtime_ns, m, "mtime after chmod")


@check
def check_meta_ctime_on_chown(d):
    """(root) chown updates ctime."""
    need_root()
    f = j(d, "f")
    wfile(f)
    ctime_advances(f, lambda: os.chown(f, OTHER_UID, OTHER_GID), "chown")


@check
def check_meta_ctime_on_rename(d):
    """rename updates the ctime of the renamed file (Linux behaviour)."""
    f, g = j(d, "f"), j(d, "g")
    wfile(f)
    before = os.stat(f).st_ctime_ns
    time.sleep(TICK_S)
    os.rename(f, g)
    after = os.stat(g).st_ctime_ns
    expect(after > before, f"ctime not updated by rename (before {before}, after {after})")


@check
def check_meta_ctime_on_link(d):
    """link() and unlink() of a second name update the file's ctime (nlink changes)."""
    f = j(d, "f")
    wfile(f)
    ctime_advances(f, lambda: os.link(f, j(d, "g")), "link")
    ctime_advances(f, lambda: os.unlink(j(d, "g")), "unlink of other link")


@check
def check_meta_ctime_on_utime_and_xattr(d):
    """utime and setxattr update ctime."""
    f = j(d, "f")
    wfile(f)
    ctime_advances(f, lambda: os.utime(f, ns=(1, 1)), "utime")
    try:
        ctime_advances(f, lambda: os.setxattr(f, "user.c", b"1"), "setxattr")
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            raise Skip("user xattrs not supported")
        raise


@check
def check_meta_dir_mtime_on_entry_change(d):
    """A directory's mtime and ctime are updated by create, unlink, mkdir, rmdir,
    rename in/out and symlink inside it."""
    sub, other = j(d, "sub"), j(d, "other")
    os.mkdir(sub)
    os.mkdir(other)
    OLD = 1_000_000_000_000_000_000
    ops = [
        ("create", lambda: os.close(os.open(j(sub, "f"), os.O_CREAT | os.O_WRONLY, 0o644))),
        ("rename within", lambda: os.rename(j(sub, "f"), j(sub, "g"))),
        ("unlink", lambda: os.unlink(j(sub, "g"))),
        ("mkdir", lambda: os.mkdir(j(sub, "x"))),
        ("rmdir", lambda: os.rmdir(j(sub, "x"))),
        ("symlink", lambda: os.symlink("t", j(sub, "ln"))),
        ("rename out", lambda: os.rename(j(sub, "ln"), j(other, "ln"))),
        ("rename in", lambda: os.rename(j(other, "ln"), j(sub, "ln2"))),
    ]
    for what, op in ops:
        os.utime(sub, ns=(OLD, OLD))
        c0 = os.stat(sub).st_ctime_ns
        time.sleep(TICK_S)
        t0 = now_ns()
        op()
        st = os.stat(sub)
        expect_near_now(st.st_mtime_ns, t0, f"dir mtime after {what}")
        expect(st.st_ctime_ns > c0, f"dir ctime not updated by {what}")


# ==========================================================================
# special files
# ==========================================================================

@check
def check_node_mkfifo(d):
    """mkfifo creates S_IFIFO with the requested mode (size 0); data written to it
    can be read back through it."""
    p = j(d, "fifo")
    os.mkfifo(p, 0o640)
    st = os.stat(p)
    expect(stat.S_ISFIFO(st.st_mode), f"mode {oct(st.st_mode)} not S_IFIFO")
    eq(stat.S_IMODE(st.st_mode), 0o640, "fifo permissions")
    eq(st.st_size, 0, "fifo size")
    rfd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        wfd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(wfd, b"ping")
        finally:
            os.close(wfd)
        eq(os.read(rfd, 10), b"ping", "data through fifo")
    finally:
        os.close(rfd)
    expect_errno(errno.EEXIST, os.mkfifo, p, what="mkfifo over existing")


@check
def check_node_mknod_regular(d):
    """mknod(S_IFREG) creates an empty regular file with the requested mode."""
    p = j(d, "f")
    os.mknod(p, stat.S_IFREG | 0o600)
    st = os.stat(p)
    expect(stat.S_ISREG(st.st_mode), f"mode {oct(st.st_mode)} not S_IFREG")
    eq((stat.S_IMODE(st.st_mode), st.st_size), (0o600, 0), "(mode, size)")


@check
def check_node_mknod_devices(d):
    """(root) mknod of a char device (1,3) and block devices (8,1), (259,70000)
    round-trips type and st_rdev (also after rename)."""
    need_root()
    cases = [("chr", stat.S_IFCHR, 1, 3), ("blk", stat.S_IFBLK, 8, 1), ("blk2", stat.S_IFBLK, 259, 70000)]
    for name, kind, ma, mi in cases:
        p = j(d, name)
        os.mknod(p, kind | 0o600, os.makedev(ma, mi))
        st = os.lstat(p)
        eq(stat.S_IFMT(st.st_mode), kind, f"{name} file type")
        eq(stat.S_IMODE(st.st_mode), 0o600, f"{name} permissions")
        eq((os.major(st.st_rdev), os.minor(st.st_rdev)), (ma, mi), f"{name} st_rdev")
    os.rename(j(d, "chr"), j(d, "null2"))
    st = os.lstat(j(d, "null2"))
    eq((stat.S_ISCHR(st.st_mode), st.st_rdev), (True, os.makedev(1, 3)), "char device after rename")


@check
def check_node_unix_socket(d):
    """bind() of an AF_UNIX socket creates an S_IFSOCK node that clients can connect to."""
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    path = f"/proc/self/fd/{dfd}/sock"  # keeps sun_path short for deep directories
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(path)
        srv.listen(1)
        expect(stat.S_ISSOCK(os.lstat(j(d, "sock")).st_mode), "bound name is not S_IFSOCK")
        cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            cli.connect(path)
            conn, _ = srv.accept()
            cli.sendall(b"hi")
            eq(conn.recv(10), b"hi", "data over socket")
            conn.close()
        finally:
            cli.close()
    finally:
        srv.close()
        os.close(dfd)


# ==========================================================================
# extended attributes
# ==========================================================================

def _user_names(path) -> list[str]:
    return sorted(n for n in os.listxattr(path) if n.startswith("user."))


@check
def check_xattr_set_get_list_remove(d):
    """user.* xattrs: set/get exact values, listxattr shows exactly the set names,
    overwrite with a shorter value leaves no stale tail, remove makes them ENODATA."""
    f = j(d, "f")
    wfile(f)
    xattr_or_skip(f, "user.a", b"1")
    os.setxattr(f, "user.bee", b"two two")
    eq(os.getxattr(f, "user.a"), b"1", "user.a")
    eq(os.getxattr(f, "user.bee"), b"two two", "user.bee")
    eq(_user_names(f), ["user.a", "user.bee"], "listxattr user.* names")
    os.setxattr(f, "user.bee", b"x")
    eq(os.getxattr(f, "user.bee"), b"x", "user.bee after shorter overwrite")
    os.removexattr(f, "user.a")
    expect_errno(errno.ENODATA, os.getxattr, f, "user.a", what="getxattr after removexattr")
    eq(_user_names(f), ["user.bee"], "listxattr after removexattr")
    expect_errno(errno.ENODATA, os.removexattr, f, "user.a", what="removexattr of missing")
    fd = os.open(f, os.O_RDONLY)
    try:
        os.setxattr(fd, "user.fd", b"via fd")
        eq(os.getxattr(fd, "user.fd"), b"via fd", "fgetxattr")
    finally:
        os.close(fd)


@check
def check_xattr_create_replace_flags(d):
    """XATTR_CREATE on an existing name -> EEXIST; XATTR_REPLACE on a missing
    name -> ENODATA; both succeed in the other case."""
    f = j(d, "f")
    wfile(f)
    xattr_or_skip(f, "user.x", b"old", os.XATTR_CREATE)
    expect_errno(errno.EEXIST, os.setxattr, f, "user.x", b"new", os.XATTR_CREATE, what="XATTR_CREATE existing")
    eq(os.getxattr(f, "user.x"), b"old", "value after refused CREATE")
    expect_errno(errno.ENODATA, os.setxattr, f, "user.y", b"v", os.XATTR_REPLACE, what="XATTR_REPLACE missing")
    expect_errno(errno.ENODATA, os.getxattr, f, "user.y", what="getxattr after refused REPLACE")
    os.setxattr(f, "user.x", b"new", os.XATTR_REPLACE)
    eq(os.getxattr(f, "user.x"), b"new", "value after REPLACE")


@check
def check_xattr_get_missing(d):
    """getxattr of a name that was never set fails with ENODATA."""
    f = j(d, "f")
    wfile(f)
    expect_errno((errno.ENODATA,), os.getxattr, f, "user.never", what="getxattr missing")
    eq(_user_names(f), [], "listxattr user.* on fresh file")


@check
def check_xattr_large_value(d):
    """A 4000-byte xattr value round-trips exactly."""
    f = j(d, "f")
    wfile(f)
    v = pattern_bytes(4000, 40)
    xattr_or_skip(f, "user.large", v)
    eq(os.getxattr(f, "user.large"), v, "4000-byte value")


@check
def check_xattr_binary_and_empty_value(d):
    """Binary xattr values (all 256 byte values incl. NUL) and the empty value round-trip."""
    f = j(d, "f")
    wfile(f)
    v = bytes(range(256)) + b"\0\0"
    xattr_or_skip(f, "user.bin", v)
    eq(os.getxattr(f, "user.bin"), v, "binary value")
    os.setxattr(f, "user.empty", b"")
    eq(os.getxattr(f, "user.empty"), b"", "empty value")
    expect("user.empty" in os.listxattr(f), "empty-valued xattr missing from listxattr")


@check
def check_xattr_dir_and_persistence(d):
    """xattrs work on directories, survive rename, and are shared by hard links."""
    sub, f = j(d, "sub"), j(d, "f")
    os.mkdir(sub)
    wfile(f)
    xattr_or_skip(sub, "user.d", b"dir")
    eq(os.getxattr(sub, "user.d"), b"dir", "dir xattr")
    os.setxattr(f, "user.f", b"file")
    os.rename(f, j(d, "g"))
    os.rename(sub, j(d, "sub2"))
    eq(os.getxattr(j(d, "g"), "user.f"), b"file", "file xattr after rename")
    eq(os.getxattr(j(d, "sub2"), "user.d"), b"dir", "dir xattr after rename")
    os.link(j(d, "g"), j(d, "h"))
    os.setxattr(j(d, "h"), "user.h", b"via link")
    eq(os.getxattr(j(d, "g"), "user.h"), b"via link", "xattr via other hard link")


# ==========================================================================
# statfs
# ==========================================================================

@check
def check_statfs_sane(d):
    """statvfs: f_bsize/f_frsize > 0, f_blocks > 0, f_bavail <= f_bfree <= f_blocks,
    f_namemax >= 255; fstatvfs agrees on the static fields."""
    s = os.statvfs(d)
    expect(s.f_bsize > 0 and s.f_frsize > 0, f"f_bsize={s.f_bsize} f_frsize={s.f_frsize}")
    expect(s.f_blocks > 0, f"f_blocks={s.f_blocks}")
    expect(s.f_bfree <= s.f_blocks, f"f_bfree={s.f_bfree} > f_blocks={s.f_blocks}")
    expect(s.f_bavail <= s.f_bfree, f"f_bavail={s.f_bavail} > f_bfree={s.f_bfree}")
    expect(s.f_ffree <= s.f_files or s.f_files == 0, f"f_ffree={s.f_ffree} > f_files={s.f_files}")
    expect(s.f_namemax >= 255, f"f_namemax={s.f_namemax}")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fs = os.fstatvfs(fd)
    finally:
        os.close(fd)
    eq((fs.f_bsize, fs.f_frsize, fs.f_blocks, fs.f_namemax),
       (s.f_bsize, s.f_frsize, s.f_blocks, s.f_namemax), "fstatvfs vs statvfs")


# ==========================================================================
# locks
# ==========================================================================

@check
def check_lock_flock_exclusive(d):
    """flock(LOCK_EX|LOCK_NB) from a second open file description fails with
    EWOULDBLOCK while the first holds it; works after LOCK_UN; shared locks coexist."""
    p = j(d, "f")
    wfile(p, b"x")
    fd1 = os.open(p, os.O_RDWR)
    fd2 = os.open(p, os.O_RDWR)
    try:
        fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)
        expect_errno(errno.EWOULDBLOCK, fcntl.flock, fd2, fcntl.LOCK_EX | fcntl.LOCK_NB, what="second LOCK_EX")
        expect_errno(errno.EWOULDBLOCK, fcntl.flock, fd2, fcntl.LOCK_SH | fcntl.LOCK_NB, what="LOCK_SH vs LOCK_EX")
        fcntl.flock(fd1, fcntl.LOCK_UN)
        fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd2, fcntl.LOCK_SH | fcntl.LOCK_NB)  # downgrade
        fcntl.flock(fd1, fcntl.LOCK_SH | fcntl.LOCK_NB)
        expect_errno(errno.EWOULDBLOCK, fcntl.flock, fd1, fcntl.LOCK_EX | fcntl.LOCK_NB, what="upgrade with other SH")
    finally:
        os.close(fd1)
        os.close(fd2)


@check
def check_lock_flock_released_on_close(d):
    """A flock is released when its open file description is closed."""
    p = j(d, "f")
    wfile(p, b"x")
    fd1 = os.open(p, os.O_RDWR)
    fcntl.flock(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd1)
    fd2 = os.open(p, os.O_RDWR)
    try:
        fcntl.flock(fd2, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd2)


_FLOCK_FMT = "@hhqqi4x" if struct.calcsize("@hhqqi") == 28 else "@hhqqi"


def _getlk(fd, start, length):
    req = struct.pack(_FLOCK_FMT, fcntl.F_WRLCK, os.SEEK_SET, start, length, 0)
    res = fcntl.fcntl(fd, fcntl.F_GETLK, req)
    t, _w, s, ln, pid = struct.unpack(_FLOCK_FMT, res)
    return t, s, ln, pid


@check
def check_lock_posix_conflict(d):
    """fcntl POSIX locks: another process gets EAGAIN/EACCES for an overlapping
    F_SETLK, succeeds on a disjoint range, F_GETLK reports the holder (type, range,
    pid); after unlock the other process can lock."""
    p = j(d, "f")
    wfile(p, b"x" * 1000)
    fd = os.open(p, os.O_RDWR)
    parent = os.getpid()

    def probe():
        cfd = os.open(p, os.O_RDWR)
        try:
            r = {"ex": outcome(fcntl.lockf, cfd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0),
                 "sh": outcome(fcntl.lockf, cfd, fcntl.LOCK_SH | fcntl.LOCK_NB, 10, 50),
                 "disjoint": outcome(fcntl.lockf, cfd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 200)}
            r["getlk"] = _getlk(cfd, 0, 100)
            return r
        finally:
            os.close(cfd)

    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 100, 0)
        r = in_child(probe)
        expect_one_of(r["ex"], ("EAGAIN", "EACCES"), "conflicting F_SETLK write lock")
        expect_one_of(r["sh"], ("EAGAIN", "EACCES"), "conflicting F_SETLK read lock")
        eq(r["disjoint"], "ok", "lock on disjoint range")
        eq(r["getlk"], (fcntl.F_WRLCK, 0, 100, parent), "F_GETLK (type, start, len, pid)")
        fcntl.lockf(fd, fcntl.LOCK_UN, 100, 0)
        r = in_child(probe)
        eq((r["ex"], r["sh"]), ("ok", "ok"), "locks after holder unlocked")
        eq(r["getlk"][0], fcntl.F_UNLCK, "F_GETLK type after unlock")
    finally:
        os.close(fd)


@check
def check_lock_posix_released_on_close(d):
    """Closing ANY descriptor of a file drops the process's POSIX locks on it
    (classic POSIX semantics), so another process can then lock."""
    p = j(d, "f")
    wfile(p, b"x")
    fd1 = os.open(p, os.O_RDWR)
    try:
        fcntl.lockf(fd1, fcntl.LOCK_EX | fcntl.LOCK_NB)

        def probe():
            cfd = os.open(p, os.O_RDWR)
            try:
                return outcome(fcntl.lockf, cfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(cfd)

        expect_one_of(in_child(probe), ("EAGAIN", "EACCES"), "lock while held")
        os.close(os.open(p, os.O_RDONLY))
        eq(in_child(probe), "ok", "lock after holder closed another fd of the file")
    finally:
        os.close(fd1)


# ==========================================================================
# mmap
# ==========================================================================

@check
def check_mmap_read(d):
    """A read-only mmap of a file (non page-aligned size) equals its content."""
    data = pattern_bytes(3 * 4096 + 100, 9)
    p = j(d, "f")
    wfile(p, data)
    fd = os.open(p, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as m:
            eq(len(m), len(data), "mapping length")
            expect(m[:] == data, "mapped content differs from file content")
    finally:
        os.close(fd)


@check
def check_mmap_shared_write(d):
    """Stores into a MAP_SHARED mapping + msync are visible via another fd, and after
    close and reopen; write() via another fd is visible in the mapping."""
    size = 3 * 4096 + 100
    data = bytearray(pattern_bytes(size, 10))
    p = j(d, "f")
    wfile(p, bytes(data))
    fd = os.open(p, os.O_RDWR)
    fd2 = os.open(p, os.O_RDWR)
    try:
        with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[4090:4110] = b"X" * 20
            m[size - 5:size] = b"TAIL!"
            m[0:4] = b"HEAD"
            m.flush()
            data[4090:4110] = b"X" * 20
            data[size - 5:size] = b"TAIL!"
            data[0:4] = b"HEAD"
            eq(os.pread(fd2, size, 0), bytes(data), "read via other fd after msync")
            os.pwrite(fd2, b"fromfd", 8000)
            data[8000:8006] = b"fromfd"
            eq(m[8000:8006], b"fromfd", "pwrite via other fd visible in mapping")
    finally:
        os.close(fd)
        os.close(fd2)
    eq(rfile(p), bytes(data), "content after close and reopen")


@check
def check_mmap_private(d):
    """Stores into a MAP_PRIVATE mapping are not written to the file."""
    p = j(d, "f")
    wfile(p, b"a" * 8192)
    fd = os.open(p, os.O_RDWR)
    try:
        with mmap.mmap(fd, 8192, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[0:5] = b"PRIVA"
            eq(m[0:5], b"PRIVA", "private mapping sees its own store")
            eq(os.pread(fd, 5, 0), b"aaaaa", "file while private mapping modified")
    finally:
        os.close(fd)
    eq(rfile(p), b"a" * 8192, "file after private mapping closed")


# ==========================================================================
# readdir
# ==========================================================================

@check
def check_readdir_1000_entries(d):
    """A directory with 1000 entries (files, dirs, symlinks) lists exactly those names
    once each; scandir types and inode numbers match lstat."""
    sub = j(d, "big")
    os.mkdir(sub)
    kinds = {}
    for i in range(1000):
        name = f"e{i:04d}"
        p = j(sub, name)
        if i % 10 == 0:
            os.mkdir(p)
            kinds[name] = "dir"
        elif i % 10 == 1:
            os.symlink("e0000", p)
            kinds[name] = "link"
        else:
            os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644))
            kinds[name] = "file"
    seen = []
    with os.scandir(sub) as it:
        for e in it:
            seen.append(e.name)
            if len(seen) > 2000:
                fail("readdir returned more than 2000 entries (looping offsets?)")
            k = kinds.get(e.name)
            if k is None:
                fail(f"unexpected entry {e.name!r}")
            got = ("dir" if e.is_dir(follow_symlinks=False) else
                   "link" if e.is_symlink() else
                   "file" if e.is_file(follow_symlinks=False) else "other")
            eq(got, k, f"type of {e.name}")
            eq(e.inode(), os.lstat(e.path).st_ino, f"d_ino vs st_ino of {e.name}")
    no_dups(seen, "listing")
    eq(sorted(seen), sorted(kinds), "set of names")


@check
def check_readdir_raw_dtype_dino(d):
    """Raw readdir (libc) returns correct d_type for file/dir/symlink/fifo and
    d_ino equal to lstat st_ino. All-DT_UNKNOWN is legal and reported as SKIP."""
    wfile(j(d, "file"))
    os.mkdir(j(d, "dir"))
    os.symlink("file", j(d, "link"))
    os.mkfifo(j(d, "fifo"))
    want = {b"file": DT_REG, b"dir": DT_DIR, b"link": DT_LNK, b"fifo": DT_FIFO}
    with RawDir(d) as rd:
        ents = {n: (ino, t) for n, ino, t in rd.read_all() if n not in (b".", b"..")}
    eq(sorted(ents), sorted(want), "names")
    types = {n: t for n, (_, t) in ents.items()}
    if all(t == DT_UNKNOWN for t in types.values()):
        raise Skip("filesystem returns DT_UNKNOWN for every entry (legal, costs an lstat per entry)")
    eq(types, want, "d_type per name")
    for n, (ino, _) in ents.items():
        eq(ino, os.lstat(j(d, os.fsdecode(n))).st_ino, f"d_ino of {n!r}")


@check
def check_readdir_dot_dotdot(d):
    """Raw readdir returns '.' and '..' exactly once each (d_ino of '.' == the dir's
    st_ino); os.listdir hides them; an empty directory lists nothing else.
    (POSIX makes the dot entries optional, but every Linux filesystem returns them
    and `ls -a`-style tools expect them.)"""
    sub = j(d, "sub")
    os.mkdir(sub)
    with RawDir(sub) as rd:
        ents = rd.read_all()
    names = [n for n, _, _ in ents]
    eq(sorted(names), [b".", b".."], "raw entries of empty dir")
    dot = [ino for n, ino, _ in ents if n == b"."][0]
    eq(dot, os.stat(sub).st_ino, "d_ino of '.'")
    eq(os.listdir(sub), [], "os.listdir of empty dir")


@check
def check_readdir_concurrent_churn(d):
    """Listing a 600-entry directory while another thread creates and unlinks other
    entries never yields duplicates and never loses a stable entry."""
    sub = j(d, "dir")
    os.mkdir(sub)
    stable = set(make_entries(sub, 600))
    stop = threading.Event()
    errors, count = [], [0]

    def churn():
        i = 0
        try:
            while not stop.is_set():
                os.close(os.open(j(sub, f"churn-{i % 50:04d}"), os.O_CREAT | os.O_WRONLY, 0o644))
                if i >= 25:
                    os.unlink(j(sub, f"churn-{(i - 25) % 50:04d}"))
                i += 1
                count[0] = i
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    try:
        for rnd in range(15):
            names = list_names(sub, cap=5000)
            no_dups(names, f"listing #{rnd}")
            missing = stable - set(names)
            expect(not missing, f"listing #{rnd} lost stable entries: {_short(sorted(missing))}")
            extra = [n for n in names if n not in stable and not n.startswith("churn-")]
            expect(not extra, f"listing #{rnd} has unknown entries {_short(extra)}")
    finally:
        stop.set()
        t.join(30)
    expect(not errors, f"churn thread failed: {errors[:1]}")
    expect(count[0] > 0, "churn thread made no progress")


@check
def check_readdir_modify_during_iteration(d):
    """Creating and unlinking other entries while iterating one directory stream:
    each entry that exists throughout appears exactly once."""
    sub = j(d, "dir")
    os.mkdir(sub)
    stable = set(make_entries(sub, 600))
    seen, created, k = [], [], 0
    with os.scandir(sub) as it:
        for e in it:
            seen.append(e.name)
            if len(seen) > 5000:
                fail("readdir returned more than 5000 entries (looping offsets?)")
            if len(seen) % 20 == 0:
                for _ in range(5):
                    n = f"new-{k:05d}"
                    os.close(os.open(j(sub, n), os.O_CREAT | os.O_WRONLY, 0o644))
                    created.append(n)
                    k += 1
                for n in created[:-10][:5]:
                    os.unlink(j(sub, n))
                    created.remove(n)
    stable_seen = [n for n in seen if n in stable]
    no_dups(seen, "listing during modification")
    missing = stable - set(stable_seen)
    expect(not missing, f"stable entries lost: {_short(sorted(missing))}")
    expect(all(n in stable or n.startswith("new-") for n in seen), "unknown entries listed")


@check
def check_readdir_delete_half(d):
    """Deleting every other entry in the middle of an iteration: every surviving entry
    is still returned exactly once; a fresh listing afterwards is exactly the survivors."""
    sub = j(d, "dir")
    os.mkdir(sub)
    names = make_entries(sub, 1000)
    survivors = set(names[1::2])
    seen = []
    with os.scandir(sub) as it:
        for e in it:
            seen.append(e.name)
            if len(seen) > 5000:
                fail("readdir returned more than 5000 entries (looping offsets?)")
            if len(seen) == 300:
                for n in names[0::2]:
                    os.unlink(j(sub, n))
    no_dups(seen, "listing during deletion")
    missing = survivors - set(seen)
    expect(not missing, f"{len(missing)} surviving entries not returned, e.g. {_short(sorted(missing)[:3])}")
    after = list_names(sub, cap=5000)
    no_dups(after, "listing after deletion")
    eq(sorted(after), sorted(survivors), "listing after deleting half")


@check
def check_readdir_seekdir_telldir(d):
    """telldir() positions stay valid: seekdir() to a remembered position resumes
    with the same entry and order (positions spread over several getdents batches)."""
    sub = j(d, "dir")
    os.mkdir(sub)
    make_entries(sub, 1000)
    with RawDir(sub) as rd:
        pos, ents = [], []
        while True:
            p = rd.tell()
            e = rd.read()
            if e is None:
                break
            pos.append(p)
            ents.append(e[0])
            if len(ents) > 5000:
                fail("readdir returned more than 5000 entries")
        end = rd.tell()
        eq(len(ents), 1002, "entries incl. '.' and '..'")
        for k in (0, 1, 37, 500, 733, len(ents) - 2, len(ents) - 1, 250):
            rd.seek(pos[k])
            got = [rd.read() for _ in range(3)]
            got = [g[0] if g else None for g in got]
            want = (ents[k:k + 3] + [None, None, None])[:3]
            eq(got, want, f"3 entries after seekdir to position #{k}")
        rd.seek(end)
        eq(rd.read(), None, "readdir after seekdir to end position")


@check
def check_readdir_rewind_sees_changes(d):
    """rewinddir() makes the stream reflect the directory's current state
    (new entries appear, removed ones are gone)."""
    wfile(j(d, "a"))
    wfile(j(d, "b"))
    with RawDir(d) as rd:
        first = sorted(n for n, _, _ in rd.read_all() if n not in (b".", b".."))
        eq(first, [b"a", b"b"], "initial listing")
        wfile(j(d, "c"))
        os.unlink(j(d, "a"))
        rd.rewind()
        second = sorted(n for n, _, _ in rd.read_all() if n not in (b".", b".."))
        eq(second, [b"b", b"c"], "listing after rewinddir")


# ==========================================================================
# permissions (root dropping to nobody; default_permissions semantics)
# ==========================================================================

@check
def check_perm_nobody_cannot_write_root_file(d):
    """uid 65534 cannot open a root-owned 0644 file for writing or truncate it (EACCES),
    and the file is unchanged."""
    require_reachable_by_nobody(d)
    f = j(d, "f")
    wfile(f, b"root data")
    os.chmod(f, 0o644)
    r = as_nobody(lambda: {"wr": outcome(os.open, f, os.O_WRONLY),
                           "rdwr": outcome(os.open, f, os.O_RDWR),
                           "trunc": outcome(os.truncate, f, 0),
                           "append": outcome(os.open, f, os.O_WRONLY | os.O_APPEND)})
    eq(r, {"wr": "EACCES", "rdwr": "EACCES", "trunc": "EACCES", "append": "EACCES"}, "outcomes")
    eq(rfile(f), b"root data", "content")


@check
def check_perm_nobody_can_read(d):
    """uid 65534 can read a root-owned 0644 file and list/stat a 0755 dir,
    but cannot read a 0600 file (EACCES)."""
    require_reachable_by_nobody(d)
    f, secret = j(d, "f"), j(d, "secret")
    wfile(f, b"public")
    wfile(secret, b"private", 0o600)
    os.chmod(secret, 0o600)

    def probe():
        return {"read": rfile(f), "list": sorted(os.listdir(d)),
                "size": os.stat(f).st_size, "secret": outcome(os.open, secret, os.O_RDONLY)}

    r = as_nobody(probe)
    eq(r["read"], b"public", "content read by nobody")
    eq(r["list"], ["f", "secret"], "listing by nobody")
    eq(r["size"], 6, "stat by nobody")
    eq(r["secret"], "EACCES", "open 0600 root file")


@check
def check_perm_nobody_cannot_create_in_root_dir(d):
    """In a root-owned 0755 directory uid 65534 gets EACCES for create, mkdir,
    symlink, unlink and rename; nothing changes."""
    require_reachable_by_nobody(d)
    os.chmod(d, 0o755)
    wfile(j(d, "existing"), b"x")
    r = as_nobody(lambda: {
        "create": outcome(os.open, j(d, "new"), os.O_CREAT | os.O_WRONLY, 0o644),
        "mkdir": outcome(os.mkdir, j(d, "newdir")),
        "symlink": outcome(os.symlink, "t", j(d, "newlink")),
        "mkfifo": outcome(os.mkfifo, j(d, "newfifo")),
        "unlink": outcome(os.unlink, j(d, "existing")),
        "rename": outcome(os.rename, j(d, "existing"), j(d, "moved")),
    })
    eq(r, dict.fromkeys(("create", "mkdir", "symlink", "mkfifo", "unlink", "rename"), "EACCES"), "outcomes")
    eq(sorted(os.listdir(d)), ["existing"], "listing afterwards")


@check
def check_perm_nobody_owns_created_files(d):
    """Files, dirs and symlinks created by uid 65534 in a 0777 dir are owned by
    65534:65534; the creator can write its own file."""
    require_reachable_by_nobody(d)
    pub = j(d, "pub")
    os.mkdir(pub)
    os.chmod(pub, 0o777)

    def probe():
        wfile(j(pub, "f"), b"mine")
        os.mkdir(j(pub, "sub"))
        os.symlink("f", j(pub, "ln"))
        wfile(j(pub, "f"), b"mine again")
        return rfile(j(pub, "f"))

    eq(as_nobody(probe), b"mine again", "content written by nobody")
    for n in ("f", "sub", "ln"):
        st = os.lstat(j(pub, n))
        eq((st.st_uid, st.st_gid), (NOBODY_UID, NOBODY_GID), f"owner of {n} created by nobody")


@check
def check_perm_create_readonly_mode_fd_writable(d):
    """open(O_CREAT|O_RDWR, 0444) by a non-root user returns a writable fd (write,
    ftruncate work) even though the new file is read-only; a later open for write fails."""
    require_reachable_by_nobody(d)
    pub = j(d, "pub")
    os.mkdir(pub)
    os.chmod(pub, 0o777)
    f = j(pub, "ro")

    def probe():
        fd = os.open(f, os.O_CREAT | os.O_RDWR | os.O_EXCL, 0o444)
        try:
            w = os.write(fd, b"object data")
            os.ftruncate(fd, 6)
            back = os.pread(fd, 100, 0)
        finally:
            os.close(fd)
        return {"write": w, "back": back, "reopen_w": outcome(os.open, f, os.O_WRONLY),
                "reread": rfile(f)}

    r = as_nobody(probe)
    eq(r, {"write": 11, "back": b"object", "reopen_w": "EACCES", "reread": b"object"}, "outcomes")
    eq(mode_of(f), 0o444, "mode of created file")


@check
def check_perm_sticky_dir(d):
    """In a root-owned 01777 dir, uid 65534 cannot unlink/rename/rmdir entries owned
    by another user (EPERM/EACCES), but can create and remove its own."""
    require_reachable_by_nobody(d)
    sticky = j(d, "tmp")
    os.mkdir(sticky)
    os.chmod(sticky, 0o1777)
    victim, vdir = j(sticky, "victim"), j(sticky, "vdir")
    wfile(victim, b"v", 0o666)
    os.chmod(victim, 0o666)
    os.chown(victim, OTHER_UID, OTHER_GID)
    os.mkdir(vdir)
    os.chmod(vdir, 0o777)
    os.chown(vdir, OTHER_UID, OTHER_GID)

    def probe():
        r = {"unlink": outcome(os.unlink, victim),
             "rename": outcome(os.rename, victim, j(sticky, "stolen")),
             "rmdir": outcome(os.rmdir, vdir)}
        wfile(j(sticky, "mine"), b"m")
        r["own_unlink"] = outcome(os.unlink, j(sticky, "mine"))
        return r

    r = as_nobody(probe)
    for k in ("unlink", "rename", "rmdir"):
        expect_one_of(r[k], ("EPERM", "EACCES"), f"{k} of other user's entry in sticky dir")
    eq(r["own_unlink"], "ok", "unlink of own file in sticky dir")
    eq(sorted(os.listdir(sticky)), ["vdir", "victim"], "sticky dir listing")


@check
def check_perm_dir_search_bits(d):
    """Directory x bit controls lookup and r bit controls listing for uid 65534:
    0700 -> stat inside EACCES, listdir EACCES; 0711 -> stat/read inside OK, listdir
    EACCES; 0744 -> listdir OK, stat inside EACCES."""
    require_reachable_by_nobody(d)
    dirs = {"d700": 0o700, "d711": 0o711, "d744": 0o744}
    for n, m in dirs.items():
        os.mkdir(j(d, n))
        wfile(j(d, n, "f"), b"x")
        os.chmod(j(d, n, "f"), 0o644)
        os.chmod(j(d, n), m)

    def probe():
        return {n: (outcome(os.stat, j(d, n, "f")), outcome(os.listdir, j(d, n)),
                    outcome(os.open, j(d, n, "f"), os.O_RDONLY)) for n in dirs}

    r = as_nobody(probe)
    eq(r["d700"], ("EACCES", "EACCES", "EACCES"), "0700 dir (stat, listdir, open)")
    eq(r["d711"], ("ok", "EACCES", "ok"), "0711 dir (stat, listdir, open)")
    eq(r["d744"], ("EACCES", "ok", "EACCES"), "0744 dir (stat, listdir, open)")


@check
def check_perm_nobody_setattr_denied(d):
    """uid 65534 on a root-owned 0644 file: chmod/chown/explicit utime -> EPERM,
    utime(now) -> EACCES; on its own file: chmod and explicit utime OK,
    chown to root or to a group it's not in -> EPERM."""
    require_reachable_by_nobody(d)
    f = j(d, "f")
    wfile(f)
    os.chmod(f, 0o644)
    pub = j(d, "pub")
    os.mkdir(pub)
    os.chmod(pub, 0o777)
    own = j(pub, "own")

    def probe():
        r = {"chmod": outcome(os.chmod, f, 0o666),
             "chown": outcome(os.chown, f, NOBODY_UID, -1),
             "utime_explicit": outcome(os.utime, f, ns=(1, 1)),
             "utime_now": outcome(os.utime, f)}
        wfile(own, b"x")
        r["own_chmod"] = outcome(os.chmod, own, 0o600)
        r["own_utime"] = outcome(os.utime, own, ns=(5, 5))
        r["own_chown_root"] = outcome(os.chown, own, 0, -1)
        r["own_chgrp_root"] = outcome(os.chown, own, -1, 0)
        return r

    r = as_nobody(probe)
    eq(r, {"chmod": "EPERM", "chown": "EPERM", "utime_explicit": "EPERM", "utime_now": "EACCES",
           "own_chmod": "ok", "own_utime": "ok", "own_chown_root": "EPERM", "own_chgrp_root": "EPERM"},
       "outcomes")
    eq(mode_of(f), 0o644, "root file mode")
    eq(mode_of(own), 0o600, "own file mode")
    eq(os.stat(own).st_mtime_ns, 5, "own file mtime")


@check
def check_perm_setgid_dir_inherit(d):
    """(root) In a setgid directory, new files get the directory's group (also when
    created by uid 65534) and new subdirectories inherit group and the setgid bit."""
    require_reachable_by_nobody(d)
    g = j(d, "g")
    os.mkdir(g)
    os.chown(g, 0, OTHER_GID)
    os.chmod(g, 0o2777)
    wfile(j(g, "rootfile"))
    os.mkdir(j(g, "rootdir"))
    eq(os.stat(j(g, "rootfile")).st_gid, OTHER_GID, "group of file created by root")
    st = os.stat(j(g, "rootdir"))
    eq(st.st_gid, OTHER_GID, "group of subdir")
    expect(st.st_mode & stat.S_ISGID, f"subdir mode {oct(st.st_mode)} lacks setgid")

    def probe():
        wfile(j(g, "nobodyfile"))
        return os.stat(j(g, "nobodyfile")).st_gid

    eq(as_nobody(probe), OTHER_GID, "group of file created by nobody")
    eq(os.stat(j(g, "nobodyfile")).st_uid, NOBODY_UID, "owner of file created by nobody")


@check
def check_perm_root_override(d):
    """(root) root can read/write a mode-0000 file and create in a 0000 dir, but
    access(X_OK) is false for a file without any x bit."""
    need_root()
    f = j(d, "f")
    wfile(f, b"abc")
    os.chmod(f, 0)
    fd = os.open(f, os.O_RDWR)
    try:
        os.pwrite(fd, b"X", 0)
        eq(os.pread(fd, 3, 0), b"Xbc", "read of 0000 file by root")
    finally:
        os.close(fd)
    locked = j(d, "locked")
    os.mkdir(locked, 0)
    os.chmod(locked, 0)
    wfile(j(locked, "inside"), b"i")
    eq(os.listdir(locked), ["inside"], "listing of 0000 dir by root")
    os.chmod(f, 0o644)
    expect(not os.access(f, os.X_OK), "root has X_OK on a 0644 file")
    os.chmod(f, 0o100)
    expect(os.access(f, os.X_OK), "root lacks X_OK on a 0100 file")


@check
def check_perm_access_as_nobody(d):
    """access()/faccessat(AT_EACCESS) as uid 65534 on a root-owned 0644 file:
    R_OK yes, W_OK no, X_OK no; on a 0755 file X_OK yes; missing file: F_OK no."""
    require_reachable_by_nobody(d)
    f, x = j(d, "f"), j(d, "x")
    wfile(f)
    os.chmod(f, 0o644)
    wfile(x)
    os.chmod(x, 0o755)

    def probe():
        return [os.access(f, os.R_OK), os.access(f, os.W_OK), os.access(f, os.X_OK),
                os.access(x, os.X_OK), os.access(j(d, "missing"), os.F_OK),
                os.access(f, os.W_OK, effective_ids=True), os.access(f, os.R_OK, effective_ids=True)]

    eq(as_nobody(probe), [True, False, False, True, False, False, True],
       "[R f, W f, X f, X x, F missing, W f eaccess, R f eaccess]")


# ==========================================================================
# names
# ==========================================================================

@check
def check_name_max_255(d):
    """255-byte names (ASCII and multi-byte UTF-8) work for files, dirs, symlinks
    and as rename/link targets, and are listed exactly."""
    a = "a" * 255
    u = "\u00e9" * 127 + "z"  # 254 + 1 bytes
    eq(len(os.fsencode(u)), 255, "utf-8 name length")
    wfile(j(d, a), b"long")
    eq(rfile(j(d, a)), b"long", "content of 255-byte name")
    os.rename(j(d, a), j(d, "b" * 255))
    os.mkdir(j(d, "c" * 255))
    os.symlink("b" * 255, j(d, "l" * 255))
    os.link(j(d, "b" * 255), j(d, u))
    eq(sorted(list_names(d)), sorted(["b" * 255, "c" * 255, "l" * 255, u]), "listing")
    eq(rfile(j(d, "l" * 255)), b"long", "read via 255-byte symlink")


@check
def check_name_too_long_256(d):
    """256-byte names fail with ENAMETOOLONG for open(O_CREAT), mkdir, symlink,
    rename/link targets, stat and unlink."""
    n = "n" * 256
    u = "\u00e9" * 128  # 256 bytes
    wfile(j(d, "src"))
    for name in (n, u):
        p = j(d, name)
        expect_errno(errno.ENAMETOOLONG, os.open, p, os.O_CREAT | os.O_WRONLY, 0o644, what="open O_CREAT 256")
        expect_errno(errno.ENAMETOOLONG, os.mkdir, p, what="mkdir 256")
        expect_errno(errno.ENAMETOOLONG, os.symlink, "t", p, what="symlink 256")
        expect_errno(errno.ENAMETOOLONG, os.rename, j(d, "src"), p, what="rename to 256")
        expect_errno(errno.ENAMETOOLONG, os.link, j(d, "src"), p, what="link to 256")
        expect_errno(errno.ENAMETOOLONG, os.stat, p, what="stat 256")
        expect_errno(errno.ENAMETOOLONG, os.unlink, p, what="unlink 256")
    eq(list_names(d), ["src"], "listing")


@check
def check_name_special_chars(d):
    """Names with spaces, newlines, tabs, backslashes, quotes, shell/Windows-special
    characters, leading dashes/dots and emoji round-trip exactly."""
    names = ["with space", "new\nline", "tab\there", "back\\slash", "colon:star*q?",
             "quote\"'`", "-leading-dash", ".hidden", "..dots", "trailing.", "trailing ",
             " leading", "emoji-\U0001F600", "pct%2F", "semi;amp&pipe|<>", "\x01ctrl\x7f",
             "CON", "nul", "a.b.c.", "#hash~"]
    for i, n in enumerate(names):
        wfile(j(d, n), str(i).encode())
    eq(sorted(list_names(d)), sorted(names), "listing")
    for i, n in enumerate(names):
        eq(rfile(j(d, n)), str(i).encode(), f"content of {n!r}")


@check
def check_name_non_utf8_bytes(d):
    """Names that are not valid UTF-8 (arbitrary bytes) can be created, listed
    byte-exactly, renamed and removed."""
    bd = os.fsencode(d)
    n1, n2 = b"\xff\xfe-latin1-caf\xe9", b"\xc3\x28-bad-seq"
    wfile(j(bd, n1), b"1")
    os.mkdir(j(bd, n2))
    eq(sorted(os.listdir(bd)), sorted([n1, n2]), "bytes listing")
    eq(rfile(j(bd, n1)), b"1", "content")
    os.rename(j(bd, n1), j(bd, b"\x80renamed"))
    eq(sorted(os.listdir(bd)), sorted([b"\x80renamed", n2]), "listing after rename")
    os.unlink(j(bd, b"\x80renamed"))
    os.rmdir(j(bd, n2))
    eq(os.listdir(bd), [], "listing after removal")


@check
def check_name_case_sensitive(d):
    """Names differing only in case are distinct files."""
    for i, n in enumerate(("readme", "README", "ReadMe")):
        wfile(j(d, n), str(i).encode())
    eq(sorted(list_names(d)), sorted(["readme", "README", "ReadMe"]), "listing")
    eq([rfile(j(d, n)) for n in ("readme", "README", "ReadMe")], [b"0", b"1", b"2"], "contents")
    expect_errno(errno.ENOENT, os.stat, j(d, "README".lower().capitalize()), what="stat 'Readme'")


@check
def check_name_unicode_nfc_nfd(d):
    """NFC and NFD spellings of the same text are different names (no normalization)
    and each is listed with its exact bytes."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    wfile(j(d, nfc), b"nfc")
    expect_errno(errno.ENOENT, os.stat, j(d, nfd), what="stat NFD name when only NFC exists")
    wfile(j(d, nfd), b"nfd")
    eq(sorted(os.listdir(os.fsencode(d))), sorted([nfc.encode(), nfd.encode()]), "bytes listing")
    eq((rfile(j(d, nfc)), rfile(j(d, nfd))), (b"nfc", b"nfd"), "contents")


# ==========================================================================
# misc error cases
# ==========================================================================

@check
def check_misc_o_directory(d):
    """open(O_DIRECTORY) on a file -> ENOTDIR; on a dir or symlink-to-dir it works."""
    wfile(j(d, "f"))
    os.mkdir(j(d, "sub"))
    os.symlink("sub", j(d, "ln"))
    expect_errno(errno.ENOTDIR, os.open, j(d, "f"), os.O_RDONLY | os.O_DIRECTORY, what="O_DIRECTORY on file")
    for n in ("sub", "ln"):
        os.close(os.open(j(d, n), os.O_RDONLY | os.O_DIRECTORY))


@check
def check_misc_open_dir_for_write(d):
    """open(dir, O_WRONLY/O_RDWR/O_CREAT) -> EISDIR; O_RDONLY works but read() -> EISDIR."""
    sub = j(d, "sub")
    os.mkdir(sub)
    expect_errno(errno.EISDIR, os.open, sub, os.O_WRONLY, what="open dir O_WRONLY")
    expect_errno(errno.EISDIR, os.open, sub, os.O_RDWR, what="open dir O_RDWR")
    expect_errno(errno.EISDIR, os.open, sub, os.O_RDONLY | os.O_CREAT, 0o644, what="open dir O_CREAT")
    fd = os.open(sub, os.O_RDONLY)
    try:
        expect_errno(errno.EISDIR, os.read, fd, 10, what="read() on dir fd")
    finally:
        os.close(fd)


@check
def check_misc_unlink_dir_eisdir(d):
    """unlink() of a directory fails with EISDIR (Linux) and keeps it."""
    os.mkdir(j(d, "sub"))
    expect_errno(errno.EISDIR, os.unlink, j(d, "sub"), what="unlink(dir)")
    expect(os.path.isdir(j(d, "sub")), "dir removed")


@check
def check_misc_rmdir_file_enotdir(d):
    """rmdir() of a regular file or symlink fails with ENOTDIR and keeps it."""
    wfile(j(d, "f"))
    os.mkdir(j(d, "sub"))
    os.symlink("sub", j(d, "ln"))
    expect_errno(errno.ENOTDIR, os.rmdir, j(d, "f"), what="rmdir(file)")
    expect_errno(errno.ENOTDIR, os.rmdir, j(d, "ln"), what="rmdir(symlink to dir)")
    expect(os.path.isfile(j(d, "f")) and os.path.islink(j(d, "ln")), "entries removed")


@check
def check_misc_rmdir_dot(d):
    """rmdir('x/.') -> EINVAL; rmdir('x/..') -> ENOTEMPTY (or EBUSY/EEXIST)."""
    os.makedirs(j(d, "x", "y"))
    expect_errno(errno.EINVAL, os.rmdir, j(d, "x", "."), what="rmdir x/.")
    expect_errno((errno.ENOTEMPTY, errno.EEXIST, errno.EBUSY), os.rmdir, j(d, "x", "y", ".."), what="rmdir x/y/..")


@check
def check_misc_enoent(d):
    """Operations on missing names or through missing dirs fail with ENOENT."""
    m = j(d, "missing")
    wfile(j(d, "f"))
    cases = [
        ("stat", os.stat, (m,)), ("lstat", os.lstat, (m,)), ("open", os.open, (m, os.O_RDONLY)),
        ("open O_CREAT in missing dir", os.open, (j(m, "x"), os.O_CREAT | os.O_WRONLY, 0o644)),
        ("unlink", os.unlink, (m,)), ("rmdir", os.rmdir, (m,)), ("mkdir in missing dir", os.mkdir, (j(m, "x"),)),
        ("rename missing src", os.rename, (m, j(d, "x"))), ("rename into missing dir", os.rename, (j(d, "f"), j(m, "x"))),
        ("link missing src", os.link, (m, j(d, "x"))), ("chmod", os.chmod, (m, 0o644)),
        ("truncate", os.truncate, (m, 0)), ("readlink", os.readlink, (m,)), ("listdir", os.listdir, (m,)),
        ("utime", os.utime, (m,)), ("getxattr", os.getxattr, (m, "user.x")),
        ("symlink in missing dir", os.symlink, ("t", j(m, "x"))),
    ]
    for what, fn, args in cases:
        expect_errno(errno.ENOENT, fn, *args, what=what)
    eq(list_names(d), ["f"], "listing")


@check
def check_misc_trailing_slash(d):
    """A trailing slash requires a directory: open/stat('file/') -> ENOTDIR;
    mkdir('new/') and rename('dir', 'dir2/') work."""
    wfile(j(d, "f"))
    os.mkdir(j(d, "sub"))
    expect_errno(errno.ENOTDIR, os.open, j(d, "f") + "/", os.O_RDONLY, what="open file/")
    expect_errno(errno.ENOTDIR, os.stat, j(d, "f") + "/", what="stat file/")
    os.mkdir(j(d, "new") + "/")
    os.rename(j(d, "sub"), j(d, "sub2") + "/")
    expect(os.path.isdir(j(d, "new")) and os.path.isdir(j(d, "sub2")), "dirs missing")


@check
def check_misc_access(d):
    """access()/faccessat: F_OK on existing/missing; R/W_OK on own 0644 file, X_OK only
    with an x bit; AT_SYMLINK_NOFOLLOW sees a dangling symlink; dir_fd form works."""
    f, x = j(d, "f"), j(d, "x")
    wfile(f)
    os.chmod(f, 0o644)
    wfile(x)
    os.chmod(x, 0o755)
    os.symlink("nowhere", j(d, "dangling"))
    eq([os.access(f, os.F_OK), os.access(j(d, "missing"), os.F_OK)], [True, False], "F_OK")
    eq([os.access(f, os.R_OK), os.access(f, os.W_OK), os.access(f, os.X_OK), os.access(x, os.X_OK)],
       [True, True, False, True], "[R, W, X on 0644; X on 0755]")
    eq([os.access(j(d, "dangling"), os.F_OK),
        os.access(j(d, "dangling"), os.F_OK, follow_symlinks=False)], [False, True], "dangling symlink F_OK")
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        eq([os.access("f", os.R_OK, dir_fd=dfd), os.access("missing", os.F_OK, dir_fd=dfd)],
           [True, False], "faccessat(dirfd)")
    finally:
        os.close(dfd)


@check
def check_misc_at_functions(d):
    """*at() calls relative to a directory fd (openat, mkdirat, fstatat incl.
    AT_SYMLINK_NOFOLLOW, renameat, linkat, symlinkat, readlinkat, unlinkat) work."""
    os.mkdir(j(d, "a"))
    os.mkdir(j(d, "b"))
    da = os.open(j(d, "a"), os.O_RDONLY | os.O_DIRECTORY)
    db = os.open(j(d, "b"), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fd = os.open("f", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=da)
        os.write(fd, b"at")
        os.close(fd)
        os.mkdir("sub", dir_fd=da)
        os.symlink("f", "ln", dir_fd=da)
        eq(os.stat("ln", dir_fd=da).st_ino, os.stat(j(d, "a", "f")).st_ino, "fstatat follows")
        expect(stat.S_ISLNK(os.stat("ln", dir_fd=da, follow_symlinks=False).st_mode), "fstatat NOFOLLOW")
        eq(os.readlink("ln", dir_fd=da), "f", "readlinkat")
        os.rename("f", "g", src_dir_fd=da, dst_dir_fd=db)
        os.link("g", "h", src_dir_fd=db, dst_dir_fd=da)
        eq(rfile(j(d, "a", "h")), b"at", "content via linkat name")
        os.unlink("h", dir_fd=da)
        os.rmdir("sub", dir_fd=da)
        eq(sorted(os.listdir(da)), ["ln"], "listing of a via fd")
        eq(sorted(os.listdir(db)), ["g"], "listing of b via fd")
    finally:
        os.close(da)
        os.close(db)


# ==========================================================================
# pjd_*: the Linux-relevant behaviour pjdfstest verifies (our own checks)
# ==========================================================================
#
# pjdfstest is the usual POSIX filesystem test suite (one directory of shell
# tests per syscall).  These checks cover what it verifies on Linux that the
# checks above do not: the errno of every path-resolution error for every path
# call, EPERM/EACCES rules for non-owners (incl. sticky directories), set-id
# bit clearing, ctime/mtime of the node and of its directory for every file
# type, open flag combinations, truncate/posix_fallocate errors and utimensat
# permission rules.  Not covered: chflags and EFTYPE (BSD), and the cases that
# need a private scratch filesystem (ENOSPC, EROFS, EXDEV, EBUSY on a mount
# point, EMLINK at LINK_MAX).  Where POSIX (and pjdfstest) allows two outcomes
# both are accepted; everything else is asserted as Linux does it on a local
# filesystem.

PJD_U2 = 65533           # a second unprivileged user (the first is nobody, 65534)
PJD_G3, PJD_G4 = 65532, 65531

_KIND_FMT = {"regular": stat.S_IFREG, "dir": stat.S_IFDIR, "fifo": stat.S_IFIFO,
             "block": stat.S_IFBLK, "char": stat.S_IFCHR, "socket": stat.S_IFSOCK,
             "symlink": stat.S_IFLNK}


def pjd_types(*, dirs: bool = True, symlinks: bool = True) -> list[str]:
    """The file types pjdfstest iterates over (device nodes only as root)."""
    kinds = ["regular"] + (["dir"] if dirs else []) + ["fifo"]
    if os.geteuid() == 0:
        kinds += ["block", "char"]
    kinds.append("socket")
    if symlinks:
        kinds.append("symlink")
    return kinds


def mknode(path, kind: str, mode: int | None = None, owner: tuple[int, int] | None = None):
    """Create a node of `kind` (see pjd_types).  Sockets are made with
    mknod(S_IFSOCK), which is what bind() does underneath; symlinks point to
    'test' (dangling).  `mode` is applied with chmod, `owner` with lchown."""
    if kind == "regular":
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    elif kind == "dir":
        os.mkdir(path, 0o755)
    elif kind == "symlink":
        os.symlink("test", path)
    elif kind == "fifo":
        os.mkfifo(path, 0o644)
    else:
        rdev = os.makedev(1, 2) if kind in ("block", "char") else 0
        os.mknod(path, _KIND_FMT[kind] | 0o644, rdev)
    if mode is not None and kind != "symlink":
        os.chmod(path, mode)
    if owner is not None:
        os.lchown(path, *owner)


def rmnode(path):
    if stat.S_ISDIR(os.lstat(path).st_mode):
        os.rmdir(path)
    else:
        os.unlink(path)


def kind_of(path, follow: bool = False) -> str:
    fmt = stat.S_IFMT(os.stat(path, follow_symlinks=follow).st_mode)
    return next((k for k, v in _KIND_FMT.items() if v == fmt), oct(fmt))


def ids_mode(path, follow: bool = False) -> tuple[int, int, str]:
    """(uid, gid, mode as an octal string) of a node."""
    st = os.stat(path, follow_symlinks=follow)
    return st.st_uid, st.st_gid, oct(stat.S_IMODE(st.st_mode))


def lctime(path) -> int:
    return os.lstat(path).st_ctime_ns


def as_user(fn: Callable[[], object], uid: int, gid: int | None = None, groups: Iterable[int] = ()):
    return in_child(fn, uid=uid, gid=uid if gid is None else gid, groups=groups)


def eq_map(actual: dict, expected: dict, what: str):
    """Compare two dicts key by key; an expected value may be a tuple of allowed
    values.  The failure names only the keys that differ."""
    bad = []
    for k in list(expected) + [k for k in actual if k not in expected]:
        want, got = expected.get(k, "<missing>"), actual.get(k, "<missing>")
        alternatives = isinstance(want, tuple) and not isinstance(got, tuple)
        if got == want or (alternatives and got in want):
            continue
        shown = "/".join(map(str, want)) if alternatives else want
        bad.append(f"{k}: expected {shown}, got {got}")
    if bad:
        more = f" (+{len(bad) - 12} more)" if len(bad) > 12 else ""
        fail(f"{what}: " + "; ".join(bad[:12]) + more)


def _path_calls(p, existing, spare) -> dict[str, Callable[[], object]]:
    """One call per path syscall, each resolving `p` (link and rename once with
    `p` as source, once as target).  `existing` is an existing regular file and
    `spare` a free name; neither is ever created or removed on the success path
    of an expected error."""
    return {
        "chmod": lambda: os.chmod(p, 0o644),
        "chown": lambda: os.chown(p, -1, -1),
        "lchown": lambda: os.lchown(p, -1, -1),
        "truncate": lambda: os.truncate(p, 123),
        "open": lambda: os.close(os.open(p, os.O_RDONLY)),
        "open_creat": lambda: os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)),
        "mkdir": lambda: os.mkdir(p, 0o755),
        "mkfifo": lambda: os.mkfifo(p, 0o644),
        "mknod": lambda: os.mknod(p, stat.S_IFIFO | 0o644),
        "symlink": lambda: os.symlink("test", p),
        "link_from": lambda: os.link(p, spare),
        "link_to": lambda: os.link(existing, p),
        "rename_from": lambda: os.rename(p, spare),
        "rename_to": lambda: os.rename(existing, p),
        "unlink": lambda: os.unlink(p),
        "rmdir": lambda: os.rmdir(p),
        "utimensat": lambda: utimensat(p, 1_000_000_000, 2_000_000_000),
        "stat": lambda: os.stat(p),
    }


def _outcomes(calls: dict) -> dict[str, str]:
    return {name: outcome(call) for name, call in calls.items()}


# ---- path resolution errors, for every path call -------------------------

@check
def check_pjd_path_enotdir(d):
    """Every path call (chmod, chown, lchown, truncate, open, open(O_CREAT), mkdir,
    mkfifo, mknod, symlink, link and rename as source and as target, unlink, rmdir,
    utimensat, stat) on 'x/test' fails with ENOTDIR when x is a regular file, fifo,
    socket or (as root) device node."""
    existing, spare = j(d, "existing"), j(d, "spare")
    wfile(existing)
    for kind in pjd_types(dirs=False, symlinks=False):
        x = j(d, kind)
        mknode(x, kind)
        calls = _path_calls(j(x, "test"), existing, spare)
        eq_map(_outcomes(calls), dict.fromkeys(calls, "ENOTDIR"), f"calls on {kind}/test")
    eq(sorted(os.listdir(d)), sorted(["existing"] + pjd_types(dirs=False, symlinks=False)), "listing")


@check
def check_pjd_path_enoent(d):
    """ENOENT for: every path call on 'missing/test'; the calls that need the final
    name (chmod, chown, lchown, truncate, open, link/rename source, unlink, rmdir,
    utimensat, stat) on 'missing'; the following calls (chmod, chown, truncate, open,
    utimensat, stat) through a dangling symlink; link and rename of a just-removed name."""
    existing, spare = j(d, "existing"), j(d, "spare")
    wfile(existing)
    calls = _path_calls(j(d, "missing", "test"), existing, spare)
    eq_map(_outcomes(calls), dict.fromkeys(calls, "ENOENT"), "calls on missing/test")
    need = ("chmod", "chown", "lchown", "truncate", "open", "link_from", "rename_from",
            "unlink", "rmdir", "utimensat", "stat")
    calls = _path_calls(j(d, "missing"), existing, spare)
    eq_map(_outcomes({k: calls[k] for k in need}), dict.fromkeys(need, "ENOENT"), "calls on missing")
    os.symlink("nowhere", j(d, "dangling"))
    follow = ("chmod", "chown", "truncate", "open", "utimensat", "stat")
    calls = _path_calls(j(d, "dangling"), existing, spare)
    eq_map(_outcomes({k: calls[k] for k in follow}), dict.fromkeys(follow, "ENOENT"),
           "calls through a dangling symlink")
    gone = j(d, "gone")
    wfile(gone)
    os.link(gone, j(d, "gone2"))
    os.unlink(gone)
    os.unlink(j(d, "gone2"))
    expect_errno(errno.ENOENT, os.link, gone, spare, what="link of a removed name")
    expect_errno(errno.ENOENT, os.rename, gone, spare, what="rename of a removed name")
    eq(sorted(os.listdir(d)), ["dangling", "existing"], "listing")


@check
def check_pjd_path_eloop(d):
    """With symlinks a -> b -> a, every path call on 'a/test' and 'b/test' fails with
    ELOOP (link and rename on either side), and the calls that follow a final symlink
    (chmod, chown, truncate, open, open(O_CREAT), utimensat, stat) fail with ELOOP on 'a'."""
    os.symlink("b", j(d, "a"))
    os.symlink("a", j(d, "b"))
    existing, spare = j(d, "existing"), j(d, "spare")
    wfile(existing)
    for top in ("a", "b"):
        calls = _path_calls(j(d, top, "test"), existing, spare)
        eq_map(_outcomes(calls), dict.fromkeys(calls, "ELOOP"), f"calls on {top}/test")
    follow = ("chmod", "chown", "truncate", "open", "open_creat", "utimensat", "stat")
    calls = _path_calls(j(d, "a"), existing, spare)
    eq_map(_outcomes({k: calls[k] for k in follow}), dict.fromkeys(follow, "ELOOP"), "calls on a")
    eq(sorted(os.listdir(d)), ["a", "b", "existing"], "listing")


@check
def check_pjd_name_max_every_call(d):
    """A NAME_MAX (255-byte) name works with every path call (chmod, chown, truncate,
    utimensat, link and rename on both sides, symlink as name and as target, mkdir/rmdir,
    mkfifo, mknod, unlink); a 256-byte name fails with ENAMETOOLONG for each of them,
    except as a symlink target, which is just a string."""
    a255, b255, c256 = "a" * 255, "b" * 255, "c" * 256
    p, q, s = j(d, a255), j(d, b255), j(d, "s")
    wfile(p)
    os.chmod(p, 0o620)
    eq(mode_of(p), 0o620, "mode after chmod")
    if os.geteuid() == 0:
        os.chown(p, NOBODY_UID, NOBODY_GID)
        eq(ids_mode(p)[:2], (NOBODY_UID, NOBODY_GID), "owner after chown")
    os.truncate(p, 123)
    eq(os.stat(p).st_size, 123, "size after truncate")
    utimensat(p, 1_000_000_000, 2_000_000_000)
    eq((os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns), (1_000_000_000, 2_000_000_000), "times")
    os.link(p, q)
    eq((os.stat(p).st_nlink, os.stat(q).st_ino), (2, os.stat(p).st_ino), "(nlink, ino of link)")
    os.unlink(q)
    os.rename(p, q)
    os.rename(q, p)
    os.symlink(a255, s)
    eq((os.readlink(s), os.stat(s).st_ino), (a255, os.stat(p).st_ino), "symlink to a 255-byte name")
    os.unlink(s)
    os.unlink(p)
    os.symlink("test", p)
    eq(os.readlink(p), "test", "readlink of a 255-byte symlink name")
    os.unlink(p)
    os.mkdir(p)
    os.rmdir(p)
    os.mkfifo(p)
    os.unlink(p)
    os.mknod(p, stat.S_IFIFO | 0o644)
    eq(kind_of(p), "fifo", "type after mknod")
    os.unlink(p)
    existing, spare = j(d, "existing"), j(d, "spare")
    wfile(existing)
    calls = _path_calls(j(d, c256), existing, spare)
    eq_map(_outcomes(calls), dict.fromkeys(calls, "ENAMETOOLONG"), "calls on a 256-byte name")
    os.symlink(c256, s)
    eq(os.readlink(s), c256, "symlink with a 256-byte target")
    eq(sorted(os.listdir(d)), ["existing", "s"], "listing")


@check
def check_pjd_path_max(d):
    """A relative path of PATH_MAX - 1 = 4095 bytes (31 nested 127-byte directories and a
    127-byte name) works for open(O_CREAT), chmod, chown, truncate, utimensat, stat, link and
    rename (both sides), symlink (as name and as 4095-byte target), mkdir/rmdir, mkfifo, mknod
    (fifo; devices as root) and unlink; one byte more (4096) fails with ENAMETOOLONG for each."""
    comps = [f"{i:02d}" + "d" * 125 for i in range(31)]
    nx = "/".join(comps) + "/" + "f" * 127
    nxx = nx + "x"
    eq((len(nx), len(nxx)), (4095, 4096), "path lengths")
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_PATH", 0)
    old_cwd = os.open(".", flags)
    os.chdir(d)
    try:
        os.makedirs("/".join(comps))
        wfile("short", b"s")
        fd = os.open(nx, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        os.close(fd)
        os.chmod(nx, 0o642)
        eq(mode_of(nx), 0o642, "mode after chmod")
        if os.geteuid() == 0:
            os.chown(nx, NOBODY_UID, NOBODY_GID)
            eq(ids_mode(nx)[:2], (NOBODY_UID, NOBODY_GID), "owner after chown")
        os.truncate(nx, 123)
        utimensat(nx, 1_000_000_000, 2_000_000_000)
        st = os.stat(nx)
        eq((st.st_size, st.st_atime_ns, st.st_mtime_ns), (123, 1_000_000_000, 2_000_000_000),
           "(size, atime, mtime)")
        os.link(nx, "l1")
        os.rename(nx, "r1")
        os.link("r1", nx)
        eq(os.stat(nx).st_nlink, 3, "nlink with three names")
        os.unlink(nx)
        os.rename("r1", nx)
        os.unlink(nx)
        os.unlink("l1")
        os.symlink(nx, "sl")
        eq(os.readlink("sl"), nx, "4095-byte symlink target")
        os.unlink("sl")
        os.symlink("../" * len(comps) + "short", nx)
        eq(rfile(nx), b"s", "read through a symlink at a 4095-byte path")
        os.unlink(nx)
        os.mkdir(nx)
        os.rmdir(nx)
        os.mkfifo(nx)
        os.unlink(nx)
        nodes = [("fifo", stat.S_IFIFO, 0)]
        if os.geteuid() == 0:
            nodes += [("block", stat.S_IFBLK, os.makedev(1, 2)), ("char", stat.S_IFCHR, os.makedev(1, 2))]
        for kind, fmt, rdev in nodes:
            os.mknod(nx, fmt | 0o644, rdev)
            eq(kind_of(nx), kind, "type after mknod")
            os.unlink(nx)
        calls = _path_calls(nxx, "short", "spare")
        calls["symlink_target"] = lambda: os.symlink(nxx, "sl")
        eq_map(_outcomes(calls), dict.fromkeys(calls, "ENAMETOOLONG"), "calls on a 4096-byte path")
        eq(sorted(os.listdir(".")), [comps[0], "short"], "listing")
        shutil.rmtree(comps[0])
    finally:
        os.fchdir(old_cwd)
        os.close(old_cwd)


@check
def check_pjd_path_eacces_search(d):
    """(root; as uid 65534) A directory of the path prefix without search permission (0644,
    owned by 65534) makes every path call on 'dir/name' fail with EACCES, also when it is on
    the target side of link and rename; with 0755 the same calls work."""
    require_reachable_by_nobody(d)
    n1, n2 = j(d, "n1"), j(d, "n2")
    for x in (n1, n2):
        mknode(x, "dir", owner=(NOBODY_UID, NOBODY_GID))
    f, g = j(n1, "f"), j(n2, "g")
    mknode(f, "regular", owner=(NOBODY_UID, NOBODY_GID))
    mknode(g, "regular", owner=(NOBODY_UID, NOBODY_GID))
    os.chmod(n1, 0o644)
    calls = _path_calls(f, g, j(n2, "spare"))
    eq_map(as_nobody(lambda: _outcomes(calls)), dict.fromkeys(calls, "EACCES"), "calls on n1/f (n1 0644)")
    os.chmod(n1, 0o755)
    os.chmod(n2, 0o644)
    other = {"link_to": lambda: os.link(f, j(n2, "h")), "rename_to": lambda: os.rename(f, j(n2, "h")),
             "link_from": lambda: os.link(g, j(n1, "h")), "rename_from": lambda: os.rename(g, j(n1, "h"))}
    eq_map(as_nobody(lambda: _outcomes(other)), dict.fromkeys(other, "EACCES"), "link/rename with n2 0644")
    os.chmod(n2, 0o755)
    works = {
        "chmod": lambda: os.chmod(f, 0o642),
        "chown": lambda: os.chown(f, -1, NOBODY_GID),
        "truncate": lambda: os.truncate(f, 123),
        "utimensat": lambda: utimensat(f, "now", "now"),
        "open": lambda: os.close(os.open(f, os.O_RDONLY)),
        "link": lambda: os.link(f, j(n2, "h")),
        "rename": lambda: os.rename(j(n2, "h"), j(n1, "h")),
        "unlink": lambda: os.unlink(j(n1, "h")),
        "mkdir": lambda: os.mkdir(j(n1, "sub")),
        "rmdir": lambda: os.rmdir(j(n1, "sub")),
        "mkfifo": lambda: os.mkfifo(j(n1, "fifo")),
        "mknod": lambda: os.mknod(j(n1, "node"), stat.S_IFIFO | 0o644),
        "symlink": lambda: os.symlink("f", j(n1, "ln")),
        "open_creat": lambda: os.close(os.open(j(n1, "new"), os.O_CREAT | os.O_WRONLY, 0o644)),
    }
    eq_map(as_nobody(lambda: _outcomes(works)), dict.fromkeys(works, "ok"), "calls with both dirs 0755")
    eq((mode_of(f), os.stat(f).st_size), (0o642, 123), "(mode, size) of n1/f")
    eq(sorted(os.listdir(n1)), ["f", "fifo", "ln", "new", "node"], "listing of n1")


@check
def check_pjd_parent_write_eacces(d):
    """(root; as uid 65534) In its own directory with mode 0555, uid 65534 gets EACCES for
    open(O_CREAT) (O_RDONLY and O_WRONLY), mkdir, mkfifo, mknod, symlink, link into it,
    rename into, out of and within it, unlink and rmdir; nothing changes (entries, the file's
    ctime, the directory's mtime and ctime). With mode 0755 all of it works."""
    require_reachable_by_nobody(d)
    n1, n2 = j(d, "n1"), j(d, "n2")
    for x in (n1, n2):
        mknode(x, "dir", owner=(NOBODY_UID, NOBODY_GID))
    f, sd, g = j(n1, "f"), j(n1, "sd"), j(n2, "g")
    mknode(f, "regular", owner=(NOBODY_UID, NOBODY_GID))
    mknode(sd, "dir", owner=(NOBODY_UID, NOBODY_GID))
    mknode(g, "regular", owner=(NOBODY_UID, NOBODY_GID))
    os.chmod(n1, 0o555)
    new = j(n1, "new")
    calls = {
        "open_rdonly_creat": lambda: os.close(os.open(new, os.O_RDONLY | os.O_CREAT, 0o644)),
        "open_wronly_creat": lambda: os.close(os.open(new, os.O_WRONLY | os.O_CREAT, 0o644)),
        "mkdir": lambda: os.mkdir(new),
        "mkfifo": lambda: os.mkfifo(new),
        "mknod": lambda: os.mknod(new, stat.S_IFIFO | 0o644),
        "symlink": lambda: os.symlink("f", new),
        "link_into": lambda: os.link(g, new),
        "link_within": lambda: os.link(f, new),
        "rename_into": lambda: os.rename(g, new),
        "rename_out": lambda: os.rename(f, j(n2, "moved")),
        "rename_within": lambda: os.rename(f, new),
        "unlink": lambda: os.unlink(f),
        "rmdir": lambda: os.rmdir(sd),
    }
    before = (lctime(f), os.stat(n1).st_mtime_ns, lctime(n1))
    time.sleep(TICK_S)
    eq_map(as_nobody(lambda: _outcomes(calls)), dict.fromkeys(calls, "EACCES"), "calls in the 0555 dir")
    eq((lctime(f), os.stat(n1).st_mtime_ns, lctime(n1)), before,
       "(file ctime, dir mtime, dir ctime) after the failed calls")
    eq((sorted(os.listdir(n1)), sorted(os.listdir(n2))), (["f", "sd"], ["g"]), "listings")
    os.chmod(n1, 0o755)
    works = {
        "open_creat": lambda: os.close(os.open(j(n1, "c1"), os.O_RDONLY | os.O_CREAT, 0o644)),
        "mkdir": lambda: os.mkdir(j(n1, "c2")),
        "mkfifo": lambda: os.mkfifo(j(n1, "c3")),
        "mknod": lambda: os.mknod(j(n1, "c4"), stat.S_IFIFO | 0o644),
        "symlink": lambda: os.symlink("f", j(n1, "c5")),
        "link_into": lambda: os.link(g, j(n1, "c6")),
        "rename_into": lambda: os.rename(g, j(n1, "g")),
        "rename_out": lambda: os.rename(j(n1, "g"), g),
        "rename_within": lambda: os.rename(f, j(n1, "f2")),
        "unlink": lambda: os.unlink(j(n1, "f2")),
        "rmdir": lambda: os.rmdir(sd),
    }
    eq_map(as_nobody(lambda: _outcomes(works)), dict.fromkeys(works, "ok"), "calls in the 0755 dir")
    eq(sorted(os.listdir(n1)), ["c1", "c2", "c3", "c4", "c5", "c6"], "listing of n1")


@check
def check_pjd_efault(d):
    """A NULL or kernel-space path pointer makes chmod, chown, lchown, open, mkdir, mkfifo,
    mknod, rmdir, unlink, truncate, link, rename and symlink (either argument) fail with
    EFAULT; utimensat too for the kernel-space pointer (glibc answers EINVAL for NULL)."""
    good = ctypes.c_char_p(os.fsencode(j(d, "f")))
    spare = ctypes.c_char_p(os.fsencode(j(d, "spare")))
    wfile(j(d, "f"))
    lib = _libc
    calls = {
        "chmod": lambda p: lib.chmod(p, 0o644),
        "chown": lambda p: lib.chown(p, -1, -1),
        "lchown": lambda p: lib.lchown(p, -1, -1),
        "open": lambda p: lib.open(p, os.O_RDONLY),
        "mkdir": lambda p: lib.mkdir(p, 0o755),
        "mkfifo": lambda p: lib.mkfifo(p, 0o644),
        "mknod": lambda p: lib.mknodat(AT_FDCWD, p, stat.S_IFIFO | 0o644, ctypes.c_ulong(0)),
        "rmdir": lambda p: lib.rmdir(p),
        "unlink": lambda p: lib.unlink(p),
        "truncate": lambda p: lib.truncate(p, ctypes.c_long(123)),
        "link_from": lambda p: lib.link(p, spare),
        "link_to": lambda p: lib.link(good, p),
        "rename_from": lambda p: lib.rename(p, spare),
        "rename_to": lambda p: lib.rename(good, p),
        "symlink_target": lambda p: lib.symlink(p, spare),
        "symlink_name": lambda p: lib.symlink(good, p),
        "utimensat": lambda p: lib.utimensat(AT_FDCWD, p, None, 0),
    }

    def run(call, ptr) -> str:
        ctypes.set_errno(0)
        res = call(ptr)
        if res == -1:
            return errname(ctypes.get_errno())
        return "ok"

    for label, ptr in (("NULL", ctypes.c_void_p(None)), ("kernel address", ctypes.c_void_p(0xFFFF_FFFF_FFFF_0000))):
        names = [n for n in calls if not (n == "utimensat" and label == "NULL")]
        eq_map({n: run(calls[n], ptr) for n in names}, dict.fromkeys(names, "EFAULT"), f"{label} path")
    eq(sorted(os.listdir(d)), ["f"], "listing")


# ---- chmod -----------------------------------------------------------------

@check
def check_pjd_chmod_every_type(d):
    """chmod on every file type (regular, dir, fifo, socket, devices as root) sets 0111
    exactly and advances ctime; chmod through a symlink (0222) changes the target and not
    the link's own mode; the sticky bit is kept on every type (01621, via symlink 01700)."""
    kinds = pjd_types(symlinks=False)
    for kind in kinds:
        mknode(j(d, kind), kind)
        os.symlink(kind, j(d, kind + ".ln"))
    before = {k: lctime(j(d, k)) for k in kinds}
    time.sleep(TICK_S)
    for kind in kinds:
        os.chmod(j(d, kind), 0o111)
    eq_map({k: oct(mode_of(j(d, k), follow=False)) for k in kinds}, dict.fromkeys(kinds, oct(0o111)),
           "modes after chmod 0111")
    eq_map({k: lctime(j(d, k)) > before[k] for k in kinds}, dict.fromkeys(kinds, True), "ctime advanced")
    link_modes = {k: os.lstat(j(d, k + ".ln")).st_mode for k in kinds}
    for kind in kinds:
        os.chmod(j(d, kind + ".ln"), 0o222)
    eq_map({k: oct(mode_of(j(d, k), follow=False)) for k in kinds}, dict.fromkeys(kinds, oct(0o222)),
           "modes after chmod 0222 through a symlink")
    eq_map({k: os.lstat(j(d, k + ".ln")).st_mode for k in kinds}, link_modes, "symlinks' own modes")
    for kind in kinds:
        os.chmod(j(d, kind), 0o1621)
    eq_map({k: oct(mode_of(j(d, k), follow=False)) for k in kinds}, dict.fromkeys(kinds, oct(0o1621)),
           "modes after chmod 01621")
    for kind in kinds:
        os.chmod(j(d, kind + ".ln"), 0o1700)
    eq_map({k: oct(mode_of(j(d, k), follow=False)) for k in kinds}, dict.fromkeys(kinds, oct(0o1700)),
           "modes after chmod 01700 through a symlink")


@check
def check_pjd_chmod_eperm(d):
    """(root; as other users) chmod by a non-owner fails with EPERM and changes neither
    mode nor ctime: uid 65534 on root's nodes of every type (directly and through a
    symlink), uid 65533 on uid 65534's file; the owner 65534 may chmod its file, directly
    and through its symlink."""
    require_reachable_by_nobody(d)
    kinds = pjd_types(symlinks=False)
    for kind in kinds:
        mknode(j(d, kind), kind)
        os.symlink(kind, j(d, kind + ".ln"))
    pub = j(d, "pub")
    mknode(pub, "dir", owner=(NOBODY_UID, NOBODY_GID))
    own, own_ln = j(pub, "own"), j(pub, "own.ln")
    mknode(own, "regular", owner=(NOBODY_UID, NOBODY_GID))
    os.symlink("own", own_ln)
    os.lchown(own_ln, NOBODY_UID, NOBODY_GID)
    paths = [j(d, k) for k in kinds] + [own]
    before = {p: (mode_of(p, follow=False), lctime(p)) for p in paths}
    time.sleep(TICK_S)
    calls = {}
    for kind in kinds:
        calls[kind] = (lambda p: lambda: os.chmod(p, 0o111))(j(d, kind))
        calls[kind + " via symlink"] = (lambda p: lambda: os.chmod(p, 0o111))(j(d, kind + ".ln"))
    eq_map(as_nobody(lambda: _outcomes(calls)), dict.fromkeys(calls, "EPERM"), "chmod by uid 65534 on root's nodes")
    other = {"direct": lambda: os.chmod(own, 0o641), "via symlink": lambda: os.chmod(own_ln, 0o641)}
    eq_map(as_user(lambda: _outcomes(other), PJD_U2), dict.fromkeys(other, "EPERM"),
           "chmod by uid 65533 on uid 65534's file")
    eq_map({p: (mode_of(p, follow=False), lctime(p)) for p in paths}, before, "(mode, ctime) after failed chmods")
    mine = {"direct": lambda: os.chmod(own, 0o642), "via symlink": lambda: os.chmod(own_ln, 0o640)}
    eq_map(as_nobody(lambda: _outcomes(mine)), dict.fromkeys(mine, "ok"), "chmod by the owner")
    eq(mode_of(own), 0o640, "mode of the owner's file")


@check
def check_pjd_chmod_setgid_sticky_nonroot(d):
    """(root; as uid 65534) the owner's chmod 02755 keeps S_ISGID while the file's group is
    its gid, and silently drops it (mode 0755) when its gid is 65533; the owner can set the
    sticky bit on its directory (01755) and, on Linux, on its regular file, fifo, socket and
    device nodes (01644, and 01640 through a symlink)."""
    require_reachable_by_nobody(d)
    pub = j(d, "pub")
    mknode(pub, "dir", owner=(NOBODY_UID, NOBODY_GID))
    f = j(pub, "f")
    mknode(f, "regular", mode=0o755, owner=(NOBODY_UID, NOBODY_GID))
    kinds = [k for k in pjd_types(symlinks=False) if k != "regular"]
    for kind in kinds:
        mknode(j(pub, kind), kind, mode=0o640 if kind != "dir" else 0o755, owner=(NOBODY_UID, NOBODY_GID))
        os.symlink(kind, j(pub, kind + ".ln"))

    def as_member():
        r = {"chmod 02755": outcome(os.chmod, f, 0o2755), "mode after 02755": oct(mode_of(f)),
             "chmod 0755": outcome(os.chmod, f, 0o755), "mode after 0755": oct(mode_of(f))}
        for kind in kinds:
            want = 0o1755 if kind == "dir" else 0o1644
            r[kind] = (outcome(os.chmod, j(pub, kind), want), oct(mode_of(j(pub, kind), follow=False)))
            if kind != "dir":
                r[kind + " via symlink"] = (outcome(os.chmod, j(pub, kind + ".ln"), 0o1640),
                                            oct(mode_of(j(pub, kind), follow=False)))
        return r

    expected = {"chmod 02755": "ok", "mode after 02755": oct(0o2755), "chmod 0755": "ok",
                "mode after 0755": oct(0o755)}
    for kind in kinds:
        expected[kind] = ("ok", oct(0o1755 if kind == "dir" else 0o1644))
        if kind != "dir":
            expected[kind + " via symlink"] = ("ok", oct(0o1640))
    eq_map(as_nobody(as_member), expected, "chmod by the owner (gid 65534)")
    r = as_user(lambda: (outcome(os.chmod, f, 0o2755), oct(mode_of(f))), NOBODY_UID, PJD_U2)
    eq(r, ("ok", oct(0o755)), "chmod 02755 by the owner with gid 65533")


@check
def check_pjd_write_clears_setid(d):
    """(root; as uid 65534) a write by a non-owner clears S_ISUID and S_ISGID: root's files
    04777 (written via O_WRONLY), 02777 and 06777 (via O_RDWR) all become 0777, as seen by
    fstat on the writer's descriptor and by stat afterwards."""
    require_reachable_by_nobody(d)
    cases = {"04777": (0o4777, os.O_WRONLY), "02777": (0o2777, os.O_RDWR), "06777": (0o6777, os.O_RDWR)}
    for name, (mode, _) in cases.items():
        mknode(j(d, name), "regular", mode=mode)

    def probe():
        r = {}
        for name, (_, flags) in cases.items():
            fd = os.open(j(d, name), flags)
            try:
                os.write(fd, b"x")
                r[name] = oct(stat.S_IMODE(os.fstat(fd).st_mode))
            finally:
                os.close(fd)
        return r

    eq_map(as_nobody(probe), dict.fromkeys(cases, oct(0o777)), "fstat mode after the write")
    eq_map({n: oct(mode_of(j(d, n))) for n in cases}, dict.fromkeys(cases, oct(0o777)), "stat mode afterwards")
    eq_map({n: os.stat(j(d, n)).st_size for n in cases}, dict.fromkeys(cases, 1), "sizes")


# ---- chown -----------------------------------------------------------------

@check
def check_pjd_chown_owner_changes_group(d):
    """(root; as uid 65534 with groups 65532 and 65531) the owner may set the group to one
    of its groups, naming its uid or -1 (chown(-1, 65532), chown(65534, 65531)), on every
    file type, through a symlink (the target changes, the link does not) and with lchown on
    its symlink; chown(-1, -1) by a non-owner succeeds and changes nothing."""
    require_reachable_by_nobody(d)
    kinds = pjd_types()
    for kind in kinds:
        mknode(j(d, kind), kind, owner=(NOBODY_UID, PJD_U2))
        mknode(j(d, "root-" + kind), kind)
        if kind != "symlink":
            os.symlink(kind, j(d, kind + ".ln"))

    def probe():
        r = {}
        for kind in kinds:
            p = j(d, kind)
            ch = os.lchown if kind == "symlink" else os.chown
            r[kind + " -1:65532"] = (outcome(ch, p, -1, PJD_G3), ids_mode(p)[:2])
            r[kind + " 65534:65531"] = (outcome(ch, p, NOBODY_UID, PJD_G4), ids_mode(p)[:2])
            if kind != "symlink":
                ln = j(d, kind + ".ln")
                r[kind + " via symlink"] = (outcome(os.chown, ln, -1, PJD_G3), ids_mode(p)[:2],
                                            ids_mode(ln)[:2])
        return r

    expected = {}
    for kind in kinds:
        expected[kind + " -1:65532"] = ("ok", (NOBODY_UID, PJD_G3))
        expected[kind + " 65534:65531"] = ("ok", (NOBODY_UID, PJD_G4))
        if kind != "symlink":
            expected[kind + " via symlink"] = ("ok", (NOBODY_UID, PJD_G3), (0, 0))
    eq_map(as_user(probe, NOBODY_UID, PJD_G3, [PJD_G3, PJD_G4]), expected, "chown by the owner")

    def non_owner():
        r = {}
        for kind in kinds:
            p = j(d, "root-" + kind)
            r[kind] = outcome(os.lchown if kind == "symlink" else os.chown, p, -1, -1)
            if kind != "symlink":
                r[kind + " via symlink"] = outcome(os.chown, j(d, kind + ".ln"), -1, -1)
        return r

    got = as_nobody(non_owner)
    eq_map(got, dict.fromkeys(got, "ok"), "chown(-1, -1) by a non-owner")
    eq_map({k: ids_mode(j(d, "root-" + k))[:2] for k in kinds}, dict.fromkeys(kinds, (0, 0)),
           "owners after chown(-1, -1)")


@check
def check_pjd_chown_eperm(d):
    """(root; as other users) chown fails with EPERM, leaving uid, gid and ctime alone, when
    the owner 65534 gives a node away (65533:65533) or sets a group it is not in (-1:65533),
    when a non-owner (65533) sets 65534:65534 or 65533:65533, and when uid 65534 changes root's
    node (65534:-1, -1:65534, 65534:65534): every file type, through symlinks and with lchown."""
    require_reachable_by_nobody(d)
    kinds = pjd_types()
    paths = []
    for kind in kinds:
        for who, owner in (("n", (NOBODY_UID, NOBODY_GID)), ("r", (0, 0))):
            p = j(d, f"{who}-{kind}")
            mknode(p, kind, owner=owner)
            paths.append(p)
            if kind != "symlink":
                os.symlink(f"{who}-{kind}", p + ".ln")
    before = {p: (ids_mode(p)[:2], lctime(p)) for p in paths}
    time.sleep(TICK_S)

    def attempts(pairs_own, pairs_root):
        def run():
            r = {}
            for kind in kinds:
                for who, pairs in (("n", pairs_own), ("r", pairs_root)):
                    p = j(d, f"{who}-{kind}")
                    for u, g in pairs:
                        if kind == "symlink":
                            r[f"lchown {who}-{kind} {u}:{g}"] = outcome(os.lchown, p, u, g)
                        else:
                            r[f"chown {who}-{kind} {u}:{g}"] = outcome(os.chown, p, u, g)
                            r[f"lchown {who}-{kind} {u}:{g}"] = outcome(os.lchown, p, u, g)
                            r[f"chown {who}-{kind}.ln {u}:{g}"] = outcome(os.chown, p + ".ln", u, g)
            return r
        return run

    got = as_nobody(attempts([(PJD_U2, PJD_U2), (-1, PJD_U2)],
                             [(NOBODY_UID, -1), (-1, NOBODY_GID), (NOBODY_UID, NOBODY_GID)]))
    eq_map(got, dict.fromkeys(got, "EPERM"), "chown by uid 65534")
    got = as_user(attempts([(NOBODY_UID, NOBODY_GID), (PJD_U2, PJD_U2)], []), PJD_U2)
    eq_map(got, dict.fromkeys(got, "EPERM"), "chown by uid 65533")
    eq_map({p: (ids_mode(p)[:2], lctime(p)) for p in paths}, before, "(owner, ctime) after failed chowns")


@check
def check_pjd_chown_clears_setid(d):
    """(root) chown of a 06555 node to a new owner or group clears S_ISUID and S_ISGID on
    every non-directory type (mode 0555) and keeps them on a directory: done by root
    (65534:65533 -> 65532:65531 -> 0:0) and by the owner 65534 changing the group to one of
    its groups (65533/65532); chown(-1, -1) may clear them or not (POSIX allows both)."""
    require_reachable_by_nobody(d)
    kinds = pjd_types(symlinks=False)
    for kind in kinds:
        mknode(j(d, kind), kind, owner=(NOBODY_UID, PJD_U2))

    def cleared(kind):
        return oct(0o6555 if kind == "dir" else 0o555)

    got, want = {}, {}
    for kind in kinds:
        p = j(d, kind)
        os.chmod(p, 0o6555)
        os.chown(p, PJD_G3, PJD_G4)
        got[f"{kind} -> 65532:65531"] = ids_mode(p)
        os.chmod(p, 0o6555)
        os.chown(p, 0, 0)
        got[f"{kind} -> 0:0"] = ids_mode(p)
        os.chmod(p, 0o6555)
        os.chown(p, -1, -1)
        got[f"{kind} -> -1:-1"] = ids_mode(p)[2]
        want[f"{kind} -> 65532:65531"] = (PJD_G3, PJD_G4, cleared(kind))
        want[f"{kind} -> 0:0"] = (0, 0, cleared(kind))
        want[f"{kind} -> -1:-1"] = (oct(0o6555), cleared(kind))
    eq_map(got, want, "chown by root")
    for kind in kinds:
        os.chown(j(d, kind), NOBODY_UID, PJD_U2)
        os.chmod(j(d, kind), 0o6555)
    by_owner = {k: (lambda p: lambda: (outcome(os.chown, p, NOBODY_UID, PJD_G3), ids_mode(p)))(j(d, k))
                for k in kinds}
    eq_map(as_user(lambda: {k: f() for k, f in by_owner.items()}, NOBODY_UID, PJD_U2, [PJD_U2, PJD_G3]),
           {k: ("ok", (NOBODY_UID, PJD_G3, cleared(k))) for k in kinds}, "chown 65534:65532 by the owner")
    for kind in kinds:
        os.chmod(j(d, kind), 0o6555)

    def noop():
        r = {}
        for k in kinds:
            r[k] = outcome(os.chown, j(d, k), -1, -1)
            r[k + " mode"] = ids_mode(j(d, k))[2]
        return r

    want = {}
    for k in kinds:
        want[k], want[k + " mode"] = "ok", (oct(0o6555), cleared(k))
    eq_map(as_user(noop, NOBODY_UID, PJD_U2, [PJD_U2, PJD_G3]), want, "chown(-1, -1) by the owner")


@check
def check_pjd_chown_ctime(d):
    """(root; as uid 65534) every successful chown advances ctime, on every file type: by
    root (lchown for symlinks), by root through a symlink, and by the owner 65534 setting one
    of its groups (65532)."""
    require_reachable_by_nobody(d)
    kinds = pjd_types()
    for kind in kinds:
        mknode(j(d, kind), kind)
        if kind != "symlink":
            os.symlink(kind, j(d, kind + ".ln"))

    def stamp():
        return {k: lctime(j(d, k)) for k in kinds}

    def advanced(before, what):
        after = stamp()
        eq_map({k: after[k] > before[k] for k in kinds}, dict.fromkeys(kinds, True), f"ctime advanced by {what}")

    t0 = stamp()
    time.sleep(TICK_S)
    for kind in kinds:
        os.lchown(j(d, kind), NOBODY_UID, PJD_U2)
    advanced(t0, "chown by root")
    t1 = stamp()
    time.sleep(TICK_S)
    for kind in kinds:
        if kind == "symlink":
            os.lchown(j(d, kind), NOBODY_UID, NOBODY_GID)
        else:
            os.chown(j(d, kind + ".ln"), NOBODY_UID, NOBODY_GID)
    advanced(t1, "chown by root through a symlink")
    t2 = stamp()
    time.sleep(TICK_S)
    got = as_user(lambda: {k: outcome(os.lchown, j(d, k), -1, PJD_G3) for k in kinds},
                  NOBODY_UID, NOBODY_GID, [NOBODY_GID, PJD_G3])
    eq_map(got, dict.fromkeys(kinds, "ok"), "chown by the owner")
    advanced(t2, "chown by the owner")


# ---- truncate, ftruncate, posix_fallocate --------------------------------

@check
def check_pjd_truncate_sizes(d):
    """truncate and ftruncate (through O_RDWR and O_WRONLY descriptors) set the size:
    0 -> 1234567 -> 567; a 12345-byte file -> 23456 -> 1, keeping the first byte."""
    f = j(d, "f")
    wfile(f)
    os.truncate(f, 1234567)
    eq(os.stat(f).st_size, 1234567, "size after truncate up")
    os.truncate(f, 567)
    eq(os.stat(f).st_size, 567, "size after truncate down")
    data = pattern_bytes(12345, 7)
    wfile(f, data)
    for flags, size in ((os.O_RDWR, 23456), (os.O_WRONLY, 1)):
        fd = os.open(f, flags)
        try:
            os.ftruncate(fd, size)
            eq(os.fstat(fd).st_size, size, "fstat size after ftruncate")
        finally:
            os.close(fd)
    eq(rfile(f), data[:1], "content after ftruncate to 1")


@check
def check_pjd_truncate_errors(d):
    """truncate/ftruncate errors: a negative length -> EINVAL; 999999999999999 bytes ->
    EFBIG or EINVAL with the size unchanged (or success with exactly that size); truncate
    of a directory -> EISDIR; ftruncate on a read-only fd -> EINVAL, on a closed fd ->
    EBADF. The failures leave size and ctime alone."""
    f = j(d, "f")
    wfile(f, b"hello")
    os.mkdir(j(d, "dir"))
    before = lctime(f)
    time.sleep(TICK_S)
    r = {"truncate -1": outcome(os.truncate, f, -1), "truncate -999999": outcome(os.truncate, f, -999999),
         "truncate dir": outcome(os.truncate, j(d, "dir"), 123)}
    for name, flags, length in (("rdwr", os.O_RDWR, -1), ("wronly", os.O_WRONLY, -999999), ("rdonly", os.O_RDONLY, 123)):
        fd = os.open(f, flags)
        try:
            r[f"ftruncate {name} {length}"] = outcome(os.ftruncate, fd, length)
        finally:
            os.close(fd)
    r["ftruncate closed fd"] = outcome(os.ftruncate, fd, 123)
    eq_map(r, {"truncate -1": "EINVAL", "truncate -999999": "EINVAL", "truncate dir": "EISDIR",
               "ftruncate rdwr -1": "EINVAL", "ftruncate wronly -999999": "EINVAL",
               "ftruncate rdonly 123": "EINVAL", "ftruncate closed fd": "EBADF"}, "outcomes")
    eq((os.stat(f).st_size, lctime(f)), (5, before), "(size, ctime) after the failures")
    huge = 999999999999999
    for how in ("truncate", "ftruncate"):
        if how == "truncate":
            res = outcome(os.truncate, f, huge)
        else:
            fd = os.open(f, os.O_RDWR)
            try:
                res = outcome(os.ftruncate, fd, huge)
            finally:
                os.close(fd)
        if res == "ok":
            eq(os.stat(f).st_size, huge, f"size after a successful {how} to {huge}")
            os.truncate(f, 5)
        else:
            expect_one_of(res, ("EFBIG", "EINVAL"), f"{how} to {huge}")
            eq(os.stat(f).st_size, 5, f"size after a failed {how} to {huge}")
    eq(rfile(f), b"hello", "content")


@check
def check_pjd_truncate_eacces(d):
    """(root; as uid 65534) truncate without write permission fails with EACCES (root's
    0644 file, and its own 0444 file) leaving size and ctime alone; a descriptor from
    open(O_CREAT|O_RDWR, mode 0) can be ftruncated and posix_fallocated, by root and by
    uid 65534 in a 0777 directory."""
    require_reachable_by_nobody(d)
    rootf = j(d, "rootf")
    wfile(rootf, b"data")
    pub = j(d, "pub")
    os.mkdir(pub)
    os.chmod(pub, 0o777)
    own = j(pub, "own")
    mknode(own, "regular", mode=0o444, owner=(NOBODY_UID, NOBODY_GID))
    before = {p: (os.stat(p).st_size, lctime(p)) for p in (rootf, own)}
    time.sleep(TICK_S)
    got = as_nobody(lambda: {"root 0644": outcome(os.truncate, rootf, 123), "own 0444": outcome(os.truncate, own, 123)})
    eq_map(got, {"root 0644": "EACCES", "own 0444": "EACCES"}, "truncate by uid 65534")
    eq_map({p: (os.stat(p).st_size, lctime(p)) for p in (rootf, own)}, before, "(size, ctime) afterwards")

    def mode0(path):
        def run():
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0)
            try:
                return (outcome(os.ftruncate, fd, 0), outcome(os.posix_fallocate, fd, 0, 1),
                        os.fstat(fd).st_size)
            finally:
                os.close(fd)
        return run

    eq(mode0(j(d, "zero"))(), ("ok", "ok", 1), "(ftruncate, posix_fallocate, size) by root on a mode-0 file")
    eq(as_nobody(mode0(j(pub, "zero"))), ("ok", "ok", 1),
       "(ftruncate, posix_fallocate, size) by uid 65534 on a mode-0 file")
    eq(mode_of(j(pub, "zero")), 0, "mode of the file created with mode 0")


@check
def check_pjd_posix_fallocate(d):
    """posix_fallocate(0, 567) on an empty file gives size 567; (20000, 3456) on a
    12345-byte file gives 23456 and keeps the data; growing advances ctime; len 0 ->
    EINVAL and a read-only descriptor -> EBADF, both leaving size and ctime alone."""
    f = j(d, "f")
    wfile(f)
    fd = os.open(f, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 567)
    finally:
        os.close(fd)
    eq(os.stat(f).st_size, 567, "size after posix_fallocate(0, 567)")
    data = pattern_bytes(12345, 8)
    wfile(f, data)
    before = lctime(f)
    time.sleep(TICK_S)
    fd = os.open(f, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 20000, 3456)
    finally:
        os.close(fd)
    eq(os.stat(f).st_size, 23456, "size after posix_fallocate(20000, 3456)")
    expect(lctime(f) > before, "ctime not advanced by a growing posix_fallocate")
    eq(rfile(f), data + bytes(23456 - 12345), "content")
    before = lctime(f)
    time.sleep(TICK_S)
    r = {}
    for name, flags, off, length in (("len 0", os.O_WRONLY, 0, 0), ("read-only fd", os.O_RDONLY, 0, 30000)):
        fd = os.open(f, flags)
        try:
            r[name] = outcome(os.posix_fallocate, fd, off, length)
        finally:
            os.close(fd)
    eq_map(r, {"len 0": "EINVAL", "read-only fd": "EBADF"}, "outcomes")
    eq((os.stat(f).st_size, lctime(f)), (23456, before), "(size, ctime) after the failures")


# ---- link ------------------------------------------------------------------

@check
def check_pjd_link_every_type(d):
    """link works for regular files, fifos, sockets and (root) device nodes: nlink goes
    1, 2, 3 on every name, chmod (and chown as root) through one name shows on all, unlink
    brings it back down; each link advances the node's ctime and the directory's mtime and
    ctime."""
    kinds = pjd_types(dirs=False, symlinks=False)
    for kind in kinds:
        sub = j(d, kind)
        os.mkdir(sub)
        mknode(j(sub, "n0"), kind)
    before = {k: (lctime(j(d, k, "n0")), os.stat(j(d, k)).st_mtime_ns, lctime(j(d, k))) for k in kinds}
    time.sleep(TICK_S)
    for kind in kinds:
        os.link(j(d, kind, "n0"), j(d, kind, "n1"))
    after = {k: (lctime(j(d, k, "n0")), os.stat(j(d, k)).st_mtime_ns, lctime(j(d, k))) for k in kinds}
    eq_map({k: tuple(a > b for a, b in zip(after[k], before[k])) for k in kinds},
           dict.fromkeys(kinds, (True, True, True)), "(node ctime, dir mtime, dir ctime) advanced by link")
    root = os.geteuid() == 0

    def view(kind, names):
        out = []
        for n in names:
            st = os.lstat(j(d, kind, n))
            out.append((kind_of(j(d, kind, n)), oct(stat.S_IMODE(st.st_mode)), st.st_nlink)
                       + ((st.st_uid, st.st_gid) if root else ()))
        return out

    for kind in kinds:
        eq(view(kind, ["n0", "n1"]), [view(kind, ["n0"])[0]] * 2, f"{kind}: both names")
        eq(os.lstat(j(d, kind, "n0")).st_nlink, 2, f"{kind}: nlink after one link")
        os.link(j(d, kind, "n1"), j(d, kind, "n2"))
        os.chmod(j(d, kind, "n1"), 0o201)
        if root:
            os.chown(j(d, kind, "n1"), NOBODY_UID, PJD_U2)
        ids = (NOBODY_UID, PJD_U2) if root else ()
        eq(view(kind, ["n0", "n1", "n2"]), [(kind, oct(0o201), 3) + ids] * 3, f"{kind}: three names")
        os.unlink(j(d, kind, "n0"))
        eq(view(kind, ["n1", "n2"]), [(kind, oct(0o201), 2) + ids] * 2, f"{kind}: after unlinking n0")
        os.unlink(j(d, kind, "n2"))
        eq(view(kind, ["n1"]), [(kind, oct(0o201), 1) + ids], f"{kind}: after unlinking n2")
        eq(sorted(os.listdir(j(d, kind))), ["n1"], f"{kind}: listing")


@check
def check_pjd_link_dir_eperm_nonroot(d):
    """(root; as uid 65534) link() of its own directory fails with EPERM for an
    unprivileged user too, and creates nothing."""
    require_reachable_by_nobody(d)
    pub = j(d, "pub")
    mknode(pub, "dir", owner=(NOBODY_UID, NOBODY_GID))

    def probe():
        os.mkdir(j(pub, "sub"))
        return outcome(os.link, j(pub, "sub"), j(pub, "sub2"))

    eq(as_nobody(probe), "EPERM", "link of a directory by uid 65534")
    eq(os.listdir(pub), ["sub"], "listing")


@check
def check_pjd_eexist_every_type(d):
    """Creating a name that exists as any file type (regular, dir, fifo, socket, devices
    as root, dangling symlink) fails with EEXIST for mkdir, mkfifo, mknod (fifo; block and
    char as root), symlink, link and open(O_CREAT|O_EXCL); the node stays as it was and a
    dangling symlink's target is not created."""
    src = j(d, "src")
    wfile(src)
    root = os.geteuid() == 0
    for kind in pjd_types():
        p = j(d, kind)
        mknode(p, kind)
        st = os.lstat(p)
        calls = {
            "mkdir": lambda: os.mkdir(p),
            "mkfifo": lambda: os.mkfifo(p),
            "mknod fifo": lambda: os.mknod(p, stat.S_IFIFO | 0o644),
            "symlink": lambda: os.symlink("test", p),
            "link": lambda: os.link(src, p),
            "open O_CREAT|O_EXCL": lambda: os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)),
        }
        if root:
            calls["mknod block"] = lambda: os.mknod(p, stat.S_IFBLK | 0o644, os.makedev(1, 2))
            calls["mknod char"] = lambda: os.mknod(p, stat.S_IFCHR | 0o644, os.makedev(1, 2))
        eq_map(_outcomes(calls), dict.fromkeys(calls, "EEXIST"), f"creating over an existing {kind}")
        after = os.lstat(p)
        eq((after.st_ino, after.st_mode, after.st_nlink), (st.st_ino, st.st_mode, st.st_nlink),
           f"{kind} after the attempts")
    eq(os.path.lexists(j(d, "test")), False, "target of the dangling symlink exists")
    eq(os.stat(src).st_nlink, 1, "nlink of the link source")


# ---- create: mode, owner, times ------------------------------------------

_CREATORS: dict[str, Callable[[str, int], None]] = {
    "mkdir": lambda p, m: os.mkdir(p, m),
    "mkfifo": lambda p, m: os.mkfifo(p, m),
    "mknod": lambda p, m: os.mknod(p, stat.S_IFIFO | m),
    "open": lambda p, m: os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, m)),
}


@check
def check_pjd_create_mode_umask(d):
    """mkdir, mkfifo, mknod(S_IFIFO) and open(O_CREAT) give exactly mode & ~umask: 0755 and
    0151 under umask 0, 0151 under 077 -> 0100, 0345 under 070 -> 0305, 0345 under 0501 ->
    0244."""
    cases = [(0, 0o755, 0o755), (0, 0o151, 0o151), (0o077, 0o151, 0o100), (0o070, 0o345, 0o305),
             (0o501, 0o345, 0o244)]
    got, want = {}, {}
    old = os.umask(0)
    try:
        for i, (mask, mode, result) in enumerate(cases):
            os.umask(mask)
            for name, create in _CREATORS.items():
                p = j(d, f"{name}{i}")
                create(p, mode)
                key = f"{name} {oct(mode)} umask {oct(mask)}"
                got[key] = oct(mode_of(p, follow=False))
                want[key] = oct(result)
    finally:
        os.umask(old)
    eq_map(got, want, "modes")


@check
def check_pjd_create_owner_group(d):
    """(root; as other users) new dirs, fifos (mkfifo and mknod), regular files and symlinks
    belong to the creator's uid and effective gid (parent without setgid): in a 0755 dir of
    4242:4343, uid 4242 with gid 4343 -> 4242:4343 and with gid 65534 -> 4242:65534; in a 0777
    dir, uid 65534 with gid 65533 -> 65534:65533."""
    require_reachable_by_nobody(d)
    creators = dict(_CREATORS, symlink=lambda p, m: os.symlink("test", p))
    top = j(d, "top")
    mknode(top, "dir", owner=(OTHER_UID, OTHER_GID))

    def create(tag):
        def run():
            out = {}
            for name, make in creators.items():
                p = j(top, f"{name}-{tag}")
                make(p, 0o755)
                st = os.lstat(p)
                out[name] = (st.st_uid, st.st_gid)
            return out
        return run

    for tag, uid, gid in (("a", OTHER_UID, OTHER_GID), ("b", OTHER_UID, NOBODY_GID)):
        eq_map(as_user(create(tag), uid, gid), dict.fromkeys(creators, (uid, gid)),
               f"owners of nodes made by {uid}:{gid}")
    os.chmod(top, 0o777)
    eq_map(as_user(create("c"), NOBODY_UID, PJD_U2), dict.fromkeys(creators, (NOBODY_UID, PJD_U2)),
           f"owners of nodes made by {NOBODY_UID}:{PJD_U2}")


@check
def check_pjd_create_times(d):
    """mkdir, mkfifo, mknod (fifo; block and char as root), open(O_CREAT) and symlink give
    the new node atime, mtime and ctime later than the directory's previous ctime and advance
    the directory's mtime and ctime; open(O_CREAT) of an existing file leaves the directory's
    times alone; open(O_WRONLY|O_TRUNC) of a 5-byte file empties it and advances its mtime and
    ctime."""
    creators = dict(_CREATORS, symlink=lambda p, m: os.symlink("test", p))
    if os.geteuid() == 0:
        creators["mknod block"] = lambda p, m: os.mknod(p, stat.S_IFBLK | m, os.makedev(1, 2))
        creators["mknod char"] = lambda p, m: os.mknod(p, stat.S_IFCHR | m, os.makedev(1, 2))
    for name in creators:
        os.mkdir(j(d, name))
    ex = j(d, "existing")
    os.mkdir(ex)
    wfile(j(ex, "f"), b"test\n")
    before = {n: lctime(j(d, n)) for n in creators}
    ex_before = (os.stat(ex).st_mtime_ns, lctime(ex))
    f_before = (os.stat(j(ex, "f")).st_mtime_ns, lctime(j(ex, "f")))
    time.sleep(TICK_S)
    for name, make in creators.items():
        make(j(d, name, "new"), 0o755)
    got = {}
    for name in creators:
        node = os.lstat(j(d, name, "new"))
        parent = os.stat(j(d, name))
        t = before[name]
        got[name] = (node.st_atime_ns > t, node.st_mtime_ns > t, node.st_ctime_ns > t,
                     parent.st_mtime_ns > t, parent.st_ctime_ns > t)
    eq_map(got, dict.fromkeys(creators, (True,) * 5),
           "(node atime, mtime, ctime, dir mtime, dir ctime) later than the dir's old ctime")
    os.close(os.open(j(ex, "f"), os.O_CREAT | os.O_RDONLY, 0o644))
    eq((os.stat(ex).st_mtime_ns, lctime(ex)), ex_before, "dir (mtime, ctime) after open(O_CREAT) of an existing file")
    os.close(os.open(j(ex, "f"), os.O_WRONLY | os.O_TRUNC))
    st = os.stat(j(ex, "f"))
    eq((st.st_size, st.st_mtime_ns > f_before[0], st.st_ctime_ns > f_before[1]), (0, True, True),
       "(size, mtime advanced, ctime advanced) after open(O_WRONLY|O_TRUNC)")


# ---- open --------------------------------------------------------------------

_PJD_OPEN_MODES = (0o600, 0o060, 0o006, 0o477, 0o747, 0o774, 0o277, 0o727, 0o772,
                   0o177, 0o717, 0o771, 0o077, 0o707, 0o770)


@check
def check_pjd_open_access_matrix(d):
    """(root; as owner 65534, group member 65533:65534 and other 65533:65533) open grants
    exactly what the caller's class bits allow, for 15 modes (0600/0060/0006, 0477/0747/0774,
    0277/..., 0177/..., 0077/...): a regular file for O_RDONLY/O_WRONLY/O_RDWR; a FIFO for
    O_RDONLY|O_NONBLOCK and O_RDWR, and O_WRONLY|O_NONBLOCK gives ENXIO (no reader) when
    allowed, EACCES when not; a directory opens O_RDONLY only with the r bit."""
    require_reachable_by_nobody(d)
    top = j(d, "top")
    mknode(top, "dir", owner=(NOBODY_UID, NOBODY_GID))
    for m in _PJD_OPEN_MODES:
        for kind, prefix in (("regular", "f"), ("fifo", "p"), ("dir", "d")):
            mknode(j(top, f"{prefix}{m:04o}"), kind, mode=m, owner=(NOBODY_UID, NOBODY_GID))

    def probe():
        r = {}
        for m in _PJD_OPEN_MODES:
            f, p, dd = (j(top, f"{x}{m:04o}") for x in "fpd")
            r[f"{m:04o} file"] = tuple(outcome(os.open, f, fl) for fl in (os.O_RDONLY, os.O_WRONLY, os.O_RDWR))
            r[f"{m:04o} fifo"] = tuple(outcome(os.open, p, fl) for fl in
                                       (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK, os.O_RDWR))
            r[f"{m:04o} dir"] = outcome(os.open, dd, os.O_RDONLY)
        return r

    for label, uid, gid, shift in (("owner", NOBODY_UID, NOBODY_GID, 6), ("group", PJD_U2, NOBODY_GID, 3),
                                   ("other", PJD_U2, PJD_U2, 0)):
        want = {}
        for m in _PJD_OPEN_MODES:
            bits = (m >> shift) & 7
            rd, wr = bool(bits & 4), bool(bits & 2)
            ok = lambda c: "ok" if c else "EACCES"  # noqa: E731
            want[f"{m:04o} file"] = (ok(rd), ok(wr), ok(rd and wr))
            want[f"{m:04o} fifo"] = (ok(rd), "ENXIO" if wr else "EACCES", ok(rd and wr))
            want[f"{m:04o} dir"] = ok(rd)
        eq_map(as_user(probe, uid, gid), want, f"opens by the {label} ({uid}:{gid})")


@check
def check_pjd_open_trunc_needs_write(d):
    """(root; as 65534 / 65533) open(O_RDONLY|O_TRUNC) without write permission fails with
    EACCES for the owner, group and other classes (modes 0477/0747/0774, 0177/0717/0771,
    0077/0707/0770) and the 1-byte file keeps its size."""
    require_reachable_by_nobody(d)
    top = j(d, "top")
    mknode(top, "dir", owner=(NOBODY_UID, NOBODY_GID))
    classes = {"owner": (NOBODY_UID, NOBODY_GID, (0o477, 0o177, 0o077)),
               "group": (PJD_U2, NOBODY_GID, (0o747, 0o717, 0o707)),
               "other": (PJD_U2, PJD_U2, (0o774, 0o771, 0o770))}
    for label, (_, _, modes) in classes.items():
        for m in modes:
            p = j(top, f"{label}{m:04o}")
            wfile(p, b"x")
            os.chown(p, NOBODY_UID, NOBODY_GID)
            os.chmod(p, m)
    for label, (uid, gid, modes) in classes.items():
        paths = {f"{m:04o}": j(top, f"{label}{m:04o}") for m in modes}
        got = as_user(lambda: {k: outcome(os.open, p, os.O_RDONLY | os.O_TRUNC) for k, p in paths.items()}, uid, gid)
        eq_map(got, dict.fromkeys(paths, "EACCES"), f"O_RDONLY|O_TRUNC by the {label}")
        eq_map({k: os.stat(p).st_size for k, p in paths.items()}, dict.fromkeys(paths, 1), f"sizes ({label})")


@check
def check_pjd_open_rdonly_trunc(d):
    """On Linux open(O_RDONLY|O_TRUNC) of a file the caller may write truncates it to 0
    bytes (POSIX leaves it unspecified) although the descriptor is read-only: fstat and
    stat show size 0, read gives b'', write fails with EBADF."""
    f = j(d, "f")
    wfile(f, b"hello")
    fd = os.open(f, os.O_RDONLY | os.O_TRUNC)
    try:
        got = (os.fstat(fd).st_size, os.read(fd, 10), outcome(os.write, fd, b"x"))
    finally:
        os.close(fd)
    eq(got, (0, b"", "EBADF"), "(fstat size, read, write) on the O_RDONLY|O_TRUNC descriptor")
    eq((os.stat(f).st_size, rfile(f)), (0, b""), "(size, content) afterwards")


@check
def check_pjd_open_flags(d):
    """open flag combinations (Linux): O_RDONLY|O_RDWR is O_RDWR; access mode 3
    (O_WRONLY|O_RDWR) opens or fails with EINVAL; O_NOFOLLOW on a symlink -> ELOOP with
    O_RDONLY, O_WRONLY, O_RDWR and O_RDONLY|O_CREAT; a directory with O_WRONLY, O_RDWR or any
    O_TRUNC combination -> EISDIR; O_WRONLY|O_NONBLOCK on a FIFO without a reader -> ENXIO; any
    open of a socket node -> ENXIO; O_CREAT with mode 0 works for O_WRONLY, O_RDWR and
    O_RDONLY and gives mode 0."""
    f = j(d, "f")
    wfile(f, b"abc")
    fd = os.open(f, os.O_RDONLY | os.O_RDWR)
    try:
        eq((os.write(fd, b"X"), os.pread(fd, 3, 0)), (1, b"Xbc"), "O_RDONLY|O_RDWR write and read")
    finally:
        os.close(fd)
    expect_one_of(outcome(os.open, f, os.O_WRONLY | os.O_RDWR), ("ok", "EINVAL"), "open with access mode 3")
    os.symlink("f", j(d, "ln"))
    os.mkdir(j(d, "dir"))
    os.mkfifo(j(d, "fifo"))
    mknode(j(d, "sock"), "socket")
    r = {}
    for name, fl in (("O_RDONLY", os.O_RDONLY), ("O_WRONLY", os.O_WRONLY), ("O_RDWR", os.O_RDWR),
                     ("O_RDONLY|O_CREAT", os.O_RDONLY | os.O_CREAT)):
        r["nofollow " + name] = outcome(os.open, j(d, "ln"), fl | os.O_NOFOLLOW, 0o644)
    for name, fl in (("O_WRONLY", os.O_WRONLY), ("O_RDWR", os.O_RDWR), ("O_RDONLY|O_TRUNC", os.O_RDONLY | os.O_TRUNC),
                     ("O_WRONLY|O_TRUNC", os.O_WRONLY | os.O_TRUNC), ("O_RDWR|O_TRUNC", os.O_RDWR | os.O_TRUNC)):
        r["dir " + name] = outcome(os.open, j(d, "dir"), fl)
    r["fifo O_WRONLY|O_NONBLOCK"] = outcome(os.open, j(d, "fifo"), os.O_WRONLY | os.O_NONBLOCK)
    for name, fl in (("O_RDONLY", os.O_RDONLY), ("O_WRONLY", os.O_WRONLY), ("O_RDWR", os.O_RDWR)):
        r["socket " + name] = outcome(os.open, j(d, "sock"), fl)
    want = {k: "ELOOP" for k in r if k.startswith("nofollow")}
    want.update({k: "EISDIR" for k in r if k.startswith("dir")})
    want["fifo O_WRONLY|O_NONBLOCK"] = "ENXIO"
    want.update({k: "ENXIO" for k in r if k.startswith("socket")})
    eq_map(r, want, "outcomes")
    eq((rfile(f), os.path.lexists(j(d, "dir")), sorted(os.listdir(j(d, "dir")))), (b"Xbc", True, []), "state")
    for name, fl in (("wronly", os.O_WRONLY), ("rdwr", os.O_RDWR), ("rdonly", os.O_RDONLY)):
        p = j(d, "zero-" + name)
        os.close(os.open(p, os.O_CREAT | fl, 0))
        eq((kind_of(p), mode_of(p)), ("regular", 0), f"(type, mode) after open(O_CREAT|O_{name.upper()}, 0)")


@check
def check_pjd_open_2gib_offset(d):
    """pwrite of one byte at offset 2 GiB + 1 gives a (sparse) file of 2 GiB + 2 bytes, and
    pread at that offset returns the byte."""
    f = j(d, "f")
    off = 2 * 1024 ** 3 + 1
    fd = os.open(f, os.O_CREAT | os.O_WRONLY, 0o755)
    try:
        eq(os.pwrite(fd, b"a", off), 1, "pwrite result")
    finally:
        os.close(fd)
    eq(os.stat(f).st_size, off + 1, "size")
    fd = os.open(f, os.O_RDONLY)
    try:
        eq(os.pread(fd, 1, off), b"a", "pread at 2 GiB + 1")
    finally:
        os.close(fd)


# ---- rename ----------------------------------------------------------------

@check
def check_pjd_rename_every_type(d):
    """rename keeps type, inode, mode and nlink of regular files, fifos, sockets and device
    nodes (also with a second hard link, which stays), of a directory, and of a symlink (the
    link is renamed, its target untouched); it advances the renamed node's ctime for every
    type (Linux)."""
    kinds = pjd_types(dirs=False, symlinks=False)
    for kind in kinds:
        p = j(d, kind)
        mknode(p, kind)
        eq((kind_of(p), mode_of(p, follow=False), os.lstat(p).st_nlink), (kind, 0o644, 1), f"new {kind}")
        ino = os.lstat(p).st_ino
        os.rename(p, p + ".1")
        eq(os.path.lexists(p), False, f"{kind}: old name exists")
        st = os.lstat(p + ".1")
        eq((kind_of(p + ".1"), st.st_ino, oct(stat.S_IMODE(st.st_mode)), st.st_nlink), (kind, ino, oct(0o644), 1),
           f"{kind} after rename")
        os.link(p + ".1", p)
        os.rename(p + ".1", p + ".2")
        eq([(os.lstat(x).st_ino, os.lstat(x).st_nlink) for x in (p, p + ".2")], [(ino, 2)] * 2,
           f"{kind}: (ino, nlink) of both names after renaming one")
        eq(os.path.lexists(p + ".1"), False, f"{kind}: renamed name still exists")
    dd = j(d, "dir")
    os.mkdir(dd)
    ino = os.lstat(dd).st_ino
    os.rename(dd, dd + ".1")
    eq((os.path.lexists(dd), kind_of(dd + ".1"), os.lstat(dd + ".1").st_ino, mode_of(dd + ".1")),
       (False, "dir", ino, 0o755), "directory after rename")
    target = j(d, "target")
    wfile(target)
    os.symlink("target", j(d, "ln"))
    sino, tino = os.lstat(j(d, "ln")).st_ino, os.stat(target).st_ino
    os.rename(j(d, "ln"), j(d, "ln.1"))
    eq((os.lstat(j(d, "ln.1")).st_ino, os.stat(j(d, "ln.1")).st_ino, os.readlink(j(d, "ln.1"))),
       (sino, tino, "target"), "symlink after rename (link ino, target ino, readlink)")
    names = {k: j(d, k + ".2") for k in kinds}
    names.update({"dir": dd + ".1", "symlink": j(d, "ln.1")})
    before = {k: lctime(p) for k, p in names.items()}
    time.sleep(TICK_S)
    for k, p in names.items():
        os.rename(p, p + "x")
    eq_map({k: lctime(p + "x") > before[k] for k, p in names.items()}, dict.fromkeys(names, True),
           "ctime advanced by rename")


@check
def check_pjd_rename_over_multilinked(d):
    """rename over a target that has a second hard link: that other link survives with
    nlink 1 and its ctime advances (regular, fifo, socket, devices as root)."""
    kinds = pjd_types(dirs=False, symlinks=False)
    for kind in kinds:
        mknode(j(d, kind + ".src"), kind)
        mknode(j(d, kind + ".dst"), kind)
        os.link(j(d, kind + ".dst"), j(d, kind + ".lnk"))
    before = {k: lctime(j(d, k + ".lnk")) for k in kinds}
    time.sleep(TICK_S)
    for kind in kinds:
        os.rename(j(d, kind + ".src"), j(d, kind + ".dst"))
    got = {k: (kind_of(j(d, k + ".lnk")), os.lstat(j(d, k + ".lnk")).st_nlink, lctime(j(d, k + ".lnk")) > before[k])
           for k in kinds}
    eq_map(got, {k: (k, 1, True) for k in kinds}, "(type, nlink, ctime advanced) of the other link")


@check
def check_pjd_rename_type_errors(d):
    """rename(non-dir, dir) -> EISDIR and rename(dir, non-dir) -> ENOTDIR for every non-dir
    type (incl. symlink); rename(dir, dir holding an entry of any type) and rmdir of such a
    dir -> ENOTEMPTY (or EEXIST); rename of 'x/.' or 'x/..' -> EBUSY (or EINVAL); nothing
    changes."""
    dd = j(d, "dir")
    os.mkdir(dd)
    r, want = {}, {}
    for kind in pjd_types(dirs=False):
        p = j(d, kind)
        mknode(p, kind)
        r[f"{kind} -> dir"] = outcome(os.rename, p, dd)
        r[f"dir -> {kind}"] = outcome(os.rename, dd, p)
        want[f"{kind} -> dir"], want[f"dir -> {kind}"] = "EISDIR", "ENOTDIR"
        r[f"{kind} types"] = (kind_of(p), kind_of(dd))
        want[f"{kind} types"] = (kind, "dir")
    full = j(d, "full")
    os.mkdir(full)
    for kind in pjd_types():
        mknode(j(full, "e"), kind)
        r[f"rename dir over dir holding {kind}"] = outcome(os.rename, dd, full)
        r[f"rmdir dir holding {kind}"] = outcome(os.rmdir, full)
        want[f"rename dir over dir holding {kind}"] = ("ENOTEMPTY", "EEXIST")
        want[f"rmdir dir holding {kind}"] = ("ENOTEMPTY", "EEXIST")
        rmnode(j(full, "e"))
    os.mkdir(j(dd, "sub"))
    for last in (".", ".."):
        r[f"rename dir/sub/{last}"] = outcome(os.rename, j(dd, "sub", last), j(d, "moved"))
        want[f"rename dir/sub/{last}"] = ("EBUSY", "EINVAL")
    eq_map(r, want, "outcomes")
    eq(sorted(os.listdir(d)), sorted(["dir", "full"] + pjd_types(dirs=False)), "listing")
    eq(os.listdir(dd), ["sub"], "listing of dir")


@check
def check_pjd_rename_dir_nlink(d):
    """Moving a directory to another parent: the old parent's nlink 3 -> 2, the new one's
    2 -> 3, and the moved dir's '..' is the new parent; moving it over an empty directory in
    a third parent leaves that parent's nlink at 3 and the second parent's at 2."""
    a, b, c = j(d, "a"), j(d, "b"), j(d, "c")
    for x in (a, b, c):
        os.mkdir(x)
    os.mkdir(j(a, "sub"))
    os.mkdir(j(c, "empty"))
    eq([os.stat(x).st_nlink for x in (a, b, c)], [3, 2, 3], "nlink of a, b, c before")
    eq(os.stat(j(a, "sub", "..")).st_ino, os.stat(a).st_ino, "'..' before")
    os.rename(j(a, "sub"), j(b, "moved"))
    eq([os.stat(x).st_nlink for x in (a, b, c)], [2, 3, 3], "nlink of a, b, c after the move")
    eq(os.stat(j(b, "moved", "..")).st_ino, os.stat(b).st_ino, "'..' after the move")
    os.rename(j(b, "moved"), j(c, "empty"))
    eq([os.stat(x).st_nlink for x in (a, b, c)], [2, 2, 3], "nlink of a, b, c after replacing c/empty")
    eq((os.listdir(b), os.listdir(c), os.stat(j(c, "empty", "..")).st_ino), ([], ["empty"], os.stat(c).st_ino),
       "(b, c, '..') after replacing c/empty")


@check
def check_pjd_rename_dir_needs_write(d):
    """(root; as uid 65534) in 0777 directories uid 65534 may rename root's 0700 directory
    within its parent but not move it to another parent (EACCES: its '..' entry would
    change); root's regular file moves between the two directories."""
    require_reachable_by_nobody(d)
    a, b = j(d, "a"), j(d, "b")
    for x in (a, b):
        os.mkdir(x)
        os.chmod(x, 0o777)
    os.mkdir(j(a, "n0"))
    os.chmod(j(a, "n0"), 0o700)
    wfile(j(a, "f"))
    got = as_nobody(lambda: {"within": outcome(os.rename, j(a, "n0"), j(a, "n1")),
                             "across": outcome(os.rename, j(a, "n1"), j(b, "n1")),
                             "file across": outcome(os.rename, j(a, "f"), j(b, "f"))})
    eq_map(got, {"within": "ok", "across": "EACCES", "file across": "ok"}, "renames by uid 65534")
    eq((sorted(os.listdir(a)), os.listdir(b)), (["n1"], ["f"]), "listings")


@check
def check_pjd_sticky_dir_rules(d):
    """(root; as uid 65534) in sticky (01777) directories owned by 65534, root or 65533,
    holding entries of every type owned by 65534, root or 65533: unlink, rename away, rename
    over, rmdir and renaming a dir within work when 65534 owns the entry or the sticky dir,
    and fail with EPERM when it owns neither; moving another user's directory out of a sticky
    dir 65534 owns fails with EACCES (its '..' would change)."""
    require_reachable_by_nobody(d)
    dest = j(d, "dest")
    mknode(dest, "dir", owner=(NOBODY_UID, NOBODY_GID))
    owners = {"n": (NOBODY_UID, NOBODY_GID), "r": (0, 0), "u": (PJD_U2, PJD_U2)}
    kinds = pjd_types(dirs=False)
    plan = {}   # label -> (call, expected)
    for so, sown in owners.items():
        s = j(d, f"sticky-{so}")
        os.mkdir(s)
        os.chmod(s, 0o1777)
        os.chown(s, *sown)
        for eo, eown in owners.items():
            may = so == "n" or eo == "n"
            verdict = "ok" if may else "EPERM"
            for kind in kinds:
                base = j(s, f"{kind}-{eo}")
                for op in ("unlink", "away", "over"):
                    mknode(f"{base}-{op}", kind, owner=eown)
                src = j(dest, f"src-{so}-{eo}-{kind}")
                mknode(src, "regular", owner=owners["n"])
                plan[f"unlink {kind} of {eo} in {so}"] = ((lambda p: lambda: os.unlink(p))(f"{base}-unlink"), verdict)
                plan[f"rename {kind} of {eo} away from {so}"] = (
                    (lambda p, q: lambda: os.rename(p, q))(f"{base}-away", j(dest, f"away-{so}-{eo}-{kind}")), verdict)
                plan[f"rename over {kind} of {eo} in {so}"] = (
                    (lambda p, q: lambda: os.rename(p, q))(src, f"{base}-over"), verdict)
            base = j(s, f"dir-{eo}")
            for op in ("rmdir", "within", "out", "over"):
                mknode(f"{base}-{op}", "dir", owner=eown)
            srcdir = j(dest, f"srcdir-{so}-{eo}")
            mknode(srcdir, "dir", owner=owners["n"])
            plan[f"rmdir dir of {eo} in {so}"] = ((lambda p: lambda: os.rmdir(p))(f"{base}-rmdir"), verdict)
            plan[f"rename dir of {eo} within {so}"] = (
                (lambda p: lambda: os.rename(p, p + "-renamed"))(f"{base}-within"), verdict)
            out = verdict if not may or eo == "n" else "EACCES"
            plan[f"move dir of {eo} out of {so}"] = (
                (lambda p, q: lambda: os.rename(p, q))(f"{base}-out", j(dest, f"outdir-{so}-{eo}")), out)
            plan[f"rename dir over dir of {eo} in {so}"] = (
                (lambda p, q: lambda: os.rename(p, q))(srcdir, f"{base}-over"), verdict)
    got = as_nobody(lambda: {k: outcome(call) for k, (call, _) in plan.items()})
    eq_map(got, {k: v for k, (_, v) in plan.items()}, "outcomes")
    # the refused ones left everything in place
    for so in owners:
        s = j(d, f"sticky-{so}")
        for eo in owners:
            if so != "n" and eo != "n":
                left = sorted(n for n in os.listdir(s) if n.endswith(f"-{eo}-unlink") or n.endswith(f"-{eo}-away"))
                eq(len(left), 2 * len(kinds), f"entries of {eo} kept in sticky dir of {so}")


def other_filesystem_dir(path) -> str | None:
    """A writable directory on another filesystem than `path` (for EXDEV), or None."""
    dev = os.stat(path).st_dev
    for cand in ("/dev/shm", tempfile.gettempdir(), "/tmp", "/var/tmp", "/run"):
        try:
            st = os.stat(cand)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_dev != dev and os.access(cand, os.W_OK | os.X_OK):
            return cand
    return None


@check
def check_pjd_exdev(d):
    """link and rename between this filesystem and another one fail with EXDEV in both
    directions (regular file, directory, symlink) and create nothing on either side."""
    other = other_filesystem_dir(d)
    if other is None:
        raise Skip("no writable directory on another filesystem (tried /dev/shm, $TMPDIR, /tmp, /var/tmp, /run)")
    far = tempfile.mkdtemp(prefix="posix-suite-exdev-", dir=other)
    try:
        wfile(j(d, "f"))
        os.mkdir(j(d, "dir"))
        os.symlink("f", j(d, "ln"))
        wfile(j(far, "g"))
        r = {}
        for name in ("f", "dir", "ln"):
            r["rename " + name + " out"] = outcome(os.rename, j(d, name), j(far, name))
        r["link f out"] = outcome(os.link, j(d, "f"), j(far, "f"))
        r["rename in"] = outcome(os.rename, j(far, "g"), j(d, "g"))
        r["link in"] = outcome(os.link, j(far, "g"), j(d, "g"))
        eq_map(r, dict.fromkeys(r, "EXDEV"), "outcomes")
        eq((sorted(os.listdir(d)), os.listdir(far)), (["dir", "f", "ln"], ["g"]), "listings of both sides")
    finally:
        shutil.rmtree(far, ignore_errors=True)


# ---- unlink, utimensat -----------------------------------------------------

@check
def check_pjd_unlink_every_type(d):
    """unlink removes regular files, symlinks, fifos, sockets and device nodes (lstat then
    gives ENOENT); it advances the directory's mtime and ctime for every type; removing a
    second hard link advances the node's ctime."""
    kinds = pjd_types(dirs=False)
    for kind in kinds:
        os.mkdir(j(d, kind))
        mknode(j(d, kind, "n0"), kind)
        if kind != "symlink":
            mknode(j(d, kind, "n1"), kind)
            os.link(j(d, kind, "n1"), j(d, kind, "n2"))
    before = {k: (os.stat(j(d, k)).st_mtime_ns, lctime(j(d, k))) for k in kinds}
    nodes = {k: lctime(j(d, k, "n1")) for k in kinds if k != "symlink"}
    time.sleep(TICK_S)
    for kind in kinds:
        os.unlink(j(d, kind, "n0"))
        if kind != "symlink":
            os.unlink(j(d, kind, "n2"))
    eq_map({k: outcome(os.lstat, j(d, k, "n0")) for k in kinds}, dict.fromkeys(kinds, "ENOENT"), "lstat after unlink")
    eq_map({k: (os.stat(j(d, k)).st_mtime_ns > before[k][0], lctime(j(d, k)) > before[k][1]) for k in kinds},
           dict.fromkeys(kinds, (True, True)), "(dir mtime, dir ctime) advanced by unlink")
    eq_map({k: (os.lstat(j(d, k, "n1")).st_nlink, lctime(j(d, k, "n1")) > t) for k, t in nodes.items()},
           dict.fromkeys(nodes, (1, True)), "(nlink, ctime advanced) of the remaining link")


@check
def check_pjd_utimensat_every_type(d):
    """utimensat(dirfd, name) sets exactly the given times on regular files, directories,
    fifos, sockets and device nodes: 1900000000 / 1950000000 s, atime later than mtime,
    2^31 / 2^32 s, and 0.1 s / 0.2 s fractions."""
    kinds = pjd_types(symlinks=False)
    cases = [(1_900_000_000 * 10**9, 1_950_000_000 * 10**9), (200_000_000 * 10**9, 100_000_000 * 10**9),
             (2**31 * 10**9, 2**32 * 10**9), (100_000_000 * 10**9 + 100_000_000, 200_000_000 * 10**9 + 200_000_000)]
    for kind in kinds:
        mknode(j(d, kind), kind)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for a, m in cases:
            for kind in kinds:
                os.utime(kind, ns=(a, m), dir_fd=dfd)
            got = {k: (os.lstat(j(d, k)).st_atime_ns, os.lstat(j(d, k)).st_mtime_ns) for k in kinds}
            eq_map(got, dict.fromkeys(kinds, (a, m)), f"(atime_ns, mtime_ns) after setting ({a}, {m})")
    finally:
        os.close(dfd)


@check
def check_pjd_utimensat_symlink(d):
    """utimensat with AT_SYMLINK_NOFOLLOW sets the symlink's own times and leaves the
    target's alone; without it the target's times change and the link's mtime does not."""
    f, ln = j(d, "f"), j(d, "ln")
    wfile(f)
    os.symlink("f", ln)
    s = 10**9
    utimensat(f, 1_900_000_000 * s, 1_950_000_000 * s)
    utimensat(ln, 1_960_000_000 * s, 1_970_000_000 * s, follow=False)
    eq((os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns), (1_900_000_000 * s, 1_950_000_000 * s),
       "target times after NOFOLLOW")
    eq((os.lstat(ln).st_atime_ns, os.lstat(ln).st_mtime_ns), (1_960_000_000 * s, 1_970_000_000 * s),
       "link times after NOFOLLOW")
    utimensat(ln, 1_980_000_000 * s, 1_990_000_000 * s)
    eq((os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns), (1_980_000_000 * s, 1_990_000_000 * s),
       "target times after following")
    eq(os.lstat(ln).st_mtime_ns, 1_970_000_000 * s, "link mtime after following")
    expect(os.lstat(ln).st_atime_ns != 1_980_000_000 * s, "link atime took the target's new atime")


@check
def check_pjd_utimensat_permissions(d):
    """(root; as uid 65534) utimensat rules: NOW/NOW needs ownership or write permission
    (root's 0644 file -> EACCES, root's 0666 file -> ok); explicit times and NOW/OMIT mixes
    need ownership (EPERM on root's 0644 and 0666 files); OMIT/OMIT always succeeds; the
    owner may do all of it even on its 0444 file; root may set anything. Refused calls
    leave the times alone."""
    require_reachable_by_nobody(d)
    files = {"root 0644": (j(d, "r644"), 0o644, (0, 0)), "root 0666": (j(d, "r666"), 0o666, (0, 0)),
             "own 0444": (j(d, "own"), 0o444, (NOBODY_UID, NOBODY_GID))}
    for path, mode, owner in files.values():
        mknode(path, "regular", mode=mode, owner=owner)
        utimensat(path, 10**18, 10**18)
    combos = [("now", "now"), ("now", "omit"), ("omit", "now"), ("omit", "omit"), (5 * 10**17, "omit"),
              ("omit", 6 * 10**17), (5 * 10**17, 6 * 10**17)]
    got = as_nobody(lambda: {f"{name} {a}/{m}": outcome(utimensat, p, a, m)
                             for name, (p, _, _) in files.items() for a, m in combos})
    want = {}
    for name in files:
        for a, m in combos:
            if name == "own 0444" or (a, m) == ("omit", "omit"):
                res = "ok"
            elif (a, m) == ("now", "now"):
                res = "ok" if name == "root 0666" else "EACCES"
            else:
                res = "EPERM"
            want[f"{name} {a}/{m}"] = res
    eq_map(got, want, "utimensat by uid 65534")
    eq((os.stat(files["root 0644"][0]).st_atime_ns, os.stat(files["root 0644"][0]).st_mtime_ns),
       (10**18, 10**18), "times of root's 0644 file after the refused calls")
    p = files["own 0444"][0]
    utimensat(p, 7 * 10**17, 8 * 10**17)
    eq((os.stat(p).st_atime_ns, os.stat(p).st_mtime_ns), (7 * 10**17, 8 * 10**17), "times set by root")


# ==========================================================================
# runner
# ==========================================================================

def _match(pattern: str, name: str) -> bool:
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return pattern in name


def select_checks(pattern=None):
    pats = None if pattern is None else ([pattern] if isinstance(pattern, str) else list(pattern))
    return [(n, f) for n, f in CHECKS if not pats or any(_match(p, n) for p in pats)]


def _where(exc: BaseException) -> str:
    for fr in reversed(traceback.extract_tb(exc.__traceback__)):
        if fr.name.startswith("check_"):
            return f" [line {fr.lineno}]"
    return ""


def _on_alarm(signum, frame):
    raise CheckTimeout()


def _run_one(fn, scratch: str, timeout: float | None) -> tuple[str, str]:
    use_timer = bool(timeout) and threading.current_thread() is threading.main_thread()
    if use_timer:
        old = signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        fn(scratch)
        return PASS, ""
    except Skip as e:
        return SKIP, str(e)
    except FlagEinval as e:
        return EINVAL, str(e)
    except CheckFailed as e:
        return FAIL, f"{e}{_where(e)}"
    except CheckTimeout:
        return FAIL, f"timed out after {timeout:g}s"
    except OSError as e:
        return FAIL, f"unexpected {errname(e.errno)}: {e}{_where(e)}"
    except Exception as e:  # noqa: BLE001
        return FAIL, f"unexpected {type(e).__name__}: {e}{_where(e)}"
    finally:
        if use_timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _rmtree(path: str):
    """Remove a scratch tree even if checks left restrictive modes behind."""
    if not os.path.lexists(path):
        return
    for root, dirs, _files in os.walk(path):
        for n in dirs:
            p = j(root, n)
            if not os.path.islink(p):
                try:
                    os.chmod(p, 0o755)
                except OSError:
                    pass
    shutil.rmtree(path)


def run_checks(directory: str, pattern=None, timeout: float | None = DEFAULT_TIMEOUT_S,
               on_result: Callable[[str, str, str, float], None] | None = None) -> dict:
    """Run the selected checks in `directory`.

    Returns {name: (status, detail, seconds)} in check order."""
    base = os.path.abspath(directory)
    if not os.path.isdir(base):
        raise NotADirectoryError(base)
    root = j(base, f".posix-suite-{os.getpid()}-{random.randrange(16**6):06x}")
    os.mkdir(root)
    os.chmod(root, 0o755)
    old_umask = os.umask(0o022)
    results: dict = {}
    try:
        for name, fn in select_checks(pattern):
            scratch = j(root, name)
            os.mkdir(scratch)
            os.chmod(scratch, 0o755)
            t0 = time.monotonic()
            status, detail = _run_one(fn, scratch, timeout)
            os.umask(0o022)
            try:
                _rmtree(scratch)
            except OSError as e:
                if status != FAIL:
                    status = FAIL
                    detail = f"cleanup of scratch dir failed: {errname(e.errno)} {e}"
            dt = time.monotonic() - t0
            results[name] = (status, detail, dt)
            if on_result:
                on_result(name, status, detail, dt)
    finally:
        os.umask(old_umask)
        try:
            _rmtree(root)
        except OSError as e:
            print(f"warning: could not remove {root}: {e}", file=sys.stderr)
    return results


def run_suite(dir: str, pattern=None, timeout: float | None = DEFAULT_TIMEOUT_S) -> dict:  # noqa: A002
    """Importable API: {check_name: (status, detail)}; status is PASS/FAIL/SKIP/EINVAL."""
    return {n: (s, dt) for n, (s, dt, _) in run_checks(dir, pattern, timeout).items()}


def _summary(results: dict, elapsed: float) -> str:
    counts = {}
    for s, *_ in results.values():
        counts[s] = counts.get(s, 0) + 1
    parts = [f"{counts.get(s, 0)} {s.lower() if s != EINVAL else 'EINVAL'}" for s in (PASS, FAIL, SKIP, EINVAL)]
    return f"{len(results)} checks: " + ", ".join(parts) + f" in {elapsed:.1f}s"


def _line(name, status, detail, dt=None) -> str:
    return f"{status:<6} {name}" + (f": {detail}" if detail else "")


def _compare(dir_a, dir_b, pattern, timeout, as_json) -> int:
    def progress(label):
        def cb(name, status, detail, dt):
            print(f"  [{label}] {status:<6} {name}", file=sys.stderr, flush=True)
        return cb

    print(f"running on A = {dir_a}", file=sys.stderr)
    ra = run_checks(dir_a, pattern, timeout, None if as_json else progress("A"))
    print(f"running on B = {dir_b}", file=sys.stderr)
    rb = run_checks(dir_b, pattern, timeout, None if as_json else progress("B"))
    diffs = [(n, ra[n], rb[n]) for n in ra if ra[n][0] != rb[n][0]]
    if as_json:
        print(json.dumps({"a": dir_a, "b": dir_b, "checks": len(ra),
                          "differences": {n: {"a": [a[0], a[1]], "b": [b[0], b[1]]} for n, a, b in diffs}},
                         indent=2))
        return 1 if diffs else 0
    print(f"A = {dir_a}\nB = {dir_b}")
    if not diffs:
        print(f"no differences in outcome ({len(ra)} checks)")
        return 0
    w = max(len("check"), *(len(n) for n, _, _ in diffs))
    print(f"{'check':<{w}}  {'A':<6}  {'B':<6}  detail")
    print(f"{'-' * w}  ------  ------  ------")
    for n, a, b in diffs:
        detail = b[1] if b[0] != PASS else a[1]
        side = "B" if b[0] != PASS else "A"
        detail = f"{side}: {detail}" if detail else ""
        if len(detail) > 160:
            detail = detail[:157] + "..."
        print(f"{n:<{w}}  {a[0]:<6}  {b[0]:<6}  {detail}")
    print(f"{len(diffs)} of {len(ra)} checks differ")
    return 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="POSIX behaviour conformance suite for a directory.")
    ap.add_argument("dir", nargs="?", help="directory to test (a scratch subdir is created and removed)")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    ap.add_argument("-k", dest="pattern", action="append", metavar="PATTERN",
                    help="only checks whose name contains PATTERN (or matches it as a glob); repeatable")
    ap.add_argument("--compare", nargs=2, metavar=("DIR_A", "DIR_B"),
                    help="run on both directories and print the checks whose outcome differs")
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"per-check time limit in seconds (default {DEFAULT_TIMEOUT_S:g}; 0 = none)")
    ap.add_argument("--list", action="store_true", help="list check names with their descriptions")
    args = ap.parse_args(argv)

    if args.list:
        for n, fn in select_checks(args.pattern):
            print(f"{n}\n    {' '.join(fn.__doc__.split())}")
        return 0
    for d in (args.compare or ([args.dir] if args.dir else [])):
        if not os.path.isdir(d):
            ap.error(f"not a directory: {d}")
    if args.compare:
        if args.dir:
            ap.error("give either DIR or --compare DIR_A DIR_B")
        return _compare(args.compare[0], args.compare[1], args.pattern, args.timeout or None, args.json)
    if not args.dir:
        ap.error("DIR is required")
    if not select_checks(args.pattern):
        print("no checks match", file=sys.stderr)
        return 2

    t0 = time.monotonic()
    out_ok = [True]

    def cb(n, s, det, dt):
        if out_ok[0]:
            try:
                print(_line(n, s, det), flush=True)
            except BrokenPipeError:  # e.g. piped into head; keep running, clean up
                out_ok[0] = False
                sys.stdout = open(os.devnull, "w")

    if args.json:
        cb = None
    results = run_checks(args.dir, args.pattern, args.timeout or None, cb)
    elapsed = time.monotonic() - t0
    if args.json:
        print(json.dumps({"dir": os.path.abspath(args.dir), "elapsed_s": round(elapsed, 3),
                          "results": {n: {"status": s, "detail": det, "seconds": round(dt, 4)}
                                      for n, (s, det, dt) in results.items()}}, indent=2))
    else:
        print(_summary(results, elapsed))
    return 1 if any(s == FAIL for s, *_ in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
