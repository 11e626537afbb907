/* gpu_common.h - what the GPU tests share: whether a GPU is there, asked in a
 * child process so the parent can still fork ranks that each start CUDA afresh
 * (a CUDA context does not survive fork). */
#ifndef LOOM_GPU_COMMON_H
#define LOOM_GPU_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cuda_runtime_api.h>

/* 0 when a GPU is usable; otherwise prints "SKIP: <why>" and returns 77 (automake's skip). */
static inline int gpu_skip_unless_available(const char *test)
{
    int fds[2];
    if (pipe(fds) != 0)
        return 99;
    pid_t pid = fork();
    if (pid < 0)
        return 99;
    if (pid == 0) {
        close(fds[0]);
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        char why[200];
        int len = snprintf(why, sizeof(why), "%s", e != cudaSuccess ? cudaGetErrorString(e)
                                                   : n == 0          ? "no CUDA device"
                                                                     : "");
        if (write(fds[1], why, (size_t)len) < 0)
            _exit(2);
        _exit(e == cudaSuccess && n > 0 ? 0 : 1);
    }
    close(fds[1]);
    char why[201] = "";
    ssize_t got = read(fds[0], why, sizeof(why) - 1);
    why[got > 0 ? got : 0] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    printf("SKIP: %s: no usable GPU (%s)\n", test, why[0] ? why : "the probe failed");
    return 77;
}

#define GPU_CHECK(call)                                                                 \
    do {                                                                                \
        cudaError_t e_ = (call);                                                        \
        if (e_ != cudaSuccess) {                                                        \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                    cudaGetErrorString(e_));                                            \
            exit(2);                                                                    \
        }                                                                               \
    } while (0)

#endif
