/* Every Check suite of the unit-test runner (tests/check_main.c). */
#ifndef LOOM_CHECK_SUITES_H
#define LOOM_CHECK_SUITES_H
#include <check.h>

Suite *loom_reduce_suite(void);
Suite *loom_store_suite(void);
Suite *loom_store_cb_suite(void);
Suite *loom_store_redis_suite(void);
Suite *loom_env_suite(void);
Suite *loom_wire_suite(void);
Suite *loom_algorithms_suite(void);
Suite *loom_ibverbs_suite(void);
Suite *loom_elastic_suite(void);
Suite *loom_spin_suite(void);
#ifdef LOOM_HAVE_CUDA
Suite *loom_cuda_suite(void);
#endif

#endif
