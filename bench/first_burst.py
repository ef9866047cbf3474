#!/usr/bin/env python3
"""Bursts of small-file creates on a mount, one after another: is the first
burst on a freshly mounted drive as fast as the later ones (issue 41)?

    python3 bench/first_burst.py [--bursts 4] [--files 1000] [--pause 0.5] DIR [DIR...]

Each burst creates FILES files of 4 KiB (open, write, close) in a new
folder of DIR, then pauses; prints creates per second per burst. Mount the
drive just before for a first burst; give bindfs's folder too, in the same
run, to compare.
"""
import argparse
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--bursts", type=int, default=4)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--pause", type=float, default=0.5)
    args = ap.parse_args()
    data = os.urandom(4096)
    for root in args.dirs:
        rates = []
        for b in range(args.bursts):
            d = os.path.join(root, f"burst-{os.getpid()}-{b}")
            os.makedirs(d)
            t0 = time.perf_counter()
            for i in range(args.files):
                fd = os.open(os.path.join(d, f"f{i:06d}"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
                os.write(fd, data)
                os.close(fd)
            rates.append(args.files / (time.perf_counter() - t0))
            time.sleep(args.pause)
        print(f"{root}: " + ", ".join(f"{r:,.0f}" for r in rates) + " creates/s")


if __name__ == "__main__":
    main()
