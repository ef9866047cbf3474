"""Fixtures for the packaging tests (Tests/packaging/README.md).

The binary is UBIQUITYFS_BIN, else .build/debug/ubiquityfs, copied to a
temporary folder first (a build may replace it while the tests run). The
mount(8) helpers come from Packaging/mount: tests that go through mount(8)
put them in /usr/sbin for their duration (mount(8) looks only in /sbin),
unless the same files are there already, and take them away after.
"""
from __future__ import annotations

import filecmp
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "Packaging"
HELPERS = ["mount.fuse.ubiquityfs", "umount.fuse.ubiquityfs", "umount.ubiquityfs"]


def need_root_and_fuse():
    if os.geteuid() != 0:
        pytest.skip("real mounts through mount(8) need root")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("/dev/fuse is missing")
    if not shutil.which("fusermount3"):
        pytest.skip("fusermount3 is not installed (fuse3)")


@pytest.fixture(scope="session")
def binary() -> Path:
    source = Path(os.environ.get("UBIQUITYFS_BIN") or REPO / ".build" / "debug" / "ubiquityfs")
    if not source.exists():
        pytest.skip(f"{source} is not built (swift build)")
    folder = Path(tempfile.mkdtemp(prefix="pkg-bin-", dir="/tmp"))
    folder.chmod(0o755)   # a test user runs it too
    copy = folder / "ubiquityfs"
    shutil.copy2(source, copy)
    yield copy
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def base() -> Path:
    """A folder /tmp/pkg-* that other users can traverse (pytest's tmp_path is root's only)."""
    path = Path(tempfile.mkdtemp(prefix="pkg-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    with open("/proc/self/mountinfo") as f:   # what a failed test left mounted in it
        left = [line.split()[4] for line in f if line.split()[4].startswith(str(path) + "/")]
    for mounted in sorted(left, reverse=True):
        cleanup_mount(Path(mounted))
    shutil.rmtree(path, ignore_errors=True)


def user_env(home: Path, binary: Path | None = None) -> dict:
    """An environment whose data, configuration and runtime folders are under `home`."""
    for sub in ("data", "config", "run"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    (home / "run").chmod(0o700)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "XDG_DATA_HOME": str(home / "data"),
           "XDG_CONFIG_HOME": str(home / "config"), "XDG_RUNTIME_DIR": str(home / "run"), "LANG": "C.UTF-8"}
    if binary is not None:
        env["UBIQUITYFS"] = str(binary)
    return env


def mount_type(path: Path) -> str | None:
    """The filesystem type mounted exactly at `path`, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            target = fields[4].replace("\\040", " ")
            if target == str(path):
                return fields[fields.index("-") + 1]
    return None


def mount_options(path: Path) -> dict:
    """The super-block options of the mount at `path` (user_id=… for FUSE)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(path):
                supers = fields[fields.index("-") + 3].split(",")
                return dict(o.split("=", 1) if "=" in o else (o, "") for o in supers) | {"_vfs": fields[5]}
    return {}


def cleanup_mount(path: Path):
    """Unmount `path` if a test left it mounted (only our own /tmp mounts)."""
    if mount_type(path) is not None:
        subprocess.run(["fusermount3", "-u", "-z", str(path)], capture_output=True)
        if mount_type(path) is not None:
            subprocess.run(["umount", "-l", "-i", str(path)], capture_output=True)


def wait_until(predicate, timeout=30.0, step=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.fixture(scope="session")
def helpers_installed():
    """The helpers where mount(8) finds them (/usr/sbin), for this session."""
    need_root_and_fuse()
    made = []
    for name in HELPERS:
        target = Path("/usr/sbin") / name
        source = PACKAGING / "mount" / (name if name != "umount.ubiquityfs" else "umount.fuse.ubiquityfs")
        if target.exists():
            if not filecmp.cmp(source, target, shallow=False):
                pytest.skip(f"{target} is another version than {source} (an installed package?); not replacing it")
            continue
        shutil.copy2(source, target)
        made.append(target)
    yield
    for target in made:
        target.unlink(missing_ok=True)


@pytest.fixture
def test_user(base):
    """A system user made for the test, with a home in `base` (removed after)."""
    need_root_and_fuse()
    fusermount = shutil.which("fusermount3")
    st = os.stat(fusermount)
    if st.st_uid != 0 or not st.st_mode & 0o4000:
        pytest.skip(f"{fusermount} is not set-uid root: ordinary users cannot mount here")
    with open("/proc/self/status") as f:
        if any(line.startswith("NoNewPrivs:") and line.split()[1] != "0" for line in f):
            pytest.skip("no_new_privs is set: set-uid fusermount3 cannot work")
    for tool in ("useradd", "userdel", "runuser"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    name = f"ubqpkg{os.getpid() % 100000}"
    home = base / name
    made = subprocess.run(["useradd", "--system", "--create-home", "--home-dir", str(home), "--shell", "/usr/sbin/nologin",
                           "--user-group", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create a test user: {made.stderr.strip()}")
    entry = pwd.getpwnam(name)
    try:
        yield entry
    finally:
        for pid in processes_of(entry.pw_uid):   # only this test's user's, by pid
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


def processes_of(uid: int) -> list[int]:
    """The pids of `uid`'s processes."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            uids = next((line.split()[1:] for line in status.splitlines() if line.startswith("Uid:")), [])
            if uids and int(uids[0]) == uid:
                pids.append(int(entry.name))
    return pids


def stop_process(process: subprocess.Popen):
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
