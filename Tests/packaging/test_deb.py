"""The Debian package built by Packaging/deb/build.sh (not built here: it takes
minutes; Tests/run-all.sh builds one from the debug build with `build.sh
--debug` first). Run after a build:

    bash Packaging/deb/build.sh && python3 -m pytest -q Tests/packaging/test_deb.py

The package is UBQ_DEB, else the newest .build-pkg/ubiquityfs_*.deb; without
one every test here is skipped. Inspected with dpkg-deb, readelf, man and
bash; then (as root, when no ubiquityfs package is installed) installed
with apt-get, used through mount(8), and purged again.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, cleanup_mount, mount_type, need_root_and_fuse, user_env


def find_deb() -> Path | None:
    if os.environ.get("UBQ_DEB"):
        return Path(os.environ["UBQ_DEB"])
    debs = sorted((REPO / ".build-pkg").glob("ubiquityfs_*.deb"), key=lambda p: p.stat().st_mtime)
    return debs[-1] if debs else None


DEB = find_deb()
pytestmark = pytest.mark.skipif(DEB is None, reason="no package built (bash Packaging/deb/build.sh)")

EXPECTED = [
    "./usr/bin/ubiquityfs",
    "./usr/sbin/mount.fuse.ubiquityfs",
    "./usr/sbin/mount.ubiquityfs",
    "./usr/sbin/umount.fuse.ubiquityfs",
    "./usr/lib/systemd/user/ubiquityfs.service",
    "./usr/share/man/man1/ubiquityfs.1.gz",
    "./usr/share/man/man1/ubiquityfs-mount.1.gz",
    "./usr/share/man/man1/ubiquityfs-unmount.1.gz",
    "./usr/share/man/man1/ubiquityfs-service.1.gz",
    "./usr/share/man/man1/ubiquityfs-container-create.1.gz",
    "./usr/share/man/man8/mount.fuse.ubiquityfs.8.gz",
    "./usr/share/man/man8/mount.ubiquityfs.8.gz",
    "./usr/share/bash-completion/completions/ubiquityfs",
    "./usr/share/zsh/vendor-completions/_ubiquityfs",
    "./usr/share/fish/vendor_completions.d/ubiquityfs.fish",
    "./usr/share/doc/ubiquityfs/copyright",
    "./usr/share/doc/ubiquityfs/changelog.gz",
]


@pytest.fixture(scope="module")
def extracted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("deb")
    subprocess.run(["dpkg-deb", "-x", str(DEB), str(root)], check=True)
    return root


def field(name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(DEB), name], capture_output=True, text=True, check=True).stdout.strip()


def test_contents():
    listing = subprocess.run(["dpkg-deb", "-c", str(DEB)], capture_output=True, text=True, check=True).stdout
    paths = {line.split()[5] for line in listing.splitlines()}
    missing = [p for p in EXPECTED if p not in paths]
    assert not missing, missing
    # Every subcommand has its page.
    pages = {p for p in paths if p.startswith("./usr/share/man/man1/")}
    for sub in ["mount", "unmount", "status", "download", "evict", "pin", "unpin", "versions", "resolve", "container",
                "query", "service"]:
        assert f"./usr/share/man/man1/ubiquityfs-{sub}.1.gz" in pages, sub
    owners = {tuple(line.split()[1].split("/")) for line in listing.splitlines()}
    assert owners == {("root", "root")}


def test_control_fields():
    depends = field("Depends")
    for needed in ["fuse3", "shared-mime-info", "libfuse3-3", "libsqlite3-0", "libc6"]:
        assert re.search(rf"(^|, ){re.escape(needed)}( |,|$)", depends), (needed, depends)
    assert "swift" not in depends.lower()
    assert DEB.name == f"ubiquityfs_{field('Version')}_{field('Architecture')}.deb"


def test_binary_needs_no_swift_toolchain(extracted):
    binary = extracted / "usr/bin/ubiquityfs"
    needed = subprocess.run(["readelf", "-d", str(binary)], capture_output=True, text=True, check=True).stdout
    libraries = re.findall(r"Shared library: \[(.+?)\]", needed)
    assert libraries and not [l for l in libraries if re.match(r"lib(swift|Foundation|_Foundation|dispatch|BlocksRuntime)", l)], libraries
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout
    assert "/opt/swift" not in ldd and "not found" not in ldd, ldd
    p = subprocess.run([str(binary), "--version"], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert p.returncode == 0 and p.stdout.strip() == f"ubiquityfs {field('Version')}", p.stderr


def test_man_pages_render(extracted):
    if not shutil.which("man"):
        pytest.skip("man is not installed (man-db)")
    pages = sorted((extracted / "usr/share/man").glob("man*/*.gz"))
    assert len(pages) >= 15
    for page in pages:
        p = subprocess.run(["man", "--warnings", "-l", "-Tutf8", str(page)], capture_output=True, text=True,
                           env=dict(os.environ, MANWIDTH="80"))
        assert p.returncode == 0 and p.stdout.strip(), (page, p.stderr)
        assert "warning" not in p.stderr, (page.name, p.stderr)


def test_bash_completion_loads(extracted):
    script = extracted / "usr/share/bash-completion/completions/ubiquityfs"
    p = subprocess.run(["bash", "-c", f"source {script} && complete -p ubiquityfs && "
                                      "COMP_WORDS=(ubiquityfs mo); COMP_CWORD=1; COMP_LINE='ubiquityfs mo'; COMP_POINT=13; "
                                      "$(complete -p ubiquityfs | sed -E 's/.* -F ([^ ]+) .*/\\1/') ubiquityfs mo ubiquityfs; "
                                      "printf '%s\\n' \"${COMPREPLY[@]}\""],
                       capture_output=True, text=True, env=dict(os.environ, PATH=f"{extracted}/usr/bin:/usr/bin:/bin"))
    assert p.returncode == 0, p.stderr
    assert "complete" in p.stdout and "mount" in p.stdout.split("\n")[1:], p.stdout


def test_fish_and_zsh_completions_load(extracted):
    env = dict(os.environ, PATH=f"{extracted}/usr/bin:/usr/bin:/bin")
    if shutil.which("fish"):
        script = extracted / "usr/share/fish/vendor_completions.d/ubiquityfs.fish"
        p = subprocess.run(["fish", "-c", f"source {script}; complete -C 'ubiquityfs mo'"], capture_output=True, text=True, env=env)
        assert p.returncode == 0 and p.stdout.startswith("mount\t"), p.stdout + p.stderr
    if shutil.which("zsh"):
        folder = extracted / "usr/share/zsh/vendor-completions"
        p = subprocess.run(["zsh", "-f", "-c", f"fpath=({folder} $fpath); autoload -Uz compinit; compinit -u; "
                                               "print ${_comps[ubiquityfs]}; autoload +X _ubiquityfs && print loaded"],
                           capture_output=True, text=True, env=env)
        assert p.returncode == 0 and p.stdout.split() == ["_ubiquityfs", "loaded"], p.stdout + p.stderr
    if not shutil.which("fish") and not shutil.which("zsh"):
        pytest.skip("neither fish nor zsh is installed (bash Packaging/install-deps.sh test)")


def test_lintian_has_no_errors():
    if not shutil.which("lintian"):
        pytest.skip("lintian is not installed (bash Packaging/install-deps.sh test)")
    p = subprocess.run(["lintian", str(DEB)], capture_output=True, text=True)
    errors = [line for line in p.stdout.splitlines() if line.startswith("E:")]
    assert not errors, p.stdout


@pytest.fixture
def clean_system():
    need_root_and_fuse()
    if not shutil.which("apt-get"):
        pytest.skip("apt-get is not here")
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "ubiquityfs"], capture_output=True, text=True).stdout
    if "installed" in installed and "not-installed" not in installed:
        pytest.skip("ubiquityfs is installed on this machine: not replacing or removing it")
    for helper in ["/usr/sbin/mount.fuse.ubiquityfs", "/usr/sbin/umount.fuse.ubiquityfs"]:
        if Path(helper).exists():
            pytest.skip(f"{helper} is there (another test's copy?)")
    yield
    subprocess.run(["apt-get", "purge", "-y", "-qq", "ubiquityfs"], capture_output=True,
                   env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def test_install_mount_unmount_purge(clean_system, tmp_path):
    env_apt = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    start = time.monotonic()
    p = subprocess.run(["apt-get", "install", "-y", "-qq", str(DEB.resolve())], capture_output=True, text=True, env=env_apt,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    files = subprocess.run(["dpkg", "-L", "ubiquityfs"], capture_output=True, text=True, check=True).stdout.split()
    base = Path(tempfile_dir())
    try:
        mnt = base / "Cloud"
        mnt.mkdir()
        env = user_env(base / "home")
        env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"   # no toolchain
        p = subprocess.run(["mount", "-t", "fuse.ubiquityfs", "default", str(mnt)], capture_output=True, text=True, env=env,
                           timeout=120)
        mounted_after = time.monotonic() - start
        assert p.returncode == 0, p.stderr
        assert mount_type(mnt) == "fuse.ubiquityfs"
        print(f"apt-get install → mounted: {mounted_after:.1f} s")
        (mnt / "hello.txt").write_text("hello")
        for page in ["ubiquityfs", "ubiquityfs-mount", "mount.fuse.ubiquityfs", "ubiquityfs-service"]:
            w = subprocess.run(["man", "-w", page], capture_output=True, text=True)
            assert w.returncode == 0 and w.stdout.startswith("/usr/share/man/"), (page, w.stderr)
        if shutil.which("systemd-analyze"):
            runtime = base / "runtime"
            runtime.mkdir(mode=0o700)
            v = subprocess.run(["systemd-analyze", "verify", "--user", "/usr/lib/systemd/user/ubiquityfs.service"],
                               capture_output=True, text=True, env=dict(os.environ, XDG_RUNTIME_DIR=str(runtime)))
            assert v.returncode == 0 and v.stderr == "", v.stderr
        u = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, env=env, timeout=120)
        assert u.returncode == 0 and "every change is in the store" in u.stdout, u.stderr
        p = subprocess.run(["apt-get", "purge", "-y", "-qq", "ubiquityfs"], capture_output=True, text=True, env=env_apt,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        left = [f for f in files if os.path.lexists(f) and not os.path.isdir(f)]
        assert not left, left
        assert not [f for f in files if f.startswith("/usr/share/doc/ubiquityfs") and os.path.lexists(f)]
        # The user's data stays.
        assert (Path(env["XDG_DATA_HOME"]) / "ubiquityfs/store").is_dir()
    finally:
        cleanup_mount(base / "Cloud")
        shutil.rmtree(base, ignore_errors=True)


def tempfile_dir() -> str:
    import tempfile
    path = tempfile.mkdtemp(prefix="pkg-deb-", dir="/tmp")
    os.chmod(path, 0o755)
    return path
