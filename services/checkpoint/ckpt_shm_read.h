/*
 * ckpt_shm_read: read files, the shared-memory side of Read (issue 11). A
 * client on the service's host creates a file "read-<tag>" in the shm
 * directory (ckpt_shm.h), writes a header proving it made it, and names
 * it with the header's nonce in its ReadRequest; the service writes the
 * wanted boxes into it (from CKPT_SHM_READ_DATA on) instead of sending
 * their bytes over gRPC. The client removes the file.
 *
 * A name from the network is checked before it touches the file system
 * (a bare "read-" + 1..32 hex digits: never a segment, a free-* file or
 * the instance file), opened relative to the directory with O_NOFOLLOW, and
 * accepted only as a regular file of the service's user with one link, of
 * CKPT_SHM_READ_DATA..max bytes, whose header is CKPT_SHM_READ_MAGIC then
 * the request's nonce (compared in constant time): a client can make the
 * service write only into a file it created and read back (an off-host
 * client cannot know a nonce; another client's file has another one). The
 * service writes with pwrite at checked offsets, so a file cut short
 * under it grows back instead of faulting a mapping.
 */
#ifndef STK_CKPT_SHM_READ_H
#define STK_CKPT_SHM_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "ckpt_shm.h"

#define CKPT_SHM_READ_MAGIC     "STKREAD1"
#define CKPT_SHM_READ_MAGIC_LEN 8
#define CKPT_SHM_READ_NONCE_LEN 32
#define CKPT_SHM_READ_DATA      4096 /* Where the wanted bytes start. */
#define CKPT_SHM_READ_TAG_MAX   32

/* 0 if name is a read-file name ("read-" + 1..32 lowercase hex digits);
 * else STK_EINVAL with a detail. */
int ckpt_shm_read_check_name(const char *name);

/* Opens read file name for writing after every check above; *ret_fd is
 * the caller's to close, *ret_size the file's size. Errors: STK_EINVAL
 * (with a detail: a bad name or nonce length, missing, a symlink, not a
 * regular file, wrong owner, linked twice, too small or too large, the
 * header does not hold the nonce). */
int ckpt_shm_read_open(struct ckpt_shm *m, const char *name, const uint8_t *nonce, size_t nonce_len,
                       int *ret_fd, uint64_t *ret_size);

/* Writes the n buffers of iov (changed: consumed) one after the other at
 * off of fd, all of them (short writes retried). 0 or STK_EIO with a
 * detail. */
int ckpt_shm_read_putv(int fd, struct iovec *iov, int n, uint64_t off);

#endif
