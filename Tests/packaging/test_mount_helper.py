"""mount(8) and fstab: the helpers in Packaging/mount, with the built binary.

The option mapping is checked with `-f` (mount(8)'s fake mode: the helper
prints the command it would run); real mounts go through `mount -t
fuse.ubiquityfs`, `mount -T FSTAB` (a test fstab, never /etc/fstab) and
`umount`, as root, and with `setuid=USER` for a test user.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import (PACKAGING, cleanup_mount, mount_options, mount_type, need_root_and_fuse, processes_of,
                      user_env)

HELPER = PACKAGING / "mount" / "mount.fuse.ubiquityfs"
UMOUNT_HELPER = PACKAGING / "mount" / "umount.fuse.ubiquityfs"


def fake(store: str, options: str, *flags: str, env=None):
    """The command the helper would run (its -f output), and its exit status."""
    p = subprocess.run(["sh", str(HELPER), store, "/mnt/x", "-f", *flags, "-o", options], capture_output=True,
                       text=True, env=env or dict(os.environ, UBIQUITYFS="/usr/bin/ubiquityfs"))
    return p.returncode, p.stderr.strip()


def test_options_map_to_mount_flags():
    rc, out = fake("default", "container=com.example.notes,scope=documents,cache-size=20G,device-name=laptop,"
                              "poll-interval=5,_netdev,nofail,noauto,user,users,x-systemd.automount,"
                              "x-systemd.idle-timeout=60,comment=x,defaults,rw")
    assert rc == 0, out
    assert out == ("mount.fuse.ubiquityfs: /usr/bin/ubiquityfs mount /mnt/x --container com.example.notes "
                   "--scope documents --cache-size 20G --device-name laptop --poll-interval 5")


def test_s3_store_and_kernel_options():
    rc, out = fake("s3://bucket/prefix", "endpoint=http://127.0.0.1:8333,region=eu-west-1,addressing=path,profile=work,"
                                         "allow_other,ro,noatime,nosuid,nodev")
    assert rc == 0, out
    assert out.endswith("/usr/bin/ubiquityfs mount /mnt/x --store s3://bucket/prefix --endpoint http://127.0.0.1:8333 "
                        "--region eu-west-1 --addressing path --profile work -o allow_other,ro,noatime,nosuid,nodev")


def test_folder_store_and_shared():
    rc, out = fake("/srv/team", "shared-store")
    assert rc == 0, out
    assert out.endswith("mount /mnt/x --store /srv/team --shared-store")


@pytest.mark.parametrize("store,options,message", [
    ("default", "contianer=x", "unknown option 'contianer=x'"),
    ("relative/path", "defaults", "STORE must be 'default', an absolute folder path or s3://"),
    ("default", "setuid=no-such-user-ubq", "setuid=no-such-user-ubq: no such user"),
])
def test_refusals(store, options, message):
    if "setuid" in options and os.geteuid() != 0:
        pytest.skip("setuid= is checked against the accounts as root")
    rc, out = fake(store, options)
    assert rc != 0
    assert message in out


def test_sloppy_ignores_unknown_options():
    rc, out = fake("default", "contianer=x,cache-size=1G", "-s")
    assert rc == 0, out
    assert out.endswith("mount /mnt/x --cache-size 1G")


def test_setuid_runs_as_the_user():
    if os.geteuid() != 0:
        pytest.skip("setuid= as root only")
    rc, out = fake("default", "setuid=nobody,device-name=d")
    assert rc == 0, out
    assert "runuser -u nobody -- env -u XDG_CONFIG_HOME -u XDG_DATA_HOME -u XDG_RUNTIME_DIR -u XDG_CACHE_HOME" in out
    assert "HOME=/nonexistent" in out and out.endswith("mount /mnt/x --device-name d")


def status(binary, mountpoint, env):
    p = subprocess.run([str(binary), "status", str(mountpoint), "--json"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_mount_t_round_trip_waits_for_pushes(binary, base, helpers_installed):
    env = user_env(base / "home", binary)
    store = base / "store"
    store.mkdir()
    mnt = base / "mnt"
    mnt.mkdir()
    try:
        p = subprocess.run(["mount", "-t", "fuse.ubiquityfs", str(store), str(mnt), "-o",
                            "container=com.example.pkg,scope=documents,cache-size=20M,device-name=pkgtest,nofail,_netdev,"
                            "x-systemd.automount,noatime"],
                           capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        assert mount_type(mnt) == "fuse.ubiquityfs"
        assert "noatime" in mount_options(mnt)["_vfs"]
        st = status(binary, mnt, env)
        assert st["container"] == "com.example.pkg" and st["scope"] == "documents"
        assert st["cacheLimitBytes"] == 20 * 1024 * 1024
        (mnt / "note.txt").write_bytes(b"x" * 300_000)
        p = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "every change is in the store" in p.stdout
        assert mount_type(mnt) is None
        # The store has it: another device (data home) reads it back.
        other = user_env(base / "other", binary)
        p = subprocess.run(["mount", "-t", "fuse.ubiquityfs", str(store), str(mnt), "-o", "container=com.example.pkg,scope=documents"],
                           capture_output=True, text=True, env=other, timeout=120)
        assert p.returncode == 0, p.stderr
        assert (mnt / "note.txt").read_bytes() == b"x" * 300_000
        p = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, env=other, timeout=120)
        assert p.returncode == 0, p.stderr
    finally:
        cleanup_mount(mnt)


def test_ro_is_read_only(binary, base, helpers_installed):
    env = user_env(base / "home", binary)
    mnt = base / "mnt"
    mnt.mkdir()
    try:
        p = subprocess.run(["mount", "-t", "fuse.ubiquityfs", "default", str(mnt), "-o", "ro"], capture_output=True,
                           text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        assert mount_options(mnt)["_vfs"].split(",")[0] == "ro"
        with pytest.raises(OSError) as failure:
            (mnt / "x").write_text("no")
        assert failure.value.errno == 30   # EROFS
        p = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
    finally:
        cleanup_mount(mnt)


def test_lazy_umount_detaches(binary, base, helpers_installed):
    env = user_env(base / "home", binary)
    mnt = base / "mnt"
    mnt.mkdir()
    try:
        assert subprocess.run(["mount", "-t", "fuse.ubiquityfs", "default", str(mnt)], env=env, timeout=120).returncode == 0
        p = subprocess.run(["umount", "-l", str(mnt)], capture_output=True, text=True, env=env, timeout=60)
        assert p.returncode == 0, p.stderr
        assert "Detached" in p.stdout
        assert mount_type(mnt) is None
    finally:
        cleanup_mount(mnt)


def test_fstab_setuid_line_mounts_as_the_user(binary, base, helpers_installed, test_user):
    """A root-run fstab line with setuid=USER: the daemon, the mount and its files are the user's; the user's
    `umount`, and root's, unmount as the user after the pushes; `mount` again is a no-op."""
    home = Path(test_user.pw_dir)
    cloud = home / "Cloud"
    cloud.mkdir()
    os.chown(cloud, test_user.pw_uid, test_user.pw_gid)
    os.chmod(binary.parent, 0o755)
    fstab = base / "fstab"
    fstab.write_text(f"# a test fstab\ndefault {cloud} fuse.ubiquityfs "
                     f"setuid={test_user.pw_name},device-name=pkg-laptop,nofail,_netdev,x-systemd.automount 0 0\n")
    env = {"PATH": os.environ["PATH"], "UBIQUITYFS": str(binary)}   # as at boot: no HOME, no XDG_*
    try:
        p = subprocess.run(["mount", "-T", str(fstab), str(cloud)], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        assert mount_type(cloud) == "fuse.ubiquityfs"
        assert mount_options(cloud)["user_id"] == str(test_user.pw_uid)
        daemons = [pid for pid in processes_of(test_user.pw_uid)
                   if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:2] == [b"mount"]]
        assert len(daemons) == 1
        w = subprocess.run(["runuser", "-u", test_user.pw_name, "--", "sh", "-c", f"echo hi > {cloud}/x.txt && stat -c %U {cloud}/x.txt"],
                           capture_output=True, text=True, timeout=30)
        assert w.returncode == 0 and w.stdout.strip() == test_user.pw_name, w.stderr
        assert (home / ".local/share/ubiquityfs/device.json").exists()
        assert json.loads((home / ".local/share/ubiquityfs/device.json").read_text())["name"] == "pkg-laptop"
        again = subprocess.run(["mount", "-T", str(fstab), str(cloud)], capture_output=True, text=True, env=env, timeout=60)
        assert again.returncode == 0 and "already" in again.stderr, again.stderr
        # The user unmounts it with umount(8) (uhelper=ubiquityfs in utab lets an ordinary user run the helper).
        p = subprocess.run(["runuser", "-u", test_user.pw_name, "--", "env", f"PATH={os.environ['PATH']}",
                            f"UBIQUITYFS={binary}", f"HOME={home}", "umount", str(cloud)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "every change is in the store" in p.stdout
        assert mount_type(cloud) is None
        # Mounted again by root's fstab line, root's umount unmounts it as the user.
        p = subprocess.run(["mount", "-T", str(fstab), str(cloud)], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        p = subprocess.run(["umount", str(cloud)], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "every change is in the store" in p.stdout
        assert mount_type(cloud) is None
    finally:
        cleanup_mount(cloud)


def test_umount_helper_passes_other_filesystems_on(base):
    """A stale uhelper=ubiquityfs in utab for a path where something else is mounted now (or nothing):
    the helper leaves it to a plain umount."""
    need_root_and_fuse()
    p = subprocess.run(["sh", str(UMOUNT_HELPER), str(base)], capture_output=True, text=True)
    assert p.returncode != 0 and "not mounted" in p.stderr, p.stderr
    tmpfs = base / "tmpfs"
    tmpfs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "pkg-test", str(tmpfs)], check=True)
    try:
        p = subprocess.run(["sh", str(UMOUNT_HELPER), str(tmpfs)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        assert mount_type(tmpfs) is None
    finally:
        if mount_type(tmpfs):
            subprocess.run(["umount", str(tmpfs)])


def test_umount_runs_the_helper_without_userspace_options(binary, base, helpers_installed):
    """No option that mount(8) keeps in utab: the helper's own uhelper=ubiquityfs makes umount wait for the pushes."""
    env = user_env(base / "home", binary)
    mnt = base / "mnt"
    mnt.mkdir()
    try:
        assert subprocess.run(["mount", "-t", "fuse.ubiquityfs", "default", str(mnt)], env=env, timeout=120).returncode == 0
        (mnt / "f.txt").write_text("x")
        p = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "every change is in the store" in p.stdout
    finally:
        cleanup_mount(mnt)
