"""The POSIX conformance suite (Tests/posix) on a real mount, side by side
with a plain directory: every check must have the same outcome on both,
except the differences docs/SEMANTICS.md documents (listed here)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "posix"))
import posix_suite  # noqa: E402

from conftest import Device  # noqa: E402

# Check name -> why the mount differs from a local filesystem (docs/SEMANTICS.md).
DOCUMENTED_DIFFERENCES: dict[str, str] = {}

pytestmark = pytest.mark.daemon


@pytest.fixture
def open_base():
    """A 0755 base directory, so the suite's permission checks (run as
    uid 65534) can reach the mount and the plain directory."""
    base = Path(tempfile.mkdtemp(prefix="ubq-posix-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_posix_suite_matches_plain_directory(open_base):
    store = open_base / "store"
    store.mkdir()
    device = Device(open_base, store, "a")
    try:
        device.mount()
        plain = open_base / "plain"
        plain.mkdir()
        plain.chmod(0o755)
        os.chmod(device.mountpoint, 0o755)
        on_plain = posix_suite.run_suite(str(plain))
        on_mount = posix_suite.run_suite(str(device.mountpoint))
        differences = []
        for name, (status, detail) in sorted(on_plain.items()):
            mount_status, mount_detail = on_mount.get(name, ("MISSING", ""))
            if mount_status != status and name not in DOCUMENTED_DIFFERENCES:
                differences.append(f"{name}: plain {status}, mount {mount_status} {mount_detail}")
        assert not differences, "the mount behaves differently:\n" + "\n".join(differences)
        skipped = [n for n, (s, _) in on_mount.items() if s == "SKIP"]
        assert not skipped, f"checks skipped on the mount: {skipped}"
    finally:
        problems = device.close()
        assert not problems, problems
