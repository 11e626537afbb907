/* check_cuda_staging.c - Loom's GPU path over the CUDA double (no GPU needed;
 * tests/cuda-double/README.md): device memory the host cannot touch, streams
 * ordered by worker threads, kernels that fault on memory a GPU cannot reach.
 *
 *  - staging: every collective on device buffers through cuda/staging.c and
 *    the CUDA backend's device operations, with 1-4 ranks as threads
 *    (tests/thread_harness), with staging buffers small enough to force many
 *    passes; the host collectives in between refuse device memory.
 *  - core: a one-rank communicator: GPU buffers are staged, host/GPU mixes are
 *    LOOM_ERR_INVALID_ARG, non-blocking p2p on GPU buffers is
 *    LOOM_ERR_UNSUPPORTED; stream-ordered calls check their arguments; the
 *    accelerator table classifies through the driver.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-double/cuda_double.h"
#include "cuda/cuda_state.h"
#include "loom_cuda.h"
#include "base/reduce.h"
#include "base/types.h"
#include "thread_harness.h"

#define REQUIRE(cond, ...)                                                              \
    do {                                                                                \
        if (!(cond))                                                                    \
            ck_abort_msg(__VA_ARGS__);                                                  \
    } while (0)


/* What the CUDA backend's device operations take: a state with its streams and
 * the events they synchronize on (the rest is the communicator's, unused here). */
typedef struct {
    loom_cuda_state_t state;
} device_stream_t;

static int device_stream_open(device_stream_t *d)
{
    int ok = cudaStreamCreateWithFlags(&d->state.stream, cudaStreamNonBlocking) == cudaSuccess &&
             cudaStreamCreateWithFlags(&d->state.down, cudaStreamNonBlocking) == cudaSuccess &&
             cudaEventCreateWithFlags(&d->state.done, cudaEventDisableTiming) == cudaSuccess;
    for (int i = 0; i < LOOM_STAGING_MARKS && ok; i++)
        ok = cudaEventCreateWithFlags(&d->state.marks[i], cudaEventDisableTiming) == cudaSuccess;
    return ok;
}

static void device_stream_close(device_stream_t *d)
{
    for (int i = 0; i < LOOM_STAGING_MARKS; i++)
        if (d->state.marks[i])
            cudaEventDestroy(d->state.marks[i]);
    if (d->state.done)
        cudaEventDestroy(d->state.done);
    if (d->state.down)
        cudaStreamDestroy(d->state.down);
    if (d->state.stream)
        cudaStreamDestroy(d->state.stream);
}

/* The CUDA backend's device operations, but with a wait that does not wait:
 * a host collective may then read a staging buffer before the copy down into
 * it ran, or overwrite one before the copy up out of it ran. */
static loom_status_t no_wait(void *arg, int slot, loom_err_t *err)
{
    (void)arg, (void)slot, (void)err;
    return LOOM_SUCCESS;
}

static const loom_dev_ops_t *dev_ops_without_waits(void)
{
    static loom_dev_ops_t ops;
    ops = loom_cuda_dev_ops;
    ops.wait = no_wait;
    return &ops;
}

/* ---- staging, rank by rank ------------------------------------------------- */

static size_t esize(loom_dtype_t dt)
{
    return loom_dtype_size(dt);
}

/* How the passes run: overlapped, overlapped over a lazy double (work runs
 * only once the host waits: a missing wait always shows), or one at a time. */
typedef enum { OVERLAP, OVERLAP_LAZY, SERIAL } stage_mode_t;

static const char *const mode_names[] = {"overlapped", "overlapped, lazy double", "serial"};

typedef struct {
    loom_coll_t coll;
    loom_dtype_t dt;
    loom_op_t op;
    size_t count;
    int in_place;
    size_t chunk;
    int nranks;
    stage_mode_t mode;
    const loom_dev_ops_t *dev;   /* NULL: the CUDA backend's */
    int quiet;                   /* a wrong result is expected: report it, don't fail */
    _Atomic int failed;
    char msg[512];
} stage_case_t;

static double value_of(int rank, size_t i)
{
    return (double)((int)((rank * 7 + i * 3) % 11) - 5);
}

static void put(loom_dtype_t dt, void *buf, size_t i, double v)
{
    switch (dt) {
    case LOOM_INT32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case LOOM_UINT8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)fmod(v + 256.0 * 1024, 256.0); break;
    case LOOM_FLOAT16: ((uint16_t *)buf)[i] = loom_float_to_half((float)v); break;
    case LOOM_FLOAT32: ((float *)buf)[i] = (float)v; break;
    default: ((double *)buf)[i] = v; break;
    }
}

/* Element i of every rank's contribution reduced, as the dtype holds it. */
static double reduced(const stage_case_t *t, size_t i)
{
    double acc = 0;
    for (int r = 0; r < t->nranks; r++) {
        double v = value_of(r, i);
        if (t->dt == LOOM_UINT8)
            v = fmod(v + 256.0, 256.0);
        if (r == 0)
            acc = v;
        else if (t->op == LOOM_SUM || t->op == LOOM_AVG)
            acc += v;
        else if (t->op == LOOM_PROD)
            acc *= v;
        else if (t->op == LOOM_MIN)
            acc = v < acc ? v : acc;
        else
            acc = v > acc ? v : acc;
    }
    if (t->op == LOOM_AVG)
        acc = t->dt == LOOM_INT32 ? trunc(acc / t->nranks) : (double)((float)acc / (float)t->nranks);
    if (t->dt == LOOM_UINT8)
        acc = fmod(acc, 256.0);
    return acc;
}

static void stage_fail(stage_case_t *t, loom_ctx_t *ctx, const char *fmt, size_t i, double got, double want)
{
    if (atomic_exchange(&t->failed, 1) == 0)
        snprintf(t->msg, sizeof(t->msg), "%s %s %s count %zu chunk %zu ranks %d%s, %s, rank %d: %s %zu: got %g, want %g",
                 loom_coll_name(t->coll), loom_dtype_name(t->dt), loom_op_name(t->op), t->count, t->chunk,
                 t->nranks, t->in_place ? " in place" : "", mode_names[t->mode], ctx->rank, fmt, i, got, want);
    ctx->tp_ops->abort(ctx->tp, LOOM_ERR_ABORTED);
}

static double get(loom_dtype_t dt, const void *buf, size_t i)
{
    switch (dt) {
    case LOOM_INT32: return ((const int32_t *)buf)[i];
    case LOOM_UINT8: return ((const uint8_t *)buf)[i];
    case LOOM_FLOAT16: return loom_half_to_float(((const uint16_t *)buf)[i]);
    case LOOM_FLOAT32: return ((const float *)buf)[i];
    default: return ((const double *)buf)[i];
    }
}

/* v as an element of dt reads back. */
static double stored(loom_dtype_t dt, double v)
{
    char tmp[8];
    put(dt, tmp, 0, v);
    return get(dt, tmp, 0);
}

static loom_status_t harness_host(void *arg, const loom_coll_args_t *a)
{
    loom_ctx_t *ctx = arg;
    int device;
    /* A barrier passes the caller's buffers along unread. */
    if (a->coll != LOOM_COLL_BARRIER &&
        ((a->sendbuf && loom_cuda_ptr_on_device(a->sendbuf, &device)) ||
         (a->recvbuf && loom_cuda_ptr_on_device(a->recvbuf, &device))))
        return loom_err_set(ctx->err, LOOM_ERR_INTERNAL, "a host collective on device memory");
    const loom_algo_t *algo = loom_algo_select(ctx, a, NULL);
    if (!algo)
        return loom_err_set(ctx->err, LOOM_ERR_INTERNAL, "no algorithm");
    uint64_t total = a->count;
    if (a->coll == LOOM_COLL_ALLGATHERV) {
        total = 0;
        for (int i = 0; i < ctx->size; i++)
            total += a->counts[i];
    } else if (a->coll == LOOM_COLL_ALLTOALLV) {
        total = 0;
    }
    ctx->seq++;
    ctx->desc = (uint32_t)a->coll | (uint32_t)a->dtype << 8 | (uint32_t)a->op << 16;
    ctx->total = total;
    return algo->run(ctx, a);
}

/* Counts of the vector collectives: some blocks empty, some longer than others. */
static size_t vcount(const stage_case_t *t, int from, int to)
{
    return (size_t)((from * 3 + to * 5) % 4) * t->count / 2;
}

static void stage_rank(loom_ctx_t *ctx, void *arg)
{
    stage_case_t *t = arg;
    const int P = ctx->size, me = ctx->rank;
    const loom_dtype_t dt = t->dt;
    const size_t es = esize(dt), n = t->count;
    const int root = (P - 1) / 2;
    size_t send_elems = n, recv_elems = n;
    size_t counts[4], displs[4], scounts[4], sdispls[4];
    size_t stotal = 0, rtotal = 0;
    for (int i = 0; i < P; i++) {
        scounts[i] = t->coll == LOOM_COLL_ALLTOALLV ? vcount(t, me, i) : 0;
        counts[i] = t->coll == LOOM_COLL_ALLTOALLV ? vcount(t, i, me) : vcount(t, i, 0);
        sdispls[i] = stotal;
        displs[i] = rtotal + 3; /* gaps between blocks stay untouched */
        stotal += scounts[i];
        rtotal += counts[i] + 3;
    }
    switch (t->coll) {
    case LOOM_COLL_REDUCE_SCATTER:
    case LOOM_COLL_ALLTOALL:
    case LOOM_COLL_SCATTER: send_elems = n * P; break;
    case LOOM_COLL_ALLTOALLV: send_elems = stotal; break;
    case LOOM_COLL_ALLGATHERV: send_elems = counts[me]; break;
    default: break;
    }
    switch (t->coll) {
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_ALLTOALL:
    case LOOM_COLL_GATHER: recv_elems = n * P; break;
    case LOOM_COLL_REDUCE_SCATTER: recv_elems = t->in_place ? n * P : n; break;
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALLV: recv_elems = rtotal + 3; break;
    default: break;
    }
    /* The buffers on the device, and their host images the test writes and reads. */
    char *hsend = calloc(send_elems + 1, es), *hrecv = calloc(recv_elems + 1, es);
    char *send = NULL, *recv = NULL, *scratch = NULL, *pinned = NULL;
    device_stream_t dev = {0};
    if (!hsend || !hrecv || cudaMalloc((void **)&send, (send_elems + 1) * es) != cudaSuccess ||
        cudaMalloc((void **)&recv, (recv_elems + 1) * es) != cudaSuccess ||
        cudaMalloc((void **)&scratch, t->chunk) != cudaSuccess ||
        cudaHostAlloc((void **)&pinned, 2 * LOOM_STAGING_SETS * t->chunk, 0) != cudaSuccess ||
        !device_stream_open(&dev)) {
        stage_fail(t, ctx, "allocating on the device failed; element", 0, 0, 0);
        goto out;
    }
    /* Inputs: element i of block b from this rank is value_of(me, b * n + i), so
     * each destination can tell what it got. */
    for (size_t i = 0; i < send_elems; i++)
        put(dt, hsend, i, value_of(me, i));
    for (size_t i = 0; i < recv_elems; i++)
        put(dt, hrecv, i, -99);
    char *in_place_src = NULL;
    loom_coll_args_t a = {.coll = t->coll, .sendbuf = send, .recvbuf = recv, .count = n,
                          .esize = es, .dtype = dt, .op = t->op, .root = root};
    if (t->coll == LOOM_COLL_ALLGATHERV || t->coll == LOOM_COLL_ALLTOALLV) {
        a.counts = counts;
        a.displs = displs;
        a.count = counts[me];
    }
    if (t->coll == LOOM_COLL_ALLTOALLV) {
        a.scounts = scounts;
        a.sdispls = sdispls;
    }
    if (t->in_place) {
        /* The core's normal form of an in-place call (algorithms.h). */
        if (t->coll == LOOM_COLL_ALLGATHER) {
            for (size_t i = 0; i < n; i++)
                put(dt, hrecv, me * n + i, value_of(me, i));
            in_place_src = recv + (size_t)me * n * es;
        } else {
            memcpy(hrecv, hsend, send_elems * es);
            in_place_src = recv;
        }
        a.sendbuf = in_place_src;
    }
    if (t->coll == LOOM_COLL_BROADCAST) {
        a.sendbuf = a.recvbuf = recv;
        if (me == root)
            memcpy(hrecv, hsend, n * es);
    }
    if ((t->coll == LOOM_COLL_GATHER || t->coll == LOOM_COLL_REDUCE) && me != root && !t->in_place)
        a.recvbuf = NULL;
    if (t->coll == LOOM_COLL_SCATTER && me != root)
        a.sendbuf = NULL;

    if (cudaMemcpy(send, hsend, (send_elems + 1) * es, cudaMemcpyHostToDevice) != cudaSuccess ||
        cudaMemcpy(recv, hrecv, (recv_elems + 1) * es, cudaMemcpyHostToDevice) != cudaSuccess) {
        stage_fail(t, ctx, "upload failed; element", 0, 0, 0);
        goto out;
    }
    loom_staging_t s = {.rank = me, .size = P, .err = ctx->err, .run_host = harness_host,
                        .host_arg = ctx, .dev = t->dev ? t->dev : &loom_cuda_dev_ops,
                        .dev_arg = &dev.state, .dev_scratch = scratch, .chunk_bytes = t->chunk,
                        .overlap = t->mode != SERIAL};
    for (int i = 0; i < LOOM_STAGING_SETS; i++) {
        s.sets[i].send = pinned + (size_t)(2 * i) * t->chunk;
        s.sets[i].recv = s.sets[i].send + t->chunk;
    }
    loom_status_t st = loom_staging_run(&s, &a);
    if (st != LOOM_SUCCESS) {
        if (atomic_exchange(&t->failed, 1) == 0)
            snprintf(t->msg, sizeof(t->msg), "%s %s ranks %d chunk %zu, %s, rank %d: status %d: %.300s",
                     loom_coll_name(t->coll), loom_dtype_name(dt), P, t->chunk, mode_names[t->mode],
                     me, (int)st, ctx->err->msg);
        ctx->tp_ops->abort(ctx->tp, LOOM_ERR_ABORTED);
        goto out;
    }
    if (cudaMemcpy(hrecv, recv, (recv_elems + 1) * es, cudaMemcpyDeviceToHost) != cudaSuccess) {
        stage_fail(t, ctx, "download failed; element", 0, 0, 0);
        goto out;
    }
#define EXPECT(what, idx, got_, want_)                                                  \
    do {                                                                                \
        double got = (got_), want = (want_);                                            \
        if (got != want) {                                                              \
            stage_fail(t, ctx, what, (idx), got, want);                                       \
            goto out;                                                                   \
        }                                                                               \
    } while (0)
    switch (t->coll) {
    case LOOM_COLL_ALLREDUCE:
    case LOOM_COLL_REDUCE:
        if (t->coll == LOOM_COLL_REDUCE && me != root)
            break;
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, hrecv, i), reduced(t, i));
        break;
    case LOOM_COLL_REDUCE_SCATTER:
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, hrecv, i), reduced(t, me * n + i));
        break;
    case LOOM_COLL_BROADCAST:
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, hrecv, i), stored(dt, value_of(root, i)));
        break;
    case LOOM_COLL_ALLGATHER:
    case LOOM_COLL_GATHER:
        if (t->coll == LOOM_COLL_GATHER && me != root)
            break;
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < n; i++)
                EXPECT("element", r * n + i, get(dt, hrecv, r * n + i), stored(dt, value_of(r, i)));
        break;
    case LOOM_COLL_SCATTER:
        for (size_t i = 0; i < n; i++)
            EXPECT("element", i, get(dt, hrecv, i), stored(dt, value_of(root, me * n + i)));
        break;
    case LOOM_COLL_ALLTOALL:
        for (int r = 0; r < P; r++)
            for (size_t i = 0; i < n; i++)
                EXPECT("element", r * n + i, get(dt, hrecv, r * n + i),
                       stored(dt, value_of(r, me * n + i)));
        break;
    case LOOM_COLL_ALLGATHERV:
    case LOOM_COLL_ALLTOALLV:
        for (int r = 0; r < P; r++) {
            /* Rank r's block for me started at its sdispls[me]. */
            size_t from = 0;
            if (t->coll == LOOM_COLL_ALLTOALLV)
                for (int j = 0; j < me; j++)
                    from += vcount(t, r, j);
            for (size_t i = 0; i < counts[r]; i++)
                EXPECT("element", displs[r] + i, get(dt, hrecv, displs[r] + i),
                       stored(dt, value_of(r, from + i)));
            for (size_t g = displs[r] - 3; g < displs[r]; g++)
                EXPECT("gap element", g, get(dt, hrecv, g), stored(dt, -99));
        }
        break;
    default: break;
    }
#undef EXPECT
out:
    device_stream_close(&dev);
    cudaFree(send);
    cudaFree(recv);
    cudaFree(scratch);
    cudaFreeHost(pinned);
    free(hsend);
    free(hrecv);
}

static void run_case(stage_case_t *t)
{
    cuda_double_set_lazy(t->mode == OVERLAP_LAZY);
    int left = loom_harness_run(t->nranks, stage_rank, t);
    cuda_double_set_lazy(0);
    /* A rank that finds a wrong result aborts the others: messages may be left. */
    if (t->quiet)
        return;
    REQUIRE(!t->failed, "%s", t->msg);
    REQUIRE(left == 0, "%s %s ranks %d: %d messages left over", loom_coll_name(t->coll),
            loom_dtype_name(t->dt), t->nranks, left);
}

/* The smallest chunk makes many passes, so it runs with the passes
 * overlapped on an eager and on a lazy double; the middle one one pass at a
 * time, the largest overlapped. */
static const size_t chunks[] = {64, 200, 4096};

static void run_stage_case(loom_coll_t coll, loom_dtype_t dt, loom_op_t op, size_t count,
                           int in_place, size_t ch, int nranks)
{
    const size_t chunk = chunks[ch] < 16u * (size_t)nranks ? 16u * (size_t)nranks : chunks[ch];
    const stage_mode_t modes[3][2] = {{OVERLAP, OVERLAP_LAZY}, {SERIAL, SERIAL}, {OVERLAP, OVERLAP}};
    for (int m = 0; m < (modes[ch][0] == modes[ch][1] ? 1 : 2); m++) {
        stage_case_t t = {.coll = coll, .dt = dt, .op = op, .count = count, .in_place = in_place,
                          .chunk = chunk, .nranks = nranks, .mode = modes[ch][m]};
        run_case(&t);
    }
}

START_TEST(test_staging_reductions)
{
    int nranks = _i + 1;
    static const struct { loom_dtype_t dt; loom_op_t op; } cases[] = {
        {LOOM_INT32, LOOM_SUM}, {LOOM_INT32, LOOM_PROD}, {LOOM_INT32, LOOM_MIN},
        {LOOM_INT32, LOOM_MAX}, {LOOM_INT32, LOOM_AVG}, {LOOM_UINT8, LOOM_PROD},
        {LOOM_FLOAT16, LOOM_SUM}, {LOOM_FLOAT32, LOOM_AVG}, {LOOM_FLOAT64, LOOM_MIN},
    };
    const loom_coll_t colls[] = {LOOM_COLL_ALLREDUCE, LOOM_COLL_REDUCE, LOOM_COLL_REDUCE_SCATTER};
    for (size_t c = 0; c < 3; c++)
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
            for (size_t ch = 0; ch < 3; ch++)
                for (int in_place = 0; in_place < 2; in_place++)
                    run_stage_case(colls[c], cases[k].dt, cases[k].op, 37, in_place, ch, nranks);
}
END_TEST

START_TEST(test_staging_data_movement)
{
    int nranks = _i + 1;
    const loom_coll_t colls[] = {LOOM_COLL_BROADCAST, LOOM_COLL_ALLGATHER, LOOM_COLL_GATHER,
                                 LOOM_COLL_SCATTER, LOOM_COLL_ALLTOALL, LOOM_COLL_ALLGATHERV,
                                 LOOM_COLL_ALLTOALLV, LOOM_COLL_BARRIER};
    for (size_t c = 0; c < sizeof colls / sizeof colls[0]; c++)
        for (size_t ch = 0; ch < 3; ch++)
            for (int dt = 0; dt < 2; dt++) {
                loom_dtype_t type = dt ? LOOM_FLOAT32 : LOOM_UINT8;
                int can_in_place = colls[c] == LOOM_COLL_ALLGATHER || colls[c] == LOOM_COLL_ALLTOALL;
                run_stage_case(colls[c], type, LOOM_SUM, 29, 0, ch, nranks);
                if (can_in_place)
                    run_stage_case(colls[c], type, LOOM_SUM, 29, 1, ch, nranks);
            }
}
END_TEST

/* The lazy double catches a wait the overlapped passes leave out: with waits
 * that do not wait, host collectives read staging buffers whose copies down
 * have not run, and every collective gets wrong data. (Were the double to run
 * copies the moment they are queued, this could pass by luck.) */
START_TEST(test_staging_missing_wait_shows)
{
    const loom_coll_t colls[] = {LOOM_COLL_ALLREDUCE, LOOM_COLL_REDUCE_SCATTER,
                                 LOOM_COLL_BROADCAST, LOOM_COLL_ALLGATHER, LOOM_COLL_ALLTOALLV};
    for (size_t c = 0; c < sizeof colls / sizeof colls[0]; c++) {
        stage_case_t t = {.coll = colls[c], .dt = LOOM_INT32, .op = LOOM_SUM, .count = 37,
                          .chunk = 64, .nranks = 2, .mode = OVERLAP_LAZY,
                          .dev = dev_ops_without_waits(), .quiet = 1};
        run_case(&t);
        REQUIRE(t.failed, "%s without waits on a lazy double gave the right result",
                loom_coll_name(colls[c]));
        /* The same case with the waits is right. */
        stage_case_t ok = {.coll = colls[c], .dt = LOOM_INT32, .op = LOOM_SUM, .count = 37,
                           .chunk = 64, .nranks = 2, .mode = OVERLAP_LAZY};
        run_case(&ok);
    }
}
END_TEST

/* ---- the core's hooks, on a one-rank communicator --------------------------- */

static loom_comm_t one_rank_comm(void)
{
    loom_config_t cfg = LOOM_CONFIG_INIT;
    cfg.rank = 0;
    cfg.size = 1;
    loom_comm_t c = NULL;
    loom_status_t st = loom_comm_create(&cfg, &c);
    REQUIRE(st == LOOM_SUCCESS, "loom_comm_create: %s: %s", loom_strerror(st),
            loom_comm_last_error(NULL));
    return c;
}

START_TEST(test_core_dispatch)
{
    loom_comm_t c = one_rank_comm();
    const size_t n = 1000;
    float *dsend = NULL, *drecv = NULL, *host = malloc(n * 4), *got = malloc(n * 4);
    REQUIRE(cudaMalloc((void **)&dsend, n * 4) == cudaSuccess &&
                cudaMalloc((void **)&drecv, n * 4) == cudaSuccess && host && got,
            "allocation failed");
    for (size_t i = 0; i < n; i++) {
        host[i] = (float)i;
        got[i] = -1;
    }
    ck_assert_int_eq(cudaMemcpy(dsend, host, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(drecv, got, n * 4, cudaMemcpyHostToDevice), cudaSuccess);
    cuda_double_counts_t before, after;
    cuda_double_counts(&before);
    loom_status_t st = loom_allreduce(dsend, drecv, n, LOOM_FLOAT32, LOOM_SUM, c);
    ck_assert_msg(st == LOOM_SUCCESS, "allreduce: %s: %s", loom_strerror(st), loom_comm_last_error(c));
    cuda_double_counts(&after);
    /* One rank reduces its own block where it is: a device copy, and one down
     * for the (one-rank) allgatherv. */
    ck_assert_msg(after.d2d + after.d2h + after.h2d > before.d2d + before.d2h + before.h2d,
                  "GPU buffers did not reach the CUDA backend");
    ck_assert_int_eq(cudaMemcpy(got, drecv, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < n; i++)
        REQUIRE(got[i] == (float)i, "allreduce element %zu: %g", i, got[i]);

    /* Non-blocking: executed by the communicator's worker. */
    loom_request_t req;
    ck_assert_int_eq(loom_iallgather(dsend, drecv, n, LOOM_FLOAT32, c, &req), LOOM_SUCCESS);
    ck_assert_int_eq(loom_wait(req), LOOM_SUCCESS);

    ck_assert_int_eq(loom_allreduce(dsend, host, n, LOOM_FLOAT32, LOOM_SUM, c),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "recvbuf is host memory") &&
                      strstr(loom_comm_last_error(c), "GPU"),
                  "unclear message: %s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_broadcast(drecv, n, LOOM_FLOAT32, 0, c), LOOM_SUCCESS);
    ck_assert_int_eq(loom_alltoall(host, drecv, n, LOOM_FLOAT32, c), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_isend(dsend, n, LOOM_FLOAT32, 0, 1, c, &req), LOOM_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(loom_comm_last_error(c), "GPU buffers"), "%s", loom_comm_last_error(c));
    /* An argument error does not break the communicator. */
    ck_assert_int_eq(loom_allreduce(host, host, n, LOOM_FLOAT32, LOOM_SUM, c), LOOM_SUCCESS);

    ck_assert_int_eq(loom_comm_destroy(c), LOOM_SUCCESS);
    cudaFree(dsend);
    cudaFree(drecv);
    free(host);
    free(got);
}
END_TEST

/* Stream-ordered calls check their arguments before touching CUDA, so these
 * hold with or without a GPU. */
START_TEST(test_stream_argument_errors)
{
    loom_comm_t c = one_rank_comm();
    float x[4] = {0};
    cudaStream_t s = 0;
    ck_assert_int_eq(loom_allreduce_stream(x, x, 4, LOOM_FLOAT32, LOOM_SUM, NULL, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(NULL), "allreduce_stream"), "%s",
                  loom_comm_last_error(NULL));
    ck_assert_int_eq(loom_allreduce_stream(x, x, 4, (loom_dtype_t)42, LOOM_SUM, c, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "unknown dtype"), "%s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_reduce_stream(x, x, 4, LOOM_FLOAT32, (loom_op_t)9, 0, c, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_broadcast_stream(x, 4, LOOM_FLOAT32, 1, c, s), LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "root 1"), "%s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_send_stream(x, 4, LOOM_FLOAT32, -1, 0, c, s), LOOM_ERR_INVALID_ARG);
    ck_assert_msg(strstr(loom_comm_last_error(c), "peer -1"), "%s", loom_comm_last_error(c));
    ck_assert_int_eq(loom_allgatherv_stream(x, 1, x, NULL, NULL, LOOM_FLOAT32, c, s),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_comm_set_device(NULL, 0), LOOM_ERR_INVALID_ARG);
    ck_assert_int_eq(loom_comm_stream_status(c), LOOM_SUCCESS);
    ck_assert_int_eq(loom_comm_destroy(c), LOOM_SUCCESS);
}
END_TEST

/* A CUDA build's core calls the CUDA table, which classifies through the
 * same code as loom_cuda_*_on_device (here with the double). */
START_TEST(test_accel_table_is_cuda)
{
    ck_assert_ptr_eq(loom_accel, &loom_accel_cuda);
    ck_assert_str_eq(loom_accel->name, "cuda");
    char text[256] = "";
    loom_accel->describe(text, sizeof(text));
    ck_assert_msg(strncmp(text, "CUDA", 4) == 0, "%s", text);
    float *d = NULL, h[16];
    ck_assert_int_eq(cudaMalloc((void **)&d, 64), cudaSuccess);
    int device = -1, on_device = -1;
    ck_assert_int_eq(loom_accel->ptr_memory(d, &device), 1);
    ck_assert_int_eq(loom_accel->ptr_memory(h, &device), 0);
    loom_coll_args_t a = {.coll = LOOM_COLL_ALLREDUCE, .sendbuf = d, .recvbuf = d, .count = 16,
                          .esize = 4, .dtype = LOOM_FLOAT32};
    loom_err_t err;
    loom_err_clear(&err);
    ck_assert_int_eq(loom_accel->coll_memory(&a, 2, 0, &on_device, &device, &err), LOOM_SUCCESS);
    ck_assert_int_eq(on_device, 1);
    a.recvbuf = h;
    ck_assert_int_eq(loom_accel->coll_memory(&a, 2, 0, &on_device, &device, &err),
                     LOOM_ERR_INVALID_ARG);
    cudaFree(d);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cuda staging");
    TCase *staging = tcase_create("staging");
    tcase_set_timeout(staging, 300);
    tcase_add_loop_test(staging, test_staging_reductions, 0, 4);
    tcase_add_loop_test(staging, test_staging_data_movement, 0, 4);
    tcase_add_test(staging, test_staging_missing_wait_shows);
    suite_add_tcase(s, staging);
    TCase *core = tcase_create("core");
    tcase_set_timeout(core, 120);
    tcase_add_test(core, test_core_dispatch);
    tcase_add_test(core, test_accel_table_is_cuda);
    tcase_add_test(core, test_stream_argument_errors);
    suite_add_tcase(s, core);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
