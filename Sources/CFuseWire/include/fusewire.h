/*
 * CFuseWire — FUSE passthrough (Linux 6.9 and later) under libfuse 3.14,
 * which predates it.
 *
 * With passthrough the kernel reads an open file's bytes from a file the
 * daemon names (its cache file) without asking the daemon. libfuse 3.14
 * can neither ask for it at INIT nor say it in an OPEN reply, so the
 * session's device I/O goes through the three functions below
 * (`fuse_session_custom_io`), which add the two things on the way out:
 *
 * - INIT: `ubq_io_read` notes whether the kernel offers FUSE_PASSTHROUGH;
 *   the file system's `init` (on the same thread, before the reply) calls
 *   `ubq_init_accept_passthrough`; `ubq_io_writev` then sets the flag and
 *   `max_stack_depth` 1 in the reply.
 * - OPEN and CREATE: `ubq_next_open_reply` (on the thread about to reply)
 *   gives the open flags and backing id that `ubq_io_writev` writes into
 *   the reply's `fuse_open_out` (its last 16 bytes): only into the reply
 *   whose unique id is the request's (`ubq_io_read` notes it; the thread
 *   that reads a request answers it).
 *
 * The layouts are the kernel's (include/uapi/linux/fuse.h, protocol 7.40).
 */
#ifndef UBIQUITYFS_CFUSEWIRE_H
#define UBIQUITYFS_CFUSEWIRE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* FOPEN_* flags of an OPEN reply. */
#define UBQ_FOPEN_DIRECT_IO   (1u << 0)
#define UBQ_FOPEN_PASSTHROUGH (1u << 7)

/* The custom I/O of a session: plain read, writev and splice, plus the patches above. */
ssize_t ubq_io_read(int fd, void *buf, size_t len, void *userdata);
ssize_t ubq_io_writev(int fd, struct iovec *iov, int count, void *userdata);
ssize_t ubq_io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                           unsigned int flags, void *userdata);

/* During `init`: whether the kernel's INIT offers passthrough. */
int ubq_init_offers_passthrough(void);
/* During `init`: the INIT reply asks for passthrough. */
void ubq_init_accept_passthrough(void);

/* The reply to the OPEN or CREATE this thread read last carries these, if it
 * is the next reply this thread sends (matched by its unique id); the next
 * reply uses them up either way. Armed while answering any other request,
 * nothing is patched. */
void ubq_next_open_reply(uint32_t open_flags, int32_t backing_id);
void ubq_forget_open_reply(void);

/* Register `fd` with the kernel as a backing file: its id (> 0), or -errno. */
int ubq_backing_open(int devfd, int fd);
/* Unregister a backing id: 0 or -errno. */
int ubq_backing_close(int devfd, int id);

#endif
