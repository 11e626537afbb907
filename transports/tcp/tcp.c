/*
 * tcp.c - the TCP transport: non-blocking sockets to every peer, an epoll loop
 * driven by whoever waits (no progress thread), a versioned handshake, and
 * frames whose headers are checked before a byte lands in a user buffer.
 *
 * LOOM_SOCKETS_PER_PEER > 1: a pair has that many connections, all dialled
 * by the same rank, each with its own handshake (and with a key its own
 * proof and session keys). Stream 0 carries every frame as with one stream;
 * a message of LOOM_STRIPE_MIN_BYTES or more is announced there as STRIPED
 * and carries slice 0, while streams 1.. carry slices 1.. (SLICE frames),
 * each stream in the order stream 0 announced them. Matching, ordering and
 * mismatch checks are decided on stream 0 alone; a stream reads only once
 * the slice it expects has a place to go. This is for networks that cap
 * each flow below the link rate; the one progress loop serves every stream
 * (no helper threads: the copies are the kernel's, and one core fills a
 * link of a few GB/s).
 *
 * Receive path: bytes are read into a per-peer staging buffer so that many
 * small frames cost one recv(); a large payload bypasses it and is read
 * straight into the posted buffer. A frame nobody has posted for yet is kept
 * as an "unexpected" message in a buffer of its own until its receive comes.
 *
 * LOOM_AUTH_KEY: the handshake proves the key both ways over both ends'
 * published addresses and derives session keys (wire.h); every frame then
 * carries an AEAD tag over its header, right after it, and (LOOM_AUTH_MAC=full
 * or encrypt) one over its payload, right after that, each under the sender's
 * direction key with the frame's sequence number in the nonce; with encrypt
 * the payload travels encrypted (sealed in CT_BYTES pieces as the socket
 * takes them, opened in place as it arrives). A header is checked before it
 * is acted on; payload bytes may land in the posted buffer before their tag
 * arrives, but the receive completes only once it matched.
 *
 * Failure: any error (a peer vanishing, a protocol violation, a mismatch) is
 * sticky for the instance: every later call returns it, and the requests that
 * were pending are never touched again (their memory may already be gone).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include "tcp_int.h"

/* ---- addresses ------------------------------------------------------------ */

static int format_addr(const struct sockaddr *sa, char *out, size_t outlen)
{
    char host[INET6_ADDRSTRLEN];
    int port;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        port = ntohs(in->sin_port);
        return snprintf(out, outlen, "%s:%d", host, port) < (int)outlen ? 0 : -1;
    }
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    if (in6->sin6_scope_id) {
        char ifname[IF_NAMESIZE] = "";
        if_indextoname(in6->sin6_scope_id, ifname);
        return snprintf(out, outlen, "[%s%%%s]:%d", host, ifname, port) < (int)outlen ? 0 : -1;
    }
    return snprintf(out, outlen, "[%s]:%d", host, port) < (int)outlen ? 0 : -1;
}

/* "1.2.3.4:5" or "[::1]:5" (an IPv6 scope may follow '%') into a sockaddr. */
static int parse_addr(const char *text, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[256];
    const char *port;
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close[1] != ':' || (size_t)(close - text - 1) >= sizeof(host))
            return -1;
        memcpy(host, text + 1, (size_t)(close - text - 1));
        host[close - text - 1] = '\0';
        port = close + 2;
    } else {
        const char *colon = strrchr(text, ':');
        if (!colon || (size_t)(colon - text) >= sizeof(host))
            return -1;
        memcpy(host, text, (size_t)(colon - text));
        host[colon - text] = '\0';
        port = colon + 1;
    }
    return loom_tp_numeric_addr(host, port, ss, len);
}

/* ---- create --------------------------------------------------------------- */

static loom_status_t tcp_create(const loom_tp_params_t *p, char *addr, size_t addrlen,
                                loom_tp_t **tp_p)
{
    loom_status_t st;
    loom_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
    tp->rank = p->rank;
    tp->size = p->size;
    tp->job_hash = p->job_hash;
    tp->comm_hash = p->comm_hash;
    tp->sockbuf = p->sockbuf;
    tp->early_max = (size_t)1 << 30;
    tp->nstreams = 1;
    /* Unasked-for bytes reach a peer that may be closing, and a socket
     * closed with unread bytes resets its connection: a healthy job, whose
     * waits end well within LOOM_TIMEOUT, sends no keepalives. */
    tp->keepalive_idle_s = (p->settings && p->settings->timeout_s > 0 ? p->settings->timeout_s
                                                                      : 30.0) / 4;
    if (p->settings) {
        tp->early_max = p->settings->early_max_bytes;
        if (p->settings->sockets_per_peer > 1 && p->settings->sockets_per_peer <= LOOM_MAX_STREAMS) {
            tp->nstreams = p->settings->sockets_per_peer;
            tp->stripe_min = p->settings->stripe_min_bytes ? p->settings->stripe_min_bytes : 1;
        }
        if (p->settings->auth_keylen > 0) {
            tp->auth_key = p->settings->auth_key;
            tp->auth_keylen = p->settings->auth_keylen;
            tp->mac_mode = p->settings->auth_mac == LOOM_AUTH_MAC_HEADERS   ? MAC_HEADERS
                           : p->settings->auth_mac == LOOM_AUTH_MAC_ENCRYPT ? MAC_ENCRYPT
                                                                            : MAC_FULL;
            tp->cipher = p->settings->auth_cipher == 1   ? LOOM_AEAD_AES_256_GCM
                         : p->settings->auth_cipher == 2 ? LOOM_AEAD_CHACHA20_POLY1305
                                                         : loom_aead_default();
        }
    }
    tp->err = p->err;
    tp->listen_fd = tp->epfd = tp->wake_fd = -1;
    tp->peers = calloc((size_t)p->size, sizeof(tcp_peer_t));
    if (!tp->peers) {
        st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
        goto err_free_tp;
    }
    tp->fault = LOOM_TP_FAULT_NONE;
    for (int i = 0; i < p->size; i++) {
        tp->peers[i].fd = -1;
        tp->peers[i].rank = i;
        if (tp->nstreams > 1 && i != p->rank) {
            tp->peers[i].lanes = calloc((size_t)tp->nstreams - 1, sizeof(tcp_lane_t));
            if (!tp->peers[i].lanes) {
                st = loom_err_set(p->err, LOOM_ERR_NO_MEMORY, "out of memory");
                goto err_free_peers;
            }
            for (int k = 1; k < tp->nstreams; k++) {
                tp->peers[i].lanes[k - 1].fd = -1;
                tp->peers[i].lanes[k - 1].idx = k;
            }
        }
    }

    char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2];
    if ((st = loom_tp_choose_host(p, host, sizeof(host))) != LOOM_SUCCESS)
        goto err_free_peers;
    struct sockaddr_storage ss;
    socklen_t sslen;
    st = loom_hs_listen(host, tp->sockbuf, &tp->listen_fd, &ss, &sslen, p->err, "");
    if (st != LOOM_SUCCESS)
        goto err_free_peers;
    if (format_addr((struct sockaddr *)&ss, addr, addrlen) != 0 ||
        strlen(addr) >= sizeof(tp->my_addr)) {
        st = loom_err_set(p->err, LOOM_ERR_INTERNAL, "address buffer too small");
        goto err_close_listen;
    }
    snprintf(tp->my_addr, sizeof(tp->my_addr), "%s", addr);
    tp->epfd = epoll_create1(EPOLL_CLOEXEC);
    tp->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (tp->epfd < 0 || tp->wake_fd < 0) {
        st = loom_err_set(p->err, LOOM_ERR_TRANSPORT, "epoll/eventfd: %s", strerror(errno));
        goto err_close_ep;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 0};
    epoll_ctl(tp->epfd, EPOLL_CTL_ADD, tp->wake_fd, &ev);
    LOOM_INFO("tcp", "rank %d listens on %s", tp->rank, addr);
    *tp_p = tp;
    return LOOM_SUCCESS;

err_close_ep:
    if (tp->epfd >= 0)
        close(tp->epfd);
    if (tp->wake_fd >= 0)
        close(tp->wake_fd);
err_close_listen:
    close(tp->listen_fd);
err_free_peers:
    for (int i = 0; i < p->size; i++)
        free(tp->peers[i].lanes);
    free(tp->peers);
err_free_tp:
    free(tp);
    return st;
}

/* ---- connect: every pair at once, one state machine per socket ------------ */

/* The socket of stream k (0: the one every frame is matched on) to rank j. */
static int *stream_fd(loom_tp_t *tp, int j, int k)
{
    return k == 0 ? &tp->peers[j].fd : &tp->peers[j].lanes[k - 1].fd;
}

static int peer_connected(loom_tp_t *tp, int j)
{
    for (int k = 0; k < tp->nstreams; k++)
        if (*stream_fd(tp, j, k) < 0)
            return 0;
    return 1;
}

/* Both ends proved the key: every frame from now on is sealed. Each stream
 * has keys of its own (its own nonces), so no frame of one stream passes for
 * another's. */
static int session_start(const loom_tp_t *tp, tcp_peer_t *peer, const loom_hs_conn_t *c,
                         int connector)
{
    uint8_t c2a[32], a2c[32];
    tcp_lane_t *lane = c->stream ? &peer->lanes[c->stream - 1] : NULL;
    loom_seal_t *tx = lane ? &lane->tx_seal : &peer->tx_seal, *rx = lane ? &lane->rx_seal : &peer->rx_seal;
    loom_session_keys(tp->auth_key, tp->auth_keylen, c->nonce_c, c->nonce_a, c->bind, c2a, a2c);
    loom_seal_fini(tx);
    loom_seal_fini(rx);
    int bad = loom_seal_init(tx, tp->cipher, connector ? c2a : a2c, 1) != 0 ||
              loom_seal_init(rx, tp->cipher, connector ? a2c : c2a, 0) != 0;
    if (lane) {
        lane->mac = tp->mac_mode;
        lane->tx_seq = lane->rx_seq = 0;
    } else {
        peer->mac = tp->mac_mode;
        peer->tx_seq = peer->rx_seq = 0;
    }
    explicit_bzero(c2a, sizeof(c2a));
    explicit_bzero(a2c, sizeof(a2c));
    return bad ? -1 : 0;
}

/* One connect: who we are to the hello handshake, and why we last refused a
 * connection that looked like one of ours (for the timeout's message). */
typedef struct tcp_hs {
    loom_tp_t *tp;
    loom_hs_self_t self;
    loom_ack_code_t refused;
} tcp_hs_t;

static int hs_taken(void *arg, int rank, int stream)
{
    return *stream_fd(arg, rank, stream) >= 0;
}

/* The step of one connection (tp_handshake.h); an established one hands its
 * socket to its peer's stream. */
static int hs_step(void *arg, loom_hs_table_t *t, loom_hs_conn_t *c, double now)
{
    tcp_hs_t *h = arg;
    loom_tp_t *tp = h->tp;
    int up = 0;
    (void)t;
    if (loom_hs_hello_step(&h->self, c, now, &up, &h->refused) != LOOM_SUCCESS || !up)
        return 0;
    if (tp->auth_key && session_start(tp, &tp->peers[c->peer], c, !c->accepted) != 0) {
        tp_fail(tp, LOOM_ERR_NO_MEMORY, "libcrypto could not set up the %s keys of the "
                "connection to rank %d", loom_aead_name(tp->cipher), c->peer);
        return 0;
    }
    *stream_fd(tp, c->peer, c->stream) = c->fd;
    c->fd = -1;
    return 1;
}

static void hs_drop(void *arg, loom_hs_conn_t *c)
{
    (void)arg;
    loom_hs_close(c);
}

static void hs_timed_out(void *arg, loom_hs_table_t *t)
{
    tcp_hs_t *h = arg;
    loom_tp_t *tp = h->tp;
    char missing[256] = "";
    size_t off = 0;
    for (int j = 0; j < tp->size && off < sizeof(missing) - 16; j++)
        if (j != tp->rank && t->addrs[j] != NULL && !peer_connected(tp, j))
            off += (size_t)snprintf(missing + off, sizeof(missing) - off, "%s%d", off ? "," : "",
                                    j);
    loom_ack_code_t r = h->refused;
    loom_status_t st = r == LOOM_ACK_OK ? LOOM_ERR_TIMEOUT
                       : r == LOOM_ACK_STREAMS ? LOOM_ERR_INVALID_ARG : LOOM_ERR_AUTH;
    tp_fail(tp, st, "rank %d timed out after %.1f s connecting to rank(s) %s%s%s%s", tp->rank,
            t->timeout_s, missing,
            r ? " (it refused a connection: " : "", r ? loom_ack_reason(r) : "", r ? ")" : "");
}

/* The connected sockets join the epoll set; each peer gets its staging buffer. */
static loom_status_t register_peers(loom_tp_t *tp, char *const *addrs)
{
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (j == tp->rank || addrs[j] == NULL)
            continue;
        loom_hs_sock_opts(peer->fd, 0);
        peer->heard_at = tp->last_moved = loom_now_s();
        peer->stage = malloc(STAGE_BYTES);
        if (!peer->stage)
            return tp_fail(tp, LOOM_ERR_NO_MEMORY, "out of memory");
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = EV_KEY(j, 0)};
        if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, peer->fd, &ev) != 0)
            return tp_fail(tp, LOOM_ERR_TRANSPORT, "epoll_ctl: %s", strerror(errno));
        for (int k = 1; k < tp->nstreams; k++) {
            tcp_lane_t *lane = &peer->lanes[k - 1];
            loom_hs_sock_opts(lane->fd, 0);
            /* Read only once stream 0 says where its bytes go (lane_events). */
            lane->events = EPOLLRDHUP;
            struct epoll_event lev = {.events = lane->events, .data.u64 = EV_KEY(j, k)};
            if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, lane->fd, &lev) != 0)
                return tp_fail(tp, LOOM_ERR_TRANSPORT, "epoll_ctl: %s", strerror(errno));
        }
    }
    return LOOM_SUCCESS;
}

/* The handshake's name for our LOOM_AUTH_MAC. */
static int p_mac_mode(const loom_tp_t *tp)
{
    return tp->mac_mode == MAC_HEADERS ? LOOM_AUTH_MAC_HEADERS
           : tp->mac_mode == MAC_ENCRYPT ? LOOM_AUTH_MAC_ENCRYPT
                                         : LOOM_AUTH_MAC_FULL;
}

static loom_status_t tcp_connect(loom_tp_t *tp, char *const *addrs, double timeout_s)
{
    static const loom_hs_ops_t ops = {.step = hs_step, .drop = hs_drop,
                                      .timed_out = hs_timed_out};
    /* Rank r dials every lower rank and accepts every higher one; a NULL
     * address is a peer another transport serves. Every pair has nstreams
     * connections, dialled by the same rank. */
    int nout = 0, nin = 0, nstreams = tp->nstreams;
    for (int j = 0; j < tp->size; j++)
        if (j != tp->rank && addrs[j] != NULL)
            *(j < tp->rank ? &nout : &nin) += 1;
    tcp_hs_t h = {.tp = tp,
                  .self = {.rank = tp->rank, .size = tp->size, .job_hash = tp->job_hash,
                           .comm_hash = tp->comm_hash, .key = tp->auth_key,
                           .keylen = tp->auth_keylen, .mac_mode = p_mac_mode(tp),
                           .chacha = tp->cipher == LOOM_AEAD_CHACHA20_POLY1305,
                           .nstreams = nstreams, .my_addr = tp->my_addr, .addrs = addrs,
                           .taken = hs_taken, .arg = tp, .failed = &tp->failed, .err = tp->err,
                           .subsys = "tcp"}};
    loom_hs_table_t t;
    loom_hs_params_t hp = {
        .rank = tp->rank, .ndial = nout * nstreams, .naccept = nin * nstreams,
        .timeout_s = timeout_s, .failed = &tp->failed, .err = tp->err, .subsys = "tcp",
        .prefix = "", .addrs = addrs, .listen_fd = tp->listen_fd, .sockbuf = tp->sockbuf,
        .accept_step = LOOM_HS_WAIT_HELLO, .accept_need = LOOM_HELLO_BYTES};
    if (loom_hs_table_init(&t, &hp) != 0)
        goto out;
    for (int j = 0; j < tp->rank; j++) {
        if (addrs[j] == NULL)
            continue;
        if (parse_addr(addrs[j], &t.ss[j], &t.sslen[j]) != 0) {
            tp_fail(tp, LOOM_ERR_INVALID_ARG, "rank %d published a bad address \"%s\"", j,
                    addrs[j]);
            goto out;
        }
        for (int k = 0; k < nstreams; k++)
            if (loom_hs_table_dial(&t, j, k, &t.ss[j], t.sslen[j]) != 0)
                goto out;
    }
    if (loom_hs_run(&t, &ops, &h) != LOOM_SUCCESS)
        goto out;
    if (register_peers(tp, addrs) != LOOM_SUCCESS)
        goto out;
    LOOM_INFO("tcp", "rank %d connected to %d peers, %d stream%s each", tp->rank, nout + nin,
              nstreams, nstreams > 1 ? "s" : "");
out:
    loom_hs_table_free(&t);
    close(tp->listen_fd);
    tp->listen_fd = -1;
    return tp->failed;
}

static void lane_hangup(loom_tp_t *tp, tcp_peer_t *peer, tcp_lane_t *lane, uint32_t events)
{
    if (events & EPOLLERR) {
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        getsockopt(lane->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (!peer->said_bye && !peer->gave_up) {
            tcp_lane_lost(tp, peer, lane, soerr ? strerror(soerr) : "connection error");
            return;
        }
        epoll_ctl(tp->epfd, EPOLL_CTL_DEL, lane->fd, NULL);
        close(lane->fd);
        lane->fd = -1;
        return;
    }
    lane->eof = 1;
    lane_events(tp, peer, lane);
}

/* A failed instance tells its peers at once, so that none waits for it until
 * LOOM_TIMEOUT while this process lives on (a rank that found a mismatch, or
 * one busy rebuilding an elastic job): a gave-up frame where the stream is
 * between two frames, then the write side shut, which ends the peer's stream. */
static void announce_failure(loom_tp_t *tp)
{
    if (tp->announced)
        return;
    tp->announced = 1;
    uint8_t gave_up[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    int why = atomic_load(&tp->abort_why);
    loom_tp_fault_keep(&tp->fault, &(loom_tp_fault_t){
        .culprit = -1, .reporter = tp->rank,
        .why = tp->failed ? tp->failed : why ? (loom_status_t)why : LOOM_ERR_ABORTED});
    loom_frame_t f;
    loom_gave_up_encode(&tp->fault, &f);
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (j == tp->rank)
            continue;
        /* Streams 1.. end after stream 0 said why, so a peer reading both
         * learns that we gave up rather than that a stream broke. */
        if (peer->fd < 0)
            goto shut_lanes;
        int between = !peer->shdr_ready || (peer->shdr_off == 0 && peer->sq.head->off == 0);
        if (!between)
            goto shut;
        /* A frame prepared but not started never goes out: this one takes its
         * number (its nonce was never seen on the wire: nothing of it left). */
        if (peer->shdr_ready)
            peer->tx_seq = peer->shdr_seq;
        uint64_t seq;
        size_t len = seal_header(peer, &f, gave_up, &seq);
        if (send(peer->fd, gave_up, len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
            /* no room or gone: the shut write side says enough */
        }
shut:
        shutdown(peer->fd, SHUT_WR);
shut_lanes:
        for (int k = 1; k < tp->nstreams && peer->lanes; k++)
            if (peer->lanes[k - 1].fd >= 0)
                shutdown(peer->lanes[k - 1].fd, SHUT_WR);
    }
}

/* Tell every peer we send nothing to right now that we are alive (a peer
 * we are sending to hears our bytes): one header, written whole or not at
 * all, so the stream stays framed. */
static void send_keepalives(loom_tp_t *tp)
{
    uint8_t hdr[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
    loom_frame_t f = {.kind = LOOM_FRAME_KEEPALIVE};
    for (int j = 0; j < tp->size && !tp->failed; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        int queued = 0;
        if (j == tp->rank || peer->fd < 0 || peer->gave_up || peer->said_bye ||
            peer->sq.head || peer->shdr_ready)
            continue;
        /* Unread bytes in the way: the header may not fit whole, and a peer
         * that reads nothing is not waiting for news of us. */
        if (ioctl(peer->fd, SIOCOUTQ, &queued) != 0 || queued > 1024)
            continue;
        uint64_t seq, seq_before = peer->tx_seq;
        size_t len = seal_header(peer, &f, hdr, &seq);
        ssize_t n = send(peer->fd, hdr, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == (ssize_t)len)
            continue;
        if (n <= 0) {
            peer->tx_seq = seq_before;   /* not sent: the number is the next frame's */
            continue;
        }
        tp_lost(tp, j, "lost the connection to rank %d: a keepalive went out in part", j);
    }
}

static loom_status_t progress_owned(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    int moved = 0;
    if (!tp->failed) {
        int why = atomic_load(&tp->abort_why);
        if (why)
            tp_fail(tp, (loom_status_t)why, "the communicator was aborted");
    }
    if (tp->failed) {
        *moved_p = 0;
        return tp->failed;
    }
    double now = loom_now_s();
    if (now >= tp->keepalive_at && now - tp->last_moved >= tp->keepalive_idle_s) {
        tp->keepalive_at = now + LOOM_TP_KEEPALIVE_S;
        send_keepalives(tp);
        if (tp->failed) {
            *moved_p = 0;
            return tp->failed;
        }
    }
    struct epoll_event evs[MAX_EVENTS];
    int n = epoll_wait(tp->epfd, evs, MAX_EVENTS, timeout_ms);
    if (n > 0)
        now = loom_now_s();
    for (int i = 0; i < n && !tp->failed; i++) {
        uint64_t key = evs[i].data.u64;
        if (key)
            tp->peers[(key >> 8) - 1].heard_at = now;
        if (key) {
            tcp_peer_t *peer = &tp->peers[(key >> 8) - 1];
            int k = (int)(key & 0xff);
            if (k > 0) {
                tcp_lane_t *lane = &peer->lanes[k - 1];
                uint32_t e = evs[i].events;
                if (lane->fd >= 0 && (e & EPOLLIN))
                    tcp_lane_read(tp, peer, lane, &moved);
                if (!tp->failed && lane->fd >= 0 && (e & EPOLLOUT))
                    tcp_lane_flush(tp, peer, lane, &moved);
                if (!tp->failed && lane->fd >= 0 && !(lane->events & EPOLLIN) &&
                    (e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
                    lane_hangup(tp, peer, lane, e);
                continue;
            }
        }
        tcp_peer_t *peer = key ? &tp->peers[(key >> 8) - 1] : NULL;
        if (!peer) {
            uint64_t v;
            if (read(tp->wake_fd, &v, sizeof(v)) < 0) { /* nothing to drain */ }
            int why = atomic_load(&tp->abort_why);
            if (why)
                tp_fail(tp, (loom_status_t)why, "the communicator was aborted");
            continue;
        }
        if (peer->fd < 0)
            continue;
        if (peer->held && (evs[i].events & (EPOLLHUP | EPOLLERR))) {
            tp_lost(tp, peer->rank, "lost the connection to rank %d", peer->rank);
            break;
        }
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
            tcp_handle_read(tp, peer, &moved);
        if (!tp->failed && peer->fd >= 0 && (evs[i].events & EPOLLOUT))
            tcp_flush_sends(tp, peer, &moved);
    }
    if (moved)
        tp->last_moved = now;
    *moved_p = moved;
    return tp->failed;
}

/* Who may touch the sockets: see loom_tp_own. The owner tells the peers of a
 * failure on its way out. */
#define disown(tp, st) loom_tp_leave(&(tp)->owner, &(tp)->failed, announce_failure, tp, st)

static loom_status_t tcp_isend(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, tcp_isend_owned(tp, req));
}

static loom_status_t tcp_irecv(loom_tp_t *tp, loom_tp_req_t *req)
{
    loom_tp_own(&tp->owner);
    return disown(tp, tcp_irecv_owned(tp, req));
}

/* Early messages, and the collective frame held in the socket (never a
 * user's: only collective frames are held). */
static int tcp_probe(loom_tp_t *tp, int rank, uint64_t tag)
{
    loom_tp_own(&tp->owner);
    const tcp_peer_t *peer = &tp->peers[rank];
    int found = (peer->held && peer->cur.match.tag == tag) || loom_unexp_probe(&peer->uq, tag);
    loom_tp_disown(&tp->owner);
    return found;
}

static loom_status_t tcp_progress(loom_tp_t *tp, int timeout_ms, int *moved_p)
{
    loom_tp_own(&tp->owner);
    return disown(tp, progress_owned(tp, timeout_ms, moved_p));
}

static void tcp_abort(loom_tp_t *tp, loom_status_t why)
{
    int expected = 0;
    atomic_compare_exchange_strong(&tp->abort_why, &expected, (int)why);
    uint64_t one = 1;
    if (write(tp->wake_fd, &one, sizeof(one)) < 0) { /* already signalled */ }
    /* Nobody progressing (the failed call has returned, or none runs): tell
     * the peers now; otherwise the owner does when it sees abort_why. */
    if (loom_tp_own_if_idle(&tp->owner)) {
        announce_failure(tp);
        loom_tp_disown(&tp->owner);
    }
}

static void tcp_give_up(loom_tp_t *tp, loom_status_t why, const loom_tp_fault_t *fault)
{
    loom_tp_own(&tp->owner);
    loom_tp_fault_keep(&tp->fault, fault);
    loom_tp_disown(&tp->owner);
    tcp_abort(tp, why);
}

static int tcp_fault(loom_tp_t *tp, loom_tp_fault_t *fault_p)
{
    return loom_tp_fault_get(&tp->fault, fault_p);
}

static double tcp_silent_s(loom_tp_t *tp, int peer)
{
    if (peer < 0 || peer >= tp->size || peer == tp->rank || tp->peers[peer].heard_at <= 0)
        return -1;
    return loom_now_s() - tp->peers[peer].heard_at;
}

/* Write all of buf within the deadline (used for the farewell only). */
static int send_all(int fd, const void *buf, size_t len, double deadline)
{
    size_t off = 0;
    while (off < len) {
        ssize_t n = send(fd, (const uint8_t *)buf + off, len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        int ms = (int)((deadline - loom_now_s()) * 1000);
        if (ms <= 0)
            return -1;
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        poll(&pfd, 1, ms);
    }
    return 0;
}

static void tcp_destroy(loom_tp_t *tp, double timeout_s)
{
    LOOM_INFO("tcp", "rank %d received %llu frames, %llu before their receive was posted "
              "(%llu bytes copied once more)", tp->rank, (unsigned long long)tp->nframes,
              (unsigned long long)tp->nunexpected, (unsigned long long)tp->unexpected_bytes);
    if (tp->nstreams > 1)
        LOOM_INFO("tcp", "rank %d striped %llu messages it sent and %llu it received across %d "
                  "streams per peer", tp->rank, (unsigned long long)tp->nstriped_sent,
                  (unsigned long long)tp->nstriped_recv, tp->nstreams);
    double deadline = loom_now_s() + (timeout_s < 5 ? timeout_s : 5);
    if (tp->failed || atomic_load(&tp->abort_why))
        announce_failure(tp);
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        if (peer->fd < 0)
            continue;
        if (!tp->announced && !peer->sq.head && !peer->sx_head) {
            /* (a failed instance has announced) */
            /* Say goodbye, so the peer can tell a finished rank from a dead one. */
            uint8_t bye[LOOM_FRAME_BYTES + LOOM_MAC_BYTES];
            loom_frame_t f = {.kind = LOOM_FRAME_BYE};
            uint64_t seq;
            size_t len = seal_header(peer, &f, bye, &seq);
            send_all(peer->fd, bye, len, deadline);
        }
        shutdown(peer->fd, SHUT_WR);
        /* Closed with bytes unread (a keepalive), the socket would reset the
         * connection and drop what we sent that is still on its way. */
        uint8_t sink[4096];
        for (int i = 0; i < 64 && recv(peer->fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; i++) {
        }
        close(peer->fd);
    }
    for (int j = 0; j < tp->size; j++)
        for (int k = 1; k < tp->nstreams && tp->peers[j].lanes; k++) {
            tcp_lane_t *lane = &tp->peers[j].lanes[k - 1];
            if (lane->fd >= 0) {
                shutdown(lane->fd, SHUT_WR);
                close(lane->fd);
            }
        }
    for (int j = 0; j < tp->size; j++) {
        tcp_peer_t *peer = &tp->peers[j];
        loom_unexp_free_all(&peer->uq);
        free(peer->stage);
        /* Requests a failed instance left pending are the caller's: only ours are freed. */
        for (tcp_xfer_t *x = peer->sx_head, *next; x; x = next) {
            next = x->next;
            free(x);
        }
        for (tcp_xfer_t *x = peer->rx_head, *next; x; x = next) {
            next = x->next;
            free(x);
        }
        loom_seal_fini(&peer->tx_seal);
        loom_seal_fini(&peer->rx_seal);
        free(peer->ct);
        for (int k = 1; k < tp->nstreams && peer->lanes; k++) {
            loom_seal_fini(&peer->lanes[k - 1].tx_seal);
            loom_seal_fini(&peer->lanes[k - 1].rx_seal);
            free(peer->lanes[k - 1].ct);
        }
        free(peer->lanes);
    }
    for (int i = 0; i < POOL_SLOTS; i++)
        free(tp->pool[i].buf);
    if (tp->listen_fd >= 0)
        close(tp->listen_fd);
    close(tp->epfd);
    close(tp->wake_fd);
    free(tp->peers);
    free(tp);
}

/* Every peer: the transport of last resort. */
static int tcp_reaches(loom_tp_t *tp, int peer, const char *peer_addr, int same_host)
{
    return 1;
}

/* The interfaces it may listen on and dial from (LOOM_SOCKET_IFNAME picks one). */
static void tcp_describe(FILE *out)
{
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0) {
        fprintf(out, "#   no network interfaces (getifaddrs: %s)\n", strerror(errno));
        return;
    }
    for (struct ifaddrs *ifa = ifs; ifa; ifa = ifa->ifa_next) {
        if (!ifa->ifa_addr ||
            (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6))
            continue;
        char host[INET6_ADDRSTRLEN];
        const void *a = ifa->ifa_addr->sa_family == AF_INET
                            ? (const void *)&((struct sockaddr_in *)ifa->ifa_addr)->sin_addr
                            : (const void *)&((struct sockaddr_in6 *)ifa->ifa_addr)->sin6_addr;
        inet_ntop(ifa->ifa_addr->sa_family, a, host, sizeof(host));
        fprintf(out, "#   %-12s %-40s %s%s\n", ifa->ifa_name, host,
                (ifa->ifa_flags & IFF_UP) ? "up" : "down",
                (ifa->ifa_flags & IFF_LOOPBACK) ? " loopback" : "");
    }
    freeifaddrs(ifs);
}

const loom_transport_ops_t loom_tcp_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "tcp",
    .medium = "TCP",
    .create = tcp_create,
    .connect = tcp_connect,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .probe = tcp_probe,
    .progress = tcp_progress,
    .mem_register = NULL,
    .mem_deregister = NULL,
    .abort = tcp_abort,
    .give_up = tcp_give_up,
    .fault = tcp_fault,
    .silent_s = tcp_silent_s,
    .destroy = tcp_destroy,
    .reaches = tcp_reaches,
    .describe = tcp_describe,
};
