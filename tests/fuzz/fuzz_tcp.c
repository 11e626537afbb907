/* fuzz_tcp.c - the TCP transport's handshake and frame reader: the input is
 * what a stranger (or a broken rank 1) sends to rank 0 over a real loopback
 * connection: a hello, then frames. Rank 0 is a real transport instance; it
 * accepts, answers the hello, and, when the handshake passes, reads frames
 * against two posted receives. The first input byte chooses LOOM_AUTH_KEY (a
 * keyed rank must refuse whatever cannot prove the key), LOOM_AUTH_MAC and
 * LOOM_AUTH_CIPHER.
 * The transport's source is included to reach its ops without the mux. */
#include "transports/tcp/tcp.c"

#define FUZZ_JOB  UINT64_C(0x6a6f622d66757a7a)   /* "job-fuzz" */
#define FUZZ_COMM UINT64_C(0x636f6d6d2d667a7a)

static const char *fuzz_env(const char *name, void *arg)
{
    unsigned mode = *(const unsigned *)arg;
    if (strcmp(name, "LOOM_AUTH_KEY") == 0)
        return (mode & 1) ? "fuzz key" : NULL;
    if (strcmp(name, "LOOM_AUTH_MAC") == 0)
        return (mode & 2) ? "headers" : (mode & 4) ? "encrypt" : NULL;
    if (strcmp(name, "LOOM_AUTH_CIPHER") == 0)
        return (mode & 8) ? "chacha20-poly1305" : "aes-256-gcm";
    if (strcmp(name, "LOOM_EARLY_MAX_BYTES") == 0)
        return "65536";   /* reach the cap on early messages */
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned mode = data[0];
    data++;
    size--;

    loom_settings_t cfg;
    loom_err_t err;
    loom_err_clear(&err);
    if (loom_settings_load(&cfg, fuzz_env, &mode, &err) != LOOM_SUCCESS)
        abort();
    loom_tp_params_t p = {.rank = 0, .size = 2, .job_hash = FUZZ_JOB, .comm_hash = FUZZ_COMM,
                          .bind_host = "127.0.0.1", .settings = &cfg, .host_id = "fuzz",
                          .err = &err};
    char addr[256];
    loom_tp_t *tp = NULL;
    if (tcp_create(&p, addr, sizeof(addr), &tp) != LOOM_SUCCESS)
        return 0;   /* out of ports or descriptors: nothing to learn */

    struct sockaddr_storage ss;
    socklen_t sslen;
    int fd = -1;
    if (parse_addr(addr, &ss, &sslen) != 0 ||
        (fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        connect(fd, (struct sockaddr *)&ss, sslen) != 0)
        goto out;
    /* Everything at once, then end of stream: the transport reads it in
     * whatever pieces the kernel hands over. libFuzzer's inputs are small
     * enough to fit the socket buffers. */
    for (size_t off = 0; off < size;) {
        ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);

    /* Rank 1's address only names it in the handshake's binding. */
    char *addrs[2] = {addr, "127.0.0.1:9"};
    if (tcp_connect(tp, addrs, 0.01) == LOOM_SUCCESS) {
        uint8_t small[64], big[4096];
        loom_tp_req_t reqs[2];
        memset(reqs, 0, sizeof(reqs));
        reqs[0] = (loom_tp_req_t){.peer = 1, .buf = small, .len = sizeof(small),
                                  .match = {.tag = 7, .desc = 0xff, .total = 16}};
        reqs[1] = (loom_tp_req_t){.peer = 1, .buf = big, .len = sizeof(big),
                                  .match = {.tag = 7, .desc = 0xff, .total = 1024}};
        int posted = 0;
        for (int i = 0; i < 2; i++)
            posted += tcp_irecv(tp, &reqs[i]) == LOOM_SUCCESS;
        for (int round = 0; posted == 2 && round < 64; round++) {
            int moved = 0;
            if (tcp_progress(tp, 0, &moved) != LOOM_SUCCESS || (!moved && reqs[1].done))
                break;
        }
    }
out:
    if (fd >= 0) {
        /* A reset, not a close: no TIME_WAIT per run to exhaust the ports. */
        struct linger lg = {.l_onoff = 1, .l_linger = 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(fd);
    }
    tcp_destroy(tp, 0.0);
    return 0;
}
