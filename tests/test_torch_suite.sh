#!/bin/sh
# test_torch_suite.sh - PyTorch's own torch.distributed suite
# (torch/testing/_internal/distributed/distributed_test.py of the torch in
# /opt/loom-torch, nothing of it copied here) against the "loom" backend beside
# gloo, through tests/python/run_torch_suite.py: every test gloo passes, loom
# must pass too, plain (BACKEND=loom) and with "gloo" mapped to loom (the tests
# the suite runs for gloo alone).
#   short form (make check): the tests named in tests/python/torch_suite_short.txt
#     at world sizes 2 and 3, ranks forked (a few minutes);
#   TORCH_SUITE=full (make torch-suite): every test at world sizes 2, 3 and 4;
#   TORCH_SUITE_ARGS: more arguments for run_torch_suite.py (--start-method spawn).
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.
name=test_torch_suite
. "$(dirname "$0")/torch_build.sh"
if ! "$py" -c 'import expecttest, torch.testing._internal.common_distributed' >/dev/null 2>&1; then
    echo "$name: SKIP: $venv cannot import torch's test helpers (python/torch_env.sh installs expecttest)"
    exit 77
fi
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
unset SLURM_JOB_ID LOOM_STORE TORCH_DISTRIBUTED_DEBUG

if [ "${TORCH_SUITE:-short}" = full ]; then
    set -- --world-sizes 2,3,4 --start-method fork
else
    set -- --world-sizes 2,3 --start-method fork --tests "$srcdir/tests/python/torch_suite_short.txt"
fi
# shellcheck disable=SC2086
timeout 3600 "$py" "$srcdir/tests/python/run_torch_suite.py" "$@" --logdir "$tmp/logs" \
    --require-gloo-parity ${TORCH_SUITE_ARGS:-} > "$tmp/out" 2>&1
st=$?
cat "$tmp/out"
if [ $st -eq 0 ]; then
    echo "$name: 1 passed, 0 failed"
else
    # The end of the log of each test that failed on loom.
    for n in $(sed -n 's/^  \[[0-9]* [a-z-]*\] \([a-z_0-9]*\):.*/\1/p' "$tmp/out" | sort -u | head -n 5); do
        echo "--- $n"
        grep -l "$n" "$tmp"/logs/suite-*/names 2>/dev/null | while read -r f; do
            d=$(dirname "$f"); case "$d" in *suite-gloo-[0-9]*) continue ;; esac
            grep -n -A30 "^ERROR: $n \|^FAIL: $n " "$d/log" | head -n 40
        done
    done
    echo "$name: 0 passed, 1 failed"
fi
exit $st
