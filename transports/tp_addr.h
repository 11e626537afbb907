/* tp_addr.h - the addresses of the network transports: which host to listen
 * on, and numeric hosts into socket addresses (tcp, ibverbs's side channel). */
#ifndef LOOM_TP_ADDR_H
#define LOOM_TP_ADDR_H

#include <stddef.h>
#include <sys/socket.h>

#include "transport.h"

/* The numeric host a network transport listens on: the interface
 * LOOM_SOCKET_IFNAME names (its IPv4 address, else its IPv6 one), else the
 * address that reaches the store, else loopback where the launcher says every
 * rank runs on this node, else the first IPv4 interface that is up and not
 * loopback. Sets p->err when the named interface has no address. */
loom_status_t loom_tp_choose_host(const loom_tp_params_t *p, char *host, size_t hostlen);

/* A numeric host ("10.0.0.1", "fe80::1%eth0") and port into a socket
 * address for a stream socket: 0, or -1 when either is not numeric. */
int loom_tp_numeric_addr(const char *host, const char *port, struct sockaddr_storage *ss,
                         socklen_t *len);

#endif
