#!/bin/sh
# The collective matrix (tests/mp_collectives --launched: every collective,
# algorithm, dtype and op at small counts) as a job started by each launcher a
# user has: loomrun, Open MPI's mpirun, MPICH's mpiexec (Hydra/PMI), a
# torchrun-style environment, and plain LOOM_* variables with a file:// store.
# Launchers that are not installed are skipped with a message.
set -u
top_builddir=${top_builddir:-.}
prog=$(cd "$top_builddir" && pwd)/tests/mp_collectives
loomrun="$top_builddir/tools/loomrun"
[ -x "$prog" ] || { echo "missing $prog"; exit 1; }
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$tmp"' EXIT
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-60}
passed=0
failed=0
skipped=0
result() {
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}
skip() { echo "SKIP $1"; skipped=$((skipped + 1)); }
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
matrix_ok() {  # the output of rank 0 names the job size
    grep -q "collective matrix OK on $1 ranks" "$2" || { tail -n 30 "$2"; return 1; }
}

"$loomrun" -np 4 "$prog" --launched > "$tmp/loomrun.out" 2>&1
rc=$?
[ $rc = 0 ] && matrix_ok 4 "$tmp/loomrun.out"
result $? "loomrun -np 4"

if command -v mpirun.openmpi > /dev/null; then
    port=$(free_port)
    mpirun.openmpi --oversubscribe --allow-run-as-root -np 4 -x LOOM_STORE=tcp://127.0.0.1:$port \
        -x LOOM_TIMEOUT "$prog" --launched > "$tmp/ompi.out" 2>&1
    rc=$?
    [ $rc = 0 ] && matrix_ok 4 "$tmp/ompi.out"
    result $? "Open MPI mpirun -np 4 -x LOOM_STORE=... (OMPI_COMM_WORLD_* variables)"
else
    skip "Open MPI's mpirun.openmpi is not installed (apt-get install openmpi-bin)"
fi

if command -v mpiexec.mpich > /dev/null; then
    port=$(free_port)
    mpiexec.mpich -n 4 -env LOOM_STORE tcp://127.0.0.1:$port -env LOOM_TIMEOUT "$LOOM_TIMEOUT" \
        "$prog" --launched > "$tmp/mpich.out" 2>&1
    rc=$?
    [ $rc = 0 ] && matrix_ok 4 "$tmp/mpich.out"
    result $? "MPICH mpiexec -n 4 -env LOOM_STORE ... (PMI_RANK/PMI_SIZE variables)"
else
    skip "MPICH's mpiexec.mpich is not installed (apt-get install mpich)"
fi

run4() {  # run4 NAME: 4 background ranks, variables from the function env_NAME RANK
    pids=""
    for r in 0 1 2 3; do
        ( eval "$(env_"$1" $r)"; exec "$prog" --launched ) > "$tmp/$1.$r" 2>&1 &
        pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    [ $rc = 0 ] && matrix_ok 4 "$tmp/$1.0"
}

port=$(free_port)
env_torch() { echo "export RANK=$1 WORLD_SIZE=4 LOCAL_RANK=$1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port"; }
run4 torch
result $? "torchrun-style RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT"

env_file() { echo "export LOOM_RANK=$1 LOOM_SIZE=4 LOOM_STORE=file://$tmp/store LOOM_JOB_ID=file$$"; }
run4 file
result $? "LOOM_* variables with a file:// store"

port=$(free_port)
env_slurm() { echo "export SLURM_PROCID=$1 SLURM_NTASKS=4 SLURM_LOCALID=$1 SLURM_JOB_ID=7$$ LOOM_STORE=tcp://127.0.0.1:$port"; }
run4 slurm
result $? "Slurm's SLURM_PROCID/SLURM_NTASKS variables (as srun sets them)"

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
