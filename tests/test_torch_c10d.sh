#!/bin/sh
# test_torch_c10d.sh - the torch.distributed backend "loom" (python/loom/torch/
# _c10d.cpp) with PyPI's torch in /opt/loom-torch (python/torch_env.sh installs
# it; LOOM_TORCH_VENV points elsewhere): builds the package against this tree's
# libloom with that interpreter, then runs tests/python/test_c10d*.py on 1, 2
# and 3 ranks under torchrun (env:// and its TCPStore) and under loomrun (a
# FileStore; a HashStore with ranks as threads): every operation and dtype
# (BAND/BOR/BXOR on integers and bool), uneven all_to_all, sub-groups, async
# work and futures; wrong usage (mismatched sizes, a dead rank) ending in an
# error within the group's timeout, and an abort ends pending work; with
# LOOM_AUTH_KEY the records in torch's store are signed and a rewrite refused; DDP (no_sync, find_unused_parameters, fp16
# and PowerSGD hooks), FSDP2 and ZeroRedundancyOptimizer ending with the
# weights of one process on the whole batch and of the same run over gloo;
# examples/python/ddp_train.py and fsdp_train.py lower their loss.
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.
name=test_torch_c10d
. "$(dirname "$0")/torch_build.sh"
export PYTHONDONTWRITEBYTECODE=1 OMP_NUM_THREADS=1
unset SLURM_JOB_ID LOOM_STORE

passes=0
failures=0
report() {  # report STATUS WHAT
    if [ "$1" -eq 0 ]; then
        echo "ok: $2"
        passes=$((passes + 1))
    else
        echo "FAIL: $2 (exit $1)"
        tail -n 60 "$tmp/out"
        failures=$((failures + 1))
    fi
    grep -h "passed, .* failed" "$tmp/out" | sed 's/^/    /'
}
with_torchrun() {  # with_torchrun NP SCRIPT [ARGS]
    np=$1
    shift
    timeout 600 "$venv/bin/torchrun" --standalone --nproc-per-node "$np" "$srcdir/$@" \
        > "$tmp/out" 2>&1
    report $? "torchrun -np $np $*"
}
with_loomrun() {  # with_loomrun NP SCRIPT [ARGS]
    np=$1
    shift
    rm -f "$tmp/filestore"
    C10D_FILESTORE="$tmp/filestore" timeout 600 "$LOOMRUN" -np "$np" "$py" "$srcdir/$@" \
        > "$tmp/out" 2>&1
    report $? "loomrun -np $np $*"
}

for np in 1 2 3; do
    with_torchrun $np tests/python/test_c10d.py
    with_loomrun $np tests/python/test_c10d.py
done
# The devices "loom" is registered for (cpu, and cuda where built with CUDA).
with_torchrun 2 tests/python/test_c10d_devices.py
with_torchrun 2 tests/python/test_c10d_errors.py mismatch
with_loomrun 3 tests/python/test_c10d_errors.py mismatch
with_torchrun 3 tests/python/test_c10d_errors.py dead
with_loomrun 2 tests/python/test_c10d_errors.py dead
with_torchrun 2 tests/python/test_c10d_errors.py abort
with_torchrun 2 tests/python/test_c10d_equiv.py
with_torchrun 3 tests/python/test_c10d_equiv.py
with_loomrun 2 tests/python/test_c10d_equiv.py
# What gloo does, loom does (issue 31): names, sequence numbers, sparse
# all_reduce, monitored_barrier, "Timed out" after the group's timeout, pg_options;
# TORCH_DISTRIBUTED_DEBUG=DETAIL reports a mismatch as on gloo.
with_torchrun 2 tests/python/test_c10d_gloo_parity.py features
with_torchrun 3 tests/python/test_c10d_gloo_parity.py features
with_loomrun 2 tests/python/test_c10d_gloo_parity.py features
with_torchrun 2 tests/python/test_c10d_gloo_parity.py detail
# A gloo DDP script with only the backend's name changed, nothing imported:
# under torchrun and with init_method=file://, the weights of gloo's run.
plain_ddp() {  # plain_ddp BACKEND: torchrun, then file://; the weights line of rank 0
    timeout 300 "$venv/bin/torchrun" --standalone --nproc-per-node 2 \
        "$srcdir/tests/python/ddp_plain.py" "$1" > "$tmp/plain.$1" 2>&1 || echo "torchrun failed" >> "$tmp/plain.$1"
    rm -f "$tmp/plain_fs"
    for r in 0 1; do
        timeout 300 "$py" "$srcdir/tests/python/ddp_plain.py" "$1" --init-method "file://$tmp/plain_fs" \
            --rank $r --world-size 2 >> "$tmp/plain.$1" 2>&1 &
    done
    wait
}
plain_ddp gloo
plain_ddp loom
want=$(grep -m1 "rank 0 of 2: gloo weights" "$tmp/plain.gloo" | sed 's/.*weights \([^ ]*\).*/\1/')
# Counted per occurrence, not per line: two ranks' prints can share a line
# (one rank's text, the other's whole line, then the first one's newline).
got=$(grep -o "rank [01] of 2: loom weights $want ddp backend_name loom" "$tmp/plain.loom" | wc -l)
cat "$tmp/plain.loom" > "$tmp/out"
if [ -n "$want" ] && [ "$got" = 4 ]; then
    report 0 "ddp_plain.py loom, no import: torchrun and file://, the weights of gloo ($want)"
else
    report 1 "ddp_plain.py loom, no import: $got of 4 ranks with gloo's weights '$want'"
fi
# HashStore and PrefixStore: three ranks as threads of one process.
timeout 300 "$py" "$srcdir/tests/python/test_c10d_hashstore.py" > "$tmp/out" 2>&1
report $? "tests/python/test_c10d_hashstore.py (3 ranks as threads over a HashStore)"
# LOOM_AUTH_KEY: records signed in torch's store, every rewrite of one refused.
timeout 300 "$py" "$srcdir/tests/python/test_c10d_signed.py" > "$tmp/out" 2>&1
report $? "tests/python/test_c10d_signed.py (signed records, rewrites refused naming rank 0)"

# The examples: the loss must fall.
example() {  # example NP SCRIPT ARGS
    np=$1
    shift
    timeout 600 "$venv/bin/torchrun" --standalone --nproc-per-node "$np" "$srcdir/$@" \
        > "$tmp/out" 2>&1
    st=$?
    first=$(grep -m1 'loss' "$tmp/out" | sed 's/.*loss //')
    last=$(grep 'loss' "$tmp/out" | tail -n 1 | sed 's/.*loss //')
    if [ $st -eq 0 ] && [ -n "$first" ] && awk "BEGIN { exit !($last < $first) }"; then
        report 0 "$* (loss $first -> $last)"
    else
        report 1 "$* (loss '$first' -> '$last')"
    fi
}
example 2 examples/python/ddp_train.py --backend loom --steps 60
example 3 examples/python/fsdp_train.py --steps 30

echo "$name: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
