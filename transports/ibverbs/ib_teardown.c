/*
 * ib_teardown.c - the end of an instance: its failure announced to the
 * peers, abort from another thread, and destroy (the last sends drained, a
 * goodbye on every side channel, the verbs objects released).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/byteorder.h"
#include "base/clock.h"
#include "ib_int.h"
#include "base/log.h"

/* ---- failure: the peers are told, abort ------------------------------------ */

/* A goodbye ('B') or the news that we gave up ('G') on the side channel,
 * with the number of messages we posted to the peer: the side channel may
 * overtake them, and the peer waits for that many before it judges what it
 * still waits on. */
void ib_say_goodbye(loom_tp_t *tp, ib_peer_t *p, int gave_up)
{
    (void)tp;
    uint8_t note[NOTE_BYTES];
    note[0] = gave_up ? 'G' : 'B';
    loom_put64(note + 1, p->consumed);
    if (p->fd >= 0 && send(p->fd, note, sizeof(note), MSG_NOSIGNAL | MSG_DONTWAIT) !=
                          (ssize_t)sizeof(note)) {
        /* it is gone, or its side channel is full of our bytes: it knows */
    }
}

/* A failed instance tells its peers at once, on the side channels, so that
 * none waits for it until LOOM_TIMEOUT while this process lives on. And it
 * deregisters user memory before the failed call returns: a peer that got a
 * receive's address (CTS) may still write there, into memory the user frees
 * and reuses from then on; after ibv_dereg_mr the HCA writes no more (the
 * peer's write fails with a remote access error: it learns of the failure). */
void ib_announce_failure(loom_tp_t *tp)
{
    if (tp->announced)
        return;
    tp->announced = 1;
    loom_rcache_revoke(&tp->rcache);
    loom_rcache_revoke(&tp->dcache);
    for (int i = 0; i < tp->nactive; i++)
        ib_say_goodbye(tp, &tp->peers[tp->active[i]], 1);
}

void ib_abort(loom_tp_t *tp, loom_status_t why)
{
    int expected = 0;
    atomic_compare_exchange_strong(&tp->abort_why, &expected, (int)why);
    uint64_t one = 1;
    if (write(tp->wake_fd, &one, sizeof(one)) < 0) { /* already signalled */ }
    if (tp->pfds && loom_tp_own_if_idle(&tp->owner)) {
        ib_announce_failure(tp);
        loom_tp_disown(&tp->owner);
    }
}

/* ---- destroy --------------------------------------------------------------- */

/* Eager sends completed when posted: let the last WRs of every queue pair
 * finish before the QPs go, or the peers would lose them (after a failure
 * too: a mismatch we found must still reach the peer, which reports it as
 * well). Completions are only counted here, never acted on. */
static void drain_sends(loom_tp_t *tp, double deadline)
{
    for (int i = 0; i < tp->nactive; i++) {
        ib_peer_t *p = &tp->peers[tp->active[i]];
        if (!p->said_bye && !p->hung_up && p->sq_posted > p->sq_last_sig)
            ib_write_credits(tp, p, 1);
    }
    for (;;) {
        int busy = 0;
        for (int i = 0; i < tp->nactive && !busy; i++) {
            ib_peer_t *p = &tp->peers[tp->active[i]];
            busy = !p->said_bye && !p->hung_up && p->sq_done < p->sq_last_sig;
        }
        if (!busy || loom_now_s() > deadline)
            return;
        struct ibv_wc wc[32];
        int n = ibv_poll_cq(tp->scq, 32, wc);
        if (n < 0)
            return;
        for (int k = 0; k < n; k++) {
            int peer = WRID_PEER(wc[k].wr_id);
            if (peer >= tp->size)
                continue;
            ib_peer_t *p = &tp->peers[peer];
            uint64_t low = WRID_LOW(wc[k].wr_id);
            uint64_t seq = WRID_KIND(wc[k].wr_id) == WR_RDV
                               ? (low < (uint64_t)tp->rdv_send.n ? tp->rdv_send.v[low].seq : 0)
                               : low;
            if (seq > p->sq_done)
                p->sq_done = seq;
        }
        if (n == 0) {
            ib_check_sockets(tp, 1000);
            if (atomic_load(&tp->abort_why))
                return;
        }
    }
}

void ib_destroy(loom_tp_t *tp, double timeout_s)
{
    LOOM_INFO("ibverbs", "rank %d sent %llu eager and %llu rendezvous messages; %llu arrived "
              "before their receive; registration cache: %llu hits, %llu misses, %llu evictions; "
              "GPU memory: %llu hits, %llu misses, %llu evictions",
              tp->rank, (unsigned long long)tp->neager, (unsigned long long)tp->nrdv,
              (unsigned long long)tp->nunexpected, (unsigned long long)tp->rcache.hits,
              (unsigned long long)tp->rcache.misses, (unsigned long long)tp->rcache.evictions,
              (unsigned long long)tp->dcache.hits, (unsigned long long)tp->dcache.misses,
              (unsigned long long)tp->dcache.evictions);
    for (int i = 0; i < tp->nactive; i++) {
        const ib_peer_t *p = &tp->peers[tp->active[i]];
        if (!ib_nothing_pending(p))
            LOOM_INFO("ibverbs", "rank %d, unfinished with rank %d: receives %s, queued ops %s, "
                      "rendezvous in %d out %d, credits %d (consumed %llu, peer freed %llu), "
                      "freed %llu advertised %llu, send queue posted %llu done %llu",
                      tp->rank, p->rank, p->rq.head ? "posted" : "none",
                      p->oq_head ? "yes" : "none", p->rdv_in, p->rdv_out, ib_credits(tp, p),
                      (unsigned long long)p->consumed,
                      (unsigned long long)tp->ctrl.credit_in[p->rank],
                      (unsigned long long)p->freed, (unsigned long long)p->advertised,
                      (unsigned long long)p->sq_posted, (unsigned long long)p->sq_done);
    }
    double deadline = loom_now_s() + (timeout_s < 5 ? timeout_s : 5);
    if (tp->pfds)
        drain_sends(tp, deadline);
    for (int i = 0; i < tp->nactive; i++) {
        ib_peer_t *p = &tp->peers[tp->active[i]];
        if (p->fd < 0)
            continue;
        /* Say goodbye, so the peer can tell a finished rank from a dead one, or
         * that this one gave up, so it does not wait for it past the grace. */
        ib_say_goodbye(tp, p, tp->failed || tp->announced || atomic_load(&tp->abort_why));
        close(p->fd);
    }
    for (int j = 0; j < tp->size; j++) {
        ib_peer_t *p = &tp->peers[j];
        if (p->qp)
            tp->api->destroy_qp(p->qp);
        loom_unexp_free_all(&p->uq);
        for (ib_op_t *op = p->oq_head, *next; op; op = next) {
            next = op->next;
            free(op);
        }
    }
    for (ib_op_t *op = tp->op_free, *next; op; op = next) {
        next = op->next;
        free(op);
    }
    if (tp->scq)
        tp->api->destroy_cq(tp->scq);
    if (tp->rcq)
        tp->api->destroy_cq(tp->rcq);
    if (tp->slots_mr)
        tp->api->dereg_mr(tp->slots_mr);
    free(tp->slots);
    loom_rcache_fini(&tp->rcache);
    loom_rcache_fini(&tp->dcache);
    tp->api->dereg_mr(tp->ctrl_mr);
    free(tp->ctrl_mem);
    tp->api->dealloc_pd(tp->pd);
    tp->api->close_device(tp->ctx);
    if (tp->listen_fd >= 0)
        close(tp->listen_fd);
    close(tp->wake_fd);
    free(tp->rdv_send.v);
    free(tp->rdv_recv.v);
    free(tp->pfds);
    free(tp->active);
    free(tp->peers);
    free(tp);
}
