#include "clinux.h"
#include <unistd.h>
#include <sys/syscall.h>

int ubq_syncfs(int fd) { return (int)syscall(SYS_syncfs, fd); }
int ubq_gettid(void) { return (int)syscall(SYS_gettid); }
int ubq_ioprio_lowest(int tid) { return (int)syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, tid, (2 << 13) | 7); }
