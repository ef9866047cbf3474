#define _GNU_SOURCE
#include "clinux.h"
#include <unistd.h>
#include <pthread.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <malloc.h>
#include <sys/vfs.h>

int ubq_syncfs(int fd) { return (int)syscall(SYS_syncfs, fd); }
long ubq_filesystem_type(const char *path) {
    struct statfs st;
    return statfs(path, &st) == 0 ? (long)st.f_type : -1;
}
int ubq_gettid(void) { return (int)syscall(SYS_gettid); }
long ubq_cached_pages(int fd, unsigned long offset, unsigned long length) {
    struct { unsigned long long off, len; } range = { offset, length };
    struct { unsigned long long cache, dirty, writeback, evicted, recently_evicted; } stat;
    /* 451: cachestat's number in the generic table every architecture shares. */
    return syscall(451, fd, &range, &stat, 0) == 0 ? (long)stat.cache : -1;
}
int ubq_o_direct(void) { return O_DIRECT; }
int ubq_name_this_thread(const char *name) { return pthread_setname_np(pthread_self(), name); }
int ubq_ioprio_lowest(int tid) { return (int)syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, tid, (2 << 13) | 7); }
int ubq_tune_malloc(int arenas, int mmap_threshold) {
    return mallopt(M_ARENA_MAX, arenas) == 1 && mallopt(M_MMAP_THRESHOLD, mmap_threshold) == 1 ? 0 : -1;
}
int ubq_malloc_trim(void) { return malloc_trim(0); }

#include <signal.h>
#include <string.h>

static int shutdown_pipe = -1;

static void forward_signal(int sig) {
    unsigned char byte = (unsigned char)sig;
    if (shutdown_pipe >= 0) { ssize_t n = write(shutdown_pipe, &byte, 1); (void)n; }
}

int ubq_forward_shutdown_signals(int fd) {
    shutdown_pipe = fd;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &sa, NULL) != 0 || sigaction(SIGINT, &sa, NULL) != 0 || sigaction(SIGHUP, &sa, NULL) != 0) return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

const char *ubq_errno_name(int code) { return strerrorname_np(code); }
