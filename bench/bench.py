#!/usr/bin/env python3
"""UbiquityFS benchmark: our FUSE mount vs. bindfs (and rclone mount) over a
plain directory, all in the same run.

This is a benchmark script, not a test: it measures, prints a table and
(optionally) writes JSON.  It never fails on a missed target; it exits
non-zero only when it could not run (bad arguments, mount failure, ...).

Targets (columns):
  ubiquityfs  `ubiquityfs mount MP --store STORE` with XDG_DATA_HOME set to
              a scratch dir under --workdir.
  bindfs      `bindfs --no-allow-other SRC MP` over a plain directory under
              --workdir (plain single-threaded FUSE loopback).  The goals are
              ratios against this column.
  plain       the plain directory itself (no FUSE): what the disk and the
              kernel allow, the ceiling for every mount.
  rclone      `rclone mount SRC MP --vfs-cache-mode full` over a plain
              directory under --workdir (no rclone config is read), if rclone
              is installed and --no-rclone is not given.  For comparison only.
  target      with --target DIR: any existing directory (e.g. a plain dir, or a
              mount you set up by hand).  It replaces the ubiquityfs column.

Workloads (each runs on a fresh subdirectory of each target, same parameters):
  small   N x 4 KiB files: create+write, readdir (again, cold: entries/s),
          stat (cold), open+read (cold), rename, unlink; then N directories:
          mkdir, rmdir -> ops/s
  seq     sequential write (incl. fsync+close), cold sequential read, 1 MiB
          blocks                                            -> MiB/s
  rand    4 KiB random reads / writes on one file (fio if present, else
          Python pread/pwrite); writes include a final fsync -> IOPS, MiB/s
  fsync   N new 4 KiB files each fsynced; N 512-byte appends each
          fdatasynced; N atomic saves (temp, fsync, rename, dir fsync)
                                                            -> ops/s
  git     `git clone --no-hardlinks SRC DEST` of a generated local repo
                                                            -> seconds
  rss     daemon VmRSS after creating N small files in D dirs: 1 s after
          the last one, and once the daemon is quiet (everything pushed;
          the goal); VmHWM                                  -> MiB

Run as root (drop_caches needs it).  See bench/README.md.
"""

import argparse
import datetime
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

MiB = 1024 * 1024
KiB = 1024
MARKER = ".ubq-bench-workdir"

# --------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------

VERBOSE = True


def log(msg):
    if VERBOSE:
        ts = time.strftime("%H:%M:%S")
        print(f"[{ts}] {msg}", file=sys.stderr, flush=True)


def warn(msg):
    print(f"WARNING: {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


def run(cmd, check=True, timeout=None, env=None, capture=True, cwd=None):
    """Run a command (list), return CompletedProcess. Output is captured."""
    try:
        cp = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout,
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE if capture else None,
                            stderr=subprocess.PIPE if capture else None,
                            text=True)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"timed out after {timeout}s: {shlex.join(cmd)}") from e
    if check and cp.returncode != 0:
        raise BenchError(f"command failed ({cp.returncode}): {shlex.join(cmd)}\n"
                         f"stdout: {(cp.stdout or '').strip()}\n"
                         f"stderr: {(cp.stderr or '').strip()}")
    return cp


_DROP_OK = None


def drop_caches():
    """sync; echo 3 > /proc/sys/vm/drop_caches (best effort, warns once)."""
    global _DROP_OK
    os.sync()
    if _DROP_OK is False:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        _DROP_OK = True
        return True
    except OSError as e:
        if _DROP_OK is None:
            warn(f"cannot drop caches ({e}); 'cold' figures will be warm. Run as root.")
        _DROP_OK = False
        return False


def mountpoints():
    """Set of mount points from /proc/self/mountinfo (unescaped)."""
    res = set()
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 4:
                    mp = parts[4]
                    mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), mp)
                    res.add(mp)
    except OSError:
        pass
    return res


def is_mounted(path):
    return os.path.realpath(path) in mountpoints()


def pids_with_arg(path):
    """PIDs whose /proc/PID/cmdline has an argument equal to (or resolving
    to) path."""
    path = os.path.realpath(path)
    out = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        for a in args:
            if not a:
                continue
            s = a.decode(errors="replace")
            if s == path or (s.startswith("/") and os.path.realpath(s) == path):
                out.append(int(d))
                break
    return out


def proc_status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombie?
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        return st.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cpu_seconds(pid):
    """User + system CPU time of `pid` so far, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_quiet(targets, timeout=120.0, window=0.5, busy=0.03):
    """Wait until no target has uploads queued or under way (`pending`) and
    no target's daemon uses more than `busy` of a CPU over `window` seconds:
    background work one target still does after a workload (ubiquityfs
    pushing what it made and what the cleanup removed; rclone writing back
    its cache, which it starts 5 s after a file's last close, when its CPU
    has long looked quiet) must not run during the next workload, on that
    target or on another."""
    targets = list(targets)
    pids = [t.pid for t in targets if t.pid is not None]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if any(t.pending() for t in targets):
            time.sleep(window)
            continue
        before = [cpu_seconds(p) for p in pids]
        time.sleep(window)
        after = [cpu_seconds(p) for p in pids]
        if all(a is None or b is None or (a - b) / window <= busy for b, a in zip(before, after)):
            return time.monotonic() - t0
    warn(f"daemons still busy after {timeout:.0f}s; measuring anyway")
    return time.monotonic() - t0


def wait_until(pred, timeout, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def run_to_file(cmd, logpath, timeout, env=None):
    """Run a command that may leave a daemon behind. Its output goes to a file,
    not a pipe: a daemon that inherits a pipe keeps it open, and reading the
    pipe to EOF would wait for the daemon to exit. Returns (rc, output)."""
    with open(logpath, "w+") as f:
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.STDOUT)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            p.kill()
            p.wait()
            f.seek(0)
            raise BenchError(f"timed out after {timeout}s: {shlex.join(cmd)}\n"
                             f"output: {f.read().strip()}") from e
        f.seek(0)
        return rc, f.read()


def fusermount_u(mp, lazy=False):
    cmd = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [mp]
    if shutil.which("fusermount3") is None:
        cmd = ["umount"] + (["-l"] if lazy else []) + [mp]
    return run(cmd, check=False, timeout=60)


def rmtree(path):
    if os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------

class Pool:
    """Incompressible, non-repeating (up to its size) data, so that a store
    that compresses or deduplicates content gets no unfair advantage."""

    def __init__(self, size):
        size = max(size, 8 * MiB)
        log(f"generating {size // MiB} MiB of random data")
        self.buf = os.urandom(size)
        self.mv = memoryview(self.buf)
        self.size = size

    def chunk(self, i, n):
        """n bytes; chunk index i -> distinct offset (wraps around)."""
        off = (i * n) % (self.size - n + 1)
        return self.mv[off:off + n]


# --------------------------------------------------------------------------
# targets
# --------------------------------------------------------------------------

class Target:
    name = "?"
    label = "?"
    root = None      # directory where workloads create their subdirs
    pid = None       # daemon pid (None: no daemon)

    def setup(self):
        pass

    def teardown(self):
        pass

    def rss_kib(self):
        if self.pid is None:
            return None, None
        return proc_status_kib(self.pid, "VmRSS"), proc_status_kib(self.pid, "VmHWM")

    def pending(self):
        """Uploads queued or under way (None: this target cannot tell)."""
        return None

    def check_alive(self):
        if self.pid is not None and not pid_alive(self.pid):
            raise BenchError(f"{self.name}: daemon pid {self.pid} died")


class DirTarget(Target):
    name = "target"

    def __init__(self, directory, pid=None):
        self.dir = os.path.abspath(directory)
        self.label = f"dir:{self.dir}"
        self.pid = pid
        self.root = None

    def setup(self):
        if not os.path.isdir(self.dir):
            raise BenchError(f"--target {self.dir}: not a directory")
        self.root = os.path.join(self.dir, f"ubq-bench-{os.getpid()}")
        os.makedirs(self.root)

    def teardown(self):
        if self.root:
            log(f"{self.name}: removing {self.root}")
            rmtree(self.root)


class PlainTarget(DirTarget):
    """The plain directory itself, under --workdir: no FUSE at all."""
    name = "plain"

    def __init__(self, workdir):
        super().__init__(os.path.join(workdir, "plain"))
        self.label = "plain directory"

    def setup(self):
        os.makedirs(self.dir, exist_ok=True)
        super().setup()


class BindfsTarget(Target):
    name = "bindfs"

    def __init__(self, workdir, extra_args):
        self.base = os.path.join(workdir, "bindfs")
        self.src = os.path.join(self.base, "src")
        self.mp = os.path.join(self.base, "mnt")
        self.extra = extra_args
        self.label = "bindfs " + " ".join(["--no-allow-other"] + extra_args)
        self.mounted = False

    def setup(self):
        if shutil.which("bindfs") is None:
            raise BenchError("bindfs not found (apt-get install -y bindfs)")
        os.makedirs(self.src, exist_ok=True)
        os.makedirs(self.mp, exist_ok=True)
        cmd = ["bindfs", "--no-allow-other"] + self.extra + [self.src, self.mp]
        log(f"bindfs: {shlex.join(cmd)}")
        run(cmd, timeout=60)
        self.mounted = True
        if not wait_until(lambda: is_mounted(self.mp), 10):
            raise BenchError("bindfs: mount did not appear")
        pids = pids_with_arg(self.mp)
        self.pid = pids[0] if pids else None
        if self.pid is None:
            warn("bindfs: could not find daemon pid; RSS will be n/a")
        self.root = self.mp
        self.version = run(["bindfs", "--version"], check=False).stdout.strip()

    def teardown(self):
        if self.mounted or is_mounted(self.mp):
            log("bindfs: fusermount3 -u")
            cp = fusermount_u(self.mp)
            if is_mounted(self.mp):
                warn(f"bindfs: unmount failed ({(cp.stderr or '').strip()}); lazy unmount")
                fusermount_u(self.mp, lazy=True)
            self.mounted = False
        if self.pid:
            wait_until(lambda: not pid_alive(self.pid), 10)


RCLONE_INSTALL = "apt-get install -y rclone (or Packaging/install-deps.sh)"


class RcloneTarget(Target):
    """`rclone mount SRC MP --vfs-cache-mode full` over a local directory.
    SRC is a plain local path, so no remote has to be configured; --config
    /dev/null keeps rclone's config in memory (no user config is read) and
    --cache-dir keeps the VFS cache under the workdir.  rclone runs in the
    foreground as our child (its own session, so a Ctrl-C reaches only this
    script), which gives us its pid for RSS and for stopping it."""
    name = "rclone"

    def __init__(self, workdir, extra_args, mount_timeout=60):
        self.base = os.path.join(workdir, "rclone")
        self.src = os.path.join(self.base, "src")
        self.mp = os.path.join(self.base, "mnt")
        self.cache = os.path.join(self.base, "cache")
        self.args = ["--vfs-cache-mode", "full", "--config", os.devnull,
                     "--cache-dir", self.cache] + extra_args
        self.label = "rclone mount SRC MP " + shlex.join(self.args)
        self.mount_timeout = mount_timeout
        self.proc = None
        self.version = None
        self.rc_port = None

    def setup(self):
        if shutil.which("rclone") is None:
            raise BenchError(f"rclone not found ({RCLONE_INSTALL}), or pass --no-rclone")
        for p in (self.src, self.mp, self.cache):
            os.makedirs(p, exist_ok=True)
        cp = run(["rclone", "version"], check=False, timeout=30)
        self.version = ((cp.stdout or "").splitlines() or ["?"])[0].strip()
        self.label = f"{self.version}: {self.label}"
        # Its remote control on loopback, to ask how many uploads are pending (`pending`).
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.rc_port = sock.getsockname()[1]
        rc = ["--rc", "--rc-addr", f"127.0.0.1:{self.rc_port}", "--rc-no-auth"]
        cmd = ["rclone", "mount", self.src, self.mp] + self.args + rc
        self.label += " --rc (on loopback: asked for pending uploads)"
        log(f"rclone: {shlex.join(cmd)}")
        logpath = os.path.join(self.base, "rclone.log")
        with open(logpath, "w") as logf:  # rclone keeps its own copy of the fd
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf,
                                         stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.pid = self.proc.pid
        wait_until(lambda: is_mounted(self.mp) or self.proc.poll() is not None,
                   self.mount_timeout)
        if not is_mounted(self.mp):
            with open(logpath) as f:
                out = f.read().strip()
            first = (out.splitlines() or ["no output"])[0]
            if self.proc.poll() is not None:
                raise BenchError(f"`rclone mount` exited ({self.proc.returncode}): "
                                 f"{first}\n{out}")
            raise BenchError(f"`rclone mount`: no mount after {self.mount_timeout}s: "
                             f"{first}\n{out}")
        log(f"rclone: pid {self.pid}")
        self.root = self.mp

    def pending(self):
        if self.rc_port is None:
            return None
        req = urllib.request.Request(f"http://127.0.0.1:{self.rc_port}/vfs/stats", data=b"{}",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                cache = json.load(r)["diskCache"]
            return cache["uploadsInProgress"] + cache["uploadsQueued"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def teardown(self):
        if self.proc is None:
            return
        if is_mounted(self.mp):
            log("rclone: fusermount3 -u")
            cp = fusermount_u(self.mp)
            if is_mounted(self.mp):
                warn(f"rclone: unmount failed ({(cp.stderr or '').strip()}); lazy unmount")
                fusermount_u(self.mp, lazy=True)
        # rclone exits by itself once its mount is gone; otherwise stop it by pid
        for sig, wait in ((None, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            if sig is not None and self.proc.poll() is None:
                warn(f"rclone: pid {self.pid} still running; sending {sig.name}")
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:
                    pass
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        if self.proc.poll() is None:
            warn(f"rclone: pid {self.pid} did not exit")
        else:
            self.proc = None


class UbiquityTarget(Target):
    name = "ubiquityfs"

    def __init__(self, workdir, binary, unmount_timeout, extra_args, mount_timeout=120):
        self.base = os.path.join(workdir, "ubiquityfs")
        self.mp = os.path.join(self.base, "mnt")
        self.store = os.path.join(self.base, "store")
        self.xdg = os.path.join(self.base, "xdg")
        self.bin = binary
        self.unmount_timeout = unmount_timeout
        self.mount_timeout = mount_timeout
        self.extra = extra_args
        self.label = f"ubiquityfs ({binary})"
        self.mounted = False
        self.unmount_seconds = None
        self.unmount_mode = None

    def env(self):
        e = dict(os.environ)
        e["XDG_DATA_HOME"] = self.xdg
        return e

    def pending(self):
        if not self.mounted:
            return None
        try:
            cp = run([self.bin, "status", self.mp, "--json"], env=self.env(), timeout=30, check=False)
            return json.loads(cp.stdout)["pendingItems"] if cp.returncode == 0 else None
        except (BenchError, OSError, ValueError, KeyError):
            return None

    def setup(self):
        if not (os.path.isfile(self.bin) and os.access(self.bin, os.X_OK)):
            raise BenchError(f"ubiquityfs binary not found: {self.bin} "
                             "(build it, pass --bin, or use --only bindfs)")
        os.makedirs(self.mp, exist_ok=True)
        os.makedirs(self.xdg, exist_ok=True)
        os.makedirs(self.store, exist_ok=True)  # an empty folder becomes a new store
        cmd = [self.bin, "mount", self.mp, "--store", self.store] + self.extra
        log(f"ubiquityfs: XDG_DATA_HOME={self.xdg} {shlex.join(cmd)}")
        self.mounted = True  # from here on, teardown tries to unmount
        try:
            rc, out = run_to_file(cmd, os.path.join(self.base, "mount.log"),
                                  timeout=self.mount_timeout, env=self.env())
        except BenchError as e:
            if is_mounted(self.mp):
                raise BenchError(f"{e}\n(the file system *is* mounted: the mount "
                                 "command did not return once the mount was ready)")
            raise
        if rc != 0:
            raise BenchError(f"ubiquityfs mount failed ({rc}):\n{out.strip()}")
        m = re.search(r"\bpid\b\D{0,3}(\d+)", out)
        if not wait_until(lambda: is_mounted(self.mp), 10):
            raise BenchError(f"ubiquityfs: mount command returned but {self.mp} "
                             f"is not mounted. Output:\n{out.strip()}")
        self.pid = int(m.group(1)) if m else None
        if self.pid is None or not pid_alive(self.pid):
            pids = pids_with_arg(self.mp)
            self.pid = pids[0] if pids else None
        if self.pid is None:
            warn("ubiquityfs: could not find daemon pid; RSS will be n/a")
        else:
            log(f"ubiquityfs: daemon pid {self.pid}")
        self.root = self.mp

    def teardown(self):
        if not is_mounted(self.mp):
            self.mounted = False
            return
        t0 = time.perf_counter()
        try:
            log(f"ubiquityfs: unmount (waits for pending uploads, "
                f"timeout {self.unmount_timeout}s)")
            cp = run([self.bin, "unmount", self.mp], env=self.env(),
                     timeout=self.unmount_timeout, check=False)
            if cp.returncode == 0 and wait_until(lambda: not is_mounted(self.mp), 10):
                self.unmount_mode = "clean"
            else:
                warn(f"ubiquityfs: unmount rc={cp.returncode}: {(cp.stderr or '').strip()}")
        except BenchError as e:
            warn(str(e))
        except OSError as e:
            warn(f"ubiquityfs: cannot run unmount: {e}")
        self.unmount_seconds = time.perf_counter() - t0
        if is_mounted(self.mp):
            warn("ubiquityfs: trying unmount --force")
            try:
                run([self.bin, "unmount", "--force", self.mp], env=self.env(),
                    timeout=60, check=False)
            except (BenchError, OSError) as e:
                warn(str(e))
            self.unmount_mode = "force"
        if is_mounted(self.mp):
            warn("ubiquityfs: falling back to fusermount3 -u -z")
            fusermount_u(self.mp, lazy=True)
            self.unmount_mode = "lazy"
        self.mounted = False
        if self.pid and not wait_until(lambda: not pid_alive(self.pid), 30):
            warn(f"ubiquityfs: daemon pid {self.pid} still running after unmount")


# --------------------------------------------------------------------------
# workloads: each takes (target, subdir, cfg, pool) and returns {metric: value}
# --------------------------------------------------------------------------

def wl_small(t, d, cfg, pool):
    n, size = cfg.small_files, cfg.small_size
    os.makedirs(d)
    names = [os.path.join(d, f"f{i:06d}") for i in range(n)]
    renamed = [os.path.join(d, f"r{i:06d}") for i in range(n)]
    flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
    datas = [pool.chunk(i, size) for i in range(n)]
    res = {}

    t0 = time.perf_counter()
    for p, data in zip(names, datas):
        fd = os.open(p, flags, 0o644)
        os.write(fd, data)
        os.close(fd)
    res["small_create"] = n / (time.perf_counter() - t0)

    # The folder of N files listed again and again (a shell's `ls`, a file
    # manager's refresh), then once after the caches are dropped: entries/s.
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        if len(os.listdir(d)) != n:
            raise BenchError(f"listing {d} did not give {n} entries")
    res["small_readdir"] = reps * n / (time.perf_counter() - t0)
    drop_caches()
    t0 = time.perf_counter()
    os.listdir(d)
    res["small_readdir_cold"] = n / (time.perf_counter() - t0)

    drop_caches()
    t0 = time.perf_counter()
    for p in names:
        os.stat(p)
    res["small_stat"] = n / (time.perf_counter() - t0)

    drop_caches()
    t0 = time.perf_counter()
    for p in names:
        fd = os.open(p, os.O_RDONLY)
        b = os.read(fd, size)
        os.close(fd)
        if len(b) != size:
            raise BenchError(f"short read on {p}: {len(b)} bytes")
    res["small_read"] = n / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    for a, b in zip(names, renamed):
        os.rename(a, b)
    res["small_rename"] = n / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    for p in renamed:
        os.unlink(p)
    res["small_unlink"] = n / (time.perf_counter() - t0)

    dirs = [os.path.join(d, f"d{i:06d}") for i in range(n)]
    t0 = time.perf_counter()
    for p in dirs:
        os.mkdir(p, 0o755)
    res["small_mkdir"] = n / (time.perf_counter() - t0)

    t0 = time.perf_counter()
    for p in dirs:
        os.rmdir(p)
    res["small_rmdir"] = n / (time.perf_counter() - t0)
    return res


def write_file(path, nbytes, bs, pool, fsync=True):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        i = 0
        left = nbytes
        while left > 0:
            n = min(bs, left)
            chunk = pool.chunk(i, bs)[:n]
            w = os.write(fd, chunk)
            while w < n:
                w += os.write(fd, chunk[w:])
            left -= n
            i += 1
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def wl_seq(t, d, cfg, pool):
    os.makedirs(d)
    path = os.path.join(d, "seq.bin")
    nbytes = cfg.seq_mib * MiB
    bs = cfg.seq_bs_kib * KiB
    res = {}
    drop_caches()
    t0 = time.perf_counter()
    write_file(path, nbytes, bs, pool, fsync=True)  # fsync + close timed
    res["seq_write"] = (nbytes / MiB) / (time.perf_counter() - t0)

    drop_caches()
    buf = bytearray(bs)
    total = 0
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            total += n
    el = time.perf_counter() - t0
    if total != nbytes:
        raise BenchError(f"seq read got {total} bytes, expected {nbytes}")
    res["seq_read"] = (nbytes / MiB) / el
    os.unlink(path)
    return res


def fio_run(path, rw, cfg):
    cmd = ["fio", "--name=ubqbench", f"--filename={path}", f"--rw={rw}",
           "--bs=4k", f"--size={cfg.rand_file_mib}M",
           f"--number_ios={cfg.rand_ops}", "--ioengine=psync", "--direct=0",
           "--iodepth=1", "--numjobs=1", "--randrepeat=1",
           f"--randseed={cfg.seed}", "--invalidate=1", "--overwrite=0",
           "--output-format=json"]
    if rw == "randwrite":
        cmd.append("--end_fsync=1")  # counted in fio's runtime
    cp = run(cmd, timeout=3600)
    out = cp.stdout
    j = json.loads(out[out.index("{"):])
    job = j["jobs"][0]
    side = job["read" if rw == "randread" else "write"]
    if side["total_ios"] < cfg.rand_ops:
        raise BenchError(f"fio {rw}: only {side['total_ios']} ios done")
    return side["iops"], side["bw_bytes"] / MiB


def py_rand(path, rw, cfg, pool):
    nblocks = (cfg.rand_file_mib * MiB) // (4 * KiB)
    rnd = random.Random(f"{cfg.seed}-{rw}")
    if cfg.rand_ops <= nblocks:
        blocks = rnd.sample(range(nblocks), cfg.rand_ops)
    else:
        blocks = [rnd.randrange(nblocks) for _ in range(cfg.rand_ops)]
    offs = [b * 4 * KiB for b in blocks]
    if rw == "randread":
        fd = os.open(path, os.O_RDONLY)
        t0 = time.perf_counter()
        for off in offs:
            if len(os.pread(fd, 4 * KiB, off)) != 4 * KiB:
                raise BenchError("short pread")
        el = time.perf_counter() - t0
        os.close(fd)
    else:
        datas = [pool.chunk(i + 7919, 4 * KiB) for i in range(len(offs))]
        fd = os.open(path, os.O_WRONLY)
        t0 = time.perf_counter()
        for off, data in zip(offs, datas):
            os.pwrite(fd, data, off)
        os.fsync(fd)
        el = time.perf_counter() - t0
        os.close(fd)
    iops = len(offs) / el
    return iops, iops * 4 * KiB / MiB


def wl_rand(t, d, cfg, pool):
    os.makedirs(d)
    path = os.path.join(d, "rand.bin")
    log(f"  {t.name}: laying out {cfg.rand_file_mib} MiB file (untimed)")
    write_file(path, cfg.rand_file_mib * MiB, MiB, pool, fsync=True)
    res = {}
    for rw, key in (("randread", "rand_read"), ("randwrite", "rand_write")):
        drop_caches()
        if cfg.rand_engine == "fio":
            iops, mibs = fio_run(path, rw, cfg)
        else:
            iops, mibs = py_rand(path, rw, cfg, pool)
        res[key + "_iops"] = iops
        res[key + "_mibs"] = mibs
    os.unlink(path)
    return res


def wl_fsync(t, d, cfg, pool):
    """What databases, git and editors do to make data survive a power
    loss: each a loop of small writes, each made durable before the next."""
    os.makedirs(d)
    n = cfg.fsync_ops
    res = {}
    # N new 4 KiB files, each written, fsynced and closed (git objects, mail).
    t0 = time.perf_counter()
    for i in range(n):
        fd = os.open(os.path.join(d, f"f{i:06d}"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        os.write(fd, pool.chunk(i, 4 * KiB))
        os.fsync(fd)
        os.close(fd)
    res["fsync_files"] = n / (time.perf_counter() - t0)
    # Appends of 512 bytes to one file, each followed by fdatasync (a database's log).
    fd = os.open(os.path.join(d, "log"), os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    record = pool.chunk(1, 512)[:512]
    t0 = time.perf_counter()
    for _ in range(n):
        os.write(fd, record)
        os.fdatasync(fd)
    res["fsync_append"] = n / (time.perf_counter() - t0)
    os.close(fd)
    # An editor's atomic save: temporary file, fsync, rename over, fsync the folder.
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    t0 = time.perf_counter()
    for i in range(n):
        tmp = os.path.join(d, ".doc.tmp")
        fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        os.write(fd, pool.chunk(i + 3, 4 * KiB))
        os.fsync(fd)
        os.close(fd)
        os.rename(tmp, os.path.join(d, "doc.txt"))
        os.fsync(dfd)
    res["fsync_save"] = n / (time.perf_counter() - t0)
    os.close(dfd)
    return res
    return res


def git_env(workdir):
    e = dict(os.environ)
    e.update({
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "HOME": workdir,
        "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
        "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost",
        "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z",
        "LC_ALL": "C",
    })
    return e


WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu "
         "nu xi omicron pi rho sigma tau upsilon phi chi psi omega func let var "
         "return struct class import if else for while switch case").split()


def gen_text(rnd, nbytes):
    out = []
    size = 0
    while size < nbytes:
        line = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 12)))
        line += f" {rnd.getrandbits(32):08x}\n"
        out.append(line)
        size += len(line)
    return "".join(out)


def make_git_repo(path, cfg):
    """Generate once per run, outside any mount."""
    log(f"generating git repo: {cfg.git_files} files in {cfg.git_dirs} dirs, "
        f"{cfg.git_commits} commits")
    env = git_env(os.path.dirname(path))
    os.makedirs(path)
    run(["git", "init", "-q", path], env=env)
    rnd = random.Random(cfg.seed)
    files = [os.path.join(f"d{i % cfg.git_dirs:03d}", f"file{i:05d}.txt")
             for i in range(cfg.git_files)]
    for dd in range(min(cfg.git_dirs, cfg.git_files)):
        os.makedirs(os.path.join(path, f"d{dd:03d}"), exist_ok=True)
    for c in range(cfg.git_commits):
        todo = files if c == 0 else rnd.sample(files, max(1, len(files) // 10))
        for rel in todo:
            with open(os.path.join(path, rel), "w") as f:
                f.write(gen_text(rnd, rnd.randint(200, 6000)))
        run(["git", "-C", path, "add", "-A"], env=env)
        run(["git", "-C", path, "commit", "-q", "--no-gpg-sign", "-m", f"commit {c}"],
            env=env)
    # a packed repository, like one fetched from a server
    run(["git", "-C", path, "repack", "-adq"], env=env)
    run(["git", "-C", path, "prune"], env=env)
    nfiles = sum(len(fs) for _, _, fs in os.walk(path))
    log(f"git repo ready: {nfiles} files on disk incl. .git")


def wl_git(t, d, cfg, pool):
    os.makedirs(d)
    dest = os.path.join(d, "clone")
    env = git_env(cfg.workdir)
    drop_caches()
    t0 = time.perf_counter()
    run(["git", "clone", "-q", "--no-hardlinks", cfg.git_src, dest], env=env,
        timeout=3600)
    el = time.perf_counter() - t0
    n = sum(1 for _ in os.scandir(dest))
    if n < 2:
        raise BenchError("git clone produced an empty checkout")
    return {"git_clone": el}


def wl_rss(t, d, cfg, pool):
    if t.pid is None:
        log(f"  {t.name}: no daemon pid, skipping rss")
        return {}
    os.makedirs(d)
    rss0, _ = t.rss_kib()
    n, ndirs = cfg.rss_files, cfg.rss_dirs
    flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC
    dirs = [os.path.join(d, f"d{i:04d}") for i in range(ndirs)]
    for p in dirs:
        os.mkdir(p)
    t0 = time.perf_counter()
    next_log = t0 + 30
    for i in range(n):
        fd = os.open(os.path.join(dirs[i % ndirs], f"f{i:06d}"), flags, 0o644)
        os.write(fd, pool.chunk(i, cfg.rss_file_size))
        os.close(fd)
        if i % 1000 == 999 and time.perf_counter() >= next_log:
            # progress for long runs (--rss-files 1000000); costs nothing measurable
            now = time.perf_counter()
            rss, _ = t.rss_kib()
            log(f"  {t.name}: {i + 1:,}/{n:,} files, {(i + 1) / (now - t0):,.0f}/s"
                + (f", VmRSS {rss / KiB:,.0f} MiB" if rss is not None else ""))
            next_log = now + 30
    el = time.perf_counter() - t0
    os.sync()
    time.sleep(1.0)
    # Right after the burst the daemon still holds what it has not pushed yet
    # (a backlog of up to a few hundred thousand small files when pushing is
    # slower than creating); the goal is for the container at rest, once
    # every item is pushed.
    burst, _ = t.rss_kib()
    settled = wait_quiet([t], timeout=900.0, window=2.0)
    log(f"  {t.name}: quiet {settled:.0f}s after the last file")
    rss, hwm = t.rss_kib()
    res = {"rss_before": rss0 / KiB if rss0 is not None else None,
           "rss_burst": burst / KiB if burst is not None else None,
           "rss_after": rss / KiB if rss is not None else None,
           "rss_peak": hwm / KiB if hwm is not None else None,
           "rss_settle": settled,
           "rss_create": n / el}
    # deliberately not deleted here: the mount is torn down right after
    return {k: v for k, v in res.items() if v is not None}


WORKLOADS = {
    "small": wl_small,
    "seq": wl_seq,
    "rand": wl_rand,
    "git": wl_git,
    "fsync": wl_fsync,
    "rss": wl_rss,
}
ORDER = ["small", "seq", "rand", "fsync", "git", "rss"]   # rss last: leaves files behind

# metric -> (workload label, unit, kind, goal)
#   kind: "rate" higher is better, ratio = ours/other
#         "time" lower is better,  ratio = other/ours (>1: we are faster)
#         "mem"  lower is better,  ratio = ours/other (<1: we use less)
#   goal, from issue 11 ("Where it stands" and "Deliver"):
#         ("ratio>=", x, note): ratio against bindfs in the same run;
#                               note "keep" = already above it, must stay there
#         ("abs<=", x, note):   absolute value for ubiquityfs
#         None:                 shown for information
RSS_GOAL_ITEMS = 1_000_000   # the memory goal is for a container of 1,000,000 items
METRICS = [
    ("small_create", "small: create+write 4K", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("small_readdir", "small: readdir N (again)", "entries/s", "rate", ("ratio>=", 1.0, "")),
    ("small_readdir_cold", "small: readdir N (cold)", "entries/s", "rate", None),
    ("small_stat", "small: stat (cold)", "ops/s", "rate", ("ratio>=", 1.0, "keep")),
    ("small_read", "small: open+read (cold)", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("small_rename", "small: rename", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("small_unlink", "small: unlink", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("small_mkdir", "small: mkdir", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("small_rmdir", "small: rmdir", "ops/s", "rate", None),
    ("seq_write", "seq: write 1M (+fsync)", "MiB/s", "rate", ("ratio>=", 1.0, "keep")),
    ("seq_read", "seq: read 1M (cold)", "MiB/s", "rate", ("ratio>=", 1.0, "keep")),
    ("rand_read_iops", "rand: 4K read", "IOPS", "rate", ("ratio>=", 1.0, "keep")),
    ("rand_read_mibs", "rand: 4K read", "MiB/s", "rate", None),
    ("rand_write_iops", "rand: 4K write (+fsync)", "IOPS", "rate", ("ratio>=", 1.0, "")),
    ("rand_write_mibs", "rand: 4K write (+fsync)", "MiB/s", "rate", None),
    ("fsync_files", "fsync: new 4K file + fsync", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("fsync_append", "fsync: append 512 B + fdatasync", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("fsync_save", "fsync: atomic save (+dir fsync)", "ops/s", "rate", ("ratio>=", 1.0, "")),
    ("git_clone", "git clone (N files)", "s", "time", ("ratio>=", 1.0, "")),
    ("rss_create", "rss: create N files", "ops/s", "rate", None),
    ("rss_mount", "rss: daemon VmRSS after mount", "MiB", "mem", None),
    ("rss_before", "rss: daemon VmRSS before N", "MiB", "mem", None),
    ("rss_burst", "rss: daemon VmRSS 1 s after N", "MiB", "mem", None),
    ("rss_settle", "rss: pushed everything after", "s", "time", None),
    ("rss_after", "rss: daemon VmRSS after N, pushed", "MiB", "mem", ("abs<=", 200, "")),
    ("rss_peak", "rss: daemon VmHWM (peak)", "MiB", "mem", None),
]
OTHERS = ("bindfs", "plain", "rclone")   # comparison columns; goals are against bindfs


# --------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------

DISPLAY = {"ubiquityfs": "ubiquityfs", "target": "dir", "bindfs": "bindfs",
           "plain": "plain", "rclone": "rclone"}


def fmt(v, unit):
    if v is None:
        return "—"
    if unit in ("ops/s", "IOPS"):
        return f"{v:,.0f}"
    if unit == "s":
        return f"{v:.2f}"
    return f"{v:,.1f}"


def spread(samples):
    """(max - min) / median of repeated samples, None for a single sample."""
    if not samples or len(samples) < 2:
        return None
    med = statistics.median(samples)
    return (max(samples) - min(samples)) / med if med else None


def ratio_of(kind, ours, other):
    """>1 = we are better for rates and times; <1 = we use less memory."""
    if ours is None or other is None or ours <= 0 or other <= 0:
        return None
    return other / ours if kind == "time" else ours / other


def build_rows(results, ours_name, cfg, raw=None):
    raw = raw or {}
    rows = []
    for key, label, unit, kind, goal in METRICS:
        o = results.get(ours_name, {}).get(key)
        b = results.get("bindfs", {}).get(key)
        pl = results.get("plain", {}).get(key)
        rc = results.get("rclone", {}).get(key)
        if o is None and b is None and rc is None and pl is None:
            continue
        if key.startswith("rss_"):
            label = label.replace(" N", f" {cfg.rss_files:,}")
        elif key == "git_clone":
            label = label.replace("N files", f"{cfg.git_files:,} files")
        ratio = ratio_of(kind, o, b)
        tgt, verdict = "", ""
        if goal:
            op, x, note = goal
            if op == "ratio>=":
                tgt = f"≥{x:.1f}×" + (f" ({note})" if note else "")
                if ratio is not None:
                    verdict = "ok" if ratio >= x else "MISS"
            elif op == "abs<=":
                tgt = f"≤{x} {unit} @ {RSS_GOAL_ITEMS:,}" + (f" ({note})" if note else "")
                if o is not None and ours_name == "ubiquityfs":
                    verdict = "ok" if o <= x else "MISS"
                    if key.startswith("rss_") and cfg.rss_files < RSS_GOAL_ITEMS:
                        verdict += "*"   # measured with fewer items than the goal's
        spreads = [x for x in (spread(raw.get(n, {}).get(key))
                               for n in (ours_name,) + OTHERS) if x is not None]
        rows.append({"metric": key, "workload": label, "unit": unit, "kind": kind,
                     "ours_name": ours_name, "ours": o, "bindfs": b, "plain": pl, "rclone": rc,
                     "ratio": ratio, "ratio_plain": ratio_of(kind, o, pl), "ratio_rclone": ratio_of(kind, o, rc),
                     "spread": max(spreads) if spreads else None,
                     "goal": tgt, "verdict": verdict})
    return rows


def print_table(rows, ours_name, notes=(), rss_files=None, out=sys.stdout):
    """notes: {column name: why it has no figures}, e.g. rclone not installed."""
    notes = dict(notes)
    show_spread = any(r["spread"] is not None for r in rows)
    hdr = ["workload", "unit", DISPLAY.get(ours_name, ours_name), "bindfs", "plain", "rclone",
           "vs bindfs", "vs plain", "vs rclone"]
    hdr += ["spread"] if show_spread else []
    hdr += ["goal (vs bindfs)", ""]

    def ratio_cell(v, col):
        if col in notes:
            return "n/a"
        return "—" if v is None else f"{v:.2f}×"

    def value_cell(v, unit, col):
        return "n/a" if col in notes else fmt(v, unit)

    table = [hdr]
    for r in rows:
        row = [r["workload"], r["unit"], value_cell(r["ours"], r["unit"], ours_name),
               value_cell(r["bindfs"], r["unit"], "bindfs"),
               value_cell(r["plain"], r["unit"], "plain"),
               value_cell(r["rclone"], r["unit"], "rclone"),
               ratio_cell(r["ratio"], "bindfs"), ratio_cell(r["ratio_plain"], "plain"),
               ratio_cell(r["ratio_rclone"], "rclone")]
        if show_spread:
            row.append("" if r["spread"] is None else f"{100 * r['spread']:.0f}%")
        row += [r["goal"], r["verdict"]]
        table.append(row)
    widths = [max(len(row[i]) for row in table) for i in range(len(hdr))]
    right = set(range(2, 10 if show_spread else 9))

    def line(row):
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                 for i, c in enumerate(row)]
        return "  ".join(cells).rstrip()

    print(line(table[0]), file=out)
    print("  ".join("-" * w for w in widths).rstrip(), file=out)
    for row in table[1:]:
        print(line(row), file=out)
    print("\nvs X: rates = ours/X, times = X/ours (>1 = we are faster); memory = "
          "ours/X (<1 = we use less).\nGoals are from issue 11. Ratio goals are "
          "judged on 'vs bindfs' ('keep': above 1.0x when the issue was filed, must "
          "stay there);\nthe memory goal is on the daemon's own VmRSS.", file=out)
    if rss_files is not None and any(r["verdict"].endswith("*") for r in rows):
        print(f"*: measured with {rss_files:,} items; the memory goal is for "
              f"{RSS_GOAL_ITEMS:,} (--rss-files {RSS_GOAL_ITEMS}).", file=out)
    if show_spread:
        print("spread: (max-min)/median over the --repeat samples, worst of the "
              "columns; values are medians.", file=out)
    for col, why in notes.items():
        print(f"{DISPLAY.get(col, col)}: n/a, {why}", file=out)


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

QUICK = dict(small_files=1000, seq_mib=64, rand_file_mib=64, rand_ops=5000, fsync_ops=300,
             git_files=500, git_dirs=20, git_commits=2, rss_files=10000, rss_dirs=100)
FULL = dict(small_files=5000, seq_mib=512, rand_file_mib=256, rand_ops=20000, fsync_ops=1000,
            git_files=3000, git_dirs=100, git_commits=3, rss_files=100000,
            rss_dirs=1000)


def default_bin():
    for p in (".build/release/ubiquityfs", ".build/debug/ubiquityfs"):
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return ".build/release/ubiquityfs"


def parse_args(argv):
    ap = argparse.ArgumentParser(
        description="Benchmark the UbiquityFS mount against bindfs (and rclone mount, "
                    "if installed) over a plain dir.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--bin", default=None,
                    help="ubiquityfs binary (default: .build/release/ubiquityfs, "
                         "else .build/debug/ubiquityfs)")
    ap.add_argument("--only", choices=["ubiquityfs", "bindfs", "plain", "rclone", "target"],
                    help="run a single target")
    ap.add_argument("--no-rclone", action="store_true",
                    help="skip the rclone column (it runs whenever rclone is installed)")
    ap.add_argument("--target", metavar="DIR",
                    help="benchmark an existing directory instead of ubiquityfs "
                         "(bindfs still runs for comparison unless --only target)")
    ap.add_argument("--target-pid", type=int,
                    help="with --target: pid of the daemon serving DIR (for RSS)")
    ap.add_argument("--workdir", default="/tmp/ubq-bench",
                    help="scratch dir for stores, mounts, git source (removed at end)")
    ap.add_argument("--keep", action="store_true", help="keep --workdir at the end")
    ap.add_argument("--json", metavar="FILE", help="write results as JSON")
    ap.add_argument("--quick", action="store_true", help="small sizes for a quick run")
    ap.add_argument("--workloads", default=",".join(ORDER),
                    help="comma-separated subset of " + ",".join(ORDER))
    ap.add_argument("--repeat", type=int, default=None,
                    help="repeat each workload N times, report the median (default 4, "
                         "1 with --quick): ubiquityfs and bindfs run first in turn")
    ap.add_argument("--seed", type=int, default=42)
    g = ap.add_argument_group("sizes (defaults: full run; --quick lowers them)")
    g.add_argument("--small-files", type=int)
    g.add_argument("--small-size", type=int, default=4096, help="bytes per file")
    g.add_argument("--seq-mib", type=int)
    g.add_argument("--seq-bs-kib", type=int, default=1024)
    g.add_argument("--rand-file-mib", type=int)
    g.add_argument("--rand-ops", type=int)
    g.add_argument("--rand-engine", choices=["auto", "fio", "python"], default="auto",
                   help="auto = fio if installed")
    g.add_argument("--fsync-ops", type=int)
    g.add_argument("--git-files", type=int)
    g.add_argument("--git-dirs", type=int)
    g.add_argument("--git-commits", type=int)
    g.add_argument("--rss-files", type=int)
    g.add_argument("--rss-dirs", type=int)
    g.add_argument("--rss-file-size", type=int, default=100)
    m = ap.add_argument_group("mounts")
    m.add_argument("--bindfs-args", default="-o big_writes",
                   help="bindfs options besides --no-allow-other. Debian's bindfs is "
                        "built on libfuse 2, which sends 4 KiB writes unless "
                        "big_writes is set (libfuse 3, as used by ubiquityfs, always "
                        "has big writes). Pass '' for stock bindfs; add "
                        "'--multithreaded' for a multithreaded baseline")
    m.add_argument("--ubq-args", default="", help="extra args for `ubiquityfs mount`")
    m.add_argument("--rclone-args", default="",
                   help="extra args for `rclone mount SRC MP --vfs-cache-mode full "
                        "--config /dev/null --cache-dir DIR`")
    m.add_argument("--mount-timeout", type=int, default=120,
                   help="seconds to wait for `ubiquityfs mount` to return")
    m.add_argument("--unmount-timeout", type=int, default=600,
                   help="seconds to wait for `ubiquityfs unmount` before --force")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress log")
    cfg = ap.parse_args(argv)

    if cfg.repeat is None:
        cfg.repeat = 1 if cfg.quick else 4
    sizes = QUICK if cfg.quick else FULL
    for k, v in sizes.items():
        if getattr(cfg, k) is None:
            setattr(cfg, k, v)
    cfg.workloads = [w.strip() for w in cfg.workloads.split(",") if w.strip()]
    bad = [w for w in cfg.workloads if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s): {bad}")
    cfg.workloads = [w for w in ORDER if w in cfg.workloads]
    if cfg.only == "target" and not cfg.target:
        ap.error("--only target needs --target DIR")
    if cfg.only == "rclone" and cfg.no_rclone:
        ap.error("--only rclone contradicts --no-rclone")
    if cfg.only == "rclone" and shutil.which("rclone") is None:
        ap.error(f"--only rclone: rclone is not installed ({RCLONE_INSTALL})")
    if cfg.target and cfg.only == "ubiquityfs":
        ap.error("--target replaces ubiquityfs; use --only target or --only bindfs")
    if cfg.rand_engine == "auto":
        cfg.rand_engine = "fio" if shutil.which("fio") else "python"
    elif cfg.rand_engine == "fio" and not shutil.which("fio"):
        ap.error("--rand-engine fio but fio is not installed (apt-get install -y fio)")
    if cfg.small_size <= 0 or cfg.seq_bs_kib <= 0 or cfg.repeat < 1:
        ap.error("sizes and --repeat must be positive")
    cfg.bin = os.path.abspath(cfg.bin or default_bin())
    ours_needed = (cfg.only == "ubiquityfs") or (cfg.only is None and not cfg.target)
    if ours_needed and not (os.path.isfile(cfg.bin) and os.access(cfg.bin, os.X_OK)):
        ap.error(f"ubiquityfs binary not found: {cfg.bin} (build it, pass --bin, "
                 "or use --only bindfs / --target DIR)")
    cfg.workdir = os.path.abspath(cfg.workdir)
    return cfg


def prepare_workdir(wd):
    """Create wd; if it exists, it must be one of ours (marker) or empty.
    Stale mounts under it from an aborted run are detached first."""
    if os.path.exists(wd):
        if os.listdir(wd) and not os.path.exists(os.path.join(wd, MARKER)):
            raise BenchError(f"--workdir {wd} exists, is not empty and was not "
                             f"created by this script; refusing to use it")
        for mp in sorted(mountpoints(), key=len, reverse=True):
            if mp.startswith(wd + "/"):
                warn(f"stale mount from an earlier run: {mp}; detaching")
                fusermount_u(mp, lazy=True)
        if any(mp.startswith(wd + "/") for mp in mountpoints()):
            raise BenchError(f"cannot detach stale mounts under {wd}")
        rmtree(wd)
    os.makedirs(wd)
    open(os.path.join(wd, MARKER), "w").close()


def close_fds_under(paths):
    """Close our own fds left open under the benchmark dirs by an interrupted
    workload, so that the unmounts are not refused as busy."""
    paths = [os.path.realpath(p) + "/" for p in paths if p]
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if any(target.startswith(p) for p in paths):
            try:
                os.close(int(fd))
            except OSError:
                pass


def on_sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
    global VERBOSE
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    VERBOSE = not cfg.quiet
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if inherited SIG_IGN
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGHUP, on_sigterm)

    if os.geteuid() != 0:
        warn("not root: caches cannot be dropped, 'cold' figures will be warm")

    ours_name = "target" if cfg.target else "ubiquityfs"
    notes = {}     # column -> why it has no figures (printed under the table)
    remarks = []   # other things the reader must know (printed under the table)
    if cfg.only:
        names = [cfg.only]
    else:
        names = [ours_name, "bindfs", "plain"]
        if cfg.no_rclone:
            notes["rclone"] = "skipped (--no-rclone)"
        elif shutil.which("rclone") is None:
            notes["rclone"] = f"rclone is not installed: {RCLONE_INSTALL}"
        else:
            names.append("rclone")
    for col in (ours_name,) + OTHERS:
        if col not in names and col not in notes:
            notes[col] = f"not run (--only {cfg.only})"

    targets = {}
    results = {n: {} for n in names}
    raw = {n: {} for n in names}
    started = datetime.datetime.now(datetime.timezone.utc)
    rc = 0
    wd_made = False
    try:
        prepare_workdir(cfg.workdir)
        wd_made = True
        need = 0
        if "seq" in cfg.workloads:
            need = max(need, cfg.seq_mib * MiB)
        if "rand" in cfg.workloads:
            need = max(need, cfg.rand_file_mib * MiB)
        if "small" in cfg.workloads:
            need = max(need, cfg.small_files * cfg.small_size)
        pool = Pool(min(need, 1024 * MiB))
        if "git" in cfg.workloads:
            cfg.git_src = os.path.join(cfg.workdir, "git-src", "repo")
            make_git_repo(cfg.git_src, cfg)

        for n in names:
            if n == "ubiquityfs":
                t = UbiquityTarget(cfg.workdir, cfg.bin, cfg.unmount_timeout,
                                   shlex.split(cfg.ubq_args), cfg.mount_timeout)
            elif n == "bindfs":
                t = BindfsTarget(cfg.workdir, shlex.split(cfg.bindfs_args))
            elif n == "rclone":
                t = RcloneTarget(cfg.workdir, shlex.split(cfg.rclone_args))
            elif n == "plain":
                t = PlainTarget(cfg.workdir)
            else:
                t = DirTarget(cfg.target, cfg.target_pid)
            targets[n] = t
            try:
                t.setup()
            except BenchError as e:
                if n != "rclone" or cfg.only:
                    raise
                # rclone is a comparison only: the run goes on without it
                warn(f"rclone: {e}")
                notes["rclone"] = "mount failed: " + str(e).splitlines()[0]
                names.remove("rclone")
                continue
            rss, _ = t.rss_kib()
            if rss is not None:
                raw[n]["rss_mount"] = [rss / KiB]

        for wl in cfg.workloads:
            reps = 1 if wl == "rss" else cfg.repeat  # rss accumulates files
            for rep in range(reps):
                # ubiquityfs and bindfs, the pair the goals compare, run back to
                # back, in turn first (with an even --repeat, each as often); any
                # other mount (rclone, --target) after them. So both run after as
                # many earlier runs, rclone's included, which leave the disk slower
                # for whoever comes next (a git clone through bindfs took 1.4 s in
                # the first round and 3.3-3.5 s from the third on, as through
                # ubiquityfs); and the first after a cleanup runs slower.
                pair = [n for n in names if n in ("ubiquityfs", "bindfs")]
                if rep % 2:
                    pair.reverse()
                order = pair + [n for n in names if n not in pair]
                for n in order:
                    if n not in names:
                        continue  # rclone failed in an earlier workload
                    t = targets[n]
                    d = os.path.join(t.root, f"{wl}-{rep}")
                    waited = wait_quiet(targets.values())
                    log(f"{wl} [{rep + 1}/{reps}] on {n} (daemons quiet after {waited:.1f}s)")
                    try:
                        r = WORKLOADS[wl](t, d, cfg, pool)
                        t.check_alive()
                    except (BenchError, OSError) as e:
                        if n != "rclone" or cfg.only:
                            raise
                        warn(f"rclone failed in {wl}: {e}")
                        remarks.append(f"rclone failed in workload {wl} "
                                       f"({str(e).splitlines()[0]}); it ran no further "
                                       "workloads")
                        names.remove("rclone")
                        continue
                    for k, v in r.items():
                        raw[n].setdefault(k, []).append(v)
                    log("  " + ", ".join(f"{k}={v:,.1f}" for k, v in r.items()))
                    if wl != "rss":
                        rmtree(d)  # untimed cleanup
        for n in raw:
            for k, vs in raw[n].items():
                results[n][k] = statistics.median(vs)
    except KeyboardInterrupt as e:
        warn(f"interrupted ({str(e) or 'SIGINT'}); tearing down")
        rc = 130
    except BenchError as e:
        print(f"ERROR: {e}", file=sys.stderr)
        rc = 1
    finally:
        close_fds_under([cfg.workdir] + [t.root for t in targets.values()])
        for n in reversed(list(targets)):
            try:
                targets[n].teardown()
            except Exception as e:  # keep tearing down the others
                warn(f"teardown of {n} failed: {e}")
        if wd_made and not cfg.keep:
            if any(mp.startswith(cfg.workdir + "/") for mp in mountpoints()):
                warn(f"mounts remain under {cfg.workdir}; not removing it")
            else:
                log(f"removing {cfg.workdir}")
                rmtree(cfg.workdir)

    if not any(results.values()):
        return rc or 1
    rows = build_rows(results, ours_name, cfg, raw)
    params = {k: getattr(cfg, k) for k in
              ["small_files", "small_size", "seq_mib", "seq_bs_kib", "rand_file_mib",
               "rand_ops", "rand_engine", "fsync_ops", "git_files", "git_dirs", "git_commits",
               "rss_files", "rss_dirs", "rss_file_size", "repeat", "quick", "seed",
               "bindfs_args", "ubq_args", "rclone_args"]}
    print()
    print(f"UbiquityFS benchmark  {started:%Y-%m-%d %H:%M UTC}  "
          f"{platform.node()}  kernel {platform.release()}  {os.cpu_count()} cpus")
    for n in targets:
        print(f"  {n}: {targets[n].label}")
    print("  params: " + " ".join(f"{k}={v}" for k, v in params.items()))
    print()
    print_table(rows, ours_name, notes,
                rss_files=cfg.rss_files if "rss" in cfg.workloads else None)
    for r in remarks:
        print(r)
    u = targets.get("ubiquityfs")
    if u is not None and u.unmount_seconds is not None:
        print(f"ubiquityfs unmount (drains pending uploads): "
              f"{u.unmount_seconds:.2f} s, mode={u.unmount_mode}")
    if rc:
        print(f"\n(incomplete run, exit code {rc})")

    if cfg.json:
        doc = {
            "started": started.isoformat(),
            "host": platform.node(), "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "targets": {n: targets[n].label for n in targets},
            "not_run": notes,
            "remarks": remarks,
            "params": params,
            "results": results,
            "samples": raw,
            "rows": rows,
            "ubiquityfs_unmount_seconds": u.unmount_seconds if u else None,
            "ubiquityfs_unmount_mode": u.unmount_mode if u else None,
            "complete": rc == 0,
        }
        with open(cfg.json, "w") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
        log(f"wrote {cfg.json}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
