#!/bin/sh
# The Python package (python/): builds the extension against this tree's
# libloom into a scratch directory, then runs tests/python/*.py under loomrun on
# 1, 2 and 3 ranks: the extension's Comm/Request API (blocking, non-blocking,
# the GIL released), every collective and type through loom (NumPy) and
# loom.torch, fusion and negotiation (its binary format: test_negotiation.py),
# the mismatch errors, and the
# DistributedOptimizer equivalence test (fusion on and off), Horovod parity
# (test_torch_horovod.py: every failure kind followed by a good call, the
# gradients of every collective, sparse, int16, scaling, SyncBatchNorm, the
# response cache), the elastic API's state handling in a plain job; then
# loom.tensorflow and loom.keras (their equivalence tests too, and
# test_tf_horovod.py: Horovod's error types and names, every gradient against
# finite differences, the API beside the collectives, and test_tf_order.py:
# a graph's collectives started in a different order on each rank, which only
# the asynchronous op loom.tensorflow._async_op runs, built for that
# interpreter) where an interpreter with TensorFlow is found. The examples in examples/python run
# too (2 ranks), and must end with the loss lower.
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.
name=test_python
. "${top_srcdir:-$(dirname "$0")/..}/tests/python_build.sh"
# The mismatch tests wait for this long of no progress before failing the names.
export LOOM_STALL_TIMEOUT=0.5
unset SLURM_JOB_ID

passes=0
failures=0
run() {  # run NP SCRIPT [VAR=value...]: one loomrun job (PYTHON_FOR_TEST=... picks the interpreter)
    np=$1 script=$2
    shift 2
    interp=$py
    for a in "$@"; do
        case $a in PYTHON_FOR_TEST=*) interp=${a#PYTHON_FOR_TEST=} ;; esac
    done
    if env "$@" "$LOOMRUN" -np "$np" "$interp" "$srcdir/$script" > "$tmp/out" 2>&1; then
        echo "ok: $script on $np ranks $*"
        passes=$((passes + 1))
    else
        echo "FAIL: $script on $np ranks $*"
        tail -n 60 "$tmp/out"
        failures=$((failures + 1))
    fi
    grep -h "passed, .* failed" "$tmp/out" | sed 's/^/    /'
}

run 1 tests/python/test_negotiation.py
for np in 1 2 3; do
    run $np tests/python/test_comm.py
    run $np tests/python/test_numpy.py
done

example() {  # example PYTHON SCRIPT [LAUNCHER...]: 2 ranks, 3 epochs, the loss must fall (LAUNCHER: loomrun)
    interp=$1 script=$2
    shift 2
    how=${*:+" under $*"}
    [ $# -gt 0 ] || set -- "$LOOMRUN"
    if "$@" -np 2 "$interp" "$srcdir/examples/python/$script" --epochs 3 > "$tmp/out" 2>&1 &&
        grep -q "loss fell" "$tmp/out"; then
        echo "ok: examples/python/$script$how"
        passes=$((passes + 1))
    else
        echo "FAIL: examples/python/$script$how"
        tail -n 40 "$tmp/out"
        failures=$((failures + 1))
    fi
}

torch_tests() {
    for np in 1 2 3; do
        run $np tests/python/test_torch.py
        run $np tests/python/test_torch_equiv.py
        run $np tests/python/test_torch_horovod.py
    done
    run 2 tests/python/test_torch_equiv.py LOOM_FUSION_THRESHOLD=0
    run 1 tests/python/test_elastic_api.py
    run 3 tests/python/test_elastic_api.py
    run 3 tests/python/test_torch.py LOOM_FUSION_THRESHOLD=64 LOOM_CYCLE_TIME=5

    # A rank that dies: the other's calls raise at once (LOOM_* variables, tcp store).
    port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    LOOM_SHM=0 LOOM_SIZE=2 LOOM_STORE="tcp://127.0.0.1:$port" LOOM_RANK=1 \
        "$py" "$srcdir/tests/python/test_torch_peer_lost.py" > "$tmp/out1" 2>&1 &
    if LOOM_SHM=0 LOOM_SIZE=2 LOOM_STORE="tcp://127.0.0.1:$port" LOOM_RANK=0 \
            timeout 60 "$py" "$srcdir/tests/python/test_torch_peer_lost.py" > "$tmp/out" 2>&1; then
        echo "ok: tests/python/test_torch_peer_lost.py"
        passes=$((passes + 1))
    else
        echo "FAIL: tests/python/test_torch_peer_lost.py"
        failures=$((failures + 1))
    fi
    wait
    sed 's/^/    /' "$tmp/out"

    # horovodrun's command line: loom.runner starts loomrun; --gloo is ignored,
    # --timeline-filename writes each rank's trace, HOROVOD_RANK agrees.
    if LOOMRUN="$LOOMRUN" "$py" -m loom.runner -np 2 --gloo --timeline-filename "$tmp/tl.json" \
            "$py" -c 'import os, torch, loom.torch as hvd; hvd.init(); hvd.allreduce(torch.ones(2), name="r"); print("runner", os.environ["HOROVOD_RANK"], hvd.rank(), hvd.size()); hvd.shutdown()' \
            > "$tmp/out" 2>&1 &&
        grep -q '^\[0\]<stdout>: runner 0 0 2$' "$tmp/out" && grep -q '^\[1\]<stdout>: runner 1 1 2$' "$tmp/out" &&
        "$py" -c 'import json, sys; [json.load(open(f)) for f in sys.argv[1:]]' "$tmp/tl.json" "$tmp/tl.1.json" &&
        grep -q '"NEGOTIATE' "$tmp/tl.json" &&
        "$py" -m loom.runner -np 3 --mpi --min-np 2 --print-command "$py" x.py | grep -q -- '--elastic -np 3 --min-np 2 -- ' &&
        "$py" -m loom.runner -np 2 -H a:2,b:2 --min-np 2 --print-command "$py" x.py |
            grep -q -- '--elastic -np 2 -H a:2,b:2 --max-np all --min-np 2 -- '; then
        echo "ok: python -m loom.runner"
        passes=$((passes + 1))
    else
        echo "FAIL: python -m loom.runner"
        cat "$tmp/out"
        failures=$((failures + 1))
    fi

    example "$py" torch_train.py
    example "$py" horovod_torch_mnist.py
    example "$py" elastic_torch.py
}

have_torch=0
if "$py" -c 'import torch' 2>/dev/null; then
    have_torch=1
    torch_tests
fi

# TensorFlow and Keras: PyPI's tensorflow-cpu brings NumPy 2, which Debian's
# PyTorch cannot load, so they live in their own interpreter: $LOOM_TF_PYTHON,
# else the virtual environment .ci/run makes, else this one.
tfpy=""
for cand in ${LOOM_TF_PYTHON:-} /opt/loom-tf/bin/python "$py"; do
    if [ -x "$cand" ] || command -v "$cand" >/dev/null 2>&1; then
        if "$cand" -c 'import tensorflow, keras, numpy' 2>/dev/null; then
            tfpy=$cand
            break
        fi
    fi
done
if [ -n "$tfpy" ]; then
    tf_package "$tfpy"
    for np in 1 2 3; do
        run $np tests/python/test_tf.py TF_CPP_MIN_LOG_LEVEL=3 PYTHON_FOR_TEST="$tfpy"
        run $np tests/python/test_keras.py TF_CPP_MIN_LOG_LEVEL=3 PYTHON_FOR_TEST="$tfpy"
        run $np tests/python/test_tf_horovod.py TF_CPP_MIN_LOG_LEVEL=3 PYTHON_FOR_TEST="$tfpy"
    done
    run 2 tests/python/test_tf_order.py TF_CPP_MIN_LOG_LEVEL=3 PYTHON_FOR_TEST="$tfpy"
    run 3 tests/python/test_tf_order.py TF_CPP_MIN_LOG_LEVEL=3 PYTHON_FOR_TEST="$tfpy"
    example "$tfpy" tf_train.py
    example "$tfpy" keras_train.py
    example "$tfpy" horovod_tf_keras_mnist.py
    # Horovod's first example under horovodrun's command line too.
    example "$tfpy" horovod_tf_keras_mnist.py env LOOMRUN="$LOOMRUN" TF_CPP_MIN_LOG_LEVEL=3 "$tfpy" -m loom.runner
else
    echo "test_python: TensorFlow tests not run: no python with tensorflow and keras" \
        "(python3 -m venv /opt/loom-tf && /opt/loom-tf/bin/pip install tensorflow-cpu)"
fi

echo "$passes passed, $failures failed"
[ "$failures" = 0 ] || exit 1
if [ "$have_torch" = 0 ]; then
    echo "test_python: SKIP: $py cannot import torch (apt-get install python3-torch): the PyTorch tests did not run"
    exit 77
fi
