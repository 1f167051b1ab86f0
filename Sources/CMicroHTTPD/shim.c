#include "cmicrohttpd.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

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

struct MHD_Daemon *cmhd_start(uint16_t port, const char *host,
                              MHD_AccessHandlerCallback handler, void *handler_cls,
                              MHD_RequestCompletedCallback completed, void *completed_cls,
                              unsigned int connection_limit, unsigned int per_address_limit,
                              unsigned int connection_timeout_seconds, size_t connection_memory_limit,
                              const char *tls_key_pem, const char *tls_certificate_pem) {
    /* An IPv4 or IPv6 address, or a host name: the first address it resolves to. */
    struct addrinfo hints, *found = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, NULL, &hints, &found) != 0 || found == NULL) { errno = ENXIO; return NULL; }
    struct sockaddr_storage address;
    memset(&address, 0, sizeof(address));
    memcpy(&address, found->ai_addr, found->ai_addrlen);
    freeaddrinfo(found);
    unsigned int flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME;
    if (address.ss_family == AF_INET6) {
        ((struct sockaddr_in6 *)&address)->sin6_port = htons(port);
        flags |= MHD_USE_IPv6;
    } else {
        ((struct sockaddr_in *)&address)->sin_port = htons(port);
    }
    /* One option list, TLS or not (two-pointer options pass the function as the value). */
    struct MHD_OptionItem options[] = {
        {MHD_OPTION_SOCK_ADDR, 0, &address},
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, completed_cls},
        {MHD_OPTION_CONNECTION_LIMIT, connection_limit, NULL},
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_address_limit, NULL},
        {MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)unescape, NULL},
        {MHD_OPTION_CONNECTION_TIMEOUT, connection_timeout_seconds, NULL},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)connection_memory_limit, NULL},
        {MHD_OPTION_END, 0, NULL},  /* the TLS options go here and after */
        {MHD_OPTION_END, 0, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    if (tls_key_pem != NULL && tls_certificate_pem != NULL) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) { errno = ENOTSUP; return NULL; }
        flags |= MHD_USE_TLS;
        options[7] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)tls_key_pem};
        options[8] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)tls_certificate_pem};
    }
    return MHD_start_daemon(flags, port, NULL, NULL, handler, handler_cls, MHD_OPTION_ARRAY, options, MHD_OPTION_END);
}

uint16_t cmhd_bound_port(struct MHD_Daemon *daemon) {
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}
