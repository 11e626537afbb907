/* tcp_server.c - the tcp:// store's server: one thread, epoll over
 * non-blocking sockets. The wire format is described in store/proto.h; the
 * client is store/tcp_client.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/crypto.h"
#include "store.h"
#include "proto.h"
#include "tcp_int.h"
#include "tcp_srv.h"

/* Buffers above this are freed once idle, so thousands of clients that once
 * sent a big value do not pin memory. */
#define IDLE_BUF_MAX (1u << 20)

/* ---- The server. ----------------------------------------------------------------
 *
 * One thread owns everything below; the only outside contact is the eventfd
 * that loom_store_server_stop writes. Each client is a small state machine: the
 * hello, then a request header, then its payload. While a client has a response
 * pending or a WAIT parked, its input is not read (the protocol has one request
 * in flight), which also bounds its buffers to one request.
 *
 * Anyone who reaches the port is a client, so what one may take is bounded
 * (loom_store_limits_t): a deadline for the hello, an idle timeout, connection
 * caps in total and per source address, and a byte quota over keys, values and
 * request payloads. Values are shared blobs, so a GET costs no copy however
 * slowly its client reads, and a replaced value a reader still holds counts
 * against the quota until it is sent. */
/* What an entry costs the quota besides its value. */
#define ENTRY_COST(klen) (sizeof(srv_entry_t) + (size_t)(klen) + 1)
/* How often connections are checked against their deadlines. */
#define SWEEP_S 0.25

static srv_blob_t *blob_new(loom_store_server_t *srv, const void *val, uint32_t len)
{
    srv_blob_t *b = malloc(sizeof(*b) + len);
    if (b == NULL)
        return NULL;
    b->refs = 1;
    b->len = len;
    if (len > 0)
        memcpy(b->data, val, len);
    srv->held += sizeof(*b) + len;
    return b;
}

static void blob_unref(loom_store_server_t *srv, srv_blob_t *b)
{
    if (b != NULL && --b->refs == 0) {
        srv->held -= sizeof(*b) + b->len;
        free(b);
    }
}

/* Whether the quota has room for n more bytes. */
static int quota_has(const loom_store_server_t *srv, uint64_t n)
{
    return srv->held <= srv->lim.max_bytes && n <= srv->lim.max_bytes - srv->held;
}

static uint64_t key_hash(const char *key, size_t len)
{
    /* FNV-1a: keys are short and mostly distinct in their last bytes. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

static void table_grow(loom_store_server_t *srv)
{
    size_t n = srv->tab_size * 2;
    srv_entry_t **tab = calloc(n, sizeof(*tab));
    if (tab == NULL)
        return;  /* keep the old table: longer chains, still correct */
    for (size_t i = 0; i < srv->tab_size; i++) {
        srv_entry_t *e = srv->tab[i];
        while (e != NULL) {
            srv_entry_t *next = e->next;
            size_t j = e->hash & (n - 1);
            e->next = tab[j];
            tab[j] = e;
            e = next;
        }
    }
    free(srv->tab);
    srv->tab = tab;
    srv->tab_size = n;
}

static srv_entry_t *entry_find(loom_store_server_t *srv, const char *key, uint32_t klen,
                               uint64_t h, int create)
{
    for (srv_entry_t *e = srv->tab[h & (srv->tab_size - 1)]; e != NULL; e = e->next)
        if (e->hash == h && e->klen == klen && memcmp(e->key, key, klen) == 0)
            return e;
    if (!create)
        return NULL;
    if (srv->n_entries >= srv->tab_size)
        table_grow(srv);
    srv_entry_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    e->key = malloc((size_t)klen + 1);
    if (e->key == NULL) {
        free(e);
        return NULL;
    }
    memcpy(e->key, key, klen);
    e->key[klen] = '\0';
    e->klen = klen;
    e->hash = h;
    srv->held += ENTRY_COST(klen);
    size_t i = h & (srv->tab_size - 1);
    e->next = srv->tab[i];
    srv->tab[i] = e;
    srv->n_entries++;
    return e;
}

/* Free e if it holds neither a value nor waiters. */
static void entry_maybe_free(loom_store_server_t *srv, srv_entry_t *e)
{
    if (e->present || e->waiters != NULL)
        return;
    srv_entry_t **pp = &srv->tab[e->hash & (srv->tab_size - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    srv->n_entries--;
    srv->held -= ENTRY_COST(e->klen);
    blob_unref(srv, e->val);
    free(e->key);
    free(e);
}

static int entry_set(loom_store_server_t *srv, srv_entry_t *e, const void *val, uint32_t len)
{
    srv_blob_t *v = blob_new(srv, val, len);
    if (v == NULL)
        return -1;
    blob_unref(srv, e->val);
    e->val = v;
    e->present = 1;
    return 0;
}

static void park(loom_store_server_t *srv, srv_client_t *c, srv_entry_t *e, double deadline)
{
    c->parked = e;
    c->deadline = deadline;
    c->wprev = NULL;
    c->wnext = e->waiters;
    if (e->waiters != NULL)
        e->waiters->wprev = c;
    e->waiters = c;
    srv->n_parked++;
}

static void unpark(loom_store_server_t *srv, srv_client_t *c)
{
    srv_entry_t *e = c->parked;
    if (c->wprev != NULL)
        c->wprev->wnext = c->wnext;
    else
        e->waiters = c->wnext;
    if (c->wnext != NULL)
        c->wnext->wprev = c->wprev;
    c->parked = NULL;
    c->wprev = c->wnext = NULL;
    srv->n_parked--;
    c->last_active = loom_now_s();   /* its idle time starts when the WAIT ends */
}

static int can_read(const srv_client_t *c)
{
    return !c->closing && c->parked == NULL && c->out_len == 0 && c->out_blob == NULL;
}

static int has_output(const srv_client_t *c)
{
    return c->out_off < c->out_len || c->out_blob != NULL;
}

static void update_interest(loom_store_server_t *srv, srv_client_t *c)
{
    if (c->dead)
        return;
    uint32_t want = EPOLLRDHUP | (can_read(c) ? EPOLLIN : 0) | (has_output(c) ? EPOLLOUT : 0);
    if (want == c->events)
        return;
    struct epoll_event ev = { .events = want, .data.ptr = c };
    epoll_ctl(srv->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->events = want;
}

static void drop(loom_store_server_t *srv, srv_client_t *c)
{
    if (c->dead)
        return;
    epoll_ctl(srv->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->parked != NULL) {
        srv_entry_t *e = c->parked;
        unpark(srv, c);
        entry_maybe_free(srv, e);
    }
    blob_unref(srv, c->out_blob);
    c->out_blob = NULL;
    srv->held -= c->reserved;
    c->reserved = 0;
    srv->n_clients--;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        srv->clients = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    /* Freed at the end of the loop round: this round's events may still name it. */
    c->dead = 1;
    c->next = srv->dead;
    srv->dead = c;
}

static void free_client(srv_client_t *c)
{
    free(c->in);
    free(c->out);
    free(c);
}

static int flush(loom_store_server_t *srv, srv_client_t *c)
{
    while (has_output(c)) {
        struct iovec iov[2];
        int n = 0;
        size_t head = c->out_len - c->out_off;
        if (head > 0)
            iov[n++] = (struct iovec){ c->out + c->out_off, head };
        if (c->out_blob != NULL)
            iov[n++] = (struct iovec){ c->out_blob->data + c->blob_off,
                                       c->out_blob->len - c->blob_off };
        struct msghdr mh = { .msg_iov = iov, .msg_iovlen = (size_t)n };
        ssize_t r = n > 0 ? sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
        if (r >= 0) {
            size_t done = (size_t)r, h = done < head ? done : head;
            c->out_off += h;
            if (c->out_blob != NULL) {
                c->blob_off += done - h;
                if (c->blob_off == c->out_blob->len) {
                    blob_unref(srv, c->out_blob);
                    c->out_blob = NULL;
                }
            }
            if (r == 0 && n > 0)
                return 0;
        } else if (errno == EINTR)
            continue;
        else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        else
            return -1;
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > IDLE_BUF_MAX) {
        free(c->out);
        c->out = NULL;
        c->out_cap = 0;
    }
    return 0;
}

static int out_append(srv_client_t *c, const void *p, size_t n)
{
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + n)
            cap *= 2;
        uint8_t *o = realloc(c->out, cap);
        if (o == NULL)
            return -1;
        c->out = o;
        c->out_cap = cap;
    }
    if (n > 0)
        memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return 0;
}

/* Queue a response, with value val (may be NULL), and push out what the
 * socket takes now. -1: drop c. */
static int reply(loom_store_server_t *srv, srv_client_t *c, uint32_t rc, uint64_t arg,
                 srv_blob_t *val)
{
    loom_store_resp_t r = { .rc = rc, .vlen = val != NULL ? val->len : 0, .arg = arg };
    uint8_t h[LOOM_STORE_RESP_LEN];
    loom_store_resp_pack(h, &r);
    if (out_append(c, h, sizeof(h)) != 0)
        return -1;
    if (val != NULL && val->len > 0) {
        val->refs++;
        c->out_blob = val;
        c->blob_off = 0;
    }
    return flush(srv, c);
}

/* Answer everyone parked on e, which now has a value. */
static void wake(loom_store_server_t *srv, srv_entry_t *e)
{
    while (e->waiters != NULL) {
        srv_client_t *w = e->waiters;
        unpark(srv, w);
        if (reply(srv, w, LOOM_STORE_RC_OK, 0, NULL) != 0)
            drop(srv, w);
        else
            update_interest(srv, w);
    }
}

/* Carry out the complete request in c->in. -1: drop c. */
static int execute(loom_store_server_t *srv, srv_client_t *c)
{
    const loom_store_req_t *r = &c->req;
    const char *key = (const char *)c->in + LOOM_STORE_REQ_LEN;
    const uint8_t *a = (const uint8_t *)key + r->klen;
    const uint8_t *b = a + r->alen;
    uint64_t h = key_hash(key, r->klen);
    srv_entry_t *e = entry_find(srv, key, r->klen, h, 0);
    int present = e != NULL && e->present;

    /* A new key costs the quota too: a flood of ADDs to fresh keys fills it. */
    if (e == NULL && r->op != LOOM_STORE_OP_GET && r->op != LOOM_STORE_OP_DELETE &&
        r->op != LOOM_STORE_OP_WAIT && !quota_has(srv, ENTRY_COST(r->klen) + 64))
        return reply(srv, c, LOOM_STORE_RC_FULL, 0, NULL);

    switch (r->op) {
    case LOOM_STORE_OP_SET:
        if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
            return -1;
        if (entry_set(srv, e, a, r->alen) != 0) {
            entry_maybe_free(srv, e);
            return -1;
        }
        wake(srv, e);
        return reply(srv, c, LOOM_STORE_RC_OK, 0, NULL);

    case LOOM_STORE_OP_GET:
        if (!present)
            return reply(srv, c, LOOM_STORE_RC_NOT_FOUND, 0, NULL);
        return reply(srv, c, LOOM_STORE_RC_OK, 0, e->val);

    case LOOM_STORE_OP_WAIT:
        if (present)
            return reply(srv, c, LOOM_STORE_RC_OK, 0, NULL);
        if (r->arg == 0)
            return reply(srv, c, LOOM_STORE_RC_TIMEOUT, 0, NULL);
        if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
            return -1;
        park(srv, c, e, loom_now_s() + (double)r->arg / 1000.0);
        return 0;

    case LOOM_STORE_OP_ADD: {
        int64_t cur = 0, delta, sum;
        memcpy(&delta, &r->arg, sizeof(delta));
        if (present && loom_store_parse_int64(e->val->data, e->val->len, &cur) != 0)
            return reply(srv, c, LOOM_STORE_RC_NOT_INTEGER, 0, NULL);
        if (__builtin_add_overflow(cur, delta, &sum))
            return reply(srv, c, LOOM_STORE_RC_OVERFLOW, 0, NULL);
        char text[24];
        int n = snprintf(text, sizeof(text), "%" PRId64, sum);
        if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
            return -1;
        if (entry_set(srv, e, text, (uint32_t)n) != 0) {
            entry_maybe_free(srv, e);
            return -1;
        }
        wake(srv, e);
        uint64_t out;
        memcpy(&out, &sum, sizeof(out));
        return reply(srv, c, LOOM_STORE_RC_OK, out, NULL);
    }

    case LOOM_STORE_OP_CAS: {
        uint32_t clen = present ? e->val->len : 0;
        if (r->alen == clen && (clen == 0 || memcmp(a, e->val->data, clen) == 0)) {
            if (e == NULL && (e = entry_find(srv, key, r->klen, h, 1)) == NULL)
                return -1;
            if (entry_set(srv, e, b, r->blen) != 0) {
                entry_maybe_free(srv, e);
                return -1;
            }
            wake(srv, e);
            present = 1;
        }
        return reply(srv, c, LOOM_STORE_RC_OK, 0, present ? e->val : NULL);
    }

    case LOOM_STORE_OP_DELETE:
        if (present) {
            blob_unref(srv, e->val);
            e->val = NULL;
            e->present = 0;
            entry_maybe_free(srv, e);
        }
        return reply(srv, c, LOOM_STORE_RC_OK, present ? 1 : 0, NULL);
    }
    return -1;  /* unreachable: the header was validated */
}

static void reset_input(loom_store_server_t *srv, srv_client_t *c)
{
    srv->held -= c->reserved;
    c->reserved = 0;
    c->discard = 0;
    c->in_len = 0;
    c->need = LOOM_STORE_REQ_LEN;
    c->have_req = 0;
    if (c->in_cap > IDLE_BUF_MAX) {
        free(c->in);
        c->in = NULL;
        c->in_cap = 0;
    }
}

/* Answer the hello with word; closing: then drop the client. */
static int hello_answer(loom_store_server_t *srv, srv_client_t *c, uint32_t word, int closing,
                        const void *more, size_t morelen)
{
    uint8_t h[LOOM_STORE_HELLO_LEN];
    loom_store_hello_pack(h, LOOM_STORE_PROTO_VERSION, word);
    c->hello_done = word != LOOM_STORE_HELLO_CHALLENGE;
    c->closing = closing;
    reset_input(srv, c);
    if (out_append(c, h, sizeof(h)) != 0 || (morelen && out_append(c, more, morelen) != 0))
        return -1;
    return flush(srv, c);
}

/* The hello, and with a key on either side the nonces and proofs (store/proto.h):
 * nothing is served to a client before it proved the server's key. */
static int hello_step(loom_store_server_t *srv, srv_client_t *c)
{
    if (c->hs == 0) {
        if (memcmp(c->in, LOOM_STORE_MAGIC, LOOM_STORE_MAGIC_LEN) != 0)
            return -1;
        if (get32(c->in + 8) != LOOM_STORE_PROTO_VERSION)
            return hello_answer(srv, c, LOOM_STORE_HELLO_REFUSED, 1, NULL, 0);
        if (get32(c->in + 12) == LOOM_STORE_HELLO_AUTH) {
            c->hs = 1;
            c->in_len = 0;
            c->need = LOOM_STORE_NONCE_LEN;
            return 0;
        }
        if (srv->keylen)
            return hello_answer(srv, c, LOOM_STORE_HELLO_AUTH_REQUIRED, 1, NULL, 0);
        return hello_answer(srv, c, LOOM_STORE_HELLO_OK, 0, NULL, 0);
    }
    if (c->hs == 1) {
        memcpy(c->nonce_c, c->in, LOOM_STORE_NONCE_LEN);
        if (!srv->keylen)
            return hello_answer(srv, c, LOOM_STORE_HELLO_OK, 0, NULL, 0);
        uint8_t chal[LOOM_STORE_NONCE_LEN + LOOM_STORE_PROOF_LEN];
        if (getrandom(c->nonce_s, sizeof(c->nonce_s), 0) != (ssize_t)sizeof(c->nonce_s))
            return -1;
        memcpy(chal, c->nonce_s, sizeof(c->nonce_s));
        loom_store_auth_proof(srv->key, srv->keylen, 'S', c->nonce_c, c->nonce_s,
                              chal + LOOM_STORE_NONCE_LEN);
        if (hello_answer(srv, c, LOOM_STORE_HELLO_CHALLENGE, 0, chal, sizeof(chal)) != 0)
            return -1;
        c->hs = 2;
        c->in_len = 0;
        c->need = LOOM_STORE_PROOF_LEN;
        return 0;
    }
    uint8_t want[LOOM_STORE_PROOF_LEN];
    loom_store_auth_proof(srv->key, srv->keylen, 'C', c->nonce_c, c->nonce_s, want);
    if (!loom_equal_ct(want, c->in, sizeof(want)))
        return hello_answer(srv, c, LOOM_STORE_HELLO_REFUSED_AUTH, 1, NULL, 0);
    return hello_answer(srv, c, LOOM_STORE_HELLO_OK, 0, NULL, 0);
}

/* c->in holds c->need bytes: the hello, a header or a whole request. -1: drop c. */
static int process(loom_store_server_t *srv, srv_client_t *c)
{
    if (!c->hello_done)
        return hello_step(srv, c);
    if (!c->have_req) {
        if (loom_store_req_unpack(c->in, &c->req) != 0)
            return -1;
        c->have_req = 1;
        /* At most 24 + 1024 + 2 * 64 MiB: no overflow in size_t. */
        size_t payload = (size_t)c->req.klen + c->req.alen + c->req.blen;
        c->need = LOOM_STORE_REQ_LEN + payload;
        if (c->req.alen + (uint64_t)c->req.blen > 0 && !quota_has(srv, payload)) {
            /* Read the payload into nothing, then say why: the client learns the
             * store is full instead of seeing its connection drop. */
            c->discard = payload;
            return 0;
        }
        c->reserved = payload;
        srv->held += payload;
        return 0;
    }
    /* Keys are C strings on the client side; an embedded NUL is a forged request. */
    if (memchr(c->in + LOOM_STORE_REQ_LEN, 0, c->req.klen) != NULL)
        return -1;
    int rc = execute(srv, c);
    reset_input(srv, c);
    c->last_active = loom_now_s();
    return rc;
}

/* Read and drop what c->discard says is left of a refused request. -1: drop c,
 * 0: would block or done. */
static int discard_input(loom_store_server_t *srv, srv_client_t *c)
{
    uint8_t sink[16384];
    while (c->discard > 0) {
        size_t want = c->discard < sizeof(sink) ? (size_t)c->discard : sizeof(sink);
        ssize_t r = recv(c->fd, sink, want, 0);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
        }
        c->discard -= (uint64_t)r;
    }
    reset_input(srv, c);
    c->last_active = loom_now_s();
    return reply(srv, c, LOOM_STORE_RC_FULL, 0, NULL);
}

/* Read what c may send now and act on every complete unit. -1: drop c. */
static int client_read(loom_store_server_t *srv, srv_client_t *c)
{
    while (can_read(c)) {
        if (c->discard > 0) {
            if (discard_input(srv, c) != 0)
                return -1;
            if (c->discard > 0)
                return 0;
            continue;
        }
        if (c->in_len == c->need) {
            if (process(srv, c) != 0)
                return -1;
            continue;
        }
        if (c->in_len == c->in_cap) {
            /* Grow as bytes arrive, not to the announced length at once: a client
             * that announces 128 MiB and sends nothing should cost nothing. */
            size_t cap = c->in_cap < 4096 ? 4096 : c->in_cap * 2;
            if (cap > c->need)
                cap = c->need;
            uint8_t *in = realloc(c->in, cap);
            if (in == NULL)
                return -1;
            c->in = in;
            c->in_cap = cap;
        }
        size_t want = (c->need < c->in_cap ? c->need : c->in_cap) - c->in_len;
        ssize_t r = recv(c->fd, c->in + c->in_len, want, 0);
        if (r == 0)
            return -1;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -1;
        }
        c->in_len += (size_t)r;
    }
    return 0;
}

static void client_event(loom_store_server_t *srv, srv_client_t *c, uint32_t ev)
{
    if (c->dead)
        return;
    if (ev & EPOLLERR)
        goto drop_client;
    if ((ev & EPOLLOUT) && flush(srv, c) != 0)
        goto drop_client;
    if (can_read(c)) {
        if ((ev & (EPOLLIN | EPOLLHUP | EPOLLRDHUP)) && client_read(srv, c) != 0)
            goto drop_client;
    } else if (ev & (EPOLLHUP | EPOLLRDHUP)) {
        /* Gone while parked or while we had an answer for it: nobody to tell. */
        goto drop_client;
    }
    if (c->closing && !has_output(c))
        goto drop_client;
    update_interest(srv, c);
    return;

drop_client:
    drop(srv, c);
}

/* Whether c may be closed to make room: it has not finished its hello, or it
 * sits between requests with nothing parked (its owner reconnects). */
static int evictable(const srv_client_t *c)
{
    if (!c->hello_done)
        return 1;
    if (c->parked != NULL || has_output(c) || c->in_len != 0 || c->have_req || c->discard != 0)
        return 0;
    /* A request already on its way would be answered by EOF: keep that one. */
    char b;
    return recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && (errno == EAGAIN ||
                                                               errno == EWOULDBLOCK);
}

/* Close the oldest connection without a finished hello, else the longest
 * idle one, to make room for a new one. 0 when one was closed. */
static int evict_one(loom_store_server_t *srv)
{
    srv_client_t *victim = NULL;
    for (srv_client_t *c = srv->clients; c != NULL; c = c->next) {
        if (!evictable(c))
            continue;
        if (victim == NULL || (!c->hello_done && victim->hello_done) ||
            (c->hello_done == victim->hello_done &&
             (c->hello_done ? c->last_active < victim->last_active : c->since < victim->since)))
            victim = c;
    }
    if (victim == NULL)
        return -1;
    drop(srv, victim);
    return 0;
}

static void source_of(const struct sockaddr_storage *ss, uint8_t src[16], uint8_t *len_p)
{
    if (ss->ss_family == AF_INET6) {
        memcpy(src, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
        *len_p = 16;
    } else if (ss->ss_family == AF_INET) {
        memcpy(src, &((const struct sockaddr_in *)ss)->sin_addr, 4);
        *len_p = 4;
    } else {
        *len_p = 0;
    }
}

static long clients_from(const loom_store_server_t *srv, const uint8_t *src, uint8_t len)
{
    long n = 0;
    for (const srv_client_t *c = srv->clients; c != NULL; c = c->next)
        n += c->src_len == len && memcmp(c->src, src, len) == 0;
    return n;
}

static void accept_clients(loom_store_server_t *srv)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        int fd = accept4(srv->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            /* Out of descriptors: a stranger's idle connections must not keep
             * the ranks out, so one of them (or an idle client) goes. */
            if ((errno == EMFILE || errno == ENFILE) && evict_one(srv) == 0)
                continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* The listener stays readable while the backlog is full; stop
                 * watching it for a moment instead of spinning. */
                struct epoll_event ev = { .events = 0, .data.ptr = &srv->lfd };
                epoll_ctl(srv->ep, EPOLL_CTL_MOD, srv->lfd, &ev);
                srv->accept_resume = loom_now_s() + 0.1;
            }
            return;
        }
        uint8_t src[16], src_len;
        source_of(&ss, src, &src_len);
        if (src_len > 0 && clients_from(srv, src, src_len) >= srv->lim.max_clients_per_host) {
            close(fd);
            continue;
        }
        if ((long)srv->n_clients >= srv->lim.max_clients && evict_one(srv) != 0) {
            close(fd);
            continue;
        }
        srv_client_t *c = calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        c->fd = fd;
        c->need = LOOM_STORE_HELLO_LEN;
        c->events = EPOLLIN | EPOLLRDHUP;
        c->since = c->last_active = loom_now_s();
        memcpy(c->src, src, sizeof(src));
        c->src_len = src_len;
        struct epoll_event ev = { .events = c->events, .data.ptr = c };
        if (epoll_ctl(srv->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            free(c);
            continue;
        }
        c->next = srv->clients;
        if (srv->clients != NULL)
            srv->clients->prev = c;
        srv->clients = c;
        srv->n_clients++;
    }
}

static int expired(const loom_store_server_t *srv, const srv_client_t *c, double now)
{
    if (!c->hello_done)
        return now - c->since > srv->lim.hello_timeout_s;
    return c->parked == NULL && !has_output(c) && now - c->last_active > srv->lim.idle_timeout_s;
}

/* Close connections past their hello deadline, and clients idle too long. */
static void sweep(loom_store_server_t *srv, double now)
{
    srv_client_t *c_next;
restart:
    for (srv_client_t *c = srv->clients; c != NULL; c = c_next) {
        c_next = c->next;
        if (!expired(srv, c, now))
            continue;
        /* If this thread was starved, the bytes that keep c alive may wait
         * unread: act on them first. */
        client_event(srv, c, EPOLLIN);
        if (!c->dead && expired(srv, c, now))
            drop(srv, c);
        if (c_next != NULL && c_next->dead)
            goto restart;   /* answering c dropped others: the list changed */
    }
}

/* Answer parked WAITs whose time is up; returns the epoll timeout (ms) until
 * the next deadline, -1 for none. */
static int expire(loom_store_server_t *srv)
{
    double now = loom_now_s(), next = -1;

    if (srv->clients != NULL) {
        if (now >= srv->next_sweep) {
            sweep(srv, now);
            srv->next_sweep = now + SWEEP_S;
        }
        next = srv->next_sweep;
    }

    if (srv->accept_resume > 0) {
        if (now >= srv->accept_resume) {
            struct epoll_event ev = { .events = EPOLLIN, .data.ptr = &srv->lfd };
            epoll_ctl(srv->ep, EPOLL_CTL_MOD, srv->lfd, &ev);
            srv->accept_resume = 0;
        } else if (next < 0 || srv->accept_resume < next) {
            next = srv->accept_resume;
        }
    }
    if (srv->n_parked > 0) {
        srv_client_t *c_next;
        for (srv_client_t *c = srv->clients; c != NULL; c = c_next) {
            c_next = c->next;
            if (c->parked == NULL)
                continue;
            if (c->deadline <= now) {
                srv_entry_t *e = c->parked;
                unpark(srv, c);
                entry_maybe_free(srv, e);
                if (reply(srv, c, LOOM_STORE_RC_TIMEOUT, 0, NULL) != 0)
                    drop(srv, c);
                else
                    update_interest(srv, c);
            } else if (next < 0 || c->deadline < next) {
                next = c->deadline;
            }
        }
    }
    if (next < 0)
        return -1;
    double ms = (next - now) * 1000.0 + 1.0;
    return ms > (double)INT_MAX ? INT_MAX : (int)ms;
}
void *loom_store_server_run(void *arg)
{
    loom_store_server_t *srv = arg;
    struct epoll_event evs[64];
    int stop = 0;

    while (!stop) {
        int timeout = expire(srv);
        while (srv->dead != NULL) {
            srv_client_t *c = srv->dead;
            srv->dead = c->next;
            free_client(c);
        }
        int n = epoll_wait(srv->ep, evs, 64, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            break;  /* a bug (EBADF...): clients see their connections close */
        }
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &srv->wfd)
                stop = 1;
            else if (p == &srv->lfd)
                accept_clients(srv);
            else
                client_event(srv, p, evs[i].events);
        }
    }
    return NULL;
}
/* Everything of a server whose thread has ended (or never ran: the fuzzer,
 * tests/fuzz/fuzz_store_server.c, drives clients by hand). */
void loom_store_server_free(loom_store_server_t *srv)
{
    while (srv->clients != NULL)
        drop(srv, srv->clients);
    while (srv->dead != NULL) {
        srv_client_t *c = srv->dead;
        srv->dead = c->next;
        free_client(c);
    }
    for (size_t i = 0; i < srv->tab_size; i++) {
        srv_entry_t *e = srv->tab[i];
        while (e != NULL) {
            srv_entry_t *next = e->next;
            blob_unref(srv, e->val);
            free(e->key);
            free(e);
            e = next;
        }
    }
    free(srv->tab);
    close(srv->wfd);
    close(srv->ep);
    close(srv->lfd);
    free(srv);
}
