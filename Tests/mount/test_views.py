"""Containers and scopes on real mounts: `container create`, `mount --scope
documents|data|all`, folder levels enforced in Documents, the status
attributes, and `versions`/`resolve` after a real two-device conflict."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from conftest import BIN

pytestmark = pytest.mark.daemon

CONTAINER = "com.example.notes"


def container(store, *args):
    return subprocess.run([str(BIN), "container", *args, "--store", str(store)],
                          capture_output=True, text=True)


def scoped(make_device, name, scope, **kw):
    dev = make_device(name, mount=False, container=CONTAINER, **kw)
    dev.mount_args = ("--scope", scope, "--device-name", name)
    dev.mount()
    return dev


def test_container_configuration_is_validated_and_kept_in_the_store(store):
    assert container(store, "create", CONTAINER, "--name", "Notes", "--public", "--folder-levels", "one").returncode == 0
    again = container(store, "create", CONTAINER)
    assert again.returncode != 0 and "already exists" in again.stderr
    bad = container(store, "create", "bad..id")
    assert bad.returncode != 0 and "invalid container ID" in bad.stderr
    assert container(store, "set", CONTAINER, "--folder-levels", "none").returncode == 0
    listed = container(store, "list").stdout
    assert f"{CONTAINER}\tNotes\tpublic\tnone" in listed


def test_documents_scope_enforces_folder_levels_and_data_scope_hides_documents(store, make_device):
    assert container(store, "create", CONTAINER, "--name", "Notes", "--folder-levels", "one").returncode == 0
    docs = scoped(make_device, "docs", "documents")
    root = docs.mountpoint
    (root / "todo.md").write_text("doc")
    os.mkdir(root / "level1")
    with pytest.raises(PermissionError):
        os.mkdir(root / "level1" / "level2")
    os.mkdir(root / "other")
    with pytest.raises(PermissionError):
        os.rename(root / "other", root / "level1" / "other")
    docs.unmount()

    data = scoped(make_device, "data", "data")
    (data.mountpoint / "app.db").write_text("data")
    assert sorted(os.listdir(data.mountpoint)) == ["app.db"]
    with pytest.raises(FileNotFoundError):
        os.stat(data.mountpoint / "Documents")
    with pytest.raises(PermissionError):
        os.mkdir(data.mountpoint / "Documents")
    data.unmount()

    everything = scoped(make_device, "all", "all")
    found = sorted(os.path.relpath(os.path.join(d, f), everything.mountpoint)
                   for d, dirs, files in os.walk(everything.mountpoint) for f in dirs + files)
    assert found == ["Documents", "Documents/level1", "Documents/other", "Documents/todo.md", "app.db"]


def test_status_attributes_are_readable_but_never_listed(make_device):
    dev = make_device("a")
    path = dev.mountpoint / "f.txt"
    path.write_text("x")
    os.setxattr(path, "user.app", b"1")
    assert os.listxattr(path) == ["user.app"]
    status = os.getxattr(path, "user.ubiquity.status")
    assert b'"downloadingStatus":"current"' in status
    assert os.getxattr(path, "user.ubiquity.percent") == b"100"
    assert os.getxattr(path, "user.ubiquity.conflicts") == b"0"
    with pytest.raises(OSError) as e:
        os.setxattr(path, "user.ubiquity.status", b"x")
    assert e.value.errno == errno.EPERM
