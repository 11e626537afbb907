/* tcp_srv.h - the tcp:// store server's state, shared by its event loop
 * (store/tcp_server.c) and its start and stop (store/tcp_listen.c). One thread
 * owns all of it while the server runs; see store/tcp_server.c. */
#ifndef LOOM_STORE_TCP_SRV_H
#define LOOM_STORE_TCP_SRV_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"
#include "proto.h"

typedef struct srv_client srv_client_t;

typedef struct srv_blob {
    size_t refs;
    uint32_t len;
    uint8_t data[];
} srv_blob_t;

typedef struct srv_entry {
    struct srv_entry *next;       /* hash chain */
    uint64_t hash;
    uint32_t klen;
    char *key;
    srv_blob_t *val;              /* NULL when absent */
    int present;                  /* 0: a placeholder that only holds waiters */
    srv_client_t *waiters;        /* clients parked in WAIT on this key */
} srv_entry_t;

struct srv_client {
    srv_client_t *prev, *next;    /* the live list; next also links the dead list */
    int fd;
    uint32_t events;              /* epoll interest now registered */
    int hello_done, closing, dead;
    int hs;                       /* the hello's step: 0 hello, 1 nonce, 2 proof */
    uint8_t nonce_c[LOOM_STORE_NONCE_LEN], nonce_s[LOOM_STORE_NONCE_LEN];
    uint8_t *in;
    size_t in_len, in_cap, need;
    int have_req;
    loom_store_req_t req;
    uint8_t *out;
    size_t out_len, out_off, out_cap;
    srv_blob_t *out_blob;         /* a value being sent after out, from blob_off */
    size_t blob_off;
    size_t reserved;              /* quota taken for the request being read */
    uint64_t discard;             /* payload bytes to read and drop, then answer FULL */
    srv_entry_t *parked;          /* the key this client waits for, or NULL */
    double deadline;
    srv_client_t *wprev, *wnext;  /* the entry's waiter list */
    double since;                 /* accepted at */
    double last_active;           /* hello or last request finished */
    uint8_t src[16];              /* source address, for the per-host cap */
    uint8_t src_len;
};

struct loom_store_server {
    int lfd, wfd, ep, port;
    pthread_t thread;
    srv_entry_t **tab;
    size_t tab_size, n_entries;
    srv_client_t *clients, *dead;
    size_t n_parked, n_clients;
    double accept_resume;         /* > 0: accepting paused (out of fds) until then */
    uint8_t key[1024];            /* LOOM_AUTH_KEY clients must prove; keylen 0: none */
    size_t keylen;
    double next_sweep;
    loom_store_limits_t lim;
    uint64_t held;                /* bytes counted against lim.max_bytes */
};

/* The server thread: serves until loom_store_server_stop wakes it. */
void *loom_store_server_run(void *arg);
/* Everything of a server whose thread has ended (or never ran). */
void loom_store_server_free(loom_store_server_t *srv);

#endif
