"""Real tools on a mounted device, each result asserted exactly.

With UBQ_TEST_PLAIN=1 these run on a plain directory (to validate the tests
themselves); the tests marked `daemon` are then skipped.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
import random
import sqlite3
import stat
import tarfile
from pathlib import Path

import pytest

from conftest import (
    current_umask,
    digest_diff,
    hardlink_groups,
    make_tree,
    mtimes,
    run,
    tree_digest,
)

# --------------------------------------------------------------------------
# vim
# --------------------------------------------------------------------------

ORIGINAL = b"first line\nsecond line\n"
EDITED = ORIGINAL + b"new line\n"


def vim_edit(path: Path, env, *settings: str) -> None:
    """Append 'new line' with vim in silent Ex mode, no vimrc, no tty.

    'backupskip' is cleared because its default skips /tmp/*, where the test
    mountpoints live, which would silently disable backups and renames.
    """
    cmd = ["vim", "-Es", "-u", "NONE", "-i", "NONE"]
    for s in settings:
        cmd += ["-c", s]
    cmd += ["-c", "set backupskip=", "-c", "normal Gonew line", "-c", "wq", str(path)]
    run(cmd, cwd=path.parent, env=env, timeout=60)


# (id, extra settings, make a hard link first, same inode afterwards, backup kept)
VIM_CASES = [
    # -u NONE means 'compatible', whose 'backupcopy' is "yes": overwrite in place.
    ("u-NONE-defaults", [], False, True, False),
    ("backupcopy=yes", ["set backupcopy=yes"], False, True, False),
    # Rename the original away, write a new file, delete the original.
    ("backupcopy=no", ["set backupcopy=no"], False, False, False),
    # Vim's own default: renames when it safely can (single link, writable dir).
    ("nocompatible-auto", ["set nocompatible backupcopy=auto"], False, False, False),
    # ... but copies (writes in place) when the file has another hard link.
    ("auto-hardlink", ["set nocompatible backupcopy=auto"], True, True, False),
    # 'backup' keeps the backup file~ (a copy; the original inode is rewritten).
    ("backup+yes", ["set backup backupcopy=yes"], False, True, True),
    # 'backup' + rename: file~ IS the original inode, file is a new one.
    ("backup+no", ["set backup backupcopy=no"], False, False, True),
]


@pytest.mark.parametrize(
    "settings,hardlink,same_inode,keep_backup",
    [c[1:] for c in VIM_CASES],
    ids=[c[0] for c in VIM_CASES],
)
def test_vim_edit(device, tool_env, settings, hardlink, same_inode, keep_backup):
    work = device.mountpoint / "vim"
    work.mkdir()
    f = work / "notes.txt"
    f.write_bytes(ORIGINAL)
    os.chmod(f, 0o640)
    if hardlink:
        os.link(f, work / "other-name.txt")
    before = os.stat(f)
    # An fd opened before the edit keeps the inode it was opened on.
    with open(f, "rb") as held:
        vim_edit(f, tool_env, *settings)
        held.seek(0)
        held_content = held.read()
        held_ino = os.fstat(held.fileno()).st_ino

    after = os.stat(f)
    assert f.read_bytes() == EDITED
    assert stat.S_IMODE(after.st_mode) == 0o640, oct(after.st_mode)
    assert held_ino == before.st_ino
    if same_inode:
        assert after.st_ino == before.st_ino, "vim should have written in place"
        assert held_content == EDITED, "in-place write not visible through an fd opened before"
    else:
        assert after.st_ino != before.st_ino, "vim should have written a new file and renamed"
        assert held_content == ORIGINAL, "the old inode's data changed under an open fd"

    expected_names = {"notes.txt"}
    if hardlink:
        expected_names.add("other-name.txt")
        assert (work / "other-name.txt").read_bytes() == EDITED
        assert os.stat(work / "other-name.txt").st_ino == after.st_ino
        assert after.st_nlink == 2
    else:
        assert after.st_nlink == 1
    if keep_backup:
        expected_names.add("notes.txt~")
        backup = work / "notes.txt~"
        assert backup.read_bytes() == ORIGINAL
        assert stat.S_IMODE(os.stat(backup).st_mode) == 0o640
        if not same_inode:
            assert os.stat(backup).st_ino == before.st_ino, "backup should be the renamed original"
    # No swap file, no leftover backup, no '4913' probe file.
    assert set(os.listdir(work)) == expected_names


def test_vim_substitute_large_file(device, tool_env):
    work = device.mountpoint / "vim"
    work.mkdir()
    f = work / "big.txt"
    lines = [f"row {i} foo {i * 7 % 13} foo\n" for i in range(20_000)]
    f.write_text("".join(lines))
    os.chmod(f, 0o600)
    run(
        ["vim", "-Es", "-u", "NONE", "-i", "NONE", "-c", "set nocompatible", "-c", "set backupskip=",
         "-c", "%s/foo/bar/g", "-c", "1d", "-c", "wq", str(f)],
        env=tool_env,
        timeout=120,
    )
    expected = "".join(l.replace("foo", "bar") for l in lines[1:])
    assert f.read_text() == expected
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    assert os.listdir(work) == ["big.txt"]


# --------------------------------------------------------------------------
# sed -i
# --------------------------------------------------------------------------


def test_sed_in_place(device, tool_env):
    work = device.mountpoint / "sed"
    work.mkdir()
    f = work / "config.ini"
    f.write_text("alpha=old\nbeta=keep\ngamma=old old\n")
    os.chmod(f, 0o604)
    ino = os.stat(f).st_ino

    run(["sed", "-i", "s/old/new/g", str(f)], env=tool_env)
    assert f.read_text() == "alpha=new\nbeta=keep\ngamma=new new\n"
    st = os.stat(f)
    assert stat.S_IMODE(st.st_mode) == 0o604
    assert st.st_ino != ino, "GNU sed -i writes a temp file and renames it over"
    assert os.listdir(work) == ["config.ini"], "sed left its temp file behind"

    run(["sed", "-i.bak", "-e", "s/keep/kept/", "-e", "$a delta=added", str(f)], env=tool_env)
    assert f.read_text() == "alpha=new\nbeta=kept\ngamma=new new\ndelta=added\n"
    assert (work / "config.ini.bak").read_text() == "alpha=new\nbeta=keep\ngamma=new new\n"
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o604
    assert stat.S_IMODE(os.stat(work / "config.ini.bak").st_mode) == 0o604
    assert sorted(os.listdir(work)) == ["config.ini", "config.ini.bak"]


# --------------------------------------------------------------------------
# git
# --------------------------------------------------------------------------


class Git:
    """git with a fixed identity and, per call, a distinct fixed date, so the
    same sequence of calls produces the same commit hashes anywhere."""

    def __init__(self, env):
        self.env = env
        self.step = 0

    def __call__(self, *args, cwd=None) -> str:
        self.step += 1
        date = f"{1_700_000_000 + self.step * 60} +0000"
        env = dict(self.env, GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
        return run(
            ["git", "-c", "user.name=Ubiquity Test", "-c", "user.email=test@example.invalid",
             "-c", "init.defaultBranch=main", "-c", "core.fsync=all", *args],
            cwd=cwd,
            env=env,
            timeout=300,
        ).stdout


def build_repos(base: Path, env) -> dict:
    """The same git workflow anywhere; returns what it observed."""
    git = Git(env)
    repo, clone, clone2 = base / "repo", base / "clone", base / "clone2"
    git("init", "-q", str(repo))
    (repo / "src").mkdir()
    (repo / "README.md").write_text("# Project\n")
    (repo / "src" / "a.txt").write_text("alpha\n" * 100)
    (repo / "run.sh").write_text("#!/bin/sh\necho hi\n")
    os.chmod(repo / "run.sh", 0o755)
    os.symlink("README.md", repo / "link")
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "first", cwd=repo)

    (repo / "README.md").write_text("# Project\n\nMore text.\n")
    (repo / "blob.bin").write_bytes(random.Random(7).randbytes(300_000))
    git("rm", "-q", "src/a.txt", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "second", cwd=repo)

    git("mv", "blob.bin", "data.bin", cwd=repo)
    git("commit", "-q", "-m", "third: rename", cwd=repo)
    assert git("status", "--porcelain", cwd=repo) == ""

    # Local clone: objects are hard-linked.  --no-local: pack protocol.
    git("clone", "-q", str(repo), str(clone))
    git("clone", "-q", "--no-local", str(repo), str(clone2))
    (clone / "from-clone.txt").write_text("made in the clone\n")
    git("add", "from-clone.txt", cwd=clone)
    git("commit", "-q", "-m", "fourth: from clone", cwd=clone)
    git("pull", "-q", "--ff-only", str(clone), "main", cwd=repo)

    git("gc", "-q", "--prune=now", cwd=repo)
    count = dict(
        line.split(": ") for line in git("count-objects", "-v", cwd=repo).splitlines()
    )
    result = {"count": count}
    for r in (repo, clone, clone2):
        git("fsck", "--full", "--strict", "--no-dangling", cwd=r)
        result[r.name] = {
            "log": git("log", "--format=%H %s", cwd=r),
            "status": git("status", "--porcelain", cwd=r),
            "tree": git("ls-tree", "-r", "HEAD", cwd=r),
        }
    return result


def test_git_workflow(device, tool_env, tmp_path):
    got = build_repos(device.mountpoint, tool_env)
    reference = tmp_path / "reference"
    reference.mkdir()
    want = build_repos(reference, tool_env)

    repo = device.mountpoint / "repo"
    subjects = [line.split(" ", 1)[1] for line in got["repo"]["log"].splitlines()]
    assert subjects == ["fourth: from clone", "third: rename", "second", "first"]
    # Identical commit hashes to the same workflow on a local disk: every
    # object, mode and symlink went through the mount unchanged.
    assert got["repo"]["log"] == want["repo"]["log"]
    assert got["clone"]["log"] == want["clone"]["log"] == got["repo"]["log"]
    assert got["clone2"]["log"] == want["clone2"]["log"]
    assert len(got["clone2"]["log"].splitlines()) == 3
    for name in ("repo", "clone", "clone2"):
        assert got[name]["status"] == "", f"{name} work tree is not clean"
        assert got[name]["tree"] == want[name]["tree"]
    # gc packed everything.
    assert got["count"]["count"] == "0", got["count"]
    assert int(got["count"]["packs"]) >= 1, got["count"]
    # Work tree contents.
    assert (repo / "README.md").read_text() == "# Project\n\nMore text.\n"
    assert os.readlink(repo / "link") == "README.md"
    assert not (repo / "src" / "a.txt").exists()
    for name in ("repo", "clone", "clone2"):
        r = device.mountpoint / name
        assert os.stat(r / "run.sh").st_mode & 0o111 == 0o111 & ~current_umask()
        assert hashlib.sha256((r / "data.bin").read_bytes()).hexdigest() == hashlib.sha256(
            random.Random(7).randbytes(300_000)
        ).hexdigest()
    assert (repo / "from-clone.txt").read_text() == "made in the clone\n"


# --------------------------------------------------------------------------
# sqlite3 (WAL)
# --------------------------------------------------------------------------


def test_sqlite_wal(device, tool_env):
    db = device.mountpoint / "db" / "test.sqlite"
    db.parent.mkdir()
    out = run(
        ["sqlite3", db, "PRAGMA journal_mode=WAL;",
         "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT NOT NULL, payload BLOB);",
         "CREATE INDEX t_name ON t(name);"],
        env=tool_env,
    ).stdout
    assert out.strip() == "wal"

    writer = sqlite3.connect(db, isolation_level=None, timeout=30)
    reader = sqlite3.connect(db, isolation_level=None, timeout=30)
    try:
        assert writer.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        reader.execute("PRAGMA mmap_size=67108864")  # main db file read through mmap too
        rng = random.Random(1)
        rows = []
        for tx in range(10):
            writer.execute("BEGIN")
            for i in range(100):
                n = tx * 100 + i + 1
                row = (n, f"name-{n:04d}", rng.randbytes(rng.randrange(0, 3000)))
                rows.append(row)
                writer.execute("INSERT INTO t(id, name, payload) VALUES (?, ?, ?)", row)
            writer.execute("COMMIT")
            if tx == 4:
                # A read snapshot in another connection...
                reader.execute("BEGIN")
                assert reader.execute("SELECT count(*) FROM t").fetchone() == (500,)
        # ...does not see later commits until it ends (WAL index in -shm).
        assert reader.execute("SELECT count(*) FROM t").fetchone() == (500,)
        reader.execute("COMMIT")
        assert reader.execute("SELECT count(*) FROM t").fetchone() == (1000,)

        # -wal and -shm exist while connections are open.
        assert (db.parent / "test.sqlite-wal").stat().st_size > 0
        assert (db.parent / "test.sqlite-shm").stat().st_size >= 32768

        # Another process sees the committed rows via the shared-memory index
        # (mmap of -shm by both processes), and writes that we then see.
        out = run(["sqlite3", db, "SELECT count(*), sum(length(payload)) FROM t;"], env=tool_env)
        assert out.stdout.strip() == f"1000|{sum(len(r[2]) for r in rows)}"
        run(["sqlite3", db, "INSERT INTO t(id, name, payload) VALUES (1001, 'from-cli', x'00ff');"],
            env=tool_env)
        assert reader.execute("SELECT name, payload FROM t WHERE id = 1001").fetchone() == (
            "from-cli", b"\x00\xff")

        assert writer.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        got = writer.execute("SELECT id, name, payload FROM t WHERE id <= 1000 ORDER BY id").fetchall()
        assert got == rows
        assert writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        assert (db.parent / "test.sqlite-wal").stat().st_size == 0
    finally:
        reader.close()
        writer.close()

    # Last connection closed: WAL checkpointed and both side files removed.
    assert sorted(os.listdir(db.parent)) == ["test.sqlite"]
    out = run(["sqlite3", db, "PRAGMA integrity_check; SELECT count(*) FROM t; PRAGMA journal_mode;"],
              env=tool_env)
    assert out.stdout.split() == ["ok", "1001", "wal"]


# --------------------------------------------------------------------------
# rsync, cp -a, tar
# --------------------------------------------------------------------------


def assert_same_tree(src: Path, dst: Path, *, times=True, links=True):
    d = digest_diff(tree_digest(src), tree_digest(dst))
    assert not d, f"{dst} differs from {src}:\n{d}"
    if times:
        d = digest_diff(mtimes(src), mtimes(dst))
        assert not d, f"mtimes differ:\n{d}"
    if links:
        assert hardlink_groups(dst) == hardlink_groups(src)


def test_rsync_tree(device, tool_env, tmp_path):
    src = make_tree(tmp_path / "src", seed=11, hardlinks=False)
    dst = device.mountpoint / "dst"
    run(["rsync", "-a", f"{src}/", f"{dst}/"], env=tool_env)
    assert_same_tree(src, dst)
    assert os.stat(dst).st_mtime_ns == os.stat(src).st_mtime_ns
    assert stat.S_IMODE(os.stat(dst).st_mode) == stat.S_IMODE(os.stat(src).st_mode)
    check = ["rsync", "-a", "--checksum", "--dry-run", "--itemize-changes", f"{src}/", f"{dst}/"]
    assert run(check, env=tool_env).stdout == ""

    # Update: changed content (same size), new file, removed file, mode change.
    f = src / "a" / "b" / "c" / "d"
    victim = next(p for p in sorted((src / "a").iterdir()) if p.is_file() and not p.is_symlink())
    data = bytearray(victim.read_bytes() or b"x")
    data[len(data) // 2] ^= 0xFF
    os.chmod(victim, 0o644)
    victim.write_bytes(bytes(data))
    (f / "new-file").write_bytes(b"new\n" * 1000)
    os.chmod(src / "with space", 0o700)
    gone = next(p for p in sorted((src / "ünïcødé").iterdir()) if p.is_file() and not p.is_symlink())
    gone.unlink()
    # rsync compares directory mtimes to the second only; give the touched
    # directories distinct old times so the update must set them exactly.
    for n, rel in enumerate(["a", "a/b/c/d", "ünïcødé", "with space"]):
        t = 1_500_000_000_000_000_000 + n * 1_000_000_123
        os.utime(src / rel, ns=(t, t))
    run(["rsync", "-a", "--delete", f"{src}/", f"{dst}/"], env=tool_env)
    assert_same_tree(src, dst)
    assert run(check + ["--delete"], env=tool_env).stdout == ""


def test_cp_a_tree(device, tool_env, tmp_path):
    src = make_tree(tmp_path / "src", seed=22, hardlinks=True)
    dst = device.mountpoint / "copy"
    run(["cp", "-a", src, dst], env=tool_env)
    assert_same_tree(src, dst)
    assert len(hardlink_groups(dst)) == 2
    for group in hardlink_groups(dst):
        sts = [os.lstat(dst / rel) for rel in group]
        assert {s.st_ino for s in sts} == {sts[0].st_ino}
        assert all(s.st_nlink == len(group) for s in sts)
    assert os.stat(dst).st_mtime_ns == os.stat(src).st_mtime_ns


TAR_TIME = 1_650_000_000

# (name, type, mode, size or link target).  Natural `tar c` order: each
# directory followed by its contents, so GNU tar can restore directory mtimes
# when it leaves a directory; hard links refer to an earlier member.
TAR_MEMBERS = [
    ("top", "dir", 0o755, None),
    ("top/file0", "file", 0o644, 0),
    ("top/file1", "file", 0o600, 1),
    ("top/link-rel", "symlink", 0o777, "sub/file3"),
    ("top/link-dir", "symlink", 0o777, "sub/deep"),
    ("top/ro", "dir", 0o555, None),
    ("top/ro/file2", "file", 0o444, 511),
    ("top/ro/file7", "file", 0o444, 1_000_003),
    ("top/sub", "dir", 0o750, None),
    ("top/sub/file3", "file", 0o640, 512),
    ("top/sub/file4", "file", 0o755, 513),
    ("top/sub/dangling", "symlink", 0o777, "no/such/target"),
    ("top/sub/deep", "dir", 0o700, None),
    ("top/sub/deep/file5", "file", 0o755, 10_000),
    ("top/sub/deep/file6", "file", 0o600, 65_536),
    ("top/sub/deep/hard-b", "hardlink", 0o755, "top/sub/deep/file5"),
    ("top/sub/hard-a", "hardlink", 0o755, "top/sub/deep/file5"),
    ("top/sub/empty", "dir", 0o711, None),
    ("top/zz-last", "file", 0o664, 4096),
]


def make_archive(path: Path) -> tuple[dict, dict]:
    """Write TAR_MEMBERS to a tar; returns (expected tree_digest, expected mtimes)."""
    rng = random.Random(33)
    expected, times = {}, {}
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for n, (name, kind, mode, arg) in enumerate(TAR_MEMBERS):
            ti = tarfile.TarInfo(name)
            ti.mode, ti.mtime = mode, TAR_TIME + n
            ti.uid, ti.gid = os.getuid(), os.getgid()
            ti.uname = ti.gname = ""
            data = None
            if kind == "dir":
                ti.type = tarfile.DIRTYPE
                expected[name] = ("dir", mode, None, None)
            elif kind == "file":
                data = rng.randbytes(arg)
                ti.size = len(data)
                expected[name] = ("file", mode, len(data), hashlib.sha256(data).hexdigest())
            elif kind == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, arg
                expected[name] = ("symlink", 0o777, len(arg), arg)
            else:
                ti.type, ti.linkname = tarfile.LNKTYPE, arg
                expected[name] = expected[arg]
            tar.addfile(ti, io.BytesIO(data) if data is not None else None)
            # GNU tar does not touch a hard link's times: it shares the target's.
            times[name] = times[arg] if kind == "hardlink" else ti.mtime * 10**9
    return expected, times


def test_tar_extract(device, tool_env, tmp_path):
    archive = tmp_path / "archive.tar"
    expected, expected_times = make_archive(archive)
    reference = tmp_path / "reference"
    reference.mkdir()
    run(["tar", "-xpf", archive, "-C", reference], env=tool_env)
    dst = device.mountpoint / "untar"
    dst.mkdir()
    run(["tar", "-xpf", archive, "-C", dst], env=tool_env)

    d = digest_diff(expected, tree_digest(dst))
    assert not d, d
    d = digest_diff(expected_times, mtimes(dst))
    assert not d, f"mtimes:\n{d}"
    assert_same_tree(reference, dst)
    assert hardlink_groups(dst) == [("top/sub/deep/file5", "top/sub/deep/hard-b", "top/sub/hard-a")]
    assert os.stat(dst / "top/sub/hard-a").st_nlink == 3


# --------------------------------------------------------------------------
# mmap
# --------------------------------------------------------------------------

PAGE = mmap.PAGESIZE


def pattern(n: int, seed: int = 5) -> bytes:
    return random.Random(seed).randbytes(n)


def mmap_exercise(path: Path) -> bytes:
    """Read mapping, MAP_SHARED writes + msync, extension; returns the final content."""
    size = 3 * PAGE + 100
    original = pattern(size)
    path.write_bytes(original)

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert len(m) == size
        assert m[:] == original
        assert m[PAGE - 3 : PAGE + 3] == original[PAGE - 3 : PAGE + 3]

    expected = bytearray(original)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED) as m:
        for off, data in [(0, b"HEAD"), (PAGE - 2, b"<across>"), (2 * PAGE + 7, b"\x00" * 50),
                          (size - 5, b"TAIL!")]:
            m[off : off + len(data)] = data
            expected[off : off + len(data)] = data
        m.flush()
        # A plain write() through another fd shows up in the live mapping.
        with open(path, "r+b") as g:
            os.pwrite(g.fileno(), b"PWRITE", PAGE * 3)
        expected[PAGE * 3 : PAGE * 3 + 6] = b"PWRITE"
        assert m[PAGE * 3 : PAGE * 3 + 6] == b"PWRITE"
    assert os.stat(path).st_size == size

    with open(path, "rb") as f:  # new fd
        assert f.read() == bytes(expected)

    # Grow with ftruncate, then write into the new pages through a new mapping.
    new_size = 6 * PAGE
    with open(path, "r+b") as f:
        os.ftruncate(f.fileno(), new_size)
        expected += b"\x00" * (new_size - size)
        with mmap.mmap(f.fileno(), new_size, flags=mmap.MAP_SHARED) as m:
            assert m[:] == bytes(expected)
            tail = pattern(PAGE + 123, seed=6)
            m[4 * PAGE : 4 * PAGE + len(tail)] = tail
            expected[4 * PAGE : 4 * PAGE + len(tail)] = tail
            m.flush()
        os.fsync(f.fileno())
    with open(path, "rb") as f:
        assert f.read() == bytes(expected)
    return bytes(expected)


def test_mmap(device):
    path = device.mountpoint / "mapped.bin"
    mmap_exercise(path)


@pytest.mark.daemon
def test_mmap_survives_remount(device):
    path = device.mountpoint / "mapped.bin"
    expected = mmap_exercise(path)
    device.remount()
    assert path.read_bytes() == expected
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[:] == expected


# --------------------------------------------------------------------------
# Tool results after remount and on a second device
# --------------------------------------------------------------------------


@pytest.mark.daemon
def test_tool_results_survive_remount_and_second_device(make_device, tool_env, tmp_path):
    a = make_device("a")
    mp = a.mountpoint
    build_repos(mp, tool_env)
    out = run(["sqlite3", mp / "app.db", "PRAGMA journal_mode=WAL; CREATE TABLE t(x);"
               "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i<5000) "
               "INSERT INTO t SELECT i FROM c;"], env=tool_env)
    assert out.stdout.strip() == "wal"
    (mp / "vim.txt").write_bytes(ORIGINAL)
    vim_edit(mp / "vim.txt", tool_env, "set backupcopy=no")
    make_archive(tmp_path / "a.tar")
    (mp / "untar").mkdir()
    run(["tar", "-xpf", tmp_path / "a.tar", "-C", mp / "untar"], env=tool_env)
    before = tree_digest(mp)
    head = run(["git", "-C", mp / "repo", "rev-parse", "HEAD"], env=tool_env).stdout

    def check(dev):
        d = digest_diff(before, tree_digest(dev.mountpoint))
        assert not d, f"{dev.name}:\n{d}"
        r = dev.mountpoint / "repo"
        assert run(["git", "-C", r, "rev-parse", "HEAD"], env=tool_env).stdout == head
        run(["git", "-C", r, "fsck", "--full", "--strict"], env=tool_env)
        out = run(["sqlite3", dev.mountpoint / "app.db",
                   "PRAGMA integrity_check; SELECT count(*), sum(x) FROM t;"], env=tool_env)
        assert out.stdout.split() == ["ok", "5000|12502500"]

    a.remount()
    check(a)
    a.unmount()
    b = make_device("b")
    check(b)
