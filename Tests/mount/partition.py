"""Partitions on real mounts: the shared logic of `test_partition.py` (CI) and
`bench/partition_campaign.py` (long campaigns).

N devices (2 or 3) mount one store.  On a folder store each has `--store` =
its own symlink to the store; on an S3 store (`conftest.S3StoreRef`) each
reaches the server through its own fault proxy (Tests/servers/faultproxy.py).
Each round:

1. every device is cut off: its symlink is re-pointed to an empty folder (what
   a dropped network share looks like), or its proxy answers every request
   with a 5xx (error_rate 1.0); we wait until `status --json` says
   `storeReachable: false` on every device cut off.  With `online_faults`
   (S3 only: a dict of FaultProxy rates), some devices (chosen at random, at
   least one device is always cut off) stay online instead, through a proxy
   that fails, throttles, resets, truncates and stalls that share of requests;
2. each device does a dozen random operations on a small shared namespace
   (folders d0..d4, files f0..f4 in each): write new content, append, rename a
   file (across folders, over an existing name), unlink, mkdir, rmdir, rename
   a folder, and (on even seeds) move a folder into another one.  The ops
   mirror `Tests/UbiquityCoreTests/PartitionModelTests.swift`;
3. every symlink is restored (in a random order, with small random delays);
   an S3 proxy goes back to no faults, or with `online_faults` to those
   faults: then we wait (at most FAULT_PHASE_TIMEOUT) until every device is
   quiet under them, and turn the faults off;
   we wait until every device is quiet and every device shows the same tree
   (bounded: CONVERGE_TIMEOUT).

Then the round is checked:

* diverged: the devices' trees (names, kinds, modes, sizes, SHA-256 of the
  content) are not identical within CONVERGE_TIMEOUT;
* lost: a content a device wrote in this round (every write and append
  carries a unique token) that no device superseded afterwards (overwrote,
  unlinked or renamed over, having read it there: the writer itself, or an
  online device that pulled it) is in no file of the tree — at its path,
  renamed or in a conflicted copy;
* lost older content: a content that was in the tree when the round began,
  and that no device superseded in the round, is in no file any more (e.g. a
  file moved into a folder that another device deleted);
* links: a file has `st_nlink` > 1 or two names share an inode (the ops never
  make hard links);
* op errors: an operation failed with an errno other than the expected
  namespace ones (ENOENT, EEXIST, ENOTEMPTY, ...), e.g. EIO;
* other: a daemon died, the empty folder was written to, a device never went
  offline, a name that is neither one the operations make nor a conflicted
  copy of one.

The state carries over between rounds, so rounds compound.  A seed stops at
its first failing round (later rounds would only compound it).  Timing is not
deterministic (which device commits first decides conflict outcomes), so a
replay with the same seed does the same operations as long as the outcomes of
the earlier rounds were the same.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import stat
import subprocess
import sys
import time
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from conftest import BIN, S3StoreRef, digest_diff, pid_alive

SERVERS = Path(__file__).resolve().parents[1] / "servers"

# Seconds within which all devices must be quiet and show the same tree after
# the stores came back.
CONVERGE_TIMEOUT = float(os.environ.get("UBQ_PARTITION_CONVERGE_TIMEOUT", "60"))
# Seconds within which a cut-off device's status must say storeReachable false.
# On S3 a request that gets 5xx is tried 5 times (backing off up to 1.5 s in
# all), and a request already in flight when the proxy cuts may be a stalled
# one (online faults) that only times out after 10 s: hence more time.
OFFLINE_TIMEOUT = 20.0
OFFLINE_TIMEOUT_S3 = 40.0
# With online faults: seconds the devices get, after reconnecting through
# faulty proxies, to become quiet before the faults are turned off.
FAULT_PHASE_TIMEOUT = float(os.environ.get("UBQ_PARTITION_FAULT_PHASE", "30"))
# The faults of `--online-faults` (bench) and of the S3 test variant that has them.
DEFAULT_ONLINE_FAULTS = dict(error_rate=0.05, throttle_rate=0.02, reset_rate=0.02, truncate_rate=0.02,
                             stall_rate=0.005, stall_seconds=12)
OPS_PER_DEVICE = 12
BASE_DIRS = ["d0", "d1", "d2"]
NAMES = [f"f{i}" for i in range(5)]
# A name the operations make (d0..d4, f0..f4), possibly as a conflicted copy
# (docs/SEMANTICS.md: "NAME (conflicted copy DEVICE YYYY-MM-DD HHMMSS).EXT"),
# possibly of a conflicted copy.
NAME_RE = re.compile(r"^[df]\d( \(conflicted copy [a-c] \d{4}-\d\d-\d\d \d{6}( \d+)?\))*$")
TOKEN_RE = re.compile(rb"<[a-z]:\d+:\d+:[0-9a-f]{8}>")
EXPECTED_ERRNOS = {errno.ENOENT, errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR, errno.EINVAL}
LABELS = "abc"
# Kinds of operation that can be skipped (UBQ_PARTITION_SKIP, --skip): to look
# past a known bug.  "rmdir": every rmdir; "dir-over": renaming or moving a
# folder onto an existing folder (which replaces, i.e. deletes, that folder).
SKIPPABLE = {"rmdir", "dir-over"}


def parse_skip(text: str | None) -> frozenset[str]:
    skip = frozenset(x.strip() for x in (text or "").split(",") if x.strip())
    unknown = skip - SKIPPABLE
    if unknown:
        raise ValueError(f"cannot skip {sorted(unknown)}; skippable: {sorted(SKIPPABLE)}")
    return skip


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


# --------------------------------------------------------------------------
# Store links, status
# --------------------------------------------------------------------------


class StoreLink:
    """A symlink to the real store; `point_to(empty)` makes the store look
    like a dropped network share for the device mounted through it."""

    def __init__(self, path: Path, target: Path):
        self.path = Path(path)
        self.target = Path(target)
        os.symlink(self.target, self.path)

    def point_to(self, target: Path) -> None:
        tmp = self.path.with_name(self.path.name + ".new")
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, self.path)  # atomic: the path never disappears in between

    def restore(self) -> None:
        self.point_to(self.target)


class ProxyLink:
    """The S3 counterpart of StoreLink: the device reaches the server through
    its own FaultProxy; `cut()` answers every request with a 5xx, `restore()`
    gives it the server back (with `faults`, through those faults)."""

    def __init__(self, store: S3StoreRef, seed: int | None = None):
        if str(SERVERS) not in sys.path:
            sys.path.insert(0, str(SERVERS))
        from faultproxy import RATE_KEYS, FaultProxy
        self.rates_off = dict.fromkeys(RATE_KEYS, 0.0)
        self.proxy = FaultProxy(store.endpoint, seed=seed).start()
        self.path = store.via(self.proxy.url)
        self.state = "online"

    def cut(self) -> None:
        self.proxy.configure(**{**self.rates_off, "error_rate": 1.0})
        self.state = "cut"

    def restore(self, faults: dict | None = None) -> None:
        self.proxy.configure(**{**self.rates_off, **(faults or {})})
        self.state = "faulty" if faults else "online"

    def stats(self) -> dict:
        return self.proxy.stats()["counters"]

    def stop(self) -> None:
        self.proxy.stop()


def status_json(dev) -> dict:
    """`ubiquityfs status MP --json` of a device (output captured, not logged:
    the campaign calls it thousands of times)."""
    proc = subprocess.run(
        [str(BIN), "status", str(dev.mountpoint), "--json"],
        env=dev.env(), capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"status of {dev.name} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[0])


def short_status(s: dict) -> str:
    keys = ("storeReachable", "pendingItems", "pendingBytes", "downloadingItems", "failingUploads", "lastSync")
    out = {k: s.get(k) for k in keys}
    out["recentErrors"] = [e.get("message") for e in s.get("recentErrors", [])[-3:]]
    return json.dumps(out)


@dataclass(frozen=True)
class S3Record:
    """A journal record of an S3 store: read with a signed GET straight from
    the server (not through any device's proxy)."""
    store: S3StoreRef
    key: str  # below the bucket: PREFIX/containers/HEXID/journal/SEQ

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[1]

    @property
    def container(self) -> str:
        hexid = self.key.rsplit("/", 3)[1]  # the container ID's UTF-8 in hex
        try:
            return bytes.fromhex(hexid).decode()
        except ValueError:
            return hexid

    def read_text(self) -> str:
        status, _, data = s3_call(self.store, "GET", "/" + _bucket_prefix(self.store)[0] + "/" + self.key)
        if status != 200:
            raise OSError(f"GET {self.key}: {status} {data[:200]!r}")
        return data.decode()


def _bucket_prefix(store: S3StoreRef) -> tuple[str, str]:
    bucket, _, prefix = str(store)[len("s3://"):].partition("/")
    prefix = prefix.strip("/")
    return bucket, prefix + "/" if prefix else ""


def s3_call(store: S3StoreRef, method: str, path: str, query: dict | None = None) -> tuple[int, dict, bytes]:
    """A signed request to the store's server, with the credentials of the
    environment (conftest.s3_server exports them)."""
    if str(SERVERS) not in sys.path:
        sys.path.insert(0, str(SERVERS))
    import s3servers
    info = {"endpoint": store.endpoint, "region": store.region,
            "access_key": os.environ["AWS_ACCESS_KEY_ID"], "secret_key": os.environ["AWS_SECRET_ACCESS_KEY"]}
    return s3servers.s3_request(info, method, path, query)


def s3_journal_keys(store: S3StoreRef) -> list[S3Record]:
    """Every journal record key of every container (ListObjectsV2, paged)."""
    bucket, prefix = _bucket_prefix(store)
    keys, token = [], None
    while True:
        query = {"list-type": "2", "prefix": prefix + "containers/", "max-keys": "1000"}
        if token:
            query["continuation-token"] = token
        status, _, data = s3_call(store, "GET", f"/{bucket}", query)
        if status != 200:
            raise OSError(f"LIST {prefix}containers/: {status} {data[:200]!r}")
        root = ET.fromstring(data)
        ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
        keys += [urllib.parse.unquote(k.text) if root.findtext(f"{ns}EncodingType") == "url" else k.text
                 for k in root.iter(f"{ns}Key")]
        if root.findtext(f"{ns}IsTruncated") != "true":
            break
        token = root.findtext(f"{ns}NextContinuationToken")
    return [S3Record(store, k) for k in keys if re.search(r"/journal/\d{16}$", k)]


def journal_records(store) -> list:
    """The change-set records of every container of the store, in order:
    Paths (folder store) or S3Records."""
    if isinstance(store, S3StoreRef):
        return sorted(s3_journal_keys(store), key=lambda r: (r.container, r.name))
    return sorted(Path(store).glob("containers/*/journal/*"), key=lambda p: (p.parent.parent.name, p.name))


def describe_record(path) -> str:
    """One change set of the journal, compact: node ids shortened to 4 characters."""
    def short(v):
        return v if v == "root" or not isinstance(v, str) else v[:4]
    try:
        record = json.loads(path.read_text())
    except Exception as e:  # noqa: BLE001 - OSError, bad JSON, an S3 GET that failed: the report goes on
        return f"#{path.name} unreadable: {e!r}"
    parts = []
    for c in record.get("changes", []):
        op = c.get("op")
        if op == "node":
            what = f"node {short(c.get('id'))} {c.get('kind')} base {c.get('base')}"
            if c.get("kind") == "file":
                what += f" {c.get('size')}B {str(c.get('hash'))[:8]}"
        elif op == "entry":
            child = short(c["child"]) if c.get("child") else "(removed)"
            what = f"entry {short(c.get('parent'))}/{c.get('name')} -> {child}"
        elif op == "delete":
            what = f"delete {short(c.get('id'))} base {c.get('base')}"
        else:
            what = json.dumps({k: short(v) for k, v in c.items()
                               if k not in ("uid", "gid", "ctime", "mtime", "btime", "rdev", "xattrs", "mode")})
        parts.append(what)
    container = path.container if isinstance(path, S3Record) else path.parent.parent.name
    head = f"#{int(path.name)} {container.split('.')[-1]} by {record.get('deviceName')}:"
    return head + "\n      " + "\n      ".join(parts)


# --------------------------------------------------------------------------
# Trees
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int
    size: int | None
    sha: str | None
    tokens: tuple[str, ...]
    nlink: int
    ino: int

    @property
    def digest(self) -> tuple:
        # The same tuple as conftest.tree_digest.
        return (self.kind, self.mode, self.size, self.sha)


def scan(root) -> dict[str, Entry]:
    """relpath -> Entry for everything below root: tree_digest's (kind, mode,
    size, sha256) plus the tokens in each file, st_nlink and the inode.
    Reads every byte (so every device downloads everything)."""
    root = os.fspath(root)
    out: dict[str, Entry] = {}

    def fail(err):
        raise err

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    data = f.read()
                toks = tuple(sorted(t.decode() for t in TOKEN_RE.findall(data)))
                out[rel] = Entry("file", mode, len(data), hashlib.sha256(data).hexdigest(), toks,
                                 st.st_nlink, st.st_ino)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = Entry("dir", mode, None, None, (), st.st_nlink, st.st_ino)
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = Entry("symlink", mode, st.st_size, os.readlink(path), (), st.st_nlink, st.st_ino)
            else:
                out[rel] = Entry("other", mode, st.st_size, None, (), st.st_nlink, st.st_ino)
    return out


def meta_scan(root) -> dict[str, tuple]:
    """relpath -> (kind, size) from lstat alone (reads no content)."""
    root = os.fspath(root)
    out: dict[str, tuple] = {}

    def fail(err):
        raise err

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
            out[os.path.relpath(path, root)] = (kind, None if kind == "dir" else st.st_size)
    return out


def digest_of(tree: dict[str, Entry]) -> dict[str, tuple]:
    return {rel: e.digest for rel, e in tree.items()}


def describe_tree(tree: dict[str, Entry], indent: str = "  ") -> str:
    if not tree:
        return indent + "(empty)"
    lines = []
    for rel in sorted(tree):
        e = tree[rel]
        if e.kind == "dir":
            lines.append(f"{indent}{rel}/")
        else:
            lines.append(f"{indent}{rel}  {e.kind} {e.size}B {e.sha[:8] if e.sha else ''} {' '.join(e.tokens)}")
    return "\n".join(lines)


def tree_diff(a: dict[str, Entry], b: dict[str, Entry]) -> str:
    """digest_diff of the two trees, files annotated with their tokens."""
    def show(tree):
        return {rel: (e.kind, e.size, e.sha[:12] if e.sha else None, e.tokens) for rel, e in tree.items()}
    return digest_diff(show(a), show(b))


def link_problems(label: str, tree: dict[str, Entry]) -> list[str]:
    problems = []
    by_ino: dict[int, list[str]] = {}
    for rel, e in sorted(tree.items()):
        if e.kind == "dir":
            continue
        if e.nlink != 1:
            problems.append(f"{label}: {rel} has st_nlink {e.nlink}")
        by_ino.setdefault(e.ino, []).append(rel)
    for ino, names in sorted(by_ino.items()):
        if len(names) > 1:
            problems.append(f"{label}: names {names} share inode {ino}")
    return problems


# --------------------------------------------------------------------------
# Actors: one per device, random operations on its mount
# --------------------------------------------------------------------------


class Actor:
    def __init__(self, label: str, dev, link: StoreLink):
        self.label = label
        self.dev = dev
        self.link = link
        self.root = Path(dev.mountpoint)
        self.written: set[str] = set()
        self.superseded: set[str] = set()
        self.log: list[str] = []
        self.errors: list[str] = []
        self.counter = 0

    def reset(self) -> None:
        self.written, self.superseded, self.log, self.errors = set(), set(), [], []

    def tokens(self, rel: str) -> set[str]:
        """Tokens in the file at rel (empty if it is not a file)."""
        try:
            st = os.lstat(self.root / rel)
            if not stat.S_ISREG(st.st_mode):
                return set()
            with open(self.root / rel, "rb") as f:
                return {t.decode() for t in TOKEN_RE.findall(f.read())}
        except FileNotFoundError:
            return set()
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                return set()
            raise

    def folders(self) -> list[str]:
        """Every folder (any depth), relative to the mount's root."""
        out = []
        for dirpath, dirnames, _ in os.walk(self.root):
            for name in dirnames:
                out.append(os.path.relpath(os.path.join(dirpath, name), self.root))
        return sorted(out)

    def operate(self, rng: random.Random, rnd: int, nesting: bool, skip: frozenset[str] = frozenset()) -> None:
        found = self.folders()
        top = sorted(set(BASE_DIRS) | {d for d in found if "/" not in d})
        dirs = sorted(set(BASE_DIRS) | set(found))
        files = [f"{d}/{n}" for d in dirs for n in NAMES]
        op = rng.randrange(100)
        self.counter += 1
        token = "<%s:%d:%d:%08x>" % (self.label, rnd, self.counter, rng.getrandbits(32))
        path = rng.choice(files)
        pad = rng.choice([0, 0, 40, 3000, 70_000])
        line = f"op {op} on {path}"
        try:
            if op < 30:
                line = f"write {path} {token} ({pad}B pad)"
                before = self.tokens(path)
                line += f" replaces {sorted(before)}"
                fd = os.open(self.root / path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                self.superseded |= before
                try:
                    os.write(fd, token.encode() + b"\n" + b"." * pad)
                finally:
                    os.close(fd)
                self.written.add(token)
            elif op < 45:
                line = f"append {path} {token}"
                fd = os.open(self.root / path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                try:
                    os.write(fd, b"\n" + token.encode() + b"\n")
                finally:
                    os.close(fd)
                self.written.add(token)
            elif op < 65:
                target = rng.choice(files)
                moves = self.tokens(path)
                before = self.tokens(target)
                line = f"rename {path} -> {target} (moves {sorted(moves)}, replaces {sorted(before)})"
                os.rename(self.root / path, self.root / target)
                if path != target:
                    self.superseded |= before
            elif op < 77:
                before = self.tokens(path)
                line = f"unlink {path} (had {sorted(before)})"
                os.unlink(self.root / path)
                self.superseded |= before
            elif op < 87:
                d = rng.choice(["d0", "d1", "d2", "d3"])
                line = f"mkdir {d}"
                os.mkdir(self.root / d)
            elif op < 93:
                d = rng.choice(dirs)
                line = f"rmdir {d}"
                if "rmdir" in skip:
                    self.log.append(f"{self.label} skip {line}")
                    return
                os.rmdir(self.root / d)
            elif op < 97 and nesting:
                src = rng.choice(dirs)
                into = rng.choice(top + [""])
                dst = f"{into}/{os.path.basename(src)}".lstrip("/")
                line = f"move-dir {src} -> {dst}"
                if "dir-over" in skip and src != dst and os.path.isdir(self.root / dst):
                    self.log.append(f"{self.label} skip {line}")
                    return
                os.rename(self.root / src, self.root / dst)
            else:
                src = rng.choice(top)
                dst = rng.choice(["d0", "d1", "d2", "d3", "d4"])
                line = f"rename-dir {src} -> {dst}"
                if "dir-over" in skip and src != dst and os.path.isdir(self.root / dst):
                    self.log.append(f"{self.label} skip {line}")
                    return
                os.rename(self.root / src, self.root / dst)
            self.log.append(f"{self.label} ok   {line}")
        except OSError as e:
            name = errno.errorcode.get(e.errno, str(e.errno))
            self.log.append(f"{self.label} fail {line}: {name}")
            if e.errno not in EXPECTED_ERRNOS:
                self.errors.append(f"{self.label}: {line}: {e!r}")


# --------------------------------------------------------------------------
# One partition run (one seed, N devices, many rounds)
# --------------------------------------------------------------------------


@dataclass
class RoundResult:
    seed: int
    devices: int
    round: int
    seconds: float = 0.0
    converge_seconds: float = 0.0
    offline_seconds: float = 0.0  # until every device cut off said storeReachable false
    fault_phase_seconds: float = 0.0  # reconnected under online faults, before they were turned off
    quiet_under_faults: bool | None = None  # None: no online faults this round
    online: list[str] = field(default_factory=list)  # devices that stayed online (faulty) during the operations
    diverged: bool = False
    lost: dict[str, list[str]] = field(default_factory=dict)
    lost_old: list[str] = field(default_factory=list)
    divergence: str = ""
    links: list[str] = field(default_factory=list)
    op_errors: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    report: str = ""

    @property
    def ok(self) -> bool:
        return not (self.diverged or self.lost or self.lost_old or self.links or self.op_errors or self.other)

    def symptoms(self) -> list[str]:
        out = []
        if self.diverged:
            out.append("diverged: " + self.divergence)
        if self.lost:
            out.append("lost " + ", ".join(f"{k}: {v}" for k, v in sorted(self.lost.items())))
        if self.lost_old:
            out.append(f"lost older content (in the tree at the round's start, superseded by no device): "
                       f"{self.lost_old}")
        if self.links:
            out.append("links " + "; ".join(self.links))
        if self.op_errors:
            out.append("op errors " + "; ".join(self.op_errors))
        out += self.other
        return out


class Partition:
    """`make(name, store)` returns an unmounted conftest.Device (its teardown
    is the caller's); `base` is a scratch directory.  `store` is a folder or
    a conftest.S3StoreRef (then each device gets its own fault proxy: stop
    them with `close_links()` after the devices are unmounted).
    `online_faults` (S3 only): FaultProxy rates for the devices that stay
    online during the operations and for every device while reconnecting."""

    def __init__(self, make: Callable, base: Path, store, n: int, seed: int,
                 *, skip: frozenset[str] = frozenset(), say: Callable[[str], None] = lambda s: None,
                 online_faults: dict | None = None):
        assert n in (2, 3), n
        self.s3 = isinstance(store, S3StoreRef)
        if online_faults and not self.s3:
            raise ValueError("online faults need an S3 store (a fault proxy per device)")
        self.make, self.base, self.n, self.seed, self.say = make, Path(base), n, seed, say
        self.store = store if self.s3 else Path(store)
        self.online_faults = dict(online_faults) if online_faults else None
        self.offline_timeout = OFFLINE_TIMEOUT_S3 if self.s3 else OFFLINE_TIMEOUT
        self.nesting = seed % 2 == 0
        self.skip = frozenset(skip)
        self.empty = self.base / "unreachable-share"
        self.actors: list[Actor] = []
        self.tree: dict[str, Entry] = {}  # the agreed tree after the last round
        self.trees: dict[str, dict[str, Entry]] = {}  # label -> tree, from the last converge()
        self.statuses: dict[str, dict] = {}
        self.history: list[str] = []  # ops of every round so far (for a replay)

    # -- setup / teardown ------------------------------------------------------

    def start(self) -> None:
        self.empty.mkdir(parents=True, exist_ok=True)
        for i in range(self.n):
            label = LABELS[i]
            if self.s3:
                link = ProxyLink(self.store, seed=self.seed * 10 + i)
            else:
                link = StoreLink(self.base / f"store-link-{label}", self.store)
            dev = self.make(label, link.path)
            dev.mount_args = ("--device-name", label)
            dev.mount()
            self.actors.append(Actor(label, dev, link))
        for d in BASE_DIRS:
            os.mkdir(self.actors[0].root / d)
        problems = self.converge()
        if problems:
            raise AssertionError(f"seed {self.seed}: the initial folders never reached every device:\n"
                                 + "\n".join(problems))
        self.tree = self.trees[self.actors[0].label]

    def restore_links(self) -> None:
        for a in self.actors:
            a.link.restore()

    def close_links(self) -> None:
        """Stop the S3 fault proxies (after the devices were unmounted: a
        graceful unmount pushes through them)."""
        for a in self.actors:
            if isinstance(a.link, ProxyLink):
                a.link.stop()

    def cut(self, a: Actor) -> None:
        if isinstance(a.link, ProxyLink):
            a.link.cut()
        else:
            a.link.point_to(self.empty)

    def link_stats(self) -> str:
        """The proxies' counters (S3), one line per device."""
        keys = ("requests", "forwarded", "error_500", "error_503", "throttle_429", "stalls", "resets_before",
                "resets_after", "truncations", "upstream_failures")
        out = []
        for a in self.actors:
            if isinstance(a.link, ProxyLink):
                c = a.link.stats()
                out.append(f"proxy {a.label} (counters since mount): " + " ".join(f"{k}={c[k]}" for k in keys if c.get(k)))
        return "\n".join(out)

    # -- waiting -----------------------------------------------------------------

    def wait_offline(self, actors: list[Actor] | None = None) -> list[str]:
        deadline = time.monotonic() + self.offline_timeout
        waiting = list(self.actors if actors is None else actors)
        how = "its proxy answered every request with a 5xx" if self.s3 else "was re-pointed to an empty folder"
        while waiting:
            waiting = [a for a in waiting if status_json(a.dev).get("storeReachable") is not False]
            if not waiting:
                return []
            if time.monotonic() > deadline:
                return [f"{a.label} still says storeReachable true {self.offline_timeout:.0f}s after its store "
                        f"{how}" for a in waiting]
            time.sleep(0.2)
        return []

    def wait_quiet_under_faults(self) -> bool:
        """With online faults on every proxy: wait until every device is
        reachable and quiet and all show the same names, kinds and sizes
        (metadata only: no content is read), twice in a row (at most
        FAULT_PHASE_TIMEOUT)."""
        deadline = time.monotonic() + FAULT_PHASE_TIMEOUT
        last = None
        while time.monotonic() < deadline:
            statuses = [status_json(a.dev) for a in self.actors]
            if all(s.get("storeReachable") and s.get("pendingItems") == 0 and s.get("downloadingItems") == 0
                   for s in statuses):
                try:
                    metas = [meta_scan(a.root) for a in self.actors]
                except OSError as e:
                    self.say(f"metadata scan under faults: {e!r}")
                    metas = [None, 0]
                if all(m == metas[0] for m in metas[1:]):
                    if metas[0] == last:
                        return True
                    last = metas[0]
                else:
                    last = None
            else:
                last = None
            time.sleep(0.5)
        return False

    def converge(self) -> list[str]:
        """Wait until every device is reachable and quiet and all trees are
        identical, twice in a row at least a second apart.  Returns problems
        (empty when converged); sets self.trees."""
        deadline = time.monotonic() + CONVERGE_TIMEOUT
        stable_since = None
        last_digest = None
        self.trees, self.statuses = {}, {}
        while True:
            self.statuses = {a.label: status_json(a.dev) for a in self.actors}
            quiet = all(s.get("storeReachable") and s.get("pendingItems") == 0 and s.get("downloadingItems") == 0
                        for s in self.statuses.values())
            if quiet:
                try:
                    self.trees = {a.label: scan(a.root) for a in self.actors}
                    digests = [digest_of(t) for t in self.trees.values()]
                    same = all(d == digests[0] for d in digests[1:])
                except OSError as e:  # a file replaced while we read it
                    same, digests = False, [None]
                    self.say(f"scan: {e!r}")
                if same and digests[0] == last_digest:
                    if time.monotonic() - stable_since >= 1.0:
                        return []
                elif same:
                    last_digest, stable_since = digests[0], time.monotonic()
                else:
                    last_digest = None
            else:
                last_digest = None
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)
        problems = [f"no agreement within {CONVERGE_TIMEOUT:.0f}s"]
        for a in self.actors:
            problems.append(f"status {a.label}: {short_status(self.statuses[a.label])}")
        if not self.trees:
            try:
                self.trees = {a.label: scan(a.root) for a in self.actors}
            except OSError as e:
                problems.append(f"scan failed: {e!r}")
        return problems

    def divergence_summary(self) -> str:
        """One line: what each device has that the first one lacks, and vice versa."""
        if not self.trees:
            return "(no trees)"
        labels = list(self.trees)
        first = self.trees[labels[0]]
        parts = []
        for label in labels[1:]:
            other = self.trees[label]
            lacks = sorted(first.keys() - other.keys())
            extra = sorted(other.keys() - first.keys())
            differs = sorted(k for k in first.keys() & other.keys() if first[k].digest != other[k].digest)
            for what, items in (("lacks", lacks), ("has extra", extra), ("differs at", differs)):
                if items:
                    parts.append(f"{label} {what} {items[:4]}{' ...' if len(items) > 4 else ''}")
        return f"vs {labels[0]}: " + "; ".join(parts) if parts else "trees equal but devices not quiet"

    # -- a round -----------------------------------------------------------------

    def round(self, rnd: int) -> RoundResult:
        res = RoundResult(self.seed, self.n, rnd)
        t0 = time.monotonic()
        rng = random.Random(self.seed * 1_000_003 + rnd)
        for a in self.actors:
            a.reset()
        start_tree = self.tree
        try:
            journal_before = len(journal_records(self.store))
        except Exception as e:  # noqa: BLE001 - the report only leaves the journal out
            journal_before = None
            self.say(f"journal listing failed: {e!r}")
        # Who stays online (through faults) during the operations: its own
        # generator, so that the operations are those of a run without faults.
        online: list[Actor] = []
        if self.online_faults:
            frng = random.Random(self.seed * 7_919 + rnd * 31 + 5)
            online = [a for a in self.actors if frng.random() < 0.4]
            if len(online) == len(self.actors):
                online.remove(frng.choice(online))
            res.online = [a.label for a in online]
        cut = [a for a in self.actors if a not in online]

        for a in cut:
            self.cut(a)
        for a in online:
            a.link.restore(self.online_faults)
        t1 = time.monotonic()
        res.other += self.wait_offline(cut)
        res.offline_seconds = time.monotonic() - t1
        self.trees = {}
        if res.other:
            self.restore_links()
        else:
            for _ in range(OPS_PER_DEVICE):
                for a in self.actors:
                    a.operate(rng, rnd, self.nesting, self.skip)
            order = list(self.actors)
            rng.shuffle(order)
            for a in order:
                time.sleep(rng.choice([0, 0, 0.1, 0.5, 1.2]))
                if self.online_faults:
                    a.link.restore(self.online_faults)
                else:
                    a.link.restore()
            if self.online_faults:
                t1 = time.monotonic()
                res.quiet_under_faults = self.wait_quiet_under_faults()
                res.fault_phase_seconds = time.monotonic() - t1
                self.restore_links()
            t1 = time.monotonic()
            problems = self.converge()
            res.converge_seconds = time.monotonic() - t1
            if problems:
                res.diverged = True
                res.divergence = self.divergence_summary()
                res.other += problems[1:]

        for a in self.actors:
            res.op_errors += a.errors
            if not pid_alive(a.dev.pid):
                res.other.append(f"daemon of {a.label} (pid {a.dev.pid}) is gone")
        leftovers = [] if self.s3 else os.listdir(self.empty)
        if leftovers:
            res.other.append(f"something was written into the empty folder: {leftovers}")

        trees = self.trees
        if trees and not res.diverged:
            tree = trees[self.actors[0].label]
            present = {t for e in tree.values() for t in e.tokens}
            superseded = set().union(*(a.superseded for a in self.actors))
            for a in self.actors:
                lost = sorted(a.written - superseded - present)
                if lost:
                    res.lost[a.label] = lost
            older = {t for e in start_tree.values() for t in e.tokens}
            res.lost_old = sorted(older - superseded - present)
            for label, t in trees.items():
                res.links += link_problems(label, t)
            odd = sorted(rel for rel in tree if not NAME_RE.match(os.path.basename(rel)))
            if odd:
                res.other.append(f"names the operations never make (not a conflicted copy either): {odd}")
            self.tree = tree
        res.seconds = time.monotonic() - t0
        ops = [line for a in self.actors for line in a.log]
        head = f"round {rnd}:" + (f" (online with faults: {', '.join(res.online) or 'none'})"
                                  if self.online_faults else "")
        self.history.append(head + "\n" + "\n".join("  " + line for line in ops))
        if not res.ok:
            records: list | str
            if journal_before is None:
                records = "(the journal could not be listed at the start of the round)"
            else:
                try:
                    records = journal_records(self.store)[journal_before:]
                except Exception as e:  # noqa: BLE001
                    records = f"(the journal could not be listed: {e!r})"
            res.report = self.report(res, start_tree, ops, trees, records)
        return res

    def replay_lines(self, rnd: int) -> list[str]:
        n = self.n
        skip = ','.join(sorted(self.skip))
        if self.s3:
            flags = f"--store s3{' --online-faults' if self.online_faults else ''}"
            return [f"replay: python3 bench/partition_campaign.py {flags} --seeds {self.seed} --devices {n} "
                    f"--rounds {rnd + 1}{' --skip ' + skip if skip else ''}",
                    f"    or: UBQ_PARTITION_SEED={self.seed} UBQ_PARTITION_DEVICES={n} "
                    f"{'UBQ_PARTITION_SKIP=' + skip + ' ' if skip else ''}UBQ_PARTITION_S3_ROUNDS={rnd + 1} "
                    "python3 -m pytest -q -p no:cacheprovider Tests/mount/test_partition.py -k s3 "
                    "(its online faults: the 3-device variant only)"]
        return [f"replay: UBQ_PARTITION_SEED={self.seed} UBQ_PARTITION_DEVICES={n} "
                f"{'UBQ_PARTITION_SKIP=' + skip + ' ' if skip else ''}"
                f"UBQ_PARTITION_ROUNDS={rnd + 1} python3 -m pytest -q -p no:cacheprovider "
                "Tests/mount/test_partition.py -k 'not s3'"]

    def report(self, res: RoundResult, start_tree, ops, trees, records) -> str:
        n = self.n
        store = (f"S3 store {self.store} at {self.store.endpoint}"
                 + (f", online faults {self.online_faults}" if self.online_faults else "")) if self.s3 \
            else f"folder store {self.store}"
        if self.online_faults:
            offline = [a.label for a in self.actors if a.label not in res.online]
            who = (f"{', '.join(offline)} offline, {', '.join(res.online) or 'none'} online with faults; "
                   f"after reconnecting, {'quiet' if res.quiet_under_faults else 'NOT quiet'} under faults "
                   f"within {res.fault_phase_seconds:.1f}s, then faults off")
        else:
            who = "all devices offline"
        lines = [
            f"PARTITION FAILURE: seed {self.seed}, {n} devices, round {res.round} "
            f"(nesting {'on' if self.nesting else 'off'}"
            f"{', skipping ' + ','.join(sorted(self.skip)) if self.skip else ''}; {store})",
            *self.replay_lines(res.round),
            "symptoms:",
            *("  " + s for s in res.symptoms()),
            "tree at the start of the round (every device agreed):",
            describe_tree(start_tree, "  "),
            f"operations of the round ({who}; a, b, c interleaved):",
            *("  " + op for op in ops),
        ]
        if trees:
            labels = list(trees)
            first = labels[0]
            lines.append(f"tree of device {first} after the round:")
            lines.append(describe_tree(trees[first], "  "))
            for other in labels[1:]:
                diff = tree_diff(trees[first], trees[other])
                if diff:
                    lines.append(f"diff {first} (expected) vs {other} (actual):")
                    lines += ["  " + line for line in diff.splitlines()]
        lines.append("change sets pushed in the round (store journal; node ids shortened):")
        if isinstance(records, str):
            lines.append("  " + records)
        else:
            lines += ["  " + describe_record(p) for p in records] or ["  (none)"]
        if self.s3:
            lines += self.link_stats().splitlines()
        for a in self.actors:
            lines.append(f"daemon log {a.label}: " + " ".join(
                str(p) for p in Path(a.dev.data_home).glob("ubiquityfs/replicas/*/daemon.log")))
        return "\n".join(lines)
