"""UbiquityFS in the file manager: sync emblems and a context menu.

A nautilus-python 4.0 extension (GNOME Files 43 and later). It also loads in
Nautilus 3.x (nautilus-python 1.2, `Nautilus` 3.0), Nemo (nemo-python, `Nemo`
3.0) and Caja (python-caja, `Caja` 2.0), whose InfoProvider, MenuProvider and
ColumnProvider interfaces match the calls made here; only Nautilus 43 is tested.

What it shows
    Every item inside a UbiquityFS mount of this device gets an emblem from
    the sync status the daemon reports -- in the cloud (a placeholder),
    downloading, downloaded, kept on this device (pinned), waiting to upload /
    uploading, conflicting versions, sync error -- and a "Sync Status" list
    column with the same in words. Folders show only their own state (pinned,
    uploading, conflict, error), not a summary of what they hold.

What it does
    A context menu on items in a mount: Download Now, Free Up Space, Keep on
    This Device / Stop Keeping on This Device, Resolve Conflict (keep the
    current version, keep every version, or keep one conflict version), Show
    Versions. Each runs the `ubiquityfs` command line asynchronously; a
    failure is reported in a desktop notification, never as a traceback.

Design
    * One thread, no blocking. Everything runs on the file manager's main
      thread, driven by the GLib main loop: child processes are
      Gio.Subprocess objects read with async reads, timers are GLib timeouts.
      (Not Python threads: nautilus-python calls Py_Initialize and keeps the
      GIL on the main thread, so a Python thread there runs only while the
      file manager happens to be calling into Python.) `ThreadRunner`, with
      worker threads handing results to the main thread, stands in where
      there is no GLib main loop (the tests' stub of gi).
    * The status map. One `ubiquityfs query MOUNT --watch --json` process per
      UbiquityFS mount of this device feeds a map from absolute path to a
      compact `ItemStatus`; its output is applied as it arrives, 64 KiB at a
      time. `update_file_info` only looks the path up in the map (no I/O, no
      process started) and adds the emblems and the column's text. Files it
      has been asked about are remembered (an LRU of 20,000 FileInfo objects)
      so that when their emblems or text change, `invalidate_extension_info()`
      is called on them -- batched, once per main-loop turn -- and the file
      manager asks again: the emblems move live. A change that shows nothing
      new (download progress behind the same emblem) invalidates nothing.
    * Mounts. /proc/self/mountinfo is read every 3 s (a few KiB; a
      GFileMonitor cannot watch /proc) and each mount whose type is
      `fuse.ubiquityfs` (or whose source starts with `ubiquityfs`, i.e.
      `ubiquityfs:PID`) gets a watch. A mount that disappears (or is replaced:
      a new mount ID) loses its watch and its entries; a watch process that
      ends is restarted with exponential back-off (1 s doubling to 60 s, reset
      after a minute of running). A mount the CLI refuses as another device's
      or user's (another XDG_DATA_HOME) is left alone until it is remounted.
      Watch processes are started through `setpriv --pdeathsig TERM` when it
      exists, so that they end with the file manager even if it crashes.
    * Until a watch has delivered its initial results (its
      `gatheringFinished` line) the map keeps what an earlier watch of the
      same mount said (after a restart), or has nothing for that mount:
      no emblem is better than a wrong one.
    * Actions run the CLI (one command after the other, for multi-selections
      one command naming every path), then read the affected items once more
      with a one-shot `query --json` (so that the emblems follow an action at
      once, even one a watch does not report), then report: a failure as a
      notification (Gio.Notification through the host application, else
      `notify-send`, else the log).
    * Resolve Conflict also lists the conflict versions of a single
      conflicted file: `ubiquityfs versions` runs (after the current
      main-loop turn) when a conflicted file is first shown, and its table is
      cached; keeping version N first checks that N still names that copy.

Environment
    UBIQUITYFS_BIN                the `ubiquityfs` binary (default: PATH, then
                                  ~/.local/bin, /usr/local/bin, /usr/bin)
    UBIQUITYFS_NAUTILUS_DEBUG=1   log what it does on stderr, prefixed
                                  "ubiquityfs-nautilus:" (a line at load, one per
                                  file it answers for, one per notification)
    UBIQUITYFS_FILE_MANAGER       nautilus, nemo or caja: which introspection
                                  module to bind to when none is loaded yet

Tests: Tests/nautilus/test_extension.py (real GObject introspection and a
stub, fake and real mounts, and a real Nautilus under Xvfb).
"""

from __future__ import annotations

import collections
import html
import importlib
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

LOG = logging.getLogger("ubiquityfs.nautilus")
DEBUG = os.environ.get("UBIQUITYFS_NAUTILUS_DEBUG", "") not in ("", "0")


def _debug(message: str) -> None:
    """One line on stderr when UBIQUITYFS_NAUTILUS_DEBUG is set."""
    if DEBUG:
        try:
            print("ubiquityfs-nautilus: " + message, file=sys.stderr, flush=True)
        except Exception:  # a closed stderr must not break the file manager
            pass


# ---------------------------------------------------------------------------
# The host file manager's introspection module
# ---------------------------------------------------------------------------

# (namespace, versions) in the order tried when no host has chosen yet.
_HOSTS = (("Nautilus", ("4.0", "3.0")), ("Nemo", ("3.0",)), ("Caja", ("2.0",)))


def _load_host():
    """(namespace, version, module, GObject, GLib, Gio) of the file manager
    loading this file. Its python loader has already required its namespace
    (nautilus-python: Nautilus 4.0, nemo-python: Nemo 3.0, python-caja: Caja
    2.0), so that one wins; standing alone (tests, `python3 -c 'import …'`),
    the first namespace whose typelib is installed."""
    import gi

    forced = os.environ.get("UBIQUITYFS_FILE_MANAGER", "").strip().lower()
    hosts = [h for h in _HOSTS if not forced or h[0].lower() == forced]
    chosen = None
    for name, _versions in hosts:
        try:
            required = gi.get_required_version(name)
        except Exception:
            required = None
        if required:
            chosen = (name, required)
            break
    if chosen is None:
        for name, versions in hosts:
            for version in versions:
                try:
                    gi.require_version(name, version)
                except ValueError:
                    continue
                chosen = (name, version)
                break
            if chosen:
                break
    if chosen is None:
        raise ImportError("no file manager introspection data: install gir1.2-nautilus-4.0 "
                          "(or Nemo 3.0 / Caja 2.0)")
    module = importlib.import_module("gi.repository." + chosen[0])
    from gi.repository import Gio, GLib, GObject
    return chosen[0], chosen[1], module, GObject, GLib, Gio


HOST_NAME, HOST_VERSION, FM, GObject, GLib, Gio = _load_host()

# ---------------------------------------------------------------------------
# Item status -> emblems and words
# ---------------------------------------------------------------------------

EMBLEM_PREFIX = "emblem-ubiquityfs-"
# Every emblem this extension uses (icons/hicolor/scalable/emblems/EMBLEM.svg).
EMBLEMS = tuple(EMBLEM_PREFIX + s for s in
                ("cloud", "downloading", "downloaded", "pinned", "uploading", "conflict", "error"))
STATUS_ATTRIBUTE = "ubiquityfs_status"


class ItemStatus:
    """What the extension keeps of one query item (the JSON item has about
    twenty keys; a map of 100,000 of them must stay small)."""

    __slots__ = ("is_dir", "downloading_status", "is_downloading", "percent", "is_uploaded",
                 "is_uploading", "conflicts", "pinned", "error", "state", "emblems", "text")

    def __init__(self, item: dict):
        self.is_dir = bool(item.get("isDirectory"))
        self.downloading_status = item.get("downloadingStatus") or "current"
        self.is_downloading = bool(item.get("isDownloading"))
        self.percent = int(item.get("percentDownloaded") or 0)
        self.is_uploaded = item.get("isUploaded", True) is not False
        self.is_uploading = bool(item.get("isUploading"))
        self.conflicts = bool(item.get("hasUnresolvedConflicts"))
        self.pinned = bool(item.get("pinned"))
        self.error = item.get("downloadingError") or item.get("uploadingError") or None
        self.state = self._state()
        emblems = [self.state] if self.state else []
        if self.pinned and self.state != "pinned":
            emblems.append("pinned")
        self.emblems = tuple(EMBLEM_PREFIX + e for e in emblems)
        self.text = self._text()

    @property
    def local(self) -> bool:
        """Whether the content is on this device (folders always are)."""
        return self.is_dir or self.downloading_status != "notDownloaded"

    def _state(self) -> str | None:
        if self.error:
            return "error"
        if self.conflicts:
            return "conflict"
        if self.is_downloading:
            return "downloading"
        if not self.is_uploaded:
            return "uploading"
        if self.is_dir:
            return "pinned" if self.pinned else None
        if self.downloading_status == "notDownloaded":
            return "cloud"
        return "pinned" if self.pinned else "downloaded"

    def _text(self) -> str:
        words = {
            "error": f"Sync error: {self.error}",
            "conflict": "Conflicting versions",
            "downloading": f"Downloading ({self.percent} %)",
            "uploading": "Uploading" if self.is_uploading else "Waiting to upload",
            "cloud": "In the cloud",
            "pinned": "Kept on this device",
            "downloaded": "Downloaded",
            None: "Up to date",
        }[self.state]
        if self.pinned and self.state != "pinned":
            words += ", kept on this device"
        return words

    def key(self):
        """What the file manager shows of it: a change of this is worth an invalidation."""
        return (self.emblems, self.text)

    def __repr__(self) -> str:
        return f"<ItemStatus {self.state} {self.emblems} {self.text!r}>"


def _key(status: ItemStatus | None):
    return None if status is None else status.key()


# ---------------------------------------------------------------------------
# The mount table
# ---------------------------------------------------------------------------

MOUNT_TYPE = "fuse.ubiquityfs"
MOUNT_SOURCE_PREFIX = "ubiquityfs"


class MountEntry(collections.namedtuple("MountEntry", "mount_id mountpoint fstype source")):
    """One line of /proc/self/mountinfo."""

    @property
    def is_ubiquity(self) -> bool:
        return self.fstype == MOUNT_TYPE or self.source.startswith(MOUNT_SOURCE_PREFIX)


def _unescape(field: bytes) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo."""
    out = bytearray()
    i = 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and len(field) >= i + 4 and all(48 <= c <= 55 for c in field[i + 1:i + 4]):
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return os.fsdecode(bytes(out))


def parse_mountinfo(data: bytes) -> list[MountEntry]:
    """Every mount of a mountinfo text (bytes, as read)."""
    entries = []
    for line in data.splitlines():
        left, sep, right = line.partition(b" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        entries.append(MountEntry(fields[0].decode("ascii", "replace"), _unescape(fields[4]),
                                  _unescape(tail[0]), _unescape(tail[1])))
    return entries


def ubiquity_mounts(mountinfo: str = "/proc/self/mountinfo") -> dict[str, MountEntry]:
    """Mountpoint -> entry of every UbiquityFS mount (the last one mounted on a path wins)."""
    with open(mountinfo, "rb") as f:
        data = f.read()
    return {e.mountpoint: e for e in parse_mountinfo(data) if e.is_ubiquity}


def find_binary(env: dict | None = None) -> str | None:
    """The `ubiquityfs` command line: $UBIQUITYFS_BIN, then PATH, then the usual places
    (a session started from a display manager often has no ~/.local/bin in PATH)."""
    env = os.environ if env is None else env
    explicit = env.get("UBIQUITYFS_BIN")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("ubiquityfs", path=env.get("PATH", os.defpath))
    if found:
        return found
    home = env.get("HOME") or os.path.expanduser("~")
    for candidate in (os.path.join(home, ".local/bin/ubiquityfs"), "/usr/local/bin/ubiquityfs", "/usr/bin/ubiquityfs"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def predicate_string(text: str) -> str:
    """A string literal of the query language."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse_versions(table: str) -> list[dict]:
    """The rows of `ubiquityfs versions` (VERSION DEVICE MODIFIED SIZE PATH,
    fixed-width columns found from the header): label, device, modified,
    size, path."""
    lines = [line for line in table.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("VERSION"):
        return []
    header = lines[0]
    columns = [header.find(name) for name in ("VERSION", "DEVICE", "MODIFIED", "SIZE", "PATH")]
    if any(c < 0 for c in columns) or columns != sorted(columns):
        return []
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(columns, columns[1:] + [len(line)])]
        rows.append(dict(zip(("label", "device", "modified", "size", "path"), cells)))
    return rows


def _error_text(stderr: str, returncode: int) -> str:
    """The CLI's message without its progress bars and "Error: " prefix."""
    lines = []
    for line in stderr.replace("\r", "\n").splitlines():
        line = line.strip()
        if not line or line.startswith("["):
            continue
        lines.append(line[len("Error: "):] if line.startswith("Error: ") else line)
    text = "\n".join(lines[-3:]) or f"ubiquityfs exited with status {returncode}"
    return text if len(text) <= 600 else text[:600] + "…"


# ---------------------------------------------------------------------------
# Processes and timers: on the GLib main loop, or with threads (no GLib)
# ---------------------------------------------------------------------------


def _logged(fn, *args):
    """Call `fn`; an exception is logged, never raised into the file manager."""
    try:
        fn(*args)
    except Exception:
        LOG.exception("ubiquityfs: callback failed")


class GLibRunner:
    """Child processes and timers driven by the GLib main loop: everything
    runs on the main thread, and nothing blocks it (Gio.Subprocess, async
    reads). This is the runner inside the file manager, whose embedded
    Python never releases the GIL between callbacks (nautilus-python calls
    Py_Initialize and keeps the GIL on the main thread), so that Python
    threads there would only run while the file manager happens to call
    into Python."""

    def post(self, fn) -> None:
        GLib.idle_add(lambda: _logged(fn) or False)

    def call_later(self, seconds: float, fn):
        timer = {"id": None}

        def fire():
            timer["id"] = None
            _logged(fn)
            return False
        timer["id"] = GLib.timeout_add(max(1, int(seconds * 1000)), fire)
        return timer

    def cancel(self, timer) -> None:
        if timer and timer.get("id") is not None:
            GLib.source_remove(timer["id"])
            timer["id"] = None

    @staticmethod
    def _launcher(env: dict, flags):
        launcher = Gio.SubprocessLauncher.new(flags)
        launcher.set_environ([f"{k}={v}" for k, v in env.items()])
        return launcher

    def spawn_stream(self, argv: list[str], env: dict, on_data, on_exit):
        """Start `argv`; `on_data(bytes)` for each chunk of its output,
        `on_exit(status, stderr text)` once it has ended. OSError if it cannot start."""
        return _GLibStream(self, argv, env, on_data, on_exit)

    def run(self, argv: list[str], env: dict, on_done) -> None:
        """Run `argv` to the end; `on_done(status, stdout, stderr)`, status None if it could not start."""
        flags = Gio.SubprocessFlags.STDOUT_PIPE | Gio.SubprocessFlags.STDERR_PIPE   # (stdin: /dev/null)
        try:
            proc = self._launcher(env, flags).spawnv(argv)
        except GLib.Error as e:
            message = e.message.encode()
            self.post(lambda: on_done(None, b"", message))
            return

        def finished(proc, result):
            try:
                _ok, out, err = proc.communicate_finish(result)
                out = out.get_data() if out is not None else b""
                err = err.get_data() if err is not None else b""
            except GLib.Error as e:
                out, err = b"", e.message.encode()
            _logged(on_done, _exit_status(proc), out, err)

        proc.communicate_async(None, None, finished)


def _exit_status(proc) -> int:
    if proc.get_if_exited():
        return proc.get_exit_status()
    return -proc.get_term_sig() if proc.get_if_signaled() else -1


class _GLibStream:
    CHUNK = 65536

    def __init__(self, runner: GLibRunner, argv, env, on_data, on_exit):
        # Its stderr goes to a nameless file, read once it has ended (the
        # command line writes its error there as it exits).
        self._errors = tempfile.TemporaryFile()
        launcher = runner._launcher(env, Gio.SubprocessFlags.STDOUT_PIPE)
        launcher.take_stderr_fd(os.dup(self._errors.fileno()))
        try:
            self._proc = launcher.spawnv(argv)
        except GLib.Error as e:
            self._errors.close()
            raise OSError(e.message) from None
        self.pid = int(self._proc.get_identifier())
        self._on_data, self._on_exit = on_data, on_exit
        self._cancel = Gio.Cancellable()
        self._stream = self._proc.get_stdout_pipe()
        self._read()

    def _read(self):
        self._stream.read_bytes_async(self.CHUNK, GLib.PRIORITY_DEFAULT, self._cancel, self._got)

    def _got(self, stream, result):
        try:
            data = stream.read_bytes_finish(result).get_data()
        except GLib.Error:
            data = b""      # cancelled, or the pipe broke: the end
        if data and not self._cancel.is_cancelled():
            _logged(self._on_data, data)
            self._read()
            return
        self._proc.wait_async(None, self._ended)

    def _ended(self, proc, result):
        try:
            proc.wait_finish(result)
        except GLib.Error:
            pass
        try:
            self._errors.seek(0)
            errors = self._errors.read().decode("utf-8", "replace")
            self._errors.close()
        except (OSError, ValueError):
            errors = ""
        _logged(self._on_exit, _exit_status(proc), errors)

    def stop(self):
        """SIGTERM, by its PID (GSubprocess reaps it)."""
        self._cancel.cancel()
        self._proc.send_signal(signal.SIGTERM)


class ThreadRunner:
    """The same with threads, for a Python without GLib's main loop (the
    test stub): workers block, and hand every result to `post`, which runs
    it on the main thread."""

    def __init__(self, post):
        self.post = post

    def call_later(self, seconds: float, fn):
        timer = threading.Timer(seconds, lambda: self.post(fn))
        timer.daemon = True
        timer.start()
        return timer

    def cancel(self, timer) -> None:
        if timer is not None:
            timer.cancel()

    def spawn_stream(self, argv, env, on_data, on_exit):
        return _ThreadStream(self, argv, env, on_data, on_exit)

    def run(self, argv, env, on_done) -> None:
        def work():
            try:
                done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, close_fds=True)
                result = (done.returncode, done.stdout, done.stderr)
            except OSError as e:
                result = (None, b"", str(e).encode())
            self.post(lambda: on_done(*result))
        threading.Thread(target=work, name="ubiquityfs-run", daemon=True).start()


class _ThreadStream:
    def __init__(self, runner: ThreadRunner, argv, env, on_data, on_exit):
        errors = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
                                          env=env, close_fds=True)
        except OSError:
            errors.close()
            raise
        self.pid = self._proc.pid

        def read():
            fd = self._proc.stdout.fileno()
            while True:
                try:
                    data = os.read(fd, _GLibStream.CHUNK)
                except OSError:
                    data = b""
                if not data:
                    break
                runner.post(lambda data=data: on_data(data))
            self._proc.stdout.close()
            status = self._proc.wait()
            errors.seek(0)
            text = errors.read().decode("utf-8", "replace")
            errors.close()
            runner.post(lambda: on_exit(status, text))
        threading.Thread(target=read, name="ubiquityfs-watch", daemon=True).start()

    def stop(self):
        if self._proc.poll() is None:
            try:
                self._proc.terminate()
            except OSError:
                pass


def default_runner():
    """GLib's main loop where there is one (always, in a file manager)."""
    if hasattr(Gio, "Subprocess") and hasattr(GLib, "timeout_add"):
        return GLibRunner()
    return ThreadRunner(_glib_post)


def _glib_post(fn) -> None:
    """Run `fn` on the main thread (the default main context), once."""
    GLib.idle_add(lambda: _logged(fn) or False)


# ---------------------------------------------------------------------------
# Watches and the status map
# ---------------------------------------------------------------------------

# The CLI's refusal of a mount that is not this device's (MountLocator.daemon).
_FOREIGN_MARKERS = ("of another device or user", "is not a ubiquityfs mount")


class MountWatch:
    """One mount: its `query --watch` process and what it reported."""

    def __init__(self, entry: MountEntry):
        self.entry = entry
        self.mountpoint = entry.mountpoint
        self.prefix = entry.mountpoint.rstrip("/") + "/"
        self.items: dict[str, ItemStatus] = {}
        self.ready = False           # initial results are in (from this or an earlier process)
        self.gathering: dict[str, ItemStatus] | None = None
        self.process = None          # the runner's stream handle
        self.token = None            # identifies the current process in its callbacks
        self.partial = b""           # an incomplete line
        self.state = "new"           # new, running, backoff, foreign, stopped
        self.failures = 0
        self.next_start = 0.0
        self.started_at = 0.0
        self.last_error = ""

    def contains(self, path: str) -> bool:
        return path == self.mountpoint or path.startswith(self.prefix)


class Controller:
    """The status map, its watches, the FileInfo objects shown, and the actions.

    Everything runs on the main thread: the runner delivers process output,
    exits and timers there (GLib main loop in the file manager). Nothing here
    blocks: child processes are started asynchronously and read as their
    output arrives; large outputs are applied in slices, one per main-loop turn.
    """

    SEEN_LIMIT = 20000          # FileInfo objects remembered for live updates
    BACKOFF_MAX = 60.0
    HEALTHY_AFTER = 60.0        # a watch that ran this long starts its back-off again at 1 s
    SLICE = 2000                # query lines applied per main-loop turn

    def __init__(self, *, binary: str | None = None, env: dict | None = None,
                 mountinfo: str = "/proc/self/mountinfo", poll_interval: float = 3.0,
                 throttle: float = 0.5, runner=None, notify=None):
        self.env = dict(os.environ if env is None else env)
        self._binary = binary
        self.mountinfo = mountinfo
        self.poll_interval = poll_interval
        self.throttle = throttle
        self.runner = default_runner() if runner is None else runner
        self.notify = default_notify if notify is None else notify
        self._watches: dict[str, MountWatch] = {}
        self._ordered: list[MountWatch] = []     # longest mountpoint first
        self._pending: set[str] = set()
        self._flush_scheduled = False
        self._seen: collections.OrderedDict = collections.OrderedDict()
        self._versions: dict[str, tuple] = {}    # path -> (status key, rows)
        self._versions_asked: set[str] = set()
        self._timer = None
        self._started = False
        self._stopping = False
        self._pdeathsig = shutil.which("setpriv", path=self.env.get("PATH", os.defpath) + ":/usr/bin:/bin")
        self._warned_binary = False
        self.invalidations = 0                   # for tests and the debug log

    # -- lifecycle -----------------------------------------------------------

    @property
    def binary(self) -> str | None:
        if self._binary is None:
            self._binary = find_binary(self.env)
        return self._binary

    def start(self) -> "Controller":
        """Scan the mounts now, then every poll interval (idempotent)."""
        if not self._started:
            self._started = True
            self._tick()
        return self

    def _tick(self) -> None:
        if self._stopping:
            return
        self.scan()
        self._timer = self.runner.call_later(self.poll_interval, self._tick)

    def shutdown(self) -> None:
        """Stop the periodic scan and every watch process."""
        self._stopping = True
        self.runner.cancel(self._timer)
        for watch in list(self._watches.values()):
            self._stop_watch(watch)
        self._watches.clear()
        self._ordered = []

    # -- mounts --------------------------------------------------------------

    def scan(self) -> None:
        """Match the watches with the mount table: start, restart (after its
        back-off) or drop them."""
        if self._stopping:
            return
        try:
            mounts = ubiquity_mounts(self.mountinfo)
        except OSError as e:
            LOG.warning("ubiquityfs: cannot read %s: %s", self.mountinfo, e)
            mounts = {}
        changed: set[str] = set()
        for mountpoint, watch in list(self._watches.items()):
            entry = mounts.get(mountpoint)
            if entry is None or entry.mount_id != watch.entry.mount_id:
                _debug(f"mount gone: {mountpoint}")
                del self._watches[mountpoint]
                self._stop_watch(watch)
                changed.update(watch.items)
                changed.add(mountpoint)
        for mountpoint, entry in mounts.items():
            if mountpoint not in self._watches:
                self._watches[mountpoint] = MountWatch(entry)
                _debug(f"mount found: {mountpoint} ({entry.fstype} from {entry.source})")
        self._ordered = sorted(self._watches.values(), key=lambda w: -len(w.mountpoint))
        now = time.monotonic()
        for watch in list(self._watches.values()):
            if watch.state == "new" or (watch.state == "backoff" and now >= watch.next_start):
                self._start_watch(watch)
        self._changed(changed)

    def mountpoints(self) -> list[str]:
        return [w.mountpoint for w in self._ordered]

    def watch_state(self, mountpoint: str) -> str | None:
        watch = self._watches.get(mountpoint)
        return None if watch is None else watch.state

    def watch_pid(self, mountpoint: str) -> int | None:
        watch = self._watches.get(mountpoint)
        return watch.process.pid if watch is not None and watch.process is not None else None

    def is_ready(self, mountpoint: str) -> bool:
        watch = self._watches.get(mountpoint)
        return watch is not None and watch.ready

    def _watch_for(self, path: str) -> MountWatch | None:
        for watch in self._ordered:
            if watch.contains(path):
                return watch
        return None

    def mount_for(self, path: str) -> str | None:
        """The mount (of this device or not) holding `path`."""
        watch = self._watch_for(path)
        return None if watch is None else watch.mountpoint

    def status(self, path: str) -> ItemStatus | None:
        """What the map says of `path` (None: not in a mount of this device, or not known yet)."""
        watch = self._watch_for(path)
        return None if watch is None else watch.items.get(path)

    def actionable(self, path: str) -> bool:
        """Whether `path` is inside a mount, not known to be another device's."""
        watch = self._watch_for(path)
        return watch is not None and watch.state != "foreign"

    # -- watch processes -----------------------------------------------------

    def _start_watch(self, watch: MountWatch) -> None:
        binary = self.binary
        if binary is None:
            watch.state, watch.next_start = "backoff", time.monotonic() + self.BACKOFF_MAX
            watch.last_error = "the ubiquityfs command was not found"
            if not self._warned_binary:
                self._warned_binary = True
                LOG.warning("ubiquityfs: command not found (set UBIQUITYFS_BIN); no sync status shown")
            return
        argv = [binary, "query", watch.mountpoint, "--watch", "--json", "--throttle", str(self.throttle)]
        if self._pdeathsig:
            # Ends with the file manager, even if that crashes (the watch
            # itself notices a closed pipe only when it next writes).
            argv = [self._pdeathsig, "--pdeathsig", "TERM", "--"] + argv
        token = object()
        try:
            process = self.runner.spawn_stream(argv, self.env,
                                               lambda data: self._on_data(watch, token, data),
                                               lambda status, errors: self._on_exit(watch, token, status, errors))
        except OSError as e:
            watch.token = token
            self._on_exit(watch, token, None, f"cannot run {binary}: {e}")
            return
        watch.process, watch.token, watch.partial, watch.gathering = process, token, b"", {}
        watch.state, watch.started_at = "running", time.monotonic()
        _debug(f"watching {watch.mountpoint} (pid {process.pid})")

    def _stop_watch(self, watch: MountWatch) -> None:
        process, watch.process, watch.token, watch.state = watch.process, None, None, "stopped"
        if process is not None:
            process.stop()

    def _on_data(self, watch: MountWatch, token, data: bytes) -> None:
        if watch.token is not token:
            return
        lines = (watch.partial + data).split(b"\n")
        watch.partial = lines.pop()
        changed: set[str] = set()
        for raw in lines:
            if raw.strip():
                changed |= self._on_line(watch, raw)
        self._changed(changed)

    def _on_line(self, watch: MountWatch, raw: bytes) -> set[str]:
        try:
            event = json.loads(raw)
            kind = event.get("event")
            item = event.get("item") or {}
            path = item.get("path")
        except (ValueError, AttributeError):
            LOG.warning("ubiquityfs: unexpected line from the watch of %s: %r", watch.mountpoint, raw[:200])
            return set()
        if kind == "gatheringFinished":
            items, watch.gathering = watch.gathering or {}, None
            return self._replace(watch, items)
        if not isinstance(path, str):
            return set()
        if kind in ("result", "added", "changed"):
            status = ItemStatus(item)
            if watch.gathering is not None:
                watch.gathering[path] = status
                return set()
            return self._put(watch, {path: status})
        if kind == "removed":
            if watch.gathering is not None:
                watch.gathering.pop(path, None)
                return set()
            return self._put(watch, {path: None})
        return set()

    def _on_exit(self, watch: MountWatch, token, status, errors: str) -> None:
        if watch.token is not token or self._stopping:
            return          # stopped on purpose, or replaced
        watch.process, watch.token = None, None
        message = errors if status is None else _error_text(errors, status)
        watch.last_error = message
        if any(marker in message for marker in _FOREIGN_MARKERS):
            # Another device's (user's) mount: never ours until remounted.
            watch.state = "foreign"
            LOG.info("ubiquityfs: %s is not this device's mount; no status shown: %s", watch.mountpoint, message)
            _debug(f"foreign mount {watch.mountpoint}: {message}")
            return
        now = time.monotonic()
        if watch.started_at and now - watch.started_at > self.HEALTHY_AFTER:
            watch.failures = 0
        watch.failures += 1
        delay = min(self.BACKOFF_MAX, 2.0 ** (watch.failures - 1))
        watch.state, watch.next_start = "backoff", now + delay
        LOG.warning("ubiquityfs: the watch of %s ended (%s); restarting in %.0f s", watch.mountpoint, message, delay)
        _debug(f"watch of {watch.mountpoint} ended ({message}); restart in {delay:.0f} s")
        self.runner.call_later(delay + 0.01, self.scan)

    def _replace(self, watch: MountWatch, items: dict[str, ItemStatus]) -> set[str]:
        """A watch's initial results: they replace what the mount had."""
        old, watch.items, watch.ready = watch.items, items, True
        _debug(f"{watch.mountpoint}: {len(items)} items")
        return {p for p in old.keys() | items.keys() if _key(old.get(p)) != _key(items.get(p))}

    def _put(self, watch: MountWatch, updates: dict[str, ItemStatus | None]) -> set[str]:
        """Apply updates (None: removed); the paths whose emblems or text changed."""
        changed = set()
        if self._watches.get(watch.mountpoint) is not watch:
            return changed
        for path, status in updates.items():
            old = watch.items.get(path)
            if status is None:
                watch.items.pop(path, None)
            else:
                watch.items[path] = status
            if _key(old) != _key(status):
                changed.add(path)
        return changed

    # -- the file manager's objects --------------------------------------------

    def remember(self, path: str, file) -> None:
        """A FileInfo the file manager asked about: invalidated when its status changes."""
        self._seen[path] = file
        self._seen.move_to_end(path)
        while len(self._seen) > self.SEEN_LIMIT:
            self._seen.popitem(last=False)

    def _changed(self, paths) -> None:
        """These paths' emblems or text changed: invalidate them, once per main-loop turn."""
        if not paths:
            return
        self._pending.update(paths)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.runner.post(self._flush)

    def _flush(self) -> None:
        paths, self._pending, self._flush_scheduled = self._pending, set(), False
        count = 0
        for path in paths:
            file = self._seen.get(path)
            if file is None:
                continue
            try:
                file.invalidate_extension_info()
                count += 1
            except Exception as e:  # a file the file manager has dropped
                LOG.debug("ubiquityfs: invalidating %s: %s", path, e)
                self._seen.pop(path, None)
        self.invalidations += count
        if count:
            _debug(f"invalidated {count} of {len(paths)} changed items")

    # -- running the command line ------------------------------------------------

    def cli(self, args: list[str], on_done) -> None:
        """Run `ubiquityfs ARGS` asynchronously; `on_done(status, stdout text, message)`
        on the main thread, status None when it could not run at all."""
        binary = self.binary
        if binary is None:
            self.runner.post(lambda: on_done(None, "", "the ubiquityfs command was not found (set UBIQUITYFS_BIN)"))
            return
        _debug(f"running ubiquityfs {' '.join(args)}")

        def done(status, out: bytes, err: bytes):
            text = err.decode("utf-8", "replace")
            message = (text.strip() or f"cannot run {binary}") if status is None else _error_text(text, status)
            on_done(status, out.decode("utf-8", "replace"), message)
        self.runner.run([binary, *args], self.env, done)

    def run_action(self, title: str, commands: list[list[str]], paths: list[str], on_output=None,
                   check=None) -> None:
        """Run `ubiquityfs ARGS` for each of `commands`, one after the other,
        then read `paths`' status again, then report failures (a notification)
        or hand the outputs to `on_output`. `check(proceed)`, if given, runs
        first and calls `proceed(None)`, or `proceed(message)` to fail."""
        failures: list[str] = []
        outputs: list[str] = []

        def report():
            if failures:
                self.notify(f"{title} failed", "\n".join(failures), error=True)
            elif on_output is not None:
                on_output(outputs)

        def step(i: int):
            if i == len(commands):
                self.refresh(paths, then=report)
                return

            def done(status, out, message):
                if status == 0:
                    outputs.append(out)
                else:
                    failures.append(message)
                    if status is None:      # the command line itself is missing: no point going on
                        self.refresh(paths, then=report)
                        return
                step(i + 1)
            self.cli(commands[i], done)

        def checked(problem):
            if problem:
                failures.append(problem)
                report()
            else:
                step(0)

        if check is None:
            step(0)
        else:
            check(checked)

    def refresh(self, paths: list[str], then=None) -> None:
        """Read the status of `paths` and everything below them again (one
        `query --json` per mount) and apply it; then `then()`."""
        by_mount: dict[str, list[str]] = {}
        for path in paths:
            watch = self._watch_for(path)
            if watch is not None and watch.ready and watch.state != "foreign":
                by_mount.setdefault(watch.mountpoint, []).append(path)
        left = [len(by_mount)]

        def one_done():
            left[0] -= 1
            if left[0] == 0 and then is not None:
                then()

        if not by_mount:
            if then is not None:
                then()
            return
        for mountpoint, wanted in by_mount.items():
            predicate = " OR ".join(f"path BEGINSWITH {predicate_string(p)}" for p in wanted)

            def done(status, out, message, mountpoint=mountpoint, wanted=wanted):
                if status != 0:
                    LOG.warning("ubiquityfs: re-reading the status in %s: %s", mountpoint, message)
                    one_done()
                    return
                self._apply_lines(mountpoint, wanted, out.splitlines(), one_done)
            self.cli(["query", mountpoint, "--json", "--predicate", predicate], done)

    def _apply_lines(self, mountpoint: str, wanted: list[str], lines: list[str], then) -> None:
        """Query result lines into the map, SLICE lines per main-loop turn."""
        watch = self._watches.get(mountpoint)
        if watch is None:
            then()
            return
        updates = {}
        for text in lines[:self.SLICE]:
            try:
                item = json.loads(text).get("item") or {}
            except (ValueError, AttributeError):
                continue
            path = item.get("path")
            if isinstance(path, str) and any(path == p or path.startswith(p.rstrip("/") + "/") for p in wanted):
                updates[path] = ItemStatus(item)
        self._changed(self._put(watch, updates))
        rest = lines[self.SLICE:]
        if rest:
            self.runner.post(lambda: self._apply_lines(mountpoint, wanted, rest, then))
        else:
            then()

    # -- conflict versions -----------------------------------------------------

    def versions(self, path: str) -> list[dict] | None:
        """The cached version rows of a conflicted file (None: not fetched for its current status)."""
        status = self.status(path)
        cached = self._versions.get(path)
        if status is None or cached is None or cached[0] != status.key():
            return None
        return cached[1]

    def want_versions(self, path: str, status: ItemStatus) -> None:
        """Fetch the versions of a conflicted file, once per status: after the
        current main-loop turn (so that update_file_info itself starts nothing)."""
        cached = self._versions.get(path)
        if (cached is not None and cached[0] == status.key()) or path in self._versions_asked:
            return
        self._versions_asked.add(path)
        key = status.key()

        def done(code, out, _message):
            self._versions_asked.discard(path)
            if code == 0:
                self._versions[path] = (key, parse_versions(out))
        self.runner.post(lambda: self.cli(["versions", path], done))


# ---------------------------------------------------------------------------
# Notifications and dialogs (main thread)
# ---------------------------------------------------------------------------

_notification_ids = itertools.count(1)


def default_notify(title: str, body: str, *, error: bool = False) -> None:
    """A desktop notification: through the file manager's GApplication
    (Gio.Notification), else `notify-send`, else only the log."""
    (LOG.warning if error else LOG.info)("ubiquityfs: %s: %s", title, body)
    _debug(f"notify: {title}: {body}")
    try:
        app = Gio.Application.get_default()
        if app is not None and app.get_is_registered():
            note = Gio.Notification.new(title)
            note.set_body(body)
            if error:
                note.set_priority(Gio.NotificationPriority.HIGH)
            app.send_notification(f"ubiquityfs-{next(_notification_ids)}", note)
            return
    except Exception as e:
        LOG.debug("ubiquityfs: Gio notification failed: %s", e)
    notify_send = shutil.which("notify-send")
    if notify_send:
        icon = "emblem-ubiquityfs-error" if error else "emblem-ubiquityfs-downloaded"
        argv = [notify_send, "--app-name=UbiquityFS", "--icon", icon, title, body]
        try:
            if hasattr(Gio, "Subprocess"):
                Gio.Subprocess.new(argv, Gio.SubprocessFlags.STDOUT_SILENCE | Gio.SubprocessFlags.STDERR_SILENCE)
            else:
                ThreadRunner(lambda fn: fn()).run(argv, dict(os.environ), lambda *_: None)
        except Exception as e:
            LOG.debug("ubiquityfs: notify-send failed: %s", e)


def show_text(title: str, text: str, notify) -> None:
    """A non-modal message dialog when GTK's introspection data is installed
    (GTK 4 in Nautilus 43, GTK 3 in the others), else a notification."""
    try:
        app = Gio.Application.get_default()
        if app is None or not hasattr(app, "get_active_window"):
            raise RuntimeError("not inside the file manager")
        import gi
        gi.require_version("Gtk", "4.0" if (HOST_NAME, HOST_VERSION) == ("Nautilus", "4.0") else "3.0")
        from gi.repository import Gtk
        parent = app.get_active_window()
        dialog = Gtk.MessageDialog(transient_for=parent, modal=False, message_type=Gtk.MessageType.INFO,
                                   buttons=Gtk.ButtonsType.CLOSE, text=title)
        dialog.set_property("secondary-use-markup", True)
        dialog.set_property("secondary-text", "<tt>" + html.escape(text, quote=False) + "</tt>")
        dialog.connect("response", lambda d, _r: d.destroy())
        dialog.present()
        _debug(f"dialog: {title}")
        return
    except Exception as e:  # no Gtk typelib, no display: a notification
        LOG.debug("ubiquityfs: no dialog (%s); notifying", e)
    notify(title, text, error=False)


def describe_versions(rows: list[dict], raw: str) -> str:
    """`ubiquityfs versions` in a few lines: "current: DEVICE, MODIFIED, SIZE (PATH)"."""
    if not rows:
        return raw.strip()
    return "\n".join(f"{r['label']}: {r['device']}, {r['modified']}, {r['size']} ({r['path']})" for r in rows)


# ---------------------------------------------------------------------------
# The provider
# ---------------------------------------------------------------------------

_shared: Controller | None = None


def shared_controller() -> Controller:
    """The controller of this process (one per file manager), started on first use."""
    global _shared
    if _shared is None:
        _shared = Controller().start()
        _debug(f"controller started (binary {_shared.binary or 'NOT FOUND'})")
    return _shared


def _path_of(file) -> str | None:
    """The local path of a FileInfo (None for other URI schemes)."""
    try:
        location = file.get_location()
        path = location.get_path() if location is not None else None
        if path:
            return path
    except Exception:
        pass
    try:
        uri = file.get_uri()
    except Exception:
        return None
    if uri and uri.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlsplit(uri).path)
    return None


def _menu_item(name: str, label: str, tip: str, icon: str | None = None):
    kwargs = {"name": name, "label": label, "tip": tip}
    if icon:
        kwargs["icon"] = icon
    return FM.MenuItem(**kwargs)


def _is_directory(file, status: ItemStatus | None) -> bool:
    if status is not None:
        return status.is_dir
    try:
        return bool(file.is_directory())
    except Exception:
        return False


class UbiquityFSExtension(GObject.GObject, FM.InfoProvider, FM.MenuProvider, FM.ColumnProvider):
    """Emblems, a status column and a context menu for UbiquityFS mounts.

    Method signatures take `*args` where the hosts differ: nautilus-python
    4.0 passes `(files)` / `(folder)`, Nautilus 3, Nemo and Caja pass
    `(window, files)` / `(window, folder)`.
    """

    def __init__(self, controller: Controller | None = None):
        super().__init__()
        self.controller = controller or shared_controller()
        _debug(f"extension ready in {HOST_NAME} {HOST_VERSION}")

    # -- InfoProvider ----------------------------------------------------------

    def update_file_info(self, file):
        """Answer from the status map: never blocks (no I/O, no subprocess)."""
        try:
            path = _path_of(file)
            if path is not None and self.controller.actionable(path):
                self.controller.remember(path, file)
                status = self.controller.status(path)
                if status is not None:
                    for emblem in status.emblems:
                        file.add_emblem(emblem)
                    file.add_string_attribute(STATUS_ATTRIBUTE, status.text)
                    if status.conflicts and not status.is_dir:
                        self.controller.want_versions(path, status)
                _debug(f"update_file_info {path}: {list(status.emblems) if status else 'status not known yet'}")
        except Exception:
            LOG.exception("ubiquityfs: update_file_info failed")
        return FM.OperationResult.COMPLETE

    # -- ColumnProvider --------------------------------------------------------

    def get_columns(self, *args):
        return [FM.Column(name="UbiquityFS::sync_status", attribute=STATUS_ATTRIBUTE, label="Sync Status",
                          description="UbiquityFS: in the cloud, downloaded, kept on this device, uploading…")]

    # -- MenuProvider ----------------------------------------------------------

    def get_file_items(self, *args):
        try:
            return self._menu(list(args[-1] or []))
        except Exception:
            LOG.exception("ubiquityfs: building the menu failed")
            return []

    def get_background_items(self, *args):
        try:
            return self._menu([args[-1]], background=True) if args and args[-1] is not None else []
        except Exception:
            LOG.exception("ubiquityfs: building the menu failed")
            return []

    def _menu(self, files, background: bool = False):
        c = self.controller
        selected = []   # (path, status, is_directory)
        for file in files:
            path = _path_of(file)
            if path is None or not c.actionable(path):
                continue
            status = c.status(path)
            selected.append((path, status, _is_directory(file, status)))
        if not selected:
            return []
        paths = [p for p, _, _ in selected]
        any_dir = any(d for _, _, d in selected)
        unknown = any(s is None for _, s, _ in selected)
        where = "Folder" if background else ""
        items = []

        def item(key, label, tip, callback=None, *data, icon=None):
            entry = _menu_item(f"UbiquityFS::{key}{where}", label, tip, icon)
            if callback is not None:
                entry.connect("activate", lambda _item: callback(*data))
            items.append(entry)
            return entry

        if unknown or any_dir or any(not s.local for _, s, _ in selected):
            item("download", "Download Now", "Download to this device now (folders: everything inside)",
                 self._download, paths, any_dir, icon="emblem-ubiquityfs-downloading")
        if unknown or any_dir or any(s.local for _, s, _ in selected):
            item("evict", "Free Up Space", "Remove the downloaded copy; it stays in the cloud",
                 self._simple, "Free Up Space", "evict", paths, icon="emblem-ubiquityfs-cloud")
        if unknown or any(not s.pinned for _, s, _ in selected):
            item("pin", "Keep on This Device", "Always keep a downloaded copy here (folders: what arrives later too)",
                 self._simple, "Keep on This Device", "pin", paths, icon="emblem-ubiquityfs-pinned")
        if unknown or any(s.pinned for _, s, _ in selected):
            item("unpin", "Stop Keeping on This Device", "Let the downloaded copy be freed again",
                 self._simple, "Stop Keeping on This Device", "unpin", paths)
        conflicted = [p for p, s, d in selected if s is not None and s.conflicts and not d]
        if conflicted and not background:
            resolve = item("resolve", "Resolve Conflict", "Choose which version to keep",
                           icon="emblem-ubiquityfs-conflict")
            submenu = FM.Menu()
            resolve.set_submenu(submenu)
            choices = [("current", "Keep Current Version", "Delete the conflicted copies", None),
                       ("both", "Keep All Versions", "Keep every version as a file of its own", None)]
            if len(conflicted) == 1:
                for row in c.versions(conflicted[0]) or []:
                    if row["label"].isdigit():
                        choices.append((row["label"], f"Keep Version {row['label']} ({row['device']}, {row['modified']})",
                                        f"Keep {row['path']} under this name (the others are deleted)", row))
            for keep, label, tip, row in choices:
                sub = _menu_item(f"UbiquityFS::resolve-{keep}", label, tip)
                sub.connect("activate", lambda _item, keep=keep, row=row: self._resolve(conflicted, keep, row))
                submenu.append_item(sub)
        if len(selected) == 1 and not any_dir and not background:
            item("versions", "Show Versions", "The current version and its conflict versions",
                 self._versions, paths[0])
        return items

    # -- actions (they only start the command line, asynchronously) -------------

    def _download(self, paths, recursive):
        self.controller.run_action("Download Now", [["download", *(["--recursive"] if recursive else []), *paths]], paths)

    def _simple(self, title, command, paths):
        self.controller.run_action(title, [[command, *paths]], paths)

    def _resolve(self, paths, keep, row=None):
        check = None
        if row is not None:
            # Conflict versions are numbered afresh as they come and go: keep
            # version N only if N is still the copy the menu named.
            def check(proceed):
                def listed(status, out, message):
                    rows = parse_versions(out) if status == 0 else []
                    if any(r["label"] == keep and r["path"] == row["path"] for r in rows):
                        proceed(None)
                    else:
                        proceed(f"The versions of {os.path.basename(paths[0])} changed; open the menu again."
                                if status == 0 else message)
                self.controller.cli(["versions", paths[0]], listed)
        # The conflicted copies are removed by the resolution: the watch reports that.
        self.controller.run_action("Resolve Conflict", [["resolve", p, "--keep", keep] for p in paths], paths,
                                   check=check)

    def _versions(self, path):
        def show(outputs):
            raw = outputs[0] if outputs else ""
            show_text(f"Versions of {os.path.basename(path)}", describe_versions(parse_versions(raw), raw),
                      self.controller.notify)
        self.controller.run_action("Show Versions", [["versions", path]], [], on_output=show)


_debug(f"loaded {__file__} for {HOST_NAME} {HOST_VERSION} (Python {sys.version.split()[0]})")
