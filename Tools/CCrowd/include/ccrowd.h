#ifndef CCROWD_H
#define CCROWD_H

#include <stdint.h>

/* The few socket calls the crowd of bench and test clients (Tools/Crowd) needs that Swift's
 * Glibc module does not offer (epoll) or makes awkward (socket addresses, SO_LINGER). */

/* A non-blocking TCP connection to 127.0.0.1:port from `source` (an IPv4 address of this
 * machine, any of 127.0.0.0/8): the descriptor, or -errno. The connection completes when the
 * socket becomes writable. */
int ccrowd_connect(const char *source, uint16_t port);

/* An epoll instance (close-on-exec), or -errno. */
int ccrowd_epoll(void);

/* Watches `fd` for reading (want & 1) and/or writing (want & 2) with `data` as its cookie:
 * op 0 adds, 1 modifies, 2 removes. Returns 0 or -errno. */
int ccrowd_watch(int epoll, int fd, int op, uint32_t want, uint64_t data);

/* Waits up to `timeout_ms` for ready descriptors: their cookies and what they are ready for
 * (1 readable, 2 writable, 4 closed or failed). Returns how many, or -errno. */
int ccrowd_wait(int epoll, uint64_t *data, uint32_t *ready, int max, int timeout_ms);

/* Closes with a reset (SO_LINGER 0): a client that vanishes without a goodbye. */
void ccrowd_reset(int fd);

#endif
