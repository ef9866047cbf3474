/*
 * The session loop: leader and followers, so that the thread that answered
 * one request reads the next.
 *
 * libfuse's multi-threaded loop has every idle worker wait in read() on
 * /dev/fuse. The kernel wakes the waiter that has waited longest, so a
 * program making one request at a time (`rm -r`, `git checkout`, a build
 * step) is answered by each worker in turn: every request wakes a thread
 * that is cold and often on the other CPU, and the reply then wakes the
 * program on the worker's CPU, which preempts the worker before it can go
 * back to read().
 *
 * Here one worker at a time reads (the *leader*). A request answered from
 * memory or the page cache (lookups, attributes, namespace changes, opens,
 * reads) is handled by the leader, which then reads again. The reading is
 * handed to an idle worker (or a new one, up to `max_threads`) first:
 * - before a request that may wait long: FSYNC, FSYNCDIR, FALLOCATE,
 *   COPY_FILE_RANGE (and the lock, ioctl and poll requests);
 * - before RELEASE, which the program does not wait for: its next request
 *   is read and answered meanwhile;
 * - before WRITE: a random writer was slower with writes answered by the
 *   leader (DESIGN.md, "The FUSE loop", says why; bench/RESULTS.md has the figures);
 * - when a handler is about to wait (`ubq_loop_may_block`: a read of a
 *   placeholder waiting for its download, a notification that may wait for
 *   a page another READ holds),
 * so the mount keeps answering while it waits.
 *
 * While a program's requests come in a burst (the last one arrived within
 * 100 µs of the leader's wait for it), the leader polls /dev/fuse for up to
 * 100 µs, yielding the CPU between looks, before it sleeps in read(): on a
 * VM, waking a thread whose CPU has gone idle costs tens of microseconds,
 * more than the request (DESIGN.md, "Polling for the next request").
 * Requests further apart are waited for in read() alone, so an idle mount
 * costs no CPU. UBIQUITYFS_FUSE_POLL_US sets the window; 0 turns it off.
 */
#ifndef UBIQUITYFS_FUSELOOP_H
#define UBIQUITYFS_FUSELOOP_H

struct fuse_session;

/* Serve `se` until it exits, with at most `max_threads` workers. The loop
 * is stopped by `fuse_session_exit` and then `wake_signal` sent to the
 * calling thread (a handler installed without SA_RESTART), or by the
 * kernel ending the session. Returns 0 or the -errno that ended it. */
int ubq_session_loop(struct fuse_session *se, unsigned max_threads, int wake_signal);

/* The calling thread is about to wait for something slow: if it is the
 * worker that reads the session's requests, another worker takes over the
 * reading. Any other thread: nothing. */
void ubq_loop_may_block(void);

#endif
