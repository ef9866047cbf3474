"""Partitions on real mounts: 2 and 3 devices on one folder store go offline
together each round, do random operations, reconnect, and must agree on one
tree that keeps every write (see partition.py for the rounds and the checks).

The S3 variants (`-k s3`) do the same on a prefix of the session's S3 server
(conftest.s3_server: UBIQUITYFS_TEST_S3_SERVERS, or a SeaweedFS it starts),
each device through its own fault proxy (cut off: every request gets a 5xx);
in the 3-device one, some devices stay online during the operations and every
device reconnects through proxies that also fail, throttle, reset, truncate
and stall some requests (partition.DEFAULT_ONLINE_FAULTS), turned off before
the final check.  They run fewer rounds (CI time).

Environment:
  UBQ_PARTITION_SEED=N     the seed (default: 2 for 3 devices, 1 for 2 devices)
  UBQ_PARTITION_ROUNDS=N   rounds per run (default 6; campaigns run more)
  UBQ_PARTITION_DEVICES=N  run only the 2- or the 3-device variant
  UBQ_PARTITION_SKIP=K,..  skip kinds of operation (rmdir, dir-over), to look
                           past a known bug
  UBQ_PARTITION_S3_ROUNDS=N  rounds of the S3 variants (default 3)

A failure prints the seed, the round, the tree at the start of that round, the
operations of every device in it, and the diff between the devices' trees.
`bench/partition_campaign.py` runs many seeds with the same code.
"""

from __future__ import annotations

import os

import pytest

from conftest import S3StoreRef, s3_server
from partition import DEFAULT_ONLINE_FAULTS, Partition, env_int, parse_skip

pytestmark = pytest.mark.daemon

DEFAULT_SEEDS = {3: 2, 2: 1}
ROUNDS = env_int("UBQ_PARTITION_ROUNDS", 6)
S3_ROUNDS = env_int("UBQ_PARTITION_S3_ROUNDS", 3)
ONLY = env_int("UBQ_PARTITION_DEVICES", 0)
VARIANTS = [n for n in (3, 2) if ONLY in (0, n)]


@pytest.mark.parametrize("n", VARIANTS, ids=[f"{n}-devices" for n in VARIANTS])
def test_partitioned_rounds_converge(proxies, make_device, tmp_path, store, n):
    run_rounds(proxies, make_device, tmp_path, store, n, ROUNDS)


# (devices, online faults): faults while online in the 3-device variant.
S3_VARIANTS = [(n, n == 3) for n in VARIANTS]


@pytest.mark.parametrize("n,faults", S3_VARIANTS,
                         ids=[f"s3-{n}-devices{'-online-faults' if f else ''}" for n, f in S3_VARIANTS])
def test_partitioned_rounds_converge_on_s3(proxies, make_device, tmp_path, n, faults):
    server = s3_server()
    store = S3StoreRef(f"s3://{server['bucket']}/partition-{tmp_path.name}-{os.urandom(4).hex()}",
                       server["endpoint"], server.get("region", "us-east-1"))
    run_rounds(proxies, make_device, tmp_path, store, n, S3_ROUNDS,
               online_faults=DEFAULT_ONLINE_FAULTS if faults else None)


@pytest.fixture
def proxies():
    """The partitions whose S3 fault proxies are stopped at teardown: after
    make_device's teardown (requested after this fixture), since a graceful
    unmount pushes through them."""
    parts: list[Partition] = []
    yield parts
    for part in parts:
        part.close_links()


def run_rounds(proxies, make_device, tmp_path, store, n, rounds, online_faults=None):
    seed = env_int("UBQ_PARTITION_SEED", DEFAULT_SEEDS[n])
    part = Partition(lambda name, link: make_device(name, store=link, mount=False),
                     tmp_path, store, n, seed, skip=parse_skip(os.environ.get("UBQ_PARTITION_SKIP")), say=print,
                     online_faults=online_faults)
    proxies.append(part)
    try:
        part.start()
        for rnd in range(rounds):
            res = part.round(rnd)
            print(f"seed {seed} devices {n} round {rnd}: {'ok' if res.ok else 'FAILED'} in {res.seconds:.1f}s "
                  f"(offline after {res.offline_seconds:.1f}s, converged {res.converge_seconds:.1f}s after "
                  f"reconnecting), {len(part.tree)} entries")
            if not res.ok:
                pytest.fail(res.report + "\n\nearlier rounds:\n" + "\n".join(part.history[:-1]), pytrace=False)
    finally:
        # Before the devices' teardown (a graceful unmount pushes): give every
        # device its store back.
        part.restore_links()
