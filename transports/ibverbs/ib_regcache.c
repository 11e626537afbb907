/* ib_regcache.c - see ib_regcache.h. A list ordered by use: the number of
 * entries is small (bounded), and a hit is usually at the front. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "ib_regcache.h"

void loom_rcache_init(loom_rcache_t *rc, size_t max_bytes, size_t max_entries,
                      loom_rc_reg_fn reg, loom_rc_dereg_fn dereg, void *arg)
{
    *rc = (loom_rcache_t){.reg = reg, .dereg = dereg, .arg = arg, .max_bytes = max_bytes,
                          .max_entries = max_entries ? max_entries : 1};
    long pg = sysconf(_SC_PAGESIZE);
    rc->page = pg > 0 ? (size_t)pg : 4096;
}

static void unlink_entry(loom_rcache_t *rc, loom_rc_entry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        rc->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        rc->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(loom_rcache_t *rc, loom_rc_entry_t *e)
{
    e->prev = NULL;
    e->next = rc->head;
    if (rc->head)
        rc->head->prev = e;
    else
        rc->tail = e;
    rc->head = e;
}

static void drop(loom_rcache_t *rc, loom_rc_entry_t *e)
{
    unlink_entry(rc, e);
    if (e->mr)
        rc->dereg(rc->arg, e->mr);
    rc->bytes -= e->end - e->start;
    rc->entries--;
    free(e);
}

/* Evict idle entries, oldest first, until the bounds hold (all: every idle one). */
static void shrink(loom_rcache_t *rc, int all)
{
    loom_rc_entry_t *e = rc->tail;
    while (e && (all || rc->bytes > rc->max_bytes || rc->entries > rc->max_entries)) {
        loom_rc_entry_t *prev = e->prev;
        if (e->refs == 0) {
            drop(rc, e);
            rc->evictions++;
        }
        e = prev;
    }
}

static void page_range(const loom_rcache_t *rc, const void *addr, size_t len, uintptr_t *start,
                       uintptr_t *end)
{
    uintptr_t a = (uintptr_t)addr, b = a + (len ? len : 1);
    *start = a & ~(uintptr_t)(rc->page - 1);
    *end = (b + rc->page - 1) & ~(uintptr_t)(rc->page - 1);
}

/* Register [start, end) as a new entry in use once. When that fails (out of
 * pinnable memory: RLIMIT_MEMLOCK, HCA tables; or a merged range that reaches
 * memory unmapped since), give back what is idle and try once more with the
 * request's own pages [own_start, own_end). */
static int insert_new(loom_rcache_t *rc, uintptr_t start, uintptr_t end, uintptr_t own_start,
                      uintptr_t own_end, uint64_t id, int once, loom_rc_entry_t **e_p)
{
    loom_rc_entry_t *e = calloc(1, sizeof(*e));
    if (!e) {
        errno = ENOMEM;
        return -1;
    }
    e->start = start;
    e->end = end;
    e->id = id;
    e->once = once;
    if (rc->reg(rc->arg, (void *)start, end - start, &e->mr, &e->lkey, &e->rkey) != 0) {
        shrink(rc, 1);
        e->start = start = own_start;
        e->end = end = own_end;
        if (rc->reg(rc->arg, (void *)start, end - start, &e->mr, &e->lkey, &e->rkey) != 0) {
            int saved = errno;
            free(e);
            errno = saved;
            return -1;
        }
    }
    e->refs = 1;
    push_front(rc, e);
    rc->bytes += end - start;
    rc->entries++;
    shrink(rc, 0);
    *e_p = e;
    return 0;
}

/* e serves a request: one more reference, first in the use order. */
static int hit(loom_rcache_t *rc, loom_rc_entry_t *e, loom_rc_entry_t **e_p)
{
    rc->hits++;
    e->refs++;
    unlink_entry(rc, e);
    push_front(rc, e);
    *e_p = e;
    return 0;
}

int loom_rcache_get_new(loom_rcache_t *rc, const void *addr, size_t len, loom_rc_entry_t **e_p)
{
    uintptr_t start, end;
    page_range(rc, addr, len, &start, &end);
    /* Idle entries over these pages were made before the caller vouched for
     * them: they may hold pages since unmapped. */
    for (loom_rc_entry_t *e = rc->head, *next; e; e = next) {
        next = e->next;
        if (e->refs == 0 && e->start < end && e->end > start) {
            drop(rc, e);
            rc->evictions++;
        }
    }
    if (insert_new(rc, start, end, start, end, 0, 0, e_p) != 0)
        return -1;
    rc->misses++;
    return 0;
}

int loom_rcache_get(loom_rcache_t *rc, const void *addr, size_t len, loom_rc_entry_t **e_p)
{
    uintptr_t start, end;
    page_range(rc, addr, len, &start, &end);
    for (loom_rc_entry_t *e = rc->head; e; e = e->next) {
        if (e->mr && !e->once && !e->id && e->start <= start && e->end >= end)
            return hit(rc, e, e_p);
    }
    rc->misses++;
    uintptr_t own_start = start, own_end = end;
    /* Idle entries that overlap (or touch) the range are absorbed: one larger
     * registration serves a buffer that grows or is used in parts. */
    for (loom_rc_entry_t *e = rc->head, *next; e; e = next) {
        next = e->next;
        if (e->refs == 0 && !e->id && e->start <= end && e->end >= start) {
            if (e->start < start)
                start = e->start;
            if (e->end > end)
                end = e->end;
            drop(rc, e);
        }
    }
    return insert_new(rc, start, end, own_start, own_end, 0, 0, e_p);
}

int loom_rcache_get_keyed(loom_rcache_t *rc, const void *base, size_t len, uint64_t id,
                          loom_rc_entry_t **e_p)
{
    uintptr_t start, end;
    page_range(rc, base, len, &start, &end);
    if (id) {
        for (loom_rc_entry_t *e = rc->head; e; e = e->next) {
            if (e->mr && e->id == id && e->start <= start && e->end >= end)
                return hit(rc, e, e_p);
        }
    }
    rc->misses++;
    /* Another identity over these pages: an allocation freed since (a keyed
     * entry), or a registration made without one. */
    for (loom_rc_entry_t *e = rc->head, *next; e; e = next) {
        next = e->next;
        if (e->refs == 0 && e->start < end && e->end > start) {
            drop(rc, e);
            rc->evictions++;
        }
    }
    return insert_new(rc, start, end, start, end, id, id == 0, e_p);
}

void loom_rcache_put(loom_rcache_t *rc, loom_rc_entry_t *e)
{
    if (--e->refs == 0) {
        if (e->once)
            drop(rc, e);
        else
            shrink(rc, 0);
    }
}

void loom_rcache_revoke(loom_rcache_t *rc)
{
    for (loom_rc_entry_t *e = rc->head; e; e = e->next)
        if (e->mr) {
            rc->dereg(rc->arg, e->mr);
            e->mr = NULL;
            e->lkey = e->rkey = 0;
        }
}

void loom_rcache_fini(loom_rcache_t *rc)
{
    while (rc->head)
        drop(rc, rc->head);
}
