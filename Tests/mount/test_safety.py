"""Safety and privacy on real mounts (issue #9, part 1).

What a new user could do by mistake, or another user on purpose:
  * `unmount` of something that is not this device's ubiquityfs mount
    (a tmpfs, another device's mount) is refused and leaves it alone;
  * `unmount` and `status` from another shell (another XDG_RUNTIME_DIR) find
    the daemon from the mount itself, and never take a live mount for dead;
  * a mount table longer than a page still shows every mount;
  * a deep predicate or an oversized request is refused with an error, and
    neither the CLI nor the daemon crashes;
  * `status` reports every mount it can reach and names the others;
  * store, replica and runtime files are owner-only (a shared store is 0770/0640);
  * a runtime directory that another user owns, or that is not 0700, is refused;
  * an ordinary user can mount; when /dev/fuse cannot be opened, the message
    says so.

Scenarios that add mounts others would see (many tmpfs, a bind mount over
/dev/fuse) run in a private mount namespace (`unshare --mount`), so other
mount tests running on the machine never see them.
"""

from __future__ import annotations

import grp
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import (
    BIN,
    CONTROL_PROTOCOL,
    EXIT_TIMEOUT,
    Device,
    is_mounted,
    lazy_unmount,
    pid_alive,
    require_fuse_and_binary,
    wait_pid_exit,
    wait_until,
)

pytestmark = pytest.mark.daemon

NOBODY = 65534


def control_socket(dev: Device, env: dict | None = None) -> str:
    """The control socket of dev's mount, named as every version names it:
    the runtime directory, then the first 24 hex digits of SHA-256(mountpoint)."""
    env = env or dev.env()
    xdg = env.get("XDG_RUNTIME_DIR", "")
    runtime = (
        os.path.join(xdg, "ubiquityfs")
        if xdg.startswith("/") and os.access(xdg, os.W_OK)
        else f"/tmp/ubiquityfs-{os.getuid()}"
    )
    name = hashlib.sha256(os.fsencode(os.path.realpath(dev.mountpoint))).hexdigest()[:24]
    return os.path.join(runtime, name + ".sock")


def request(path: str, data: bytes, timeout: float = 60) -> bytes:
    """Send raw bytes to a control socket; everything it answers until it closes."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(timeout)
    s.connect(path)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the daemon stopped reading (too large) and answered
    out = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def as_user(uid: int, gid: int, *cmd, groups: str | None = None, env=None, timeout=60):
    """Run `cmd` with another uid/gid (setpriv: no shell, no PAM)."""
    group_arg = f"--groups={groups}" if groups else "--clear-groups"
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={gid}", group_arg, "--", *map(str, cmd)],
        capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL,
    )


def in_private_namespace(script: str, *args, timeout: float = 120) -> dict:
    """Run a Python `script` as root in a private mount namespace; it prints
    one JSON object last. Mounts made there vanish with the namespace."""
    if not shutil.which("unshare"):
        pytest.skip("unshare (util-linux) is needed for a private mount namespace")
    proc = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", textwrap.dedent(script),
         *map(str, args)],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0 and proc.stdout.strip(), (
        f"namespace script failed ({proc.returncode}):\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Shared by the namespace scripts: run the CLI, remember daemons, clean up.
NAMESPACE_PRELUDE = """
import json, os, re, signal, stat, subprocess, sys, time
daemons = []
def cli(*args, env=None, user=None):
    argv = [BIN, *map(str, args)]
    if user:
        argv = ["setpriv", f"--reuid={user[0]}", f"--regid={user[1]}", "--clear-groups", "--", *argv]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)
    m = re.search(r"daemon pid (\\d+)", p.stdout)
    if m:
        daemons.append(int(m.group(1)))
    return {"rc": p.returncode, "text": p.stdout + p.stderr}
def mounted_at(path):
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split(" ")[4] == path)
def detach_inherited_fuse_mounts():
    # The namespace starts with a copy of every mount of the machine. A copy
    # of another test's FUSE mount would keep its connection (and daemon)
    # alive after that test unmounts it: detach the copies first.
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    for line in reversed(lines):
        fields, _, rest = line.partition(" - ")
        if rest.split(" ")[0].startswith("fuse"):
            subprocess.run(["umount", "-l", fields.split(" ")[4].replace("\\\\040", " ")], capture_output=True)
detach_inherited_fuse_mounts()
def cleanup(*mountpoints):
    for mp in mountpoints:
        for _ in range(5):
            if not mounted_at(mp):
                break
            subprocess.run(["umount", "-l", mp], capture_output=True)
    for pid in daemons:
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
"""


@pytest.fixture
def runtime_dir():
    """A private XDG_RUNTIME_DIR with a short path (socket paths are limited
    to 107 bytes; pytest's tmp paths are long)."""
    path = Path(tempfile.mkdtemp(prefix="ubq-rt-", dir="/tmp"))
    os.chmod(path, 0o700)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def open_base(request):
    """A folder in /tmp that other users can traverse (pytest's own tmp dir is
    0700), with a device factory like `make_device`. Removed afterwards."""
    require_fuse_and_binary()
    base = Path(tempfile.mkdtemp(prefix="ubq-safety-", dir="/tmp"))
    os.chmod(base, 0o755)
    devices: list[Device] = []

    def factory(name, store, *, mount=True):
        dev = Device(base, store, name)
        devices.append(dev)
        if mount:
            dev.mount()
        return dev

    factory.base = base
    yield factory
    problems = []
    for dev in reversed(devices):
        problems += dev.close()
    shutil.rmtree(base, ignore_errors=True)
    if problems:
        pytest.fail("teardown found problems:\n" + "\n".join(problems), pytrace=False)


# --------------------------------------------------------------------------
# unmount acts only on this device's ubiquityfs mounts
# --------------------------------------------------------------------------


def test_unmount_refuses_a_filesystem_that_is_not_ubiquityfs(make_device, tmp_path):
    dev = make_device("a", mount=False)
    target = tmp_path / "tmpfs"
    target.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "ubq-test", str(target)], check=True)
    try:
        (target / "precious").write_text("keep me")
        for args in (["unmount", str(target)], ["unmount", "--force", str(target)]):
            res = dev.cli(*args, timeout=60)
            assert res.returncode == 1, f"unmount of a tmpfs must be refused:\n{res}"
            assert "not a ubiquityfs mount" in res.stderr, res
            assert is_mounted(target), f"the tmpfs was unmounted:\n{res}"
            assert (target / "precious").read_text() == "keep me"
    finally:
        if is_mounted(target):
            subprocess.run(["umount", "-l", str(target)], check=True)


def test_unmount_refuses_another_devices_mount(make_device):
    a = make_device("a")
    b = make_device("b", mount=False)  # another device (data home) of the same user
    (a.mountpoint / "f.txt").write_text("a's")
    for args in (["unmount", str(a.mountpoint)], ["unmount", "--force", str(a.mountpoint)],
                 ["status", str(a.mountpoint)], ["pin", str(a.mountpoint / "f.txt")]):
        res = b.cli(*args, timeout=60)
        assert res.returncode == 1, f"another device's mount must be refused:\n{res}"
        assert "another device or user" in res.stderr, res
    assert a.is_mounted() and pid_alive(a.pid)
    assert (a.mountpoint / "f.txt").read_text() == "a's"


def test_unmount_from_another_shell_finds_the_daemon(runtime_dir, make_device):
    """Another XDG_RUNTIME_DIR (another login, su, cron): the daemon is found
    from the mount, the unmount is the graceful one; a dead daemon's mount is
    still cleaned up."""
    elsewhere = {"XDG_RUNTIME_DIR": str(runtime_dir)}
    a = make_device("a")
    (a.mountpoint / "note.txt").write_text("pushed before unmount")
    res = a.cli("status", str(a.mountpoint), timeout=60, extra_env=elsewhere)
    assert res.returncode == 0 and f"daemon pid {a.pid}" in res.stdout, res
    res = a.cli("unmount", str(a.mountpoint), timeout=600, extra_env=elsewhere)
    assert res.returncode == 0, res
    assert "every change is in the store" in res.stdout, f"the live daemon was not asked:\n{res}"
    assert not a.is_mounted() and wait_pid_exit(a.pid, EXIT_TIMEOUT)
    a.pid = None
    # What the store has: a second device sees the file.
    b = make_device("b")
    assert wait_until(lambda: (b.mountpoint / "note.txt").exists(), 20)
    assert (b.mountpoint / "note.txt").read_text() == "pushed before unmount"

    # A daemon killed with -9: its mount is dead, and is cleaned from anywhere.
    a.mount()
    pid = a.pid
    os.kill(pid, signal.SIGKILL)
    assert wait_pid_exit(pid, EXIT_TIMEOUT)
    res = a.cli("unmount", str(a.mountpoint), timeout=60, extra_env=elsewhere)
    assert res.returncode == 0 and "was not running" in res.stdout, res
    assert lazy_unmount(a.mountpoint)
    a.pid = None


# --------------------------------------------------------------------------
# The mount table is read whole
# --------------------------------------------------------------------------


def test_mounts_listed_after_the_first_page_of_the_mount_table(tmp_path, store):
    """With 16 KiB of mounts before ours (a desktop with snaps has more), every
    command still sees the mount, and a second mount cannot be stacked on it."""
    require_fuse_and_binary()
    store2 = tmp_path / "store2"
    store2.mkdir()
    (tmp_path / "mnt").mkdir()
    out = in_private_namespace(NAMESPACE_PRELUDE + """
        BIN, base, store, store2 = sys.argv[1:5]
        mp = base + "/mnt"
        env = dict(os.environ, XDG_DATA_HOME=base + "/data")
        pads, out = [], {}
        try:
            while len(open("/proc/self/mountinfo").read()) < 16384 and len(pads) < 500:
                pad = f"{base}/pad/{len(pads):03d}"
                os.makedirs(pad)
                subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "ubq-pad", pad], check=True)
                pads.append(pad)
            out["table"] = len(open("/proc/self/mountinfo").read())
            out["mount"] = cli("mount", mp, "--store", store, env=env)
            out["stacked"] = cli("mount", mp, "--store", store2, env=env)
            out["mounts_at_mp"] = mounted_at(mp)
            with open(mp + "/file.txt", "w") as f:
                f.write("hello")
            for command in ("pin", "versions", "download"):
                out[command] = cli(command, mp + "/file.txt", env=env)
            for _ in range(100):   # evict waits for the file to be pushed
                out["evict"] = cli("evict", mp + "/file.txt", env=env)
                if out["evict"]["rc"] == 0 or "not yet pushed" not in out["evict"]["text"]:
                    break
                time.sleep(0.1)
            out["status"] = cli("status", mp, env=env)
            out["unmount"] = cli("unmount", mp, env=env)
            out["left"] = mounted_at(mp)
        finally:
            cleanup(mp, *reversed(pads))
        print(json.dumps(out))
    """.replace("\n        ", "\n"), BIN, tmp_path, store, store2)
    assert out["table"] >= 16384
    assert out["mount"]["rc"] == 0, out["mount"]
    assert out["stacked"]["rc"] == 1 and "already mounted" in out["stacked"]["text"], out["stacked"]
    assert out["mounts_at_mp"] == 1, "a second mount was stacked on the first"
    for command in ("pin", "versions", "download", "evict", "status", "unmount"):
        assert out[command]["rc"] == 0, f"{command}: {out[command]}"
    assert "file.txt" in out["versions"]["text"]
    assert out["left"] == 0


# --------------------------------------------------------------------------
# Nothing a client sends crashes the CLI or the daemon
# --------------------------------------------------------------------------


def test_deep_predicates_and_oversized_requests_are_refused(make_device):
    a = make_device("a")
    (a.mountpoint / "f.txt").write_text("x")
    deep = "(" * 15000 + "TRUEPREDICATE" + ")" * 15000
    res = a.cli("query", str(a.mountpoint), "--predicate", deep, timeout=60)
    assert res.returncode is not None and res.returncode > 0, f"the CLI crashed or hung:\n{res}"
    assert "nests more than 100 levels" in res.stderr, res

    sock = control_socket(a)
    replies = {
        "deep predicate": request(sock, json.dumps({"protocol": CONTROL_PROTOCOL, "command": "query",
                                                    "predicate": deep}).encode() + b"\n"),
        "2 MiB request": request(sock, b'{"command":"status","pad":"' + b"x" * (2 << 20) + b'"}\n'),
        "deep JSON": request(sock, b"[" * 500_000 + b"\n"),
        "not JSON": request(sock, b"\xff\xfe\n"),
    }
    assert b"nests more than 100 levels" in replies["deep predicate"], replies["deep predicate"][:300]
    assert b"request too large" in replies["2 MiB request"], replies["2 MiB request"][:300]
    assert b"not a JSON object" in replies["deep JSON"], replies["deep JSON"][:300]
    assert b"not a JSON object" in replies["not JSON"], replies["not JSON"][:300]
    # A long flat chain is fine (no depth): 60,000 comparisons in one request.
    chain = " AND ".join(["size >= 0"] * 60_000)
    reply = request(sock, json.dumps({"protocol": CONTROL_PROTOCOL, "command": "query", "predicate": chain}).encode() + b"\n")
    assert b"f.txt" in reply and b'"ok":true' in reply, reply[-300:]

    assert pid_alive(a.pid), "the daemon died"
    assert (a.mountpoint / "f.txt").read_text() == "x"
    res = a.cli("status", str(a.mountpoint), timeout=60)
    assert res.returncode == 0, res


# --------------------------------------------------------------------------
# status reports every mount it can reach
# --------------------------------------------------------------------------


def test_status_reports_every_mount_it_can_reach(runtime_dir, make_device):
    other_runtime = runtime_dir
    b = make_device("b", mount=False)  # another device, in another runtime dir, mounted first
    b.env = lambda: {**Device.env(b), "XDG_RUNTIME_DIR": str(other_runtime)}
    b.mount()
    a = make_device("a")
    res = a.cli("status", timeout=60)
    assert res.returncode == 0, res
    assert f"Mount:        {os.path.realpath(a.mountpoint)}" in res.stdout, res
    assert str(b.mountpoint) not in res.stdout, res
    assert "not shown" in res.stderr and str(b.mountpoint) in res.stderr, res
    res = a.cli("status", "--json", timeout=60)
    assert res.returncode == 0, res
    assert any(json.loads(line)["pid"] == a.pid for line in res.stdout.splitlines()), res


# --------------------------------------------------------------------------
# Permissions
# --------------------------------------------------------------------------


def modes_under(root: Path) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [""] + dirnames + filenames:
            path = os.path.join(dirpath, name) if name else dirpath
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode):
                out[os.path.relpath(path, root)] = stat.S_IMODE(st.st_mode)
    return out


def blob_of(store: Path, content: bytes) -> Path:
    digest = hashlib.sha256(content).hexdigest()
    return store / "blobs" / digest[:2] / digest


def test_store_replica_and_runtime_files_are_owner_only(open_base):
    base = open_base.base
    store = base / "store"
    store.mkdir(mode=0o755)
    old_umask = os.umask(0)  # the most permissive umask: modes must not depend on it
    try:
        a = open_base("a", store)
    finally:
        os.umask(old_umask)
    secret = b"the secret content of a chmod 600 file\n"
    (a.mountpoint / "secret-name.txt").write_bytes(secret)
    os.chmod(a.mountpoint / "secret-name.txt", 0o600)
    a.unmount()  # everything pushed

    loose = {f"store/{p}": oct(m) for p, m in modes_under(store).items() if m & 0o077}
    loose.update({f"data/{p}": oct(m) for p, m in modes_under(a.data_home / "ubiquityfs").items() if m & 0o077})
    assert not loose, f"readable by others: {loose}"
    blob = blob_of(store, secret)
    assert blob.exists()
    index = next((a.data_home / "ubiquityfs" / "replicas").glob("*/*/index.sqlite"))
    for path in (blob, index):
        res = as_user(NOBODY, NOBODY, "cat", path)
        assert res.returncode != 0 and "Permission denied" in res.stderr, f"another user read {path}: {res}"

    # The runtime directory and what is in it, while mounted.
    a.mount()
    runtime = Path(control_socket(a)).parent
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
    for entry in runtime.iterdir():
        assert stat.S_IMODE(entry.lstat().st_mode) & 0o077 == 0, entry


def test_shared_store_is_for_its_folders_group(open_base):
    base = open_base.base
    store = base / "shared-store"
    store.mkdir()
    group = grp.getgrnam("users").gr_gid if "users" in {g.gr_name for g in grp.getgrall()} else 100
    os.chown(store, 0, group)
    os.chmod(store, 0o2770)
    a = open_base("a", store, mount=False)
    a.mount_args = ("--shared-store",)
    a.mount()
    content = b"shared with the group\n"
    (a.mountpoint / "team.txt").write_bytes(content)
    a.unmount()
    for path, mode in modes_under(store).items():
        full = store / path
        if full.is_dir():
            assert mode == 0o2770, f"{path}: {oct(mode)}"
        elif path != "ubiquityfs-store.json":
            assert mode == 0o640, f"{path}: {oct(mode)}"
    member = as_user(NOBODY, NOBODY, "cat", blob_of(store, content), groups=str(group))
    assert member.returncode == 0 and member.stdout == content.decode(), member
    stranger = as_user(NOBODY, NOBODY, "cat", blob_of(store, content))
    assert stranger.returncode != 0, stranger
    # The replica stays private.
    assert not {p: m for p, m in modes_under(a.data_home / "ubiquityfs").items() if m & 0o077}
    # A private store refuses --shared-store (its files are its owner's only).
    private = base / "private-store"
    private.mkdir()
    b = open_base("b", private)
    b.unmount()
    b.mount_args = ("--shared-store",)
    res = b.mount(check=False)
    assert res.returncode == 1 and "is private" in res.text, res


def test_runtime_directory_must_be_the_users_own_and_private(runtime_dir, make_device):
    xdg = runtime_dir
    hijacked = xdg / "ubiquityfs"
    hijacked.mkdir()
    os.chown(hijacked, NOBODY, NOBODY)
    os.chmod(hijacked, 0o777)
    a = make_device("a", mount=False)
    a.env = lambda: {**Device.env(a), "XDG_RUNTIME_DIR": str(xdg)}
    res = a.mount(check=False)
    assert res.returncode == 1 and f"belongs to uid {NOBODY}" in res.text, res
    assert not a.is_mounted()
    os.chown(hijacked, os.getuid(), os.getgid())
    os.chmod(hijacked, 0o755)
    res = a.mount(check=False)
    assert res.returncode == 1 and "its mode is 755" in res.text, res
    assert not a.is_mounted()
    os.chmod(hijacked, 0o700)
    a.mount()
    a.unmount()


# --------------------------------------------------------------------------
# An ordinary user
# --------------------------------------------------------------------------


@pytest.fixture
def ordinary_user():
    """A system user made for the test (removed after), or a skip saying
    why this machine cannot run FUSE as an ordinary user."""
    if os.geteuid() != 0:
        pytest.skip("creating a test user needs root")
    for tool in ("useradd", "userdel", "setpriv", "unshare"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    fusermount = shutil.which("fusermount3")
    if not fusermount:
        pytest.skip("fusermount3 is not installed (fuse3)")
    st = os.stat(fusermount)
    if st.st_uid != 0 or not st.st_mode & stat.S_ISUID:
        pytest.skip(f"{fusermount} is not set-uid root: ordinary users cannot mount here")
    with open("/proc/self/status") as f:
        if any(line.startswith("NoNewPrivs:") and line.split()[1] != "0" for line in f):
            pytest.skip("no_new_privs is set: set-uid fusermount3 cannot work")
    name = f"ubqsafety{os.getpid() % 100000}"
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
                           "--shell", "/usr/sbin/nologin", "--user-group", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot create a test user: {made.stderr.strip()}")
    try:
        import pwd
        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)


USER_SCRIPT = NAMESPACE_PRELUDE + """
BIN, base, uid, gid, node_mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5], 8)
user = (uid, gid)
nodes = base + "/devnodes"
os.makedirs(nodes)
subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=755", "ubq-devnodes", nodes], check=True)
os.mknod(nodes + "/fuse", stat.S_IFCHR | 0o600, os.makedev(10, 229))
os.chmod(nodes + "/fuse", node_mode)
subprocess.run(["mount", "--bind", nodes + "/fuse", "/dev/fuse"], check=True)
home = base + "/home"
for d in (home, home + "/run", home + "/mnt", home + "/store"):
    os.makedirs(d, mode=0o700)
    os.chown(d, uid, gid)
mp = home + "/mnt"
env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "XDG_DATA_HOME": home + "/data",
       "XDG_RUNTIME_DIR": home + "/run"}
out = {}
try:
    out["mount"] = cli("mount", mp, "--store", home + "/store", env=env, user=user)
    if out["mount"]["rc"] == 0:
        p = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", "sh", "-c",
                            f"echo hello > {mp}/mine.txt && cat {mp}/mine.txt && stat -c %u {mp}/mine.txt"],
                           capture_output=True, text=True, timeout=30)
        out["write"] = {"rc": p.returncode, "text": p.stdout + p.stderr}
        out["status"] = cli("status", env=env, user=user)
        out["root_unmount"] = cli("unmount", mp, env=dict(env, XDG_DATA_HOME="/nonexistent-data-home"))
        out["unmount"] = cli("unmount", mp, env=env, user=user)
        out["left"] = mounted_at(mp)
    out["allow_other"] = cli("mount", mp, "--store", home + "/store", "-o", "allow_other", env=env, user=user)
finally:
    cleanup(mp)
print(json.dumps(out))
"""


def test_ordinary_user_mounts_and_unmounts(ordinary_user, open_base):
    uid, gid = ordinary_user
    out = in_private_namespace(USER_SCRIPT, BIN, open_base.base, uid, gid, "666")
    assert out["mount"]["rc"] == 0, out["mount"]
    assert out["write"]["rc"] == 0 and out["write"]["text"].split() == ["hello", str(uid)], out["write"]
    assert out["status"]["rc"] == 0 and "Mount:" in out["status"]["text"], out["status"]
    # root, as another device, may not unmount the user's mount with ubiquityfs.
    assert out["root_unmount"]["rc"] == 1 and "another device or user" in out["root_unmount"]["text"]
    assert out["unmount"]["rc"] == 0 and "every change is in the store" in out["unmount"]["text"], out["unmount"]
    assert out["left"] == 0
    fuse_conf = Path("/etc/fuse.conf").read_text() if Path("/etc/fuse.conf").exists() else ""
    if not any(line.strip() == "user_allow_other" for line in fuse_conf.splitlines()):
        assert out["allow_other"]["rc"] == 1 and "user_allow_other" in out["allow_other"]["text"], out["allow_other"]


def test_ordinary_user_without_dev_fuse_access_is_told_why(ordinary_user, open_base):
    uid, gid = ordinary_user
    out = in_private_namespace(USER_SCRIPT, BIN, open_base.base, uid, gid, "600")
    text = out["mount"]["text"]
    assert out["mount"]["rc"] == 1, out["mount"]
    assert "/dev/fuse" in text and "Permission denied" in text, text
    assert "is /dev/fuse available" not in text, text
