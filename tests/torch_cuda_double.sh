#!/bin/sh
# torch_cuda_double.sh - the torch.distributed backend "loom" on CUDA tensors
# without a GPU: PyPI's torch (/opt/loom-torch, which tests/install-deps.sh
# installs) runs over the CUDA double built as libcudart.so.13
# (tests/cuda-double/torch_face.c), loaded with LD_PRELOAD so that torch's
# libraries take it for the CUDA runtime, with a libcuda.so.1 link to the same
# file on the library path for the driver calls (torch's NVRTC stub, Loom's
# pointer classification). The extension is built with CUDA (LOOM_TORCH_CUDA=1)
# against Loom's CUDA backend over that double (libloom_on_cudart), and
# tests/python/test_c10d_cuda.py runs on 2 ranks under torchrun three times:
# on the double's one device (GPU to GPU through its IPC handles), on a device
# each with the double lazy, and staged through host memory; so does
# tests/python/test_torch_cuda.py under loomrun, loom.torch (Horovod's API) on
# CUDA tensors, whose loom._loom is built against the same libloom. The double runs none of torch's
# kernels (a launch fails with cudaErrorNotSupported): the test takes that into
# account (LOOM_TEST_NO_TORCH_KERNELS=1, which it reads). Skips (77) only
# without the torch venv (tests/install-deps.sh installs it) or without shared
# libraries.
name=torch_cuda_double
builddir=$(cd "${top_builddir:-.}" && pwd)
dbl="$builddir/tests/cuda-double/cudart/.libs"
if [ ! -e "$dbl/libcudart.so.13" ] || [ ! -e "$dbl/libloom_on_cudart.so" ]; then
    if [ ! -e "$builddir/.libs/libloom.so" ]; then
        echo "$name: SKIP: no shared libraries (configured with --disable-shared)"
        exit 77
    fi
    echo "$name: FAIL: the double's libcudart.so.13 and libloom_on_cudart are not built (make check builds them)"
    exit 1
fi
# The libloom the extension links, under the name setup.py looks for, in a
# directory of its own (the extension's rpath); the driver's name for the
# double in another.
loom_libdir="$builddir/python/loom-on-cudart"
mkdir -p "$loom_libdir/driver" &&
    ln -sf "$dbl/libloom_on_cudart.so" "$loom_libdir/libloom.so" &&
    ln -sf "$dbl/libloom_on_cudart.so.0" "$loom_libdir/libloom_on_cudart.so.0" &&
    ln -sf "$dbl/libcudart.so.13" "$loom_libdir/driver/libcuda.so.1" || exit 1
# From here on every process has the double for its CUDA runtime: the build
# too, as setup.py loads the libloom it links (which needs the double's own
# calls) beside torch.
export LD_PRELOAD="$dbl/libcudart.so.13"
export LD_LIBRARY_PATH="$loom_libdir/driver${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
torch_build_tag=-cuda-double
export LOOM_TORCH_CUDA=1
. "$(dirname "$0")/torch_build.sh"

export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1 LOOM_TEST_NO_TORCH_KERNELS=1
export LOOM_DEBUG=INFO LOOM_DEBUG_SUBSYS=cuda
unset SLURM_JOB_ID LOOM_STORE

failures=0
# The premise, in one process: torch's device is the double, copies work, and
# a kernel of torch's fails (the double runs none, and says so).
if "$py" - > "$tmp/out" 2>&1 <<'EOF'
import torch
assert torch.cuda.is_available() and torch.cuda.get_device_name(0) == "Loom CUDA double", \
    "torch's device is not the double: %s" % torch.cuda.get_device_name(0)
x = torch.arange(8, dtype=torch.float32).cuda()
assert x.cpu().tolist() == list(range(8)), x.cpu()
try:
    (x + 1).cpu()
    raise AssertionError("a kernel of torch's ran over the double")
except RuntimeError as e:
    assert "operation not supported" in str(e), e
EOF
then
    echo "ok: torch over the double: copies work, its kernels fail"
else
    cat "$tmp/out"
    echo "FAIL: torch over the double"
    failures=$((failures + 1))
fi
# report WHAT RC: ok with the test's output (less Loom's log), or the whole
# output and a failure.
report() {
    if [ "$2" = 0 ]; then
        echo "ok: $1"
        grep -v "LOOM INFO" "$tmp/out" | sed 's/^/    /'
    else
        cat "$tmp/out"
        echo "FAIL: $1 (exit $2)"
        failures=$((failures + 1))
    fi
}
# run TEST WHAT PATH [VAR=VALUE...]: tests/python/TEST on 2 ranks with the
# double and Loom so configured (torch.distributed's test under torchrun,
# loom.torch's under loomrun); allreduce on GPU buffers must log PATH.
run() {
    test=$1
    what="$test: $2"
    path=$3
    shift 3
    case $test in
    test_c10d_*) launch="$venv/bin/torchrun --standalone --nproc-per-node 2" ;;
    *) launch="$LOOMRUN -np 2 $py" ;;
    esac
    env "$@" timeout 600 $launch "$srcdir/tests/python/$test" > "$tmp/out" 2>&1
    rc=$?
    # Over the double nothing may skip (torch must see its device), and the
    # collectives must have taken the path asked for.
    if [ $rc = 0 ] && grep -q "SKIP" "$tmp/out"; then
        echo "$name: $what: the test skipped"
        rc=1
    fi
    if [ $rc = 0 ] && ! grep -q "allreduce on GPU buffers: $path" "$tmp/out"; then
        echo "$name: $what: allreduce did not log its path ($path)"
        rc=1
    fi
    report "$what" $rc
}
# Both ranks on the double's one device; then a device each, in lazy mode
# (device work runs only when the host waits: a missing stream dependency
# shows as a stale result); then staged, lazy too.
ipc="GPU to GPU through CUDA IPC"
for test in test_c10d_cuda.py test_torch_cuda.py; do
    run $test "2 ranks, one device" "$ipc" LOOM_CUDA_DOUBLE_DEVICES=1
    run $test "2 ranks, a device each, lazy double" "$ipc" LOOM_CUDA_DOUBLE_DEVICES=2 LOOM_CUDA_DOUBLE_LAZY=1
    run $test "2 ranks, one device, staged, lazy double" "staged through host memory" \
        LOOM_CUDA_DOUBLE_DEVICES=1 LOOM_CUDA_DOUBLE_LAZY=1 LOOM_CUDA_IPC=0
done
# torch.distributed's "loom" with its extension built without CUDA
# (LOOM_TORCH_CUDA=0): registered for cuda all the same, it refuses a CUDA
# tensor with an error that says so, not torch's "No backend type associated
# with device type cuda".
if (export LOOM_TORCH_CUDA=0; torch_build_into "$torch_build_tag-nocuda"); then
    PYTHONPATH="$builddir/python/lib-torch$torch_build_tag-nocuda:$srcdir/tests/python" \
        timeout 300 "$venv/bin/torchrun" --standalone --nproc-per-node 2 \
        "$srcdir/tests/python/test_c10d_nocuda.py" > "$tmp/out" 2>&1
    rc=$?
else
    rc=$?
    cp "$tmp/build.log" "$tmp/out"
fi
report "test_c10d_nocuda.py: torch.distributed's loom built without CUDA refuses CUDA tensors" $rc
# loom.torch over a libloom without CUDA: every collective refuses CUDA tensors
# with an error that says why (tests/python/test_torch_cuda.py's other half).
# The tree's own libloom where configure left CUDA out, else the one in
# $LOOM_NOCUDA_LIBDIR (the .libs of a build configured --without-cuda); only
# loom._loom is rebuilt against it, beside a copy of the package.
nocuda=${LOOM_NOCUDA_LIBDIR:-$builddir/.libs}
if [ ! -e "$nocuda/libloom.so" ] || nm -D "$nocuda/libloom.so" | grep -q " T loom_comm_set_device$"; then
    echo "$name: loom.torch over a libloom without CUDA: not run (the libloom in $nocuda has CUDA;" \
        "LOOM_NOCUDA_LIBDIR names the .libs of a build configured --without-cuda)"
else
    mkdir "$tmp/nocuda" && cp -r "$lib/loom" "$tmp/nocuda/" &&
        rm -f "$tmp/nocuda/loom/_loom".*.so "$tmp/nocuda/loom/torch/_c10d".*.so &&
        "${CC:-cc}" -shared -fPIC -std=c11 -O2 \
            -I"$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
            -I"$srcdir/include" "$srcdir/python/loom/_loom.c" -L"$nocuda" -lloom -Wl,-rpath,"$nocuda" \
            -o "$tmp/nocuda/loom/_loom$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')" \
            > "$tmp/out" 2>&1 &&
        PYTHONPATH="$tmp/nocuda:$srcdir/tests/python" LOOM_CUDA_DOUBLE_DEVICES=1 timeout 300 \
            "$LOOMRUN" -np 2 "$py" "$srcdir/tests/python/test_torch_cuda.py" > "$tmp/out" 2>&1
    rc=$?
    if [ $rc = 0 ] && ! grep -q "has no CUDA: the refusal alone" "$tmp/out"; then
        rc=1   # it ran the CUDA half: the libloom it linked has CUDA after all
    fi
    report "test_torch_cuda.py: loom.torch over a libloom without CUDA" $rc
fi
[ $failures = 0 ] && echo "$name: PASS" || echo "$name: FAIL"
[ $failures = 0 ]
