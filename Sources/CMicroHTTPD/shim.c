#include "cmicrohttpd.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <ctype.h>
#include <malloc.h>
#include <errno.h>
#include <stdio.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

/* Percent-decodes in place like libmicrohttpd's own unescaping, except that a decoded NUL or
 * other control byte becomes DEL (0x7F): a "%00" can no longer cut a path short as a C string,
 * and the server refuses any path or argument holding a control character. */
static size_t unescape(void *cls, struct MHD_Connection *connection, char *text) {
    (void)cls; (void)connection;
    char *out = text;
    for (const char *in = text; *in != '\0'; in++) {
        unsigned int value;
        if (in[0] == '%' && isxdigit((unsigned char)in[1]) && isxdigit((unsigned char)in[2]) && sscanf(in + 1, "%2x", &value) == 1) {
            *out++ = (value < 0x20 || value == 0x7F) ? 0x7F : (char)value;
            in += 2;
        } else {
            *out++ = *in;
        }
    }
    *out = '\0';
    return (size_t)(out - text);
}

/* One open connection, in the pressure list (least recently active first). */
struct cmhd_tracked {
    struct MHD_Connection *connection;
    struct cmhd_tracked *previous, *next;
    int in_request;   /* between the first call of a request and its completion (long polls too) */
    int giving_way;   /* given the short timeout, not closed yet */
};

struct cmhd_pressure {
    pthread_mutex_t lock;
    struct cmhd_tracked *head, *tail;
    unsigned int open, giving_way, high_water;
    unsigned int peak;   /* the most open since cmhd_take_peak */
    unsigned long long evicted;
    MHD_AccessHandlerCallback handler;
    void *handler_cls;
    MHD_RequestCompletedCallback completed;
    void *completed_cls;
};

static void unlink_tracked(struct cmhd_pressure *p, struct cmhd_tracked *t) {
    if (t->previous) t->previous->next = t->next; else p->head = t->next;
    if (t->next) t->next->previous = t->previous; else p->tail = t->previous;
    t->previous = t->next = NULL;
}

static void append_tracked(struct cmhd_pressure *p, struct cmhd_tracked *t) {
    t->previous = p->tail;
    t->next = NULL;
    if (p->tail) p->tail->next = t; else p->head = t;
    p->tail = t;
}

static struct cmhd_tracked *tracked_of(struct MHD_Connection *connection) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info == NULL ? NULL : (struct cmhd_tracked *)info->socket_context;
}

/* Under the lock: the least recently active idle connections give way until the open ones not
 * already giving way are below the high-water mark. The newest connection never does. */
static void relieve(struct cmhd_pressure *p) {
    for (struct cmhd_tracked *t = p->head; t != NULL && t != p->tail && p->open - p->giving_way >= p->high_water; t = t->next) {
        if (t->in_request || t->giving_way) continue;
        /* Its reading side shut: the thread that owns it (with a pool, perhaps not this one)
         * reads the end at once and closes it. */
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(t->connection, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (info != NULL) shutdown(info->connect_fd, SHUT_RD);
        t->giving_way = 1;
        p->giving_way++;
        p->evicted++;
    }
}

static void notify_connection(void *cls, struct MHD_Connection *connection, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    struct cmhd_pressure *p = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        struct cmhd_tracked *t = calloc(1, sizeof(*t));
        *socket_context = t;
        if (t == NULL) return;
        t->connection = connection;
        pthread_mutex_lock(&p->lock);
        append_tracked(p, t);
        p->open++;
        if (p->open > p->peak) p->peak = p->open;
        relieve(p);
        pthread_mutex_unlock(&p->lock);
    } else {
        struct cmhd_tracked *t = *socket_context;
        if (t == NULL) return;
        pthread_mutex_lock(&p->lock);
        unlink_tracked(p, t);
        p->open--;
        if (t->giving_way) p->giving_way--;
        pthread_mutex_unlock(&p->lock);
        free(t);
        *socket_context = NULL;
    }
}

static enum MHD_Result tracked_access(void *cls, struct MHD_Connection *connection, const char *url, const char *method, const char *version,
                                      const char *upload_data, size_t *upload_data_size, void **request_context) {
    struct cmhd_pressure *p = cls;
    if (*request_context == NULL) {
        struct cmhd_tracked *t = tracked_of(connection);
        if (t != NULL) {
            pthread_mutex_lock(&p->lock);
            t->in_request = 1;
            pthread_mutex_unlock(&p->lock);
        }
    }
    return p->handler(p->handler_cls, connection, url, method, version, upload_data, upload_data_size, request_context);
}

static void tracked_completed(void *cls, struct MHD_Connection *connection, void **request_context, enum MHD_RequestTerminationCode code) {
    struct cmhd_pressure *p = cls;
    struct cmhd_tracked *t = tracked_of(connection);
    if (t != NULL) {
        pthread_mutex_lock(&p->lock);
        t->in_request = 0;
        unlink_tracked(p, t);
        append_tracked(p, t);
        pthread_mutex_unlock(&p->lock);
    }
    p->completed(p->completed_cls, connection, request_context, code);
}

static void cmhd_stop_unstarted(struct cmhd_pressure *pressure) {
    pthread_mutex_destroy(&pressure->lock);
    free(pressure);
}

void cmhd_stop(struct MHD_Daemon *daemon, struct cmhd_pressure *pressure) {
    MHD_stop_daemon(daemon);
    if (pressure != NULL) {
        pthread_mutex_destroy(&pressure->lock);
        free(pressure);
    }
}

unsigned long long cmhd_evicted_count(struct cmhd_pressure *pressure) {
    pthread_mutex_lock(&pressure->lock);
    unsigned long long count = pressure->evicted;
    pthread_mutex_unlock(&pressure->lock);
    return count;
}

struct MHD_Daemon *cmhd_start(uint16_t port, const char *host,
                              MHD_AccessHandlerCallback handler, void *handler_cls,
                              MHD_RequestCompletedCallback completed, void *completed_cls,
                              unsigned int connection_limit, unsigned int per_address_limit, unsigned int high_water,
                              unsigned int connection_timeout_seconds, size_t connection_memory_limit, unsigned int threads,
                              const char *tls_key_pem, const char *tls_certificate_pem, struct cmhd_pressure **pressure_out) {
    *pressure_out = NULL;
    struct cmhd_pressure *pressure = calloc(1, sizeof(*pressure));
    if (pressure == NULL) { errno = ENOMEM; return NULL; }
    pthread_mutex_init(&pressure->lock, NULL);
    pressure->high_water = high_water == 0 || high_water > connection_limit ? connection_limit : high_water;
    pressure->handler = handler;
    pressure->handler_cls = handler_cls;
    pressure->completed = completed;
    pressure->completed_cls = completed_cls;
    /* An IPv4 or IPv6 address, or a host name: the first address it resolves to. */
    struct addrinfo hints, *found = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, NULL, &hints, &found) != 0 || found == NULL) { cmhd_stop_unstarted(pressure); errno = ENXIO; return NULL; }
    struct sockaddr_storage address;
    memset(&address, 0, sizeof(address));
    memcpy(&address, found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE;
    if (address.ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)&address)->sin6_port = htons(port);
        flags |= MHD_USE_IPv6;
    } else {
        ((struct sockaddr_in *)&address)->sin_port = htons(port);
    }
    /* One option list, TLS or not (two-pointer options pass the function as the value). */
    struct MHD_OptionItem options[] = {
        {MHD_OPTION_SOCK_ADDR, 0, &address},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)tracked_completed, pressure},
        {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t)notify_connection, pressure},
        {MHD_OPTION_CONNECTION_LIMIT, connection_limit, NULL},
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_address_limit, NULL},
        {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)unescape, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, connection_timeout_seconds, NULL},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)connection_memory_limit, NULL},
        {MHD_OPTION_THREAD_POOL_SIZE, threads > 1 ? threads : 0, NULL},
        {MHD_OPTION_END, 0, NULL},  /* the TLS options go here and after */
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    if (tls_key_pem != NULL && tls_certificate_pem != NULL) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) { cmhd_stop_unstarted(pressure); errno = ENOTSUP; return NULL; }
        flags |= MHD_USE_TLS;
        options[9] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)tls_key_pem};
        options[10] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)tls_certificate_pem};
    }
    struct MHD_Daemon *daemon = MHD_start_daemon(flags, port, NULL, NULL, tracked_access, pressure, MHD_OPTION_ARRAY, options, MHD_OPTION_END);
    if (daemon == NULL) {
        int saved = errno;
        cmhd_stop_unstarted(pressure);
        errno = saved;
        return NULL;
    }
    *pressure_out = pressure;
    return daemon;
}

unsigned int cmhd_take_peak(struct cmhd_pressure *pressure) {
    pthread_mutex_lock(&pressure->lock);
    unsigned int peak = pressure->peak;
    pressure->peak = pressure->open;
    pthread_mutex_unlock(&pressure->lock);
    return peak;
}

unsigned int cmhd_open_count(struct cmhd_pressure *pressure) {
    pthread_mutex_lock(&pressure->lock);
    unsigned int count = pressure->open;
    pthread_mutex_unlock(&pressure->lock);
    return count;
}

uint16_t cmhd_bound_port(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}

/* The disconnect watch: its own epoll instance and thread, on the sockets of suspended
 * connections (libmicrohttpd does not look at a suspended connection's socket). */
struct cmhd_watch {
    int epoll;
    int wakeup;   /* an eventfd: written once to stop the thread */
    pthread_t thread;
    int running;
    void (*gone)(void *cls, uint64_t cookie);
    void *cls;
};

static void *watch_loop(void *argument) {
    struct cmhd_watch *w = argument;
    struct epoll_event events[64];
    for (;;) {
        int n = epoll_wait(w->epoll, events, 64, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            return NULL;
        }
        for (int i = 0; i < n; i++) {
            if (events[i].data.u64 == UINT64_MAX) return NULL;
            w->gone(w->cls, events[i].data.u64);
        }
    }
}

struct cmhd_watch *cmhd_watch_new(void) {
    struct cmhd_watch *w = calloc(1, sizeof(*w));
    if (w == NULL) return NULL;
    w->epoll = epoll_create1(EPOLL_CLOEXEC);
    w->wakeup = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event stop = {.events = EPOLLIN, .data.u64 = UINT64_MAX};
    if (w->epoll < 0 || w->wakeup < 0 || epoll_ctl(w->epoll, EPOLL_CTL_ADD, w->wakeup, &stop) != 0) {
        if (w->epoll >= 0) close(w->epoll);
        if (w->wakeup >= 0) close(w->wakeup);
        free(w);
        return NULL;
    }
    return w;
}

int cmhd_watch_run(struct cmhd_watch *w, void (*gone)(void *cls, uint64_t cookie), void *cls) {
    w->gone = gone;
    w->cls = cls;
    if (pthread_create(&w->thread, NULL, watch_loop, w) != 0) return -1;
    w->running = 1;
    return 0;
}

int cmhd_watch_add(struct cmhd_watch *w, struct MHD_Connection *connection, uint64_t cookie) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (info == NULL) return -1;
    int fd = info->connect_fd;
    /* The peer's end closing (FIN: EPOLLRDHUP) or the socket failing (RST: EPOLLHUP, EPOLLERR,
     * always reported); not readable data, which may be a next request sent ahead. One-shot. */
    struct epoll_event event = {.events = EPOLLRDHUP | EPOLLONESHOT, .data.u64 = cookie};
    if (epoll_ctl(w->epoll, EPOLL_CTL_ADD, fd, &event) != 0) return -1;
    return fd;
}

void cmhd_watch_remove(struct cmhd_watch *w, int fd) {
    epoll_ctl(w->epoll, EPOLL_CTL_DEL, fd, NULL);
}

void cmhd_watch_stop(struct cmhd_watch *w) {
    if (w == NULL) return;
    uint64_t one = 1;
    if (w->running) {
        ssize_t written = write(w->wakeup, &one, sizeof(one));
        (void)written;
        pthread_join(w->thread, NULL);
    }
    close(w->epoll);
    close(w->wakeup);
    free(w);
}

int cmhd_upgrade_close(struct MHD_UpgradeResponseHandle *urh) {
    return MHD_upgrade_action(urh, MHD_UPGRADE_ACTION_CLOSE) == MHD_YES ? 0 : -1;
}

void cmhd_release_free_memory(void) {
    malloc_trim(0);
}

void cmhd_client_address(struct MHD_Connection *connection, char *out, size_t size) {
    if (size == 0) return;
    out[0] = 0;
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!info || !info->client_addr) return;
    const struct sockaddr *address = info->client_addr;
    if (address->sa_family == AF_INET) {
        if (!inet_ntop(AF_INET, &((const struct sockaddr_in *)address)->sin_addr, out, (socklen_t)size)) out[0] = 0;
    } else if (address->sa_family == AF_INET6) {
        if (!inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)address)->sin6_addr, out, (socklen_t)size)) out[0] = 0;
    }
}
