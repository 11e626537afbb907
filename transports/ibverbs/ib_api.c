/* ib_api.c - dlopen of libibverbs.so.1 (see ib_api.h). Never dlclose'd:
 * providers loaded by libibverbs keep threads and state for the process. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ib_api.h"

static loom_ib_api_t api;
static char load_error[512];
static int loaded;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void load(void)
{
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof(load_error), "cannot load libibverbs.so.1 (%s); install "
                 "rdma-core's libibverbs1", dlerror());
        return;
    }
    struct { const char *name; void **slot; int optional; } syms[] = {
        {"ibv_get_device_list", (void **)&api.get_device_list, 0},
        {"ibv_free_device_list", (void **)&api.free_device_list, 0},
        {"ibv_get_device_name", (void **)&api.get_device_name, 0},
        {"ibv_get_device_guid", (void **)&api.get_device_guid, 0},
        {"ibv_open_device", (void **)&api.open_device, 0},
        {"ibv_close_device", (void **)&api.close_device, 0},
        {"ibv_query_device", (void **)&api.query_device, 0},
        {"ibv_query_port", (void **)&api.query_port, 0},
        {"ibv_query_gid", (void **)&api.query_gid, 0},
        {"ibv_alloc_pd", (void **)&api.alloc_pd, 0},
        {"ibv_dealloc_pd", (void **)&api.dealloc_pd, 0},
        {"ibv_reg_mr", (void **)&api.reg_mr, 0},
        {"ibv_dereg_mr", (void **)&api.dereg_mr, 0},
        {"ibv_reg_dmabuf_mr", (void **)&api.reg_dmabuf_mr, 1},
        {"ibv_create_cq", (void **)&api.create_cq, 0},
        {"ibv_destroy_cq", (void **)&api.destroy_cq, 0},
        {"ibv_create_qp", (void **)&api.create_qp, 0},
        {"ibv_modify_qp", (void **)&api.modify_qp, 0},
        {"ibv_query_qp", (void **)&api.query_qp, 0},
        {"ibv_destroy_qp", (void **)&api.destroy_qp, 0},
        {"ibv_wc_status_str", (void **)&api.wc_status_str, 0},
    };
    for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
        void *f = dlsym(h, syms[i].name);
        if (!f && !syms[i].optional) {
            snprintf(load_error, sizeof(load_error), "libibverbs.so.1 lacks %s (rdma-core too "
                     "old?)", syms[i].name);
            return;
        }
        /* POSIX guarantees that a function pointer survives the trip through void *. */
        memcpy(syms[i].slot, &f, sizeof(f));
    }
    /* Registered memory and fork() (a data-loader worker, a subprocess) do not
     * mix on kernels without copy-on-fork for pinned pages: as NCCL does, ask
     * libibverbs to keep registered pages out of children (a no-op where the
     * kernel copes by itself). It must precede every other verbs call. */
    void *fi = dlsym(h, "ibv_fork_init");
    if (fi) {
        int (*fork_init)(void);
        memcpy(&fork_init, &fi, sizeof(fi));
        if (fork_init() != 0) { /* registration then works as without it */ }
    }
    loaded = 1;
}

const loom_ib_api_t *loom_ib_api_load(char *why, size_t whylen)
{
    pthread_once(&once, load);
    if (!loaded) {
        snprintf(why, whylen, "%s", load_error);
        return NULL;
    }
    return &api;
}
