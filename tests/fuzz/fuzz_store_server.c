/* fuzz_store_server.c - the tcp:// store server's request handling: the bytes
 * of one client connection (hello, requests, payloads, garbage) are fed to a
 * server with no thread, through a socketpair, with small limits so the
 * quota, discard and drop paths are reached. The server's source is included
 * to drive its state machine by hand. */
#include "store/tcp_server.c"

#include <sys/eventfd.h>

static void pump(loom_store_server_t *srv, srv_client_t *c, int peer)
{
    uint8_t sink[65536];
    for (int round = 0; round < 64 && !c->dead; round++) {
        client_event(srv, c, EPOLLIN | EPOLLOUT);
        while (read(peer, sink, sizeof(sink)) > 0)
            ;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    loom_store_server_t *srv = calloc(1, sizeof(*srv));
    srv->tab_size = 16;
    srv->tab = calloc(srv->tab_size, sizeof(*srv->tab));
    srv->lim = (loom_store_limits_t){ .max_bytes = 1u << 16, .max_clients = 8,
                                      .max_clients_per_host = 8, .hello_timeout_s = 5,
                                      .idle_timeout_s = 5 };
    srv->lfd = eventfd(0, EFD_CLOEXEC);
    srv->wfd = eventfd(0, EFD_CLOEXEC);
    srv->ep = epoll_create1(EPOLL_CLOEXEC);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    srv_client_t *c = calloc(1, sizeof(*c));
    c->fd = sv[0];
    c->need = LOOM_STORE_HELLO_LEN;
    c->events = EPOLLIN | EPOLLRDHUP;
    c->since = c->last_active = loom_now_s();
    struct epoll_event ev = { .events = c->events, .data.ptr = c };
    epoll_ctl(srv->ep, EPOLL_CTL_ADD, sv[0], &ev);
    srv->clients = c;
    srv->n_clients = 1;

    /* Feed in pieces, as a network would, answering as we go. */
    size_t off = 0;
    while (off < size && !c->dead) {
        ssize_t w = write(sv[1], data + off, size - off < 4096 ? size - off : 4096);
        if (w > 0)
            off += (size_t)w;
        pump(srv, c, sv[1]);
        if (w <= 0 && !c->dead && !can_read(c))
            break;   /* parked or stuck on output: the rest would wait */
    }
    shutdown(sv[1], SHUT_WR);
    pump(srv, c, sv[1]);
    /* Parked WAITs time out; a quota the client left must be back to zero. */
    if (!c->dead && c->parked != NULL) {
        c->deadline = 0;
        expire(srv);
    }
    close(sv[1]);
    loom_store_server_free(srv);
    return 0;
}
