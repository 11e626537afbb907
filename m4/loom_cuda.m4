dnl loom_cuda.m4 - LOOM_CHECK_CUDA: the CUDA part (cuda/: reduction kernels and
dnl GPU staging), built when a toolkit is found (--with-cuda[=DIR], default
dnl /usr/local/cuda). Sets have_cuda, NVCC, CUDA_CPPFLAGS, CUDA_LIBS,
dnl CUDA_LDFLAGS, the HAVE_CUDA conditional and LOOM_HAVE_CUDA, and picks the
dnl accelerator table of the build (LOOM_ACCEL_TABLE, src/accel.h).
AC_DEFUN([LOOM_CHECK_CUDA], [
AC_ARG_WITH([cuda],
  [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [CUDA toolkit (default: /usr/local/cuda when present)])],
  [], [with_cuda=check])
have_cuda=no
AS_IF([test "x$with_cuda" != xno],
  [cuda_dir="$with_cuda"
   AS_IF([test "x$cuda_dir" = xyes || test "x$cuda_dir" = xcheck], [cuda_dir=/usr/local/cuda])
   AS_IF([test -x "$cuda_dir/bin/nvcc" && test -f "$cuda_dir/include/cuda_runtime_api.h"],
     [have_cuda=yes; CUDA_DIR="$cuda_dir"],
     [AS_IF([test "x$with_cuda" != xcheck], [AC_MSG_ERROR([CUDA not found in $cuda_dir])])])])
AC_ARG_VAR([CUDA_ARCH_FLAGS], [nvcc targets of the reduction kernels (default: sm_90 code plus compute_90 PTX)])
AS_IF([test "x$have_cuda" = xyes],
  [NVCC="$CUDA_DIR/bin/nvcc"
   AS_IF([test "x$CUDA_ARCH_FLAGS" = x], [CUDA_ARCH_FLAGS="-gencode arch=compute_90,code=@<:@sm_90,compute_90@:>@"])
   cuda_libdir=
   for d in "$CUDA_DIR/lib64" "$CUDA_DIR/lib" "$CUDA_DIR/targets/x86_64-linux/lib" "$CUDA_DIR/targets/sbsa-linux/lib"; do
     AS_IF([test -z "$cuda_libdir" && test -f "$d/libcudart_static.a"], [cuda_libdir="$d"])
   done
   AS_IF([test -z "$cuda_libdir"],
     [AS_IF([test "x$with_cuda" = xcheck], [have_cuda=no], [AC_MSG_ERROR([libcudart_static.a not found under $CUDA_DIR])])])])
dnl cudart is linked statically and hidden (as NCCL does): libloom then needs neither
dnl libcudart.so nor libcuda.so to load, and cudart loads the driver only when a GPU
dnl call is made. -lrt -ldl are what libcudart_static.a itself calls.
AS_IF([test "x$have_cuda" = xyes],
  [CUDA_CPPFLAGS="-I$CUDA_DIR/include"
   CUDA_LIBS="-L$cuda_libdir -lcudart_static -lrt -ldl"
   CUDA_LDFLAGS="-Wl,--exclude-libs,libcudart_static.a"
   LOOM_PC_LIBS_PRIVATE="$LOOM_PC_LIBS_PRIVATE $CUDA_LIBS"
   AC_DEFINE([LOOM_HAVE_CUDA], [1], [GPU buffers: CUDA kernels and staging are built])])
AC_SUBST([CUDA_DIR])
AC_SUBST([NVCC])
AC_SUBST([CUDA_CPPFLAGS])
AC_SUBST([CUDA_LIBS])
AC_SUBST([CUDA_LDFLAGS])
AM_CONDITIONAL([HAVE_CUDA], [test "x$have_cuda" = xyes])
dnl The accelerator table the core calls through (src/accel.h): one per backend,
dnl the host-only one when none is built.
AS_IF([test "x$have_cuda" = xyes], [accel_table=loom_accel_cuda], [accel_table=loom_accel_null])
AC_DEFINE_UNQUOTED([LOOM_ACCEL_TABLE], [$accel_table], [the accelerator ops table of this build (src/accel.h)])
])
