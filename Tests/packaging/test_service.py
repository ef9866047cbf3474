"""The systemd user service: `ubiquityfs service` under a stand-in for
systemd's notify socket (a datagram socket of the test's, as $NOTIFY_SOCKET),
the daemon's own READY=1 in the foreground, and the unit file checked by
`systemd-analyze verify`. Whether a user systemd really runs it (login,
logout) is checked only where one runs (test_unit_under_user_systemd).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from conftest import PACKAGING, cleanup_mount, mount_type, need_root_and_fuse, stop_process, user_env, wait_until

UNIT = PACKAGING / "systemd" / "ubiquityfs.service"


class NotifySocket:
    """What systemd listens on for sd_notify(3): a datagram socket."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []

    def wait_for(self, key: str, timeout: float) -> str | None:
        """The first message (after those seen) with line `key=…`, or None."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.messages:
                if any(line.startswith(key + "=") for line in message.splitlines()):
                    return message
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except socket.timeout:
                return None

    def close(self):
        self.sock.close()


def daemon_pids(mountpoints):
    """The daemon pid of each mount (its source is ubiquityfs:PID)."""
    found = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] in {str(m) for m in mountpoints}:
                found[fields[4]] = int(fields[fields.index("-") + 2].split(":")[1])
    return found


@pytest.fixture
def service_setup(binary, base):
    need_root_and_fuse()
    if subprocess.run([str(binary), "service", "--help"], capture_output=True).returncode != 0:
        pytest.fail(f"{binary} has no `service` command")
    env = user_env(base / "home", binary)
    notify = NotifySocket(base / "notify")
    env["NOTIFY_SOCKET"] = str(notify.path)
    yield env, notify
    notify.close()


def test_service_mounts_remembered_and_configured_then_unmounts_on_sigterm(binary, base, service_setup):
    env, notify = service_setup
    cloud, notes, team = base / "Cloud", base / "Notes", base / "Team"
    team_store = base / "team-store"
    for d in (cloud, notes, team, team_store):
        d.mkdir()
    # Team: remembered in mounts.json by a mount with --store (then unmounted).
    p = subprocess.run([str(binary), "mount", str(team), "--store", str(team_store)], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert subprocess.run([str(binary), "unmount", str(team)], env=env, capture_output=True, timeout=120).returncode == 0
    remembered = json.loads((Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs/mounts.json").read_text())
    assert str(team) in remembered
    # Cloud and Notes: the default store, from service.conf.
    conf = Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs/service.conf"
    conf.write_text(f"# test\n{cloud}\n{notes} --container com.example.notes --scope documents   # notes\n\n")
    service = subprocess.Popen([str(binary), "service"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = notify.wait_for("READY", timeout=120)
        assert ready is not None, "no READY=1"
        assert "STATUS=3 of 3 mounted" in ready
        assert all(mount_type(m) == "fuse.ubiquityfs" for m in (cloud, notes, team))
        pids = daemon_pids([cloud, notes, team])
        assert pids[str(cloud)] == pids[str(notes)] != pids[str(team)]   # one daemon per store
        assert all(Path(f"/proc/{pid}/status").read_text().split("PPid:")[1].split()[0] == str(service.pid)
                   for pid in pids.values()), "the daemons are the service's children"
        (cloud / "a.txt").write_text("to push")
        (team / "b.txt").write_text("to push too")
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=120) == 0
        output = service.stdout.read()
        assert notify.wait_for("STOPPING", timeout=1) is not None
        assert all(mount_type(m) is None for m in (cloud, notes, team)), output
        assert output.count("every change is in the store") == 3, output
        assert all(not Path(f"/proc/{pid}").exists() for pid in pids.values())
        # The journal gets the daemons' logs.
        assert "FUSE loop of" in output, output
    finally:
        stop_process(service)
        for m in (cloud, notes, team):
            cleanup_mount(m)


def test_service_fails_when_a_daemon_dies_and_cleans_its_mount(binary, base, service_setup):
    env, notify = service_setup
    cloud = base / "Cloud"
    cloud.mkdir()
    (Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs").mkdir(parents=True)
    (Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs/service.conf").write_text(f"{cloud}\n")
    service = subprocess.Popen([str(binary), "service"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert notify.wait_for("READY", timeout=120) is not None
        pid = daemon_pids([cloud])[str(cloud)]
        os.kill(pid, signal.SIGKILL)
        assert service.wait(timeout=60) == 1   # Restart=on-failure starts it again
        output = service.stdout.read()
        assert f"daemon {pid} died" in output, output
        assert mount_type(cloud) is None, "the dead mount is detached"
        # Started again (as systemd would), it mounts again.
        notify.messages.clear()
        again = subprocess.Popen([str(binary), "service"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert notify.wait_for("READY", timeout=120) is not None
            assert mount_type(cloud) == "fuse.ubiquityfs"
            again.send_signal(signal.SIGTERM)
            assert again.wait(timeout=120) == 0
        finally:
            stop_process(again)
    finally:
        stop_process(service)
        cleanup_mount(cloud)


def test_service_with_nothing_to_mount_says_so(binary, base, service_setup):
    env, notify = service_setup
    p = subprocess.run([str(binary), "service"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    assert "nothing to mount" in p.stdout
    assert "nothing to mount" in (notify.wait_for("READY", timeout=5) or "")


def test_service_ends_when_every_mount_is_unmounted_by_hand(binary, base, service_setup):
    env, notify = service_setup
    cloud = base / "Cloud"
    cloud.mkdir()
    (Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs").mkdir(parents=True)
    (Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs/service.conf").write_text(f"{cloud}\n")
    service = subprocess.Popen([str(binary), "service"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert notify.wait_for("READY", timeout=120) is not None
        assert subprocess.run([str(binary), "unmount", str(cloud)], env=env, capture_output=True, timeout=60).returncode == 0
        assert service.wait(timeout=30) == 0
        assert "every mount was unmounted" in service.stdout.read()
    finally:
        stop_process(service)
        cleanup_mount(cloud)


def test_service_keeps_what_was_mounted_and_what_joins_its_daemon(binary, base, service_setup):
    """A mountpoint mounted by hand before the service starts is kept and unmounted at stop; a mount made by
    hand of a store the service serves joins its daemon and ends with the service, its changes pushed."""
    env, notify = service_setup
    cloud, extra = base / "Cloud", base / "Extra"
    for d in (cloud, extra):
        d.mkdir()
    assert subprocess.run([str(binary), "mount", str(cloud)], env=env, capture_output=True, timeout=120).returncode == 0
    (Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs").mkdir(parents=True, exist_ok=True)
    (Path(env["XDG_CONFIG_HOME"]) / "ubiquityfs/service.conf").write_text(f"{cloud}\n")
    service = subprocess.Popen([str(binary), "service"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = notify.wait_for("READY", timeout=120)
        assert ready is not None and "STATUS=1 of 1 mounted (1 already were)" in ready, ready
        p = subprocess.run([str(binary), "mount", str(extra), "--container", "com.example.extra"], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert daemon_pids([cloud, extra])[str(cloud)] == daemon_pids([cloud, extra])[str(extra)]
        (extra / "e.txt").write_text("joined")
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=120) == 0
        output = service.stdout.read()
        assert mount_type(cloud) is None and mount_type(extra) is None, output
        assert output.count("every change is in the store") == 2, output
    finally:
        stop_process(service)
        for m in (cloud, extra):
            cleanup_mount(m)


def test_foreground_daemon_says_ready(binary, base, service_setup):
    """`ubiquityfs mount --foreground` under systemd (Type=notify) tells it when the mount is ready."""
    env, notify = service_setup
    mnt = base / "mnt"
    mnt.mkdir()
    daemon = subprocess.Popen([str(binary), "mount", str(mnt), "--foreground"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        ready = notify.wait_for("READY", timeout=120)
        assert ready is not None and f"STATUS=serving {mnt}" in ready
        assert mount_type(mnt) == "fuse.ubiquityfs"
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    finally:
        stop_process(daemon)
        cleanup_mount(mnt)


def verify(unit: Path, base: Path, *extra: str):
    runtime = base / "runtime"
    runtime.mkdir(exist_ok=True)
    runtime.chmod(0o700)
    return subprocess.run(["systemd-analyze", "verify", "--user", *extra, str(unit)], capture_output=True, text=True,
                          env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)), timeout=60)


def test_unit_file_verifies(binary, base):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed (bash Packaging/install-deps.sh package)")
    text = UNIT.read_text()
    assert "Type=notify" in text and "Restart=on-failure" in text and "ExecStart=/usr/bin/ubiquityfs service" in text
    # The unit as installed, but with this build's binary; its man pages come with the package (not checked here).
    unit = base / "ubiquityfs.service"
    unit.write_text(text.replace("/usr/bin/ubiquityfs", str(binary)))
    p = verify(unit, base, "--man=no")
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_installed_unit_verifies_with_its_man_pages(base):
    installed = Path("/usr/lib/systemd/user/ubiquityfs.service")
    if not installed.exists():
        pytest.skip("the package is not installed (test_deb installs and removes it)")
    p = verify(installed, base)
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_unit_under_user_systemd():
    if Path("/proc/1/comm").read_text().strip() != "systemd" or not os.environ.get("DBUS_SESSION_BUS_ADDRESS"):
        pytest.skip("no user systemd here (PID 1 is not systemd, or no user session bus): "
                    "`systemctl --user enable --now ubiquityfs` cannot be run")
    p = subprocess.run(["systemctl", "--user", "cat", "ubiquityfs"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
