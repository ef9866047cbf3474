"""A small stand-in for PyGObject's `gi` with `Nautilus` 4.0, `GObject`,
`GLib` and `Gio`: only what the extension and the tests call, so that the
extension loads and runs where python3-nautilus / gir1.2-nautilus-4.0 are
not installed (or in an interpreter without PyGObject).

`GLib.idle_add` queues the callback; `pending` holds the queue and `run_idle`
runs it, standing in for Nautilus's main loop. The stub is used only while
the extension module is being executed (see conftest.load_extension); the
module keeps references to these objects afterwards.
"""

from __future__ import annotations

import threading
import types
from urllib.parse import quote

pending: list = []
_pending_lock = threading.Lock()


def run_idle() -> int:
    """Run the queued idle callbacks (as the main loop would); how many ran."""
    with _pending_lock:
        batch = list(pending)
        pending.clear()
    for fn, args in batch:
        fn(*args)
    return len(batch)


class _Props:
    def __init__(self, values):
        self.__dict__.update(values)


class _GObject:
    """GObject.GObject: properties from keyword arguments, signals by name."""

    def __init__(self, **props):
        self.props = _Props(props)
        self._handlers: dict[str, list] = {}

    def get_property(self, name):
        return getattr(self.props, name.replace("-", "_"))

    def set_property(self, name, value):
        setattr(self.props, name.replace("-", "_"), value)

    def connect(self, signal, callback, *data):
        self._handlers.setdefault(signal, []).append((callback, data))
        return len(self._handlers[signal])

    def emit(self, signal, *args):
        for callback, data in self._handlers.get(signal, []):
            callback(self, *args, *data)


class _Interface:
    """A provider interface: a plain mixin."""


class _MenuItem(_GObject):
    def __init__(self, name, label, tip="", icon=None):
        super().__init__(name=name, label=label, tip=tip, icon=icon, menu=None, sensitive=True, priority=True)

    def set_submenu(self, menu):
        self.props.menu = menu

    def activate(self):
        self.emit("activate")


class _Menu(_GObject):
    def __init__(self):
        super().__init__()
        self._items = []

    def append_item(self, item):
        self._items.append(item)

    def get_items(self):
        return list(self._items)


class _Column(_GObject):
    def __init__(self, name, attribute, label, description):
        super().__init__(name=name, attribute=attribute, label=label, description=description)


class _OperationResult:
    COMPLETE = "complete"
    FAILED = "failed"
    IN_PROGRESS = "in-progress"


class _File:
    """Gio.File for local paths."""

    def __init__(self, path):
        self._path = path

    @classmethod
    def new_for_path(cls, path):
        return cls(path)

    def get_path(self):
        return self._path

    def get_uri(self):
        return "file://" + quote(self._path)


class _Application:
    @staticmethod
    def get_default():
        return None


def _idle_add(fn, *args):
    with _pending_lock:
        pending.append((fn, args))
    return len(pending)


def modules() -> dict[str, types.ModuleType]:
    """sys.modules entries: gi, gi.repository and its four modules."""
    gi = types.ModuleType("gi")
    gi.__path__ = []
    required = {"Nautilus": "4.0"}
    gi.get_required_version = lambda namespace: required.get(namespace)

    def require_version(namespace, version):
        if required.get(namespace, version) != version or namespace not in ("Nautilus", "GLib", "Gio", "GObject"):
            raise ValueError(f"Namespace {namespace} not available for version {version} (stub)")
        required[namespace] = version

    gi.require_version = require_version
    repository = types.ModuleType("gi.repository")
    repository.__path__ = []
    gi.repository = repository

    nautilus = types.ModuleType("gi.repository.Nautilus")
    nautilus.InfoProvider = type("InfoProvider", (_Interface,), {})
    nautilus.MenuProvider = type("MenuProvider", (_Interface,), {})
    nautilus.ColumnProvider = type("ColumnProvider", (_Interface,), {})
    nautilus.FileInfo = type("FileInfo", (_Interface,), {})
    nautilus.MenuItem = _MenuItem
    nautilus.Menu = _Menu
    nautilus.Column = _Column
    nautilus.OperationResult = _OperationResult
    nautilus.STUB = True

    gobject = types.ModuleType("gi.repository.GObject")
    gobject.GObject = gobject.Object = _GObject

    glib = types.ModuleType("gi.repository.GLib")
    glib.idle_add = _idle_add
    glib.markup_escape_text = lambda text, length=-1: text.replace("&", "&amp;").replace("<", "&lt;")

    gio = types.ModuleType("gi.repository.Gio")
    gio.File = _File
    gio.Application = _Application

    for name, module in (("Nautilus", nautilus), ("GObject", gobject), ("GLib", glib), ("Gio", gio)):
        setattr(repository, name, module)
    return {"gi": gi, "gi.repository": repository, "gi.repository.Nautilus": nautilus,
            "gi.repository.GObject": gobject, "gi.repository.GLib": glib, "gi.repository.Gio": gio}
