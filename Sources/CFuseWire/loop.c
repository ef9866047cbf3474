/* The leader/followers session loop: see fuseloop.h. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 314
#include "fuseloop.h"
#include <fuse_lowlevel.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Opcodes (include/uapi/linux/fuse.h) whose reading is handed over before they are handled (fuseloop.h says why). */
enum {
    OP_WRITE = 16, OP_RELEASE = 18, OP_FSYNC = 20, OP_FSYNCDIR = 30, OP_GETLK = 31, OP_SETLK = 32, OP_SETLKW = 33,
    OP_IOCTL = 39, OP_POLL = 40, OP_FALLOCATE = 43, OP_COPY_FILE_RANGE = 47,
};

/* How long the leader polls for the next request, in a burst, before it
 * sleeps in read() (fuseloop.h); UBIQUITYFS_FUSE_POLL_US changes it, 0 turns
 * the polling off. */
enum { POLL_NS_DEFAULT = 100 * 1000 };

struct loop {
    struct fuse_session *se;
    long long poll_ns;
    int burst;                  /* the last request came within poll_ns of the wait for it */
    pthread_mutex_t lock;
    pthread_cond_t followers;   /* idle workers wait here for the reading */
    pthread_cond_t gone;        /* a worker ended */
    sem_t finish;               /* the session ended (posted by a worker) */
    unsigned max_threads, threads, idle;
    int reading;                /* a worker reads, or holds the reading */
    int has_reader;             /* `reader` is in (or about to enter) read() */
    pthread_t reader;
    int stopping;
    int error;
};

struct worker {
    struct loop *loop;
    int leads;                  /* this worker holds the reading */
};

static __thread struct worker *this_worker;

static void *work(void *arg);

/* Start a worker (the caller holds the lock). */
static void start_worker(struct loop *loop) {
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, work, loop) == 0) loop->threads++;
    pthread_attr_destroy(&attr);
}

/* Give the reading to an idle worker, or a new one (the caller holds the lock). */
static void hand_over(struct worker *w) {
    struct loop *loop = w->loop;
    if (!w->leads) return;
    w->leads = 0;
    loop->reading = 0;
    if (loop->idle > 0) pthread_cond_signal(&loop->followers);
    else if (loop->threads < loop->max_threads) start_worker(loop);
}

void ubq_loop_may_block(void) {
    struct worker *w = this_worker;
    if (w == NULL || !w->leads) return;
    pthread_mutex_lock(&w->loop->lock);
    hand_over(w);
    pthread_mutex_unlock(&w->loop->lock);
}

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* Return once a request is there, the session ended or the clock reached
 * `until` (monotonic_ns), giving the CPU to anything else that wants it
 * between looks. */
static void poll_for_request(struct fuse_session *se, long long until) {
    struct pollfd device = { .fd = fuse_session_fd(se), .events = POLLIN };
    while (poll(&device, 1, 0) == 0 && !fuse_session_exited(se) && monotonic_ns() < until) sched_yield();
}

static int hand_over_first(const struct fuse_buf *buf) {
    uint32_t opcode;
    if (buf->flags & FUSE_BUF_IS_FD || buf->size < 8) return 1;
    memcpy(&opcode, (const char *)buf->mem + 4, 4);   /* fuse_in_header.opcode */
    switch (opcode) {
    case OP_WRITE: case OP_RELEASE: case OP_FSYNC: case OP_FSYNCDIR: case OP_GETLK: case OP_SETLK: case OP_SETLKW:
    case OP_IOCTL: case OP_POLL: case OP_FALLOCATE: case OP_COPY_FILE_RANGE:
        return 1;
    default:
        return 0;
    }
}

static void *work(void *arg) {
    struct loop *loop = arg;
    struct worker w = { .loop = loop, .leads = 0 };
    struct fuse_buf buf;
    memset(&buf, 0, sizeof buf);
    this_worker = &w;
    pthread_mutex_lock(&loop->lock);
    while (!loop->stopping) {
        if (loop->reading) {
            loop->idle++;
            pthread_cond_wait(&loop->followers, &loop->lock);
            loop->idle--;
            continue;
        }
        loop->reading = 1;
        w.leads = 1;
        loop->reader = pthread_self();
        loop->has_reader = 1;
        int poll_first = loop->burst;
        pthread_mutex_unlock(&loop->lock);
        long long wait_began = monotonic_ns();
        if (poll_first) poll_for_request(loop->se, wait_began + loop->poll_ns);
        int res = fuse_session_exited(loop->se) ? 0 : fuse_session_receive_buf(loop->se, &buf);
        long long waited = monotonic_ns() - wait_began;
        pthread_mutex_lock(&loop->lock);
        loop->has_reader = 0;
        loop->burst = waited <= loop->poll_ns;
        if (res == -EINTR || res == -EAGAIN) {
            w.leads = 0;
            loop->reading = 0;
            continue;
        }
        if (res <= 0) {
            /* Unmounted (0) or a read error: the session ends. */
            if (res < 0 && loop->error == 0) loop->error = res;
            fuse_session_exit(loop->se);
            loop->stopping = 1;
            w.leads = 0;
            loop->reading = 0;
            pthread_cond_broadcast(&loop->followers);
            sem_post(&loop->finish);
            break;
        }
        if (hand_over_first(&buf)) hand_over(&w);
        pthread_mutex_unlock(&loop->lock);
        fuse_session_process_buf(loop->se, &buf);
        pthread_mutex_lock(&loop->lock);
        if (w.leads) {
            /* Answered without handing over: read again (at the top). */
            w.leads = 0;
            loop->reading = 0;
        }
    }
    loop->threads--;
    pthread_cond_broadcast(&loop->gone);
    pthread_mutex_unlock(&loop->lock);
    this_worker = NULL;
    free(buf.mem);
    return NULL;
}

int ubq_session_loop(struct fuse_session *se, unsigned max_threads, int wake_signal) {
    struct loop loop;
    memset(&loop, 0, sizeof loop);
    loop.se = se;
    const char *poll_us = getenv("UBIQUITYFS_FUSE_POLL_US");
    loop.poll_ns = poll_us != NULL ? atoll(poll_us) * 1000 : POLL_NS_DEFAULT;
    loop.max_threads = max_threads > 0 ? max_threads : 1;
    pthread_mutex_init(&loop.lock, NULL);
    pthread_cond_init(&loop.followers, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&loop.gone, &monotonic);
    pthread_condattr_destroy(&monotonic);
    sem_init(&loop.finish, 0, 0);

    pthread_mutex_lock(&loop.lock);
    start_worker(&loop);
    int started = loop.threads > 0;
    pthread_mutex_unlock(&loop.lock);
    if (!started) {
        loop.error = -EAGAIN;
    } else {
        /* sem_wait returns on the wake signal: then look at the session again. */
        while (!fuse_session_exited(se)) sem_wait(&loop.finish);
        pthread_mutex_lock(&loop.lock);
        loop.stopping = 1;
        pthread_cond_broadcast(&loop.followers);
        /* Workers answering a request finish it; the reader is woken from
         * read() by the signal (again, until it is gone: it may have been
         * about to enter read() when the last one came). */
        while (loop.threads > 0) {
            if (loop.has_reader) pthread_kill(loop.reader, wake_signal);
            struct timespec until;
            clock_gettime(CLOCK_MONOTONIC, &until);
            until.tv_nsec += 10 * 1000 * 1000;
            if (until.tv_nsec >= 1000000000L) { until.tv_sec += 1; until.tv_nsec -= 1000000000L; }
            pthread_cond_timedwait(&loop.gone, &loop.lock, &until);
        }
        pthread_mutex_unlock(&loop.lock);
    }
    pthread_mutex_destroy(&loop.lock);
    pthread_cond_destroy(&loop.followers);
    pthread_cond_destroy(&loop.gone);
    sem_destroy(&loop.finish);
    fuse_session_reset(se);
    return loop.error;
}
