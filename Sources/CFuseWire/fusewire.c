#define _GNU_SOURCE
#include "fusewire.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>

/* Wire layouts (include/uapi/linux/fuse.h). */
enum { FUSE_OPEN_OPCODE = 14, FUSE_INIT_OPCODE = 26, FUSE_CREATE_OPCODE = 35 };
enum { IN_HEADER_SIZE = 40, OUT_HEADER_SIZE = 16, OPEN_OUT_SIZE = 16 };
/* In fuse_in_header: opcode at 4, unique at 8. In fuse_init_in: flags at 12, flags2 at 16. */
/* In fuse_out_header: unique at 8. In fuse_init_out: flags at 12, flags2 at 32, max_stack_depth at 36. */
#define FUSE_INIT_EXT_FLAG       (1u << 30)
#define FUSE_PASSTHROUGH_FLAGS2  (1u << 5)   /* FUSE_PASSTHROUGH is bit 37 of the 64 */

struct ubq_backing_map { int32_t fd; uint32_t flags; uint64_t padding; };
#define UBQ_DEV_IOC_BACKING_OPEN  _IOW(229, 1, struct ubq_backing_map)
#define UBQ_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

/* The INIT this thread read: its unique, whether it offers passthrough, whether init took it. */
static __thread uint64_t init_unique;
static __thread int init_offers;
static __thread int init_accepted;
/* The request this thread read last (it answers what it read: fuseloop.h). */
static __thread uint64_t read_unique;
static __thread uint32_t read_opcode;
/* The open reply this thread is about to send: the unique of its OPEN or
 * CREATE (0: none). Only the reply with that unique is patched. */
static __thread uint64_t open_patch;
static __thread uint32_t open_flags_patch;
static __thread int32_t open_backing_patch;

static uint32_t get32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static void put32(char *p, uint32_t v) { memcpy(p, &v, 4); }

ssize_t ubq_io_read(int fd, void *buf, size_t len, void *userdata) {
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    if (n >= IN_HEADER_SIZE) {
        read_opcode = get32((char *)buf + 4);
        read_unique = get64((char *)buf + 8);
    }
    if (n >= IN_HEADER_SIZE + 20 && get32((char *)buf + 4) == FUSE_INIT_OPCODE) {
        const char *in = (const char *)buf + IN_HEADER_SIZE;
        init_unique = get64((char *)buf + 8);
        init_offers = (get32(in + 12) & FUSE_INIT_EXT_FLAG) && (get32(in + 16) & FUSE_PASSTHROUGH_FLAGS2);
        init_accepted = 0;
    }
    return n;
}

ssize_t ubq_io_writev(int fd, struct iovec *iov, int count, void *userdata) {
    (void)userdata;
    if (count >= 1 && iov[0].iov_len >= OUT_HEADER_SIZE) {
        uint64_t unique = get64((char *)iov[0].iov_base + 8);
        char *body = iov[count - 1].iov_base;
        size_t size = count >= 2 ? iov[count - 1].iov_len : 0;
        if (init_unique != 0 && unique == init_unique) {
            if (init_accepted && size >= 40 && (get32(body + 12) & FUSE_INIT_EXT_FLAG)) {
                put32(body + 32, get32(body + 32) | FUSE_PASSTHROUGH_FLAGS2);
                put32(body + 36, 1);   /* max_stack_depth: backing files are on a plain file system */
            }
            init_unique = 0;
        } else if (open_patch != 0 && unique != 0) {
            /* A reply (notifications have unique 0): the patch is for this
             * one, or for a reply that did not come next. Either way it is
             * used up; an error reply (no body) is left alone. */
            if (unique == open_patch && size >= OPEN_OUT_SIZE) {
                char *out = body + size - OPEN_OUT_SIZE;   /* fuse_open_out: fh, open_flags, backing_id */
                put32(out + 8, get32(out + 8) | open_flags_patch);
                memcpy(out + 12, &open_backing_patch, 4);
            }
            open_patch = 0;
        }
    }
    return writev(fd, iov, count);
}

ssize_t ubq_io_splice_send(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                           unsigned int flags, void *userdata) {
    (void)userdata;
    return splice(fdin, offin, fdout, offout, len, flags);
}

int ubq_init_offers_passthrough(void) { return init_offers; }
void ubq_init_accept_passthrough(void) { init_accepted = init_offers; }

void ubq_next_open_reply(uint32_t open_flags, int32_t backing_id) {
    /* Armed for the OPEN or CREATE this thread is answering, nothing else. */
    open_patch = (read_opcode == FUSE_OPEN_OPCODE || read_opcode == FUSE_CREATE_OPCODE) ? read_unique : 0;
    open_flags_patch = open_flags;
    open_backing_patch = backing_id;
}
void ubq_forget_open_reply(void) { open_patch = 0; }

int ubq_backing_open(int devfd, int fd) {
    struct ubq_backing_map map = { .fd = fd, .flags = 0, .padding = 0 };
    int id = ioctl(devfd, UBQ_DEV_IOC_BACKING_OPEN, &map);
    return id < 0 ? -errno : id;
}

int ubq_backing_close(int devfd, int id) {
    uint32_t value = (uint32_t)id;
    return ioctl(devfd, UBQ_DEV_IOC_BACKING_CLOSE, &value) < 0 ? -errno : 0;
}
