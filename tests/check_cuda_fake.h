/* check_cuda_fake.h - host memory standing in for GPU memory (check_cuda*.c). */
#ifndef LOOM_CHECK_CUDA_FAKE_H
#define LOOM_CHECK_CUDA_FAKE_H

#include <stdatomic.h>
#include <stddef.h>
#include "cuda/cuda_int.h"

/* Register / forget [p, p + len) as device memory; scratch: the reduction
 * scratch, whose reduction operands must sit at multiples of 16 bytes. */
void region_add(void *p, size_t len);
void region_add_as(void *p, size_t len, int scratch);
void region_remove(const void *p);
int is_dev(const void *p);
/* For loom_cuda_test_backend. */
int fake_on_device(const void *p, int *device);
void *fake_scratch_alloc(size_t bytes);
void fake_scratch_free(void *p);
extern const loom_dev_ops_t fake_ops;
extern _Atomic long fake_copies;   /* copies made, so a test can see staging happen */

#endif
