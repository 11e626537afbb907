/*
 * ib_regcache.h - a registration cache: memory registrations are expensive
 * (pinning, a system call, IOMMU updates), and collectives reuse the same
 * buffers call after call. Ranges are widened to whole pages; an entry that
 * covers a request is reused (hit), overlapping idle entries are merged into
 * one new registration (miss), and idle entries are evicted least recently
 * used first once the cache holds more than its byte or entry bound.
 *
 * Caveat (as for every verbs cache without memory hooks): memory that is freed
 * and mapped again at the same address keeps the old pinned pages behind a
 * cached entry. So ibverbs.c keeps idle entries only where that cannot
 * happen (on-demand-paging registrations) or where the user asked for it
 * (LOOM_IB_REG_CACHE); else max_bytes is 0 and an entry lives while a message
 * or a loom_comm_register_buffer handle holds it (see ibverbs.c's top).
 *
 * Register/deregister are callbacks, so the cache is tested without a device.
 */
#ifndef LOOM_IB_REGCACHE_H
#define LOOM_IB_REGCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct loom_rc_entry {
    uintptr_t start, end;       /* page-aligned, end exclusive */
    void *mr;                   /* what reg returned; NULL once revoked */
    uint32_t lkey, rkey;
    int refs;
    uint64_t id;                /* keyed entries: the allocation's identity; 0: none */
    int once;                   /* dropped as soon as it is idle (memory of unknown life) */
    struct loom_rc_entry *prev, *next;   /* most recently used first */
} loom_rc_entry_t;

/* Register [addr, addr + len): 0 and *mr, keys set; -1 with errno set. */
typedef int (*loom_rc_reg_fn)(void *arg, void *addr, size_t len, void **mr_p, uint32_t *lkey,
                              uint32_t *rkey);
typedef void (*loom_rc_dereg_fn)(void *arg, void *mr);

typedef struct loom_rcache {
    loom_rc_reg_fn reg;
    loom_rc_dereg_fn dereg;
    void *arg;
    size_t page;
    size_t max_bytes, max_entries;   /* max_bytes 0: nothing is kept once idle */
    size_t bytes, entries;
    loom_rc_entry_t *head, *tail;
    uint64_t hits, misses, evictions;
} loom_rcache_t;

void loom_rcache_init(loom_rcache_t *rc, size_t max_bytes, size_t max_entries,
                      loom_rc_reg_fn reg, loom_rc_dereg_fn dereg, void *arg);
/* A referenced entry covering [addr, addr + len) (len 0 counts as 1 byte);
 * 0 on success, -1 with errno when registration fails even after evicting
 * every idle entry. */
int loom_rcache_get(loom_rcache_t *rc, const void *addr, size_t len, loom_rc_entry_t **e_p);
/* A new referenced entry for exactly the pages of [addr, addr + len), never
 * an existing one: for memory whose owner vouches for its pages now (idle
 * entries over them are dropped). As loom_rcache_get otherwise. */
int loom_rcache_get_new(loom_rcache_t *rc, const void *addr, size_t len, loom_rc_entry_t **e_p);
/* Keyed use, for memory whose allocator can say which allocation an address
 * is in (GPU memory: the driver's range and buffer id, which a freed and
 * re-made allocation at the same address does not share): a referenced entry
 * for the allocation [base, base + len) with identity id. An entry of the
 * same allocation is reused; idle entries over the range with another
 * identity are registrations of memory freed since, and are dropped (they
 * must never be handed out: their pages are not the program's any more). id
 * 0 (the allocation is unknown): a registration of exactly the pages of
 * [base, base + len) for this use only, dropped once idle. As loom_rcache_get
 * otherwise; never merged with other entries. */
int loom_rcache_get_keyed(loom_rcache_t *rc, const void *base, size_t len, uint64_t id,
                          loom_rc_entry_t **e_p);
/* Drop one reference; idle entries beyond the bounds are deregistered. */
void loom_rcache_put(loom_rcache_t *rc, loom_rc_entry_t *e);
/* Deregister every entry now, referenced ones too, keeping the entries (their
 * holders still put them; they are never handed out again): after a failure
 * no peer may write into memory the user gets back (a receive abandoned
 * after its address went out). */
void loom_rcache_revoke(loom_rcache_t *rc);
/* Deregister everything (referenced entries too: the owner is going away). */
void loom_rcache_fini(loom_rcache_t *rc);

#endif
