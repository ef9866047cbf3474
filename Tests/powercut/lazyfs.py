#!/usr/bin/python3
"""lazyfs.py: a passthrough FUSE filesystem that can lose what was never synced.

A small power-cut simulator for durability tests, in the manner of LazyFS
(Jepsen's tool; none of its code is used here). It mounts BACKING at
MOUNTPOINT and passes everything through, except that data not yet made
durable can be thrown away on command, as a power cut would:

* Data (what `write` and `truncate` do to a regular file's bytes and size,
  `O_TRUNC` included) is *volatile* until the file is fsynced or fdatasynced
  (through any descriptor of it, `O_SYNC`/`O_DSYNC` writes included: the
  kernel sends an fsync after each). A **cut** gives every file back the
  content it had at its last fsync; a file not fsynced since lazyfs started
  gets what it held when it was first changed, and one created since and never
  fsynced gets nothing: it becomes empty.
* Metadata passes through at once and is never lost: create, mknod, mkdir,
  symlink, link, rename, unlink, rmdir, chmod, chown, utimes, xattrs. (LazyFS
  does the same: it caches data only.) So after a cut a file renamed into
  place keeps its new name, and a file created and never fsynced exists,
  empty. Syncing a folder (`fsync` of a directory) is accepted and changes
  nothing, as its entries are already durable.

How: the backing file always holds the current content. On the first data
change to a file since its last fsync, a *shadow* is made for its inode (so
renames and hard links do not matter): the durable size and, as later
changes reach them, the durable bytes of each 64 KiB block about to be
overwritten or cut off (an undo log kept in an anonymous temporary file;
appends past the durable size cost nothing). fsync drops the shadow. A cut
writes each shadow's saved blocks back, truncates the file to its durable
size, drops the shadows, and tells the kernel to forget its cached pages and
attributes of those files. A shadow holds a descriptor of its inode, so an
inode number is never reused while it has one; a file whose last name is
gone by the cut is simply not restored (its unlink was durable).

Control, while mounted (the control socket lives outside the mount):

    lazyfs.py serve BACKING MOUNTPOINT [--control SOCKET]   # foreground; prints "lazyfs: ready" once mounted
    lazyfs.py cut SOCKET      # the power cut: unsynced data is lost; prints what was reverted
                              # ("cut KEEP" on the socket keeps the unsynced data of files whose
                              # path has KEEP in it: the disk wrote those back, not the others)
    lazyfs.py sync SOCKET     # everything is made durable (as sync(1) would)
    lazyfs.py status SOCKET   # how many files have unsynced data, and how much was saved to undo it

The socket takes one line ("cut", "cut KEEP", "sync", "status" or "stop") and answers one
line of JSON once the command is done (`request()` below is the client, usable
without pyfuse3). Signals do the same asynchronously: SIGUSR1 cuts, SIGUSR2
syncs, SIGTERM/SIGINT unmount and exit. The default SOCKET is
MOUNTPOINT + ".lazyfs-control". `fusermount3 -u MOUNTPOINT` also ends it.

What it is not: it does not reorder or tear writes within a file (each
unsynced file goes back whole to its synced content), does not lose metadata,
and does not sync the backing filesystem (the simulated disk is the backing
directory as it is).

As a filesystem it is a plain passthrough (Tests/posix/posix_suite.py passes
on it, run as root). Locks (fcntl, flock) are the kernel's own (no lock
handlers: the kernel keeps them locally, enough for processes on this one
machine); mmap works (files are opened in cached mode, not direct_io; an
msync(MS_SYNC) is an fsync); fallocate is not offered (callers get EOPNOTSUPP; glibc's
posix_fallocate then writes the blocks, which are data like any other); the
kernel checks permissions (default_permissions) and, run as root, lets every
user in (allow_other), new entries belonging to their creator. Requests are
served one at a time. BACKING must be one filesystem. Needs pyfuse3 (Debian:
python3-pyfuse3, with trio) and /dev/fuse.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import stat
import sys

BLOCK = 64 * 1024


def default_control(mountpoint: str) -> str:
    return os.path.abspath(mountpoint).rstrip("/") + ".lazyfs-control"


def request(control: str, command: str, timeout: float = 120) -> dict:
    """Send one command to a running lazyfs over its control socket; its answer (a dict).
    Raises RuntimeError if lazyfs reports an error."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(control)
        s.sendall(command.encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    answer = json.loads(data.decode() or "{}")
    if not answer.get("ok"):
        raise RuntimeError(f"lazyfs {command}: {answer.get('error', 'no answer')}")
    return answer


# ---------------------------------------------------------------------------
# The filesystem (imports pyfuse3 and trio only when serving)
# ---------------------------------------------------------------------------


def serve(backing: str, mountpoint: str, control: str, debug: bool = False) -> int:
    import ctypes
    import resource
    import tempfile

    import pyfuse3
    import trio
    from pyfuse3 import FUSEError

    libc = ctypes.CDLL(None, use_errno=True)
    AT_EMPTY_PATH = 0x1000

    def _check(rc):
        if rc != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def renameat2(olddir, old, newdir, new, flags):
        _check(libc.renameat2(olddir, old, newdir, new, ctypes.c_uint(flags)))

    def fchown_empty(fd, uid, gid):
        _check(libc.fchownat(fd, b"", uid, gid, AT_EMPTY_PATH))

    class Timespec(ctypes.Structure):
        _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]

    def utimens_empty(fd, atime_ns, mtime_ns):
        times = (Timespec * 2)(Timespec(*divmod(atime_ns, 10**9)), Timespec(*divmod(mtime_ns, 10**9)))
        _check(libc.utimensat(fd, b"", times, AT_EMPTY_PATH))

    def fuse_errors(fn):
        """Turn OSError into FUSEError (the only exception pyfuse3 handlers may raise)."""
        async def wrapper(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except FUSEError:
                raise
            except OSError as e:
                raise FUSEError(e.errno or errno.EIO)
            except Exception:  # a bug here must not kill the mount: log it, answer EIO
                import traceback
                traceback.print_exc()
                raise FUSEError(errno.EIO)
        wrapper.__name__ = fn.__name__
        return wrapper

    def proc(fd: int) -> str:
        return f"/proc/self/fd/{fd}"

    class Node:
        __slots__ = ("fd", "lookups", "key", "is_link")

        def __init__(self, fd, key, is_link):
            self.fd, self.key, self.is_link, self.lookups = fd, key, is_link, 0

    class Shadow:
        """What a file held at its last fsync: its durable size and the durable
        bytes of each block changed since (in `undo`, at the same offsets)."""
        __slots__ = ("fd", "size", "saved", "undo")

        def __init__(self, fd, size):
            self.fd, self.size, self.saved, self.undo = fd, size, set(), None

    class LazyFS(pyfuse3.Operations):
        supports_dot_lookup = True
        enable_writeback_cache = False

        def __init__(self, backing):
            super().__init__()
            self.backing = backing
            root_fd = os.open(backing, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            st = os.fstat(root_fd)
            self.root_key = (st.st_dev, st.st_ino)
            root = Node(root_fd, self.root_key, False)
            root.lookups = 1 << 62
            self.nodes: dict[int, Node] = {pyfuse3.ROOT_INODE: root}
            self.files: dict[int, tuple[int, int]] = {}    # fh -> (backing fd, inode)
            self.dirs: dict[int, list] = {}                # fh -> [inode, listing or None]
            self.next_dir = 1
            self.shadows: dict[tuple[int, int], Shadow] = {}
            self.cuts = 0
            self.reverted_total = 0

        # -- inodes ------------------------------------------------------------

        def ino_of(self, st) -> int:
            if (st.st_dev, st.st_ino) == self.root_key:
                return pyfuse3.ROOT_INODE
            if st.st_ino == pyfuse3.ROOT_INODE or st.st_dev != self.root_key[0]:
                raise FUSEError(errno.EXDEV)   # another filesystem inside BACKING: not supported
            return st.st_ino

        def node(self, ino) -> Node:
            try:
                return self.nodes[ino]
            except KeyError:
                raise FUSEError(errno.ESTALE)

        def attrs(self, st, ino=None):
            a = pyfuse3.EntryAttributes()
            a.st_ino = ino if ino is not None else self.ino_of(st)
            a.generation = 0
            a.entry_timeout = 1.0
            a.attr_timeout = 1.0
            a.st_mode, a.st_nlink, a.st_uid, a.st_gid = st.st_mode, st.st_nlink, st.st_uid, st.st_gid
            a.st_rdev, a.st_size, a.st_blksize, a.st_blocks = st.st_rdev, st.st_size, st.st_blksize, st.st_blocks
            a.st_atime_ns, a.st_mtime_ns, a.st_ctime_ns = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
            return a

        def remember(self, parent: Node, name: bytes, fd: int | None = None):
            """Count one kernel lookup of `name` in `parent`; its attributes."""
            if name == b"." or (name == b".." and parent.key == self.root_key):
                st = os.fstat(parent.fd)
                ino = self.ino_of(st)
                self.nodes[ino].lookups += 1
                return self.attrs(st, ino)
            if fd is None:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent.fd)
            try:
                st = os.fstat(fd)
                ino = self.ino_of(st)
            except BaseException:
                os.close(fd)
                raise
            known = self.nodes.get(ino)
            if known is not None and known.key == (st.st_dev, st.st_ino):
                os.close(fd)
                known.lookups += 1
            else:
                if known is not None:          # cannot happen while we hold its descriptor
                    os.close(known.fd)
                node = Node(fd, (st.st_dev, st.st_ino), stat.S_ISLNK(st.st_mode))
                node.lookups = 1
                self.nodes[ino] = node
            return self.attrs(st, ino)

        async def forget(self, inode_list):
            for ino, n in inode_list:
                node = self.nodes.get(ino)
                if node is None or ino == pyfuse3.ROOT_INODE:
                    continue
                node.lookups -= n
                if node.lookups <= 0:
                    os.close(node.fd)
                    del self.nodes[ino]

        # -- volatile data ------------------------------------------------------

        def shadow(self, key, fd_of_inode: int, *, fresh=False) -> Shadow:
            sh = self.shadows.get(key)
            if sh is None:
                own = os.open(proc(fd_of_inode), os.O_PATH | os.O_CLOEXEC)
                sh = Shadow(own, 0 if fresh else os.fstat(own).st_size)
                self.shadows[key] = sh
            return sh

        def preserve(self, key, fd_of_inode: int, start: int, end: int):
            """Before bytes [start, end) of this file change: keep their durable content."""
            sh = self.shadow(key, fd_of_inode)
            end = min(end, sh.size)
            if start >= end:
                return
            blocks = [b for b in range(start // BLOCK, (end - 1) // BLOCK + 1) if b not in sh.saved]
            if not blocks:
                return
            if sh.undo is None:
                sh.undo = tempfile.TemporaryFile(prefix="lazyfs-undo-")
            rfd = os.open(proc(sh.fd), os.O_RDONLY | os.O_CLOEXEC)
            try:
                for b in blocks:
                    off = b * BLOCK
                    data = os.pread(rfd, min(BLOCK, sh.size - off), off)
                    os.pwrite(sh.undo.fileno(), data, off)
                    sh.saved.add(b)
            finally:
                os.close(rfd)

        def make_durable(self, key):
            sh = self.shadows.pop(key, None)
            if sh is not None:
                self.drop(sh)

        @staticmethod
        def drop(sh: Shadow):
            os.close(sh.fd)
            if sh.undo is not None:
                sh.undo.close()

        def sync_all(self) -> dict:
            n = len(self.shadows)
            for sh in self.shadows.values():
                self.drop(sh)
            self.shadows.clear()
            return {"made_durable": n}

        def cut(self, keep: str | None = None) -> dict:
            """The power cut: every file goes back to its durable content, except
            files whose path (relative to BACKING) has `keep` in it, whose unsynced
            writes the disk is taken to have written back before the cut (a disk
            writes back in any order: the data of one file, not the records of another)."""
            reverted, gone, kept, inodes, files = 0, 0, 0, [], []
            for key, sh in self.shadows.items():
                try:
                    if os.fstat(sh.fd).st_nlink == 0:
                        gone += 1
                        continue
                    size = os.fstat(sh.fd).st_size
                    if not sh.saved and size == sh.size:
                        continue            # nothing to undo (created, or extended then cut back)
                    if keep and keep in self.path_of(sh.fd):
                        kept += 1
                        continue
                    files.append({"path": self.path_of(sh.fd), "size": size, "durable_size": sh.size})
                    self.restore(sh)
                    reverted += 1
                    ino = pyfuse3.ROOT_INODE if key == self.root_key else key[1]
                    if ino in self.nodes:
                        inodes.append(ino)
                finally:
                    self.drop(sh)
            self.shadows.clear()
            self.cuts += 1
            self.reverted_total += reverted
            return {"reverted": reverted, "unlinked": gone, "kept": kept, "inodes": inodes,
                    "files": sorted(files, key=lambda f: f["path"])}

        def path_of(self, fd) -> str:
            """Where an inode is now, relative to BACKING (for reports)."""
            try:
                return os.path.relpath(os.readlink(proc(fd)), self.backing)
            except OSError:
                return "?"

        def restore(self, sh: Shadow):
            path = proc(sh.fd)
            try:
                wfd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                chmodded = None
            except PermissionError:                   # a read-only file, not root
                chmodded = stat.S_IMODE(os.fstat(sh.fd).st_mode)
                os.chmod(path, chmodded | stat.S_IWUSR)
                wfd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                for b in sorted(sh.saved):
                    off = b * BLOCK
                    data = os.pread(sh.undo.fileno(), min(BLOCK, sh.size - off), off)
                    os.pwrite(wfd, data, off)
                os.ftruncate(wfd, sh.size)
            finally:
                os.close(wfd)
                if chmodded is not None:
                    os.chmod(path, chmodded)

        @staticmethod
        def changed(sh: Shadow) -> bool:
            return bool(sh.saved) or os.fstat(sh.fd).st_size != sh.size

        def status(self) -> dict:
            return {
                "unsynced_files": sum(1 for s in self.shadows.values() if self.changed(s)),
                "unsynced": sorted(self.path_of(s.fd) for s in self.shadows.values() if self.changed(s)),
                "saved_blocks": sum(len(s.saved) for s in self.shadows.values()),
                "cuts": self.cuts,
                "reverted_total": self.reverted_total,
                "known_inodes": len(self.nodes),
                "open_files": len(self.files),
            }

        def truncating(self, key, fd_of_inode, new_size):
            self.preserve(key, fd_of_inode, new_size, 1 << 62)

        # -- entries -------------------------------------------------------------

        @fuse_errors
        def lookup(self, parent_inode, name, ctx):
            return self.remember(self.node(parent_inode), name)

        @fuse_errors
        def getattr(self, inode, ctx):
            return self.attrs(os.fstat(self.node(inode).fd), inode)

        @fuse_errors
        def setattr(self, inode, attr, fields, fh, ctx):
            node = self.node(inode)
            path = proc(node.fd)
            if fields.update_size:
                self.truncating(node.key, node.fd, attr.st_size)
                if fh is not None and fh in self.files:
                    os.ftruncate(self.files[fh][0], attr.st_size)
                else:
                    os.truncate(path, attr.st_size)
            if fields.update_mode:
                if node.is_link:
                    raise FUSEError(errno.EOPNOTSUPP)
                os.chmod(path, stat.S_IMODE(attr.st_mode))
            if fields.update_uid or fields.update_gid:
                uid = attr.st_uid if fields.update_uid else -1
                gid = attr.st_gid if fields.update_gid else -1
                fchown_empty(node.fd, uid, gid)
            if fields.update_atime or fields.update_mtime:
                st = os.fstat(node.fd)
                atime = attr.st_atime_ns if fields.update_atime else st.st_atime_ns
                mtime = attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns
                utimens_empty(node.fd, atime, mtime)
            return self.attrs(os.fstat(node.fd), inode)

        @fuse_errors
        def readlink(self, inode, ctx):
            return os.readlink(b"", dir_fd=self.node(inode).fd)

        def _owned(self, parent: Node, name: bytes, ctx):
            """A new entry belongs to its creator (we create as root), its group
            to a set-group-ID folder's group (which the backing filesystem gave it)."""
            if os.geteuid() == 0 and (ctx.uid, ctx.gid) != (0, 0):
                gid = -1 if os.fstat(parent.fd).st_mode & stat.S_ISGID else ctx.gid
                os.chown(name, ctx.uid, gid, dir_fd=parent.fd, follow_symlinks=False)

        @fuse_errors
        def mknod(self, parent_inode, name, mode, rdev, ctx):
            parent = self.node(parent_inode)
            os.mknod(name, mode, rdev, dir_fd=parent.fd)
            self._owned(parent, name, ctx)
            attrs = self.remember(parent, name)
            if stat.S_ISREG(mode):
                node = self.nodes[attrs.st_ino]
                self.shadow(node.key, node.fd, fresh=True)
            return attrs

        @fuse_errors
        def mkdir(self, parent_inode, name, mode, ctx):
            parent = self.node(parent_inode)
            os.mkdir(name, mode, dir_fd=parent.fd)
            self._owned(parent, name, ctx)
            return self.remember(parent, name)

        @fuse_errors
        def symlink(self, parent_inode, name, target, ctx):
            parent = self.node(parent_inode)
            os.symlink(target, name, dir_fd=parent.fd)
            self._owned(parent, name, ctx)
            return self.remember(parent, name)

        @fuse_errors
        def link(self, inode, new_parent_inode, new_name, ctx):
            node, parent = self.node(inode), self.node(new_parent_inode)
            os.link(proc(node.fd), new_name, dst_dir_fd=parent.fd, follow_symlinks=True)
            return self.remember(parent, new_name)

        def _victim_gone(self, parent: Node, name: bytes):
            """Before unlinking or replacing `name`: drop its shadow if this removes its last link."""
            try:
                st = os.stat(name, dir_fd=parent.fd, follow_symlinks=False)
            except FileNotFoundError:
                return None
            if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                return (st.st_dev, st.st_ino)
            return None

        @fuse_errors
        def unlink(self, parent_inode, name, ctx):
            parent = self.node(parent_inode)
            victim = self._victim_gone(parent, name)
            os.unlink(name, dir_fd=parent.fd)
            if victim is not None:
                self.make_durable(victim)   # nothing left to restore

        @fuse_errors
        def rmdir(self, parent_inode, name, ctx):
            os.rmdir(name, dir_fd=self.node(parent_inode).fd)

        @fuse_errors
        def rename(self, parent_inode_old, name_old, parent_inode_new, name_new, flags, ctx):
            old, new = self.node(parent_inode_old), self.node(parent_inode_new)
            victim = None if flags & pyfuse3.RENAME_EXCHANGE else self._victim_gone(new, name_new)
            if flags:
                renameat2(old.fd, name_old, new.fd, name_new, flags)
            else:
                os.rename(name_old, name_new, src_dir_fd=old.fd, dst_dir_fd=new.fd)
            if victim is not None:
                try:
                    same = os.stat(name_new, dir_fd=new.fd, follow_symlinks=False)
                    if (same.st_dev, same.st_ino) == victim:
                        return           # renamed onto a hard link of itself: nothing removed
                except FileNotFoundError:
                    pass
                self.make_durable(victim)

        # -- files ---------------------------------------------------------------

        @staticmethod
        def backing_flags(flags):
            # The kernel already did what these mean (appending, sync writes send fsync).
            return (flags & os.O_ACCMODE) | os.O_CLOEXEC

        def open_file(self, inode, flags):
            node = self.node(inode)
            fd = os.open(proc(node.fd), self.backing_flags(flags))
            if flags & os.O_TRUNC:     # even with O_RDONLY, as Linux does
                try:
                    self.truncating(node.key, node.fd, 0)
                    os.truncate(proc(fd), 0)
                except BaseException:
                    os.close(fd)
                    raise
            self.files[fd] = (fd, inode)
            # Cached mode (not direct_io): mmap works; no keep_cache: an open drops stale pages.
            return pyfuse3.FileInfo(fh=fd, direct_io=False, keep_cache=False)

        @fuse_errors
        def open(self, inode, flags, ctx):
            return self.open_file(inode, flags)

        @fuse_errors
        def create(self, parent_inode, name, mode, flags, ctx):
            parent = self.node(parent_inode)
            try:
                fd = os.open(name, self.backing_flags(flags) | os.O_CREAT | os.O_EXCL, mode, dir_fd=parent.fd)
            except FileExistsError:
                if flags & os.O_EXCL:
                    raise
                attrs = self.remember(parent, name)   # made meanwhile: open it as it is
                return self.open_file(attrs.st_ino, flags), attrs
            try:
                self._owned(parent, name, ctx)
                attrs = self.remember(parent, name)
            except BaseException:
                os.close(fd)
                raise
            node = self.nodes[attrs.st_ino]
            self.shadow(node.key, node.fd, fresh=True)    # new: its durable content is none
            self.files[fd] = (fd, attrs.st_ino)
            return pyfuse3.FileInfo(fh=fd, direct_io=False, keep_cache=False), attrs

        @fuse_errors
        def read(self, fh, off, size):
            return os.pread(self.files[fh][0], size, off)

        @fuse_errors
        def write(self, fh, off, buf):
            fd, ino = self.files[fh]
            node = self.node(ino)
            self.preserve(node.key, node.fd, off, off + len(buf))
            view, done = memoryview(buf), 0
            while done < len(view):
                done += os.pwrite(fd, view[done:], off + done)
            return done

        @fuse_errors
        def flush(self, fh):
            pass

        @fuse_errors
        def release(self, fh):
            fd, _ = self.files.pop(fh)
            os.close(fd)

        @fuse_errors
        def fsync(self, fh, datasync):
            _, ino = self.files[fh]
            self.make_durable(self.node(ino).key)

        # -- folders -------------------------------------------------------------

        @fuse_errors
        def opendir(self, inode, ctx):
            self.node(inode)
            fh = self.next_dir
            self.next_dir += 1
            self.dirs[fh] = [inode, None]
            return fh

        @fuse_errors
        def readdir(self, fh, start_id, token):
            entry = self.dirs[fh]
            node = self.node(entry[0])
            if start_id == 0 or entry[1] is None:
                fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=node.fd)
                try:
                    entry[1] = [b".", b".."] + sorted(os.fsencode(n) for n in os.listdir(fd))
                finally:
                    os.close(fd)
            names = entry[1]
            for i in range(start_id, len(names)):
                name = names[i]
                if i < 2:    # "." and "..": listed, never counted as lookups
                    st = os.stat(name if entry[0] != pyfuse3.ROOT_INODE else ".", dir_fd=node.fd)
                    attrs = self.attrs(st, None if i == 0 or entry[0] != pyfuse3.ROOT_INODE else pyfuse3.ROOT_INODE)
                    if not pyfuse3.readdir_reply(token, name, attrs, i + 1):
                        break
                    continue
                try:
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=node.fd)
                except FileNotFoundError:
                    continue
                try:
                    st = os.fstat(fd)
                    attrs = self.attrs(st)
                except BaseException:
                    os.close(fd)
                    raise
                if not pyfuse3.readdir_reply(token, name, attrs, i + 1):
                    os.close(fd)
                    break
                self.remember(node, name, fd)

        @fuse_errors
        def releasedir(self, fh):
            self.dirs.pop(fh, None)

        @fuse_errors
        def fsyncdir(self, fh, datasync):
            pass       # entries are durable as soon as they are made

        @fuse_errors
        def statfs(self, ctx):
            sv = os.statvfs(proc(self.nodes[pyfuse3.ROOT_INODE].fd))
            out = pyfuse3.StatvfsData()
            for f in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                      "f_favail", "f_namemax"):
                setattr(out, f, getattr(sv, f))
            return out

        # -- extended attributes ---------------------------------------------------

        def _xpath(self, inode):
            node = self.node(inode)
            if node.is_link:
                raise FUSEError(errno.EPERM)
            return proc(node.fd)

        @fuse_errors
        def setxattr(self, inode, name, value, ctx):
            os.setxattr(self._xpath(inode), name, value)

        @fuse_errors
        def getxattr(self, inode, name, ctx):
            if self.node(inode).is_link:
                raise FUSEError(pyfuse3.ENOATTR)
            return os.getxattr(self._xpath(inode), name)   # ENODATA is pyfuse3.ENOATTR

        @fuse_errors
        def listxattr(self, inode, ctx):
            if self.node(inode).is_link:
                return []
            return [os.fsencode(n) for n in os.listxattr(self._xpath(inode))]

        @fuse_errors
        def removexattr(self, inode, name, ctx):
            os.removexattr(self._xpath(inode), name)

        def close_all(self):
            for fd, _ in self.files.values():
                os.close(fd)
            self.files.clear()
            for sh in self.shadows.values():
                self.drop(sh)
            self.shadows.clear()
            for node in self.nodes.values():
                os.close(node.fd)
            self.nodes.clear()

    # -- running ----------------------------------------------------------------

    os.umask(0)   # the kernel already applied the caller's umask to the modes it sends
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    fs = LazyFS(backing)
    options = set(pyfuse3.default_options)
    options |= {"fsname=lazyfs", "subtype=lazyfs"}
    if os.geteuid() == 0:
        options.add("allow_other")   # other users too (a daemon dropping to its user); the kernel checks permissions
    if debug:
        options.add("debug")
    if os.path.exists(control):
        os.unlink(control)
    pyfuse3.init(fs, mountpoint, options)

    async def forget_cached(inodes):
        """After a cut: the kernel must not serve the old pages or sizes."""
        def run():
            for ino in inodes:
                try:
                    pyfuse3.invalidate_inode(ino, attr_only=False)
                except OSError:
                    pass
        await trio.to_thread.run_sync(run)

    async def command(line: str) -> dict:
        if line == "cut" or line.startswith("cut "):
            result = fs.cut(keep=line[4:] or None)
            await forget_cached(result["inodes"])
            return {"ok": True, **result}
        if line == "sync":
            return {"ok": True, **fs.sync_all()}
        if line == "status":
            return {"ok": True, **fs.status()}
        if line == "stop":
            pyfuse3.terminate()
            return {"ok": True}
        return {"ok": False, "error": f"unknown command {line!r} (cut [KEEP], sync, status, stop)"}

    async def client(conn):
        with conn:
            data = b""
            while not data.endswith(b"\n") and len(data) < 4096:
                chunk = await conn.recv(4096)
                if not chunk:
                    break
                data += chunk
            try:
                answer = await command(data.decode(errors="replace").strip())
            except Exception as e:  # noqa: BLE001 - reported to the client
                answer = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            await conn.send((json.dumps(answer) + "\n").encode())

    async def control_server(listener, nursery):
        while True:
            conn, _ = await listener.accept()
            nursery.start_soon(client, conn)

    async def signals(nursery):
        import signal
        with trio.open_signal_receiver(signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                if signum == signal.SIGUSR1:
                    await command("cut")
                elif signum == signal.SIGUSR2:
                    await command("sync")
                else:
                    pyfuse3.terminate()

    async def main():
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(control)
        listener.listen(16)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(control_server, listener, nursery)
            nursery.start_soon(signals, nursery)
            print(f"lazyfs: ready pid {os.getpid()} control {control}", flush=True)
            try:
                await pyfuse3.main()
            finally:
                nursery.cancel_scope.cancel()
        listener.close()

    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=True)
        fs.close_all()
        try:
            os.unlink(control)
        except FileNotFoundError:
            pass
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lazyfs.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", help="mount BACKING at MOUNTPOINT (foreground)")
    p.add_argument("backing")
    p.add_argument("mountpoint")
    p.add_argument("--control", help="control socket (default MOUNTPOINT.lazyfs-control)")
    p.add_argument("--debug", action="store_true", help="libfuse's request log on stderr")
    for name in ("cut", "sync", "status", "stop"):
        q = sub.add_parser(name, help=f"send '{name}' to a running lazyfs")
        q.add_argument("control", help="its control socket")
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        return serve(os.path.abspath(args.backing), os.path.abspath(args.mountpoint),
                     args.control or default_control(args.mountpoint), args.debug)
    try:
        print(json.dumps(request(args.control, args.cmd)))
    except (OSError, RuntimeError) as e:
        print(f"lazyfs.py {args.cmd}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
