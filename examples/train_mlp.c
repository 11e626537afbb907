/*
 * train_mlp.c - data-parallel training with Loom, in plain C.
 *
 * A small MLP (8 inputs, 16 tanh hidden units, 1 output) learns a fixed
 * nonlinear function from noisy samples. It is synchronous data-parallel SGD,
 * the scheme of PyTorch DDP and Horovod:
 *
 *   1. rank 0 initialises the weights and broadcasts them, so all ranks start
 *      from the same model;
 *   2. each rank owns a shard of the data and computes gradients on its own
 *      mini-batches (hand-written backprop);
 *   3. one loom_allreduce(LOOM_AVG) per step averages the gradients, so every
 *      rank applies the same update and the models never drift apart.
 *
 *   loomrun -np 4 ./train_mlp
 *
 * Rank 0 prints the loss over the whole data set after each epoch; at the end
 * every rank checks that all ranks hold bit-identical weights.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <loom.h>

#define N_IN      8
#define N_HID     16
#define N_SAMPLES 8192        /* the whole data set, split evenly across ranks */
#define BATCH     16          /* samples per rank per step */
#define EPOCHS    20
#define LR        0.02f
#define MOMENTUM  0.9f
#define SEED      0x6c6f6f6dULL

/* All parameters live in one flat array, so one broadcast and one allreduce
 * per step move all of them: fewer, larger messages are what collectives do
 * best. */
#define OFF_W1   0                        /* [N_HID][N_IN] */
#define OFF_B1   (OFF_W1 + N_HID * N_IN)  /* [N_HID] */
#define OFF_W2   (OFF_B1 + N_HID)         /* [N_HID] */
#define OFF_B2   (OFF_W2 + N_HID)         /* [1] */
#define N_PARAMS (OFF_B2 + 1)

/* splitmix64: small, fast, and the same on every platform. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float uniform(uint64_t *state)
{
    return (float)((double)(next_random(state) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* Sample i depends only on (SEED, i): each rank generates just its shard, and
 * the data set is the same whatever the number of ranks. */
static void make_sample(uint64_t i, float x[N_IN], float *y)
{
    static const float v[N_IN] = { 0.8f, -0.5f, 0.3f, 0.9f, -0.7f, 0.2f, -0.4f, 0.6f };
    uint64_t state = (SEED << 32) ^ i;
    float dot = 0.0f;
    for (int k = 0; k < N_IN; k++) {
        x[k] = uniform(&state);
        dot += v[k] * x[k];
    }
    *y = tanhf(dot) + 0.5f * x[0] * x[1] + 0.05f * uniform(&state);
}

static float predict(const float *p, const float x[N_IN], float h[N_HID])
{
    float out = p[OFF_B2];
    for (int j = 0; j < N_HID; j++) {
        float z = p[OFF_B1 + j];
        for (int k = 0; k < N_IN; k++)
            z += p[OFF_W1 + j * N_IN + k] * x[k];
        h[j] = tanhf(z);
        out += p[OFF_W2 + j] * h[j];
    }
    return out;
}

/* Gradient of the mean squared error over n samples, by backprop. */
static void gradient(const float *p, const float *xs, const float *ys, int n, float *grad)
{
    memset(grad, 0, N_PARAMS * sizeof(float));
    for (int s = 0; s < n; s++) {
        const float *x = xs + (size_t)s * N_IN;
        float h[N_HID];
        float dout = 2.0f * (predict(p, x, h) - ys[s]) / (float)n;
        grad[OFF_B2] += dout;
        for (int j = 0; j < N_HID; j++) {
            grad[OFF_W2 + j] += dout * h[j];
            float dz = dout * p[OFF_W2 + j] * (1.0f - h[j] * h[j]);   /* tanh' = 1 - tanh^2 */
            grad[OFF_B1 + j] += dz;
            for (int k = 0; k < N_IN; k++)
                grad[OFF_W1 + j * N_IN + k] += dz * x[k];
        }
    }
}

static int check(loom_status_t st, const char *what, loom_comm_t comm)
{
    if (st == LOOM_SUCCESS)
        return 0;
    fprintf(stderr, "rank %d: %s failed: %s: %s\n", comm ? loom_comm_rank(comm) : -1, what,
            loom_strerror(st), loom_comm_last_error(comm));
    return -1;
}

/* Mean squared error over the whole data set: every rank sums over its shard,
 * one allreduce adds the shards up. Every rank gets the result. */
static int global_loss(const float *p, const float *xs, const float *ys, int n, loom_comm_t comm,
                       double *loss)
{
    double acc[2] = { 0.0, (double)n };   /* sum of squared errors, sample count */
    for (int s = 0; s < n; s++) {
        float h[N_HID];
        double d = predict(p, xs + (size_t)s * N_IN, h) - ys[s];
        acc[0] += d * d;
    }
    if (check(loom_allreduce(acc, acc, 2, LOOM_FLOAT64, LOOM_SUM, comm), "loss allreduce", comm))
        return -1;
    *loss = acc[0] / acc[1];
    return 0;
}

/* FNV-1a over the bytes: equal on all ranks only if the weights are
 * bit-identical, which is what synchronous SGD promises. */
static uint64_t checksum(const float *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t hash = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n * sizeof(float); i++)
        hash = (hash ^ b[i]) * 0x100000001b3ULL;
    return hash;
}

int main(void)
{
    loom_comm_t comm;
    loom_status_t st = loom_init(&comm);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "loom_init failed: %s: %s\n", loom_strerror(st),
                loom_comm_last_error(NULL));
        return 1;
    }
    int rank = loom_comm_rank(comm);
    int size = loom_comm_size(comm);
    int rc = 1;
    float *xs = NULL, *ys = NULL;

    /* Equal shards: every rank must take the same number of steps, since each
     * step is a collective that all ranks join. */
    int shard = N_SAMPLES / size;
    int steps = shard / BATCH;
    if (steps == 0) {
        if (rank == 0)
            fprintf(stderr, "train_mlp: %d ranks are too many for %d samples\n", size,
                    N_SAMPLES);
        goto out;
    }
    xs = malloc((size_t)shard * N_IN * sizeof(float));
    ys = malloc((size_t)shard * sizeof(float));
    if (xs == NULL || ys == NULL) {
        fprintf(stderr, "rank %d: out of memory\n", rank);
        goto out;
    }
    for (int s = 0; s < shard; s++)
        make_sample((uint64_t)rank * (uint64_t)shard + (uint64_t)s, xs + (size_t)s * N_IN,
                    ys + s);

    /* Each rank draws its own random weights (seeded by rank, so they differ);
     * the broadcast replaces them with rank 0's. Without it the ranks would
     * train different models. */
    float params[N_PARAMS], grad[N_PARAMS], velocity[N_PARAMS] = { 0 };
    uint64_t state = SEED + (uint64_t)rank;
    for (int i = 0; i < N_PARAMS; i++) {
        /* Glorot-uniform weights, zero biases. */
        float scale = i < OFF_B1 ? sqrtf(6.0f / (N_IN + N_HID))
                    : i >= OFF_W2 && i < OFF_B2 ? sqrtf(6.0f / (N_HID + 1)) : 0.0f;
        params[i] = scale * uniform(&state);
    }
    if (check(loom_broadcast(params, N_PARAMS, LOOM_FLOAT32, 0, comm), "broadcast", comm))
        goto out;

    double first_loss, loss;
    if (global_loss(params, xs, ys, shard, comm, &first_loss))
        goto out;
    if (rank == 0)
        printf("%d ranks, %d samples each, %d steps per epoch\nepoch  0  loss %.6f\n", size,
               shard, steps, first_loss);

    for (int epoch = 1; epoch <= EPOCHS; epoch++) {
        for (int step = 0; step < steps; step++) {
            int first = step * BATCH;
            gradient(params, xs + (size_t)first * N_IN, ys + first, BATCH, grad);
            /* The one line that makes it data-parallel. */
            if (check(loom_allreduce(grad, grad, N_PARAMS, LOOM_FLOAT32, LOOM_AVG, comm),
                      "gradient allreduce", comm))
                goto out;
            for (int i = 0; i < N_PARAMS; i++) {
                velocity[i] = MOMENTUM * velocity[i] - LR * grad[i];
                params[i] += velocity[i];
            }
        }
        if (global_loss(params, xs, ys, shard, comm, &loss))
            goto out;
        if (rank == 0)
            printf("epoch %2d  loss %.6f\n", epoch, loss);
    }

    uint64_t sum = checksum(params, N_PARAMS), lo, hi;
    if (check(loom_allreduce(&sum, &lo, 1, LOOM_UINT64, LOOM_MIN, comm), "checksum MIN", comm) ||
        check(loom_allreduce(&sum, &hi, 1, LOOM_UINT64, LOOM_MAX, comm), "checksum MAX", comm))
        goto out;
    if (lo != hi) {
        fprintf(stderr, "rank %d: weights differ between ranks\n", rank);
        goto out;
    }
    if (rank == 0)
        printf("weights identical on all ranks (checksum %016llx)\n", (unsigned long long)sum);
    /* Every rank holds the same loss values, so all reach the same verdict. */
    if (!(loss < 0.5 * first_loss)) {
        if (rank == 0)
            fprintf(stderr, "train_mlp: the loss did not fall enough (%.6f -> %.6f)\n",
                    first_loss, loss);
        goto out;
    }
    rc = 0;

out:
    free(xs);
    free(ys);
    st = loom_comm_destroy(comm);
    if (st != LOOM_SUCCESS) {
        fprintf(stderr, "rank %d: loom_comm_destroy failed: %s\n", rank, loom_strerror(st));
        rc = 1;
    }
    return rc;
}
