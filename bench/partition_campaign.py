#!/usr/bin/env python3
"""A long partition campaign on real mounts: many seeds x many rounds, with 2
and 3 devices on one folder store (or S3 store), the same code as
Tests/mount/test_partition.py (Tests/mount/partition.py).

    UBIQUITYFS_BIN=/path/to/ubiquityfs python3 bench/partition_campaign.py \
        --seeds 1-20 --rounds 10 --devices 2,3
    python3 bench/partition_campaign.py --store s3 --online-faults --seeds 1-20 --rounds 6

--store s3 starts a SeaweedFS (--s3-server ceph: a Ceph RGW; Tests/servers/s3servers.py) in WORKDIR/s3server
and stops it by PID at the end, whatever happens; every (seed, device count)
gets a fresh prefix in its bucket and every device its own fault proxy (a cut
device gets 5xx for everything).  --online-faults (S3 only) keeps some devices
online during the operations, through proxies that fail, throttle, reset,
truncate and stall a share of the requests (--fault-rates, JSON, overrides
partition.DEFAULT_ONLINE_FAULTS), and reconnects every device through them;
the faults are turned off before the final convergence check.

Each (seed, device count) runs up to --rounds rounds and stops at its first
failing round. At the end it prints the counts (rounds run, diverged, lost
writes, lost older content, unexpected links, op errors, other) and the failing seeds; every
failure's full report (seed, round, tree at the start of the round, every
device's operations, the diff between trees) is printed as it happens and
written to WORKDIR/failures.txt. Exit status 1 if anything failed.

Run as root (FUSE mounts). Scratch space is --workdir (default
/tmp/ubq-partition); the directories of passing runs are removed, those of
failing runs are kept (with the daemon logs) unless --no-keep.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            seeds += range(int(lo), int(hi) + 1)
        elif part:
            seeds.append(int(part))
    return seeds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1-10", help="seeds: '1-20', '3,7,9' (default 1-10)")
    ap.add_argument("--rounds", type=int, default=10, help="rounds per seed and device count (default 10)")
    ap.add_argument("--devices", default="3,2", help="device counts to run, e.g. '3,2' or '2' (default 3,2)")
    ap.add_argument("--bin", help="ubiquityfs binary (default: $UBIQUITYFS_BIN, else .build/debug/ubiquityfs)")
    ap.add_argument("--workdir", default="/tmp/ubq-partition", help="scratch directory")
    ap.add_argument("--no-keep", action="store_true", help="remove the directories of failing runs too")
    ap.add_argument("--skip", default="", help="kinds of operation to skip (rmdir, dir-over): to look past a known bug")
    ap.add_argument("--quiet", action="store_true", help="no line per round")
    ap.add_argument("--store", choices=("folder", "s3"), default="folder",
                    help="folder (default) or s3: a SeaweedFS started in WORKDIR/s3server")
    ap.add_argument("--s3-server", choices=("seaweedfs", "ceph"), default="seaweedfs",
                    help="the S3 server --store s3 starts (default seaweedfs)")
    ap.add_argument("--online-faults", action="store_true",
                    help="S3 only: faults while online (some devices during the operations, all while reconnecting)")
    ap.add_argument("--fault-rates", default="",
                    help="JSON overriding the online faults, e.g. '{\"error_rate\": 0.1}'")
    args = ap.parse_args()
    if args.bin:
        os.environ["UBIQUITYFS_BIN"] = os.path.abspath(args.bin)
    sys.path.insert(0, str(REPO / "Tests" / "mount"))
    import conftest  # noqa: E402  (reads UBIQUITYFS_BIN)
    from partition import DEFAULT_ONLINE_FAULTS, Partition, parse_skip  # noqa: E402

    if not (conftest.BIN.is_file() and os.access(conftest.BIN, os.X_OK)):
        print(f"no ubiquityfs binary at {conftest.BIN} (--bin or UBIQUITYFS_BIN)", file=sys.stderr)
        return 2
    if (args.online_faults or args.fault_rates) and args.store != "s3":
        print("--online-faults needs --store s3 (a fault proxy per device)", file=sys.stderr)
        return 2
    online_faults = None
    if args.online_faults or args.fault_rates:
        online_faults = {**DEFAULT_ONLINE_FAULTS, **(json.loads(args.fault_rates) if args.fault_rates else {})}
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.store == "folder":
        return campaign(args, conftest, Partition, parse_skip, work, None, None)
    sys.path.insert(0, str(REPO / "Tests" / "servers"))
    import s3servers  # noqa: E402

    server_dir = work / "s3server"

    def on_term(signum, frame):  # a SIGTERM unwinds like Ctrl-C: the server is stopped below
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        server = s3servers.start(args.s3_server, server_dir)
        print(f"S3: {args.s3_server} at {server['endpoint']}, bucket {server['bucket']}, pids {server['pids']} "
              f"(data in {server_dir})", flush=True)
        os.environ["AWS_ACCESS_KEY_ID"] = server["access_key"]
        os.environ["AWS_SECRET_ACCESS_KEY"] = server["secret_key"]
        os.environ.pop("AWS_SESSION_TOKEN", None)
        os.environ.pop("AWS_PROFILE", None)
        rc = campaign(args, conftest, Partition, parse_skip, work, server, online_faults)
    finally:
        s3servers.stop(server_dir)
    if rc == 0 or args.no_keep:
        shutil.rmtree(server_dir, ignore_errors=True)
    return rc


def campaign(args, conftest, Partition, parse_skip, work: Path, server: dict | None, online_faults: dict | None) -> int:
    skip = parse_skip(args.skip)
    seeds = parse_seeds(args.seeds)
    counts = [int(x) for x in args.devices.split(",") if x.strip()]
    failures_file = work / "failures.txt"
    print(f"binary {conftest.BIN}; seeds {args.seeds}; {args.rounds} rounds; devices {counts}; skip {sorted(skip) or 'nothing'}; workdir {work}"
          f"; store {args.store}{'; online faults ' + json.dumps(online_faults) if online_faults else ''}",
          flush=True)

    stats = {n: dict(runs=0, rounds=0, failed_rounds=0, diverged=0, lost=0, lost_old=0, links=0, op_errors=0, other=0,
                     seconds=0.0, quiet_under_faults=0, max_offline=0.0)
             for n in counts}
    failing: list[str] = []
    t_start = time.monotonic()
    for seed in seeds:
        for n in counts:
            st = stats[n]
            base = work / f"seed{seed}-{n}dev-{int(time.time())}"
            base.mkdir()
            if server is None:
                store = base / "store"
                store.mkdir()
            else:
                store = conftest.S3StoreRef(f"s3://{server['bucket']}/{base.name}", server["endpoint"],
                                            server.get("region", "us-east-1"))
            devices = []

            def make(name, link, base=base, store=store):
                dev = conftest.Device(base, link, name)
                devices.append(dev)
                return dev

            say = (lambda s: None) if args.quiet else (lambda s: print("   ", s, flush=True))
            part = Partition(make, base, store, n, seed, skip=skip, say=say, online_faults=online_faults)
            failed = None
            t0 = time.monotonic()
            try:
                part.start()
                st["runs"] += 1
                for rnd in range(args.rounds):
                    res = part.round(rnd)
                    st["rounds"] += 1
                    if not args.quiet:
                        faults = ""
                        if online_faults:
                            faults = (f" online {','.join(res.online) or '-'}, "
                                      f"{'quiet' if res.quiet_under_faults else 'NOT quiet'} under faults "
                                      f"after {res.fault_phase_seconds:.1f}s,")
                        print(f"  seed {seed} devices {n} round {rnd}: {'ok' if res.ok else 'FAILED'} "
                              f"{res.seconds:.1f}s (offline {res.offline_seconds:.1f}s,{faults} "
                              f"converged {res.converge_seconds:.1f}s) "
                              f"{len(part.tree)} entries", flush=True)
                    if online_faults:
                        st["quiet_under_faults"] += bool(res.quiet_under_faults)
                    st["max_offline"] = max(st["max_offline"], res.offline_seconds)
                    if not res.ok:
                        st["failed_rounds"] += 1
                        st["diverged"] += res.diverged
                        st["lost"] += bool(res.lost)
                        st["lost_old"] += bool(res.lost_old)
                        st["links"] += bool(res.links)
                        st["op_errors"] += bool(res.op_errors)
                        st["other"] += bool(res.other) and not res.diverged
                        failed = res
                        text = res.report + "\n\nearlier rounds of this seed:\n" + "\n".join(part.history[:-1])
                        print(text, flush=True)
                        with open(failures_file, "a") as f:
                            f.write(text + "\n\n" + "=" * 78 + "\n\n")
                        break
            except Exception as e:  # noqa: BLE001 - a run that could not even start is reported, not fatal
                st["other"] += 1
                failed = e
                print(f"  seed {seed} devices {n}: ERROR {e!r}", flush=True)
                with open(failures_file, "a") as f:
                    f.write(f"seed {seed} devices {n}: ERROR {e!r}\n\n")
            finally:
                part.restore_links()
                problems = []
                for dev in reversed(devices):
                    problems += dev.close()
                part.close_links()
                if problems:
                    print(f"  seed {seed} devices {n}: teardown problems: {problems}", flush=True)
            st["seconds"] += time.monotonic() - t0
            if failed is not None:
                what = "; ".join(failed.symptoms())[:300] if hasattr(failed, "symptoms") else repr(failed)
                rnd = getattr(failed, "round", "-")
                failing.append(f"seed {seed} devices {n} round {rnd}: {what}  [{base}]")
                if args.no_keep:
                    shutil.rmtree(base, ignore_errors=True)
            else:
                shutil.rmtree(base, ignore_errors=True)
                print(f"seed {seed} devices {n}: ok ({args.rounds} rounds, {time.monotonic() - t0:.0f}s)",
                      flush=True)

    print()
    print(f"campaign: {time.monotonic() - t_start:.0f}s, binary {conftest.BIN}")
    print(f"{'devices':>7} {'runs':>5} {'rounds':>6} {'failed':>6} {'diverged':>8} {'lost':>5} {'lostold':>7} {'links':>5} "
          f"{'operr':>5} {'other':>5} {'s/round':>7} {'offmax':>6}" + (f" {'quietF':>6}" if online_faults else ""))
    for n, st in stats.items():
        per = st["seconds"] / st["rounds"] if st["rounds"] else 0
        print(f"{n:>7} {st['runs']:>5} {st['rounds']:>6} {st['failed_rounds']:>6} {st['diverged']:>8} "
              f"{st['lost']:>5} {st['lost_old']:>7} {st['links']:>5} {st['op_errors']:>5} {st['other']:>5} {per:>7.1f}"
              f" {st['max_offline']:>6.1f}" + (f" {st['quiet_under_faults']:>6}" if online_faults else ""))
    print("offmax: longest wait (s) until every device cut off said storeReachable false")
    if online_faults:
        print("quietF: rounds in which every device was quiet under the online faults "
              f"(within {conftest_fault_phase()}s) before they were turned off")
    if failing:
        print("failing seeds:")
        for line in failing:
            print("  " + line)
        print(f"full reports: {failures_file}")
    return 1 if failing else 0


def conftest_fault_phase() -> str:
    from partition import FAULT_PHASE_TIMEOUT
    return f"{FAULT_PHASE_TIMEOUT:.0f}"


if __name__ == "__main__":
    sys.exit(main())
