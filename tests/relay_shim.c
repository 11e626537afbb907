/*
 * relay_shim.c - LD_PRELOAD library for tests/test_relay.py: stands in for a
 * network device that intercepts a connection. A connect() to port
 * RELAY_FROM_PORT goes to RELAY_TO_PORT on the same host instead.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>

int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
    static int (*real)(int, const struct sockaddr *, socklen_t);
    if (!real)
        real = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "connect");
    const char *from = getenv("RELAY_FROM_PORT"), *to = getenv("RELAY_TO_PORT");
    if (from && to && sa->sa_family == AF_INET &&
        ntohs(((const struct sockaddr_in *)sa)->sin_port) == atoi(from)) {
        struct sockaddr_in a = *(const struct sockaddr_in *)sa;
        a.sin_port = htons((uint16_t)atoi(to));
        return real(fd, (const struct sockaddr *)&a, sizeof(a));
    }
    return real(fd, sa, len);
}
