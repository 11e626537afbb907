/* Unit tests of the verbs transport's device-free parts: the registration
 * cache (against counting stand-ins for ibv_reg_mr/ibv_dereg_mr), LOOM_IB_HCA
 * parsing, GID choice, the GPUDirect decision and the message headers. */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_suites.h"
#include "transports/ibverbs/ib_regcache.h"
#include "transports/ibverbs/ib_util.h"

/* ---- registration cache ----------------------------------------------------- */

typedef struct fake_reg {
    int regs, deregs, live, fail_next, fail_always;
    uintptr_t last_start;
    size_t last_len;
} fake_reg_t;

static int fake_reg_fn(void *arg, void *addr, size_t len, void **mr_p, uint32_t *lkey,
                       uint32_t *rkey)
{
    fake_reg_t *f = arg;
    if (f->fail_always || f->fail_next) {
        f->fail_next = 0;
        errno = ENOMEM;
        return -1;
    }
    f->regs++;
    f->live++;
    f->last_start = (uintptr_t)addr;
    f->last_len = len;
    *mr_p = (void *)(uintptr_t)f->regs;
    *lkey = (uint32_t)f->regs;
    *rkey = (uint32_t)f->regs + 1000;
    return 0;
}

static void fake_dereg_fn(void *arg, void *mr)
{
    fake_reg_t *f = arg;
    ck_assert_ptr_nonnull(mr);
    f->deregs++;
    f->live--;
}

static size_t page(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

/* An address range that is never touched: the cache only does arithmetic on it. */
static uint8_t *region(size_t pages)
{
    static uint8_t *base;
    if (!base)
        base = (uint8_t *)(uintptr_t)(UINT64_C(1) << 40);
    (void)pages;
    return base;
}

START_TEST(test_rcache_hit_and_alignment)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    loom_rcache_init(&rc, 1 << 30, 64, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    loom_rc_entry_t *e1, *e2, *e3;
    ck_assert_int_eq(loom_rcache_get(&rc, b + 100, 1000, &e1), 0);
    ck_assert_int_eq(f.regs, 1);
    /* Widened to whole pages. */
    ck_assert_uint_eq(f.last_start, (uintptr_t)b);
    ck_assert_uint_eq(f.last_len, page());
    /* Same page, different offset: a hit. */
    ck_assert_int_eq(loom_rcache_get(&rc, b + 2000, 100, &e2), 0);
    ck_assert_ptr_eq(e1, e2);
    ck_assert_int_eq(e1->refs, 2);
    ck_assert_int_eq(f.regs, 1);
    ck_assert_uint_eq(rc.hits, 1);
    ck_assert_uint_eq(rc.misses, 1);
    /* Crossing into the next page is not covered: a miss. */
    ck_assert_int_eq(loom_rcache_get(&rc, b + page() - 10, 20, &e3), 0);
    ck_assert_int_eq(f.regs, 2);
    ck_assert_uint_eq(e3->end - e3->start, 2 * page());
    loom_rcache_put(&rc, e1);
    loom_rcache_put(&rc, e2);
    loom_rcache_put(&rc, e3);
    /* Idle entries stay cached. */
    ck_assert_int_eq(f.deregs, 0);
    ck_assert_int_eq(loom_rcache_get(&rc, b + 5, 5, &e1), 0);
    ck_assert_int_eq(f.regs, 2);
    loom_rcache_put(&rc, e1);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(test_rcache_overlap_merges_idle)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    loom_rcache_init(&rc, 1 << 30, 64, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    size_t pg = page();
    loom_rc_entry_t *a, *c, *m;
    ck_assert_int_eq(loom_rcache_get(&rc, b, pg, &a), 0);                /* page 0 */
    ck_assert_int_eq(loom_rcache_get(&rc, b + 4 * pg, pg, &c), 0);       /* page 4 */
    loom_rcache_put(&rc, a);
    /* c stays referenced: it must survive (a transfer uses its keys). */
    ck_assert_int_eq(loom_rcache_get(&rc, b + pg / 2, 3 * pg, &m), 0);  /* pages 0-3 */
    ck_assert_int_eq(f.regs, 3);
    ck_assert_int_eq(f.deregs, 1);           /* idle page-0 entry absorbed */
    ck_assert_uint_eq(m->start, (uintptr_t)b);
    ck_assert_uint_eq(m->end, (uintptr_t)b + 4 * pg);
    ck_assert_uint_eq(rc.entries, 2);
    ck_assert_int_eq(c->refs, 1);
    loom_rcache_put(&rc, c);
    loom_rcache_put(&rc, m);
    /* A larger request over both idle entries absorbs both. */
    ck_assert_int_eq(loom_rcache_get(&rc, b, 5 * pg, &m), 0);
    ck_assert_int_eq(f.deregs, 3);
    ck_assert_uint_eq(rc.entries, 1);
    ck_assert_uint_eq(rc.bytes, 5 * pg);
    loom_rcache_put(&rc, m);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(test_rcache_lru_eviction)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    size_t pg = page();
    loom_rcache_init(&rc, 3 * pg, 64, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    loom_rc_entry_t *e[4];
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(loom_rcache_get(&rc, b + (size_t)(2 * i) * pg, 10, &e[i]), 0);
        loom_rcache_put(&rc, e[i]);
    }
    ck_assert_int_eq(f.deregs, 0);
    /* Touch entry 0 so entry 1 is the least recently used. */
    ck_assert_int_eq(loom_rcache_get(&rc, b, 10, &e[0]), 0);
    loom_rcache_put(&rc, e[0]);
    ck_assert_int_eq(loom_rcache_get(&rc, b + 6 * pg, 10, &e[3]), 0);
    loom_rcache_put(&rc, e[3]);
    ck_assert_int_eq(f.deregs, 1);
    ck_assert_uint_eq(rc.evictions, 1);
    ck_assert_uint_eq(rc.bytes, 3 * pg);
    /* Entry 1 is gone, entries 0 and 2 are still hits. */
    int regs = f.regs;
    ck_assert_int_eq(loom_rcache_get(&rc, b, 10, &e[0]), 0);
    ck_assert_int_eq(loom_rcache_get(&rc, b + 4 * pg, 10, &e[2]), 0);
    ck_assert_int_eq(f.regs, regs);
    loom_rc_entry_t *again;
    ck_assert_int_eq(loom_rcache_get(&rc, b + 2 * pg, 10, &again), 0);
    ck_assert_int_eq(f.regs, regs + 1);
    /* Over the bound with everything referenced but e[3]: e[3] went. */
    ck_assert_int_eq(f.live, 3);
    ck_assert_int_eq(e[0]->refs + e[2]->refs + again->refs, 3);
    loom_rcache_put(&rc, e[0]);
    loom_rcache_put(&rc, e[2]);
    loom_rcache_put(&rc, again);
    ck_assert_uint_le(rc.bytes, 3 * pg);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(test_rcache_entry_bound_and_nocache)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    size_t pg = page();
    loom_rcache_init(&rc, 1 << 30, 2, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    loom_rc_entry_t *e;
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(loom_rcache_get(&rc, b + (size_t)(2 * i) * pg, 10, &e), 0);
        loom_rcache_put(&rc, e);
    }
    ck_assert_uint_eq(rc.entries, 2);
    ck_assert_int_eq(f.live, 2);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(f.live, 0);

    /* max_bytes 0: nothing idle is kept (LOOM_IB_REG_CACHE=0). */
    fake_reg_t g = {0};
    loom_rcache_init(&rc, 0, 64, fake_reg_fn, fake_dereg_fn, &g);
    loom_rc_entry_t *x, *y;
    ck_assert_int_eq(loom_rcache_get(&rc, b, 10, &x), 0);
    ck_assert_int_eq(loom_rcache_get(&rc, b, 10, &y), 0);
    ck_assert_ptr_eq(x, y);              /* shared while referenced */
    loom_rcache_put(&rc, x);
    ck_assert_int_eq(g.deregs, 0);
    loom_rcache_put(&rc, y);
    ck_assert_int_eq(g.deregs, 1);
    ck_assert_int_eq(loom_rcache_get(&rc, b, 10, &x), 0);
    ck_assert_int_eq(g.regs, 2);
    loom_rcache_put(&rc, x);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(g.live, 0);
}
END_TEST

/* loom_comm_register_buffer's entries: always a new registration (an idle
 * entry over the pages may hold pages unmapped since), kept while held, hit by
 * messages inside it, released on the last put. */
START_TEST(test_rcache_get_new)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    size_t pg = page();
    loom_rcache_init(&rc, 1 << 30, 64, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    loom_rc_entry_t *old, *e, *m;
    ck_assert_int_eq(loom_rcache_get(&rc, b, 4 * pg, &old), 0);
    loom_rcache_put(&rc, old);           /* idle, cached */
    ck_assert_int_eq(loom_rcache_get_new(&rc, b + pg, pg, &e), 0);
    ck_assert_int_eq(f.regs, 2);         /* not the idle entry covering it */
    ck_assert_int_eq(f.deregs, 1);       /* which was dropped */
    ck_assert_uint_eq(e->start, (uintptr_t)(b + pg));
    ck_assert_uint_eq(e->end, (uintptr_t)(b + 2 * pg));
    ck_assert_int_eq(loom_rcache_get(&rc, b + pg + 100, 200, &m), 0);
    ck_assert_ptr_eq(m, e);              /* a message inside it: a hit */
    ck_assert_int_eq(f.regs, 2);
    loom_rcache_put(&rc, m);
    ck_assert_int_eq(loom_rcache_get_new(&rc, b + pg, pg, &m), 0);
    ck_assert_ptr_ne(m, e);              /* a second handle: its own registration */
    loom_rcache_put(&rc, m);
    loom_rcache_put(&rc, e);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(f.live, 0);

    /* With nothing kept idle, the last put deregisters it. */
    fake_reg_t g = {0};
    loom_rcache_init(&rc, 0, 64, fake_reg_fn, fake_dereg_fn, &g);
    ck_assert_int_eq(loom_rcache_get_new(&rc, b, 10, &e), 0);
    loom_rcache_put(&rc, e);
    ck_assert_int_eq(g.live, 0);
    loom_rcache_fini(&rc);
}
END_TEST

/* After a failure every registration goes at once, those still held too;
 * each is deregistered once, never handed out again, and freed by its
 * last put or by fini. */
START_TEST(test_rcache_revoke)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    size_t pg = page();
    loom_rcache_init(&rc, 1 << 30, 64, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    loom_rc_entry_t *held, *idle, *handle, *again;
    ck_assert_int_eq(loom_rcache_get(&rc, b, pg, &held), 0);
    ck_assert_int_eq(loom_rcache_get(&rc, b + 4 * pg, pg, &idle), 0);
    loom_rcache_put(&rc, idle);
    ck_assert_int_eq(loom_rcache_get_new(&rc, b + 8 * pg, pg, &handle), 0);
    ck_assert_int_eq(f.live, 3);
    loom_rcache_revoke(&rc);
    ck_assert_int_eq(f.live, 0);
    ck_assert_int_eq(f.deregs, 3);
    ck_assert_uint_eq(held->rkey, 0);
    loom_rcache_revoke(&rc);             /* twice: nothing more */
    ck_assert_int_eq(f.deregs, 3);
    ck_assert_int_eq(loom_rcache_get(&rc, b, pg, &again), 0);
    ck_assert_ptr_ne(again, held);       /* a fresh registration, not the revoked one */
    ck_assert_int_eq(f.live, 1);
    loom_rcache_put(&rc, handle);        /* the user's deregistration, later */
    loom_rcache_put(&rc, again);
    loom_rcache_fini(&rc);               /* held was never put back */
    ck_assert_int_eq(f.live, 0);
    ck_assert_int_eq(f.deregs, 4);
}
END_TEST

/* GPU memory: entries keyed on the allocation and its identity. A range freed
 * and allocated again at the same address (a new buffer id) must get a new
 * registration, never the old one, whose pages are no longer the program's. */
START_TEST(test_rcache_keyed)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    const size_t pg = page();
    loom_rcache_init(&rc, 8 * pg, 4, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    loom_rc_entry_t *a, *a2, *n, *z;
    ck_assert_int_eq(loom_rcache_get_keyed(&rc, b, 2 * pg, 7, &a), 0);
    ck_assert_int_eq(f.regs, 1);
    ck_assert_uint_eq(f.last_start, (uintptr_t)b);
    ck_assert_uint_eq(f.last_len, 2 * pg);
    loom_rcache_put(&rc, a);
    /* Same allocation, same identity: the one registration, kept while idle. */
    ck_assert_int_eq(loom_rcache_get_keyed(&rc, b, 2 * pg, 7, &a2), 0);
    ck_assert_ptr_eq(a2, a);
    ck_assert_int_eq(f.regs, 1);
    loom_rcache_put(&rc, a2);
    ck_assert_int_eq(f.live, 1);
    /* Freed and allocated again at the same address: a new identity. */
    ck_assert_int_eq(loom_rcache_get_keyed(&rc, b, 2 * pg, 8, &n), 0);
    ck_assert_int_eq(f.regs, 2);
    ck_assert_int_eq(f.deregs, 1);   /* the stale one went at once */
    ck_assert_uint_eq(n->id, 8);
    /* A plain (unkeyed) lookup never gets a keyed entry. */
    loom_rcache_put(&rc, n);
    ck_assert_int_eq(loom_rcache_get(&rc, b, pg, &z), 0);
    ck_assert_ptr_ne(z, n);
    loom_rcache_put(&rc, z);
    /* Identity unknown (0): registered for this use only. */
    uint8_t *c = b + 8 * pg;
    int live = f.live;
    ck_assert_int_eq(loom_rcache_get_keyed(&rc, c, pg, 0, &z), 0);
    ck_assert_int_eq(f.live, live + 1);
    loom_rcache_put(&rc, z);
    ck_assert_int_eq(f.live, live);
    /* Bounded: idle keyed entries are evicted least recently used first. */
    for (uint64_t id = 100; id < 110; id++) {
        ck_assert_int_eq(loom_rcache_get_keyed(&rc, b + (id - 90) * pg, pg, id, &z), 0);
        loom_rcache_put(&rc, z);
    }
    ck_assert_uint_le(rc.entries, 4);
    ck_assert_uint_le(rc.bytes, 8 * pg);
    ck_assert_ptr_eq(rc.head, z);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(f.live, 0);
}
END_TEST

START_TEST(test_rcache_failure_evicts_and_retries)
{
    fake_reg_t f = {0};
    loom_rcache_t rc;
    size_t pg = page();
    loom_rcache_init(&rc, 1 << 30, 64, fake_reg_fn, fake_dereg_fn, &f);
    uint8_t *b = region(16);
    loom_rc_entry_t *e, *held;
    ck_assert_int_eq(loom_rcache_get(&rc, b, 10, &held), 0);
    ck_assert_int_eq(loom_rcache_get(&rc, b + 2 * pg, 10, &e), 0);
    loom_rcache_put(&rc, e);
    /* The first attempt fails (pinned-memory limit): idle entries are given
     * back, the referenced one stays, and the second attempt succeeds. */
    f.fail_next = 1;
    ck_assert_int_eq(loom_rcache_get(&rc, b + 8 * pg, 10, &e), 0);
    ck_assert_int_eq(f.live, 2);
    ck_assert_int_eq(held->refs, 1);
    loom_rcache_put(&rc, e);
    f.fail_always = 1;
    errno = 0;
    ck_assert_int_eq(loom_rcache_get(&rc, b + 12 * pg, 10, &e), -1);
    ck_assert_int_eq(errno, ENOMEM);
    ck_assert_int_eq(f.live, 1);         /* only the referenced entry is left */
    loom_rcache_put(&rc, held);
    loom_rcache_fini(&rc);
    ck_assert_int_eq(f.live, 0);
}
END_TEST

/* ---- LOOM_IB_HCA ------------------------------------------------------------ */

START_TEST(test_hca_parse)
{
    loom_ib_hca_list_t l;
    char err[256];
    ck_assert_int_eq(loom_ib_hca_parse("mlx5_0:1,mlx5_1", &l, err, sizeof(err)), 0);
    ck_assert_int_eq(l.n, 2);
    ck_assert_int_eq(l.exclude, 0);
    ck_assert_int_eq(l.exact, 0);
    ck_assert_str_eq(l.v[0].name, "mlx5_0");
    ck_assert_int_eq(l.v[0].port, 1);
    ck_assert_str_eq(l.v[1].name, "mlx5_1");
    ck_assert_int_eq(l.v[1].port, -1);
    ck_assert_int_eq(loom_ib_hca_parse("^=mlx5_2:2", &l, err, sizeof(err)), 0);
    ck_assert_int_eq(l.exclude, 1);
    ck_assert_int_eq(l.exact, 1);
    ck_assert_int_eq(l.n, 1);
    ck_assert_int_eq(l.v[0].port, 2);
    ck_assert_int_eq(loom_ib_hca_parse("", &l, err, sizeof(err)), 0);
    ck_assert_int_eq(l.n, 0);
    ck_assert_int_eq(loom_ib_hca_parse(NULL, &l, err, sizeof(err)), 0);
    ck_assert_int_eq(l.n, 0);
    static const char *const bad[] = {"mlx5_0:x", ":1", "mlx5_0,", "^", "mlx5_0:0", "a:1:2",
                                      "mlx5_0:", "a,,b"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(loom_ib_hca_parse(bad[i], &l, err, sizeof(err)) == -1, "accepted \"%s\"",
                      bad[i]);
        ck_assert_ptr_nonnull(strstr(err, "LOOM_IB_HCA"));
    }
}
END_TEST

START_TEST(test_hca_match)
{
    loom_ib_hca_list_t l;
    char err[256];
    ck_assert_int_eq(loom_ib_hca_parse("", &l, err, sizeof(err)), 0);
    ck_assert(loom_ib_hca_match(&l, "anything", 3));
    /* Prefix match, as NCCL: "mlx5_1" also selects mlx5_10. */
    ck_assert_int_eq(loom_ib_hca_parse("mlx5_1", &l, err, sizeof(err)), 0);
    ck_assert(loom_ib_hca_match(&l, "mlx5_1", 1));
    ck_assert(loom_ib_hca_match(&l, "mlx5_10", 2));
    ck_assert(!loom_ib_hca_match(&l, "mlx5_0", 1));
    ck_assert_int_eq(loom_ib_hca_parse("=mlx5_1", &l, err, sizeof(err)), 0);
    ck_assert(loom_ib_hca_match(&l, "mlx5_1", 1));
    ck_assert(!loom_ib_hca_match(&l, "mlx5_10", 1));
    ck_assert_int_eq(loom_ib_hca_parse("mlx5_0:1,mlx5_1:2", &l, err, sizeof(err)), 0);
    ck_assert(loom_ib_hca_match(&l, "mlx5_0", 1));
    ck_assert(!loom_ib_hca_match(&l, "mlx5_0", 2));
    ck_assert(loom_ib_hca_match(&l, "mlx5_1", 2));
    ck_assert(!loom_ib_hca_match(&l, "mlx5_1", 1));
    ck_assert_int_eq(loom_ib_hca_parse("^mlx5_2,loomfake1:2", &l, err, sizeof(err)), 0);
    ck_assert(!loom_ib_hca_match(&l, "mlx5_2", 1));
    ck_assert(loom_ib_hca_match(&l, "mlx5_3", 1));
    ck_assert(!loom_ib_hca_match(&l, "loomfake1", 2));
    ck_assert(loom_ib_hca_match(&l, "loomfake1", 1));
}
END_TEST

/* ---- GIDs ------------------------------------------------------------------- */

static void v4mapped(uint8_t g[16], uint8_t a, uint8_t b, uint8_t c, uint8_t d)
{
    memset(g, 0, 16);
    g[10] = g[11] = 0xff;
    g[12] = a;
    g[13] = b;
    g[14] = c;
    g[15] = d;
}

START_TEST(test_gid_choice)
{
    char err[256];
    uint8_t gids[4][16];
    int types[4] = {0, 0, 0, 0};
    memset(gids, 0, sizeof(gids));
    /* The test provider's RoCE table: link-local v1 at 0, ::ffff:127.0.0.1 at 1,
     * and no sysfs types. */
    gids[0][0] = 0xfe;
    gids[0][1] = 0x80;
    gids[0][15] = 1;
    v4mapped(gids[1], 127, 0, 0, 1);
    ck_assert_int_eq(loom_ib_choose_gid((const uint8_t (*)[16])gids, types, 2, -1, NULL, err,
                                        sizeof(err)), 1);
    ck_assert_int_eq(loom_ib_choose_gid((const uint8_t (*)[16])gids, types, 2, 0, NULL, err,
                                        sizeof(err)), 0);
    /* A forced index must name a non-empty entry. */
    ck_assert_int_eq(loom_ib_choose_gid((const uint8_t (*)[16])gids, types, 4, 3, NULL, err,
                                        sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "LOOM_IB_GID_INDEX=3"));
    ck_assert_int_eq(loom_ib_choose_gid((const uint8_t (*)[16])gids, types, 2, 7, NULL, err,
                                        sizeof(err)), -1);
    /* A real mlx5 table: v1 and v2 entries per address; the v2 entry that carries
     * the job's address wins over another v2 address. */
    v4mapped(gids[1], 10, 0, 0, 5);
    v4mapped(gids[2], 10, 0, 0, 5);
    v4mapped(gids[3], 192, 168, 1, 5);
    int mlx[4] = {1, 1, 2, 2};
    uint8_t pref[16];
    v4mapped(pref, 192, 168, 1, 5);
    ck_assert_int_eq(loom_ib_choose_gid((const uint8_t (*)[16])gids, mlx, 4, -1, pref, err,
                                        sizeof(err)), 3);
    ck_assert_int_eq(loom_ib_choose_gid((const uint8_t (*)[16])gids, mlx, 4, -1, NULL, err,
                                        sizeof(err)), 2);
    /* Only v1 entries: used as a last resort. */
    int v1[4] = {1, 1, 1, 1};
    ck_assert_int_ge(loom_ib_choose_gid((const uint8_t (*)[16])gids, v1, 4, -1, NULL, err,
                                        sizeof(err)), 0);
    /* An empty table says what to do. */
    memset(gids, 0, sizeof(gids));
    ck_assert_int_eq(loom_ib_choose_gid((const uint8_t (*)[16])gids, types, 4, -1, NULL, err,
                                        sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "LOOM_IB_GID_INDEX"));
}
END_TEST

START_TEST(test_gid_text)
{
    uint8_t g[16], back[16];
    v4mapped(g, 127, 0, 0, 1);
    char txt[40];
    loom_ib_gid_format(g, txt);
    ck_assert_str_eq(txt, "0000:0000:0000:0000:0000:ffff:7f00:0001");
    ck_assert_int_eq(loom_ib_gid_parse(txt, back), 0);
    ck_assert_mem_eq(g, back, 16);
    ck_assert_int_eq(loom_ib_gid_parse("0000:zz00", back), -1);
}
END_TEST

/* ---- GPUDirect decision ------------------------------------------------------ */

START_TEST(test_gdr_decision)
{
    char why[256];
    loom_gdr_caps_t c = {.forced = -1};
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_HOST);
    c.device_buffer = 1;
    /* Nothing available: staging; forcing it is an error that says why. */
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_STAGING);
    c.forced = 1;
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_IMPOSSIBLE);
    ck_assert_ptr_nonnull(strstr(why, "LOOM_NET_GDR=1"));
    /* dma-buf needs both sides. */
    c = (loom_gdr_caps_t){.forced = -1, .device_buffer = 1, .verbs_dmabuf = 1, .near = 1};
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_STAGING);
    c.gpu_dmabuf = 1;
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_DMABUF);
    /* dma-buf is preferred over peermem when both work. */
    c.peermem = 1;
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_DMABUF);
    c.verbs_dmabuf = 0;   /* rdma-core < 34 */
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_PEERMEM);
    /* Far apart: staging by default, GPUDirect when forced. */
    c.near = 0;
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_STAGING);
    ck_assert_ptr_nonnull(strstr(why, "PCIe"));
    /* Not measurable (the doubles, no sysfs): staging, and the reason. */
    c.near = -1;
    c.distance = "no PCI path for the HCA (none)";
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_STAGING);
    ck_assert_ptr_nonnull(strstr(why, "distance unknown: staging"));
    ck_assert_ptr_nonnull(strstr(why, "no PCI path for the HCA"));
    /* Near: GPUDirect by itself, saying why. */
    c.near = 1;
    c.distance = "GPU 0000:03:00.0 and HCA 0000:04:00.0 share a PCIe switch";
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_PEERMEM);
    ck_assert_ptr_nonnull(strstr(why, "share a PCIe switch"));
    c.near = 0;
    c.distance = NULL;
    c.forced = 1;
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_PEERMEM);
    /* LOOM_NET_GDR=0 wins over every capability. */
    c = (loom_gdr_caps_t){.forced = 0, .device_buffer = 1, .verbs_dmabuf = 1, .gpu_dmabuf = 1,
                          .peermem = 1, .near = 1};
    ck_assert_int_eq(loom_gdr_decide(&c, why, sizeof(why)), LOOM_GDR_STAGING);
    ck_assert_int_eq(loom_gdr_decide(&c, NULL, 0), LOOM_GDR_STAGING);
    ck_assert_str_eq(loom_gdr_path_name(LOOM_GDR_DMABUF), "dmabuf");
}
END_TEST

/* ---- headers ---------------------------------------------------------------- */

/* GPU-HCA distance from sysfs paths, as realpath resolves them on real
 * machines (a two-level PCIe switch under one root port, as on DGX-class
 * boards; a second root port; a second socket's root complex; a VM whose
 * devices sit on the root bus; soft-RoCE with no PCI device). */
START_TEST(test_gdr_pci_near)
{
    char what[256];
    const char *gpu = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/"
                      "0000:03:00.0";
    /* Same switch, another downstream port. */
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                            "0000:02:10.0/0000:04:00.0", what, sizeof(what)), 1);
    ck_assert_ptr_nonnull(strstr(what, "share a PCIe switch below root port 0000:00:01.0"));
    ck_assert_ptr_nonnull(strstr(what, "0000:03:00.0"));
    ck_assert_ptr_nonnull(strstr(what, "0000:04:00.0"));
    /* Two levels of switches, meeting at the upper one (NCCL's PXB). */
    ck_assert_int_eq(loom_gdr_pci_near("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                       "0000:02:00.0/0000:03:00.0/0000:04:10.0/0000:05:00.0",
                                       "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/"
                                       "0000:02:04.0/0000:06:00.0/0000:07:00.1", what,
                                       sizeof(what)), 1);
    /* Two functions of one device (a multi-function adapter). */
    ck_assert_int_eq(loom_gdr_pci_near("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0",
                                       "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.1/", what,
                                       sizeof(what)), 1);
    /* Different root ports of one root complex: through the CPU (PHB). */
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/devices/pci0000:00/0000:00:03.1/0000:21:00.0",
                                       what, sizeof(what)), 0);
    ck_assert_ptr_nonnull(strstr(what, "root ports 0000:00:01.0, 0000:00:03.1"));
    /* Another root complex (a second socket, or another host bridge): SYS. */
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/"
                                            "0000:82:08.0/0000:83:00.0", what, sizeof(what)), 0);
    ck_assert_ptr_nonnull(strstr(what, "different PCI root complexes (pci0000:00, pci0000:80)"));
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/devices/pci0001:00/0001:00:01.0/0001:01:00.0",
                                       what, sizeof(what)), 0);
    /* A VM: both devices on the root bus, nothing shared but the host bridge. */
    ck_assert_int_eq(loom_gdr_pci_near("/sys/devices/pci0000:00/0000:00:04.0",
                                       "/sys/devices/pci0000:00/0000:00:05.0", what, sizeof(what)),
                     0);
    /* Unknown: no path, soft-RoCE (a virtual device), garbage. */
    ck_assert_int_eq(loom_gdr_pci_near(gpu, NULL, what, sizeof(what)), -1);
    ck_assert_ptr_nonnull(strstr(what, "no PCI path for the HCA"));
    ck_assert_int_eq(loom_gdr_pci_near(NULL, gpu, what, sizeof(what)), -1);
    ck_assert_ptr_nonnull(strstr(what, "no PCI path for the GPU"));
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "", NULL, 0), -1);
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/devices/virtual/infiniband/rxe0", what,
                                       sizeof(what)), -1);
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/devices/pci0000:00", what, sizeof(what)), -1);
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/devices/pci0000:00/0000:00:01.0/net/eth0",
                                       what, sizeof(what)), -1);
    ck_assert_int_eq(loom_gdr_pci_near(gpu, "/sys/bus/pci/devices/0000:03:00.0", what,
                                       sizeof(what)), -1);
}
END_TEST

START_TEST(test_hdr_roundtrip_and_garbage)
{
    loom_ib_hdr_t h = {.type = LOOM_IB_CTS, .desc = 0x00ff0102, .tag = UINT64_C(1) << 63 | 77,
                       .total = 12345, .len = 1 << 20, .cookie = 7, .peer_cookie = 9,
                       .rkey = 0xabcdef01, .addr = UINT64_C(0x7fff12345678)}, got;
    uint8_t buf[LOOM_IB_HDR_BYTES];
    loom_ib_hdr_encode(&h, buf);
    ck_assert_int_eq(loom_ib_hdr_decode(buf, &got), 0);
    ck_assert_int_eq(got.type, LOOM_IB_CTS);
    ck_assert_uint_eq(got.desc, h.desc);
    ck_assert_uint_eq(got.tag, h.tag);
    ck_assert_uint_eq(got.total, h.total);
    ck_assert_uint_eq(got.len, h.len);
    ck_assert_uint_eq(got.cookie, 7);
    ck_assert_uint_eq(got.peer_cookie, 9);
    ck_assert_uint_eq(got.rkey, h.rkey);
    ck_assert_uint_eq(got.addr, h.addr);
    /* Little-endian on the wire whatever the host. */
    ck_assert_uint_eq(buf[8], 77);
    uint8_t bad[LOOM_IB_HDR_BYTES];
    memcpy(bad, buf, sizeof(bad));
    bad[0] ^= 1;
    ck_assert_int_eq(loom_ib_hdr_decode(bad, &got), -1);
    memcpy(bad, buf, sizeof(bad));
    bad[1] = 9;
    ck_assert_int_eq(loom_ib_hdr_decode(bad, &got), -1);
    memcpy(bad, buf, sizeof(bad));
    bad[45] = 1;
    ck_assert_int_eq(loom_ib_hdr_decode(bad, &got), -1);
    h.len = (UINT64_C(1) << 40) + 1;
    loom_ib_hdr_encode(&h, bad);
    ck_assert_int_eq(loom_ib_hdr_decode(bad, &got), -1);
}
END_TEST

Suite *loom_ibverbs_suite(void)
{
    Suite *s = suite_create("ibverbs");
    TCase *tc = tcase_create("regcache");
    tcase_add_test(tc, test_rcache_hit_and_alignment);
    tcase_add_test(tc, test_rcache_overlap_merges_idle);
    tcase_add_test(tc, test_rcache_lru_eviction);
    tcase_add_test(tc, test_rcache_entry_bound_and_nocache);
    tcase_add_test(tc, test_rcache_failure_evicts_and_retries);
    tcase_add_test(tc, test_rcache_get_new);
    tcase_add_test(tc, test_rcache_revoke);
    tcase_add_test(tc, test_rcache_keyed);
    suite_add_tcase(s, tc);
    tc = tcase_create("config");
    tcase_add_test(tc, test_hca_parse);
    tcase_add_test(tc, test_hca_match);
    tcase_add_test(tc, test_gid_choice);
    tcase_add_test(tc, test_gid_text);
    tcase_add_test(tc, test_gdr_decision);
    tcase_add_test(tc, test_gdr_pci_near);
    tcase_add_test(tc, test_hdr_roundtrip_and_garbage);
    suite_add_tcase(s, tc);
    return s;
}
