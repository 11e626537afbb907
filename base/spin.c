/* spin.c - see spin.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "spin.h"

/* The peer we wait for needs our only core. */
static int never_spin(const loom_spin_view_t *v)
{
    return v->cpus <= 1;
}

/* Others want our CPUs: our own ranks (then a spinner that yields hands the
 * core to the peer it waits for, which may pay), or anyone. */
static int crowded(const loom_spin_view_t *v)
{
    return v->local_ranks > v->cpus || v->runnable > v->cpus;
}

/* How long to spin when spinning at all: about twice what spinning waits
 * took, so a spin ends soon after the answer should have come. */
static int spin_length(const loom_spin_view_t *v)
{
    if (v->spin_wait_us < 0)
        return LOOM_SPIN_AUTO_MAX_US;
    /* Waits far longer than any spin (a peer computing): a spin rarely
     * catches one, so keep only a short one for the quick exceptions. */
    if (v->spin_wait_us > 8.0 * LOOM_SPIN_AUTO_MAX_US)
        return LOOM_SPIN_AUTO_MIN_US;
    double b = 2.0 * v->spin_wait_us;
    if (b < LOOM_SPIN_AUTO_MIN_US)
        return LOOM_SPIN_AUTO_MIN_US;
    return b > LOOM_SPIN_AUTO_MAX_US ? LOOM_SPIN_AUTO_MAX_US : (int)b;
}

int loom_spin_decide(const loom_spin_view_t *v)
{
    if (v->setting_us >= 0)
        return v->setting_us;
    if (never_spin(v))
        return 0;
    /* A quiet machine spins: the lost CPU time is nobody's loss. Crowded, it
     * sleeps only where that is clearly faster: ranks time each other's ways
     * too (a spinner waiting for sleepers pays their wake-ups), and where our
     * own ranks are the crowd, spinners that yield pass the core to the peer
     * they wait for, which beats waking it. */
    if (crowded(v) && v->sleep_wait_us >= 0 && v->spin_wait_us >= 0 &&
        v->sleep_wait_us * LOOM_SPIN_SLEEP_GAIN < v->spin_wait_us)
        return 0;
    return spin_length(v);
}

static int affinity_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void loom_spin_init(loom_spin_t *s, int setting_us, int local_ranks)
{
    memset(s, 0, sizeof(*s));
    s->view.setting_us = setting_us;
    s->view.cpus = setting_us < 0 ? affinity_cpus() : 1;
    s->view.local_ranks = local_ranks > 0 ? local_ranks : 1;
    s->view.runnable = -1;
    s->view.spin_wait_us = -1;
    s->view.sleep_wait_us = -1;
    s->wait_budget_us = -1;
}

void loom_spin_sample(loom_spin_t *s, double now_s, int runnable)
{
    s->next_sample_s = now_s + LOOM_SPIN_SAMPLE_S;
    s->view.runnable = runnable;
}

/* The runnable tasks on our CPUs, from /proc/loadavg ("0.50 0.40 0.30 3/120
 * 4567": the fourth field counts them on every CPU); -1 when unreadable. */
static int runnable_tasks(int cpus)
{
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    int running, total;
    double l1, l5, l15;
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    if (sscanf(buf, "%lf %lf %lf %d/%d", &l1, &l5, &l15, &running, &total) != 5)
        return -1;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > cpus ? (int)((long)running * cpus / online) : running;
}

int loom_spin_begin(loom_spin_t *s, double now_s)
{
    loom_spin_view_t *v = &s->view;
    if (v->setting_us >= 0)
        return s->wait_budget_us = v->setting_us;
    if (now_s >= s->next_sample_s)
        loom_spin_sample(s, now_s, runnable_tasks(v->cpus));
    int b = loom_spin_decide(v);
    if (!never_spin(v) && crowded(v)) {
        /* Keep the time of the way not taken current: the crowd changes. */
        if (s->trial_left == 0 && now_s >= s->next_trial_s) {
            s->trial_left = LOOM_SPIN_TRIAL_WAITS;
            s->trial_spins = b == 0;
            s->next_trial_s = now_s + LOOM_SPIN_TRIAL_S;
        }
        if (s->trial_left > 0) {
            s->trial_left--;
            b = s->trial_spins ? spin_length(v) : 0;
        }
    }
    return s->wait_budget_us = b;
}

void loom_spin_end(loom_spin_t *s, double wait_us)
{
    if (s->wait_budget_us < 0 || s->view.setting_us >= 0)
        return;
    double *mean = s->wait_budget_us > 0 ? &s->view.spin_wait_us : &s->view.sleep_wait_us;
    if (wait_us < 0.1)
        wait_us = 0.1;
    /* A geometric mean: one wait that a preemption stretched a thousandfold
     * must not outweigh a run of quick ones, while a way that keeps costing a
     * time slice still shows. */
    *mean = *mean <= 0 ? wait_us : exp(log(*mean) + (log(wait_us) - log(*mean)) / 4);
    s->wait_budget_us = -1;
}
