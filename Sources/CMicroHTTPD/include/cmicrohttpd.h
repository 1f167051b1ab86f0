#ifndef CMICROHTTPD_H
#define CMICROHTTPD_H

#include <stddef.h>
#include <stdint.h>
#include <microhttpd.h>

/* MHD_start_daemon is variadic, which Swift cannot call: this shim passes the options the zone
 * server uses; with a key and a certificate (PEM, both or neither) it serves HTTPS through
 * libmicrohttpd's GnuTLS support. `host` is an IPv4 or IPv6 address or a name (its first
 * address). Returns NULL on failure, with errno set (ENXIO: the host does not resolve). */
struct MHD_Daemon *cmhd_start(uint16_t port, const char *host,
                              MHD_AccessHandlerCallback handler, void *handler_cls,
                              MHD_RequestCompletedCallback completed, void *completed_cls,
                              unsigned int connection_limit, unsigned int per_address_limit,
                              unsigned int connection_timeout_seconds, size_t connection_memory_limit,
                              const char *tls_key_pem, const char *tls_certificate_pem);

/* The port the daemon listens on (after binding port 0). */
uint16_t cmhd_bound_port(struct MHD_Daemon *daemon);

#endif
