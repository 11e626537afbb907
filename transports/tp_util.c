/* tp_util.c - see tp_util.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/settings.h"
#include "tp_util.h"

/* The numeric form of an interface's address, an IPv6 link-local one with its
 * scope ("fe80::1%eth0"), which is all a peer needs to reach it. */
static int numeric_host(const struct sockaddr *sa, char *host, size_t hostlen)
{
    char text[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET)
        return inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, text,
                         sizeof(text)) && snprintf(host, hostlen, "%s", text) < (int)hostlen
                   ? 0 : -1;
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (!inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text)))
        return -1;
    char ifname[IF_NAMESIZE] = "";
    if (in6->sin6_scope_id && if_indextoname(in6->sin6_scope_id, ifname))
        return snprintf(host, hostlen, "%s%%%s", text, ifname) < (int)hostlen ? 0 : -1;
    return snprintf(host, hostlen, "%s", text) < (int)hostlen ? 0 : -1;
}

loom_status_t loom_tp_choose_host(const loom_tp_params_t *p, char *host, size_t hostlen)
{
    struct ifaddrs *ifs, *ifa;
    if (p->ifname && *p->ifname) {
        if (getifaddrs(&ifs) != 0)
            return loom_err_set(p->err, LOOM_ERR_TRANSPORT, "getifaddrs: %s", strerror(errno));
        int rc = -1;
        for (int af = AF_INET; rc != 0; af = AF_INET6) {   /* IPv4 first, then IPv6 */
            for (ifa = ifs; ifa && rc != 0; ifa = ifa->ifa_next)
                if (ifa->ifa_addr && ifa->ifa_addr->sa_family == af &&
                    strcmp(ifa->ifa_name, p->ifname) == 0)
                    rc = numeric_host(ifa->ifa_addr, host, hostlen);
            if (af == AF_INET6)
                break;
        }
        freeifaddrs(ifs);
        if (rc != 0)
            return loom_err_set(p->err, LOOM_ERR_INVALID_ARG,
                                "LOOM_SOCKET_IFNAME=%s: no such interface with an IPv4 or IPv6 "
                                "address", p->ifname);
        return LOOM_SUCCESS;
    }
    if (p->bind_host && *p->bind_host) {
        snprintf(host, hostlen, "%s", p->bind_host);
        return LOOM_SUCCESS;
    }
    snprintf(host, hostlen, "127.0.0.1");
    /* Nothing says which interface the others reach (a file:// store) and
     * the launcher says they all run here: loopback, which no other machine
     * reaches. */
    if (p->settings && p->settings->single_node)
        return LOOM_SUCCESS;
    if (getifaddrs(&ifs) == 0) {
        for (ifa = ifs; ifa; ifa = ifa->ifa_next)
            if (ifa->ifa_addr && ifa->ifa_addr->sa_family == AF_INET &&
                (ifa->ifa_flags & IFF_UP) && !(ifa->ifa_flags & IFF_LOOPBACK) &&
                numeric_host(ifa->ifa_addr, host, hostlen) == 0)
                break;
        freeifaddrs(ifs);
    }
    return LOOM_SUCCESS;
}

loom_status_t loom_tp_fail_gave_up(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                   int rank, int peer)
{
    return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                        "rank %d lost rank %d: rank %d gave up on this communicator (a failed "
                        "call or loom_comm_abort there)", rank, peer, peer);
}

loom_status_t loom_tp_fail_fault(loom_status_t *failed, loom_err_t *err, const char *subsys,
                                 int rank, int from, const loom_tp_fault_t *f)
{
    char told[64] = "";
    if (from != f->reporter)
        snprintf(told, sizeof(told), "; rank %d told rank %d", from, rank);
    if (f->culprit >= 0 && f->why == LOOM_ERR_TIMEOUT)
        return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                            "rank %d stopped answering (rank %d gave up on it after %.1f s "
                            "LOOM_TIMEOUT%s)", f->culprit, f->reporter, f->waited_ms / 1000.0,
                            told);
    if (f->culprit >= 0)
        return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                            "rank %d was lost (rank %d gave up on it: %s%s)", f->culprit,
                            f->reporter, loom_strerror(f->why), told);
    return loom_tp_fail(failed, err, subsys, rank, LOOM_ERR_PEER_LOST,
                        "rank %d lost rank %d: rank %d gave up on this communicator (a failed "
                        "call or loom_comm_abort there: %s%s)", rank, f->reporter, f->reporter,
                        loom_strerror(f->why), told);
}

int loom_tp_numeric_addr(const char *host, const char *port, struct sockaddr_storage *ss,
                         socklen_t *len)
{
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV,
                             .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        return -1;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

void loom_tp_own(_Atomic int *owner)
{
    int idle = 0;
    while (!atomic_compare_exchange_weak(owner, &idle, 1)) {
        idle = 0;
        sched_yield();   /* an abort is telling the peers: a few sends */
    }
}

void loom_tp_disown(_Atomic int *owner)
{
    atomic_store(owner, 0);
}

int loom_tp_own_if_idle(_Atomic int *owner)
{
    int idle = 0;
    return atomic_compare_exchange_strong(owner, &idle, 2);
}

loom_status_t loom_tp_leave(_Atomic int *owner, const loom_status_t *failed,
                            void (*announce)(loom_tp_t *), loom_tp_t *tp, loom_status_t st)
{
    if (*failed)
        announce(tp);
    loom_tp_disown(owner);
    return st;
}

loom_status_t loom_tp_fail(loom_status_t *failed, loom_err_t *err, const char *subsys, int rank,
                           loom_status_t st, const char *fmt, ...)
{
    if (*failed == LOOM_SUCCESS) {
        char msg[LOOM_ERRMSG_MAX];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        loom_err_set(err, st, "%s", msg);
        LOOM_INFO(subsys, "rank %d: %s", rank, msg);
        *failed = st;
    }
    return *failed;
}

void loom_req_queue_push(loom_req_queue_t *q, loom_tp_req_t *req)
{
    req->next = NULL;
    if (q->tail)
        q->tail->next = req;
    else
        q->head = req;
    q->tail = req;
}

loom_tp_req_t *loom_req_queue_pop(loom_req_queue_t *q)
{
    loom_tp_req_t *req = q->head;
    q->head = req->next;
    if (!q->head)
        q->tail = NULL;
    return req;
}

void loom_req_start(loom_tp_req_t *req)
{
    req->done = 0;
    req->off = 0;
    req->status = LOOM_SUCCESS;
    req->next = NULL;
}

void loom_req_complete(loom_tp_req_t *req)
{
    req->off = req->len;
    req->status = LOOM_SUCCESS;
    req->done = 1;
}

loom_tp_req_t *loom_req_queue_take(loom_req_queue_t *q, const loom_frame_t *f, int my_rank,
                                   loom_err_t *err, loom_status_t *st)
{
    loom_tp_req_t *prev = NULL;
    for (loom_tp_req_t *r = q->head; r; prev = r, r = r->next) {
        if (r->match.tag != f->match.tag)
            continue;
        loom_status_t check = loom_frame_check(f, r, my_rank, err);
        if (check != LOOM_SUCCESS) {
            *st = check;
            return NULL;
        }
        if (prev)
            prev->next = r->next;
        else
            q->head = r->next;
        if (q->tail == r)
            q->tail = prev;
        return r;
    }
    return NULL;
}

void loom_unexp_free_all(loom_unexp_queue_t *q)
{
    for (loom_unexp_t *u = q->head, *next; u; u = next) {
        next = u->next;
        free(u->data);
        free(u);
    }
    q->head = q->tail = NULL;
    q->count = 0;
    q->bytes = 0;
}
