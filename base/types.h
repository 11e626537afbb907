/* types.h - names and sizes of dtypes and ops, shared by messages and tools. */
#ifndef LOOM_TYPES_H
#define LOOM_TYPES_H
#include "loom.h"

/* "float32", "bfloat16", ...; "?" for an unknown value. */
const char *loom_dtype_name(loom_dtype_t dt);
const char *loom_op_name(loom_op_t op);
/* Parse a name ("float32", "float", "half", "bf16", ...); -1 when unknown. */
int loom_dtype_parse(const char *name);
int loom_op_parse(const char *name);
int loom_dtype_valid(loom_dtype_t dt);
int loom_op_valid(loom_op_t op);
/* The bitwise ops take integer dtypes only; every other op takes every dtype. */
int loom_op_takes_dtype(loom_op_t op, loom_dtype_t dt);

#endif
