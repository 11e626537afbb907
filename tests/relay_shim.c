/*
 * relay_shim.c - LD_PRELOAD library for tests/test_relay.py: stands in for a
 * network device that intercepts a connection. A connect() to port
 * RELAY_FROM_PORT goes to RELAY_TO_PORT on the same host instead. With
 * RELAY_ANY_TO_PORT, every TCP connect() on loopback except to
 * RELAY_EXCEPT_PORT (the store) goes to that port, and the first two bytes
 * sent (big-endian) are the port it was meant for, so one relay can follow
 * connections whose ports nobody knows in advance (a split communicator's).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

/* Connect to the relay blocking (loopback: at once) and say where to. */
static int via_relay(connect_fn real, int fd, const struct sockaddr_in *to, int relay_port)
{
    struct sockaddr_in a = *to;
    uint16_t want = to->sin_port;   /* already big-endian */
    a.sin_port = htons((uint16_t)relay_port);
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
        return -1;
    int rc = real(fd, (const struct sockaddr *)&a, sizeof(a));
    if (rc == 0 && send(fd, &want, sizeof(want), MSG_NOSIGNAL) != (ssize_t)sizeof(want))
        rc = -1;
    int saved = errno;
    fcntl(fd, F_SETFL, flags);
    errno = saved;
    return rc;
}

int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    static connect_fn real;
    if (!real)
        real = (connect_fn)dlsym(RTLD_NEXT, "connect");
    if (sa->sa_family != AF_INET)
        return real(fd, sa, len);
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    const char *any = getenv("RELAY_ANY_TO_PORT"), *except = getenv("RELAY_EXCEPT_PORT");
    if (any && ntohs(in->sin_port) != (except ? atoi(except) : -1))
        return via_relay(real, fd, in, atoi(any));
    const char *from = getenv("RELAY_FROM_PORT"), *to = getenv("RELAY_TO_PORT");
    if (from && to && ntohs(in->sin_port) == atoi(from)) {
        struct sockaddr_in a = *in;
        a.sin_port = htons((uint16_t)atoi(to));
        return real(fd, (const struct sockaddr *)&a, sizeof(a));
    }
    return real(fd, sa, len);
}
