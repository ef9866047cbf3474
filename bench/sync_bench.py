#!/usr/bin/env python3
"""UbiquityFS sync benchmark: two devices on one folder store, real mounts.

A benchmark script, not a test: it prints figures next to the issue's goals.

  propagation  close() on device A until the new content is readable on B,
               p50 / p99 over N edits                      goal p50 <= 1 s, p99 <= 3 s
  join         a new device mounts a container of N items: time until
               `ls -R` of the mount completes               goal <= 10 s for 100,000
  push         N x 4 KiB files written on A: files pushed per second
               (writes start -> nothing pending)            goal >= 1,000/s
  placeholder  read a 1 GiB placeholder on B vs `cat` of its blob files
               from the store (MiB/s)
  query        `ubiquityfs query` with a name predicate and a sort over the
               100,000 items of the join tree, process start included,
               median of 7                                  goal <= 200 ms
  watch        close() on device A until B's `query --watch` (throttle 0.2 s)
               reports the item, p50 / p99 over N files, with the join tree's
               100,000 items in the container               goal: propagation + throttle

Run as root from the repository: python3 bench/sync_bench.py [--quick]
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Device:
    def __init__(self, binary, base, name, store):
        self.binary, self.name, self.store = binary, name, store
        self.data = os.path.join(base, name, "data")
        self.mp = os.path.join(base, name, "mnt")
        os.makedirs(self.data)
        os.makedirs(self.mp)
        self.mounted = False

    def env(self):
        env = dict(os.environ)
        env["XDG_DATA_HOME"] = self.data
        return env

    def cli(self, *args, check=True):
        with tempfile.TemporaryFile() as out:
            res = subprocess.run([self.binary, *args], env=self.env(), stdout=out, stderr=subprocess.STDOUT)
            out.seek(0)
            text = out.read().decode(errors="replace")
        if check and res.returncode != 0:
            raise RuntimeError(f"ubiquityfs {' '.join(args)}: {text}")
        return text

    def mount(self):
        self.cli("mount", self.mp, "--store", self.store, "--device-name", self.name)
        self.mounted = True

    def unmount(self):
        if self.mounted:
            if subprocess.run([self.binary, "unmount", self.mp], env=self.env(), capture_output=True).returncode != 0:
                subprocess.run([self.binary, "unmount", "--force", self.mp], env=self.env(), capture_output=True)
            self.mounted = False

    def status(self):
        return json.loads(self.cli("status", self.mp, "--json"))

    def wait_pushed(self, timeout=600):
        deadline = time.time() + timeout
        quiet = 0
        while time.time() < deadline:
            s = self.status()
            quiet = quiet + 1 if s["pendingItems"] == 0 else 0
            if quiet >= 2:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: still pending after {timeout} s")


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def bench_propagation(a, b, edits):
    lat = []
    for i in range(edits):
        data = f"version {i} {os.urandom(8).hex()}\n".encode()
        name = f"prop{i % 10}.txt"
        with open(os.path.join(a.mp, name), "wb") as f:
            f.write(data)
        t0 = time.perf_counter()
        while True:
            try:
                with open(os.path.join(b.mp, name), "rb") as f:
                    if f.read() == data:
                        break
            except FileNotFoundError:
                pass
            if time.perf_counter() - t0 > 30:
                raise RuntimeError(f"edit {i} did not arrive within 30 s")
            time.sleep(0.002)
        lat.append(time.perf_counter() - t0)
    lat.sort()
    return {"p50": statistics.median(lat), "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))], "max": lat[-1]}


def bench_push(a, files):
    d = os.path.join(a.mp, "push")
    os.makedirs(d)
    payload = os.urandom(4096)
    t0 = time.perf_counter()
    for i in range(files):
        with open(os.path.join(d, f"f{i:05d}"), "wb") as f:
            f.write(payload[:4088] + i.to_bytes(8, "little"))   # distinct content: one blob each
    written = time.perf_counter() - t0
    a.wait_pushed()
    total = time.perf_counter() - t0
    return {"files": files, "write_s": written, "pushed_s": total, "files_per_s": files / total}


def bench_join(binary, base, store, a, items):
    d = os.path.join(a.mp, "join")
    os.makedirs(d)
    per_dir = 1000
    t0 = time.perf_counter()
    for i in range(items):
        if i % per_dir == 0:
            sub = os.path.join(d, f"d{i // per_dir:04d}")
            os.mkdir(sub)
        with open(os.path.join(sub, f"f{i:06d}"), "wb") as f:
            f.write(b"x" * 16)
    a.wait_pushed()
    created = time.perf_counter() - t0
    c = Device(binary, base, "joiner", store)
    t0 = time.perf_counter()
    c.mount()
    mounted = time.perf_counter() - t0
    out = subprocess.run(["ls", "-R", c.mp], capture_output=True, text=True, check=True).stdout
    listed = time.perf_counter() - t0
    # Count the files of the joined container's `join/` folder only.
    count, inside = 0, False
    for line in out.splitlines():
        if line.endswith(":"):
            inside = line.startswith(os.path.join(c.mp, "join"))
        elif inside and line.startswith("f"):
            count += 1
    c.unmount()
    return {"items": items, "created_and_pushed_s": created, "mount_s": mounted, "ls_R_done_s": listed, "files_listed": count}


def bench_placeholder(a, b, store, mib):
    path = os.path.join(a.mp, "big.bin")
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(mib):
            f.write(chunk[:-8] + i.to_bytes(8, "little"))
    a.wait_pushed()
    target = os.path.join(b.mp, "big.bin")
    t0 = time.time()
    while not os.path.exists(target):
        if time.time() - t0 > 60:
            raise RuntimeError("big.bin did not arrive")
        time.sleep(0.05)
    # The blobs of this file: every blob of about 4 MiB in the store (chunks).
    blobs = []
    for root, _, names in os.walk(os.path.join(store, "blobs")):
        for n in names:
            p = os.path.join(root, n)
            if os.path.getsize(p) >= (1 << 20):
                blobs.append(p)
    drop_caches()
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", 'cat "$@" > /dev/null', "cat", *blobs], check=True)
    cat_s = time.perf_counter() - t0
    drop_caches()
    t0 = time.perf_counter()
    with open(target, "rb", buffering=0) as f:
        buf = bytearray(1 << 20)
        while f.readinto(buf):
            pass
    read_s = time.perf_counter() - t0
    return {"mib": mib, "placeholder_read_mibs": mib / read_s, "cat_blobs_mibs": mib / cat_s, "ratio": cat_s / read_s}


def bench_query(a, items, runs=7):
    """Needs the join tree (100,000 files in join/dNNNN/fNNNNNN) on A."""
    predicate = "name LIKE[c] 'f0012*' AND size > 10"
    times, found = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        out = a.cli("query", a.mp, "--predicate", predicate, "--sort", "-name,size", "--json")
        times.append(time.perf_counter() - t0)
        found = sum(1 for line in out.splitlines() if line.startswith('{"event":"result"'))
    everything = a.cli("query", a.mp, "--predicate", "size >= 0", "--json").count('{"event":"result"')
    return {"items_in_mount": everything, "matches": found, "p50_s": statistics.median(times), "max_s": max(times),
            "runs": runs, "predicate": predicate}


def bench_watch(a, b, files, throttle=0.2):
    import queue
    import threading
    proc = subprocess.Popen([b.binary, "query", b.mp, "--watch", "--json", "--throttle", str(throttle),
                             "--predicate", "name BEGINSWITH 'watched-'"], env=b.env(), stdout=subprocess.PIPE, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put((time.perf_counter(), json.loads(l))) for l in proc.stdout],
                     daemon=True).start()
    try:
        while lines.get(timeout=60)[1]["event"] != "gatheringFinished":
            pass
        latencies = []
        for i in range(files):
            name = f"watched-{i:04d}.txt"
            t0 = time.perf_counter()
            with open(os.path.join(a.mp, name), "wb") as f:
                f.write(b"w" * 100)
            while True:
                arrived, event = lines.get(timeout=30)
                if event["event"] == "added" and event["item"]["name"] == name:
                    latencies.append(arrived - t0)
                    break
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(10)
    latencies.sort()
    return {"files": files, "throttle_s": throttle, "p50": statistics.median(latencies),
            "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], "max": latencies[-1]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=None)
    ap.add_argument("--quick", action="store_true", help="small sizes")
    ap.add_argument("--workdir", default="/tmp/ubq-sync-bench")
    ap.add_argument("--only", default="propagation,watch,push,placeholder,join,query")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    binary = args.bin or next(p for p in (os.path.join(REPO, ".build/release/ubiquityfs"),
                                          os.path.join(REPO, ".build/debug/ubiquityfs")) if os.path.exists(p))
    edits, pushes, items, mib = (50, 1000, 10000, 256) if args.quick else (200, 10000, 100000, 1024)
    if os.path.exists(args.workdir):
        shutil.rmtree(args.workdir)
    os.makedirs(args.workdir)
    store = os.path.join(args.workdir, "store")
    os.makedirs(store)
    a = Device(binary, args.workdir, "laptop", store)
    b = Device(binary, args.workdir, "desktop", store)
    results = {}
    try:
        a.mount()
        b.mount()
        only = args.only.split(",")
        if "propagation" in only:
            results["propagation"] = bench_propagation(a, b, edits)
        if "push" in only:
            results["push"] = bench_push(a, pushes)
        if "placeholder" in only:
            results["placeholder"] = bench_placeholder(a, b, store, mib)
        if "join" in only or "query" in only:
            results["join"] = bench_join(binary, args.workdir, store, a, items)
        if "query" in only:
            results["query"] = bench_query(a, items)
        if "watch" in only:
            # After the join tree when it is there: each update batch re-runs the query over every item.
            results["watch"] = bench_watch(a, b, edits // 4)
    finally:
        for d in (a, b):
            d.unmount()
        shutil.rmtree(args.workdir, ignore_errors=True)
    print(f"\nUbiquityFS sync benchmark ({time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cpus, binary {binary})")
    if "propagation" in results:
        r = results["propagation"]
        print(f"  propagation over {edits} edits: p50 {r['p50']:.3f} s, p99 {r['p99']:.3f} s, max {r['max']:.3f} s"
              f"   goal p50 <= 1 s, p99 <= 3 s  {'ok' if r['p50'] <= 1 and r['p99'] <= 3 else 'MISS'}")
    if "push" in results:
        r = results["push"]
        print(f"  push of {r['files']} x 4 KiB: written in {r['write_s']:.1f} s, all pushed after {r['pushed_s']:.1f} s"
              f" = {r['files_per_s']:.0f} files/s   goal >= 1,000/s  {'ok' if r['files_per_s'] >= 1000 else 'MISS'}")
    if "placeholder" in results:
        r = results["placeholder"]
        print(f"  {r['mib']} MiB placeholder read: {r['placeholder_read_mibs']:.0f} MiB/s vs cat of its blobs"
              f" {r['cat_blobs_mibs']:.0f} MiB/s (ratio {r['ratio']:.2f})")
    if "join" in results:
        r = results["join"]
        print(f"  new device joining {r['items']} items: mounted in {r['mount_s']:.1f} s, ls -R done after"
              f" {r['ls_R_done_s']:.1f} s ({r['files_listed']} files listed)   goal <= 10 s"
              f"  {'ok' if r['ls_R_done_s'] <= 10 and r['files_listed'] == r['items'] else 'MISS'}")
    if "watch" in results:
        r = results["watch"]
        goal = (results["propagation"]["p50"] + r["throttle_s"]) if "propagation" in results else None
        verdict = "" if goal is None else f"   goal <= propagation p50 + throttle = {goal:.2f} s  {'ok' if r['p50'] <= goal else 'MISS'}"
        print(f"  --watch update on B after a write on A ({r['files']} files, throttle {r['throttle_s']} s):"
              f" p50 {r['p50']:.3f} s, p99 {r['p99']:.3f} s, max {r['max']:.3f} s{verdict}")
    if "query" in results:
        r = results["query"]
        print(f"  query \"{r['predicate']}\" --sort -name,size over {r['items_in_mount']} items: {r['matches']} matches,"
              f" p50 {r['p50_s'] * 1000:.0f} ms, max {r['max_s'] * 1000:.0f} ms (wall, process start included)"
              f"   goal <= 200 ms  {'ok' if r['p50_s'] <= 0.2 else 'MISS'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
