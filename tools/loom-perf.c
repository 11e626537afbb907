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

/* Exit codes: results were wrong; bad usage or a Loom error. */
#define EXIT_WRONG 1
#define EXIT_ERROR 2

/* ---- what can be measured --------------------------------------------------- */

typedef enum {
    C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_ALLTOALL,
    C_GATHER, C_SCATTER, C_SENDRECV, C_BARRIER, C_P2P, C_COUNT
} coll_t;

static const char *const coll_names[C_COUNT] = {
    "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
    "gather", "scatter", "sendrecv", "barrier", "p2p"};

static int coll_reduces(coll_t c)
{
    return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCE_SCATTER;
}

static int coll_rooted(coll_t c)
{
    return c == C_BROADCAST || c == C_REDUCE || c == C_GATHER || c == C_SCATTER;
}

/* nccl-tests splits the size over the ranks for these: the size column is the
 * total buffer, count the per-rank block, and algbw counts every block. */
static int coll_per_rank_blocks(coll_t c)
{
    return c == C_ALLGATHER || c == C_REDUCE_SCATTER || c == C_ALLTOALL || c == C_GATHER ||
           c == C_SCATTER;
}

/* busbw = algbw * factor: the bandwidth a ring-optimal algorithm needs on each
 * link, comparable across collectives and rank counts (nccl-tests PERFORMANCE.md). */
static double busbw_factor(coll_t c, int n)
{
    switch (c) {
    case C_ALLREDUCE:
        return 2.0 * (n - 1) / n;
    case C_REDUCE_SCATTER: case C_ALLGATHER: case C_ALLTOALL: case C_GATHER: case C_SCATTER:
        return (double)(n - 1) / n;
    case C_BROADCAST: case C_REDUCE: case C_SENDRECV:
        return 1.0;
    default:
        return 0.0;
    }
}

/* In nccl-tests' order and spelling, which "-d all" follows and the type column prints. */
static const struct { const char *name; loom_dtype_t dt; } types[] = {
    {"int8", LOOM_INT8},     {"uint8", LOOM_UINT8},   {"int32", LOOM_INT32},
    {"uint32", LOOM_UINT32}, {"int64", LOOM_INT64},   {"uint64", LOOM_UINT64},
    {"half", LOOM_FLOAT16},  {"float", LOOM_FLOAT32}, {"double", LOOM_FLOAT64},
    {"bfloat16", LOOM_BFLOAT16}};
#define NTYPES ((int)(sizeof(types) / sizeof(types[0])))

static const struct { const char *alias; const char *name; } type_aliases[] = {
    {"float16", "half"},   {"fp16", "half"},     {"float32", "float"}, {"fp32", "float"},
    {"float64", "double"}, {"fp64", "double"},   {"bf16", "bfloat16"}, {"char", "int8"},
    {"int", "int32"}};

static const struct { const char *name; loom_op_t op; } ops[] = {
    {"sum", LOOM_SUM}, {"prod", LOOM_PROD}, {"max", LOOM_MAX}, {"min", LOOM_MIN},
    {"avg", LOOM_AVG}};
#define NOPS ((int)(sizeof(ops) / sizeof(ops[0])))

/* ---- options ---------------------------------------------------------------- */

typedef struct {
    coll_t coll;
    size_t minbytes, maxbytes, stepbytes, stepfactor;
    int iters, warmup, check, nonblocking, average;
    int type;        /* index in types[]; -1: all */
    int op;          /* index in ops[]; -1: all */
    int root;        /* -1: all */
    const char *json, *csv, *plot;
    const char *transport;   /* -t; NULL: LOOM_TRANSPORT or Loom's default */
    int gpu;                 /* -g: device buffers */
} opts_t;

static void usage(FILE *f)
{
    fprintf(f,
        "usage: loom-perf COLL [options]      (run under loomrun, mpirun, srun, torchrun...)\n"
        "COLL: allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter\n"
        "      sendrecv barrier, or p2p (latency and bandwidth between ranks 0 and 1)\n"
        "\n"
        "  -b, --minbytes N      smallest size (default 8); K, M, G suffixes (powers of 1024)\n"
        "  -e, --maxbytes N      largest size (default 128M)\n"
        "  -f, --stepfactor F    multiply the size by F at each step (default 2)\n"
        "  -i, --stepbytes N     add N bytes at each step instead (excludes -f)\n"
        "  -n, --iters N         timed iterations per size (default 20)\n"
        "  -w, --warmup_iters N  untimed iterations at the largest and smallest size (default 5)\n"
        "  -c, --check 0|1       check every result; 0 prints #wrong as N/A (default 1)\n"
        "  -d, --datatype T|all  int8 uint8 int32 uint32 int64 uint64 half|float16\n"
        "                        float|float32 double|float64 bfloat16 (default float)\n"
        "  -o, --op OP|all       sum prod max min avg (default sum; reducing collectives)\n"
        "  -r, --root N|all      root of broadcast, reduce, gather, scatter (default 0)\n"
        "  -z, --blocking 0|1    0: blocking calls (default); 1: non-blocking loom_i* calls,\n"
        "                        all iterations posted back to back, then waited for.\n"
        "                        (nccl-tests' -z 1 means the opposite: wait after each call.)\n"
        "  -a, --average 0..3    time reported: 0 rank 0's, 1 mean (default), 2 min, 3 max\n"
        "                        over the ranks\n"
        "  -t, --transport NAME  tcp, ibverbs or auto (sets LOOM_TRANSPORT); tcp and ibverbs\n"
        "                        also carry the ranks of one node (LOOM_SHM=0 unless set),\n"
        "                        so the network is measured\n"
        "  -g, --gpu             buffers in GPU memory (CUDA builds): local rank k uses\n"
        "                        GPU k modulo the GPU count; results are checked on the host\n"
        "  -J, --json FILE       also write the results as JSON\n"
        "      --csv FILE        also write the results as CSV\n"
        "      --plot FILE.svg   draw busbw and time against size (SVG)\n"
        "  -h, --help            show this help\n"
        "\n"
        "Columns: size (B), count (elements), type, redop, root, then for out-of-place\n"
        "and in-place: time (us per operation), algbw = size/time and busbw = algbw *\n"
        "factor (GB/s, 1e9 B/s), #wrong (mismatching elements). busbw factors: allreduce\n"
        "2(n-1)/n; reduce_scatter, allgather, alltoall, gather, scatter (n-1)/n; broadcast,\n"
        "reduce, sendrecv 1. Exit status: 0 all results right, 1 some wrong, 2 an error.\n");
}

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !isfinite(v) || v < 0)
        return -1;
    double unit = 1;
    switch (*end) {
    case 'k': case 'K': unit = 1024.0; end++; break;
    case 'm': case 'M': unit = 1024.0 * 1024; end++; break;
    case 'g': case 'G': unit = 1024.0 * 1024 * 1024; end++; break;
    default: break;
    }
    if (*end || v * unit > (double)(SIZE_MAX / 4))
        return -1;
    *out = (size_t)(v * unit);
    return 0;
}

static int parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 0);
    if (end == s || *end || errno || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* "all_reduce_perf", "reduce-scatter" and "allreduce" all name allreduce/...:
 * people come with nccl-tests' binary names in their fingers. */
static int find_coll(const char *arg)
{
    char norm[64];
    size_t n = 0;
    for (const char *p = arg; *p && n + 1 < sizeof(norm); p++)
        if (*p != '_' && *p != '-')
            norm[n++] = *p;
    norm[n] = '\0';
    if (n > 4 && strcmp(norm + n - 4, "perf") == 0)
        norm[n - 4] = '\0';
    for (int c = 0; c < C_COUNT; c++) {
        char name[64];
        size_t k = 0;
        for (const char *p = coll_names[c]; *p; p++)
            if (*p != '_')
                name[k++] = *p;
        name[k] = '\0';
        if (strcmp(norm, name) == 0)
            return c;
    }
    return -1;
}

static int find_type(const char *s)
{
    for (size_t i = 0; i < sizeof(type_aliases) / sizeof(type_aliases[0]); i++)
        if (strcmp(s, type_aliases[i].alias) == 0)
            s = type_aliases[i].name;
    for (int i = 0; i < NTYPES; i++)
        if (strcmp(s, types[i].name) == 0)
            return i;
    return -1;
}

static int find_op(const char *s)
{
    for (int i = 0; i < NOPS; i++)
        if (strcmp(s, ops[i].name) == 0)
            return i;
    return -1;
}

__attribute__((format(printf, 1, 2))) _Noreturn static void die_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loom-perf: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\nTry 'loom-perf --help'.\n");
    va_end(ap);
    exit(EXIT_ERROR);
}

static void parse_args(int argc, char **argv, opts_t *o)
{
    *o = (opts_t){.coll = C_COUNT, .minbytes = 8, .maxbytes = (size_t)128 << 20,
                  .stepbytes = 0, .stepfactor = 2, .iters = 20, .warmup = 5, .check = 1,
                  .nonblocking = 0, .average = 1, .type = 7 /* float */, .op = 0, .root = 0,
                  .transport = NULL};
    enum { OPT_CSV = 256, OPT_PLOT };
    static const struct option longopts[] = {
        {"minbytes", required_argument, 0, 'b'},   {"maxbytes", required_argument, 0, 'e'},
        {"stepfactor", required_argument, 0, 'f'}, {"stepbytes", required_argument, 0, 'i'},
        {"iters", required_argument, 0, 'n'},      {"warmup_iters", required_argument, 0, 'w'},
        {"check", required_argument, 0, 'c'},      {"datatype", required_argument, 0, 'd'},
        {"op", required_argument, 0, 'o'},         {"root", required_argument, 0, 'r'},
        {"blocking", required_argument, 0, 'z'},   {"average", required_argument, 0, 'a'},
        {"transport", required_argument, 0, 't'},  {"json", required_argument, 0, 'J'},
        {"csv", required_argument, 0, OPT_CSV},    {"plot", required_argument, 0, OPT_PLOT},
        {"help", no_argument, 0, 'h'},             {"gpu", no_argument, 0, 'g'},
        {0, 0, 0, 0}};
    int saw_f = 0, saw_i = 0, opt;
    while ((opt = getopt_long(argc, argv, ":b:e:f:i:n:w:c:d:o:r:z:a:t:J:gh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'b':
            if (parse_size(optarg, &o->minbytes))
                die_usage("invalid size for -b/--minbytes: '%s'", optarg);
            break;
        case 'e':
            if (parse_size(optarg, &o->maxbytes))
                die_usage("invalid size for -e/--maxbytes: '%s'", optarg);
            break;
        case 'f': {
            int f;
            if (parse_int(optarg, 2, 1 << 20, &f))
                die_usage("invalid -f/--stepfactor '%s': an integer >= 2", optarg);
            o->stepfactor = (size_t)f;
            saw_f = 1;
            break;
        }
        case 'i':
            if (parse_size(optarg, &o->stepbytes) || o->stepbytes == 0)
                die_usage("invalid -i/--stepbytes '%s': a size > 0", optarg);
            saw_i = 1;
            break;
        case 'n':
            if (parse_int(optarg, 1, 1 << 30, &o->iters))
                die_usage("invalid -n/--iters '%s': an integer >= 1", optarg);
            break;
        case 'w':
            if (parse_int(optarg, 0, 1 << 30, &o->warmup))
                die_usage("invalid -w/--warmup_iters '%s': an integer >= 0", optarg);
            break;
        case 'c':
            if (parse_int(optarg, 0, 1 << 30, &o->check))
                die_usage("invalid -c/--check '%s': 0 or 1", optarg);
            o->check = o->check != 0;
            break;
        case 'd':
            if (strcmp(optarg, "all") == 0)
                o->type = -1;
            else if ((o->type = find_type(optarg)) < 0)
                die_usage("unknown datatype '%s' (int8 uint8 int32 uint32 int64 uint64 half "
                          "float double bfloat16, float16 float32 float64, or all)", optarg);
            break;
        case 'o':
            if (strcmp(optarg, "all") == 0)
                o->op = -1;
            else if ((o->op = find_op(optarg)) < 0)
                die_usage("unknown op '%s' (sum prod max min avg, or all)", optarg);
            break;
        case 'r':
            if (strcmp(optarg, "all") == 0)
                o->root = -1;
            else if (parse_int(optarg, 0, INT32_MAX, &o->root))
                die_usage("invalid -r/--root '%s': a rank or all", optarg);
            break;
        case 'z':
            if (parse_int(optarg, 0, 1, &o->nonblocking))
                die_usage("invalid -z/--blocking '%s': 0 (blocking calls) or 1 (non-blocking)",
                          optarg);
            break;
        case 'a':
            if (parse_int(optarg, 0, 3, &o->average))
                die_usage("invalid -a/--average '%s': 0 (rank 0), 1 (mean), 2 (min) or 3 (max)",
                          optarg);
            break;
        case 't':
            if (strcmp(optarg, "tcp") != 0 && strcmp(optarg, "auto") != 0 &&
                strcmp(optarg, "ibverbs") != 0)
                die_usage("unknown transport '%s' (tcp, ibverbs or auto)", optarg);
            o->transport = optarg;
            break;
        case 'J':
            o->json = optarg;
            break;
        case 'g':
#ifndef LOOM_HAVE_CUDA
            die_usage("-g/--gpu: this build of Loom has no CUDA support (configure --with-cuda)");
#endif
            o->gpu = 1;
            break;
        case OPT_CSV:
            o->csv = optarg;
            break;
        case OPT_PLOT:
            o->plot = optarg;
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case ':':
            die_usage("option '%s' needs a value", argv[optind - 1]);
            break;
        default:
            if (optopt)
                die_usage("unknown option '-%c'", optopt);
            die_usage("unknown option '%s'", argv[optind - 1]);
            break;
        }
    }
    if (saw_f && saw_i)
        die_usage("-f/--stepfactor and -i/--stepbytes exclude each other");
    if (saw_i)
        o->stepfactor = 1;
    if (optind >= argc)
        die_usage("which collective? (allreduce, broadcast, ..., barrier, p2p)");
    int c = find_coll(argv[optind]);
    if (c < 0)
        die_usage("unknown collective '%s'", argv[optind]);
    o->coll = (coll_t)c;
    if (optind + 1 < argc)
        die_usage("unexpected argument '%s'", argv[optind + 1]);
    if (o->minbytes > o->maxbytes)
        die_usage("-b/--minbytes (%zu) is larger than -e/--maxbytes (%zu)", o->minbytes,
                  o->maxbytes);
    if (o->gpu && (o->coll == C_SENDRECV || o->coll == C_P2P))
        die_usage("-g/--gpu: %s uses non-blocking send/recv, which GPU buffers do not support",
                  coll_names[o->coll]);
}

/* What carries the bytes, as asked for ("auto" is reported as tcp, its usual outcome
 * without RDMA devices). */
static const char *transport_name(const opts_t *o)
{
    const char *t = o->transport ? o->transport : getenv("LOOM_TRANSPORT");
    return t && *t && strcmp(t, "auto") != 0 ? t : "tcp";
}

/* The next size of the sweep; 0 when the sweep is over. */
static size_t next_size(const opts_t *o, size_t size)
{
    size_t next;
    if (o->stepfactor > 1)
        next = size == 0 ? 1 : size > SIZE_MAX / o->stepfactor ? 0 : size * o->stepfactor;
    else
        next = size > SIZE_MAX - o->stepbytes ? 0 : size + o->stepbytes;
    return next > o->maxbytes ? 0 : next;
}

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

#define MAX_PERIOD 20   /* the longest period of reduce_input in j */
#define USER_TAG 7

typedef struct {
    size_t bytes, count;
    int type, op, root;    /* op -1: none */
    double time[2], algbw[2], busbw[2];
    int64_t wrong[2];
    int reported[2];       /* #wrong means something */
} row_t;

typedef struct {
    int32_t rank, pid, local_rank;
    char host[244];
} rankinfo_t;

typedef struct {
    opts_t o;
    loom_comm_t comm;
    int rank, n;
    char *sbuf, *rbuf;
    char *dsbuf, *drbuf;   /* -g: the buffers the calls get; sbuf/rbuf stage and check */
    size_t buf_bytes;
    loom_request_t *reqs;
    int nreq;
    /* the test running now */
    loom_dtype_t dt;
    size_t ts;
    loom_op_t op;
    int root;
    size_t count;
    int red_k, prod_m, period;
    double expect[MAX_PERIOD];
    /* results */
    row_t *rows;
    size_t nrows, rows_cap;
    int failed_tests;
    rankinfo_t *infos;   /* rank 0 only */
} bench_t;

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

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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
        int64_t sum = 0, prod = 1, lo = INT64_MAX, hi = INT64_MIN;
        for (int r = 0; r < n; r++) {
            int64_t v = reduce_input(b, r, (size_t)q);
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

/* nccl-tests' shortening: as many decimals as fit the column, then exponent form. */
static void fmt_num(char *out, size_t len, double v, int width)
{
    int digits = 0;
    for (double p = 1; v >= p && digits < 40; p *= 10)
        digits++;
    if (digits < width - 2)
        snprintf(out, len, "%*.2f", width, v);
    else if (digits < width - 1)
        snprintf(out, len, "%*.1f", width, v);
    else if (digits < width + 1)
        snprintf(out, len, "%*.0f", width, v);
    else
        snprintf(out, len, "%*.1e", width, v);
}

static void print_row(const bench_t *b, const row_t *w)
{
    if (b->rank != 0)
        return;
    char root[16];
    snprintf(root, sizeof(root), "%d", w->root);
    printf("%12zu  %12zu  %8s  %6s  %6s", w->bytes, w->count,
           b->o.coll == C_BARRIER ? "none" : types[w->type].name,
           w->op < 0 ? "none" : ops[w->op].name, root);
    for (int m = 0; m < 2; m++) {
        char t[32], alg[32], bus[32], wrong[32];
        fmt_num(t, sizeof(t), w->time[m], 7);
        fmt_num(alg, sizeof(alg), w->algbw[m], 6);
        fmt_num(bus, sizeof(bus), w->busbw[m], 6);
        if (w->reported[m])
            snprintf(wrong, sizeof(wrong), "%g", (double)w->wrong[m]);
        else
            snprintf(wrong, sizeof(wrong), "N/A");
        printf("  %7s  %6s  %6s  %6s", t, alg, bus, wrong);
    }
    printf("\n");
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
            double t0 = now_s();
            for (int i = 0; i < b->o.iters; i++)
                issue(b, m);
            complete(b);
            double t = (now_s() - t0) / b->o.iters;
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

#define P2P_WINDOW 64
#define TAG_PING 1
#define TAG_PONG 2
#define TAG_WINDOW 3
#define TAG_ACK 4

typedef struct {
    size_t size;
    double latency_us, bandwidth_mbs;
} p2p_row_t;

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
                    t0 = now_s();
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
            lat = (now_s() - t0) / b->o.iters / 2 * 1e6;

            /* Large messages take fewer windows, as osu_bw does: about 1 GiB per size. */
            long windows = b->o.iters;
            if (size > 0 && (double)size * P2P_WINDOW * windows > 1073741824.0)
                windows = (long)(1073741824.0 / ((double)size * P2P_WINDOW));
            if (windows < 1)
                windows = 1;
            int warm = b->o.warmup < windows ? b->o.warmup : (int)windows;
            for (long it = 0; it < warm + windows; it++) {
                if (it == warm)
                    t0 = now_s();
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
            double t = now_s() - t0;
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

/* ---- JSON, CSV ------------------------------------------------------------------ */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static int finish_file(FILE *f, const char *path)
{
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "loom-perf: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

static FILE *open_out(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "loom-perf: cannot create %s: %s\n", path, strerror(errno));
    return f;
}

static double avg_busbw(const bench_t *b)
{
    double sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < b->nrows; i++)
        for (int m = 0; m < 2; m++, n++)
            sum += b->rows[i].busbw[m];
    return n ? sum / (double)n : 0;
}

static int write_json(const bench_t *b, const p2p_row_t *prows, size_t nprows)
{
    const opts_t *o = &b->o;
    FILE *f = open_out(o->json);
    if (!f)
        return -1;
    fprintf(f, "{\n  \"loom_version\": ");
    json_str(f, loom_version());
    fprintf(f, ",\n  \"collective\": ");
    json_str(f, coll_names[o->coll]);
    fprintf(f, ",\n  \"nranks\": %d,\n  \"config\": {\"minimum_bytes\": %zu, \"maximum_bytes\": %zu, ",
            b->n, o->minbytes, o->maxbytes);
    if (o->stepfactor > 1)
        fprintf(f, "\"step_factor\": %zu, ", o->stepfactor);
    else
        fprintf(f, "\"step_bytes\": %zu, ", o->stepbytes);
    fprintf(f, "\"warmup_iters\": %d, \"iterations\": %d, \"validation\": %d, "
               "\"nonblocking\": %d, \"average\": %d, \"transport\": ",
            o->warmup, o->iters, o->check, o->nonblocking, o->average);
    json_str(f, transport_name(o));
    fprintf(f, "},\n  \"devices\": [");
    for (int r = 0; r < b->n; r++) {
        const rankinfo_t *ri = &b->infos[r];
        fprintf(f, "%s\n    {\"rank\": %d, \"group\": 0, \"pid\": %d, \"hostname\": ", r ? "," : "",
                (int)ri->rank, (int)ri->pid);
        json_str(f, ri->host);
        fprintf(f, ", \"local_rank\": %d, \"device\": -1, \"device_info\": \"host memory\"}",
                (int)ri->local_rank);
    }
    fprintf(f, "\n  ],\n  \"results\": [");
    if (o->coll == C_P2P) {
        for (size_t i = 0; i < nprows; i++)
            fprintf(f, "%s\n    {\"size\": %zu, \"latency_us\": %.6g, \"bandwidth_MBps\": %.6g}",
                    i ? "," : "", prows[i].size, prows[i].latency_us, prows[i].bandwidth_mbs);
    } else {
        for (size_t i = 0; i < b->nrows; i++) {
            const row_t *w = &b->rows[i];
            fprintf(f, "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": ", i ? "," : "",
                    w->bytes, w->count);
            json_str(f, o->coll == C_BARRIER ? "none" : types[w->type].name);
            fprintf(f, ", \"redop\": ");
            json_str(f, w->op < 0 ? "none" : ops[w->op].name);
            fprintf(f, ", \"root\": %d", w->root);
            for (int m = 0; m < 2; m++) {
                fprintf(f, ", \"%s\": {\"time\": %.6g, \"alg_bw\": %.6g, \"bus_bw\": %.6g, "
                           "\"nwrong\": ",
                        m ? "in_place" : "out_of_place", w->time[m], w->algbw[m], w->busbw[m]);
                if (w->reported[m])
                    fprintf(f, "%" PRId64 "}", w->wrong[m]);
                else
                    fprintf(f, "null}");
            }
            fprintf(f, "}");
        }
    }
    fprintf(f, "\n  ],\n  \"out_of_bounds\": {\"count\": %d, \"okay\": %s}",
            b->failed_tests, b->failed_tests ? "false" : "true");
    if (o->coll != C_P2P)
        fprintf(f, ",\n  \"average_bus_bandwidth\": {\"bandwidth\": %.6g}", avg_busbw(b));
    fprintf(f, "\n}\n");
    return finish_file(f, o->json);
}

static int write_csv(const bench_t *b, const p2p_row_t *prows, size_t nprows)
{
    const opts_t *o = &b->o;
    FILE *f = open_out(o->csv);
    if (!f)
        return -1;
    if (o->coll == C_P2P) {
        fprintf(f, "size,latency_us,bandwidth_MBps\n");
        for (size_t i = 0; i < nprows; i++)
            fprintf(f, "%zu,%.6g,%.6g\n", prows[i].size, prows[i].latency_us,
                    prows[i].bandwidth_mbs);
    } else {
        fprintf(f, "collective,nranks,size,count,type,redop,root,"
                   "oop_time_us,oop_algbw_GBps,oop_busbw_GBps,oop_nwrong,"
                   "ip_time_us,ip_algbw_GBps,ip_busbw_GBps,ip_nwrong\n");
        for (size_t i = 0; i < b->nrows; i++) {
            const row_t *w = &b->rows[i];
            fprintf(f, "%s,%d,%zu,%zu,%s,%s,%d", coll_names[o->coll], b->n, w->bytes, w->count,
                    o->coll == C_BARRIER ? "none" : types[w->type].name,
                    w->op < 0 ? "none" : ops[w->op].name, w->root);
            for (int m = 0; m < 2; m++) {
                fprintf(f, ",%.6g,%.6g,%.6g,", w->time[m], w->algbw[m], w->busbw[m]);
                if (w->reported[m])
                    fprintf(f, "%" PRId64, w->wrong[m]);
            }
            fprintf(f, "\n");
        }
    }
    return finish_file(f, o->csv);
}

/* ---- SVG plot --------------------------------------------------------------------
 * Two panels side by side, size on a log2 axis in both: bandwidth (linear) on the
 * left, time (log10) on the right. One polyline per series. */

typedef struct {
    char label[96];
    int color, dashed;
    size_t n;
    double *x, *bw, *t;
} series_t;

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NCOLORS ((int)(sizeof(palette) / sizeof(palette[0])))

#define PANEL_W 500
#define PLOT_TOP 60
#define PLOT_BOTTOM 390
#define PLOT_LEFT 75
#define PLOT_RIGHT 475
#define LEGEND_TOP 462
#define LEGEND_ROW 18
#define LEGEND_COLS 3
#define LEGEND_MAX 48

static void size_label(char *out, size_t len, double v)
{
    static const char *const units[] = {"", "K", "M", "G", "T"};
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(out, len, "%g%s", v, units[u]);
}

static double nice_step(double range, int target)
{
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

typedef struct {
    double x0, x1;        /* log2 of the x range */
    double y0, y1;        /* the y range: log10 when logy */
    int logy;
    int left;             /* pixel offset of the panel */
} axes_t;

static double map_x(const axes_t *a, double x)
{
    return a->left + PLOT_LEFT + (log2(x) - a->x0) / (a->x1 - a->x0) * (PLOT_RIGHT - PLOT_LEFT);
}

static double map_y(const axes_t *a, double y)
{
    double v = a->logy ? log10(y) : y;
    return PLOT_BOTTOM - (v - a->y0) / (a->y1 - a->y0) * (PLOT_BOTTOM - PLOT_TOP);
}

static int plottable(const axes_t *a, double x, double y)
{
    return x > 0 && isfinite(y) && (!a->logy || y > 0);
}

static void draw_panel(FILE *f, axes_t *a, const series_t *s, size_t ns, int use_t,
                       const char *title, const char *ylabel)
{
    /* Ranges over every plottable point. */
    double xmin = INFINITY, xmax = 0, ymin = INFINITY, ymax = 0;
    for (size_t k = 0; k < ns; k++)
        for (size_t i = 0; i < s[k].n; i++) {
            double y = use_t ? s[k].t[i] : s[k].bw[i];
            if (!plottable(a, s[k].x[i], y))
                continue;
            xmin = fmin(xmin, s[k].x[i]);
            xmax = fmax(xmax, s[k].x[i]);
            ymin = fmin(ymin, y);
            ymax = fmax(ymax, y);
        }
    int empty = !(xmax > 0);
    if (empty) {
        xmin = 1;
        xmax = 1024;
        ymin = 1;
        ymax = 10;
    }
    a->x0 = floor(log2(xmin));
    a->x1 = ceil(log2(xmax));
    if (a->x1 <= a->x0)
        a->x1 = a->x0 + 1;
    double ystep;
    if (a->logy) {
        a->y0 = floor(log10(ymin));
        a->y1 = ceil(log10(ymax));
        if (a->y1 <= a->y0)
            a->y1 = a->y0 + 1;
        ystep = ceil((a->y1 - a->y0) / 8);
    } else {
        a->y0 = 0;
        if (!(ymax > 0))
            ymax = 1;
        ystep = nice_step(ymax, 5);
        a->y1 = ceil(ymax / ystep) * ystep;
    }

    int L = a->left;
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"14\">%s</text>\n",
            L + (PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_TOP - 12, title);
    /* Grid and tick labels. */
    int xstep = (int)ceil((a->x1 - a->x0) / 10);
    for (double e = a->x0; e <= a->x1 + 1e-9; e += xstep) {
        double X = map_x(a, exp2(e));
        char lab[32];
        size_label(lab, sizeof(lab), exp2(e));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"#ddd\"/>\n", X,
                PLOT_TOP, X, PLOT_BOTTOM);
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", X,
                PLOT_BOTTOM + 16, lab);
    }
    for (double v = a->y0; v <= a->y1 + 1e-9 * fmax(1, fabs(a->y1)); v += ystep) {
        double Y = PLOT_BOTTOM - (v - a->y0) / (a->y1 - a->y0) * (PLOT_BOTTOM - PLOT_TOP);
        char lab[32];
        snprintf(lab, sizeof(lab), "%g", a->logy ? pow(10, v) : v);
        fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                L + PLOT_LEFT, Y, L + PLOT_RIGHT, Y);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", L + PLOT_LEFT - 6,
                Y + 4, lab);
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n",
            L + PLOT_LEFT, PLOT_TOP, PLOT_RIGHT - PLOT_LEFT, PLOT_BOTTOM - PLOT_TOP);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">"
               "message size (bytes, log scale)</text>\n",
            L + (PLOT_LEFT + PLOT_RIGHT) / 2, PLOT_BOTTOM + 38);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" "
               "transform=\"rotate(-90 %d %d)\">%s</text>\n",
            L + 18, (PLOT_TOP + PLOT_BOTTOM) / 2, L + 18, (PLOT_TOP + PLOT_BOTTOM) / 2, ylabel);
    if (empty) {
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">no data</text>\n",
                L + (PLOT_LEFT + PLOT_RIGHT) / 2, (PLOT_TOP + PLOT_BOTTOM) / 2);
        return;
    }
    for (size_t k = 0; k < ns; k++) {
        const char *color = palette[s[k].color % NCOLORS];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", color,
                s[k].dashed ? " stroke-dasharray=\"6 3\"" : "");
        for (size_t i = 0; i < s[k].n; i++) {
            double y = use_t ? s[k].t[i] : s[k].bw[i];
            if (plottable(a, s[k].x[i], y))
                fprintf(f, "%.1f,%.1f ", map_x(a, s[k].x[i]), map_y(a, y));
        }
        fprintf(f, "\"/>\n");
        if (s[k].n <= 64)
            for (size_t i = 0; i < s[k].n; i++) {
                double y = use_t ? s[k].t[i] : s[k].bw[i];
                if (plottable(a, s[k].x[i], y))
                    fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\"/>\n",
                            map_x(a, s[k].x[i]), map_y(a, y), color);
            }
    }
}

static int write_plot(const bench_t *b, const p2p_row_t *prows, size_t nprows)
{
    const opts_t *o = &b->o;
    /* Series: consecutive rows of one type x op x root, out of place and in place. */
    series_t *s = calloc(2 * (b->nrows + 1), sizeof(*s));
    double *pool = calloc(3 * 2 * (b->nrows + nprows + 1), sizeof(double));
    if (!s || !pool) {
        fprintf(stderr, "loom-perf: out of memory\n");
        free(s);
        free(pool);
        return -1;
    }
    size_t ns = 0, used = 0;
    if (o->coll == C_P2P) {
        series_t *p = &s[ns++];
        snprintf(p->label, sizeof(p->label), "ranks 0 and 1, %s", transport_name(o));
        p->x = pool;
        p->bw = pool + nprows;
        p->t = pool + 2 * nprows;
        for (size_t i = 0; i < nprows; i++) {
            p->x[i] = (double)prows[i].size;
            p->bw[i] = prows[i].bandwidth_mbs;
            p->t[i] = prows[i].latency_us;
        }
        p->n = nprows;
    } else {
        int several = o->type < 0 || (coll_reduces(o->coll) && o->op < 0) ||
                      (coll_rooted(o->coll) && o->root < 0);
        for (size_t i = 0; i < b->nrows;) {
            size_t j = i;
            const row_t *w = &b->rows[i];
            while (j < b->nrows && b->rows[j].type == w->type && b->rows[j].op == w->op &&
                   b->rows[j].root == w->root)
                j++;
            for (int m = 0; m < 2; m++) {
                series_t *p = &s[ns];
                char what[64] = "";
                if (several) {
                    snprintf(what, sizeof(what), "%s%s%s", types[w->type].name,
                             w->op >= 0 ? " " : "", w->op >= 0 ? ops[w->op].name : "");
                    if (w->root >= 0)
                        snprintf(what + strlen(what), sizeof(what) - strlen(what), " root %d",
                                 w->root);
                    strcat(what, ", ");
                }
                snprintf(p->label, sizeof(p->label), "%s%s", what,
                         m ? "in-place" : "out-of-place");
                p->color = (int)(ns / 2);
                p->dashed = m;
                p->n = j - i;
                p->x = pool + used;
                p->bw = p->x + p->n;
                p->t = p->bw + p->n;
                used += 3 * p->n;
                for (size_t k = 0; k < p->n; k++) {
                    p->x[k] = (double)b->rows[i + k].bytes;
                    p->bw[k] = b->rows[i + k].busbw[m];
                    p->t[k] = b->rows[i + k].time[m];
                }
                ns++;
            }
            i = j;
        }
    }

    FILE *f = open_out(o->plot);
    if (!f) {
        free(s);
        free(pool);
        return -1;
    }
    /* The legend fills column by column, an even number of rows for collectives so
     * that a series' out-of-place and in-place lines stay side by side. */
    size_t nleg = ns < LEGEND_MAX ? ns : LEGEND_MAX;
    size_t legend_rows = (nleg + LEGEND_COLS - 1) / LEGEND_COLS;
    if (o->coll != C_P2P)
        legend_rows += legend_rows & 1;
    int height = LEGEND_TOP + (int)legend_rows * LEGEND_ROW + (ns > nleg ? LEGEND_ROW : 0) + 10;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            2 * PANEL_W, height, 2 * PANEL_W, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"24\" text-anchor=\"middle\" font-size=\"16\">loom-perf %s, "
               "%d rank%s, Loom %s</text>\n",
            PANEL_W, coll_names[o->coll], b->n, b->n == 1 ? "" : "s", loom_version());
    axes_t left = {.logy = 0, .left = 0}, right = {.logy = 1, .left = PANEL_W};
    if (o->coll == C_P2P) {
        draw_panel(f, &left, s, ns, 0, "unidirectional bandwidth", "bandwidth (MB/s)");
        draw_panel(f, &right, s, ns, 1, "latency (half round trip)", "latency (us, log scale)");
    } else {
        draw_panel(f, &left, s, ns, 0, "bus bandwidth", "busbw (GB/s)");
        draw_panel(f, &right, s, ns, 1, "time per operation", "time (us, log scale)");
    }
    for (size_t k = 0; k < nleg; k++) {
        int X = 40 + (int)(k / legend_rows) * 320;
        int Y = LEGEND_TOP + (int)(k % legend_rows) * LEGEND_ROW;
        fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" "
                   "stroke-width=\"2\"%s/>\n",
                X, Y - 4, X + 30, Y - 4, palette[s[k].color % NCOLORS],
                s[k].dashed ? " stroke-dasharray=\"6 3\"" : "");
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", X + 38, Y, s[k].label);
    }
    if (ns > nleg)
        fprintf(f, "<text x=\"40\" y=\"%d\">... and %zu more series</text>\n",
                LEGEND_TOP + (int)legend_rows * LEGEND_ROW,
                ns - nleg);
    fprintf(f, "</svg>\n");
    free(s);
    free(pool);
    return finish_file(f, o->plot);
}

/* ---- main ------------------------------------------------------------------------ */

static void print_header(bench_t *b)
{
    const opts_t *o = &b->o;
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
    const char *kind = o->coll == C_P2P ? "Point-to-point" : "Collective";
    printf("# Loom loom-perf version %s\n", loom_version());
    printf("# %s test starting: %s\n", kind, coll_names[o->coll]);
    printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d "
           "iters: %d agg iters: 1 validation: %d graph: 0\n",
           o->minbytes, o->maxbytes, o->stepfactor > 1 ? o->stepfactor : o->stepbytes,
           o->stepfactor > 1 ? "factor" : "bytes", o->warmup, o->iters, o->check);
    if (o->nonblocking && o->coll != C_P2P)
        printf("# Non-blocking: loom_i* calls, all iterations posted back to back, then waited for\n");
    if (o->coll == C_P2P)
        printf("# Ranks 0 and 1 over %s: ping-pong latency (half round trip), bandwidth with a "
               "window of %d non-blocking sends\n", transport_name(o), P2P_WINDOW);
    printf("#\n# Using devices\n");
    for (int r = 0; r < b->n; r++) {
        b->infos[r].host[sizeof(b->infos[r].host) - 1] = '\0';
        printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s\n", (int)b->infos[r].rank,
               0, (int)b->infos[r].pid, b->infos[r].host, -1, "cpu", "host memory");
    }
    if (o->coll != C_P2P) {
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place\n",
               "", "", "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size",
               "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
               "algbw", "busbw", "#wrong");
        char units[160];
        snprintf(units, sizeof(units), "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s",
                 "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                 "(GB/s)");
        printf("%s\n", units);
    }
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
        int t0 = o->type < 0 ? 0 : o->type, t1 = o->type < 0 ? NTYPES - 1 : o->type;
        int p0 = 0, p1 = 0, r0 = -1, r1 = -1;
        if (coll_reduces(o->coll)) {
            p0 = o->op < 0 ? 0 : o->op;
            p1 = o->op < 0 ? NOPS - 1 : o->op;
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
