#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_store_util.h"

loom_store_t *open_uri(const char *uri)
{
    loom_err_t err;
    loom_store_t *s = NULL;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_open(uri, -1, LONG_TIMEOUT, &err, &s) == LOOM_SUCCESS,
                  "open %s: %s", uri, err.msg);
    ck_assert_ptr_nonnull(s);
    return s;
}

void put(loom_store_t *s, const char *key, const void *val, size_t len)
{
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_set(s, key, val, len, &err) == LOOM_SUCCESS, "set %s: %s", key,
                  err.msg);
}

void put_str(loom_store_t *s, const char *key, const char *val)
{
    put(s, key, val, strlen(val));
}

void expect(loom_store_t *s, const char *key, const void *want, size_t wlen)
{
    loom_err_t err;
    void *val = NULL;
    size_t len = 0;
    loom_err_clear(&err);
    ck_assert_msg(loom_store_get(s, key, &val, &len, LONG_TIMEOUT, &err) == LOOM_SUCCESS,
                  "get %s: %s", key, err.msg);
    ck_assert_uint_eq(len, wlen);
    ck_assert(memcmp(val, want, wlen) == 0);
    ck_assert_int_eq(((char *)val)[len], '\0');
    free(val);
}

void expect_str(loom_store_t *s, const char *key, const char *want)
{
    expect(s, key, want, strlen(want));
}

void expect_absent(loom_store_t *s, const char *key)
{
    loom_err_t err;
    const char *keys[1] = { key };
    loom_err_clear(&err);
    ck_assert_int_eq(loom_store_wait(s, keys, 1, 0.0, &err), LOOM_ERR_TIMEOUT);
}

/* ---- A redis-server of our own. ------------------------------------------ */

/* A socket bound to 127.0.0.1:port and not listening: connections to that
 * port are refused, and nobody else can take the port meanwhile. */
int reserve_port(int *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t sl = sizeof(a);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &sl), 0);
    *port_p = ntohs(a.sin_port);
    return fd;
}

/* Send one inline command to 127.0.0.1:port and read the first line of the
 * answer ("+PONG", ":1", ...) without its CRLF. 0 on success. */
int raw_command(int port, const char *cmd, char *line, size_t linelen)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = { 2, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int rc = -1;
    char req[256];
    int n = snprintf(req, sizeof(req), "%s\r\n", cmd);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        send(fd, req, (size_t)n, MSG_NOSIGNAL) != n)
        goto out;
    size_t got = 0;
    while (got + 1 < linelen) {
        ssize_t r = recv(fd, line + got, 1, 0);
        if (r <= 0)
            goto out;
        if (line[got] == '\n') {
            if (got > 0 && line[got - 1] == '\r')
                got--;
            line[got] = '\0';
            rc = 0;
            goto out;
        }
        got++;
    }
out:
    close(fd);
    return rc;
}

static pid_t spawn_redis(int port, const char *const *extra)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid > 0)
        return pid;
    /* Die with the test process: in Check's fork mode a failed assertion ends
     * it with _exit, and the teardown never runs. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127);
    int nul = open("/dev/null", O_RDWR);
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
    }
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    const char *argv[24] = { "redis-server", "--port", ps, "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no" };
    int argc = 9;
    for (int i = 0; extra != NULL && extra[i] != NULL && argc < 23; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    execvp(argv[0], (char *const *)argv);
    _exit(127);
}

void redis_stop(redis_server_t *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    s->pid = 0;
}

/* Start redis-server on port (0: a free one) with extra options (NULL-ended)
 * and wait until it answers. */
void redis_start(redis_server_t *s, int port, const char *const *extra)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        int p = port;
        if (p == 0)
            close(reserve_port(&p));
        s->port = p;
        s->pid = spawn_redis(p, extra);
        snprintf(s->uri, sizeof(s->uri), "redis://127.0.0.1:%d", p);
        double deadline = loom_now_s() + 15.0;
        while (loom_now_s() < deadline) {
            char line[128];
            /* A server with a password answers -NOAUTH: up all the same. */
            if (raw_command(p, "PING", line, sizeof(line)) == 0 &&
                (strcmp(line, "+PONG") == 0 || strncmp(line, "-NOAUTH", 7) == 0))
                return;
            int status;
            if (waitpid(s->pid, &status, WNOHANG) == s->pid) {
                s->pid = 0;   /* exited: most likely someone took the port meanwhile */
                break;
            }
            usleep(10000);
        }
        redis_stop(s);
        if (port != 0)
            break;
    }
    ck_abort_msg("redis-server did not come up on 127.0.0.1:%d", s->port);
}

int have_redis_server(void)
{
    const char *path = getenv("PATH");
    if (path == NULL)
        return 0;
    char *dirs = strdup(path), *save = NULL;
    if (dirs == NULL)
        return 0;
    int found = 0;
    for (char *d = strtok_r(dirs, ":", &save); d != NULL && !found;
         d = strtok_r(NULL, ":", &save)) {
        char p[4096];
        snprintf(p, sizeof(p), "%s/redis-server", d);
        found = access(p, X_OK) == 0;
    }
    free(dirs);
    return found;
}
