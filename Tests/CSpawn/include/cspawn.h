#ifndef CSPAWN_H
#define CSPAWN_H

#include <sys/types.h>

/* Starts `path` with `argv` (NULL-terminated), stdin from /dev/null, stdout and stderr into two
 * new pipes whose read ends are returned in out_fd and err_fd; every other descriptor of the
 * caller is closed in the child. Returns 0 or an errno value. For the tests' child processes:
 * Foundation's Process.run() in Swift 6.3.1 crashes now and then (see ChildProcess.swift). */
int cspawn(const char *path, char *const argv[], pid_t *pid, int *out_fd, int *err_fd);

#endif
