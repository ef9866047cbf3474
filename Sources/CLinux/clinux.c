#include "clinux.h"
#include <unistd.h>
#include <sys/syscall.h>
#include <malloc.h>

int ubq_syncfs(int fd) { return (int)syscall(SYS_syncfs, fd); }
int ubq_gettid(void) { return (int)syscall(SYS_gettid); }
int ubq_ioprio_lowest(int tid) { return (int)syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, tid, (2 << 13) | 7); }
int ubq_limit_malloc_arenas(int n) { return mallopt(M_ARENA_MAX, n); }
int ubq_malloc_trim(void) { return malloc_trim(0); }
