#!/usr/bin/env python3
"""What a sync of the operation log costs on this disk: an 800-byte record
written and `fdatasync`ed, appended to a growing file (the filesystem's
journal commits the new size and blocks) against written over zeros
written ahead (a data flush only: `OperationLog.writtenAhead`). Microseconds
per record, median of --rounds rounds of --records records.

    python3 bench/log_sync.py [--dir DIR] [--records 500] [--rounds 3]
"""
import argparse
import os
import statistics
import tempfile
import time


def run(path: str, ahead: bool, records: int) -> float:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if ahead:
            os.pwrite(fd, bytes(1 << 20), 0)
            os.fsync(fd)
        record = b"r" * 800
        t0 = time.perf_counter()
        for i in range(records):
            os.pwrite(fd, record, i * len(record))
            os.fdatasync(fd)
        return (time.perf_counter() - t0) / records * 1e6
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--records", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    path = os.path.join(args.dir, f"log-sync-{os.getpid()}")
    appended = [run(path, False, args.records) for _ in range(args.rounds)]
    ahead = [run(path, True, args.records) for _ in range(args.rounds)]
    print(f"appended: {statistics.median(appended):.0f} us/record   "
          f"over zeros written ahead: {statistics.median(ahead):.0f} us/record")


if __name__ == "__main__":
    main()
