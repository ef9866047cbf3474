"""What only an S3 store has: credentials the AWS way, clear errors for refused
credentials and missing buckets, a store URL remembered per mountpoint, a
prefix that lost its marker, and a fault campaign through a proxy that fails,
stalls, resets and truncates requests — on real mounts against a real S3
server on loopback (SeaweedFS unless UBIQUITYFS_TEST_S3_SERVERS names others).

The rest of the mount tests run on S3 too, with UBQ_TEST_STORE=s3.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIN, S3StoreRef, s3_server, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "servers"))
from faultproxy import FaultProxy  # noqa: E402
import s3servers  # noqa: E402

pytestmark = pytest.mark.daemon


@pytest.fixture
def s3(tmp_path) -> S3StoreRef:
    """A fresh prefix on the session's S3 server (whatever UBQ_TEST_STORE says)."""
    server = s3_server()
    return S3StoreRef(f"s3://{server['bucket']}/s3test-{tmp_path.name}-{os.urandom(4).hex()}", server["endpoint"],
                      server.get("region", "us-east-1"))


def proxy_for(store: S3StoreRef, **rates) -> FaultProxy:
    proxy = FaultProxy(store.endpoint, **rates).start()
    atexit.register(proxy.stop)   # devices unmount through it after the test
    return proxy


def status_json(dev) -> dict:
    res = dev.cli("status", str(dev.mountpoint), "--json", timeout=30)
    assert res.returncode == 0, res
    return json.loads(res.stdout)


def raw(store: S3StoreRef, method: str, key: str, body: bytes = b"") -> tuple[int, bytes]:
    """A signed request straight to the server (as another tool would make)."""
    server = s3_server()
    bucket, _, prefix = str(store)[len("s3://"):].partition("/")
    status, _, data = s3servers.s3_request({**server, "endpoint": store.endpoint}, method, f"/{bucket}/{prefix}/{key}", body=body)
    return status, data


def test_status_names_the_store_and_its_round_trip(make_device, s3):
    a = make_device("a", store=s3)
    (a.mountpoint / "x.txt").write_text("x")
    text = a.cli("status", str(a.mountpoint), timeout=30).stdout
    line = next(l for l in text.splitlines() if l.startswith("Store:"))
    assert str(s3) in line and "reachable" in line and " ms)" in line, text


def test_credentials_from_a_profile_never_in_the_process_list(make_device, s3, tmp_path):
    server = s3_server()
    home = tmp_path / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(
        f"[other]\naws_access_key_id = WRONG\naws_secret_access_key = WRONG\n\n"
        f"[work]\naws_access_key_id = {server['access_key']}\naws_secret_access_key = {server['secret_key']}\n")
    a = make_device("a", store=s3, mount=False)
    # The keys in the environment would win: this test takes them away.
    saved = {k: os.environ.pop(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if k in os.environ}
    try:
        a.mount_env = {"HOME": str(home), "AWS_PROFILE": "work"}
        a.mount()
        (a.mountpoint / "p.txt").write_text("through a profile")
        assert wait_until(lambda: status_json(a)["pendingItems"] == 0, 30)
        cmdline = Path(f"/proc/{a.pid}/cmdline").read_bytes().decode(errors="replace")
        assert server["secret_key"] not in cmdline and server["access_key"] not in cmdline, cmdline
        logs = list(a.data_home.glob("ubiquityfs/replicas/*/daemon.log"))
        assert logs, "no daemon log"
        for text in [a.cli("status", str(a.mountpoint), timeout=30).stdout] + [log.read_text() for log in logs]:
            assert server["secret_key"] not in text
    finally:
        os.environ.update(saved)


def test_refused_credentials_and_a_missing_bucket_are_clear_at_mount(make_device, s3):
    a = make_device("a", store=s3, mount=False)
    a.mount_env = {"AWS_SECRET_ACCESS_KEY": "definitely-not-the-secret"}
    res = a.mount(check=False)
    assert res.returncode != 0, res
    assert "refused the credentials" in res.stderr and "definitely-not-the-secret" not in res.text, res

    missing = S3StoreRef(f"s3://no-such-bucket-{os.urandom(3).hex()}/p", s3.endpoint, s3.region)
    b = make_device("b", store=missing, mount=False)
    res = b.mount(check=False)
    assert res.returncode != 0 and "does not exist" in res.stderr, res


def test_the_store_is_remembered_for_the_mountpoint(make_device, s3, tmp_path):
    config = tmp_path / "config"
    a = make_device("a", store=s3, mount=False)
    a.mount_env = {"XDG_CONFIG_HOME": str(config)}
    a.mount()
    (a.mountpoint / "kept.txt").write_text("kept")
    a.unmount()
    res = a.cli("mount", str(a.mountpoint), timeout=60, extra_env={"XDG_CONFIG_HOME": str(config)})
    assert res.returncode == 0 and str(s3) in res.stdout, res
    a._adopt_pid(res)
    assert (a.mountpoint / "kept.txt").read_text() == "kept"
    remembered = config / "ubiquityfs" / "mounts.json"
    assert oct(remembered.stat().st_mode & 0o777) == "0o600"
    text = remembered.read_text()
    assert str(s3) in text and s3_server()["secret_key"] not in text, text


def test_a_prefix_that_lost_its_marker_is_unreachable_not_empty(make_device, s3):
    a = make_device("a", store=s3)
    b = make_device("b", store=s3)
    (a.mountpoint / "one.txt").write_text("one")
    assert wait_until(lambda: (b.mountpoint / "one.txt").exists(), 15)
    assert (b.mountpoint / "one.txt").read_text() == "one"   # downloaded: readable offline
    marker_status, marker = raw(s3, "GET", "ubiquityfs-store.json")
    assert marker_status == 200
    b.unmount()
    assert raw(s3, "DELETE", "ubiquityfs-store.json")[0] in (200, 204)
    b.mount()
    assert (b.mountpoint / "one.txt").read_text() == "one"
    assert status_json(b)["storeReachable"] is False
    (b.mountpoint / "offline.txt").write_text("queued")
    time.sleep(2)
    assert raw(s3, "GET", "ubiquityfs-store.json")[0] == 404, "the device made a new store over the old one"
    assert raw(s3, "PUT", "ubiquityfs-store.json", marker)[0] == 200
    assert wait_until(lambda: (a.mountpoint / "offline.txt").exists(), 30), "b's queued write never arrived"


def test_faults_lose_nothing_and_never_hang(make_device, s3):
    """Two devices, each through its own proxy failing 10 % of requests with
    5xx or 429, and resetting, truncating and stalling a few: every write of
    each device ends on both, with the same content."""
    rates = dict(error_rate=0.06, throttle_rate=0.02, reset_rate=0.03, truncate_rate=0.03, stall_rate=0.01,
                 stall_seconds=15, seed=7)
    pa, pb = proxy_for(s3, **rates), proxy_for(s3, **{**rates, "seed": 8})
    a = make_device("a", store=s3.via(pa.url))
    b = make_device("b", store=s3.via(pb.url))
    rng = random.Random(42)
    expected: dict[str, bytes] = {}
    for round_ in range(6):
        for dev, tag in ((a, "a"), (b, "b")):
            for i in range(8):
                name = f"{tag}-{round_}-{i}.txt"
                data = (f"{name} " * rng.randint(1, 3000)).encode()
                t0 = time.monotonic()
                (dev.mountpoint / name).write_bytes(data)
                assert time.monotonic() - t0 < 10, "a write waited on the store"
                expected[name] = data
            (dev.mountpoint / f"{tag}-shared-{round_ % 2}.bin").write_bytes(os.urandom(rng.randint(1, 5 << 20)))
        time.sleep(1)
    pa.off()
    pb.off()

    def converged():
        for dev in (a, b):
            names = set(os.listdir(dev.mountpoint))
            if not set(expected) <= names:
                return False
        return status_json(a)["pendingItems"] == 0 and status_json(b)["pendingItems"] == 0

    assert wait_until(converged, 120, 1), (
        f"missing on a: {sorted(set(expected) - set(os.listdir(a.mountpoint)))[:10]}; "
        f"missing on b: {sorted(set(expected) - set(os.listdir(b.mountpoint)))[:10]}; "
        f"a: {status_json(a)['recentErrors'][-3:]}; b: {status_json(b)['recentErrors'][-3:]}")
    for name, data in expected.items():
        for dev in (a, b):
            assert hashlib.sha256((dev.mountpoint / name).read_bytes()).digest() == hashlib.sha256(data).digest(), (dev.name, name)
    assert sorted(os.listdir(a.mountpoint)) == sorted(os.listdir(b.mountpoint))
    for name in os.listdir(a.mountpoint):
        assert (a.mountpoint / name).read_bytes() == (b.mountpoint / name).read_bytes(), name
    counted = {k: v for k, v in {**pa.stats()["counters"]}.items() if v}
    assert counted.get("error_500", 0) + counted.get("error_503", 0) > 0 and counted.get("resets_before", 0) + counted.get("resets_after", 0) > 0, counted
