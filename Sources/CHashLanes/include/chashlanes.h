/*
 * CHashLanes — SHA-256 of two messages at once, in one thread, with the x86
 * SHA extensions.
 *
 * One SHA-256 stream waits on the latency of each sha256rnds2; two
 * independent streams, interleaved, fill those waits. Swift cannot emit these
 * instructions, so this is C (the only C in the daemon that is not a system
 * call wrapper). bench/RESULTS.md ("Chunked content and streaming
 * downloads") has the measurements.
 */
#ifndef UBIQUITYFS_CHASHLANES_H
#define UBIQUITYFS_CHASHLANES_H

#include <stddef.h>
#include <stdint.h>

/* 1 if this CPU has the SHA extensions (and SSSE3, SSE4.1) this code needs. */
int ubq_sha256_lanes_available(void);

/* The SHA-256 digests of first[0..<first_count] and second[0..<second_count]
 * (any lengths, 0 included). 0 on success; -1 (nothing written) where
 * ubq_sha256_lanes_available() is 0. */
int ubq_sha256_two(const void *first, size_t first_count, uint8_t first_digest[32],
                   const void *second, size_t second_count, uint8_t second_digest[32]);

#endif
