#include "raw_limits.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char body[] = "{\"status\":\"ok\"}";

static enum MHD_Result answer(void *cls, struct MHD_Connection *connection, const char *url, const char *method,
                              const char *version, const char *upload_data, size_t *upload_data_size, void **state) {
    (void)cls; (void)url; (void)method; (void)version; (void)upload_data;
    if (*state == NULL) { *state = (void *)1; return MHD_YES; }
    if (*upload_data_size != 0) { *upload_data_size = 0; return MHD_YES; }
    struct MHD_Response *response = MHD_create_response_from_buffer(sizeof(body) - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(response, "Content-Type", "application/json");
    enum MHD_Result queued = MHD_queue_response(connection, 200, response);
    MHD_destroy_response(response);
    return queued;
}

uint16_t raw_http_start(unsigned int connection_limit, unsigned int connection_timeout_seconds, size_t connection_memory_limit) {
    struct sockaddr_in address;
    memset(&address, 0, sizeof(address));
    address.sin_family = AF_INET;
    address.sin_port = 0;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *daemon = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ITC | MHD_ALLOW_SUSPEND_RESUME, 0, NULL, NULL, answer, NULL,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&address,
        MHD_OPTION_CONNECTION_LIMIT, connection_limit,
        MHD_OPTION_CONNECTION_TIMEOUT, connection_timeout_seconds,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, connection_memory_limit,
        MHD_OPTION_END);
    if (daemon == NULL) return 0;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
    return info == NULL ? 0 : info->port;
}

static void *echo_connection(void *argument) {
    int fd = (int)(intptr_t)argument;
    char buffer[65536];
    for (;;) {
        ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
        if (n <= 0) break;
        ssize_t sent = 0;
        while (sent < n) {
            ssize_t m = send(fd, buffer + sent, (size_t)(n - sent), MSG_NOSIGNAL);
            if (m <= 0) { close(fd); return NULL; }
            sent += m;
        }
    }
    close(fd);
    return NULL;
}

static void *echo_accept(void *argument) {
    int listener = (int)(intptr_t)argument;
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        pthread_t thread;
        if (pthread_create(&thread, NULL, echo_connection, (void *)(intptr_t)fd) == 0) pthread_detach(thread);
        else close(fd);
    }
    return NULL;
}

uint16_t raw_echo_start(void) {
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    if (listener < 0) return 0;
    struct sockaddr_in address;
    memset(&address, 0, sizeof(address));
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (bind(listener, (struct sockaddr *)&address, sizeof(address)) != 0 || listen(listener, 16) != 0 ||
        getsockname(listener, (struct sockaddr *)&address, &length) != 0) {
        close(listener);
        return 0;
    }
    pthread_t thread;
    if (pthread_create(&thread, NULL, echo_accept, (void *)(intptr_t)listener) != 0) { close(listener); return 0; }
    pthread_detach(thread);
    return ntohs(address.sin_port);
}

struct sink { unsigned char *buffer; size_t capacity, used; };

static size_t sink_write(char *data, size_t size, size_t count, void *user) {
    struct sink *sink = user;
    size_t n = size * count;
    if (sink->used + n > sink->capacity) return 0;
    memcpy(sink->buffer + sink->used, data, n);
    sink->used += n;
    return n;
}

struct slot { CURL *curl; struct curl_slist *headers; struct sink sink; int index; };

static void start_transfer(CURLM *multi, struct slot *slot, int index, const char *base_url, const char *const *paths, const char *const *headers,
                           const unsigned char *const *bodies, const size_t *sizes, int upload) {
    char url[4096];
    snprintf(url, sizeof(url), "%s%s", base_url, paths[index]);
    curl_easy_setopt(slot->curl, CURLOPT_URL, url);
    slot->headers = curl_slist_append(NULL, headers[index]);
    if (upload) {
        slot->headers = curl_slist_append(slot->headers, "Content-Type: application/octet-stream");
        curl_easy_setopt(slot->curl, CURLOPT_CUSTOMREQUEST, "PUT");
        curl_easy_setopt(slot->curl, CURLOPT_POSTFIELDS, bodies[index]);
        curl_easy_setopt(slot->curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)sizes[index]);
    }
    curl_easy_setopt(slot->curl, CURLOPT_HTTPHEADER, slot->headers);
    slot->sink.used = 0;
    slot->index = index;
    curl_multi_add_handle(multi, slot->curl);
}

long long raw_curl_transfer(const char *base_url, int count, const char *const *paths, const char *const *headers,
                            const unsigned char *const *bodies, const size_t *sizes, size_t capacity, int upload, int parallel) {
    CURLM *multi = curl_multi_init();
    if (multi == NULL || parallel < 1 || parallel > 16) return -1;
    struct slot slots[16];
    long long moved = 0;
    int failed = 0, next = 0, running = 0;
    for (int i = 0; i < parallel; i++) {
        slots[i].curl = curl_easy_init();
        slots[i].headers = NULL;
        /* Each connection's answers land in its own buffer: a download's whole chunk, an upload's small JSON. */
        slots[i].sink.capacity = upload ? (1 << 16) : capacity;
        slots[i].sink.buffer = malloc(slots[i].sink.capacity);
        curl_easy_setopt(slots[i].curl, CURLOPT_WRITEFUNCTION, sink_write);
        curl_easy_setopt(slots[i].curl, CURLOPT_WRITEDATA, &slots[i].sink);
        curl_easy_setopt(slots[i].curl, CURLOPT_PRIVATE, &slots[i]);
        if (next < count) { start_transfer(multi, &slots[i], next++, base_url, paths, headers, bodies, sizes, upload); running++; }
    }
    while (running > 0 && !failed) {
        int still = 0;
        curl_multi_perform(multi, &still);
        CURLMsg *message;
        int left = 0;
        while ((message = curl_multi_info_read(multi, &left)) != NULL) {
            if (message->msg != CURLMSG_DONE) continue;
            struct slot *slot = NULL;
            curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, (char **)&slot);
            long status = 0;
            curl_easy_getinfo(slot->curl, CURLINFO_RESPONSE_CODE, &status);
            if (message->data.result != CURLE_OK || status < 200 || status > 299) failed = 1;
            moved += upload ? (long long)sizes[slot->index] : (long long)slot->sink.used;
            curl_multi_remove_handle(multi, slot->curl);
            curl_slist_free_all(slot->headers);
            slot->headers = NULL;
            running--;
            if (next < count && !failed) { start_transfer(multi, slot, next++, base_url, paths, headers, bodies, sizes, upload); running++; }
        }
        if (running > 0) curl_multi_poll(multi, NULL, 0, 1000, NULL);
    }
    for (int i = 0; i < parallel; i++) {
        curl_multi_remove_handle(multi, slots[i].curl);
        curl_slist_free_all(slots[i].headers);
        curl_easy_cleanup(slots[i].curl);
        free(slots[i].sink.buffer);
    }
    curl_multi_cleanup(multi);
    return failed ? -1 : moved;
}
