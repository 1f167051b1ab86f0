#include "ccrowd.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int ccrowd_connect(const char *source, uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    /* The port is chosen at connect, per destination: many sources, each its own port range. */
    int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
    struct sockaddr_in local;
    memset(&local, 0, sizeof(local));
    local.sin_family = AF_INET;
    if (inet_pton(AF_INET, source, &local.sin_addr) != 1) { close(fd); return -EINVAL; }
    if (bind(fd, (struct sockaddr *)&local, sizeof(local)) != 0) { int e = errno; close(fd); return -e; }
    struct sockaddr_in remote;
    memset(&remote, 0, sizeof(remote));
    remote.sin_family = AF_INET;
    remote.sin_port = htons(port);
    remote.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&remote, sizeof(remote)) != 0 && errno != EINPROGRESS) { int e = errno; close(fd); return -e; }
    return fd;
}

int ccrowd_epoll(void) {
    int fd = epoll_create1(EPOLL_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int ccrowd_watch(int epoll, int fd, int op, uint32_t want, uint64_t data) {
    struct epoll_event event;
    memset(&event, 0, sizeof(event));
    event.events = (want & 1 ? EPOLLIN : 0) | (want & 2 ? EPOLLOUT : 0) | EPOLLRDHUP;
    event.data.u64 = data;
    int code = op == 0 ? EPOLL_CTL_ADD : op == 1 ? EPOLL_CTL_MOD : EPOLL_CTL_DEL;
    return epoll_ctl(epoll, code, fd, &event) == 0 ? 0 : -errno;
}

int ccrowd_wait(int epoll, uint64_t *data, uint32_t *ready, int max, int timeout_ms) {
    struct epoll_event events[256];
    if (max > 256) max = 256;
    int n = epoll_wait(epoll, events, max, timeout_ms);
    if (n < 0) return errno == EINTR ? 0 : -errno;
    for (int i = 0; i < n; i++) {
        data[i] = events[i].data.u64;
        uint32_t e = events[i].events;
        ready[i] = (e & EPOLLIN ? 1u : 0u) | (e & EPOLLOUT ? 2u : 0u) | (e & (EPOLLHUP | EPOLLERR | EPOLLRDHUP) ? 4u : 0u);
    }
    return n;
}

void ccrowd_reset(int fd) {
    struct linger linger = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, sizeof(linger));
    close(fd);
}
