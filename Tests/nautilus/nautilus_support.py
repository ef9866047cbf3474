"""Fixtures and helpers for the file-manager extension tests (Packaging/nautilus),
imported by test_extension.py. (Not a conftest.py: Tests/mount's test modules
import their helpers with `from conftest import …`, and a second conftest.py
would take that name when both folders run in one session.)

The extension is loaded two ways ("flavours"):

* ``gi``: with the real GObject introspection of Nautilus 4.0
  (python3-gi + gir1.2-nautilus-4.0). Menu items are real
  ``Nautilus.MenuItem`` objects, files are a GObject implementing the
  ``Nautilus.FileInfo`` interface (so the extension's calls go through GI's
  vfuncs), and the extension runs on GLib's main loop as in Nautilus
  (``GLibRunner``: Gio.Subprocess, GLib timeouts); the tests iterate the
  default main context. When this interpreter has no PyGObject (a pyenv
  Python) but the system's has one built for the same ABI, the system's
  ``gi`` package is borrowed through a one-entry folder on sys.path.
* ``stub``: with ``nautilus_stub`` standing in for gi (always available); the
  extension then uses its ``ThreadRunner`` and the tests run the stub's idle queue.

``UBQ_NAUTILUS_FLAVOURS=stub`` (or ``gi``) restricts the run to one; the gi
flavour is skipped, saying why, where the introspection data is missing. The
mount tests (real daemons, with the fixtures of ``Tests/mount/conftest.py``)
use the gi flavour where it is available, else the stub.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
EXTENSION = REPO / "Packaging" / "nautilus" / "ubiquityfs_nautilus.py"
MOUNT_CONFTEST = REPO / "Tests" / "mount" / "conftest.py"
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import nautilus_stub  # noqa: E402


def _mount_conftest():
    """Tests/mount/conftest.py: pytest's own instance when it has loaded it
    (Tests/mount in the same session), else loaded here under a name of its own."""
    loaded = sys.modules.get("conftest")
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() == MOUNT_CONFTEST:
        return loaded, False
    if "ubq_mount_conftest" in sys.modules:
        return sys.modules["ubq_mount_conftest"], True
    spec = importlib.util.spec_from_file_location("ubq_mount_conftest", MOUNT_CONFTEST)
    module = importlib.util.module_from_spec(spec)
    sys.modules["ubq_mount_conftest"] = module
    spec.loader.exec_module(module)
    return module, True


mount_conftest, _loaded_here = _mount_conftest()
# The mount fixtures, for test_extension.py to import: devices on a store, and
# a teardown that unmounts and fails on leftover mounts or processes.
store = mount_conftest.store
make_device = mount_conftest.make_device
private_data_home = mount_conftest.private_data_home


@pytest.fixture(scope="session", autouse=True)
def mount_safety_net():
    """What Tests/mount's pytest_sessionfinish does when pytest did not load
    that conftest itself: no mount or daemon left behind, even after Ctrl-C."""
    yield
    if _loaded_here:
        for dev in list(mount_conftest._LIVE_DEVICES):
            dev.close()


FLAVOURS = [f for f in os.environ.get("UBQ_NAUTILUS_FLAVOURS", "gi,stub").split(",") if f]


# ---------------------------------------------------------------------------
# Real GObject introspection
# ---------------------------------------------------------------------------

_GI: dict = {}


def real_gi():
    """(gi, None) with Nautilus 4.0 required, or (None, why not)."""
    if "result" in _GI:
        return _GI["result"]
    try:
        import gi  # noqa: F401
    except ImportError:
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        system = Path("/usr/lib/python3/dist-packages/gi")
        if (system / f"_gi{suffix}").exists():
            shim = Path(tempfile.mkdtemp(prefix="ubq-gi-shim-"))
            (shim / "gi").symlink_to(system)
            sys.path.append(str(shim))
            atexit.register(shutil.rmtree, shim, True)
    try:
        import gi
        gi.require_version("Nautilus", "4.0")
        from gi.repository import Gio, GLib, GObject, Nautilus  # noqa: F401
        _GI["result"] = (gi, None)
    except (ImportError, ValueError) as e:
        _GI["result"] = (None, f"no Nautilus 4.0 introspection here ({type(e).__name__}: {e}); "
                               "install python3-gi python3-nautilus gir1.2-nautilus-4.0")
    return _GI["result"]


_GI_FILE_CLASS = []


def gi_file_class():
    """A GObject implementing Nautilus.FileInfo (made once: a GType is registered)."""
    if _GI_FILE_CLASS:
        return _GI_FILE_CLASS[0]
    from gi.repository import Gio, GObject, Nautilus

    class GiFileInfo(GObject.Object, Nautilus.FileInfo, FakeFileState):
        def __init__(self, path, is_dir=False):
            super().__init__()
            FakeFileState.__init__(self, path, is_dir)

        def do_get_location(self):
            return Gio.File.new_for_path(self.path)

        def do_get_uri(self):
            return Gio.File.new_for_path(self.path).get_uri()

        def do_get_name(self):
            return os.path.basename(self.path)

        def do_is_directory(self):
            return self.is_dir

        def do_is_gone(self):
            return False

        def do_add_emblem(self, emblem):
            self.emblems.append(emblem)

        def do_add_string_attribute(self, name, value):
            self.attributes[name] = value

        def do_invalidate_extension_info(self):
            self.invalidated += 1
            self.invalidated_at = time.monotonic()

    _GI_FILE_CLASS.append(GiFileInfo)
    return GiFileInfo


class FakeFileState:
    """What a fake FileInfo records: emblems and attributes added, invalidations."""

    def __init__(self, path, is_dir=False):
        self.path = str(path)
        self.is_dir = is_dir
        self.emblems: list[str] = []
        self.attributes: dict[str, str] = {}
        self.invalidated = 0
        self.invalidated_at = None

    def clear(self):
        self.emblems.clear()
        self.attributes.clear()


class StubFileInfo(FakeFileState):
    """The stub flavour's NautilusFileInfo."""

    def get_location(self):
        return nautilus_stub._File(self.path)

    def get_uri(self):
        return nautilus_stub._File(self.path).get_uri()

    def get_name(self):
        return os.path.basename(self.path)

    def is_directory(self):
        return self.is_dir

    def is_gone(self):
        return False

    def add_emblem(self, emblem):
        self.emblems.append(emblem)

    def add_string_attribute(self, name, value):
        self.attributes[name] = value

    def invalidate_extension_info(self):
        self.invalidated += 1
        self.invalidated_at = time.monotonic()


# ---------------------------------------------------------------------------
# Loading the extension
# ---------------------------------------------------------------------------

_LOADED: dict[str, object] = {}


def load_extension(flavour: str):
    """The extension module, executed with the real gi or with the stub in sys.modules."""
    if flavour in _LOADED:
        return _LOADED[flavour]
    name = f"ubiquityfs_nautilus_{flavour}"
    spec = importlib.util.spec_from_file_location(name, EXTENSION)
    module = importlib.util.module_from_spec(spec)
    if flavour == "stub":
        stubs = nautilus_stub.modules()
        saved = {key: sys.modules.get(key) for key in stubs}
        sys.modules.update(stubs)
        try:
            spec.loader.exec_module(module)
        finally:
            for key, value in saved.items():
                if value is None:
                    sys.modules.pop(key, None)
                else:
                    sys.modules[key] = value
    else:
        spec.loader.exec_module(module)
    sys.modules[name] = module
    _LOADED[flavour] = module
    return module


class Flavour:
    """The extension as loaded one way, and how to drive the main loop there."""

    def __init__(self, name: str):
        self.name = name
        self.ext = load_extension(name)
        self.FM = self.ext.FM
        self._file_class = gi_file_class() if name == "gi" else StubFileInfo
        self.controllers = []

    def __repr__(self):
        return f"<Flavour {self.name}>"

    def file(self, path, is_dir=False):
        return self._file_class(str(path), is_dir)

    def iterate(self) -> int:
        """Run what is due on the main thread; how many callbacks ran (gi: whether any)."""
        if self.name == "gi":
            from gi.repository import GLib
            ran = 0
            context = GLib.MainContext.default()
            while context.pending():
                context.iteration(False)
                ran += 1
            return ran
        return nautilus_stub.run_idle()

    def pump(self, until, timeout: float, what: str = "", interval: float = 0.02):
        """Run the main loop until `until()` is true (and return its value); fail after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            self.iterate()
            value = until()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not true within {timeout:.1f}s: {what}")
            time.sleep(interval)

    def controller(self, **kw):
        """A controller on this flavour's main loop (gi: GLibRunner, the one
        the file manager uses; stub: ThreadRunner), recording notifications,
        shut down at teardown."""
        kw.setdefault("notify", Notifications())
        controller = self.ext.Controller(**kw)
        self.controllers.append(controller)
        return controller

    def provider(self, controller):
        return self.ext.UbiquityFSExtension(controller=controller)

    def close(self):
        """Shut every controller down; its watch processes must be gone within 10 s."""
        pids = [pid for c in self.controllers for pid in map(c.watch_pid, c.mountpoints()) if pid]
        for controller in self.controllers:
            controller.shutdown()
        self.controllers.clear()
        self.iterate()
        left = [pid for pid in pids if not mount_conftest.wait_pid_exit(pid, 10)]
        assert not left, f"watch processes still running after shutdown: {left}"


class Notifications(list):
    """A notifier that records (title, body, error)."""

    def __call__(self, title, body, *, error=False):
        self.append((title, body, error))


def _flavour(name: str):
    if name not in FLAVOURS:
        pytest.skip(f"flavour {name} not selected (UBQ_NAUTILUS_FLAVOURS={','.join(FLAVOURS)})")
    if name == "gi":
        gi, why = real_gi()
        if gi is None:
            pytest.skip(why)
    flavour = Flavour(name)
    return flavour


@pytest.fixture(params=["gi", "stub"])
def flavour(request):
    """The extension, loaded with real GI and with the stub (each test runs with both)."""
    f = _flavour(request.param)
    yield f
    f.close()


@pytest.fixture
def best_flavour():
    """The extension with real GI where available, else with the stub."""
    names = [n for n in ("gi", "stub") if n in FLAVOURS]
    if "gi" in names and real_gi()[0] is None:
        names.remove("gi")
    if not names:
        pytest.skip("no flavour selected")
    f = Flavour(names[0])
    yield f
    f.close()

