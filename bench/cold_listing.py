#!/usr/bin/env python3
"""Cold listing of a folder: the page cache and the kernel's dentries are
dropped (`sync; echo 3 > /proc/sys/vm/drop_caches`, root only), then the
folder is listed once (`os.listdir`), and listed with an `lstat` of every
entry (`ls -l`); medians over --times runs, in milliseconds.

    python3 bench/cold_listing.py [--make N] [--times 11] DIR [DIR...]

Give the same folder through several mounts (ubiquityfs, bindfs, the plain
folder) in one run: figures from different runs do not compare. `--make N`
first fills each DIR with N empty files (f000000...) if it has fewer.
"""
import argparse
import os
import statistics
import time


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    time.sleep(0.2)


def cold(action, times: int) -> float:
    samples = []
    for _ in range(times):
        drop_caches()
        t0 = time.perf_counter()
        action()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--times", type=int, default=11)
    ap.add_argument("--make", type=int, default=0)
    args = ap.parse_args()
    for d in args.dirs:
        if args.make and len(os.listdir(d)) < args.make:
            for i in range(args.make):
                open(os.path.join(d, f"f{i:06d}"), "a").close()
        n = len(os.listdir(d))

        def listing():
            os.listdir(d)

        def long_listing():
            for name in os.listdir(d):
                os.lstat(os.path.join(d, name))

        print(f"{d}: {n} entries  cold listing {cold(listing, args.times):.2f} ms  "
              f"cold ls -l {cold(long_listing, max(3, args.times // 2)):.2f} ms")


if __name__ == "__main__":
    main()
