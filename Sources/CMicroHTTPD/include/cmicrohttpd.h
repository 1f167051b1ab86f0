#ifndef CMICROHTTPD_H
#define CMICROHTTPD_H

#include <stddef.h>
#include <stdint.h>
#include <microhttpd.h>

/* Which connections are idle, in the order they were last active: when the open connections
 * reach `high_water` (below the connection limit), the least recently active idle ones — not in
 * a request, not waiting in a long poll — are given a one-second timeout, so they give way and
 * a new client always gets in. Owned by the daemon it was started with: free it with cmhd_stop. */
struct cmhd_pressure;

/* MHD_start_daemon is variadic, which Swift cannot call: this shim passes the options the zone
 * server uses; with a key and a certificate (PEM, both or neither) it serves HTTPS through
 * libmicrohttpd's GnuTLS support. `host` is an IPv4 or IPv6 address or a name (its first
 * address). Idle connections give way from `high_water` open connections on (*pressure).
 * Returns NULL on failure, with errno set (ENXIO: the host does not resolve). */
struct MHD_Daemon *cmhd_start(uint16_t port, const char *host,
                              MHD_AccessHandlerCallback handler, void *handler_cls,
                              MHD_RequestCompletedCallback completed, void *completed_cls,
                              unsigned int connection_limit, unsigned int per_address_limit, unsigned int high_water,
                              unsigned int connection_timeout_seconds, size_t connection_memory_limit,
                              const char *tls_key_pem, const char *tls_certificate_pem, struct cmhd_pressure **pressure);

/* Stops the daemon (MHD_stop_daemon), then frees its pressure state. */
void cmhd_stop(struct MHD_Daemon *daemon, struct cmhd_pressure *pressure);

/* How many idle connections were made to give way so far. */
unsigned long long cmhd_evicted_count(struct cmhd_pressure *pressure);

/* The port the daemon listens on (after binding port 0). */
uint16_t cmhd_bound_port(struct MHD_Daemon *daemon);

#endif
