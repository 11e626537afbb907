#include <string.h>
#include <strings.h>

#include "coll_kind.h"
#include "types.h"

static const struct {
    const char *name, *alias1, *alias2;
    size_t size;
} dtypes[LOOM_NUM_DTYPES] = {
    [LOOM_INT8] = {"int8", "char", NULL, 1},
    [LOOM_UINT8] = {"uint8", "uchar", NULL, 1},
    [LOOM_INT32] = {"int32", "int", NULL, 4},
    [LOOM_UINT32] = {"uint32", "uint", NULL, 4},
    [LOOM_INT64] = {"int64", "long", NULL, 8},
    [LOOM_UINT64] = {"uint64", "ulong", NULL, 8},
    [LOOM_FLOAT16] = {"float16", "half", "fp16", 2},
    [LOOM_BFLOAT16] = {"bfloat16", "bf16", NULL, 2},
    [LOOM_FLOAT32] = {"float32", "float", "fp32", 4},
    [LOOM_FLOAT64] = {"float64", "double", "fp64", 8},
    [LOOM_INT16] = {"int16", "short", NULL, 2},
    [LOOM_UINT16] = {"uint16", "ushort", NULL, 2},
};

static const char *const ops[LOOM_NUM_OPS] = {
    [LOOM_SUM] = "sum", [LOOM_PROD] = "prod", [LOOM_MIN] = "min", [LOOM_MAX] = "max",
    [LOOM_AVG] = "avg", [LOOM_BAND] = "band", [LOOM_BOR] = "bor", [LOOM_BXOR] = "bxor",
};

int loom_dtype_valid(loom_dtype_t dt)
{
    return (unsigned)dt < LOOM_NUM_DTYPES;
}

int loom_op_valid(loom_op_t op)
{
    return (unsigned)op < LOOM_NUM_OPS;
}

int loom_op_takes_dtype(loom_op_t op, loom_dtype_t dt)
{
    if (!loom_op_valid(op) || !loom_dtype_valid(dt))
        return 0;
    if (op == LOOM_BAND || op == LOOM_BOR || op == LOOM_BXOR)
        return dt != LOOM_FLOAT16 && dt != LOOM_BFLOAT16 && dt != LOOM_FLOAT32 &&
               dt != LOOM_FLOAT64;
    return 1;
}

size_t loom_dtype_size(loom_dtype_t dt)
{
    return loom_dtype_valid(dt) ? dtypes[dt].size : 0;
}

const char *loom_dtype_name(loom_dtype_t dt)
{
    return loom_dtype_valid(dt) ? dtypes[dt].name : "?";
}

const char *loom_op_name(loom_op_t op)
{
    return loom_op_valid(op) ? ops[op] : "?";
}

int loom_dtype_parse(const char *name)
{
    for (int i = 0; i < LOOM_NUM_DTYPES; i++) {
        if (strcasecmp(name, dtypes[i].name) == 0 ||
            (dtypes[i].alias1 && strcasecmp(name, dtypes[i].alias1) == 0) ||
            (dtypes[i].alias2 && strcasecmp(name, dtypes[i].alias2) == 0))
            return i;
    }
    return -1;
}

int loom_op_parse(const char *name)
{
    for (int i = 0; i < LOOM_NUM_OPS; i++)
        if (strcasecmp(name, ops[i]) == 0)
            return i;
    return -1;
}

static const char *const coll_names[LOOM_COLL_COUNT] = {
    [LOOM_COLL_ALLREDUCE] = "allreduce",
    [LOOM_COLL_BROADCAST] = "broadcast",
    [LOOM_COLL_REDUCE] = "reduce",
    [LOOM_COLL_ALLGATHER] = "allgather",
    [LOOM_COLL_ALLGATHERV] = "allgatherv",
    [LOOM_COLL_REDUCE_SCATTER] = "reduce_scatter",
    [LOOM_COLL_ALLTOALL] = "alltoall",
    [LOOM_COLL_ALLTOALLV] = "alltoallv",
    [LOOM_COLL_GATHER] = "gather",
    [LOOM_COLL_SCATTER] = "scatter",
    [LOOM_COLL_BARRIER] = "barrier",
};

const char *loom_coll_name(loom_coll_t coll)
{
    if ((unsigned)coll >= LOOM_COLL_COUNT)
        return "unknown";
    return coll_names[coll];
}
