/*
 * blocks.h - count elements split into n blocks as evenly as possible: every
 * block gets count / n elements and the first count % n one more, so blocks
 * differ by at most one element and may be empty when count < n. The ring,
 * Rabenseifner, hierarchical, scatter-allgather and in-node algorithms all
 * partition this way, and ranks must agree on it to the element.
 */
#ifndef LOOM_BLOCKS_H
#define LOOM_BLOCKS_H

#include <stddef.h>

/* Elements in block b (0 <= b < n). */
static inline size_t loom_block_count(size_t count, int n, int b)
{
    return count / (size_t)n + ((size_t)b < count % (size_t)n ? 1 : 0);
}

/* First element of block b. */
static inline size_t loom_block_offset(size_t count, int n, int b)
{
    size_t rem = count % (size_t)n;
    return (size_t)b * (count / (size_t)n) + ((size_t)b < rem ? (size_t)b : rem);
}

/* x modulo n in 0 .. n-1, also for negative x (a ring position). */
static inline int loom_mod(int x, int n)
{
    return ((x % n) + n) % n;
}

#endif
