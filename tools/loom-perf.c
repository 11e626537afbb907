/*
 * loom-perf - benchmark Loom's collectives the way nccl-tests benchmarks NCCL.
 *
 *   loomrun -np 4 loom-perf allreduce -b 8 -e 128M -f 2
 *
 * The output copies nccl-tests' layout (header, columns, number shortening,
 * busbw factors, footer) so that scripts written for all_reduce_perf and
 * friends read it unchanged. "loom-perf p2p" measures latency and bandwidth
 * between ranks 0 and 1 like osu_latency / osu_bw.
 *
 * Only the public API is used: this is also a worked example of driving every
 * collective, blocking and non-blocking, in and out of place.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <loom.h>
#ifdef LOOM_HAVE_CUDA
#include <loom_cuda.h>
#endif

#include "base/clock.h"
#include "perf.h"

/* ---- element values ----------------------------------------------------------
 * Inputs are small integers, exact in every type (bfloat16 holds integers up to
 * 256 exactly), so every expected result is exact too and a check can compare
 * for equality. Results are read back into a double. */

/* Round x to a binary floating-point number with p significant bits, nearest even. */
static double round_bits(double x, int p)
{
    if (x == 0 || !isfinite(x))
        return x;
    int e;
    double m = frexp(x, &e);
    return ldexp(nearbyint(ldexp(m, p)), e - p);
}

static uint16_t half_bits(double v)
{
    uint16_t sign = signbit(v) ? 0x8000u : 0;
    double r = round_bits(fabs(v), 11);
    if (r == 0)
        return sign;
    int e;
    double m = frexp(r, &e);   /* r = m * 2^e, m in [0.5, 1) */
    int biased = e - 1 + 15;
    if (biased >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (biased <= 0)   /* subnormal: a multiple of 2^-24 */
        return (uint16_t)(sign | (uint16_t)nearbyint(ldexp(r, 24)));
    uint16_t mant = (uint16_t)(ldexp(m, 11) - 1024);
    return (uint16_t)(sign | (unsigned)biased << 10 | mant);
}

static double half_value(uint16_t h)
{
    int biased = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v = biased == 0    ? ldexp(mant, -24)
               : biased == 31 ? (mant ? NAN : INFINITY)
                              : ldexp(1024 + mant, biased - 25);
    return (h & 0x8000u) ? -v : v;
}

static uint16_t bf16_bits(double v)
{
    float f = (float)round_bits(v, 8);
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return (uint16_t)(u >> 16);
}

static double bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

static void put_elem(void *buf, loom_dtype_t dt, size_t i, double v)
{
    switch (dt) {
    case LOOM_INT8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case LOOM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case LOOM_INT16: ((int16_t *)buf)[i] = (int16_t)v; break;
    case LOOM_UINT16: ((uint16_t *)buf)[i] = (uint16_t)v; break;
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case LOOM_INT64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case LOOM_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = half_bits(v); break;
    case LOOM_BFLOAT16: ((uint16_t *)buf)[i] = bf16_bits(v); break;
    case LOOM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case LOOM_FLOAT64: ((double *)buf)[i] = v; break;
    }
}

static double get_elem(const void *buf, loom_dtype_t dt, size_t i)
{
    switch (dt) {
    case LOOM_INT8: return ((const int8_t *)buf)[i];
    case LOOM_UINT8: return ((const uint8_t *)buf)[i];
    case LOOM_INT16: return ((const int16_t *)buf)[i];
    case LOOM_UINT16: return ((const uint16_t *)buf)[i];
    case LOOM_INT32: return ((const int32_t *)buf)[i];
    case LOOM_UINT32: return ((const uint32_t *)buf)[i];
    case LOOM_INT64: return (double)((const int64_t *)buf)[i];
    case LOOM_UINT64: return (double)((const uint64_t *)buf)[i];
    case LOOM_FLOAT16: return half_value(((const uint16_t *)buf)[i]);
    case LOOM_BFLOAT16: return bf16_value(((const uint16_t *)buf)[i]);
    case LOOM_FLOAT32: return ((const float *)buf)[i];
    case LOOM_FLOAT64: return ((const double *)buf)[i];
    }
    return NAN;
}

static int is_integer_type(loom_dtype_t dt)
{
    return dt == LOOM_INT8 || dt == LOOM_UINT8 || dt == LOOM_INT16 || dt == LOOM_UINT16 ||
           dt == LOOM_INT32 || dt == LOOM_UINT32 || dt == LOOM_INT64 || dt == LOOM_UINT64;
}

/* x as the integer type holds it: Loom's integer sums and products wrap. */
static int64_t wrap_int(int64_t x, loom_dtype_t dt)
{
    switch (dt) {
    case LOOM_INT8: return (int8_t)(uint8_t)x;
    case LOOM_UINT8: return (uint8_t)x;
    case LOOM_INT16: return (int16_t)(uint16_t)x;
    case LOOM_UINT16: return (uint16_t)x;
    case LOOM_INT32: return (int32_t)(uint32_t)x;
    case LOOM_UINT32: return (uint32_t)x;
    default: return x;
    }
}

/* x rounded to a floating type the way Loom's kernels round their result. */
static double round_float(double x, loom_dtype_t dt)
{
    switch (dt) {
    case LOOM_FLOAT16: return half_value(half_bits(x));
    case LOOM_BFLOAT16: return bf16_value(bf16_bits(x));
    case LOOM_FLOAT32: return (float)x;
    default: return x;
    }
}

/* Data of the non-reducing collectives: depends on the sender and the position,
 * so a block from the wrong rank or at the wrong offset shows. Never 0, the
 * value receive buffers are cleared to. */
static double data_value(int rank, size_t j)
{
    return (double)(1 + ((size_t)rank * 13 + j) % 101);
}

/* ---- the benchmark ------------------------------------------------------------ */

#define USER_TAG 7

__attribute__((format(printf, 2, 3))) static void say(const bench_t *b, const char *fmt, ...)
{
    if (b->rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
}

static void loom_fail(const bench_t *b, const char *what, loom_status_t st)
{
    fprintf(stderr, "loom-perf: rank %d: %s failed: %s: %s\n", b->rank, what, loom_strerror(st),
            loom_comm_last_error(b->comm));
    exit(EXIT_ERROR);
}

#define LCHECK(b, what, call)                                                                \
    do {                                                                                     \
        loom_status_t st_ = (call);                                                          \
        if (st_ != LOOM_SUCCESS)                                                             \
            loom_fail((b), (what), st_);                                                     \
    } while (0)

/* Ranks past this many contribute the op's neutral value, so that sums stay within
 * int8 and within the integers bfloat16 holds exactly (256) on any rank count. */
#define EXACT_RANKS 120

/* Input of a reduction: SUM, AVG, MIN and MAX take 1..k, PROD takes 1 or 2, with k
 * and the share of 2s small enough that every result is exact in every type. */
static int64_t reduce_input(const bench_t *b, int rank, size_t j)
{
    if (rank >= EXACT_RANKS)
        return b->op == LOOM_PROD ? 1 : 0;
    if (b->op == LOOM_PROD)
        return ((size_t)rank + j) % (size_t)b->prod_m == 0 ? 2 : 1;
    return 1 + (int64_t)(((size_t)rank + j) % (size_t)b->red_k);
}

/* The expected result at j depends on j modulo the period only: one table per test. */
static void compute_expected(bench_t *b)
{
    int n = b->n, active = n < EXACT_RANKS ? n : EXACT_RANKS;
    /* At most EXACT_RANKS in a sum, at most 6 factors of 2 (int8 holds 64). */
    b->red_k = EXACT_RANKS / active > 7 ? 7 : EXACT_RANKS / active;
    b->prod_m = (active + 5) / 6 < 2 ? 2 : (active + 5) / 6;
    b->period = b->op == LOOM_PROD ? b->prod_m : b->red_k;
    for (int q = 0; q < b->period; q++) {
        int64_t sum = 0, prod = 1, lo = INT64_MAX, hi = INT64_MIN, and_ = -1, or_ = 0, xor_ = 0;
        for (int r = 0; r < n; r++) {
            int64_t v = reduce_input(b, r, (size_t)q);
            and_ &= v;
            or_ |= v;
            xor_ ^= v;
            sum += v;
            prod *= v;
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        int integer = is_integer_type(b->dt);
        double e;
        switch (b->op) {
        case LOOM_SUM:
            e = integer ? (double)wrap_int(sum, b->dt) : round_float((double)sum, b->dt);
            break;
        case LOOM_PROD:
            e = integer ? (double)wrap_int(prod, b->dt) : round_float((double)prod, b->dt);
            break;
        case LOOM_MIN:
            e = (double)lo;
            break;
        case LOOM_MAX:
            e = (double)hi;
            break;
        case LOOM_BAND:
            e = (double)and_;
            break;
        case LOOM_BOR:
            e = (double)or_;
            break;
        case LOOM_BXOR:
            e = (double)xor_;
            break;
        default:   /* AVG: sum, then divide (integers truncate toward zero) */
            e = integer ? (double)(wrap_int(sum, b->dt) / n)
                        : round_float((double)sum / n, b->dt);
            break;
        }
        b->expect[q] = e;
    }
}

/* Choose the count for a size the way nccl-tests does. *bytes: the size column;
 * *algbytes: the bytes algbw counts. */
static void set_size(bench_t *b, size_t size, size_t *bytes, double *algbytes)
{
    size_t count = b->ts ? size / b->ts : 0;
    if (b->o.coll == C_BARRIER)
        count = 0;
    else if (coll_per_rank_blocks(b->o.coll))
        count /= (size_t)b->n;
    b->count = count;
    size_t blocks = coll_per_rank_blocks(b->o.coll) ? (size_t)b->n : 1;
    *bytes = count * blocks * b->ts;
    *algbytes = (double)*bytes;
}

static void fill_reduce(bench_t *b, char *dst, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_elem(dst, b->dt, i, (double)reduce_input(b, b->rank, first + i));
}

static void fill_data(bench_t *b, char *dst, int rank, size_t first, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_elem(dst, b->dt, i, data_value(rank, first + i));
}

/* Inputs of one operation, with the output cleared so a result that never came shows. */
static void prepare(bench_t *b, int in_place)
{
    size_t c = b->count, ts = b->ts, n = (size_t)b->n, r = (size_t)b->rank;
    char *in = in_place ? b->rbuf : b->sbuf;
    switch (b->o.coll) {
    case C_ALLREDUCE: case C_REDUCE:
        if (!in_place)
            memset(b->rbuf, 0, c * ts);
        fill_reduce(b, in, 0, c);
        break;
    case C_REDUCE_SCATTER:
        if (!in_place)
            memset(b->rbuf, 0, c * ts);
        fill_reduce(b, in, 0, n * c);
        break;
    case C_BROADCAST:
        memset(b->rbuf, 0, c * ts);
        if (b->rank == b->root)
            fill_data(b, in, b->rank, 0, c);
        break;
    case C_ALLGATHER: case C_GATHER:
        memset(b->rbuf, 0, n * c * ts);
        fill_data(b, in_place ? b->rbuf + r * c * ts : b->sbuf, b->rank, 0, c);
        break;
    case C_ALLTOALL:
        if (!in_place)
            memset(b->rbuf, 0, n * c * ts);
        fill_data(b, in, b->rank, 0, n * c);
        break;
    case C_SCATTER:
        memset(b->rbuf, 0, n * c * ts);
        if (b->rank == b->root)
            fill_data(b, in, b->rank, 0, n * c);
        break;
    case C_SENDRECV:
        if (!in_place)
            memset(b->rbuf, 0, c * ts);
        fill_data(b, in, b->rank, 0, c);
        break;
    default:
        break;
    }
}

/* Run one operation (blocking) or start it (-z 1: its requests go to b->reqs). */
static void issue(bench_t *b, int in_place)
{
    int nb = b->o.nonblocking;
    loom_request_t *q = &b->reqs[b->nreq];
    size_t c = b->count, ts = b->ts;
    int root = b->root, rank = b->rank, n = b->n;
    char *sb = b->o.gpu ? b->dsbuf : b->sbuf, *rb = b->o.gpu ? b->drbuf : b->rbuf;
    const void *in = in_place ? LOOM_IN_PLACE : sb;
    loom_dtype_t dt = b->dt;
    loom_op_t op = b->op;
    loom_comm_t comm = b->comm;
    const char *name = coll_names[b->o.coll];
    loom_status_t st = LOOM_SUCCESS;
    int started = 1;
    switch (b->o.coll) {
    case C_ALLREDUCE:
        st = nb ? loom_iallreduce(in, rb, c, dt, op, comm, q)
                : loom_allreduce(in, rb, c, dt, op, comm);
        break;
    case C_BROADCAST: {
        /* One buffer in Loom's API: out of place, the root sends from its send buffer. */
        void *buf = !in_place && rank == root ? sb : rb;
        st = nb ? loom_ibroadcast(buf, c, dt, root, comm, q)
                : loom_broadcast(buf, c, dt, root, comm);
        break;
    }
    case C_REDUCE:
        st = nb ? loom_ireduce(in, rb, c, dt, op, root, comm, q)
                : loom_reduce(in, rb, c, dt, op, root, comm);
        break;
    case C_ALLGATHER:
        st = nb ? loom_iallgather(in, rb, c, dt, comm, q) : loom_allgather(in, rb, c, dt, comm);
        break;
    case C_REDUCE_SCATTER:
        st = nb ? loom_ireduce_scatter(in, rb, c, dt, op, comm, q)
                : loom_reduce_scatter(in, rb, c, dt, op, comm);
        break;
    case C_ALLTOALL:
        st = nb ? loom_ialltoall(in, rb, c, dt, comm, q) : loom_alltoall(in, rb, c, dt, comm);
        break;
    case C_GATHER: {
        /* In place, as nccl-tests: every rank's block already sits at its place in the
         * receive buffer; only the root may say LOOM_IN_PLACE. */
        const void *s = !in_place ? sb : rank == root ? LOOM_IN_PLACE
                                                      : (const void *)(rb + (size_t)rank * c * ts);
        st = nb ? loom_igather(s, rb, c, dt, root, comm, q) : loom_gather(s, rb, c, dt, root, comm);
        break;
    }
    case C_SCATTER: {
        const void *s = in_place ? rb : sb;
        void *r = !in_place ? rb : rank == root ? (void *)LOOM_IN_PLACE : rb + (size_t)rank * c * ts;
        st = nb ? loom_iscatter(s, r, c, dt, root, comm, q) : loom_scatter(s, r, c, dt, root, comm);
        break;
    }
    case C_SENDRECV: {
        /* A ring: send to the next rank, receive from the previous one. */
        const void *s = in_place ? rb : sb;
        st = loom_isend(s, c, dt, (rank + 1) % n, USER_TAG, comm, &q[0]);
        if (st == LOOM_SUCCESS)
            st = loom_irecv(rb, c, dt, (rank + n - 1) % n, USER_TAG, comm, &q[1]);
        if (st == LOOM_SUCCESS && !nb) {
            st = loom_wait(q[0]);
            loom_status_t st2 = loom_wait(q[1]);
            st = st != LOOM_SUCCESS ? st : st2;
        }
        started = 2;
        break;
    }
    case C_BARRIER:
        st = nb ? loom_ibarrier(comm, q) : loom_barrier(comm);
        break;
    default:
        break;
    }
    if (st != LOOM_SUCCESS)
        loom_fail(b, name, st);
    if (nb)
        b->nreq += started;
}

static void complete(bench_t *b)
{
    for (int i = 0; i < b->nreq; i++)
        LCHECK(b, "loom_wait", loom_wait(b->reqs[i]));
    b->nreq = 0;
}

/* Count the result elements that differ from what they must be. */
static int64_t verify(bench_t *b, int in_place)
{
    size_t c = b->count, ts = b->ts, n = (size_t)b->n, r = (size_t)b->rank;
    loom_dtype_t dt = b->dt;
    int64_t wrong = 0;
    const char *res = b->rbuf;
    switch (b->o.coll) {
    case C_ALLREDUCE: case C_REDUCE: case C_REDUCE_SCATTER: {
        if (b->o.coll == C_REDUCE && b->rank != b->root)
            break;
        size_t first = b->o.coll == C_REDUCE_SCATTER ? r * c : 0;
        for (size_t i = 0; i < c; i++)
            wrong += get_elem(res, dt, i) != b->expect[(first + i) % (size_t)b->period];
        break;
    }
    case C_BROADCAST:
        if (!in_place && b->rank == b->root)
            res = b->sbuf;
        for (size_t i = 0; i < c; i++)
            wrong += get_elem(res, dt, i) != data_value(b->root, i);
        break;
    case C_ALLGATHER: case C_GATHER:
        if (b->o.coll == C_GATHER && b->rank != b->root)
            break;
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < c; i++)
                wrong += get_elem(res, dt, p * c + i) != data_value((int)p, i);
        break;
    case C_ALLTOALL:
        for (size_t p = 0; p < n; p++)
            for (size_t i = 0; i < c; i++)
                wrong += get_elem(res, dt, p * c + i) != data_value((int)p, r * c + i);
        break;
    case C_SCATTER:
        if (in_place)
            res += r * c * ts;
        for (size_t i = 0; i < c; i++)
            wrong += get_elem(res, dt, i) != data_value(b->root, r * c + i);
        break;
    case C_SENDRECV:
        for (size_t i = 0; i < c; i++)
            wrong += get_elem(res, dt, i) != data_value((b->rank + b->n - 1) % b->n, i);
        break;
    default:
        break;
    }
    return wrong;
}

/* One buffer both sends and receives in an in-place ring exchange: what arrives
 * overwrites what is still being sent, so there is nothing to check (nccl-tests
 * reports in-place alltoall the same way). */
static int checkable(const bench_t *b, int in_place)
{
    return b->o.check && !(in_place && b->o.coll == C_SENDRECV);
}

/* Combine the per-rank time as -a says, and sum the wrong elements over the ranks. */
static void combine(bench_t *b, double *t, int64_t *wrong)
{
    double v[2] = {*t, (double)*wrong};
    if (b->o.average <= 1) {
        if (b->o.average == 0 && b->rank != 0)
            v[0] = 0;
        LCHECK(b, "allreduce of the timings",
               loom_allreduce(LOOM_IN_PLACE, v, 2, LOOM_FLOAT64, LOOM_SUM, b->comm));
        if (b->o.average == 1)
            v[0] /= b->n;
    } else {
        LCHECK(b, "allreduce of the timings",
               loom_allreduce(LOOM_IN_PLACE, v, 1, LOOM_FLOAT64,
                              b->o.average == 2 ? LOOM_MIN : LOOM_MAX, b->comm));
        LCHECK(b, "allreduce of the error counts",
               loom_allreduce(LOOM_IN_PLACE, &v[1], 1, LOOM_FLOAT64, LOOM_SUM, b->comm));
    }
    *t = v[0];
    *wrong = (int64_t)v[1];
}

static void add_row(bench_t *b, const row_t *w)
{
    if (b->nrows == b->rows_cap) {
        b->rows_cap = b->rows_cap ? 2 * b->rows_cap : 64;
        row_t *grown = realloc(b->rows, b->rows_cap * sizeof(*grown));
        if (!grown) {
            fprintf(stderr, "loom-perf: out of memory\n");
            exit(EXIT_ERROR);
        }
        b->rows = grown;
    }
    b->rows[b->nrows++] = *w;
}

/* -g: the prepared inputs to the GPU, the results back for checking. */
#ifdef LOOM_HAVE_CUDA
static size_t gpu_bytes(const bench_t *b)
{
    size_t bytes = b->count * b->ts * (size_t)b->n;
    return bytes < b->buf_bytes ? bytes : b->buf_bytes;
}
#endif

static void to_device(bench_t *b)
{
#ifdef LOOM_HAVE_CUDA
    cudaError_t e = cudaSuccess;
    if (b->o.gpu && (e = cudaMemcpy(b->dsbuf, b->sbuf, gpu_bytes(b), cudaMemcpyHostToDevice)) == cudaSuccess)
        e = cudaMemcpy(b->drbuf, b->rbuf, gpu_bytes(b), cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        fprintf(stderr, "loom-perf: rank %d: cudaMemcpy: %s\n", b->rank, cudaGetErrorString(e));
        exit(EXIT_ERROR);
    }
#else
    (void)b;
#endif
}

static void from_device(bench_t *b)
{
#ifdef LOOM_HAVE_CUDA
    cudaError_t e;
    if (b->o.gpu && (e = cudaMemcpy(b->rbuf, b->drbuf, gpu_bytes(b), cudaMemcpyDeviceToHost)) != cudaSuccess) {
        fprintf(stderr, "loom-perf: rank %d: cudaMemcpy: %s\n", b->rank, cudaGetErrorString(e));
        exit(EXIT_ERROR);
    }
#else
    (void)b;
#endif
}

/* One type x op x root: warm up, then sweep the sizes (nccl-tests' TimeTest). */
static void time_test(bench_t *b, int type, int op, int root)
{
    b->dt = types[type].dt;
    b->ts = loom_dtype_size(b->dt);
    b->op = op >= 0 ? ops[op].op : LOOM_SUM;
    b->root = root;
    if (coll_reduces(b->o.coll))
        compute_expected(b);

    size_t bytes;
    double algbytes;
    int only_once = b->o.coll == C_BARRIER;
    /* Warm up at both ends of the sweep: connections, buffers and caches. */
    size_t ends[2] = {b->o.maxbytes, b->o.minbytes};
    for (int e = 0; e < (only_once ? 1 : 2); e++) {
        set_size(b, ends[e], &bytes, &algbytes);
        for (int i = 0; i < b->o.warmup; i++)
            issue(b, 0);
        complete(b);
    }

    for (size_t size = only_once ? 0 : b->o.minbytes;;) {
        set_size(b, size, &bytes, &algbytes);
        row_t w = {.bytes = bytes, .count = b->count, .type = type, .op = op,
                   .root = coll_rooted(b->o.coll) ? root : -1};
        for (int m = 0; m < 2; m++) {
            /* The first run both synchronises and is the one checked. */
            prepare(b, m);
            to_device(b);
            issue(b, m);
            complete(b);
            from_device(b);
            int64_t wrong = checkable(b, m) ? verify(b, m) : 0;
            if (m == 1 && b->o.check) {
                prepare(b, m);   /* in place, the check run consumed the inputs */
                to_device(b);
            }

            LCHECK(b, "barrier", loom_barrier(b->comm));
            double t0 = loom_now_s();
            for (int i = 0; i < b->o.iters; i++)
                issue(b, m);
            complete(b);
            double t = (loom_now_s() - t0) / b->o.iters;
            combine(b, &t, &wrong);

            w.time[m] = t * 1e6;
            w.algbw[m] = algbytes / t / 1e9;
            w.busbw[m] = w.algbw[m] * busbw_factor(b->o.coll, b->n);
            w.wrong[m] = wrong;
            w.reported[m] = checkable(b, m);
            if (w.reported[m] && wrong > 0)
                b->failed_tests++;
        }
        print_row(b, &w);
        add_row(b, &w);
        if (only_once || (size = next_size(&b->o, size)) == 0)
            break;
    }
}

/* ---- p2p: ping-pong latency and windowed bandwidth between ranks 0 and 1 ------- */

#define TAG_PING 1
#define TAG_PONG 2
#define TAG_WINDOW 3
#define TAG_ACK 4

static void run_p2p(bench_t *b, p2p_row_t **rows_out, size_t *nrows_out)
{
    size_t nrows = 0, cap = 0;
    p2p_row_t *rows = NULL;
    int peer = 1 - b->rank, active = b->rank <= 1;
    loom_comm_t comm = b->comm;
    uint32_t ack = 0;
    say(b, "#\n# %10s  %12s  %16s\n", "size", "latency(us)", "bandwidth(MB/s)");
    for (size_t size = b->o.minbytes;;) {
        double lat = 0, bw = 0;
        int64_t wrong = 0;
        /* Every rank meets here each size, so the idle ones never wait long enough
         * for LOOM_TIMEOUT. */
        LCHECK(b, "barrier", loom_barrier(comm));
        if (active) {
            uint8_t *sb = (uint8_t *)b->sbuf, *rb = (uint8_t *)b->rbuf;
            for (size_t i = 0; i < size; i++)
                sb[i] = (uint8_t)data_value(b->rank, i);
            /* Checked exchange, then warm-up, then the timed ping-pong. */
            int rounds = (b->o.check ? 1 : 0) + b->o.warmup + b->o.iters;
            double t0 = 0;
            for (int it = 0; it < rounds; it++) {
                if (it == rounds - b->o.iters)
                    t0 = loom_now_s();
                if (b->rank == 0) {
                    LCHECK(b, "send", loom_send(sb, size, LOOM_UINT8, peer, TAG_PING, comm));
                    LCHECK(b, "recv", loom_recv(rb, size, LOOM_UINT8, peer, TAG_PONG, comm));
                } else {
                    LCHECK(b, "recv", loom_recv(rb, size, LOOM_UINT8, peer, TAG_PING, comm));
                    LCHECK(b, "send", loom_send(sb, size, LOOM_UINT8, peer, TAG_PONG, comm));
                }
                if (it == 0 && b->o.check)
                    for (size_t i = 0; i < size; i++)
                        wrong += rb[i] != (uint8_t)data_value(peer, i);
            }
            lat = (loom_now_s() - t0) / b->o.iters / 2 * 1e6;

            /* Large messages take fewer windows, as osu_bw does: about 1 GiB per size. */
            long windows = b->o.iters;
            if (size > 0 && (double)size * P2P_WINDOW * windows > 1073741824.0)
                windows = (long)(1073741824.0 / ((double)size * P2P_WINDOW));
            if (windows < 1)
                windows = 1;
            int warm = b->o.warmup < windows ? b->o.warmup : (int)windows;
            for (long it = 0; it < warm + windows; it++) {
                if (it == warm)
                    t0 = loom_now_s();
                for (int k = 0; k < P2P_WINDOW; k++) {
                    loom_status_t st = b->rank == 0
                        ? loom_isend(sb, size, LOOM_UINT8, peer, TAG_WINDOW, comm, &b->reqs[k])
                        : loom_irecv(rb, size, LOOM_UINT8, peer, TAG_WINDOW, comm, &b->reqs[k]);
                    if (st != LOOM_SUCCESS)
                        loom_fail(b, b->rank == 0 ? "isend" : "irecv", st);
                }
                b->nreq = P2P_WINDOW;
                complete(b);
                /* The receiver's acknowledgement ends the window only once all of it arrived. */
                if (b->rank == 0)
                    LCHECK(b, "recv", loom_recv(&ack, 1, LOOM_UINT32, peer, TAG_ACK, comm));
                else
                    LCHECK(b, "send", loom_send(&ack, 1, LOOM_UINT32, peer, TAG_ACK, comm));
            }
            double t = loom_now_s() - t0;
            bw = (double)size * P2P_WINDOW * (double)windows / t / 1e6;
        }
        double v[3] = {b->rank == 0 ? lat : 0, b->rank == 0 ? bw : 0, (double)wrong};
        LCHECK(b, "allreduce of the results",
               loom_allreduce(LOOM_IN_PLACE, v, 3, LOOM_FLOAT64, LOOM_SUM, comm));
        if (v[2] > 0)
            b->failed_tests++;
        say(b, "%12zu  %12.2f  %16.2f\n", size, v[0], v[1]);
        if (nrows == cap) {
            cap = cap ? 2 * cap : 64;
            p2p_row_t *grown = realloc(rows, cap * sizeof(*rows));
            if (!grown) {
                fprintf(stderr, "loom-perf: out of memory\n");
                exit(EXIT_ERROR);
            }
            rows = grown;
        }
        rows[nrows++] = (p2p_row_t){size, v[0], v[1]};
        if ((size = next_size(&b->o, size)) == 0)
            break;
    }
    *rows_out = rows;
    *nrows_out = nrows;
}

/* ---- main ------------------------------------------------------------------------ */

static void print_header(bench_t *b)
{
    rankinfo_t me;
    memset(&me, 0, sizeof(me));
    me.rank = b->rank;
    me.pid = (int32_t)getpid();
    me.local_rank = loom_comm_local_rank(b->comm);
    if (gethostname(me.host, sizeof(me.host) - 1) != 0)
        snprintf(me.host, sizeof(me.host), "unknown");
    if (b->rank == 0) {
        b->infos = calloc((size_t)b->n, sizeof(*b->infos));
        if (!b->infos) {
            fprintf(stderr, "loom-perf: out of memory\n");
            exit(EXIT_ERROR);
        }
    }
    LCHECK(b, "gather of the rank descriptions",
           loom_gather(&me, b->infos, sizeof(me), LOOM_UINT8, 0, b->comm));
    if (b->rank != 0)
        return;
    for (int r = 0; r < b->n; r++)
        b->infos[r].host[sizeof(b->infos[r].host) - 1] = '\0';
    print_table_header(b);
}

int main(int argc, char **argv)
{
    bench_t b;
    memset(&b, 0, sizeof(b));
    parse_args(argc, argv, &b.o);
    const opts_t *o = &b.o;
    /* Line-buffered even into loomrun's pipe, so progress shows as it is made. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o->transport && setenv("LOOM_TRANSPORT", o->transport, 1) != 0) {
        fprintf(stderr, "loom-perf: setenv: %s\n", strerror(errno));
        return EXIT_ERROR;
    }
    /* A named network transport is measured between every pair, also inside a node. */
    if (o->transport && strcmp(o->transport, "auto") != 0 && setenv("LOOM_SHM", "0", 0) != 0) {
        fprintf(stderr, "loom-perf: setenv: %s\n", strerror(errno));
        return EXIT_ERROR;
    }

    loom_status_t st = loom_init(&b.comm);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "loom-perf: loom_init failed: %s: %s\n", loom_strerror(st),
                loom_comm_last_error(NULL));
        return EXIT_ERROR;
    }
    b.rank = loom_comm_rank(b.comm);
    b.n = loom_comm_size(b.comm);
    /* The same arguments everywhere, so every rank takes these exits together. */
    /* Rank 0 says why before anyone leaves: a launcher that sees the first rank
     * exit stops the others, which could cut the message off. */
    if (o->root >= b.n && coll_rooted(o->coll)) {
        if (b.rank == 0)
            fprintf(stderr, "loom-perf: root %d is not a rank (%d ranks)\n", o->root, b.n);
        loom_barrier(b.comm);
        loom_comm_destroy(b.comm);
        return EXIT_ERROR;
    }
    if (o->coll == C_P2P && b.n < 2) {
        if (b.rank == 0)
            fprintf(stderr, "loom-perf: p2p needs at least 2 ranks (ranks 0 and 1 measure)\n");
        loom_comm_destroy(b.comm);
        return EXIT_ERROR;
    }

    b.buf_bytes = o->maxbytes < 64 || o->coll == C_BARRIER ? 64 : o->maxbytes;
    if (posix_memalign((void **)&b.sbuf, 4096, b.buf_bytes) != 0 ||
        posix_memalign((void **)&b.rbuf, 4096, b.buf_bytes) != 0 ||
        !(b.reqs = calloc(2 * (size_t)o->iters + P2P_WINDOW + 2 * (size_t)o->warmup + 4,
                          sizeof(*b.reqs)))) {
        fprintf(stderr, "loom-perf: rank %d: cannot allocate 2 x %zu bytes\n", b.rank, b.buf_bytes);
        return EXIT_ERROR;
    }
    memset(b.sbuf, 0, b.buf_bytes);
    memset(b.rbuf, 0, b.buf_bytes);
#ifdef LOOM_HAVE_CUDA
    if (o->gpu) {
        int ngpus = 0, local = loom_comm_local_rank(b.comm);
        cudaError_t e = cudaGetDeviceCount(&ngpus);
        if (e == cudaSuccess && ngpus == 0)
            e = cudaErrorNoDevice;
        if (e == cudaSuccess)
            e = cudaSetDevice((local < 0 ? 0 : local) % ngpus);
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&b.dsbuf, b.buf_bytes);
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&b.drbuf, b.buf_bytes);
        if (e != cudaSuccess) {
            fprintf(stderr, "loom-perf: rank %d: -g: %s\n", b.rank, cudaGetErrorString(e));
            return EXIT_ERROR;
        }
        LCHECK(&b, "loom_comm_set_device", loom_comm_set_device(b.comm, (local < 0 ? 0 : local) % ngpus));
    }
#endif

    print_header(&b);

    p2p_row_t *prows = NULL;
    size_t nprows = 0;
    if (o->coll == C_P2P) {
        run_p2p(&b, &prows, &nprows);
    } else {
        /* nccl-tests' nesting: types, then ops, then roots. */
        int t0 = o->type < 0 ? 0 : o->type, t1 = o->type < 0 ? n_types - 1 : o->type;
        int p0 = 0, p1 = 0, r0 = -1, r1 = -1;
        if (coll_reduces(o->coll)) {
            p0 = o->op < 0 ? 0 : o->op;
            p1 = o->op < 0 ? n_ops - 1 : o->op;
        } else {
            p0 = p1 = -1;
        }
        if (coll_rooted(o->coll)) {
            r0 = o->root < 0 ? 0 : o->root;
            r1 = o->root < 0 ? b.n - 1 : o->root;
        }
        if (o->coll == C_BARRIER)
            t0 = t1 = 7;   /* moves no data: one row */
        for (int t = t0; t <= t1; t++)
            for (int p = p0; p <= p1; p++)
                for (int r = r0; r <= r1; r++)
                    if (p < 0 || perf_op_takes_type(ops[p].op, types[t].dt))
                        time_test(&b, t, p, r < 0 ? 0 : r);
    }

    say(&b, "# %-20s : %d %s\n", "Out of bounds values", b.failed_tests,
        b.failed_tests ? "FAILED" : "OK");
    if (o->coll != C_P2P)
        say(&b, "# %-20s : %g\n", "Avg bus bandwidth", avg_busbw(&b));
    say(&b, "#\n# %s test concluded: %s\n", o->coll == C_P2P ? "Point-to-point" : "Collective",
        coll_names[o->coll]);

    int rc = b.failed_tests ? EXIT_WRONG : 0;
    if (b.rank == 0) {
        if ((o->json && write_json(&b, prows, nprows) != 0) ||
            (o->csv && write_csv(&b, prows, nprows) != 0) ||
            (o->plot && write_plot(&b, prows, nprows) != 0))
            rc = EXIT_ERROR;
    }
    /* Rank 0 has printed and written everything before any rank exits: launchers
     * end the whole job as soon as one rank exits with an error. */
    LCHECK(&b, "final barrier", loom_barrier(b.comm));
    st = loom_comm_destroy(b.comm);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "loom-perf: rank %d: loom_comm_destroy failed: %s\n", b.rank,
                loom_strerror(st));
        rc = EXIT_ERROR;
    }
    free(b.sbuf);
    free(b.rbuf);
#ifdef LOOM_HAVE_CUDA
    if (b.dsbuf)
        cudaFree(b.dsbuf);
    if (b.drbuf)
        cudaFree(b.drbuf);
#endif
    free(b.reqs);
    free(b.rows);
    free(b.infos);
    free(prows);
    return rc;
}
