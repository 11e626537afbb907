/*
 * mp_elastic - the worker of the elastic tests (tests/test_elastic.sh runs it
 * under loomrun --elastic): a toy model trained with commits, that survives
 * ranks dying, hosts leaving and hosts joining.
 *
 * The model is a vector w of MPE_DIM int64. Step s has MPE_BATCH samples;
 * rank r of n handles samples j with j % n == r, the "gradients" of those
 * samples are summed by an allreduce and added to w. Everything is integer,
 * so the result of a step does not depend on how samples are split across
 * ranks: after MPE_STEPS steps w must equal the serial computation, whatever
 * happened in between, if no committed step was lost or applied twice.
 *
 * After every step the state (step, w) is committed. On any failure a rank
 * rolls back to its commit, rebuilds the communicator, and takes the state
 * rank 0 of the new epoch broadcasts (a survivor: they come first). At each
 * commit point the ranks ask whether processes wait to join and rebuild if so.
 *
 * Faults, chosen by environment (ids are LOOM_ELASTIC_ID, set by loomrun):
 *   MPE_KILL_ID=i MPE_KILL_STEP=s   process i starts the allreduce of step s,
 *                                   then SIGKILLs itself (mid-allreduce)
 *   MPE_REBUILD_DIE_ID=i            process i SIGKILLs itself a few ms into
 *                                   its first rebuild
 *   MPE_STALE_ID=i MPE_STALE_STEP=s process i revokes the communicator at
 *                                   step s, waits until the others have
 *                                   committed a later step without it (rank 0's
 *                                   MPE_DIR/progress; at most MPE_STALE_SLEEP,
 *                                   60, seconds), then rebuilds: it must be
 *                                   refused as stale (it exits 6 when it is)
 *   MPE_SPLIT=1                     the steps' allreduces run on a split of the
 *                                   world (which must be revoked with it)
 * Membership changes the test makes from outside (a host added or removed)
 * take a while to arrive, longer on a busy machine: with MPE_SIZES="3 2 3"
 * the ranks hold before step MPE_HOLD_STEP (3/4 of the steps) until the
 * communicator sizes of the job so far are that sequence, asking whether
 * someone waits to join every 20 ms, at most MPE_HOLD_POLLS (3000) times.
 * The sizes travel with the state rank 0 broadcasts, and the polls are
 * collective (loom_comm_join_pending) and counted from each epoch's start,
 * so every rank holds and stops holding at the same point.
 * MPE_DIR: where rank 0 writes "progress" (the committed step) and the victims
 * "death" (their time of death, for the recovery time rank 0 reports).
 * Exit codes: 0 the model matches, 3 loom_init failed, 4 a rebuild failed,
 * 5 the model differs from the reference, 6 refused as stale (expected),
 * 7 not refused.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loom.h"

static int steps = 40, dim = 65536, batch = 12, sleep_ms = 30;
static long long my_id = -1;
static const char *dir;

/* The communicator sizes of the job so far, rank 0's account of it (the
 * sizes it printed), broadcast with the state; and MPE_SIZES. */
#define MAX_SIZES 16
static int64_t sizes[MAX_SIZES];
static int nsizes, nexpect;
static int64_t expect[MAX_SIZES];

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static double real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* The contribution of sample j of step s to element i, given w[i]. */
static int64_t grad(int s, int j, int i, int64_t wi)
{
    uint64_t x = ((uint64_t)wi ^ ((uint64_t)s * 1000003u + (uint64_t)j)) * 0x9E3779B97F4A7C15ull;
    return (int64_t)(x >> 44) + (i % 7);
}

static void local_grad(int s, int rank, int size, const int64_t *w, int64_t *g)
{
    memset(g, 0, sizeof(*g) * (size_t)dim);
    for (int j = rank; j < batch; j += size)
        for (int i = 0; i < dim; i++)
            g[i] += grad(s, j, i, w[i]);
}

static uint64_t hash(const int64_t *w)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < dim; i++)
        h = (h ^ (uint64_t)w[i]) * 0x100000001b3ull;
    return h;
}

static void write_file(const char *name, const char *fmt, double v)
{
    if (!dir)
        return;
    char path[512], tmp[520];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return;
    fprintf(f, fmt, v);
    fclose(f);
    rename(tmp, path);   /* readers never see half a file */
}

static void die_now(void)
{
    write_file("death", "%.3f\n", real_ms());
    raise(SIGKILL);
}

static void *die_later(void *arg)
{
    (void)arg;
    usleep((useconds_t)(1000 * (2 + getpid() % 20)));
    die_now();
    return NULL;
}

static int64_t read_progress(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/progress", dir);
    FILE *f = fopen(path, "r");
    long long v = -1;
    if (f) {
        if (fscanf(f, "%lld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

static void parse_sizes(const char *v)
{
    char *end;
    while (v && nexpect < MAX_SIZES) {
        long n = strtol(v, &end, 10);
        if (end == v)
            break;
        expect[nexpect++] = n;
        v = end;
    }
}

static int sizes_reached(void)
{
    return nsizes == nexpect && memcmp(sizes, expect, sizeof(*sizes) * (size_t)nexpect) == 0;
}

/* Broadcast the committed state from rank 0: newcomers get it, everyone
 * agrees on the step to continue from and on the sizes seen so far, to which
 * this epoch's is added. */
static loom_status_t sync_state(loom_comm_t c, int64_t *step, int64_t *w)
{
    int64_t head[2 + MAX_SIZES] = {*step, nsizes};
    memcpy(head + 2, sizes, sizeof(sizes));
    loom_status_t st = loom_broadcast(head, 2 + MAX_SIZES, LOOM_INT64, 0, c);
    if (st == LOOM_SUCCESS)
        st = loom_broadcast(w, (size_t)dim, LOOM_INT64, 0, c);
    if (st != LOOM_SUCCESS)
        return st;
    *step = head[0];
    nsizes = (int)head[1];
    memcpy(sizes, head + 2, sizeof(sizes));
    if (nsizes < MAX_SIZES)
        sizes[nsizes++] = loom_comm_size(c);
    return st;
}

int main(void)
{
    steps = env_int("MPE_STEPS", steps);
    dim = env_int("MPE_DIM", dim);
    batch = env_int("MPE_BATCH", batch);
    sleep_ms = env_int("MPE_SLEEP_MS", sleep_ms);
    dir = getenv("MPE_DIR");
    const char *idv = getenv("LOOM_ELASTIC_ID");
    my_id = idv ? atoll(idv) : -1;
    long long kill_id = env_int("MPE_KILL_ID", -1), kill_step = env_int("MPE_KILL_STEP", -1);
    long long rebuild_die_id = env_int("MPE_REBUILD_DIE_ID", -1);
    long long stale_id = env_int("MPE_STALE_ID", -1), stale_step = env_int("MPE_STALE_STEP", -1);
    int use_split = env_int("MPE_SPLIT", 0);
    parse_sizes(getenv("MPE_SIZES"));
    int hold_step = env_int("MPE_HOLD_STEP", steps * 3 / 4), max_polls = env_int("MPE_HOLD_POLLS", 3000);
    int polls = 0;
    loom_comm_t work = NULL;   /* the split the steps run on, with MPE_SPLIT */
    setvbuf(stdout, NULL, _IOLBF, 0);

    int64_t *w = calloc((size_t)dim, sizeof(int64_t)), *wc = calloc((size_t)dim, sizeof(int64_t));
    int64_t *g = calloc((size_t)dim, sizeof(int64_t));
    if (!w || !wc || !g)
        return 1;
    for (int i = 0; i < dim; i++)
        w[i] = wc[i] = i % 13;
    int64_t step = 0, step_c = 0;

    loom_comm_t comm;
    loom_status_t st = loom_init(&comm);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "mp_elastic id %lld: loom_init: %s: %s\n", my_id, loom_strerror(st),
                loom_comm_last_error(NULL));
        free(w);
        free(wc);
        free(g);
        return 3;
    }
    int need_sync = 1, failed = 0, rebuilds = 0, code = 0;
    double last_death_reported = 0;
    for (;;) {
        if (failed || need_sync == 2) {
            if (failed) {
                /* Roll back: the step in flight may have been applied here
                 * and not elsewhere, or the other way round. */
                memcpy(w, wc, sizeof(*w) * (size_t)dim);
                step = step_c;
                if (my_id == rebuild_die_id && rebuilds == 0) {
                    pthread_t t;
                    pthread_create(&t, NULL, die_later, NULL);
                }
            }
            loom_comm_t next;
            st = loom_comm_rebuild(comm, &next);
            rebuilds++;
            if (st != LOOM_SUCCESS) {
                fprintf(stderr, "mp_elastic id %lld: loom_comm_rebuild: %s: %s\n", my_id,
                        loom_strerror(st), loom_comm_last_error(comm));
                code = 4;
                goto out;
            }
            loom_comm_destroy(work);
            work = NULL;
            loom_comm_destroy(comm);
            comm = next;
            need_sync = 1;
        }
        if (need_sync) {
            if ((st = sync_state(comm, &step, w)) != LOOM_SUCCESS) {
                failed = 1;
                continue;
            }
            memcpy(wc, w, sizeof(*w) * (size_t)dim);
            step_c = step;
            if (loom_comm_rank(comm) == 0) {
                printf("[mpe] epoch %llu size %d step %lld\n",
                       (unsigned long long)loom_comm_epoch(comm), loom_comm_size(comm),
                       (long long)step);
                char path[512];
                snprintf(path, sizeof(path), "%s/death", dir ? dir : ".");
                FILE *f = dir && failed ? fopen(path, "r") : NULL;
                double t;
                if (f && fscanf(f, "%lf", &t) == 1 && t != last_death_reported) {
                    printf("[mpe] resumed %.1f ms after the death\n", real_ms() - t);
                    last_death_reported = t;
                }
                if (f)
                    fclose(f);
            }
            need_sync = 0;
            failed = 0;
            polls = 0;
        }
        if (step >= steps)
            break;
        if (use_split && !work && loom_comm_split(comm, 0, loom_comm_rank(comm), &work) != LOOM_SUCCESS) {
            failed = 1;
            continue;
        }
        loom_comm_t step_comm = work ? work : comm;
        int pending = 0;
        if ((st = loom_comm_join_pending(comm, &pending)) != LOOM_SUCCESS) {
            failed = 1;
            continue;
        }
        if (pending > 0) {
            /* The count only grows until the rebuild takes the newcomers in:
             * this rank's own later look sees at least what the ranks agreed on. */
            int waiting = 0;
            if (loom_comm_join_waiting(comm, &waiting) != LOOM_SUCCESS || waiting < pending) {
                fprintf(stderr, "[mpe] loom_comm_join_waiting: %d, below the agreed %d\n",
                        waiting, pending);
                return 1;
            }
            need_sync = 2;
            continue;
        }
        if (nexpect > 0 && step >= hold_step && !sizes_reached() && polls < max_polls) {
            if (polls == 0 && loom_comm_rank(comm) == 0) {
                printf("[mpe] holding at step %lld for the sizes of MPE_SIZES; so far:", (long long)step);
                for (int i = 0; i < nsizes; i++)
                    printf(" %lld", (long long)sizes[i]);
                printf("\n");
            }
            if (++polls == max_polls && loom_comm_rank(comm) == 0)
                printf("[mpe] held %d polls at step %lld for the sizes of MPE_SIZES: going on\n",
                       polls, (long long)step);
            usleep(20000);
            continue;
        }
        int rank = loom_comm_rank(comm), size = loom_comm_size(comm);
        local_grad((int)step, rank, size, w, g);
        if (my_id == stale_id && step == stale_step) {
            /* Leave on purpose without dying, come back too late. */
            loom_comm_revoke(comm);
            /* Come back only once the others went on without this rank. */
            double until = real_ms() + 1e3 * env_int("MPE_STALE_SLEEP", 60);
            while (dir && read_progress() <= stale_step && real_ms() < until)
                usleep(20000);
            if (!dir)
                sleep((unsigned)env_int("MPE_STALE_SLEEP", 6));
            loom_comm_t next;
            st = loom_comm_rebuild(comm, &next);
            if (st == LOOM_ERR_ABORTED && strstr(loom_comm_last_error(comm), "stale")) {
                printf("[mpe] id %lld refused as stale: %s\n", my_id, loom_comm_last_error(comm));
                code = 6;
            } else {
                fprintf(stderr, "mp_elastic id %lld: a stale rebuild returned %s: %s\n", my_id,
                        loom_strerror(st), loom_comm_last_error(comm));
                code = 7;
                if (st == LOOM_SUCCESS)
                    loom_comm_destroy(next);
            }
            goto out;
        }
        if (my_id == kill_id && step == kill_step) {
            loom_request_t req;
            if (loom_iallreduce(LOOM_IN_PLACE, g, (size_t)dim, LOOM_INT64, LOOM_SUM, step_comm,
                                &req) == LOOM_SUCCESS)
                usleep(1000);
            die_now();
        }
        if ((st = loom_allreduce(LOOM_IN_PLACE, g, (size_t)dim, LOOM_INT64, LOOM_SUM, step_comm)) !=
            LOOM_SUCCESS) {
            printf("[mpe] id %lld: allreduce of step %lld failed: %s: %s\n", my_id,
                   (long long)step, loom_strerror(st), loom_comm_last_error(step_comm));
            failed = 1;
            continue;
        }
        for (int i = 0; i < dim; i++)
            w[i] += g[i];
        step++;
        memcpy(wc, w, sizeof(*w) * (size_t)dim);   /* commit */
        step_c = step;
        if (rank == 0)
            write_file("progress", "%.0f\n", (double)step);
        usleep((useconds_t)sleep_ms * 1000);
    }

    if (loom_comm_rank(comm) == 0) {
        int64_t *ref = calloc((size_t)dim, sizeof(int64_t));
        for (int i = 0; i < dim; i++)
            ref[i] = i % 13;
        for (int s = 0; s < steps; s++) {
            local_grad(s, 0, 1, ref, g);
            for (int i = 0; i < dim; i++)
                ref[i] += g[i];
        }
        int same = memcmp(ref, w, sizeof(*w) * (size_t)dim) == 0;
        printf("[mpe] final epoch %llu size %d model %016llx reference %016llx %s\n",
               (unsigned long long)loom_comm_epoch(comm), loom_comm_size(comm),
               (unsigned long long)hash(w), (unsigned long long)hash(ref),
               same ? "MATCH" : "DIFFER");
        code = same ? 0 : 5;
        free(ref);
    }
out:
    loom_comm_destroy(work);
    loom_comm_destroy(comm);
    free(w);
    free(wc);
    free(g);
    return code;
}
