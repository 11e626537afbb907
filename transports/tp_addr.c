/* tp_addr.c - see tp_addr.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/settings.h"
#include "tp_addr.h"

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
