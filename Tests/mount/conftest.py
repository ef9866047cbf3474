"""Fixtures and helpers for the UbiquityFS mount tests.

These tests drive the real `ubiquityfs` daemon on real FUSE mounts.  See
README.md in this directory for how to run them and the environment variables.

With UBQ_TEST_PLAIN=1 the `device` fixture hands out a plain directory instead
of a mount, so the tool tests can be checked against an ordinary filesystem;
everything that needs the daemon (marked `daemon`) is skipped in that mode.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import re
import shlex
import signal
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("UBIQUITYFS_BIN") or REPO / ".build" / "debug" / "ubiquityfs")
# The same command with fault injection (UBIQUITYFS_FAULTS): mounts that set it run this one.
TESTING_BIN = Path(os.environ.get("UBIQUITYFS_TESTING_BIN") or BIN.with_name("ubiquityfs-testing"))
# What only the testing command reads (Tests/ubiquityfs-testing): a command given one of these runs it.
TESTING_ENV = {"UBIQUITYFS_FAULTS", "UBIQUITYFS_TEST_BOOT_ID"}
# The control protocol the binary speaks (docs/PROTOCOL.md), for tests that talk to a daemon's socket directly.
CONTROL_PROTOCOL = "1.3"
PLAIN = os.environ.get("UBQ_TEST_PLAIN", "") == "1"


def _env_seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


# `ubiquityfs mount` must return (mount ready) within this time.
MOUNT_TIMEOUT = _env_seconds("UBQ_MOUNT_TIMEOUT", 60)
# `ubiquityfs unmount` (graceful: waits for every push) must return within this time.
UNMOUNT_TIMEOUT = _env_seconds("UBQ_UNMOUNT_TIMEOUT", 600)
# A mounted device whose daemon is still alive this long after mounting is
# SIGKILLed, which turns a hung FUSE request into ENOTCONN (the test then
# fails instead of hanging forever).  The teardown reports it.
HANG_TIMEOUT = _env_seconds("UBQ_HANG_TIMEOUT", 1800)
# The daemon must have exited this long after an unmount / SIGTERM.
EXIT_TIMEOUT = 10
# Extra arguments appended to every `ubiquityfs mount` (e.g. a log level flag).
EXTRA_MOUNT_ARGS = shlex.split(os.environ.get("UBQ_MOUNT_ARGS", ""))
# Which store the `store` fixture gives: "folder" (default) or "s3" (a fresh
# prefix in a bucket of a real S3 server on loopback: the first server of
# UBIQUITYFS_TEST_S3_SERVERS, or a SeaweedFS this session starts).
STORE_KIND = os.environ.get("UBQ_TEST_STORE", "folder")
assert STORE_KIND in ("folder", "s3"), f"UBQ_TEST_STORE must be folder or s3, not {STORE_KIND!r}"


class S3StoreRef(str):
    """An S3 store for the tests: `s3://BUCKET/PREFIX` plus the endpoint to
    reach it (a device may reach it through its own fault proxy)."""

    def __new__(cls, url: str, endpoint: str, region: str = "us-east-1"):
        ref = super().__new__(cls, url)
        ref.endpoint = endpoint
        ref.region = region
        return ref

    def via(self, endpoint: str) -> "S3StoreRef":
        return S3StoreRef(str(self), endpoint, self.region)

    @property
    def args(self) -> list[str]:
        return ["--endpoint", self.endpoint, "--region", self.region]


def store_args(store) -> list[str]:
    """`--store …` (and the S3 server options) naming `store` on a command line."""
    return ["--store", str(store), *(store.args if isinstance(store, S3StoreRef) else [])]


_S3_SERVER: dict | None = None


def s3_server() -> dict:
    """The S3 server of this test session (credentials exported to children)."""
    global _S3_SERVER
    if _S3_SERVER is None:
        import json
        import sys
        listed = [p for p in os.environ.get("UBIQUITYFS_TEST_S3_SERVERS", "").split(",") if p]
        if listed:
            with open(listed[0]) as f:
                _S3_SERVER = json.load(f)
        else:
            sys.path.insert(0, str(REPO / "Tests" / "servers"))
            import s3servers
            directory = Path(f"/tmp/ubq-test-s3-{os.getpid()}")
            _S3_SERVER = s3servers.start("seaweedfs", directory)
            _S3_SERVER["_started_here"] = str(directory)
        os.environ["AWS_ACCESS_KEY_ID"] = _S3_SERVER["access_key"]
        os.environ["AWS_SECRET_ACCESS_KEY"] = _S3_SERVER["secret_key"]
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.pop("AWS_PROFILE", None)
    return _S3_SERVER


def folder_store_only(reason: str):
    """Mark a test that works on the store's files directly (skipped on S3)."""
    return pytest.mark.skipif(STORE_KIND == "s3", reason=f"folder store only: {reason}")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "daemon: needs the real ubiquityfs daemon (skipped with UBQ_TEST_PLAIN=1)",
    )


def pytest_runtest_setup(item):
    if PLAIN and item.get_closest_marker("daemon") is not None:
        pytest.skip("needs the ubiquityfs daemon (UBQ_TEST_PLAIN=1)")


def require_fuse_and_binary():
    if not os.path.exists("/dev/fuse"):
        pytest.fail("/dev/fuse is missing: these tests need FUSE (or set UBQ_TEST_PLAIN=1)")
    if not (BIN.is_file() and os.access(BIN, os.X_OK)):
        pytest.fail(
            f"ubiquityfs binary not found at {BIN}: run `swift build` or set "
            "UBIQUITYFS_BIN (UBQ_TEST_PLAIN=1 runs the tool tests on a plain directory)"
        )


# --------------------------------------------------------------------------
# Processes and mounts
# --------------------------------------------------------------------------


def _unescape_mount_field(field: str) -> str:
    # /proc/*/mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mounts() -> dict[str, str]:
    """Mount point -> filesystem type, from /proc/self/mountinfo."""
    result = {}
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) < 5 or not right:
                continue
            result[_unescape_mount_field(fields[4])] = right.split()[0]
    return result


def mount_fstype(path) -> str | None:
    """The filesystem type mounted exactly at `path`, or None."""
    return mounts().get(os.path.realpath(path))


def is_mounted(path) -> bool:
    return mount_fstype(path) is not None


def mounts_under(path) -> list[str]:
    """Every mount point at or below `path` (used to prove nothing was left mounted)."""
    root = os.path.realpath(path)
    return sorted(m for m in mounts() if m == root or m.startswith(root + "/"))


def mount_is_dead(path) -> bool:
    """True if `path` is a FUSE mount whose daemon is gone (ENOTCONN).

    statfs always reaches the daemon; stat of the root may be answered from
    the kernel's attribute cache even when the daemon is dead.
    """
    for probe in (os.statvfs, os.stat):
        try:
            probe(path)
        except OSError as e:
            if e.errno in (errno.ENOTCONN, errno.ECONNABORTED):
                return True
    return False


def lazy_unmount(path) -> bool:
    """Detach a (possibly dead) FUSE mount.  Returns True if nothing is mounted there now."""
    if not is_mounted(path):
        return True
    subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True, timeout=30)
    if is_mounted(path):
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
    return not is_mounted(path)


def pid_alive(pid: int | None) -> bool:
    """True if `pid` runs (a zombie counts as exited: PID 1 here may not reap)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = data[data.rfind(b")") + 2 : data.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def wait_pid_exit(pid: int | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def processes_with_data_home(data_home) -> list[int]:
    """Live processes whose environment has XDG_DATA_HOME=data_home.

    Every device gets a unique data home under the test's tmp dir, so such a
    process can only be a daemon (or helper) that one of our tests started.
    """
    needle = b"XDG_DATA_HOME=" + os.fsencode(str(data_home))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env and pid_alive(int(entry)):
            found.append(int(entry))
    return found


# --------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------


@dataclass
class CmdResult:
    args: list[str]
    returncode: int | None  # None: timed out and was killed
    stdout: str
    stderr: str
    seconds: float

    @property
    def text(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:
        rc = "TIMEOUT" if self.returncode is None else self.returncode
        return (
            f"$ {shlex.join(self.args)}\n  -> exit {rc} after {self.seconds:.1f}s\n"
            f"  stdout: {self.stdout.strip()!r}\n  stderr: {self.stderr.strip()!r}"
        )


_LIVE_DEVICES: list["Device"] = []


class Device:
    """One "device": its own XDG_DATA_HOME (replica) and mountpoint, on a shared store.

    Paths: <base>/<name>/data (XDG_DATA_HOME), <base>/<name>/mnt, <base>/<name>/logs.
    `data_home` can be passed to make a second Device that is the *same* device
    (same replica) on another mountpoint.
    """

    plain = False
    # Per-device extras for `mount`: arguments appended after UBQ_MOUNT_ARGS,
    # and variables added to the environment of the `mount` command (hence of
    # the daemon), e.g. UBIQUITYFS_FAULTS.  Set them on the instance.
    mount_args: tuple[str, ...] = ()
    mount_env: dict[str, str] | None = None

    def __init__(self, base: Path, store: Path, name: str, *, data_home=None, container=None):
        self.name = name
        self.dir = Path(base) / name
        self.dir.mkdir(parents=True, exist_ok=False)
        self.data_home = Path(data_home) if data_home else self.dir / "data"
        self.data_home.mkdir(parents=True, exist_ok=True)
        self.mountpoint = self.dir / "mnt"
        self.mountpoint.mkdir()
        self.logdir = self.dir / "logs"
        self.logdir.mkdir()
        self.store = store if isinstance(store, S3StoreRef) else Path(store)
        self.container = container
        self.pid: int | None = None
        self.history: list[CmdResult] = []
        self.problems: list[str] = []
        self._watchdog: threading.Timer | None = None
        _LIVE_DEVICES.append(self)

    def __fspath__(self) -> str:
        return str(self.mountpoint)

    def __repr__(self) -> str:
        return f"<Device {self.name} mp={self.mountpoint} pid={self.pid}>"

    # -- running the CLI ------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["XDG_DATA_HOME"] = str(self.data_home)
        return env

    def cli(self, *args: str, timeout: float, extra_env: dict[str, str] | None = None) -> CmdResult:
        """Run `ubiquityfs ARGS` as this device.

        Output goes to files, not pipes: a daemon that forgets to detach from
        its stdout must not make the test hang waiting for EOF.
        """
        n = len(self.history)
        out_path = self.logdir / f"{n:02d}-{args[0]}.stdout"
        err_path = self.logdir / f"{n:02d}-{args[0]}.stderr"
        faulty = bool(TESTING_ENV & set(extra_env or {}))
        argv = [str(TESTING_BIN if faulty else BIN), *map(str, args)]
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv,
                env={**self.env(), **(extra_env or {})},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = None
        res = CmdResult(
            argv,
            rc,
            out_path.read_text(errors="replace"),
            err_path.read_text(errors="replace"),
            time.monotonic() - start,
        )
        self.history.append(res)
        return res

    def mount(self, *, check: bool = True) -> CmdResult:
        args = ["mount", str(self.mountpoint), *store_args(self.store)]
        if self.container:
            args += ["--container", self.container]
        res = self.cli(*args, *EXTRA_MOUNT_ARGS, *self.mount_args, timeout=MOUNT_TIMEOUT,
                       extra_env=self.mount_env)
        if not check:
            if res.returncode == 0:
                self._adopt_pid(res)
            return res
        assert res.returncode == 0, f"mount failed:\n{res}"
        assert self._adopt_pid(res), f"mount output has no 'pid N' line:\n{res}"
        assert pid_alive(self.pid), f"daemon pid {self.pid} is not running after mount:\n{res}"
        fstype = mount_fstype(self.mountpoint)
        assert fstype and fstype.startswith("fuse"), (
            f"mount returned 0 but {self.mountpoint} is not a FUSE mount (fstype {fstype!r}):\n{res}"
        )
        self._arm_watchdog()
        return res

    def _adopt_pid(self, res: CmdResult) -> bool:
        m = re.search(r"\bpid[\s:=]+(\d+)", res.text)
        if m:
            self.pid = int(m.group(1))
        return m is not None

    def unmount(self, force: bool = False, *, check: bool = True) -> CmdResult:
        """`ubiquityfs unmount` (graceful: waits for every push; --force: at once)."""
        args = ["unmount", str(self.mountpoint)] + (["--force"] if force else [])
        res = self.cli(*args, timeout=MOUNT_TIMEOUT if force else UNMOUNT_TIMEOUT)
        if check:
            assert res.returncode == 0, f"unmount failed:\n{res}"
            assert not is_mounted(self.mountpoint), f"still mounted after unmount:\n{res}"
            assert self._daemon_shared() or wait_pid_exit(self.pid, EXIT_TIMEOUT), (
                f"daemon pid {self.pid} still running {EXIT_TIMEOUT}s after unmount:\n{res}"
            )
        if not pid_alive(self.pid):
            self._disarm_watchdog()
            self.pid = None
        return res

    def _daemon_shared(self) -> bool:
        """Another live Device of this device (same data home) is mounted and
        served by the same daemon, which then keeps running after this unmount."""
        return any(d is not self and d.data_home == self.data_home and d.pid == self.pid and d.is_mounted()
                   for d in _LIVE_DEVICES)

    def remount(self) -> None:
        self.unmount()
        self.mount()

    def kill9(self) -> None:
        """SIGKILL the daemon and lazily detach the dead FUSE mount it leaves behind."""
        assert self.pid, "kill9: daemon pid unknown (not mounted?)"
        self._disarm_watchdog()
        os.kill(self.pid, signal.SIGKILL)
        assert wait_pid_exit(self.pid, EXIT_TIMEOUT), f"pid {self.pid} survived SIGKILL"
        self.pid = None
        assert lazy_unmount(self.mountpoint), f"could not detach dead mount {self.mountpoint}"

    def terminate(self) -> None:
        """Send SIGTERM to the daemon (does not wait)."""
        assert self.pid, "terminate: daemon pid unknown (not mounted?)"
        os.kill(self.pid, signal.SIGTERM)

    def is_mounted(self) -> bool:
        return is_mounted(self.mountpoint)

    def _strays(self) -> list[int]:
        """Processes running with this device's XDG_DATA_HOME, unless another
        live Device shares that data home (its processes are legitimate then;
        the last of them to close does the check)."""
        if any(d is not self and d.data_home == self.data_home for d in _LIVE_DEVICES):
            return []
        return processes_with_data_home(self.data_home)

    def wait_gone(self, timeout: float = EXIT_TIMEOUT) -> list[str]:
        """After an external unmount or a signal: wait until the daemon has
        exited and the mount is gone.  Returns what did not happen in time."""
        problems = []
        if not wait_pid_exit(self.pid, timeout):
            problems.append(f"daemon pid {self.pid} still running after {timeout}s")
        if not wait_until(lambda: not self.is_mounted(), timeout):
            problems.append(f"{self.mountpoint} still mounted after {timeout}s")
        if not wait_until(lambda: not self._strays(), timeout):
            problems.append(
                "processes still running: "
                + ", ".join(f"{p} ({_cmdline(p)})" for p in self._strays())
            )
        if not problems:
            self._disarm_watchdog()
            self.pid = None
        return problems

    # -- watchdog -------------------------------------------------------------

    def _arm_watchdog(self) -> None:
        self._disarm_watchdog()
        pid = self.pid

        def fire():
            if pid_alive(pid):
                self.problems.append(
                    f"watchdog: daemon pid {pid} still mounted after {HANG_TIMEOUT:.0f}s "
                    "(UBQ_HANG_TIMEOUT); SIGKILLed it to unblock the test"
                )
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

        self._watchdog = threading.Timer(HANG_TIMEOUT, fire)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _disarm_watchdog(self) -> None:
        if self._watchdog:
            self._watchdog.cancel()
            self._watchdog = None

    # -- teardown -------------------------------------------------------------

    def close(self) -> list[str]:
        """Unmount (gracefully if possible) and make sure nothing is left behind.

        Returns the problems found; a leftover mount or process is a defect.
        """
        if self not in _LIVE_DEVICES:
            return []
        _LIVE_DEVICES.remove(self)
        self._disarm_watchdog()
        problems = list(self.problems)
        if self.is_mounted():
            if (self.pid and not pid_alive(self.pid)) or mount_is_dead(self.mountpoint):
                problems.append(f"{self.name}: dead FUSE mount left at {self.mountpoint}")
            else:
                res = self.unmount(check=False)
                if res.returncode != 0 or self.is_mounted():
                    problems.append(f"{self.name}: graceful unmount at teardown failed:\n{res}")
                    if self.is_mounted():
                        self.unmount(force=True, check=False)
            if not lazy_unmount(self.mountpoint):
                problems.append(f"{self.name}: could not detach {self.mountpoint}")
        if self.pid and not self._daemon_shared() and not wait_pid_exit(self.pid, EXIT_TIMEOUT):
            problems.append(f"{self.name}: daemon pid {self.pid} still running after unmount")
        if not wait_until(lambda: not self._strays(), EXIT_TIMEOUT):
            for pid in self._strays():
                problems.append(f"{self.name}: leftover process {pid} ({_cmdline(pid)}); killed")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.pid = None
        return problems


class PlainDevice:
    """UBQ_TEST_PLAIN=1 stand-in: `mountpoint` is an ordinary directory."""

    plain = True
    pid = None
    data_home = None

    def __init__(self, base: Path, store: Path):
        self.name = "plain"
        self.mountpoint = Path(base) / "plain-mnt"
        self.mountpoint.mkdir()
        self.store = store

    def __fspath__(self) -> str:
        return str(self.mountpoint)

    def _skip(self, *_a, **_k):
        pytest.skip("needs the ubiquityfs daemon (UBQ_TEST_PLAIN=1)")

    mount = unmount = remount = kill9 = terminate = _skip

    def is_mounted(self) -> bool:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return shlex.join(os.fsdecode(a) for a in f.read().split(b"\0") if a)
    except OSError:
        return "?"


def pytest_sessionfinish(session, exitstatus):
    # Safety net (e.g. after Ctrl-C): never leave a mount or daemon behind.
    for dev in list(_LIVE_DEVICES):
        dev.close()
    if _S3_SERVER and _S3_SERVER.get("_started_here"):
        import s3servers
        s3servers.stop(_S3_SERVER["_started_here"])


# --------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    """A new, empty store: a directory (the folder store), or with
    UBQ_TEST_STORE=s3 a fresh prefix on the session's S3 server."""
    if STORE_KIND == "s3":
        server = s3_server()
        return S3StoreRef(f"s3://{server['bucket']}/t-{tmp_path.name}-{os.urandom(4).hex()}", server["endpoint"],
                          server.get("region", "us-east-1"))
    path = tmp_path / "store"
    path.mkdir()
    return path


@pytest.fixture
def make_device(tmp_path, store):
    """Factory: make_device(name="a", *, store=..., data_home=None, mount=True, container=None).

    Every device it makes is unmounted and checked at teardown, even if the
    test failed; leftover mounts/processes make the teardown fail.
    """
    if PLAIN:
        pytest.skip("needs the ubiquityfs daemon (UBQ_TEST_PLAIN=1)")
    require_fuse_and_binary()
    devices: list[Device] = []

    def factory(name="a", *, store=store, data_home=None, mount=True, container=None) -> Device:
        unique, n = name, 1
        while (tmp_path / unique).exists():
            n += 1
            unique = f"{name}{n}"
        dev = Device(tmp_path, store, unique, data_home=data_home, container=container)
        devices.append(dev)
        if mount:
            dev.mount()
        return dev

    yield factory

    problems = []
    for dev in reversed(devices):
        problems += dev.close()
    if problems:
        pytest.fail("teardown found problems:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def private_data_home(tmp_path_factory):
    """A data home of the test session's own for commands run without a
    device's environment (`container create …`): the user's
    ~/.local/share/ubiquityfs is never written (a `container` command on an
    S3 store left its known-stores entry there)."""
    saved = os.environ.get("XDG_DATA_HOME")
    os.environ["XDG_DATA_HOME"] = str(tmp_path_factory.mktemp("data-home"))
    yield
    if saved is None:
        os.environ.pop("XDG_DATA_HOME", None)
    else:
        os.environ["XDG_DATA_HOME"] = saved


@pytest.fixture
def device(tmp_path, store, request):
    """A mounted device (or, with UBQ_TEST_PLAIN=1, a PlainDevice on a plain dir).

    Use `device.mountpoint` (or `device` itself, it is path-like).
    """
    if PLAIN:
        yield PlainDevice(tmp_path, store)
        return
    factory = request.getfixturevalue("make_device")
    yield factory("dev")


class LazyFS:
    """Tests/powercut/lazyfs.py serving `backing` at `mountpoint`: a filesystem
    that loses every file's data written since its last fsync on `cut()` (a
    simulated power cut; metadata is never lost). Give a device a data home
    inside `mountpoint` to put its replica there."""

    POWERCUT = REPO / "Tests" / "powercut"

    def __init__(self, base: Path):
        import importlib.util
        spec = importlib.util.spec_from_file_location("lazyfs", self.POWERCUT / "lazyfs.py")
        self._client = importlib.util.module_from_spec(spec)   # its client half needs no pyfuse3
        spec.loader.exec_module(self._client)
        self.backing = base / "lazy-backing"
        self.mountpoint = base / "lazy"
        self.control = base / "lazy.control"
        self.backing.mkdir()
        self.mountpoint.mkdir()
        self.log = open(base / "lazyfs.log", "wb")
        self.proc = subprocess.Popen(
            [self.python(), str(self.POWERCUT / "lazyfs.py"), "serve", str(self.backing), str(self.mountpoint),
             "--control", str(self.control)],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        ready = wait_until(lambda: self.proc.poll() is not None or (
            self.control.exists() and mount_fstype(self.mountpoint) == "fuse.lazyfs"), 30)
        if not ready or self.proc.poll() is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            lazy_unmount(self.mountpoint)
            pytest.fail(f"lazyfs did not start:\n{self.log_text()}")

    _python: str | None = None

    @classmethod
    def python(cls) -> str:
        """An interpreter with pyfuse3 (Debian's python3-pyfuse3 is /usr/bin/python3's)."""
        import sys
        if cls._python:
            return cls._python
        for python in (os.environ.get("UBQ_LAZYFS_PYTHON"), "/usr/bin/python3", sys.executable):
            if python and subprocess.run([python, "-c", "import pyfuse3, trio"], capture_output=True).returncode == 0:
                cls._python = python
                return python
        pytest.fail("no python3 with pyfuse3 for Tests/powercut/lazyfs.py: "
                    "`bash Packaging/install-deps.sh test` installs python3-pyfuse3 (or set UBQ_LAZYFS_PYTHON)")

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def cut(self, keep: str | None = None) -> dict:
        """The power cut: every file's data goes back to what it was at its last fsync
        (except files whose path has `keep` in it: as if the disk had written them back)."""
        return self._client.request(str(self.control), f"cut {keep}" if keep else "cut")

    def sync(self) -> dict:
        """Everything written so far becomes durable."""
        return self._client.request(str(self.control), "sync")

    def status(self) -> dict:
        return self._client.request(str(self.control), "status")

    @staticmethod
    def _end_strays(inside: str) -> list[str]:
        """SIGKILL daemons still running with a data home inside lazyfs (a device
        whose teardown failed) and detach their mounts: lazyfs must go last."""
        problems = []
        needle = b"XDG_DATA_HOME=" + os.fsencode(inside)
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            pid = int(entry)
            if any(v.startswith(needle) for v in env) and pid_alive(pid):
                problems.append(f"leftover process {pid} ({_cmdline(pid)}) with its data home on lazyfs; killed")
                os.kill(pid, signal.SIGKILL)
                wait_pid_exit(pid, EXIT_TIMEOUT)
                with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
                    for line in f:
                        left, _, right = line.partition(" - ")
                        if right.split()[1:2] == [f"ubiquityfs:{pid}"]:
                            lazy_unmount(_unescape_mount_field(left.split()[4]))
        return problems

    def stop(self) -> list[str]:
        """Unmount and end lazyfs (devices whose data home is inside it are closed first)."""
        problems = []
        inside = str(self.mountpoint) + "/"
        for dev in list(_LIVE_DEVICES):
            if str(dev.data_home).startswith(inside):
                try:
                    problems += dev.close()
                except Exception as e:  # noqa: BLE001 - reported; the strays are ended below
                    problems.append(f"{dev.name}: closing it failed: {e!r}")
        problems += self._end_strays(inside)
        if self.proc.poll() is None:
            try:
                self._client.request(str(self.control), "stop", timeout=10)
            except (OSError, RuntimeError) as e:
                problems.append(f"lazyfs stop: {e}")
            try:
                self.proc.wait(EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                problems.append(f"lazyfs pid {self.proc.pid} still running after stop; killed")
                self.proc.kill()
                self.proc.wait()
        if not lazy_unmount(self.mountpoint):
            problems.append(f"could not detach {self.mountpoint}")
        if self.proc.returncode not in (0, None):
            problems.append(f"lazyfs exited {self.proc.returncode}:\n{self.log_text()}")
        elif "Traceback" in self.log_text():
            problems.append(f"lazyfs logged an error:\n{self.log_text()}")
        self.log.close()
        return problems


@pytest.fixture
def lazyfs(tmp_path):
    """A LazyFS under the test's tmp dir, stopped (after the devices in it) at teardown."""
    if PLAIN:
        pytest.skip("needs FUSE (UBQ_TEST_PLAIN=1)")
    fs = LazyFS(tmp_path)
    yield fs
    problems = fs.stop()
    if problems:
        pytest.fail("lazyfs teardown found problems:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture
def tool_env(tmp_path) -> dict[str, str]:
    """Environment for real tools: private HOME, no user/system git config, C locale."""
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ)
    env.update(
        HOME=str(home),
        LC_ALL="C.UTF-8",
        TZ="UTC",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
    )
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "VIMINIT", "EXINIT", "XDG_DATA_HOME"):
        env.pop(var, None)
    return env


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def run(cmd, *, cwd=None, env=None, timeout=300, check=True, input=None) -> subprocess.CompletedProcess:
    """Run a tool; on failure the assertion message carries its output."""
    proc = subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    if check:
        assert proc.returncode == 0, (
            f"$ {shlex.join(map(str, cmd))} -> exit {proc.returncode}\n"
            f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
        )
    return proc


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _raise(err):
    raise err


def _walk(root):
    """(relpath, lstat) for every entry below root (root itself excluded), sorted."""
    root = os.fspath(root)
    entries = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise, followlinks=False):
        dirnames.sort()
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            entries.append((os.path.relpath(path, root), path, os.lstat(path)))
    entries.sort(key=lambda e: e[0])
    return entries


def tree_digest(root) -> dict[str, tuple]:
    """relpath -> (type, mode, size, sha256 | symlink target | None).

    type is file/dir/symlink/fifo/socket/other; mode is the permission bits;
    directory size is None (it is filesystem-specific).  Reads every byte.
    """
    out = {}
    for rel, path, st in _walk(root):
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode):
            out[rel] = ("file", mode, st.st_size, sha256_file(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", mode, None, None)
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = ("symlink", mode, st.st_size, os.readlink(path))
        elif stat.S_ISFIFO(st.st_mode):
            out[rel] = ("fifo", mode, 0, None)
        elif stat.S_ISSOCK(st.st_mode):
            out[rel] = ("socket", mode, 0, None)
        else:
            out[rel] = ("other", mode, st.st_size, None)
    return out


def mtimes(root, *, include_root=False) -> dict[str, int]:
    """relpath -> st_mtime_ns (lstat) for every entry."""
    out = {rel: st.st_mtime_ns for rel, _, st in _walk(root)}
    if include_root:
        out["."] = os.lstat(root).st_mtime_ns
    return out


def hardlink_groups(root) -> list[tuple[str, ...]]:
    """Sorted groups of relpaths (non-directories) that share one inode."""
    by_inode: dict[tuple[int, int], list[str]] = {}
    for rel, _, st in _walk(root):
        if not stat.S_ISDIR(st.st_mode):
            by_inode.setdefault((st.st_dev, st.st_ino), []).append(rel)
    return sorted(tuple(sorted(g)) for g in by_inode.values() if len(g) > 1)


def xattrs(root) -> dict[str, dict[str, bytes]]:
    """relpath -> {name: value} for user.* extended attributes (non-symlinks)."""
    out = {}
    for rel, path, st in _walk(root):
        if stat.S_ISLNK(st.st_mode):
            continue
        names = sorted(n for n in os.listxattr(path) if n.startswith("user."))
        if names:
            out[rel] = {n: os.getxattr(path, n) for n in names}
    return out


def digest_diff(expected: dict, actual: dict, *, note=None) -> str:
    """Human-readable difference between two mappings ('' when equal).

    `note(relpath) -> str` can annotate entries (e.g. "fsynced").
    """
    note = note or (lambda rel: "")
    lines = []
    for rel in sorted(expected.keys() - actual.keys()):
        lines.append(f"missing: {rel} {note(rel)}".rstrip())
    for rel in sorted(actual.keys() - expected.keys()):
        lines.append(f"unexpected: {rel} = {_short(actual[rel])}")
    for rel in sorted(expected.keys() & actual.keys()):
        if expected[rel] != actual[rel]:
            lines.append(
                f"differs: {rel} {note(rel)}\n    expected {_short(expected[rel])}\n"
                f"    actual   {_short(actual[rel])}"
            )
    if len(lines) > 60:
        lines = lines[:60] + [f"... and {len(lines) - 60} more"]
    return "\n".join(lines)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) < 200 else text[:200] + "..."


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


BASE_TIME_NS = 1_600_000_000 * 1_000_000_000


def make_tree(root, seed: int = 0, *, hardlinks: bool = True) -> Path:
    """Generate a tree: nested dirs, files of boundary sizes, odd names,
    symlinks (relative, absolute, dangling, to a dir), optional hard links,
    assorted modes, and nanosecond mtimes on everything (dirs last).
    """
    rng = random.Random(seed)
    root = Path(root)
    root.mkdir(parents=True)
    dirs = {
        "": 0o755,
        "a": 0o755,
        "a/b": 0o750,
        "a/b/c": 0o700,
        "a/b/c/d": 0o755,
        "empty": 0o755,
        "with space": 0o755,
        "ünïcødé": 0o755,
        "readonly": 0o555,
    }
    for d in dirs:
        (root / d).mkdir(parents=True, exist_ok=True)
    sizes = [0, 1, 17, 4095, 4096, 4097, 65_543, 131_072, 300_001, 1_048_579]
    modes = [0o644, 0o600, 0o755, 0o640, 0o444, 0o700, 0o664]
    names = ["plain.txt", "with space.txt", ".hidden", "ünïcødé.bin", "x" * 200, "data.bin"]
    files = []
    i = 0
    for d in dirs:
        if d == "empty":
            continue
        for name in rng.sample(names, 3):
            rel = f"{d}/{name}".lstrip("/")
            size = sizes[i % len(sizes)]
            i += 1
            data = rng.randbytes(size) if i % 3 else (b"line %d\n" % i) * (size // 7 + 1)
            (root / rel).write_bytes(data[:size])
            os.chmod(root / rel, modes[i % len(modes)])
            files.append(rel)
    symlinks = {
        "link-to-file": "a/plain.txt" if (root / "a/plain.txt").exists() else files[0],
        "a/b/up-link": "../../" + files[0],
        "link-to-dir": "a/b",
        "dangling": "does/not/exist",
        "absolute": "/etc/hostname",
        "ünïcødé/self": ".",
    }
    for rel, target in symlinks.items():
        os.symlink(target, root / rel)
    if hardlinks:
        os.link(root / files[1], root / "a/b/hardlink-1")
        os.link(root / files[1], root / "with space/hardlink-2")
        os.link(root / files[5], root / "a/hardlink-3")
    # Times: files and symlinks first, then directories bottom-up.
    for rel in files + list(symlinks) + (["a/b/hardlink-1"] if hardlinks else []):
        t = BASE_TIME_NS + rng.randrange(10**17)
        os.utime(root / rel, ns=(t, t), follow_symlinks=False)
    for d in sorted(dirs, key=lambda d: -d.count("/") - (d != "")):
        os.chmod(root / d, dirs[d])
        t = BASE_TIME_NS + rng.randrange(10**17)
        os.utime(root / d if d else root, ns=(t, t))
    return root


# --------------------------------------------------------------------------
# Programs in the background (watchers, example apps)
# --------------------------------------------------------------------------


class Background:
    """A program in the background whose output lines (stdout and stderr) are
    collected with their arrival times. `ready`: a line to wait for before
    the constructor returns; `settle`: seconds to give a program that prints
    no such line; `stdin`: keep a pipe to its standard input (`send`), else
    it reads an empty one."""

    def __init__(self, argv, env=None, ready: str | None = None, settle: float = 0, ready_timeout: float = 30,
                 stdin: bool = False):
        self.proc = subprocess.Popen([str(a) for a in argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, text=True)
        self.timed: list[tuple[float, str]] = []
        self.lock = threading.RLock()
        self._ready = threading.Event()
        self._marker = ready
        threading.Thread(target=self._read, daemon=True).start()
        if ready is not None:
            assert self._ready.wait(ready_timeout), f"{argv[0]} did not start: {self.text()}"
        time.sleep(settle)

    def _read(self):
        for line in self.proc.stdout:
            with self.lock:
                self.timed.append((time.monotonic(), line.rstrip("\n")))
            if self._marker and self._marker in line:
                self._ready.set()

    def send(self, line: str | None) -> None:
        """A line to the program's standard input; None closes it."""
        if line is None:
            self.proc.stdin.close()
        else:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    @property
    def lines(self) -> list[str]:
        with self.lock:
            return [line for _, line in self.timed]

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, predicate, timeout: float = 15, after: float = 0.0, what: str = "") -> tuple[float, str]:
        """The first line since `after` (a `time.monotonic()`) that `predicate` accepts: (its time, the line)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for t, line in self.timed:
                    if t >= after and predicate(line):
                        return t, line
            time.sleep(0.02)
        raise AssertionError(f"no line {what} within {timeout}s; the program printed:\n{self.text()}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def background():
    """Start programs with `background(argv, …)`; each is stopped at the end of the test."""
    started: list[Background] = []

    def start(*args, **kwargs) -> Background:
        program = Background(*args, **kwargs)
        started.append(program)
        return program
    yield start
    for program in started:
        program.stop()
