/* loom_bench.c - bench/peers/mpi_bench.c (the anchors' MPI harness) with
 * MPI_Allreduce replaced by loom_allreduce and nothing else changed: the same
 * sizes, warm-up, iteration count, timing (max over ranks of the mean time
 * per call) and checking, so bench/compare.sh compares like with like.
 * Build: cc -O2 loom_bench.c $(pkg-config --cflags --libs loom)
 * Usage: loomrun -np N ./loom_bench [-b MIN] [-e MAX] [-f FACTOR] [-t TARGET_SEC] [-m MIN_ITERS] [-s sizes] */
#include <loom.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECKED(call)                                                                  \
  do {                                                                                 \
    if ((call) != LOOM_SUCCESS) {                                                      \
      fprintf(stderr, "rank %d: %s: %s\n", rank, #call, loom_comm_last_error(comm));    \
      return 2;                                                                        \
    }                                                                                  \
  } while (0)

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float pat(int rank, size_t i) { return (float)((rank + 1) + (int)(i % 7)); }

static size_t check(float *r, size_t count, int n) {
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) {
    float exp = (float)(n * (n + 1) / 2 + n * (int)(i % 7));
    if (r[i] != exp) bad++;
  }
  return bad;
}

int main(int argc, char **argv) {
  loom_comm_t comm;
  if (loom_init(&comm) != LOOM_SUCCESS) { fprintf(stderr, "loom_init: %s\n", loom_comm_last_error(NULL)); return 2; }
  int rank = loom_comm_rank(comm), n = loom_comm_size(comm);
  size_t minb = 8, maxb = 256u << 20;
  int factor = 4, min_iters = 5;
  double target = 0.5;
  const char *label = "";
  size_t list[64];
  int nlist = 0;
  int opt;
  while ((opt = getopt(argc, argv, "b:e:f:t:m:l:s:")) != -1) {
    switch (opt) {
      case 'b': minb = strtoull(optarg, 0, 0); break;
      case 'e': maxb = strtoull(optarg, 0, 0); break;
      case 'f': factor = atoi(optarg); break;
      case 't': target = atof(optarg); break;
      case 'm': min_iters = atoi(optarg); break;
      case 'l': label = optarg; break;
      case 's': {
        char *tok = strtok(optarg, ",");
        while (tok && nlist < 64) { list[nlist++] = strtoull(tok, 0, 0); tok = strtok(0, ","); }
        break;
      }
      default: if (!rank) fprintf(stderr, "bad args\n"); return 2;
    }
  }
  if (nlist == 0)
    for (size_t b = minb; b <= maxb && nlist < 64; b *= factor) list[nlist++] = b;
  maxb = 0;
  for (int k = 0; k < nlist; k++) if (list[k] > maxb) maxb = list[k];
  size_t maxcount = maxb / sizeof(float);
  if (maxcount < 1) maxcount = 1;
  float *s = aligned_alloc(4096, ((maxcount * 4 + 4095) / 4096) * 4096);
  float *r = aligned_alloc(4096, ((maxcount * 4 + 4095) / 4096) * 4096);
  const char *ver = loom_version();
  if (rank == 0) {
    printf("# loom_bench loom_allreduce float32 sum nranks=%d %s lib=\"%s\"\n", n, label, ver);
    printf("# %12s %12s %12s %10s %10s %8s %6s\n", "size(B)", "count", "time(us)", "algbw(GB/s)",
           "busbw(GB/s)", "iters", "check");
    fflush(stdout);
  }
  int failures = 0;
  for (int k = 0; k < nlist; k++) {
    size_t bytes = list[k];
    size_t count = bytes / sizeof(float);
    if (count < 1) count = 1;
    for (size_t i = 0; i < count; i++) s[i] = pat(rank, i);
    memset(r, 0, count * 4);
    CHECKED(loom_allreduce(s, r, count, LOOM_FLOAT32, LOOM_SUM, comm));
    size_t bad = check(r, count, n);

    double t0 = now_s();
    CHECKED(loom_allreduce(s, r, count, LOOM_FLOAT32, LOOM_SUM, comm));
    double t1 = now_s() - t0;
    CHECKED(loom_broadcast(&t1, 1, LOOM_FLOAT64, 0, comm));
    double wd = 0.05 / (t1 > 1e-7 ? t1 : 1e-7);
    int w = wd < 1 ? 1 : wd > 200 ? 200 : (int)wd;
    CHECKED(loom_barrier(comm));
    t0 = now_s();
    for (int i = 0; i < w; i++) CHECKED(loom_allreduce(s, r, count, LOOM_FLOAT32, LOOM_SUM, comm));
    double per = (now_s() - t0) / w;
    CHECKED(loom_broadcast(&per, 1, LOOM_FLOAT64, 0, comm));
    double itd = target / (per > 1e-7 ? per : 1e-7);
    int iters = itd < min_iters ? min_iters : itd > 1e6 ? 1000000 : (int)itd;

    CHECKED(loom_barrier(comm));
    t0 = now_s();
    for (int i = 0; i < iters; i++) CHECKED(loom_allreduce(s, r, count, LOOM_FLOAT32, LOOM_SUM, comm));
    double el = (now_s() - t0) / iters, t;
    CHECKED(loom_allreduce(&el, &t, 1, LOOM_FLOAT64, LOOM_MAX, comm));

    memset(r, 0, count * 4);
    CHECKED(loom_allreduce(s, r, count, LOOM_FLOAT32, LOOM_SUM, comm));
    bad += check(r, count, n);
    uint64_t lb = bad, allbad;
    CHECKED(loom_allreduce(&lb, &allbad, 1, LOOM_UINT64, LOOM_SUM, comm));
    if (allbad) failures++;
    double algbw = count * 4.0 / t / 1e9;
    if (rank == 0) {
      printf("  %12zu %12zu %12.2f %10.3f %10.3f %8d %6s\n", count * 4, count, t * 1e6, algbw,
             algbw * 2.0 * (n - 1) / n, iters, allbad ? "FAIL" : "OK");
      fflush(stdout);
    }
  }
  free(s);
  free(r);
  loom_comm_destroy(comm);
  return failures ? 1 : 0;
}
