#!/usr/bin/env python3
"""A long partition campaign on real mounts: many seeds x many rounds, with 2
and 3 devices on one folder store, the same code as
Tests/mount/test_partition.py (Tests/mount/partition.py).

    UBIQUITYFS_BIN=/path/to/ubiquityfs python3 bench/partition_campaign.py \
        --seeds 1-20 --rounds 10 --devices 2,3

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
import os
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
    args = ap.parse_args()
    if args.bin:
        os.environ["UBIQUITYFS_BIN"] = os.path.abspath(args.bin)
    sys.path.insert(0, str(REPO / "Tests" / "mount"))
    import conftest  # noqa: E402  (reads UBIQUITYFS_BIN)
    from partition import Partition, parse_skip  # noqa: E402

    if not (conftest.BIN.is_file() and os.access(conftest.BIN, os.X_OK)):
        print(f"no ubiquityfs binary at {conftest.BIN} (--bin or UBIQUITYFS_BIN)", file=sys.stderr)
        return 2
    skip = parse_skip(args.skip)
    seeds = parse_seeds(args.seeds)
    counts = [int(x) for x in args.devices.split(",") if x.strip()]
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    failures_file = work / "failures.txt"
    print(f"binary {conftest.BIN}; seeds {args.seeds}; {args.rounds} rounds; devices {counts}; skip {sorted(skip) or 'nothing'}; workdir {work}",
          flush=True)

    stats = {n: dict(runs=0, rounds=0, failed_rounds=0, diverged=0, lost=0, lost_old=0, links=0, op_errors=0, other=0,
                     seconds=0.0)
             for n in counts}
    failing: list[str] = []
    t_start = time.monotonic()
    for seed in seeds:
        for n in counts:
            st = stats[n]
            base = work / f"seed{seed}-{n}dev-{int(time.time())}"
            base.mkdir()
            store = base / "store"
            store.mkdir()
            devices = []

            def make(name, link, base=base, store=store):
                dev = conftest.Device(base, link, name)
                devices.append(dev)
                return dev

            say = (lambda s: None) if args.quiet else (lambda s: print("   ", s, flush=True))
            part = Partition(make, base, store, n, seed, skip=skip, say=say)
            failed = None
            t0 = time.monotonic()
            try:
                part.start()
                st["runs"] += 1
                for rnd in range(args.rounds):
                    res = part.round(rnd)
                    st["rounds"] += 1
                    if not args.quiet:
                        print(f"  seed {seed} devices {n} round {rnd}: {'ok' if res.ok else 'FAILED'} "
                              f"{res.seconds:.1f}s (converged {res.converge_seconds:.1f}s) "
                              f"{len(part.tree)} entries", flush=True)
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
          f"{'operr':>5} {'other':>5} {'s/round':>7}")
    for n, st in stats.items():
        per = st["seconds"] / st["rounds"] if st["rounds"] else 0
        print(f"{n:>7} {st['runs']:>5} {st['rounds']:>6} {st['failed_rounds']:>6} {st['diverged']:>8} "
              f"{st['lost']:>5} {st['lost_old']:>7} {st['links']:>5} {st['op_errors']:>5} {st['other']:>5} {per:>7.1f}")
    if failing:
        print("failing seeds:")
        for line in failing:
            print("  " + line)
        print(f"full reports: {failures_file}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
