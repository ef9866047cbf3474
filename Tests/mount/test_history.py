"""Version history and Recently Deleted on real mounts (issue #39, items 2
and 3): two devices on one store (the folder store, or S3 with
UBQ_TEST_STORE=s3), the CLI as a user runs it.

- `versions --all` lists every pushed content of a file, across renames,
  with its device; `restore --version` makes one current on every device
  (the replaced one stays listed); `restore --to` puts one beside it.
- `trash` lists what another device deleted (a folder with what was
  deleted with it) with path, date and device; `restore --deleted` brings a
  folder back whole on every device, to a free name if the old one is
  taken; `trash --empty` removes the items for good, everywhere.
- Bad input gets a clear error: an unknown version, an item not in the
  trash, a name that is taken for `--to`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess

from test_sync import eventually, new_device, read, until, wait_pushed, write


def history(dev, path):
    res = dev.cli("versions", "--all", "--json", str(path), timeout=60)
    assert res.returncode == 0, res
    return json.loads(res.stdout)["history"]


def trash(dev):
    res = dev.cli("trash", str(dev.mountpoint), "--json", timeout=60)
    assert res.returncode == 0, res
    return json.loads(res.stdout)["items"]


def test_versions_restore_on_every_device(make_device):
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    contents = [b"first\n", b"second, longer\n", os.urandom(300_000)]
    write(A / "report.txt", contents[0])
    wait_pushed(a)
    write(A / "report.txt", contents[1])
    wait_pushed(a)
    until(lambda: read(B / "report.txt"), lambda got: got == contents[1], "b sees the second version")
    write(B / "report.txt", contents[2])
    wait_pushed(b)
    os.rename(B / "report.txt", B / "final.txt")
    wait_pushed(b)
    eventually(lambda: os.stat(A / "final.txt"), what="the rename reaches a")

    listed = until(lambda: history(a, A / "final.txt"), lambda h: len(h) == 3, "three versions listed on a")
    assert [v["size"] for v in listed] == [len(c) for c in contents]
    assert [v["device"] for v in listed] == ["a", "a", "b"]
    assert [v["current"] for v in listed] == [False, False, True]
    text = a.cli("versions", "--all", str(A / "final.txt"), timeout=60)
    assert text.returncode == 0 and "HISTORY" in text.stdout and "(current)" in text.stdout, text

    # The first version becomes current everywhere; the replaced one stays listed.
    res = a.cli("restore", str(A / "final.txt"), "--version", str(listed[0]["id"]), timeout=60)
    assert res.returncode == 0, res
    assert f"restored {A / 'final.txt'}" in res.stdout, res
    for dev in (a, b):
        until(lambda dev=dev: read(dev.mountpoint / "final.txt"), lambda got: got == contents[0],
              f"{dev.name} reads the restored version")
    after = until(lambda: history(b, B / "final.txt"), lambda h: len(h) == 4, "four versions listed on b")
    assert after[-1]["current"] and after[-1]["size"] == len(contents[0])

    # Beside it; a taken name and an unknown version are refused.
    res = b.cli("restore", str(B / "final.txt"), "--version", str(listed[2]["id"]), "--to", str(B / "big.bin"), timeout=60)
    assert res.returncode == 0, res
    until(lambda: read(A / "big.bin"), lambda got: got == contents[2], "a reads the version restored beside it")
    res = b.cli("restore", str(B / "final.txt"), "--version", str(listed[1]["id"]), "--to", str(B / "big.bin"), timeout=60)
    assert res.returncode == 1 and "exists" in res.stderr, res
    res = b.cli("restore", str(B / "final.txt"), "--version", "999999", timeout=60)
    assert res.returncode == 1 and "no version 999999" in res.stderr, res


def test_recently_deleted_lists_restores_and_empties(make_device):
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    files = {"Projects/site/index.html": b"<html>\n", "Projects/plan.txt": b"plan\n", "loose.txt": b"loose\n"}
    os.makedirs(A / "Projects/site")
    for rel, data in files.items():
        write(A / rel, data)
    wait_pushed(a)
    eventually(lambda: [os.stat(B / rel) for rel in files], what="the tree reaches b")

    # b deletes the folder (rm -r) and a file.
    shutil.rmtree(B / "Projects")
    os.unlink(B / "loose.txt")
    wait_pushed(b)
    until(lambda: os.listdir(A), lambda names: names == [], "gone on a")

    items = until(lambda: trash(a), lambda t: len(t) == 2, "two items in a's trash")
    by_path = {item["path"]: item for item in items}
    assert set(by_path) == {str(A / "Projects"), str(A / "loose.txt")}, items
    folder = by_path[str(A / "Projects")]
    assert folder["kind"] == "directory" and folder["items"] == 3 and folder["device"] == "b", folder
    assert folder["size"] == len(files["Projects/site/index.html"]) + len(files["Projects/plan.txt"])
    text = a.cli("trash", str(A), timeout=60)
    assert text.returncode == 0 and "Projects/ (3 items)" in text.stdout, text

    # The name was taken meanwhile: it comes back beside it.
    write(A / "loose.txt", b"a new one\n")
    res = a.cli("restore", "--deleted", str(A / "loose.txt"), timeout=60)
    assert res.returncode == 0 and "loose (restored).txt" in res.stdout, res
    res = a.cli("restore", "--deleted", str(A / "Projects"), timeout=60)
    assert res.returncode == 0, res

    def back_everywhere():
        for dev in (a, b):
            root = dev.mountpoint
            for rel, data in files.items():
                assert read(root / (rel if rel != "loose.txt" else "loose (restored).txt")) == data, (dev.name, rel)
            assert read(root / "loose.txt") == b"a new one\n"

    eventually(back_everywhere, 30, 0.25, "restored on both devices")
    assert trash(a) == [] and trash(b) == []
    res = a.cli("restore", "--deleted", str(A / "Projects"), timeout=60)
    assert res.returncode == 1 and "not in Recently Deleted" in res.stderr, res

    # Deleted again, then emptied for good on every device.
    os.unlink(A / "loose (restored).txt")
    wait_pushed(a)
    until(lambda: trash(b), lambda t: len(t) == 1, "b lists it")
    res = b.cli("trash", str(B), "--empty", timeout=60)
    assert res.returncode == 0 and "removed 1 item for good" in res.stdout, res
    assert trash(a) == [] and trash(b) == []


def test_recently_deleted_shows_in_the_mount_where_file_managers_look(make_device):
    """The freedesktop trash layout at the mount's root, read-only:
    `.Trash-UID/files/NAME` and `info/NAME.trashinfo` (Path relative to the
    mount, URL-escaped; DeletionDate); hidden from listings; every change
    refused with EROFS; gio's trash:/// (what Nautilus's Trash shows) lists
    the items with their original paths. A restore takes the item out."""
    a = new_device(make_device, "a")
    b = new_device(make_device, "b")
    A, B = a.mountpoint, b.mountpoint
    os.makedirs(A / "Plans")
    write(A / "Plans/q1.txt", b"q1\n")
    write(A / "old notes.txt", b"notes\n")
    wait_pushed(a)
    until(lambda: sorted(os.listdir(B)), lambda names: names == ["Plans", "old notes.txt"], "the tree reaches b")
    shutil.rmtree(B / "Plans")
    os.unlink(B / "old notes.txt")
    wait_pushed(b)

    trash_dir = A / f".Trash-{os.geteuid()}"
    until(lambda: sorted(os.listdir(trash_dir / "files")), lambda names: names == ["Plans", "old notes.txt"],
          "both items in a's .Trash-UID/files")
    assert sorted(os.listdir(trash_dir / "info")) == ["Plans.trashinfo", "old notes.txt.trashinfo"]
    info = (trash_dir / "info/old notes.txt.trashinfo").read_text()
    assert info.startswith("[Trash Info]\nPath=old%20notes.txt\nDeletionDate=20"), info
    assert os.stat(trash_dir).st_uid == os.geteuid()
    assert (trash_dir / "files/Plans").is_dir() and (trash_dir / "files/old notes.txt").stat().st_size == 6
    assert trash_dir.name not in os.listdir(A), "hidden from the root's listing"

    for attempt in (lambda: open(trash_dir / "files/new", "w"), lambda: os.unlink(trash_dir / "info/Plans.trashinfo"),
                    lambda: os.rename(trash_dir / "files/Plans", A / "Plans"), lambda: os.mkdir(trash_dir / "x")):
        try:
            attempt()
        except OSError as e:
            assert e.errno == errno.EROFS, e
        else:
            raise AssertionError("a change in .Trash-UID was allowed")

    if shutil.which("gio") and shutil.which("dbus-run-session") and os.path.exists("/usr/libexec/gvfsd-trash"):
        listed = subprocess.run(["dbus-run-session", "--", "gio", "list", "-a", "trash::orig-path", "trash:///"],
                                capture_output=True, text=True, timeout=60, env=a.env())
        assert f"trash::orig-path={A}/old notes.txt" in listed.stdout, listed
        assert f"trash::orig-path={A}/Plans" in listed.stdout, listed

    res = a.cli("restore", "--deleted", str(A / "Plans"), timeout=60)
    assert res.returncode == 0, res
    until(lambda: sorted(os.listdir(trash_dir / "files")), lambda names: names == ["old notes.txt"],
          "the restored folder leaves the trash folder")
