#ifndef RAW_LIMITS_H
#define RAW_LIMITS_H

#include <stddef.h>
#include <stdint.h>

/* The raw limits the bench measures our server and client against, in a few lines of C.
 *
 * raw_http_start: a libmicrohttpd daemon on 127.0.0.1 with the zone server's thread model and
 * options (one internal epoll thread, suspend/resume allowed, same connection limits) that
 * reads any request whole and answers 200 with a fixed small JSON body. Returns its port, or 0.
 *
 * raw_echo_start: a TCP server on 127.0.0.1 that echoes what each connection sends (a thread
 * per connection). Returns its port, or 0. */
uint16_t raw_http_start(unsigned int connection_limit, unsigned int connection_timeout_seconds, size_t connection_memory_limit);
uint16_t raw_echo_start(void);

/* raw_curl_transfer: moves `count` bodies with libcurl, `parallel` requests in flight (1–16),
 * each on its own keep-alive connection: with `upload`, PUT bodies[i] (sizes[i] bytes) to
 * base_url + paths[i]; without, GET base_url + paths[i] into a buffer of `capacity` bytes per
 * connection. Each request carries headers[i] (a whole "Name: value" line). Returns the bytes
 * sent (PUT) or received (GET), or -1 when a request fails or does not answer 2xx. */
long long raw_curl_transfer(const char *base_url, int count, const char *const *paths, const char *const *headers,
                            const unsigned char *const *bodies, const size_t *sizes, size_t capacity, int upload, int parallel);

#endif
