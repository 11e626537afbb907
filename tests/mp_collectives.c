/*
 * mp_collectives - every collective on 1..8 forked ranks over real loopback
 * sockets, checked element by element against a serial reference:
 *   every algorithm (forced through LOOM_ALGO) x in-place and out-of-place x
 *   counts {0, 1, 7, 1031, 100003} x every dtype x every op,
 *   plus the large count 2^22 for a few dtype/op pairs per algorithm
 *   (LOOM_MP_FULL=1: every dtype and op at 2^22 too; LOOM_MP_QUICK=1: fewer
 *   rank counts, for sanitizer builds), and allreduce once more with the
 *   automatic choice.
 * LOOM_MP_SIZES="4 6" runs those rank counts instead; LOOM_MP_DTYPES="int32
 * float32" only those dtypes (for slow links: tests/rxe); LOOM_MP_NODES=k acts out
 * nodes of k ranks each (LOOM_HOST_ID, see mp_util.h), which the topology
 * check expects and the hierarchical algorithms use.
 * Inputs are small integers, so every reduction is exact in every type and a
 * result must match the reference bit for bit.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/comm.h"
#include "mp_util.h"
#include "base/reduce.h"
#include "base/types.h"

#define LARGE_COUNT (1u << 22)
static const size_t small_counts[] = {0, 1, 7, 1031, 100003};
static int full_matrix, quick, launched, per_node;
static unsigned dtype_mask = ~0u;   /* LOOM_MP_DTYPES */

/* ---- values ------------------------------------------------------------- */

static double input_value(int rank, size_t i, loom_op_t op)
{
    if (op == LOOM_PROD)
        return ((i + (size_t)rank) % 4 == 0) ? 2.0 : 1.0;
    return (double)(((size_t)rank * 3 + i) % 11 + 1);
}

/* Payload of non-reducing collectives: depends on the source, the destination
 * block and the index, small enough to be exact in int8 and bfloat16. */
static double block_value(int src, int block, size_t i)
{
    return (double)(((size_t)src * 7 + (size_t)block * 13 + i) % 97);
}

static void put(loom_dtype_t dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case LOOM_INT8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
    case LOOM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case LOOM_INT16: ((int16_t *)buf)[i] = (int16_t)(int64_t)v; break;
    case LOOM_UINT16: ((uint16_t *)buf)[i] = (uint16_t)(int64_t)v; break;
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
    case LOOM_UINT32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
    case LOOM_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case LOOM_UINT64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = loom_float_to_half((float)v); break;
    case LOOM_BFLOAT16: ((uint16_t *)buf)[i] = loom_float_to_bf16((float)v); break;
    case LOOM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case LOOM_FLOAT64: ((double *)buf)[i] = v; break;
    }
}

/* The reduction of element i over n ranks, stored as dt would hold it. */
static void put_reduced(loom_dtype_t dt, loom_op_t op, int n, size_t i, void *buf, size_t at)
{
    double acc = input_value(0, i, op);
    for (int q = 1; q < n; q++) {
        double v = input_value(q, i, op);
        switch (op) {
        case LOOM_SUM: case LOOM_AVG: acc += v; break;
        case LOOM_PROD: acc *= v; break;
        case LOOM_MIN: acc = v < acc ? v : acc; break;
        case LOOM_MAX: acc = v > acc ? v : acc; break;
        case LOOM_BAND: acc = (double)((int64_t)acc & (int64_t)v); break;
        case LOOM_BOR: acc = (double)((int64_t)acc | (int64_t)v); break;
        case LOOM_BXOR: acc = (double)((int64_t)acc ^ (int64_t)v); break;
        }
    }
    if (op != LOOM_AVG) {
        put(dt, buf, at, acc);
    } else if (dt == LOOM_FLOAT64) {
        put(dt, buf, at, acc / n);
    } else if (dt == LOOM_FLOAT32 || dt == LOOM_FLOAT16 || dt == LOOM_BFLOAT16) {
        put(dt, buf, at, (double)((float)acc / (float)n));
    } else {
        put(dt, buf, at, trunc(acc / n));   /* integer AVG truncates */
    }
}

static void fill_input(loom_dtype_t dt, loom_op_t op, void *buf, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++)
        put(dt, buf, i, input_value(rank, i, op));
}

/* Compare count elements of got (from index gi) with want (from wi). */
static int check_elems(const char *what, loom_dtype_t dt, const void *got, size_t gi,
                       const void *want, size_t wi, size_t count)
{
    size_t es = loom_dtype_size(dt);
    const char *g = (const char *)got + gi * es, *w = (const char *)want + wi * es;
    if (count == 0 || memcmp(g, w, count * es) == 0)
        return 0;
    for (size_t i = 0; i < count; i++)
        if (memcmp(g + i * es, w + i * es, es) != 0) {
            fprintf(stderr, "%s: element %zu differs\n", what, gi + i);
            return 1;
        }
    return 1;
}

static void *xalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        exit(3);
    }
    memset(p, 0xA5, bytes);
    return p;
}

/* ---- one test per collective ------------------------------------------- */

typedef struct tcase {
    loom_coll_t coll;
    loom_dtype_t dt;
    loom_op_t op;
    size_t count;
    int inplace;
    int root;
    char what[160];
} tcase_t;

static int status_ok(loom_comm_t c, tcase_t *t, loom_status_t st)
{
    if (st == LOOM_SUCCESS)
        return 1;
    fprintf(stderr, "%s: %s: %s\n", t->what, loom_strerror(st), loom_comm_last_error(c));
    return 0;
}

static int t_allreduce(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count;
    void *in = xalloc(cnt * es), *out = xalloc(cnt * es), *ref = xalloc(cnt * es),
         *orig = xalloc(cnt * es);
    fill_input(t->dt, t->op, in, cnt, r);
    memcpy(orig, in, cnt * es);
    for (size_t i = 0; i < cnt; i++)
        put_reduced(t->dt, t->op, n, i, ref, i);
    int bad;
    if (t->inplace) {
        bad = !status_ok(c, t, loom_allreduce(LOOM_IN_PLACE, in, cnt, t->dt, t->op, c)) ||
              check_elems(t->what, t->dt, in, 0, ref, 0, cnt);
    } else {
        bad = !status_ok(c, t, loom_allreduce(in, out, cnt, t->dt, t->op, c)) ||
              check_elems(t->what, t->dt, out, 0, ref, 0, cnt) ||
              check_elems("input changed", t->dt, in, 0, orig, 0, cnt);
    }
    free(in); free(out); free(ref); free(orig);
    return bad;
}

static int t_reduce(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count;
    void *in = xalloc(cnt * es), *out = xalloc(cnt * es), *ref = xalloc(cnt * es);
    fill_input(t->dt, t->op, in, cnt, r);
    for (size_t i = 0; i < cnt; i++)
        put_reduced(t->dt, t->op, n, i, ref, i);
    int at_root = r == t->root, bad;
    if (t->inplace && at_root) {
        bad = !status_ok(c, t, loom_reduce(LOOM_IN_PLACE, in, cnt, t->dt, t->op, t->root, c)) ||
              check_elems(t->what, t->dt, in, 0, ref, 0, cnt);
    } else {
        bad = !status_ok(c, t, loom_reduce(in, at_root ? out : NULL, cnt, t->dt, t->op, t->root, c)) ||
              (at_root && check_elems(t->what, t->dt, out, 0, ref, 0, cnt));
    }
    free(in); free(out); free(ref);
    return bad;
}

static int t_broadcast(loom_comm_t c, tcase_t *t)
{
    int r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count;
    void *buf = xalloc(cnt * es), *ref = xalloc(cnt * es);
    for (size_t i = 0; i < cnt; i++)
        put(t->dt, ref, i, block_value(t->root, 0, i));
    if (r == t->root)
        memcpy(buf, ref, cnt * es);
    int bad = !status_ok(c, t, loom_broadcast(buf, cnt, t->dt, t->root, c)) ||
              check_elems(t->what, t->dt, buf, 0, ref, 0, cnt);
    free(buf); free(ref);
    return bad;
}

static int t_allgather(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count, total = cnt * (size_t)n;
    void *in = xalloc(cnt * es), *out = xalloc(total * es), *ref = xalloc(total * es);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
            put(t->dt, ref, (size_t)q * cnt + i, block_value(q, 0, i));
    memcpy(in, (char *)ref + (size_t)r * cnt * es, cnt * es);
    loom_status_t st;
    if (t->inplace) {
        memcpy((char *)out + (size_t)r * cnt * es, in, cnt * es);
        st = loom_allgather(LOOM_IN_PLACE, out, cnt, t->dt, c);
    } else {
        st = loom_allgather(in, out, cnt, t->dt, c);
    }
    int bad = !status_ok(c, t, st) || check_elems(t->what, t->dt, out, 0, ref, 0, total);
    free(in); free(out); free(ref);
    return bad;
}

static int t_allgatherv(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt);
    size_t *counts = calloc((size_t)n, sizeof(size_t)), *displs = calloc((size_t)n, sizeof(size_t));
    size_t total = 0;
    /* Uneven blocks, some empty, with a one-element gap between blocks. */
    for (int q = 0; q < n; q++) {
        counts[q] = t->count == 0 ? 0 : (q % 3 == 2 ? 0 : t->count + (size_t)q);
        displs[q] = total;
        total += counts[q] + 1;
    }
    void *out = xalloc(total * es), *ref = xalloc(total * es), *in = xalloc(counts[r] * es);
    memcpy(ref, out, total * es);   /* gaps keep the fill pattern */
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < counts[q]; i++)
            put(t->dt, ref, displs[q] + i, block_value(q, 1, i));
    memcpy(in, (char *)ref + displs[r] * es, counts[r] * es);
    loom_status_t st;
    if (t->inplace) {
        memcpy((char *)out + displs[r] * es, in, counts[r] * es);
        st = loom_allgatherv(LOOM_IN_PLACE, counts[r], out, counts, displs, t->dt, c);
    } else {
        st = loom_allgatherv(in, counts[r], out, counts, displs, t->dt, c);
    }
    int bad = !status_ok(c, t, st) || check_elems(t->what, t->dt, out, 0, ref, 0, total);
    free(in); free(out); free(ref); free(counts); free(displs);
    return bad;
}

static int t_reduce_scatter(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count, total = cnt * (size_t)n;
    void *in = xalloc(total * es), *out = xalloc(cnt * es), *ref = xalloc(cnt * es);
    fill_input(t->dt, t->op, in, total, r);
    for (size_t i = 0; i < cnt; i++)
        put_reduced(t->dt, t->op, n, (size_t)r * cnt + i, ref, i);
    int bad;
    if (t->inplace)
        bad = !status_ok(c, t, loom_reduce_scatter(LOOM_IN_PLACE, in, cnt, t->dt, t->op, c)) ||
              check_elems(t->what, t->dt, in, 0, ref, 0, cnt);
    else
        bad = !status_ok(c, t, loom_reduce_scatter(in, out, cnt, t->dt, t->op, c)) ||
              check_elems(t->what, t->dt, out, 0, ref, 0, cnt);
    free(in); free(out); free(ref);
    return bad;
}

static int t_alltoall(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count, total = cnt * (size_t)n;
    void *in = xalloc(total * es), *out = xalloc(total * es), *ref = xalloc(total * es);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++) {
            put(t->dt, in, (size_t)q * cnt + i, block_value(r, q, i));
            put(t->dt, ref, (size_t)q * cnt + i, block_value(q, r, i));
        }
    int bad;
    if (t->inplace)
        bad = !status_ok(c, t, loom_alltoall(LOOM_IN_PLACE, in, cnt, t->dt, c)) ||
              check_elems(t->what, t->dt, in, 0, ref, 0, total);
    else
        bad = !status_ok(c, t, loom_alltoall(in, out, cnt, t->dt, c)) ||
              check_elems(t->what, t->dt, out, 0, ref, 0, total);
    free(in); free(out); free(ref);
    return bad;
}

/* How many elements rank src sends rank dst in the alltoallv test. */
static size_t v_count(size_t base, int src, int dst)
{
    return base == 0 ? 0 : base + (size_t)((src + 2 * dst) % 3);
}

static int t_alltoallv(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt);
    size_t *sc = calloc((size_t)n, sizeof(size_t)), *sd = calloc((size_t)n, sizeof(size_t));
    size_t *rc = calloc((size_t)n, sizeof(size_t)), *rd = calloc((size_t)n, sizeof(size_t));
    size_t stot = 0, rtot = 0;
    for (int q = 0; q < n; q++) {
        sc[q] = v_count(t->count, r, q);
        sd[q] = stot;
        stot += sc[q];
        rc[q] = v_count(t->count, q, r);
        rd[q] = rtot;
        rtot += rc[q];
    }
    if (t->inplace) {  /* in place needs one layout for both directions */
        for (int q = 0; q < n; q++)
            if (sc[q] != rc[q]) {
                free(sc); free(sd); free(rc); free(rd);
                return 0;
            }
    }
    void *in = xalloc(stot * es), *out = xalloc(rtot * es), *ref = xalloc(rtot * es);
    for (int q = 0; q < n; q++) {
        for (size_t i = 0; i < sc[q]; i++)
            put(t->dt, in, sd[q] + i, block_value(r, q, i));
        for (size_t i = 0; i < rc[q]; i++)
            put(t->dt, ref, rd[q] + i, block_value(q, r, i));
    }
    int bad;
    if (t->inplace)
        bad = !status_ok(c, t, loom_alltoallv(LOOM_IN_PLACE, NULL, NULL, in, rc, rd, t->dt, c)) ||
              check_elems(t->what, t->dt, in, 0, ref, 0, rtot);
    else
        bad = !status_ok(c, t, loom_alltoallv(in, sc, sd, out, rc, rd, t->dt, c)) ||
              check_elems(t->what, t->dt, out, 0, ref, 0, rtot);
    free(in); free(out); free(ref); free(sc); free(sd); free(rc); free(rd);
    return bad;
}

static int t_gather(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count, total = cnt * (size_t)n;
    void *in = xalloc(cnt * es), *out = xalloc(total * es), *ref = xalloc(total * es);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
            put(t->dt, ref, (size_t)q * cnt + i, block_value(q, 2, i));
    memcpy(in, (char *)ref + (size_t)r * cnt * es, cnt * es);
    int at_root = r == t->root;
    loom_status_t st;
    if (t->inplace && at_root) {
        memcpy((char *)out + (size_t)r * cnt * es, in, cnt * es);
        st = loom_gather(LOOM_IN_PLACE, out, cnt, t->dt, t->root, c);
    } else {
        st = loom_gather(in, at_root ? out : NULL, cnt, t->dt, t->root, c);
    }
    int bad = !status_ok(c, t, st) || (at_root && check_elems(t->what, t->dt, out, 0, ref, 0, total));
    free(in); free(out); free(ref);
    return bad;
}

static int t_scatter(loom_comm_t c, tcase_t *t)
{
    int n = loom_comm_size(c), r = loom_comm_rank(c);
    size_t es = loom_dtype_size(t->dt), cnt = t->count, total = cnt * (size_t)n;
    void *in = xalloc(total * es), *out = xalloc(cnt * es), *ref = xalloc(total * es);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
            put(t->dt, ref, (size_t)q * cnt + i, block_value(t->root, q, i));
    int at_root = r == t->root;
    if (at_root)
        memcpy(in, ref, total * es);
    loom_status_t st;
    if (t->inplace && at_root)
        st = loom_scatter(in, (void *)LOOM_IN_PLACE, cnt, t->dt, t->root, c);
    else
        st = loom_scatter(at_root ? in : NULL, out, cnt, t->dt, t->root, c);
    int bad = !status_ok(c, t, st) ||
              (!(t->inplace && at_root) &&
               check_elems(t->what, t->dt, out, 0, ref, (size_t)r * cnt, cnt)) ||
              (at_root && check_elems("root's sendbuf changed", t->dt, in, 0, ref, 0, total));
    free(in); free(out); free(ref);
    return bad;
}

static int t_barrier(loom_comm_t c, tcase_t *t)
{
    return !status_ok(c, t, loom_barrier(c));
}

typedef int (*test_fn)(loom_comm_t, tcase_t *);
static const struct {
    loom_coll_t coll;
    test_fn fn;
    int reduces, rooted, blocks;  /* blocks: count is per rank, so large counts shrink */
} colls[] = {
    {LOOM_COLL_ALLREDUCE, t_allreduce, 1, 0, 0},
    {LOOM_COLL_BROADCAST, t_broadcast, 0, 1, 0},
    {LOOM_COLL_REDUCE, t_reduce, 1, 1, 0},
    {LOOM_COLL_ALLGATHER, t_allgather, 0, 0, 1},
    {LOOM_COLL_ALLGATHERV, t_allgatherv, 0, 0, 1},
    {LOOM_COLL_REDUCE_SCATTER, t_reduce_scatter, 1, 0, 1},
    {LOOM_COLL_ALLTOALL, t_alltoall, 0, 0, 1},
    {LOOM_COLL_ALLTOALLV, t_alltoallv, 0, 0, 1},
    {LOOM_COLL_GATHER, t_gather, 0, 1, 1},
    {LOOM_COLL_SCATTER, t_scatter, 0, 1, 1},
    {LOOM_COLL_BARRIER, t_barrier, 0, 0, 0},
};

static int run_case(loom_comm_t c, test_fn fn, tcase_t *t, const char *algo)
{
    snprintf(t->what, sizeof(t->what), "rank %d/%d %s algo=%s %s %s count=%zu %s root=%d",
             loom_comm_rank(c), loom_comm_size(c), loom_coll_name(t->coll), algo,
             loom_dtype_name(t->dt), loom_op_name(t->op), t->count,
             t->inplace ? "in-place" : "out-of-place", t->root);
    return fn(c, t);
}

/* Every algorithm of one collective on the communicator. */
static int rank_main(loom_comm_t c, void *arg)
{
    int which = *(int *)arg;
    int n = loom_comm_size(c);
    int failures = 0;
    /* a == loom_num_algorithms: no algorithm forced, for the collectives that
     * have a choice (the selection's thresholds and topology rules). */
    int nalgos = 0;
    for (size_t a = 0; a < loom_num_algorithms; a++)
        nalgos += loom_algorithms[a].coll == colls[which].coll;
    for (size_t a = 0; a <= loom_num_algorithms && failures == 0; a++) {
        const loom_algo_t *algo = a < loom_num_algorithms ? &loom_algorithms[a] : NULL;
        const loom_algo_t auto_algo = {colls[which].coll, "auto", NULL, NULL};
        if (algo == NULL && nalgos > 1)
            algo = &auto_algo;
        if (algo == NULL || algo->coll != colls[which].coll)
            continue;
        loom_coll_args_t probe = {.coll = algo->coll};
        if (algo->can_run && !algo->can_run(&c->ctx, &probe))
            continue;   /* e.g. the direct algorithms without shared memory */
        if (algo == &auto_algo)
            c->cfg.algo[0] = '\0';
        else
            snprintf(c->cfg.algo, sizeof(c->cfg.algo), "%s=%s", loom_coll_name(algo->coll),
                     algo->name);
        int nroots = colls[which].rooted ? (n > 1 ? 2 : 1) : 1;
        for (int ri = 0; ri < nroots && failures == 0; ri++) {
            int root = ri == 0 ? 0 : n - 1 - (n > 2);
            for (int inplace = 0; inplace < 2 && failures == 0; inplace++) {
                if (colls[which].coll == LOOM_COLL_BROADCAST || colls[which].coll == LOOM_COLL_BARRIER)
                    if (inplace)
                        continue;
                int ndt = colls[which].coll == LOOM_COLL_BARRIER ? 1 : LOOM_NUM_DTYPES;
                int nops = colls[which].reduces ? LOOM_NUM_OPS : 1;
                /* Sanitized builds (LOOM_MP_QUICK) leave out the large count. */
                size_t ncounts = colls[which].coll == LOOM_COLL_BARRIER ? 1 : quick ? 5 : 6;
                for (size_t ci = 0; ci < ncounts && failures == 0; ci++) {
                    size_t count = ci < 5 ? small_counts[ci] : LARGE_COUNT;
                    if (ci == 5 && colls[which].blocks)
                        count = LARGE_COUNT / (size_t)n + 1;
                    for (int d = 0; d < ndt && failures == 0; d++) {
                        if (ndt > 1 && !(dtype_mask & (1u << d)))
                            continue;
                        for (int o = 0; o < nops && failures == 0; o++) {
                            /* The bitwise ops take integers only; check_reduce tests their
                             * kernels on every integer type, so one type each here. */
                            if (nops > 1 && ((o == LOOM_BAND && d != LOOM_INT32) ||
                                             (o == LOOM_BOR && d != LOOM_UINT8) ||
                                             (o == LOOM_BXOR && d != LOOM_INT64)))
                                continue;
                            /* The large count for a few pairs, all of them with LOOM_MP_FULL. */
                            if (ci == 5 && !full_matrix &&
                                !((d == LOOM_FLOAT32 && o == LOOM_SUM) ||
                                  (d == LOOM_BFLOAT16 && o == (nops > 1 ? LOOM_AVG : 0)) ||
                                  (d == LOOM_INT64 && o == (nops > 1 ? LOOM_MAX : 0))))
                                continue;
                            tcase_t t = {.coll = colls[which].coll, .dt = (loom_dtype_t)d,
                                         .op = (loom_op_t)o, .count = count, .inplace = inplace,
                                         .root = root};
                            failures += run_case(c, colls[which].fn, &t, algo->name);
                        }
                    }
                }
            }
        }
    }
    return failures;
}

/* Tagged send/recv around a ring, to self, and non-blocking exchanges. */
static int p2p_main(loom_comm_t c, void *arg)
{
    (void)arg;
    int n = loom_comm_size(c), r = loom_comm_rank(c), bad = 0;
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    enum { N = 100003 };
    int32_t *a = malloc(N * sizeof(int32_t)), *b = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        a[i] = r * 1000 + i;
    loom_request_t rq[4];
    /* Two tags in flight at once, received in the opposite order of sending. */
    if (loom_irecv(b, N, LOOM_INT32, prev, 7, c, &rq[0]) || loom_isend(a, N, LOOM_INT32, next, 7, c, &rq[1]) ||
        loom_wait(rq[1]) || loom_wait(rq[0]))
        bad = 1, fprintf(stderr, "rank %d: ring exchange: %s\n", r, loom_comm_last_error(c));
    for (int i = 0; i < N && !bad; i++)
        if (b[i] != prev * 1000 + i)
            bad = 1, fprintf(stderr, "rank %d: wrong ring data at %d\n", r, i);
    int32_t small1 = 11 + r, small2 = 22 + r, got1 = 0, got2 = 0;
    if (!bad && (loom_isend(&small1, 1, LOOM_INT32, next, 1, c, &rq[0]) ||
                 loom_isend(&small2, 1, LOOM_INT32, next, 2, c, &rq[1]) ||
                 loom_recv(&got2, 1, LOOM_INT32, prev, 2, c) ||
                 loom_recv(&got1, 1, LOOM_INT32, prev, 1, c) || loom_wait(rq[0]) || loom_wait(rq[1])))
        bad = 1, fprintf(stderr, "rank %d: tagged exchange: %s\n", r, loom_comm_last_error(c));
    if (!bad && (got1 != 11 + prev || got2 != 22 + prev))
        bad = 1, fprintf(stderr, "rank %d: tags mixed up: %d %d\n", r, got1, got2);
    /* The same with large messages: the first one's receive comes after the
     * second's, so it waits as an early message (over several TCP streams,
     * striped and possibly still arriving when its receive is posted). */
    int32_t *a2 = malloc(N * sizeof(int32_t)), *b2 = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++)
        a2[i] = r * 1000 - i;
    if (!bad && (loom_isend(a, N, LOOM_INT32, next, 5, c, &rq[0]) ||
                 loom_isend(a2, N, LOOM_INT32, next, 6, c, &rq[1]) ||
                 loom_recv(b2, N, LOOM_INT32, prev, 6, c) ||
                 loom_recv(b, N, LOOM_INT32, prev, 5, c) || loom_wait(rq[0]) || loom_wait(rq[1])))
        bad = 1, fprintf(stderr, "rank %d: large tagged exchange: %s\n", r, loom_comm_last_error(c));
    for (int i = 0; i < N && !bad; i++)
        if (b[i] != prev * 1000 + i || b2[i] != prev * 1000 - i)
            bad = 1, fprintf(stderr, "rank %d: large tags mixed up at %d\n", r, i);
    free(a2);
    free(b2);
    int32_t self = 0;
    if (!bad && (loom_isend(&small1, 1, LOOM_INT32, r, 3, c, &rq[0]) ||
                 loom_recv(&self, 1, LOOM_INT32, r, 3, c) || loom_wait(rq[0]) || self != small1))
        bad = 1, fprintf(stderr, "rank %d: send to self failed\n", r);
    /* From any rank: every rank (rank 0 too) sends rank 0 a small message with
     * tag 9 and a large one with tag 10; rank 0 takes them as they come, the
     * small ones blocking, the large ones all posted at once. */
    if (!bad && n <= 64) {
        int32_t mine = 10 * r;
        if (loom_isend(&mine, 1, LOOM_INT32, 0, 9, c, &rq[0]) ||
            loom_isend(a, N, LOOM_INT32, 0, 10, c, &rq[1]))
            bad = 1, fprintf(stderr, "rank %d: sends to rank 0: %s\n", r, loom_comm_last_error(c));
        if (!bad && r == 0) {
            int seen[64] = {0}, srcs[64];
            for (int k = 0; k < n && !bad; k++) {
                int32_t v = -1;
                int src = -1;
                if (loom_recv_any(&v, 1, LOOM_INT32, 9, &src, c) || src < 0 || src >= n ||
                    seen[src]++ || v != 10 * src)
                    bad = 1, fprintf(stderr, "rank 0: recv_any %d: source %d value %d: %s\n", k,
                                     src, v, loom_comm_last_error(c));
            }
            int32_t *big = malloc((size_t)n * N * sizeof(int32_t));
            loom_request_t reqs[64];
            int posted = 0;
            for (; posted < n && !bad; posted++)
                if (loom_irecv_any(big + (size_t)posted * N, N, LOOM_INT32, 10, &srcs[posted], c,
                                   &reqs[posted]))
                    bad = 1, fprintf(stderr, "rank 0: irecv_any: %s\n", loom_comm_last_error(c));
            for (int k = 0; k < posted; k++)
                if (loom_wait(reqs[k]) != LOOM_SUCCESS)
                    bad = 1, fprintf(stderr, "rank 0: irecv_any %d: %s\n", k, loom_comm_last_error(c));
            memset(seen, 0, sizeof(seen));
            for (int k = 0; k < posted && !bad; k++) {
                int src = srcs[k];
                if (src < 0 || src >= n || seen[src]++)
                    bad = 1, fprintf(stderr, "rank 0: irecv_any %d: source %d\n", k, src);
                for (size_t i = 0; i < N && !bad; i++)
                    if (big[(size_t)k * N + i] != src * 1000 + (int32_t)i)
                        bad = 1, fprintf(stderr, "rank 0: irecv_any from %d: wrong data at %zu\n",
                                         src, i);
            }
            free(big);
        }
        if (loom_wait(rq[0]) || loom_wait(rq[1]))
            bad = 1, fprintf(stderr, "rank %d: sends to rank 0: %s\n", r, loom_comm_last_error(c));
    }
    /* Non-blocking collectives queued back to back, then a blocking one. */
    float x[3] = {1, 2, 3}, y[5] = {0}, z = 1;
    if (!bad && (loom_iallreduce(LOOM_IN_PLACE, x, 3, LOOM_FLOAT32, LOOM_SUM, c, &rq[0]) ||
                 loom_ibarrier(c, &rq[1]) ||
                 loom_iallgather(&z, y, 1, LOOM_FLOAT32, c, &rq[2]) ||
                 loom_allreduce(LOOM_IN_PLACE, &z, 1, LOOM_FLOAT32, LOOM_SUM, c) ||
                 loom_wait(rq[0]) || loom_wait(rq[1]) || loom_wait(rq[2])))
        bad = 1, fprintf(stderr, "rank %d: non-blocking collectives: %s\n", r, loom_comm_last_error(c));
    if (!bad && (x[0] != n || x[2] != 3 * n || z != n || y[n - 1] != 1))
        bad = 1, fprintf(stderr, "rank %d: wrong non-blocking results\n", r);
    int done = 0;
    if (!bad && !loom_ibarrier(c, &rq[0])) {
        while (!done && !bad)
            bad = loom_test(rq[0], &done) != LOOM_SUCCESS;
    }
    /* Split into even and odd ranks, reversed order by key. */
    loom_comm_t sub;
    if (!bad && loom_comm_split(c, r % 2, -r, &sub) != LOOM_SUCCESS)
        bad = 1, fprintf(stderr, "rank %d: split: %s\n", r, loom_comm_last_error(c));
    if (!bad) {
        int want_size = (n + 1 - r % 2) / 2, sum = r, want = 0;
        for (int q = r % 2; q < n; q += 2)
            want += q;
        int expect_rank = (n - 1 - r) / 2;
        if (loom_comm_size(sub) != want_size || loom_comm_rank(sub) != expect_rank ||
            loom_allreduce(LOOM_IN_PLACE, &sum, 1, LOOM_INT32, LOOM_SUM, sub) || sum != want)
            bad = 1, fprintf(stderr, "rank %d: sub-communicator wrong (size %d rank %d sum %d)\n",
                             r, loom_comm_size(sub), loom_comm_rank(sub), sum);
        loom_comm_destroy(sub);
    }
    loom_comm_t none = (loom_comm_t)1;
    if (!bad && (loom_comm_split(c, r == 0 ? LOOM_UNDEFINED : 1, 0, &none) != LOOM_SUCCESS ||
                 (r == 0) != (none == NULL)))
        bad = 1, fprintf(stderr, "rank %d: split with LOOM_UNDEFINED\n", r);
    if (none && none != (loom_comm_t)1)
        loom_comm_destroy(none);
    /* Nodes of per_node ranks (the last one may hold fewer); one node without LOOM_MP_NODES. */
    int k = per_node > 0 ? per_node : n;
    int want_local = n - r / k * k < k ? n - r / k * k : k;
    if (!bad && !launched &&
        (loom_comm_local_size(c) != want_local || loom_comm_node_count(c) != (n + k - 1) / k ||
         loom_comm_local_rank(c) != r % k || loom_comm_node_rank(c) != r / k))
        bad = 1, fprintf(stderr, "rank %d: topology wrong (local %d/%d, node %d/%d)\n", r,
                         loom_comm_local_rank(c), loom_comm_local_size(c),
                         loom_comm_node_rank(c), loom_comm_node_count(c));
    free(a);
    free(b);
    return bad;
}

/* One rank of a job started by someone else (loomrun, mpirun, srun, ssh, a
 * torchrun-style environment): the whole matrix with the small counts. */
static int run_launched(void)
{
    loom_comm_t c;
    loom_status_t st = loom_init(&c);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "loom_init: %s: %s\n", loom_strerror(st), loom_comm_last_error(NULL));
        return 2;
    }
    launched = quick = 1;
    int bad = p2p_main(c, NULL);
    int ncolls = (int)(sizeof(colls) / sizeof(colls[0]));
    for (int which = 0; which < ncolls && !bad; which++)
        bad = rank_main(c, &which);
    if (loom_comm_rank(c) == 0 && !bad)
        printf("collective matrix OK on %d ranks (%d nodes)\n", loom_comm_size(c),
               loom_comm_node_count(c));
    loom_comm_destroy(c);
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *dtypes_env = getenv("LOOM_MP_DTYPES");
    if (dtypes_env) {
        char list[256];
        snprintf(list, sizeof(list), "%s", dtypes_env);
        dtype_mask = 0;
        for (char *save = NULL, *tok = strtok_r(list, " ,", &save); tok;
             tok = strtok_r(NULL, " ,", &save)) {
            int d = loom_dtype_parse(tok);
            if (d < 0) {
                fprintf(stderr, "LOOM_MP_DTYPES: %s is not a dtype\n", tok);
                return 2;
            }
            dtype_mask |= 1u << d;
        }
        if (dtype_mask == 0) {
            fprintf(stderr, "LOOM_MP_DTYPES='%s' holds no dtype\n", dtypes_env);
            return 2;
        }
    }
    if (argc > 1 && strcmp(argv[1], "--launched") == 0)
        return run_launched();
    full_matrix = getenv("LOOM_MP_FULL") != NULL;
    quick = getenv("LOOM_MP_QUICK") != NULL;
    const char *nodes_env = getenv("LOOM_MP_NODES");
    per_node = nodes_env ? atoi(nodes_env) : 0;
    static const int all_sizes[] = {1, 2, 3, 4, 5, 6, 7, 8}, quick_sizes[] = {1, 3, 4};
    const int *sizes = quick ? quick_sizes : all_sizes;
    int nsizes = quick ? 3 : 8;
    int env_sizes[16];
    const char *sizes_env = getenv("LOOM_MP_SIZES");
    if (sizes_env) {
        nsizes = 0;
        for (char *p = (char *)sizes_env, *end; nsizes < 16; p = end) {
            long v = strtol(p, &end, 10);
            if (end == p)
                break;
            if (v < 1 || v > 64) {
                fprintf(stderr, "LOOM_MP_SIZES: %ld is not a rank count (1..64)\n", v);
                return 2;
            }
            env_sizes[nsizes++] = (int)v;
        }
        if (nsizes == 0) {
            fprintf(stderr, "LOOM_MP_SIZES='%s' holds no rank count\n", sizes_env);
            return 2;
        }
        sizes = env_sizes;
    }
    for (int s = 0; s < nsizes; s++) {
        int n = sizes[s];
        char name[96];
        snprintf(name, sizeof(name), "send/recv, non-blocking, split on %d ranks", n);
        mp_result(name, mp_run(n, p2p_main, NULL, 120) == 0);
        for (int which = 0; which < (int)(sizeof(colls) / sizeof(colls[0])); which++) {
            double t0 = mp_now();
            int failed = mp_run(n, rank_main, &which, 600);
            snprintf(name, sizeof(name), "%s on %d ranks, every algorithm (%.1f s)",
                     loom_coll_name(colls[which].coll), n, mp_now() - t0);
            mp_result(name, failed == 0);
        }
    }
    return mp_summary();
}
