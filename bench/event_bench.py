#!/usr/bin/env python3
"""Events for remote changes: what they cost and how late they come.

A benchmark script, not a test (issue 37, "Measure"). Two devices on one
folder store, real mounts:

  latency   A writes and closes a new file; B's `inotifywait` reports its
            CLOSE_WRITE (event) and a poller on B sees the file (propagation).
            p50 / p99 over N files, both from A's close().
            goal: event p50 <= propagation p50 + 50 ms
  burst     10,000 files written on A while B's daemon is stopped (SIGSTOP),
            then B resumes: time until B's query lists all of them, with
            nobody watching (B's kernel never saw the folder: no replay), and
            with `inotifywait -r` on the folder (until every CREATE event
            has arrived).                                  goal: watched <= 1.5x

Run as root from the repository: python3 bench/event_bench.py [--bin PATH] [--edits N] [--files N]
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Device:
    def __init__(self, binary, work, store, name):
        self.binary, self.name = binary, name
        self.data = os.path.join(work, name, "data")
        self.mnt = os.path.join(work, name, "mnt")
        os.makedirs(self.data)
        os.makedirs(self.mnt)
        self.store = store
        self.pid = None

    def cli(self, *args, check=True):
        env = dict(os.environ, XDG_DATA_HOME=self.data)
        res = subprocess.run([self.binary, *args], env=env, capture_output=True, text=True)
        if check and res.returncode != 0:
            sys.exit(f"{self.name}: ubiquityfs {' '.join(args)} failed: {res.stderr}")
        return res

    def mount(self):
        out = self.cli("mount", self.mnt, "--store", self.store, "--device-name", self.name).stdout
        self.pid = int(out.split("daemon pid ")[1].split(";")[0])

    def unmount(self):
        if self.pid:
            os.kill(self.pid, signal.SIGCONT)
            self.cli("unmount", self.mnt, check=False)

    def count(self, folder, prefix):
        out = self.cli("query", self.mnt, "--predicate", f"kMDItemFSName BEGINSWITH '{prefix}'", "--json").stdout
        return sum(1 for line in out.splitlines() if f"/{folder}/" in line)


class Watch:
    def __init__(self, *argv):
        self.proc = subprocess.Popen(["inotifywait", "-m", "--format", "%e %f", *argv],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.seen = {}
        self.lock = threading.Lock()
        ready = threading.Event()

        def errors():
            for line in self.proc.stderr:
                if "Watches established" in line:
                    ready.set()
        threading.Thread(target=errors, daemon=True).start()
        threading.Thread(target=self.read, daemon=True).start()
        ready.wait(30)

    def read(self):
        for line in self.proc.stdout:
            now = time.monotonic()
            events, _, name = line.rstrip("\n").partition(" ")
            if "CLOSE_WRITE" in events or "CREATE" in events:
                with self.lock:
                    self.seen.setdefault((events.split(",")[0], name), now)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def latency(a, b, edits):
    os.makedirs(os.path.join(a.mnt, "lat"))
    while not os.path.isdir(os.path.join(b.mnt, "lat")):
        time.sleep(0.01)
    watch = Watch(os.path.join(b.mnt, "lat"))
    events, propagation = [], []
    for i in range(edits):
        name = f"e{i:04d}"
        with open(os.path.join(a.mnt, "lat", name), "w") as f:
            f.write(f"edit {i}\n")
        closed = time.monotonic()
        target = os.path.join(b.mnt, "lat", name)
        while not os.path.exists(target) and time.monotonic() - closed < 30:
            time.sleep(0.002)
        propagation.append(time.monotonic() - closed)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with watch.lock:
                t = watch.seen.get(("CLOSE_WRITE", name))
            if t is not None:
                events.append(t - closed)
                break
            time.sleep(0.002)
        time.sleep(0.05)
    watch.stop()
    return events, propagation


def burst(a, b, files, folder, watched):
    os.makedirs(os.path.join(a.mnt, folder))
    watch = None
    if watched:
        while not os.path.isdir(os.path.join(b.mnt, folder)):
            time.sleep(0.05)
        watch = Watch("-r", os.path.join(b.mnt, folder))
    else:
        time.sleep(3)   # B pulls the folder; nothing on B looks at it
    os.kill(b.pid, signal.SIGSTOP)
    for i in range(files):
        with open(os.path.join(a.mnt, folder, f"b{i:05d}"), "w") as f:
            f.write("x")
    while "Uploads:      0 items" not in a.cli("status", a.mnt).stdout:
        time.sleep(0.2)
    start = time.monotonic()
    os.kill(b.pid, signal.SIGCONT)
    while b.count(folder, "b") < files:
        time.sleep(0.1)
    listed = time.monotonic() - start
    done = listed
    if watch:
        while True:
            with watch.lock:
                n = sum(1 for (e, _) in watch.seen if e == "CREATE")
            if n >= files:
                break
            if time.monotonic() - start > 600:
                break
            time.sleep(0.05)
        done = time.monotonic() - start
        watch.stop()
    return listed, done


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.path.join(REPO, ".build", "release", "ubiquityfs"))
    parser.add_argument("--edits", type=int, default=200)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    if not os.path.exists(args.bin):
        args.bin = os.path.join(REPO, ".build", "debug", "ubiquityfs")
    if shutil.which("inotifywait") is None:
        sys.exit("inotifywait is needed (Debian: inotify-tools)")
    work = tempfile.mkdtemp(prefix="ubq-event-bench-")
    store = os.path.join(work, "store")
    os.makedirs(store)
    a, b = Device(args.bin, work, store, "a"), Device(args.bin, work, store, "b")
    try:
        a.mount()
        b.mount()
        events, propagation = latency(a, b, args.edits)
        quiet, _ = burst(a, b, args.files, "quiet", watched=False)
        listed, watched = burst(a, b, args.files, "watched", watched=True)
        print(f"binary: {args.bin}")
        print(f"latency over {args.edits} new files (A's close -> B), seconds:")
        print(f"  propagation  p50 {statistics.median(propagation):.3f}  p99 {pct(propagation, 99):.3f}")
        print(f"  event        p50 {statistics.median(events):.3f}  p99 {pct(events, 99):.3f}"
              f"   (goal: p50 <= propagation p50 + 0.050)")
        print(f"burst of {args.files} files, B resumed -> all listed (and all CREATE events):")
        print(f"  no watcher   {quiet:.2f} s")
        print(f"  watched      {listed:.2f} s listed, {watched:.2f} s all events   ratio {watched / quiet:.2f} (goal <= 1.5)")
    finally:
        a.unmount()
        b.unmount()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
