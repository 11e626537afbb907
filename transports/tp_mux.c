/* tp_mux.c - see tp_mux.h. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp_mux.h"

struct loom_tp {
    const loom_transport_ops_t *ops[LOOM_MUX_MAX];
    loom_tp_t *tps[LOOM_MUX_MAX];
    int ntp;
    int *route;
};

loom_status_t loom_mux_create(const loom_transport_ops_t *const *ops, loom_tp_t *const *tps,
                              int ntp, const int *route, int size, loom_err_t *err,
                              loom_tp_t **tp_p)
{
    loom_tp_t *m = calloc(1, sizeof(*m));
    int *rt = malloc(sizeof(int) * (size_t)size);
    if (!m || !rt || ntp > LOOM_MUX_MAX) {
        free(m);
        free(rt);
        return loom_err_set(err, LOOM_ERR_NO_MEMORY, "out of memory");
    }
    memcpy(rt, route, sizeof(int) * (size_t)size);
    for (int i = 0; i < ntp; i++) {
        m->ops[i] = ops[i];
        m->tps[i] = tps[i];
    }
    m->ntp = ntp;
    m->route = rt;
    *tp_p = m;
    return LOOM_SUCCESS;
}

static loom_status_t mux_isend(loom_tp_t *m, loom_tp_req_t *req)
{
    int i = m->route[req->peer];
    return m->ops[i]->isend(m->tps[i], req);
}

static loom_status_t mux_irecv(loom_tp_t *m, loom_tp_req_t *req)
{
    int i = m->route[req->peer];
    return m->ops[i]->irecv(m->tps[i], req);
}

/* Each transport sleeps in its own way (epoll, a futex), so while idle they
 * take turns sleeping a millisecond: waking up costs that much at most, and
 * only after the wait loop has stopped spinning. */
static loom_status_t mux_progress(loom_tp_t *m, int timeout_ms, int *moved_p)
{
    int moved = 0;
    for (int i = 0; i < m->ntp; i++) {
        int one = 0;
        loom_status_t st = m->ops[i]->progress(m->tps[i], 0, &one);
        if (st != LOOM_SUCCESS)
            return st;
        moved |= one;
    }
    for (int i = 0; i < m->ntp && !moved && timeout_ms != 0; i++) {
        loom_status_t st = m->ops[i]->progress(m->tps[i], 1, &moved);
        if (st != LOOM_SUCCESS)
            return st;
    }
    *moved_p = moved;
    return LOOM_SUCCESS;
}

static int mux_peer_readable(loom_tp_t *m, int peer)
{
    const loom_transport_ops_t *ops = m->ops[m->route[peer]];
    return ops->peer_readable && ops->peer_readable(m->tps[m->route[peer]], peer);
}

static loom_status_t mux_peer_read(loom_tp_t *m, int peer, void *buf, uint64_t addr, size_t len)
{
    int i = m->route[peer];
    return m->ops[i]->peer_read(m->tps[i], peer, buf, addr, len);
}

static int mux_probe(loom_tp_t *m, int peer, uint64_t tag)
{
    int i = m->route[peer];
    return m->ops[i]->probe && m->ops[i]->probe(m->tps[i], peer, tag);
}

static void *mux_window(loom_tp_t *m, int peer, size_t *len_p)
{
    int i = m->route[peer];
    return m->ops[i]->window ? m->ops[i]->window(m->tps[i], peer, len_p) : NULL;
}

/* Memory registration is the network transport's (shm has none). */
static loom_status_t mux_mem_register(loom_tp_t *m, void *buf, size_t len, void **handle_p)
{
    for (int i = 0; i < m->ntp; i++)
        if (m->ops[i]->mem_register)
            return m->ops[i]->mem_register(m->tps[i], buf, len, handle_p);
    *handle_p = NULL;
    return LOOM_SUCCESS;
}

static void mux_mem_deregister(loom_tp_t *m, void *handle)
{
    for (int i = 0; i < m->ntp; i++)
        if (m->ops[i]->mem_deregister) {
            m->ops[i]->mem_deregister(m->tps[i], handle);
            return;
        }
}

static void mux_abort(loom_tp_t *m, loom_status_t why)
{
    for (int i = 0; i < m->ntp; i++)
        m->ops[i]->abort(m->tps[i], why);
}

static int has_op(const loom_transport_ops_t *ops, size_t end)
{
    return ops->size >= end;
}
#define MUX_HAS(ops, op) \
    (has_op(ops, offsetof(loom_transport_ops_t, op) + sizeof((ops)->op)) && (ops)->op)

/* Every transport tells its peers the same fault: the one a transport
 * learned itself (a lost peer, a peer's news) before the caller's. */
static void mux_give_up(loom_tp_t *m, loom_status_t why, const loom_tp_fault_t *fault)
{
    loom_tp_fault_t f = *fault;
    for (int i = 0; i < m->ntp; i++) {
        loom_tp_fault_t own;
        if (MUX_HAS(m->ops[i], fault) && m->ops[i]->fault(m->tps[i], &own)) {
            f = own;
            break;
        }
    }
    for (int i = 0; i < m->ntp; i++) {
        if (MUX_HAS(m->ops[i], give_up))
            m->ops[i]->give_up(m->tps[i], why, &f);
        else
            m->ops[i]->abort(m->tps[i], why);
    }
}

static int mux_fault(loom_tp_t *m, loom_tp_fault_t *fault_p)
{
    for (int i = 0; i < m->ntp; i++)
        if (MUX_HAS(m->ops[i], fault) && m->ops[i]->fault(m->tps[i], fault_p))
            return 1;
    return 0;
}

static double mux_silent_s(loom_tp_t *m, int peer)
{
    const loom_transport_ops_t *ops = m->ops[m->route[peer]];
    return MUX_HAS(ops, silent_s) ? ops->silent_s(m->tps[m->route[peer]], peer) : -1;
}

static int mux_device_memory(loom_tp_t *m, int peer, char *why, size_t whylen)
{
    const loom_transport_ops_t *ops = m->ops[m->route[peer]];
    if (MUX_HAS(ops, device_memory) && ops->device_memory)
        return ops->device_memory(m->tps[m->route[peer]], peer, why, whylen);
    if (why && whylen)
        snprintf(why, whylen, "rank %d is reached over %s, which takes host memory only", peer,
                 ops->medium ? ops->medium : ops->name);
    return 0;
}

static loom_status_t mux_watch(loom_tp_t *m, int peer)
{
    const loom_transport_ops_t *ops = m->ops[m->route[peer]];
    return MUX_HAS(ops, watch) ? ops->watch(m->tps[m->route[peer]], peer) : LOOM_SUCCESS;
}

static void mux_destroy(loom_tp_t *m, double timeout_s)
{
    if (!m)
        return;
    for (int i = 0; i < m->ntp; i++)
        m->ops[i]->destroy(m->tps[i], timeout_s);
    free(m->route);
    free(m);
}

const loom_transport_ops_t loom_mux_transport = {
    .size = sizeof(loom_transport_ops_t),
    .name = "mux",
    .isend = mux_isend,
    .irecv = mux_irecv,
    .progress = mux_progress,
    .mem_register = mux_mem_register,
    .mem_deregister = mux_mem_deregister,
    .abort = mux_abort,
    .give_up = mux_give_up,
    .fault = mux_fault,
    .silent_s = mux_silent_s,
    .destroy = mux_destroy,
    .peer_readable = mux_peer_readable,
    .peer_read = mux_peer_read,
    .window = mux_window,
    .probe = mux_probe,
    .device_memory = mux_device_memory,
    .watch = mux_watch,
};
