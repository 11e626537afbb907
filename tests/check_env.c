/* Unit tests of the settings table and of loom_init's reading of launchers'
 * variables, against a fake environment. */
#include <check.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_suites.h"
#include "base/log.h"
#include "base/settings.h"
#include "src/comm.h"
#include "store/proto.h"

typedef struct fake_env {
    const char *kv[32];   /* name, value, name, value, ..., NULL */
} fake_env_t;

static const char *fake_get(const char *name, void *arg)
{
    fake_env_t *e = arg;
    for (int i = 0; e->kv[i]; i += 2)
        if (strcmp(e->kv[i], name) == 0)
            return e->kv[i + 1];
    return NULL;
}

static loom_status_t boot(fake_env_t *e, loom_bootstrap_t *b, loom_err_t *err)
{
    memset(err, 0, sizeof(*err));
    memset(b, 0, sizeof(*b));
    return loom_bootstrap_from_env(fake_get, e, b, err);
}

START_TEST(test_loom_vars)
{
    fake_env_t e = {{"LOOM_RANK", "2", "LOOM_SIZE", "4", "LOOM_LOCAL_RANK", "1", "LOOM_STORE",
                     "tcp://10.0.0.1:29500", NULL}};
    loom_bootstrap_t b;
    loom_err_t err;
    ck_assert_int_eq(boot(&e, &b, &err), LOOM_SUCCESS);
    ck_assert_int_eq(b.rank, 2);
    ck_assert_int_eq(b.size, 4);
    ck_assert_int_eq(b.local_rank, 1);
    ck_assert_str_eq(b.store, "tcp://10.0.0.1:29500");
    ck_assert_str_eq(b.source, "LOOM");
}
END_TEST

START_TEST(test_torchrun_vars)
{
    fake_env_t e = {{"RANK", "3", "WORLD_SIZE", "8", "LOCAL_RANK", "3", "MASTER_ADDR", "node7",
                     "MASTER_PORT", "29400", NULL}};
    loom_bootstrap_t b;
    loom_err_t err;
    ck_assert_int_eq(boot(&e, &b, &err), LOOM_SUCCESS);
    ck_assert_int_eq(b.rank, 3);
    ck_assert_int_eq(b.size, 8);
    ck_assert_str_eq(b.store, "tcp://node7:29400");
    ck_assert_str_eq(b.source, "torchrun");
}
END_TEST

START_TEST(test_ipv6_master)
{
    fake_env_t e = {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "fd00::1", "MASTER_PORT", "5",
                     NULL}};
    loom_bootstrap_t b;
    loom_err_t err;
    ck_assert_int_eq(boot(&e, &b, &err), LOOM_SUCCESS);
    ck_assert_str_eq(b.store, "tcp://[fd00::1]:5");
}
END_TEST

START_TEST(test_precedence)
{
    /* Loom's own variables win over a launcher's, and LOOM_STORE over MASTER_*. */
    fake_env_t e = {{"SLURM_PROCID", "5", "SLURM_NTASKS", "6", "LOOM_RANK", "1", "LOOM_SIZE", "2",
                     "MASTER_ADDR", "a", "MASTER_PORT", "1", "LOOM_STORE", "file:///tmp/x", NULL}};
    loom_bootstrap_t b;
    loom_err_t err;
    ck_assert_int_eq(boot(&e, &b, &err), LOOM_SUCCESS);
    ck_assert_int_eq(b.rank, 1);
    ck_assert_str_eq(b.store, "file:///tmp/x");
}
END_TEST

START_TEST(test_launchers)
{
    static const char *const families[][3] = {
        {"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
        {"PMI_RANK", "PMI_SIZE", "PMI"},
    };
    for (int i = 0; i < 3; i++) {
        fake_env_t e = {{families[i][0], "1", families[i][1], "3", "LOOM_STORE", "tcp://h:1", NULL}};
        loom_bootstrap_t b;
        loom_err_t err;
        ck_assert_int_eq(boot(&e, &b, &err), LOOM_SUCCESS);
        ck_assert_int_eq(b.rank, 1);
        ck_assert_int_eq(b.size, 3);
        ck_assert_str_eq(b.source, families[i][2]);
    }
}
END_TEST

START_TEST(test_bad_values)
{
    loom_bootstrap_t b;
    loom_err_t err;
    fake_env_t none = {{NULL}};
    ck_assert_int_eq(boot(&none, &b, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_RANK"));

    fake_env_t half = {{"LOOM_RANK", "0", NULL}};
    ck_assert_int_eq(boot(&half, &b, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_SIZE"));

    fake_env_t big = {{"LOOM_RANK", "4", "LOOM_SIZE", "4", "LOOM_STORE", "tcp://h:1", NULL}};
    ck_assert_int_eq(boot(&big, &b, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_RANK"));

    fake_env_t junk = {{"LOOM_RANK", "1x", "LOOM_SIZE", "4", NULL}};
    ck_assert_int_eq(boot(&junk, &b, &err), LOOM_ERR_INVALID_ARG);

    fake_env_t nostore = {{"LOOM_RANK", "0", "LOOM_SIZE", "2", NULL}};
    ck_assert_int_eq(boot(&nostore, &b, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_STORE"));

    fake_env_t badport = {{"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT",
                           "70000", NULL}};
    ck_assert_int_eq(boot(&badport, &b, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "MASTER_PORT"));
}
END_TEST

START_TEST(test_single_rank_needs_no_store)
{
    fake_env_t e = {{"LOOM_RANK", "0", "LOOM_SIZE", "1", NULL}};
    loom_bootstrap_t b;
    loom_err_t err;
    ck_assert_int_eq(boot(&e, &b, &err), LOOM_SUCCESS);
    ck_assert_str_eq(b.store, "");
    ck_assert_int_eq(b.local_rank, -1);
}
END_TEST

START_TEST(test_settings_defaults)
{
    fake_env_t e = {{NULL}};
    loom_settings_t s;
    loom_err_t err = {0};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &e, &err), LOOM_SUCCESS);
    ck_assert(s.timeout_s == 300.0);
    ck_assert_str_eq(s.transport, "auto");
    ck_assert_str_eq(s.job_id, "default");
    ck_assert_int_eq(s.socket_bufsize, 4194304);
    ck_assert_str_eq(s.ifname, "");
    ck_assert_int_eq(s.sockets_per_peer, 1);
    ck_assert_uint_eq(s.stripe_min_bytes, 256u << 10);
}
END_TEST

START_TEST(test_settings_values)
{
    fake_env_t e = {{"LOOM_TIMEOUT", "2.5", "LOOM_ALGO", "allreduce=ring,allgather=bruck",
                     "SLURM_JOB_ID", "991", "LOOM_SOCKET_IFNAME", "eth1",
                     "LOOM_SOCKETS_PER_PEER", "16", "LOOM_STRIPE_MIN_BYTES", "4096", NULL}};
    loom_settings_t s;
    loom_err_t err = {0};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &e, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.sockets_per_peer, 16);
    ck_assert_uint_eq(s.stripe_min_bytes, 4096);
    ck_assert(s.timeout_s == 2.5);
    ck_assert_str_eq(s.job_id, "991");
    ck_assert_str_eq(s.ifname, "eth1");
    ck_assert_str_eq(s.algo, "allreduce=ring,allgather=bruck");   /* rows: check_algorithms */
}
END_TEST

START_TEST(test_settings_rejects)
{
    static const char *const bad[][2] = {
        {"LOOM_TIMEOUT", "0"}, {"LOOM_TIMEOUT", "soon"}, {"LOOM_TIMEOUT", "-3"},
        {"LOOM_TRANSPORT", "carrier-pigeon"}, {"LOOM_SOCKET_BUFSIZE", "-1"},
        {"LOOM_SPIN_US", "lots"}, {"LOOM_SEGMENT_BYTES", "1"},
        {"LOOM_SOCKETS_PER_PEER", "0"}, {"LOOM_SOCKETS_PER_PEER", "17"},
        {"LOOM_SOCKETS_PER_PEER", "four"}, {"LOOM_STRIPE_MIN_BYTES", "0"},
        {"LOOM_STRIPE_MIN_BYTES", "1M"}, {"LOOM_ALGO", "allreduce=ring@1X-"},
        {"LOOM_ALGO", "allreduce=ring@64K-1K"}, {"LOOM_ALGO", "allreduce=@1M-"},
        {"LOOM_ALGO", "allreduce=ring@-"},
    };
    /* LOOM_ALGO's rows are parsed by the core (loom_comm_settings_load). */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fake_env_t e = {{bad[i][0], bad[i][1], NULL}};
        loom_settings_t s;
        loom_err_t err = {0};
        ck_assert_int_eq(loom_comm_settings_load(&s, fake_get, &e, &err), LOOM_ERR_INVALID_ARG);
        ck_assert_ptr_nonnull(strstr(err.msg, bad[i][0]));
    }
}
END_TEST

START_TEST(test_settings_auth_key)
{
    loom_settings_t s;
    loom_err_t err = {0};
    fake_env_t none = {{NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &none, &err), LOOM_SUCCESS);
    ck_assert_uint_eq(s.auth_keylen, 0);

    fake_env_t direct = {{"LOOM_AUTH_KEY", "s3cret", NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &direct, &err), LOOM_SUCCESS);
    ck_assert_uint_eq(s.auth_keylen, 6);
    ck_assert(memcmp(s.auth_key, "s3cret", 6) == 0);

    /* From a file: the trailing newline an editor leaves is not part of the key. */
    char path[] = "/tmp/loom-keyXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "from a file\n", 12), 12);
    close(fd);
    fake_env_t file = {{"LOOM_AUTH_KEY_FILE", path, NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &file, &err), LOOM_SUCCESS);
    ck_assert_uint_eq(s.auth_keylen, 11);
    ck_assert(memcmp(s.auth_key, "from a file", 11) == 0);
    fake_env_t both = {{"LOOM_AUTH_KEY", "wins", "LOOM_AUTH_KEY_FILE", path, NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &both, &err), LOOM_SUCCESS);
    ck_assert_uint_eq(s.auth_keylen, 4);
    fd = open(path, O_WRONLY | O_TRUNC);
    close(fd);
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &file, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "empty"));
    unlink(path);
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &file, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_AUTH_KEY_FILE"));

    /* What the frame MACs cover: full by default, headers on request, nothing else. */
    loom_err_clear(&err);
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &direct, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.auth_mac, 0);
    fake_env_t headers = {{"LOOM_AUTH_KEY", "k", "LOOM_AUTH_MAC", "headers", NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &headers, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.auth_mac, 1);
    fake_env_t enc = {{"LOOM_AUTH_KEY", "k", "LOOM_AUTH_MAC", "encrypt", "LOOM_AUTH_CIPHER",
                       "chacha20-poly1305", NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &enc, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.auth_mac, LOOM_AUTH_MAC_ENCRYPT);
    ck_assert_int_eq(s.auth_cipher, 2);
    fake_env_t bad = {{"LOOM_AUTH_KEY", "k", "LOOM_AUTH_MAC", "none", NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &bad, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_AUTH_MAC"));
}
END_TEST

START_TEST(test_settings_doc_table)
{
    /* loom-info prints this table and the loaders walk it: every row needs a
     * name, a help text and, where it has a field, one its type can fill. */
    for (size_t i = 0; i < loom_num_settings; i++) {
        const loom_setting_t *r = &loom_settings_table[i];
        ck_assert_ptr_nonnull(r->name);
        ck_assert_msg(strncmp(r->name, "LOOM_", 5) == 0, "%s", r->name);
        ck_assert_msg(strlen(r->help) > 5, "%s", r->name);
        ck_assert_msg(loom_setting_find(r->name) == r, "%s listed twice", r->name);
        switch (r->type) {
        case LOOM_SETTING_NONE:
            ck_assert_msg(r->group == LOOM_SG_BOOTSTRAP || r->group == LOOM_SG_PYTHON ||
                              r->group == LOOM_SG_LOG, "%s", r->name);
            break;
        case LOOM_SETTING_INT:
            ck_assert_msg(r->size == sizeof(int) || r->size == 8, "%s", r->name);
            ck_assert_msg(r->min <= r->max, "%s", r->name);
            ck_assert_msg(r->size == 8 || (r->min >= INT_MIN && r->max <= INT_MAX), "%s",
                          r->name);
            break;
        case LOOM_SETTING_SECONDS:
            ck_assert_msg(r->size == sizeof(double), "%s", r->name);
            break;
        case LOOM_SETTING_STRING:
            ck_assert_msg(r->size > 1, "%s", r->name);
            break;
        case LOOM_SETTING_STRREF:
            ck_assert_msg(r->size == sizeof(const char *), "%s", r->name);
            break;
        case LOOM_SETTING_CHOICE:
            ck_assert_msg(r->size == sizeof(int) && r->choices && r->choices[0], "%s", r->name);
            break;
        case LOOM_SETTING_CUSTOM:
            ck_assert_msg(r->parse != NULL, "%s", r->name);
            break;
        }
        ck_assert_msg(r->type == LOOM_SETTING_NONE ||
                      (r->group != LOOM_SG_BOOTSTRAP && r->group != LOOM_SG_PYTHON), "%s",
                      r->name);
    }
    /* The variables once read around the table, and the secrets loom-info hides. */
    static const char *const listed[] = {
        "LOOM_ELASTIC", "LOOM_ELASTIC_ID", "LOOM_ELASTIC_TIMEOUT", "LOOM_ELASTIC_MIN_NP",
        "LOOM_CUDA_CHUNK_BYTES", "LOOM_DEBUG", "LOOM_DEBUG_SUBSYS", "LOOM_DEBUG_FILE",
        "LOOM_REDIS_USER", "LOOM_REDIS_PASSWORD", "LOOM_FILE_STORE_GROUP", "LOOM_LOCAL_SIZE",
    };
    for (size_t i = 0; i < sizeof(listed) / sizeof(listed[0]); i++)
        ck_assert_msg(loom_setting_find(listed[i]) != NULL, "%s", listed[i]);
    ck_assert(loom_setting_find("LOOM_AUTH_KEY")->flags & LOOM_SETTING_SECRET);
    ck_assert(loom_setting_find("LOOM_REDIS_PASSWORD")->flags & LOOM_SETTING_SECRET);
    ck_assert(!(loom_setting_find("LOOM_REDIS_USER")->flags & LOOM_SETTING_SECRET));
    ck_assert_ptr_null(loom_setting_find("LOOM_BOGUS"));
}
END_TEST

START_TEST(test_settings_elastic_cuda)
{
    loom_settings_t s;
    loom_err_t err = {0};
    fake_env_t none = {{NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &none, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.elastic, 0);
    ck_assert(s.elastic_id == -1);
    ck_assert(s.elastic_timeout_s == 0);   /* LOOM_TIMEOUT's, in elastic.c */
    ck_assert_int_eq(s.elastic_min_np, 1);
    ck_assert_uint_eq(s.cuda_chunk_bytes, 4u << 20);
    ck_assert_int_eq(s.cuda_overlap, 1);
    ck_assert_int_eq(s.ib_gid_index, -1);
    ck_assert_int_eq(s.net_gdr, -1);

    fake_env_t set = {{"LOOM_ELASTIC", "1", "LOOM_ELASTIC_ID", "1099511627776",
                       "LOOM_ELASTIC_TIMEOUT", "7.5", "LOOM_ELASTIC_MIN_NP", "3",
                       "LOOM_CUDA_CHUNK_BYTES", "65536", "LOOM_CUDA_OVERLAP", "0",
                       "LOOM_IB_GID_INDEX", "3",
                       "LOOM_NET_GDR", "0", "LOOM_AUTH_MAC", "HEADERS", NULL}};
    ck_assert_int_eq(loom_settings_load(&s, fake_get, &set, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.elastic, 1);
    ck_assert(s.elastic_id == 1LL << 40);
    ck_assert(s.elastic_timeout_s == 7.5);
    ck_assert_int_eq(s.elastic_min_np, 3);
    ck_assert_uint_eq(s.cuda_chunk_bytes, 65536);
    ck_assert_int_eq(s.cuda_overlap, 0);
    ck_assert_int_eq(s.ib_gid_index, 3);
    ck_assert_int_eq(s.net_gdr, 0);
    ck_assert_int_eq(s.auth_mac, 1);

    /* Each a malformed value, named in the message with the range it missed. */
    static const char *const bad[][3] = {
        {"LOOM_ELASTIC", "yes", "[0, 1]"},
        {"LOOM_ELASTIC_ID", "-2", "[0, 1099511627776]"},
        {"LOOM_ELASTIC_TIMEOUT", "soon", "seconds"},
        {"LOOM_ELASTIC_MIN_NP", "0", "[1, 1048576]"},
        {"LOOM_CUDA_CHUNK_BYTES", "0", "[1, 4294967296]"},
        {"LOOM_CUDA_CHUNK_BYTES", "4294967297", "[1, 4294967296]"},
        {"LOOM_IB_GID_INDEX", "256", "[0, 255]"},
        {"LOOM_NET_GDR", "2", "[0, 1]"},
        {"LOOM_IB_SL", "16", "[0, 15]"},
        {"LOOM_AUTH_MAC", "none", "full, headers"},
        {"LOOM_JOB_ID", "", NULL},   /* empty is unset: loads */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fake_env_t e = {{bad[i][0], bad[i][1], NULL}};
        loom_err_clear(&err);
        if (!bad[i][2]) {
            ck_assert_int_eq(loom_settings_load(&s, fake_get, &e, &err), LOOM_SUCCESS);
            ck_assert_str_eq(s.job_id, "default");
            continue;
        }
        ck_assert_int_eq(loom_settings_load(&s, fake_get, &e, &err), LOOM_ERR_INVALID_ARG);
        ck_assert_msg(strstr(err.msg, bad[i][0]) && strstr(err.msg, bad[i][2]), "%s",
                      err.msg);
    }
}
END_TEST

START_TEST(test_settings_groups)
{
    /* The store's and the logger's rows load into their own structs. */
    loom_err_t err = {0};
    fake_env_t none = {{NULL}};
    loom_store_env_t se;
    memset(&se, 0x55, sizeof(se));
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_FILE, &se, fake_get, &none, &err),
                     LOOM_SUCCESS);
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_REDIS, &se, fake_get, &none, &err),
                     LOOM_SUCCESS);
    ck_assert_int_eq(se.file_group, 0);
    ck_assert_ptr_null(se.redis_user);
    ck_assert_ptr_null(se.redis_password);
    fake_env_t redis = {{"LOOM_REDIS_USER", "bob", "LOOM_REDIS_PASSWORD", "pw",
                         "LOOM_FILE_STORE_GROUP", "1", NULL}};
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_REDIS, &se, fake_get, &redis, &err),
                     LOOM_SUCCESS);
    ck_assert_int_eq(se.file_group, 0);   /* the file store's row, not the redis store's */
    ck_assert_str_eq(se.redis_user, "bob");
    ck_assert_str_eq(se.redis_password, "pw");
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_FILE, &se, fake_get, &redis, &err),
                     LOOM_SUCCESS);
    ck_assert_int_eq(se.file_group, 1);
    /* A bad value fails the store that reads it, and only that one. */
    fake_env_t group = {{"LOOM_FILE_STORE_GROUP", "yes", NULL}};
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_REDIS, &se, fake_get, &group, &err),
                     LOOM_SUCCESS);
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_FILE, &se, fake_get, &group, &err),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_FILE_STORE_GROUP"));

    loom_store_limits_t lim;
    memset(&lim, 0, sizeof(lim));
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_SERVER, &lim, fake_get, &none, &err),
                     LOOM_SUCCESS);
    ck_assert(lim.max_bytes == 268435456u);
    ck_assert_int_eq(lim.max_clients, 8192);
    ck_assert_int_eq(lim.max_clients_per_host, 2048);
    ck_assert(lim.hello_timeout_s == 5 && lim.idle_timeout_s == 120);
    fake_env_t big = {{"LOOM_STORE_MAX_BYTES", "9000000000", "LOOM_STORE_IDLE_TIMEOUT", "0.5",
                       NULL}};
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_SERVER, &lim, fake_get, &big, &err),
                     LOOM_SUCCESS);
    ck_assert(lim.max_bytes == 9000000000u);
    ck_assert(lim.idle_timeout_s == 0.5);
    fake_env_t small = {{"LOOM_STORE_MAX_BYTES", "4095", NULL}};
    loom_err_clear(&err);
    ck_assert_int_eq(loom_settings_load_group(LOOM_SG_STORE_SERVER, &lim, fake_get, &small, &err),
                     LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_STORE_MAX_BYTES"));

    loom_log_env_t le;
    fake_env_t dbg = {{"LOOM_DEBUG", "bogus", "LOOM_DEBUG_FILE", "/tmp/x.%p", NULL}};
    loom_log_env_read(&le, fake_get, &dbg);
    ck_assert_str_eq(le.level, "bogus");   /* the logger ignores what it cannot use */
    ck_assert_ptr_null(le.subsys);
    ck_assert_str_eq(le.file, "/tmp/x.%p");
}
END_TEST

Suite *loom_env_suite(void)
{
    Suite *s = suite_create("env");
    TCase *tc = tcase_create("bootstrap");
    tcase_add_test(tc, test_loom_vars);
    tcase_add_test(tc, test_torchrun_vars);
    tcase_add_test(tc, test_ipv6_master);
    tcase_add_test(tc, test_precedence);
    tcase_add_test(tc, test_launchers);
    tcase_add_test(tc, test_bad_values);
    tcase_add_test(tc, test_single_rank_needs_no_store);
    suite_add_tcase(s, tc);
    TCase *ts = tcase_create("settings");
    tcase_add_test(ts, test_settings_defaults);
    tcase_add_test(ts, test_settings_values);
    tcase_add_test(ts, test_settings_rejects);
    tcase_add_test(ts, test_settings_doc_table);
    tcase_add_test(ts, test_settings_auth_key);
    tcase_add_test(ts, test_settings_elastic_cuda);
    tcase_add_test(ts, test_settings_groups);
    suite_add_tcase(s, ts);
    return s;
}
