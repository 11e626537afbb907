/* check_cuda_fake.c - the device double of the host-side GPU tests: "device
 * memory" is whatever a test registered, and the double's copies and reductions
 * refuse to work where a GPU could not (a copy between two host buffers, a
 * reduction in host memory, a scratch block off 16 bytes). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check_cuda_fake.h"
#include "base/reduce.h"

#define MAX_REGIONS 64
static pthread_mutex_t regions_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { const char *start; size_t len; int device, scratch; } regions[MAX_REGIONS];

void region_add_as(void *p, size_t len, int scratch)
{
    pthread_mutex_lock(&regions_lock);
    for (int i = 0; i < MAX_REGIONS; i++)
        if (!regions[i].start) {
            regions[i].start = p;
            regions[i].len = len;
            regions[i].device = 0;
            regions[i].scratch = scratch;
            break;
        }
    pthread_mutex_unlock(&regions_lock);
}

void region_add(void *p, size_t len)
{
    region_add_as(p, len, 0);
}

/* Where in the reduction scratch p is: -1 outside it. */
static long scratch_offset(const void *p)
{
    long off = -1;
    pthread_mutex_lock(&regions_lock);
    for (int i = 0; i < MAX_REGIONS; i++)
        if (regions[i].start && regions[i].scratch && (const char *)p >= regions[i].start &&
            (const char *)p < regions[i].start + regions[i].len)
            off = (long)((const char *)p - regions[i].start);
    pthread_mutex_unlock(&regions_lock);
    return off;
}

void region_remove(const void *p)
{
    pthread_mutex_lock(&regions_lock);
    for (int i = 0; i < MAX_REGIONS; i++)
        if (regions[i].start == p)
            regions[i].start = NULL;
    pthread_mutex_unlock(&regions_lock);
}

int fake_on_device(const void *p, int *device)
{
    int found = 0;
    pthread_mutex_lock(&regions_lock);
    for (int i = 0; i < MAX_REGIONS && !found; i++)
        if (regions[i].start && (const char *)p >= regions[i].start &&
            (const char *)p < regions[i].start + regions[i].len) {
            found = 1;
            *device = regions[i].device;
        }
    pthread_mutex_unlock(&regions_lock);
    return found;
}

int is_dev(const void *p)
{
    int d;
    return fake_on_device(p, &d);
}

_Atomic long fake_copies;

static loom_status_t fake_copy2d(void *arg, void *dst, size_t dpitch, const void *src,
                                 size_t spitch, size_t width, size_t height, loom_err_t *err)
{
    if (is_dev(dst) == is_dev(src))
        return loom_err_set(err, LOOM_ERR_INTERNAL, "fake device: a copy %s to %s",
                            is_dev(src) ? "device" : "host", is_dev(dst) ? "device" : "host");
    for (size_t r = 0; r < height; r++)
        memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    fake_copies++;
    return LOOM_SUCCESS;
}

static loom_status_t fake_reduce3(void *arg, void *out, const void *a, const void *b, size_t count,
                                  loom_dtype_t dt, loom_op_t op, loom_err_t *err)
{
    if (!is_dev(out) || !is_dev(a) || !is_dev(b))
        return loom_err_set(err, LOOM_ERR_INTERNAL, "fake device: a reduction in host memory");
    /* Blocks in the scratch start on 16 bytes, so the real kernels can vectorise. */
    const void *ptrs[3] = {out, a, b};
    for (int i = 0; i < 3; i++)
        if (scratch_offset(ptrs[i]) % 16 != 0 && scratch_offset(ptrs[i]) != -1)
            return loom_err_set(err, LOOM_ERR_INTERNAL,
                                "fake device: a reduction operand %ld bytes into the scratch",
                                scratch_offset(ptrs[i]));
    loom_reduce_local3(out, a, b, count, dt, op);
    return LOOM_SUCCESS;
}

static loom_status_t fake_avg(void *arg, void *buf, size_t count, loom_dtype_t dt, int nranks,
                              loom_err_t *err)
{
    if (!is_dev(buf))
        return loom_err_set(err, LOOM_ERR_INTERNAL, "fake device: an average in host memory");
    loom_reduce_avg_finalize(buf, count, dt, nranks);
    return LOOM_SUCCESS;
}

static loom_status_t fake_sync(void *arg, loom_err_t *err)
{
    return LOOM_SUCCESS;
}

void *fake_scratch_alloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (p)
        region_add_as(p, bytes, 1);
    return p;
}

void fake_scratch_free(void *p)
{
    region_remove(p);
    free(p);
}

const loom_dev_ops_t fake_ops = {sizeof(loom_dev_ops_t), fake_copy2d, fake_reduce3,
                                        fake_avg, fake_sync};

