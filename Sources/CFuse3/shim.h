/*
 * CFuse3 — the libfuse3 low-level API as Swift sees it.
 *
 * Only UbiquityFUSE imports this module. Each inline wrapper below exists
 * because Swift cannot call the original directly; the comment says why.
 */
#ifndef UBIQUITYFS_CFUSE3_SHIM_H
#define UBIQUITYFS_CFUSE3_SHIM_H

#define FUSE_USE_VERSION 314
#include <stddef.h>
#include <fuse_lowlevel.h>
#include <signal.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>

/* A signal whose handler does nothing, installed without SA_RESTART, so
 * that sending it to the thread running a session's loop interrupts its
 * wait: how one session of several is stopped (Swift cannot fill the
 * sigaction union). */
static void ubq_wake_noop(int sig) { (void)sig; }
static inline int ubq_install_wake_signal(int sig) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = ubq_wake_noop;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

/* FUSE_ARGS_INIT is a macro. */
static inline struct fuse_args ubq_args_init(int argc, char **argv) {
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    return args;
}

/* fuse_file_info packs its flags into C bitfields, which Swift cannot set. */
static inline void ubq_fi_set_keep_cache(struct fuse_file_info *fi, int v) { fi->keep_cache = v ? 1 : 0; }
static inline void ubq_fi_set_cache_readdir(struct fuse_file_info *fi, int v) { fi->cache_readdir = v ? 1 : 0; }
static inline void ubq_fi_set_noflush(struct fuse_file_info *fi, int v) { fi->noflush = v ? 1 : 0; }
static inline int ubq_fi_flock_release(const struct fuse_file_info *fi) { return fi->flock_release; }

/* Reads up to this size are copied (pread + one write to /dev/fuse): for a
 * few pages that is cheaper than splicing through a pipe (three syscalls). */
#define UBQ_COPIED_READ_MAX (32 * 1024)

/* Reply to a read with a range of a file: small ranges copied, larger ones
 * spliced (a one-element fuse_bufvec pointing at the range, no copy here).
 * Spliced without SPLICE_F_MOVE: moving would have the kernel try to steal
 * each page from the cache file's page cache, which on ext4 means freeing
 * the page's journal buffers first (and failing for a page still dirty, as a
 * download's are): in a profile of a placeholder read that was a quarter of
 * the CPU, against the plain copy into the FUSE page it replaces. */
static inline int ubq_reply_fd_range(fuse_req_t req, int fd, off_t off, size_t size) {
    if (size <= UBQ_COPIED_READ_MAX) {
        char bytes[UBQ_COPIED_READ_MAX];
        size_t done = 0;
        while (done < size) {
            ssize_t n = pread(fd, bytes + done, size - done, off + (off_t)done);
            if (n < 0) {
                if (errno == EINTR) continue;
                return fuse_reply_err(req, errno);
            }
            if (n == 0) break;   /* end of file: a short read */
            done += (size_t)n;
        }
        return fuse_reply_buf(req, bytes, done);
    }
    struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
    buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    buf.buf[0].fd = fd;
    buf.buf[0].pos = off;
    return fuse_reply_data(req, &buf, 0);
}

/* st_atim / st_mtim / st_ctim are fine in Swift, but their setters on Linux glibc
 * go through a union; keep a helper so the adapter stays readable. */
static inline void ubq_stat_set_times(struct stat *st,
                                      long long as, long an, long long ms, long mn, long long cs, long cn) {
    st->st_atim.tv_sec = as; st->st_atim.tv_nsec = an;
    st->st_mtim.tv_sec = ms; st->st_mtim.tv_nsec = mn;
    st->st_ctim.tv_sec = cs; st->st_ctim.tv_nsec = cn;
}

#endif
