/* perf.h - what the parts of loom-perf share: the collectives it measures, the
 * options, the benchmark's state and results, and the report writers
 * (perf_report.c). loom-perf.c runs the benchmark, perf_args.c reads the
 * command line. */
#ifndef LOOM_PERF_H
#define LOOM_PERF_H

#include <stddef.h>
#include <stdint.h>

#include <loom.h>

/* Exit codes: results were wrong; bad usage or a Loom error. */
#define EXIT_WRONG 1
#define EXIT_ERROR 2

/* ---- what can be measured (perf_args.c) ------------------------------------- */

typedef enum {
    C_ALLREDUCE, C_BROADCAST, C_REDUCE, C_ALLGATHER, C_REDUCE_SCATTER, C_ALLTOALL,
    C_GATHER, C_SCATTER, C_SENDRECV, C_BARRIER, C_P2P, C_COUNT
} coll_t;

extern const char *const coll_names[C_COUNT];
int coll_reduces(coll_t c);
int coll_rooted(coll_t c);
int coll_per_rank_blocks(coll_t c);
double busbw_factor(coll_t c, int n);

typedef struct { const char *name; loom_dtype_t dt; } perf_type_t;
typedef struct { const char *name; loom_op_t op; } perf_op_t;
/* Types in nccl-tests' order and spelling; reduction ops. */
extern const perf_type_t types[];
extern const int n_types;
extern const perf_op_t ops[];
extern const int n_ops;
/* Bitwise ops take integer types only (Loom refuses them on floats). */
int perf_op_takes_type(loom_op_t op, loom_dtype_t dt);

/* ---- options (perf_args.c) -------------------------------------------------- */

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

/* Reads the command line into o; exits with a message on bad usage. */
void parse_args(int argc, char **argv, opts_t *o);
const char *transport_name(const opts_t *o);
size_t next_size(const opts_t *o, size_t size);

/* ---- the benchmark (loom-perf.c) -------------------------------------------- */

#define MAX_PERIOD 20   /* the longest period of reduce_input in j */
#define P2P_WINDOW 64   /* p2p: non-blocking sends in flight */

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

typedef struct {
    size_t size;
    double latency_us, bandwidth_mbs;
} p2p_row_t;

/* ---- reports (perf_report.c) ------------------------------------------------ */

void print_table_header(const bench_t *b);
void print_row(const bench_t *b, const row_t *w);
double avg_busbw(const bench_t *b);
int write_json(const bench_t *b, const p2p_row_t *prows, size_t nprows);
int write_csv(const bench_t *b, const p2p_row_t *prows, size_t nprows);
int write_plot(const bench_t *b, const p2p_row_t *prows, size_t nprows);

#endif
