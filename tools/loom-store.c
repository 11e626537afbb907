/* loom-store - serve a tcp:// rendezvous store in the foreground, for jobs whose
 * launcher does not (Slurm, Kubernetes, a hand-started set of ranks). Rank 0 of
 * such a job finds the port taken and connects as a client like everyone else. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/settings.h"
#include "store/store.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: loom-store --port P [--host H] [--auth-key-file F] [--quiet]\n"
            "\n"
            "Serve a Loom rendezvous store (LOOM_STORE=tcp://H:P) until SIGINT or SIGTERM.\n"
            "\n"
            "  --port P   TCP port to listen on; 0 picks a free one (printed)\n"
            "  --host H   address or name to listen on (default: 127.0.0.1, this machine\n"
            "             only; '*' for every interface)\n"
            "  --auth-key-file F  require the key in file F (LOOM_AUTH_KEY_FILE's format) of\n"
            "             every client before serving it; ranks need the same key\n"
            "  --quiet    do not print the \"listening\" line\n"
            "  --help     show this text\n"
            "\n"
            "Limits (environment): LOOM_STORE_MAX_BYTES, LOOM_STORE_MAX_CLIENTS,\n"
            "LOOM_STORE_MAX_CLIENTS_PER_HOST, LOOM_STORE_HELLO_TIMEOUT, LOOM_STORE_IDLE_TIMEOUT\n"
            "(loom-info lists them with their defaults).\n");
}

static int parse_port(const char *s, int *port_p)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0 || v > 65535)
        return -1;
    *port_p = (int)v;
    return 0;
}

/* The value of option name at argv[*i], as "--name V" or "--name=V"; NULL if
 * argv[*i] is not that option or lacks its value. */
static const char *opt_value(int argc, char **argv, int *i, const char *name)
{
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0)
        return NULL;
    if (a[n] == '=')
        return a + n + 1;
    if (a[n] == '\0' && *i + 1 < argc)
        return argv[++*i];
    return NULL;
}

/* Only LOOM_AUTH_KEY_FILE is set: the rest of the settings take their defaults. */
static const char *key_file_env(const char *name, void *arg)
{
    const char *const *env = arg;
    return strcmp(name, env[0]) == 0 ? env[1] : NULL;
}

int main(int argc, char **argv)
{
    /* Loopback unless asked: a store reachable from the network is open to
     * anyone who reaches it, so serving beyond this machine is a choice. */
    const char *host = "127.0.0.1", *key_file = NULL;
    int port = -1, quiet = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0) {
            quiet = 1;
        } else if ((val = opt_value(argc, argv, &i, "--port")) != NULL) {
            if (parse_port(val, &port) != 0) {
                fprintf(stderr, "loom-store: bad port '%s' (0..65535)\n", val);
                return 2;
            }
        } else if ((val = opt_value(argc, argv, &i, "--host")) != NULL) {
            host = strcmp(val, "*") == 0 ? NULL : val;
        } else if ((val = opt_value(argc, argv, &i, "--auth-key-file")) != NULL) {
            key_file = val;
        } else {
            fprintf(stderr, "loom-store: bad argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (port < 0) {
        fprintf(stderr, "loom-store: --port is required\n");
        usage(stderr);
        return 2;
    }

    /* Block the stop signals before the server thread starts, so it inherits the
     * mask and only sigwait below receives them. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);

    loom_err_t err;
    loom_err_clear(&err);
    /* The file is read as the ranks read LOOM_AUTH_KEY_FILE, so one file serves both. */
    loom_settings_t keyed;
    memset(&keyed, 0, sizeof(keyed));
    if (key_file) {
        const char *env[] = {"LOOM_AUTH_KEY_FILE", key_file};
        if (loom_settings_load(&keyed, key_file_env, (void *)env, &err) != LOOM_SUCCESS) {
            fprintf(stderr, "loom-store: %s\n", err.msg);
            return 2;
        }
    }
    loom_store_server_t *srv;
    if (loom_store_server_start_auth(host, port, keyed.auth_key, keyed.auth_keylen, &err, &srv) !=
        LOOM_SUCCESS) {
        fprintf(stderr, "loom-store: %s\n", err.msg);
        return 1;
    }
    if (!quiet) {
        /* Without --host, print this machine's name: the line is meant to be
         * pasted into LOOM_STORE on the other hosts. */
        char name[HOST_NAME_MAX + 1] = "localhost";
        if (host == NULL && gethostname(name, sizeof(name)) == 0)
            name[sizeof(name) - 1] = '\0';
        char addr[HOST_NAME_MAX + 300];
        loom_store_format_hostport(host != NULL ? host : name, loom_store_server_port(srv),
                                   addr, sizeof(addr));
        printf("loom-store listening on tcp://%s\n", addr);
        fflush(stdout);
    }

    int sig;
    while (sigwait(&stop, &sig) != 0)
        ;
    loom_store_server_stop(srv);
    return 0;
}
