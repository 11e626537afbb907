/* spin.h - how long a waiting rank busy-polls before it sleeps in the kernel.
 *
 * Spinning saves the wake-up of a sleeping waiter (a futex or epoll wake-up,
 * tens of microseconds in a VM) when the answer comes soon. It costs a core:
 * harmless on a quiet node, ruinous when the peer we wait for needs that core
 * (ranks outnumber CPUs, or busy processes of the same priority share them):
 * the peer then runs only when the scheduler takes the core from us, and a
 * spinner that yields hands a whole time slice to a busy neighbour. Which
 * side wins depends on who else runs and at what priority (niced builds take
 * little from a spinner, a `yes` takes half), so on a crowded machine the
 * policy measures it: it times its waits when spinning and when sleeping,
 * keeps to the faster way, and now and then tries the other again.
 *
 * The policy: LOOM_SPIN_US fixed, or (auto)
 *  - never spin on one CPU (the peer needs our very core);
 *  - crowded (more ranks of the communicator on this node than CPUs we may
 *    use, or more runnable tasks than CPUs in /proc/loadavg) and sleeping
 *    has been clearly faster lately (LOOM_SPIN_SLEEP_GAIN): do not spin;
 *  - else spin about twice what recent spinning waits took, within
 *    [LOOM_SPIN_AUTO_MIN_US, LOOM_SPIN_AUTO_MAX_US]. */
#ifndef LOOM_SPIN_H
#define LOOM_SPIN_H

/* Longest spin of the automatic policy, in microseconds. */
#define LOOM_SPIN_AUTO_MAX_US 200
/* Shortest, while spinning at all: a few wake-ups (a sleeping wait in a
 * communicator that mixes shared memory and TCP naps a millisecond). */
#define LOOM_SPIN_AUTO_MIN_US 50

/* Crowded, sleeping is chosen where waits that sleep took less than the
 * spinning ones by this factor. */
#define LOOM_SPIN_SLEEP_GAIN 2.0

/* What the decision rests on. */
typedef struct loom_spin_view {
    int setting_us;          /* LOOM_SPIN_US: < 0 auto, else this many microseconds */
    int cpus;                /* CPUs this process may run on (sched_getaffinity) */
    int local_ranks;         /* ranks of the communicator on this node */
    int runnable;            /* runnable tasks on those CPUs (/proc/loadavg), < 0 unknown */
    double spin_wait_us;     /* what recent waits took that spun (decaying geometric mean), < 0 none */
    double sleep_wait_us;    /* what recent waits took that slept at once, < 0 none */
} loom_spin_view_t;

/* The spin budget in microseconds: 0 sleeps at once. The one place the
 * policy lives. */
int loom_spin_decide(const loom_spin_view_t *v);

/* /proc/loadavg is read at most this often (seconds). */
#define LOOM_SPIN_SAMPLE_S 0.02
/* On a crowded machine, the way not taken is tried again this often (seconds)
 * for LOOM_SPIN_TRIAL_WAITS waits, so its time stays current. */
#define LOOM_SPIN_TRIAL_S 1.0
#define LOOM_SPIN_TRIAL_WAITS 8

/* The policy's state for one communicator. */
typedef struct loom_spin {
    loom_spin_view_t view;
    double next_sample_s;
    double next_trial_s;
    int trial_left;          /* waits left that take the other way */
    int trial_spins;         /* that way: 1 spin, 0 sleep */
    int wait_budget_us;      /* the budget of the wait going on, -1: none */
} loom_spin_t;

/* setting_us: LOOM_SPIN_US (< 0 auto); local_ranks: the communicator's ranks on this node. */
void loom_spin_init(loom_spin_t *s, int setting_us, int local_ranks);
/* A wait begins at now_s (seconds, CLOCK_MONOTONIC): its spin budget, in us. */
int loom_spin_begin(loom_spin_t *s, double now_s);
/* The wait that began ended after wait_us. */
void loom_spin_end(loom_spin_t *s, double wait_us);
/* What loom_spin_begin reads from /proc: the runnable tasks (< 0 unknown).
 * Exposed for the unit tests. */
void loom_spin_sample(loom_spin_t *s, double now_s, int runnable);

#endif
