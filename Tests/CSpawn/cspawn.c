#define _GNU_SOURCE
#include "cspawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

extern char **environ;

int cspawn(const char *path, char *const argv[], pid_t *pid, int *out_fd, int *err_fd) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return errno;
    if (pipe2(err, O_CLOEXEC) != 0) { int e = errno; close(out[0]); close(out[1]); return e; }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
    // The child starts as a shell would start it: no signal blocked (the spawning thread may be
    // one of Dispatch's, which block them all, and a blocked mask outlives exec) and none
    // ignored. Without this a tmux server started here never ends on kill-server or SIGTERM.
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t none, reset;
    sigemptyset(&none);
    sigemptyset(&reset);
    int signals[] = {SIGHUP, SIGINT, SIGQUIT, SIGPIPE, SIGALRM, SIGTERM, SIGUSR1, SIGUSR2, SIGCHLD, SIGTSTP, SIGTTIN, SIGTTOU};
    for (size_t index = 0; index < sizeof signals / sizeof signals[0]; index++) sigaddset(&reset, signals[index]);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setsigdefault(&attributes, &reset);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    int result = posix_spawn(pid, path, &actions, &attributes, argv, environ);
    posix_spawnattr_destroy(&attributes);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    close(err[1]);
    if (result != 0) { close(out[0]); close(err[0]); return result; }
    *out_fd = out[0];
    *err_fd = err[0];
    return 0;
}
