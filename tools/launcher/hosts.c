/* loomrun: hosts: which are this machine, and the store address each one reaches. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "loomrun.h"

/* ---- hosts ------------------------------------------------------------------- */

void add_host(host_t **hosts, int *nhosts, const char *name, size_t len, int slots)
{
    /* The same name twice is the same host: its slots add up. */
    for (int i = 0; i < *nhosts; i++) {
        if (strlen((*hosts)[i].name) == len && strncmp((*hosts)[i].name, name, len) == 0) {
            (*hosts)[i].slots = (*hosts)[i].slots > INT_MAX / 2 - slots ? INT_MAX / 2
                                                                        : (*hosts)[i].slots + slots;
            return;
        }
    }
    *hosts = xrealloc(*hosts, (size_t)(*nhosts + 1) * sizeof(host_t));
    host_t *h = &(*hosts)[(*nhosts)++];
    memset(h, 0, sizeof(*h));
    h->name = xrealloc(NULL, len + 1);
    memcpy(h->name, name, len);
    h->name[len] = '\0';
    h->slots = slots;
}

/* A slot count: an integer >= 1. Returns it, or -1. */
int parse_slots(const char *s, size_t len)
{
    if (len == 0 || len > 9)
        return -1;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 ? v : -1;
}

int is_local_host(const char *name)
{
    if (strchr(name, '@') != NULL)
        return 0;   /* a user to log in as: the user wants ssh */
    if (strcasecmp(name, "localhost") == 0 || strcasecmp(name, "localhost.localdomain") == 0)
        return 1;
    char me[256] = "";
    if (gethostname(me, sizeof(me) - 1) == 0 && me[0] != '\0') {
        size_t mshort = strcspn(me, "."), nshort = strcspn(name, ".");
        if (strcasecmp(name, me) == 0)
            return 1;
        /* "node1" given on node1.cluster, or "node1.cluster" on node1 */
        if ((name[nshort] == '\0' || me[mshort] == '\0') && mshort == nshort &&
            strncasecmp(name, me, mshort) == 0)
            return 1;
    }
    /* An address: loopback, or one of this machine's interfaces. */
    unsigned char a[16];
    int family = inet_pton(AF_INET, name, a) == 1 ? AF_INET
                 : inet_pton(AF_INET6, name, a) == 1 ? AF_INET6 : 0;
    if (family == 0)
        return 0;
    if ((family == AF_INET && a[0] == 127) ||
        (family == AF_INET6 && IN6_IS_ADDR_LOOPBACK((struct in6_addr *)a)))
        return 1;
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0)
        return 0;
    int found = 0;
    for (struct ifaddrs *i = ifs; i != NULL && !found; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != family)
            continue;
        if (family == AF_INET)
            found = memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, 4) == 0;
        else
            found = memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, a, 16) == 0;
    }
    freeifaddrs(ifs);
    return found;
}

/* The address of this machine that routes to host: connecting a UDP socket
 * sends nothing but makes the kernel choose the source address. */
int route_addr(const char *host, char *out, size_t outlen)
{
    const char *at = strrchr(host, '@');
    if (at != NULL)
        host = at + 1;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_DGRAM,
                              .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res;
    if (getaddrinfo(host, "22", &hints, &res) != 0)
        return -1;
    int ok = -1;
    for (struct addrinfo *ai = res; ai != NULL && ok != 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)outlen, NULL, 0,
                        NI_NUMERICHOST) == 0)
            ok = 0;
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

/* A non-loopback address this machine's name resolves to. */
int own_addr(char *out, size_t outlen)
{
    char me[256] = "";
    if (gethostname(me, sizeof(me) - 1) != 0 || me[0] == '\0')
        return -1;
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res;
    if (getaddrinfo(me, NULL, &hints, &res) != 0)
        return -1;
    int ok = -1;
    for (struct addrinfo *ai = res; ai != NULL && ok != 0; ai = ai->ai_next) {
        if ((ai->ai_family == AF_INET &&
             ((const unsigned char *)&((struct sockaddr_in *)ai->ai_addr)->sin_addr)[0] == 127) ||
            (ai->ai_family == AF_INET6 &&
             IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)ai->ai_addr)->sin6_addr)))
            continue;
        if (getnameinfo(ai->ai_addr, ai->ai_addrlen, out, (socklen_t)outlen, NULL, 0,
                        NI_NUMERICHOST) == 0)
            ok = 0;
    }
    freeaddrinfo(res);
    return ok;
}

char *store_uri(const char *addr, int port)
{
    char buf[NI_MAXHOST + 32];
    snprintf(buf, sizeof(buf), strchr(addr, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", addr, port);
    return xstrdup(buf);
}

/* The first node of a Slurm node list: "gpu[03-08,11],cpu1" -> "gpu03". */
void first_slurm_node(const char *list, char *out, size_t outlen)
{
    size_t n = strcspn(list, ",[");
    size_t k = 0;
    if (list[n] == '[')
        k = strcspn(list + n + 1, "-,]");
    if (n + k >= outlen) {
        out[0] = '\0';
        return;
    }
    memcpy(out, list, n);
    memcpy(out + n, list + n + 1, k);   /* nothing copied when k == 0 */
    out[n + k] = '\0';
}
