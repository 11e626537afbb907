/* perf_args.c - loom-perf's command line: the collectives, types and ops it
 * knows, and the options (nccl-tests' flags). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <loom.h>

#include "perf.h"

/* ---- what can be measured --------------------------------------------------- */

const char *const coll_names[C_COUNT] = {
    "allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
    "gather", "scatter", "sendrecv", "barrier", "p2p"};

int coll_reduces(coll_t c)
{
    return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCE_SCATTER;
}

int coll_rooted(coll_t c)
{
    return c == C_BROADCAST || c == C_REDUCE || c == C_GATHER || c == C_SCATTER;
}

/* nccl-tests splits the size over the ranks for these: the size column is the
 * total buffer, count the per-rank block, and algbw counts every block. */
int coll_per_rank_blocks(coll_t c)
{
    return c == C_ALLGATHER || c == C_REDUCE_SCATTER || c == C_ALLTOALL || c == C_GATHER ||
           c == C_SCATTER;
}

/* busbw = algbw * factor: the bandwidth a ring-optimal algorithm needs on each
 * link, comparable across collectives and rank counts (nccl-tests PERFORMANCE.md). */
double busbw_factor(coll_t c, int n)
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
const perf_type_t types[] = {
    {"int8", LOOM_INT8},     {"uint8", LOOM_UINT8},   {"int32", LOOM_INT32},
    {"uint32", LOOM_UINT32}, {"int64", LOOM_INT64},   {"uint64", LOOM_UINT64},
    {"half", LOOM_FLOAT16},  {"float", LOOM_FLOAT32}, {"double", LOOM_FLOAT64},
    {"bfloat16", LOOM_BFLOAT16}};
const int n_types = (int)(sizeof(types) / sizeof(types[0]));

static const struct { const char *alias; const char *name; } type_aliases[] = {
    {"float16", "half"},   {"fp16", "half"},     {"float32", "float"}, {"fp32", "float"},
    {"float64", "double"}, {"fp64", "double"},   {"bf16", "bfloat16"}, {"char", "int8"},
    {"int", "int32"}};

const perf_op_t ops[] = {
    {"sum", LOOM_SUM}, {"prod", LOOM_PROD}, {"max", LOOM_MAX}, {"min", LOOM_MIN},
    {"avg", LOOM_AVG}, {"band", LOOM_BAND}, {"bor", LOOM_BOR}, {"bxor", LOOM_BXOR}};
const int n_ops = (int)(sizeof(ops) / sizeof(ops[0]));

int perf_op_takes_type(loom_op_t op, loom_dtype_t dt)
{
    int bitwise = op == LOOM_BAND || op == LOOM_BOR || op == LOOM_BXOR;
    int floating = dt == LOOM_FLOAT16 || dt == LOOM_BFLOAT16 || dt == LOOM_FLOAT32 ||
                   dt == LOOM_FLOAT64;
    return !bitwise || !floating;
}

/* ---- options ---------------------------------------------------------------- */

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
        "  -o, --op OP|all       sum prod max min avg, and band bor bxor on integer types\n"
        "                        (default sum; reducing collectives)\n"
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
    for (int i = 0; i < n_types; i++)
        if (strcmp(s, types[i].name) == 0)
            return i;
    return -1;
}

static int find_op(const char *s)
{
    for (int i = 0; i < n_ops; i++)
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

void parse_args(int argc, char **argv, opts_t *o)
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
                die_usage("unknown op '%s' (sum prod max min avg band bor bxor, or all)", optarg);
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
    if (o->op >= 0 && o->type >= 0 && !perf_op_takes_type(ops[o->op].op, types[o->type].dt))
        die_usage("op %s takes integer types only, not %s", ops[o->op].name,
                  types[o->type].name);
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
const char *transport_name(const opts_t *o)
{
    const char *t = o->transport ? o->transport : getenv("LOOM_TRANSPORT");
    return t && *t && strcmp(t, "auto") != 0 ? t : "tcp";
}

/* The next size of the sweep; 0 when the sweep is over. */
size_t next_size(const opts_t *o, size_t size)
{
    size_t next;
    if (o->stepfactor > 1)
        next = size == 0 ? 1 : size > SIZE_MAX / o->stepfactor ? 0 : size * o->stepfactor;
    else
        next = size > SIZE_MAX - o->stepbytes ? 0 : size + o->stepbytes;
    return next > o->maxbytes ? 0 : next;
}
