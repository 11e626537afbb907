/* One runner for every unit-test suite; CK_RUN_SUITE / CK_FORK work as usual. */
#include <stdlib.h>
#include "check_suites.h"

int main(void)
{
    SRunner *sr = srunner_create(loom_reduce_suite());
    srunner_add_suite(sr, loom_store_suite());
    srunner_add_suite(sr, loom_store_cb_suite());
    srunner_add_suite(sr, loom_store_redis_suite());
    srunner_add_suite(sr, loom_env_suite());
    srunner_add_suite(sr, loom_wire_suite());
    srunner_add_suite(sr, loom_algorithms_suite());
    srunner_add_suite(sr, loom_ibverbs_suite());
    srunner_add_suite(sr, loom_elastic_suite());
    srunner_add_suite(sr, loom_spin_suite());
#ifdef LOOM_HAVE_CUDA
    srunner_add_suite(sr, loom_cuda_suite());
#endif
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
