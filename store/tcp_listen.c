/* tcp_listen.c - starting and stopping the tcp:// store server: the
 * listening socket, the server's state and its thread. What the thread does is
 * in store/tcp_server.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/log.h"
#include "store.h"
#include "proto.h"
#include "tcp_srv.h"

/* listen() clamps this to net.core.somaxconn; thousands of ranks may connect at
 * once when a job starts. */
#define LISTEN_BACKLOG 65535

/* Bind and listen on host:port (host NULL: every interface, IPv6 and IPv4). */
static int listen_on(const char *host, int port, int *sys_errno_p, loom_err_t *err)
{
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                              .ai_flags = AI_PASSIVE | AI_NUMERICSERV };
    struct addrinfo *res;
    char ps[8], shown[NI_MAXHOST + 16];

    snprintf(ps, sizeof(ps), "%d", port);
    loom_store_format_hostport(host != NULL ? host : "*", port, shown, sizeof(shown));
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g != 0) {
        *sys_errno_p = EADDRNOTAVAIL;
        loom_err_set(err, LOOM_ERR_INVALID_ARG, "cannot listen on %s: %s", shown,
                     g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
        return -1;
    }
    int fd = -1, e = 0, in_use = 0;
    /* For all interfaces, one dual-stack IPv6 socket serves both families; an
     * IPv4 socket is the fallback on hosts without IPv6. */
    for (int pass = 0; pass < 2 && fd < 0; pass++) {
        for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
            if (host == NULL && (pass == 0) != (ai->ai_family == AF_INET6))
                continue;
            if (host != NULL && pass == 1)
                continue;
            fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        ai->ai_protocol);
            if (fd < 0) {
                e = errno;
                continue;
            }
            int one = 1, zero = 0;
            /* Rank 0 of a restarted job must get its port back from TIME_WAIT. */
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
            if (host == NULL && ai->ai_family == AF_INET6)
                setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
            if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
                listen(fd, LISTEN_BACKLOG) != 0) {
                e = errno;
                in_use |= e == EADDRINUSE;
                close(fd);
                fd = -1;
            }
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        if (in_use)
            e = EADDRINUSE;
        *sys_errno_p = e;
        loom_err_set(err, LOOM_ERR_TRANSPORT, "cannot listen on %s: %s", shown, strerror(e));
    }
    return fd;
}

loom_status_t loom_store_server_start_opts(const char *host, int port, const void *key,
                                           size_t keylen, const loom_store_limits_t *lim,
                                           int *sys_errno_p, loom_err_t *err,
                                           loom_store_server_t **srv_p)
{
    loom_status_t st;
    int e = 0;
    loom_store_limits_t env_lim;

    if (sys_errno_p != NULL)
        *sys_errno_p = 0;
    if (srv_p == NULL || port < 0 || port > 65535)
        return loom_err_set(err, LOOM_ERR_INVALID_ARG,
                            "store server: port %d out of range or output pointer NULL", port);
    if (keylen > sizeof(((loom_store_server_t *)0)->key))
        return loom_err_set(err, LOOM_ERR_INVALID_ARG, "store server: the key is too long");
    if (lim == NULL) {
        if ((st = loom_store_limits_from_env(&env_lim, err)) != LOOM_SUCCESS)
            return st;
        lim = &env_lim;
    }
    loom_store_server_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory starting the store server");
    if (keylen > 0)
        memcpy(srv->key, key, keylen);
    srv->keylen = keylen;
    srv->lim = *lim;
    srv->tab_size = 256;
    srv->tab = calloc(srv->tab_size, sizeof(*srv->tab));
    if (srv->tab == NULL) {
        st = loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory starting the store server");
        goto free_server;
    }
    srv->lfd = listen_on(host, port, &e, err);
    if (srv->lfd < 0) {
        st = err != NULL && err->status != LOOM_SUCCESS ? err->status : LOOM_ERR_TRANSPORT;
        if (sys_errno_p != NULL)
            *sys_errno_p = e;
        goto free_table;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getsockname(srv->lfd, (struct sockaddr *)&ss, &sl) != 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "getsockname: %s", strerror(errno));
        goto close_listener;
    }
    srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    srv->ep = epoll_create1(EPOLL_CLOEXEC);
    if (srv->ep < 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "epoll_create1: %s", strerror(errno));
        goto close_listener;
    }
    srv->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (srv->wfd < 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "eventfd: %s", strerror(errno));
        goto close_epoll;
    }
    struct epoll_event lev = { .events = EPOLLIN, .data.ptr = &srv->lfd };
    struct epoll_event wev = { .events = EPOLLIN, .data.ptr = &srv->wfd };
    if (epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->lfd, &lev) != 0 ||
        epoll_ctl(srv->ep, EPOLL_CTL_ADD, srv->wfd, &wev) != 0) {
        st = loom_err_set(err, LOOM_ERR_TRANSPORT, "epoll_ctl: %s", strerror(errno));
        goto close_eventfd;
    }
    /* The server thread takes no signals: they belong to the application's threads. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&srv->thread, NULL, loom_store_server_run, srv);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        st = loom_err_set(err, LOOM_ERR_INTERNAL, "starting the store server thread: %s",
                          strerror(rc));
        goto close_eventfd;
    }
    *srv_p = srv;
    return LOOM_SUCCESS;

close_eventfd:
    close(srv->wfd);
close_epoll:
    close(srv->ep);
close_listener:
    close(srv->lfd);
free_table:
    free(srv->tab);
free_server:
    free(srv);
    return st;
}

loom_status_t loom_store_server_start_key(const char *host, int port, const void *key,
                                          size_t keylen, int *sys_errno_p, loom_err_t *err,
                                          loom_store_server_t **srv_p)
{
    return loom_store_server_start_opts(host, port, key, keylen, NULL, sys_errno_p, err, srv_p);
}

loom_status_t loom_store_server_start_limits(const char *host, int port,
                                             const loom_store_limits_t *lim, int *sys_errno_p,
                                             loom_err_t *err, loom_store_server_t **srv_p)
{
    return loom_store_server_start_opts(host, port, NULL, 0, lim, sys_errno_p, err, srv_p);
}

loom_status_t loom_store_server_start_errno(const char *host, int port, int *sys_errno_p,
                                            loom_err_t *err, loom_store_server_t **srv_p)
{
    return loom_store_server_start_opts(host, port, NULL, 0, NULL, sys_errno_p, err, srv_p);
}

loom_status_t loom_store_server_start(const char *host, int port, loom_err_t *err,
                                      loom_store_server_t **srv_p)
{
    return loom_store_server_start_key(host, port, NULL, 0, NULL, err, srv_p);
}

loom_status_t loom_store_server_start_auth(const char *host, int port, const void *key,
                                           size_t keylen, loom_err_t *err,
                                           loom_store_server_t **srv_p)
{
    return loom_store_server_start_key(host, port, key, keylen, NULL, err, srv_p);
}

int loom_store_server_port(const loom_store_server_t *srv)
{
    return srv->port;
}
void loom_store_server_stop(loom_store_server_t *srv)
{
    if (srv == NULL)
        return;
    uint64_t one = 1;
    while (write(srv->wfd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
    pthread_join(srv->thread, NULL);
    loom_store_server_free(srv);
}
