#ifndef CMICROHTTPD_H
#define CMICROHTTPD_H

#include <stddef.h>
#include <stdint.h>
#include <microhttpd.h>
#include <sys/epoll.h>   /* the stream loop (StreamLoop.swift) */
#include <sys/eventfd.h>

/* Which connections are idle, in the order they were last active: when the open connections
 * reach `high_water` (below the connection limit), the least recently active idle ones — not in
 * a request, not waiting in a long poll — are closed (their reading side shut), so they give way
 * and a new client always gets in. Owned by the daemon it was started with: free it with cmhd_stop. */
struct cmhd_pressure;

/* MHD_start_daemon is variadic, which Swift cannot call: this shim passes the options the zone
 * server uses; with a key and a certificate (PEM, both or neither) it serves HTTPS through
 * libmicrohttpd's GnuTLS support. `host` is an IPv4 or IPv6 address or a name (its first
 * address). `threads` polling threads (0 or 1: one), each with its share of the connections
 * (libmicrohttpd's thread pool). Idle connections give way from `high_water` open connections on (*pressure).
 * Returns NULL on failure, with errno set (ENXIO: the host does not resolve). */
struct MHD_Daemon *cmhd_start(uint16_t port, const char *host,
                              MHD_AccessHandlerCallback handler, void *handler_cls,
                              MHD_RequestCompletedCallback completed, void *completed_cls,
                              unsigned int connection_limit, unsigned int per_address_limit, unsigned int high_water,
                              unsigned int connection_timeout_seconds, size_t connection_memory_limit, unsigned int threads,
                              const char *tls_key_pem, const char *tls_certificate_pem, struct cmhd_pressure **pressure);

/* Stops the daemon (MHD_stop_daemon), then frees its pressure state. */
void cmhd_stop(struct MHD_Daemon *daemon, struct cmhd_pressure *pressure);

/* How many idle connections were made to give way so far. */
unsigned long long cmhd_evicted_count(struct cmhd_pressure *pressure);

/* The most connections open at once since the last call (which starts again from now). */
unsigned int cmhd_take_peak(struct cmhd_pressure *pressure);

/* How many connections are open. */
unsigned int cmhd_open_count(struct cmhd_pressure *pressure);

/* The port the daemon listens on (after binding port 0). */
uint16_t cmhd_bound_port(struct MHD_Daemon *daemon);

/* Watches the sockets of suspended connections (a long poll waiting) for their peer going away,
 * which libmicrohttpd does not notice until it resumes them: `gone` is called, on the watch's own
 * thread, with the cookie of a watched connection whose peer closed or reset it. */
struct cmhd_watch;
struct cmhd_watch *cmhd_watch_new(void);
/* Starts the watch's thread; -1 when it cannot. */
int cmhd_watch_run(struct cmhd_watch *watch, void (*gone)(void *cls, uint64_t cookie), void *cls);
/* Watches a suspended connection (at most one `gone` per add); returns its socket, for
 * cmhd_watch_remove, or -1 when it cannot be watched. Remove it before resuming the connection. */
int cmhd_watch_add(struct cmhd_watch *watch, struct MHD_Connection *connection, uint64_t cookie);
void cmhd_watch_remove(struct cmhd_watch *watch, int fd);
/* Stops the thread, if it runs (after its current callback), and frees the watch. */
void cmhd_watch_stop(struct cmhd_watch *watch);

/* The address a connection comes from, as text (IPv4, or IPv6 without brackets), into `out`
 * (64 bytes are enough); "" when it cannot be told. */
void cmhd_client_address(struct MHD_Connection *connection, char *out, size_t size);

/* Closes an upgraded connection (a stream) through libmicrohttpd, which owns its socket:
 * MHD_upgrade_action is variadic, which Swift cannot call. -1 when libmicrohttpd refused. */
int cmhd_upgrade_close(struct MHD_UpgradeResponseHandle *urh);

/* Gives the memory malloc holds free back to the system (malloc_trim): what a crowd of
 * connections used stays in glibc's arenas after they close, otherwise. */
void cmhd_release_free_memory(void);

#endif
