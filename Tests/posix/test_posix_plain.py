"""Run the POSIX suite on plain (kernel) directories: proves the suite itself is right.

Every check must PASS on a plain local filesystem, or SKIP with a reason (e.g. the
root-only checks when not run as root).  Run:  python3 -m pytest -q Tests/posix/test_posix_plain.py

The main run uses a fresh directory under the system temp dir with mode 0755,
not pytest's tmp_path: pytest's base temp dir is 0700, so uid 65534 could not
reach it and the permission checks would all SKIP.  A second test runs the whole
suite on tmp_path itself (there the permission checks SKIP, everything else PASSes).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import posix_suite as ps  # noqa: E402

SUITE = os.path.join(HERE, "posix_suite.py")
OK = (ps.PASS, ps.SKIP)


@pytest.fixture(scope="module")
def plain_dir():
    d = tempfile.mkdtemp(prefix="posix-plain-")
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def results(plain_dir):
    t0 = time.monotonic()
    res = ps.run_suite(plain_dir)
    elapsed = time.monotonic() - t0
    assert elapsed < 60, f"suite took {elapsed:.1f}s on a plain dir"
    # the suite must clean up after itself
    assert os.listdir(plain_dir) == []
    return res


@pytest.mark.parametrize("name", ps.check_names())
def test_check_on_plain_dir(results, name):
    status, detail = results[name]
    if status == ps.SKIP:
        assert detail, "SKIP without a reason"
        pytest.skip(detail)
    assert status == ps.PASS, f"{status}: {detail}"


def test_root_runs_everything(results):
    """As root on a plain dir nothing should need to be skipped."""
    if os.geteuid() != 0:
        pytest.skip("not root")
    skipped = {n: d for n, (s, d) in results.items() if s == ps.SKIP}
    assert skipped == {}


def test_suite_on_tmp_path(tmp_path):
    res = ps.run_suite(str(tmp_path))
    bad = {n: r for n, r in res.items() if r[0] not in OK or (r[0] == ps.SKIP and not r[1])}
    assert bad == {}
    assert list(tmp_path.iterdir()) == []


def test_every_check_has_docstring_and_unique_name():
    names = ps.check_names()
    assert len(names) == len(set(names))
    assert len(names) >= 100
    for _, fn in ps.CHECKS:
        assert fn.__doc__ and fn.__doc__.strip()


def test_pattern_selection():
    assert [n for n, _ in ps.select_checks("rename_")] == [n for n in ps.check_names() if "rename_" in n]
    assert [n for n, _ in ps.select_checks("xattr_l*")] == ["xattr_large_value"]
    assert len(ps.select_checks(["lock_", "mmap_"])) == len(
        [n for n in ps.check_names() if "lock_" in n or "mmap_" in n])


# ---- the runner reports failures, timeouts and cleans up -----------------

@pytest.fixture
def extra_checks():
    """Temporarily register synthetic checks (removed afterwards)."""
    before = list(ps.CHECKS)
    yield ps.check
    ps.CHECKS[:] = before


def test_runner_reports_fail_errno_timeout_and_cleans_up(tmp_path, extra_checks):
    def check_zz_wrong_value(d):
        """synthetic"""
        ps.eq(1, 2, "one")

    def check_zz_missing_errno(d):
        """synthetic: expects an errno that does not happen"""
        ps.expect_errno(ps.errno.ENOENT, os.mkdir, os.path.join(d, "x"))

    def check_zz_unexpected_oserror(d):
        """synthetic"""
        os.rmdir(os.path.join(d, "nope"))

    def check_zz_hang(d):
        """synthetic"""
        while True:
            time.sleep(0.05)

    def check_zz_messy(d):
        """synthetic: leaves an unreadable tree behind"""
        os.makedirs(os.path.join(d, "a", "b"))
        os.chmod(os.path.join(d, "a"), 0)

    for f in (check_zz_wrong_value, check_zz_missing_errno, check_zz_unexpected_oserror,
              check_zz_hang, check_zz_messy):
        extra_checks(f)
    res = ps.run_suite(str(tmp_path), pattern="zz_", timeout=1.0)
    assert res["zz_wrong_value"][0] == ps.FAIL and "expected 2, got 1" in res["zz_wrong_value"][1]
    assert res["zz_missing_errno"][0] == ps.FAIL and "succeeded" in res["zz_missing_errno"][1]
    assert res["zz_unexpected_oserror"][0] == ps.FAIL and "ENOENT" in res["zz_unexpected_oserror"][1]
    assert res["zz_hang"] == (ps.FAIL, "timed out after 1s")
    assert res["zz_messy"] == (ps.PASS, "")
    assert list(tmp_path.iterdir()) == []


# ---- command line ----------------------------------------------------------

def _cli(*args):
    return subprocess.run([sys.executable, SUITE, *args], capture_output=True, text=True, timeout=120)


def test_cli_text_and_json(plain_dir):
    p = _cli(plain_dir, "-k", "io_o_")
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("PASS   io_o_append") and "checks:" in lines[-1]
    p = _cli(plain_dir, "-k", "symlink_", "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["results"] and all(r["status"] == ps.PASS for r in data["results"].values())


def test_cli_compare_same_kind(plain_dir):
    b = tempfile.mkdtemp(prefix="posix-plain-b-")
    os.chmod(b, 0o755)
    try:
        p = _cli("--compare", plain_dir, b, "-k", "rename_", "-k", "dir_")
    finally:
        shutil.rmtree(b, ignore_errors=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "no differences" in p.stdout


def test_cli_compare_shows_differences(plain_dir, tmp_path):
    """pytest's tmp_path has a 0700 ancestor, so there the permission checks SKIP:
    --compare must list exactly those and exit 1."""
    if os.geteuid() != 0:
        pytest.skip("needs root (permission checks skip everywhere otherwise)")
    p = _cli("--compare", plain_dir, str(tmp_path), "-k", "perm_dir", "-k", "io_o_")
    assert p.returncode == 1, p.stdout + p.stderr
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.startswith("perm_") or ln.startswith("io_")]
    assert [r[:3] for r in rows] == [["perm_dir_search_bits", "PASS", "SKIP"]]
    p = _cli("--compare", plain_dir, str(tmp_path), "-k", "perm_dir", "--json")
    assert p.returncode == 1
    diffs = json.loads(p.stdout)["differences"]
    assert diffs["perm_dir_search_bits"]["a"][0] == ps.PASS
    assert diffs["perm_dir_search_bits"]["b"][0] == ps.SKIP


def test_cli_exit_status_on_failure(tmp_path):
    # a path that is not a directory cannot be tested
    f = tmp_path / "file"
    f.write_text("x")
    p = _cli(str(f))
    assert p.returncode != 0
