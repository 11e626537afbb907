/* check_spin.c - the wait policy (base/spin.h): when a waiting rank spins,
 * for how long, and how it learns from its waits on a crowded machine. */
#include <check.h>
#include <string.h>

#include "check_suites.h"
#include "base/settings.h"
#include "base/spin.h"

static loom_spin_view_t view(int cpus, int local_ranks, int runnable, double spin_us,
                             double sleep_us)
{
    loom_spin_view_t v = {.setting_us = -1, .cpus = cpus, .local_ranks = local_ranks,
                          .runnable = runnable, .spin_wait_us = spin_us,
                          .sleep_wait_us = sleep_us};
    return v;
}

START_TEST(test_decide_fixed)
{
    loom_spin_view_t v = view(1, 8, 100, 5, 1);
    v.setting_us = 0;
    ck_assert_int_eq(loom_spin_decide(&v), 0);
    v.setting_us = 75;   /* a fixed budget holds whatever the machine looks like */
    ck_assert_int_eq(loom_spin_decide(&v), 75);
}
END_TEST

START_TEST(test_decide_oversubscribed_by_ranks)
{
    loom_spin_view_t v = view(1, 1, 1, -1, -1);
    ck_assert_int_eq(loom_spin_decide(&v), 0);            /* one CPU */
    /* 4 ranks on 2 CPUs crowd them whatever the load figure says: the
     * faster way wins. */
    v = view(2, 4, 1, 500, 30);
    ck_assert_int_eq(loom_spin_decide(&v), 0);
    v = view(2, 4, 1, 10, 30);
    ck_assert_int_eq(loom_spin_decide(&v), LOOM_SPIN_AUTO_MIN_US);
    v = view(4, 4, 4, 500, 30);
    ck_assert_int_gt(loom_spin_decide(&v), 0);            /* as many ranks as CPUs */
}
END_TEST

START_TEST(test_decide_length)
{
    /* A quiet machine spins, about twice what spinning waits took. */
    loom_spin_view_t v = view(2, 2, 1, -1, -1);
    ck_assert_int_eq(loom_spin_decide(&v), LOOM_SPIN_AUTO_MAX_US);
    v.spin_wait_us = 3;
    ck_assert_int_eq(loom_spin_decide(&v), LOOM_SPIN_AUTO_MIN_US);
    v.spin_wait_us = 50;
    ck_assert_int_eq(loom_spin_decide(&v), 100);
    v.spin_wait_us = 150;
    ck_assert_int_eq(loom_spin_decide(&v), LOOM_SPIN_AUTO_MAX_US);
    v.spin_wait_us = 20 * LOOM_SPIN_AUTO_MAX_US;   /* waits no spin catches */
    ck_assert_int_eq(loom_spin_decide(&v), LOOM_SPIN_AUTO_MIN_US);
    /* Quiet: sleeping being faster does not matter, nobody needs the CPU. */
    v = view(2, 2, 2, 50, 10);
    ck_assert_int_eq(loom_spin_decide(&v), 100);
}
END_TEST

START_TEST(test_decide_crowded)
{
    loom_spin_view_t v = view(2, 2, 9, 2000, 30);
    ck_assert_int_eq(loom_spin_decide(&v), 0);            /* sleeping is faster */
    v = view(2, 2, 9, 5, 30);
    ck_assert_int_eq(loom_spin_decide(&v), LOOM_SPIN_AUTO_MIN_US);   /* spinning is */
    v = view(2, 2, 9, 50, 30);
    ck_assert_int_eq(loom_spin_decide(&v), 100);          /* sleeping, but not clearly */
    v = view(2, 2, 9, 61, 30);
    ck_assert_int_eq(loom_spin_decide(&v), 0);            /* clearly */
    v = view(2, 2, 9, -1, 30);
    ck_assert_int_gt(loom_spin_decide(&v), 0);            /* spinning untried */
    v = view(2, 2, 9, 5, -1);
    ck_assert_int_gt(loom_spin_decide(&v), 0);            /* sleeping untried */
    v = view(2, 2, -1, 2000, 30);
    ck_assert_int_gt(loom_spin_decide(&v), 0);            /* no load figure: not crowded */
}
END_TEST

/* One wait of the state machine at time t on a machine with runnable tasks. */
static int one_wait(loom_spin_t *s, double t, int runnable, double spin_wait_us,
                    double sleep_wait_us)
{
    loom_spin_sample(s, t, runnable);   /* so begin reads nothing from /proc */
    int b = loom_spin_begin(s, t);
    loom_spin_end(s, b > 0 ? spin_wait_us : sleep_wait_us);
    return b;
}

START_TEST(test_learns_to_sleep_and_back)
{
    loom_spin_t s;
    loom_spin_init(&s, -1, 2);
    s.view.cpus = 2;
    double t = 100;
    /* Crowded, nothing known: the first waits try sleeping... */
    int slept = 0;
    for (int i = 0; i < LOOM_SPIN_TRIAL_WAITS; i++)
        slept += one_wait(&s, t += 1e-4, 9, 3000, 30) == 0;
    ck_assert_int_eq(slept, LOOM_SPIN_TRIAL_WAITS);
    ck_assert_double_eq_tol(s.view.sleep_wait_us, 30, 1e-6);
    /* ...then spinning, which costs a time slice a wait here: it stops. */
    int spun = 0;
    for (int i = 0; i < 20; i++)
        spun += one_wait(&s, t += 1e-4, 9, 3000, 30) > 0;
    ck_assert_int_eq(spun, 1);
    ck_assert_int_eq(one_wait(&s, t += 1e-4, 9, 3000, 30), 0);
    /* A second on, spinning is tried again, and wins once the crowd is gone
     * from our CPUs (a quiet figure ends the trials at once). */
    t += LOOM_SPIN_TRIAL_S;
    spun = 0;
    for (int i = 0; i < LOOM_SPIN_TRIAL_WAITS; i++)
        spun += one_wait(&s, t += 1e-4, 9, 4, 30) > 0;
    ck_assert_int_eq(spun, LOOM_SPIN_TRIAL_WAITS);
    ck_assert_double_lt(s.view.spin_wait_us, 30);
    ck_assert_int_gt(one_wait(&s, t += 1e-4, 9, 4, 30), 0);
    ck_assert_int_eq(one_wait(&s, t += 1e-4, 1, 4, 30), LOOM_SPIN_AUTO_MIN_US);
}
END_TEST

START_TEST(test_one_slow_wait)
{
    /* A preemption that stretches one wait a thousandfold does not make a
     * run of quick spinning waits look slow. */
    loom_spin_t s;
    loom_spin_init(&s, -1, 2);
    s.view.cpus = 2;
    double t = 5;
    for (int i = 0; i < 50; i++)
        one_wait(&s, t += 1e-4, 1, 5, 30);
    one_wait(&s, t += 1e-4, 1, 5000, 30);
    ck_assert_double_lt(s.view.spin_wait_us, 100);
    ck_assert_int_lt(loom_spin_decide(&s.view), LOOM_SPIN_AUTO_MAX_US);
}
END_TEST

START_TEST(test_fixed_never_measures)
{
    loom_spin_t s;
    loom_spin_init(&s, 0, 2);
    for (int i = 0; i < 20; i++)
        ck_assert_int_eq(one_wait(&s, 1 + i * 1e-3, 50, 1, 1000), 0);
    ck_assert_double_lt(s.view.sleep_wait_us, 0);
    loom_spin_init(&s, 30, 8);
    ck_assert_int_eq(loom_spin_begin(&s, 1), 30);
}
END_TEST

static const char *one_var(const char *name, void *arg)
{
    const char *const *kv = arg;
    return strcmp(name, kv[0]) == 0 ? kv[1] : NULL;
}

START_TEST(test_setting)
{
    int us = 7;
    ck_assert_int_eq(loom_spin_parse("auto", &us), 0);
    ck_assert_int_eq(us, -1);
    ck_assert_int_eq(loom_spin_parse("AUTO", &us), 0);
    ck_assert_int_eq(loom_spin_parse("0", &us), 0);
    ck_assert_int_eq(us, 0);
    ck_assert_int_eq(loom_spin_parse("150", &us), 0);
    ck_assert_int_eq(us, 150);
    ck_assert_int_ne(loom_spin_parse("-5", &us), 0);
    ck_assert_int_ne(loom_spin_parse("fast", &us), 0);

    loom_settings_t s;
    loom_err_t err = {0};
    const char *unset[2] = {"LOOM_NOTHING", NULL};
    ck_assert_int_eq(loom_settings_load(&s, one_var, (void *)unset, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.spin_us, -1);   /* auto by default */
    const char *fixed[2] = {"LOOM_SPIN_US", "40"};
    ck_assert_int_eq(loom_settings_load(&s, one_var, (void *)fixed, &err), LOOM_SUCCESS);
    ck_assert_int_eq(s.spin_us, 40);
    const char *bad[2] = {"LOOM_SPIN_US", "sometimes"};
    ck_assert_int_eq(loom_settings_load(&s, one_var, (void *)bad, &err), LOOM_ERR_INVALID_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "LOOM_SPIN_US"));
}
END_TEST

Suite *loom_spin_suite(void)
{
    Suite *s = suite_create("spin");
    TCase *tc = tcase_create("policy");
    tcase_add_test(tc, test_decide_fixed);
    tcase_add_test(tc, test_decide_oversubscribed_by_ranks);
    tcase_add_test(tc, test_decide_length);
    tcase_add_test(tc, test_decide_crowded);
    tcase_add_test(tc, test_learns_to_sleep_and_back);
    tcase_add_test(tc, test_one_slow_wait);
    tcase_add_test(tc, test_fixed_never_measures);
    tcase_add_test(tc, test_setting);
    suite_add_tcase(s, tc);
    return s;
}
