/*
 * CLinux — Linux system calls Swift cannot reach: glibc exports them only
 * under _GNU_SOURCE (which Swift's Glibc module is not built with), or only
 * through the variadic syscall(2), which Swift cannot call.
 */
#ifndef UBIQUITYFS_CLINUX_H
#define UBIQUITYFS_CLINUX_H

/* syncfs(2): flush the filesystem holding fd. */
int ubq_syncfs(int fd);
/* statfs(2)'s f_type of the filesystem holding path (its magic number), or -1. */
long ubq_filesystem_type(const char *path);
/* gettid(2): the calling thread's id. */
int ubq_gettid(void);
/* pthread_setname_np(3) for the calling thread: its name in /proc/PID/task/TID/comm
 * (at most 15 bytes), which threads it starts inherit. */
int ubq_name_this_thread(const char *name);
/* cachestat(2) (Linux 6.5): how many pages of fd's bytes offset..<offset+length
 * the page cache holds, without reading anything (-1 with ENOSYS before 6.5). */
long ubq_cached_pages(int fd, unsigned long offset, unsigned long length);
/* O_DIRECT for open(2) (its value differs between architectures). */
int ubq_o_direct(void);
/* ioprio_set(2) for a thread: best-effort class, lowest level (7). */
int ubq_ioprio_lowest(int tid);
/* mallopt(M_ARENA_MAX, arenas) and mallopt(M_MMAP_THRESHOLD, mmap_threshold),
 * and malloc_trim(0): malloc.h is not part of Swift's Glibc module. */
int ubq_tune_malloc(int arenas, int mmap_threshold);
int ubq_malloc_trim(void);

/* SIGTERM, SIGINT and SIGHUP each write their number (one byte) to fd; a
 * thread reading fd does the shutdown (a handler may do nothing else).
 * SIGPIPE is ignored. */
int ubq_forward_shutdown_signals(int fd);

/* strerrorname_np(3): "EAGAIN" for EAGAIN (NULL for an unknown number). */
const char *ubq_errno_name(int code);

#endif
