#!/bin/sh
# test_elastic.sh - elastic jobs end to end: loomrun --elastic runs
# tests/mp_elastic (a toy model trained with commits, see its header) on
# hosts acted out on this machine (127.0.0.x addresses are local hosts with
# their own LOOM_HOST_ID), listed by a discovery script that reads a file the
# test edits while the job runs. Scenarios:
#   grow    3 -> 2 -> 3: a rank SIGKILLs itself mid-allreduce, its host is
#           blacklisted, a new host is added later and its rank joins
#   shrink  4 -> 3: a rank SIGKILLs itself mid-allreduce
#   remove  3 -> 2: a host disappears from the discovery script
#   rebuild 4 -> 3 -> 2: a rank dies mid-allreduce, another during the rebuild
#   stale   3 -> 2: a rank revokes the epoch, the others go on without it
#           after --elastic-timeout, and its late rebuild is refused as stale
#   split   the stale scenario with the steps on a split of the world: the
#           revoke reaches it (a split shares its parent's epoch)
#   min-np  2 -> 1 with --min-np 2: the job fails, with loomrun saying why
#   resets  a failure past --reset-limit 0 ends the job
# Each must end with the model of a fault-free run (mp_elastic checks it
# against the serial computation; the hash is also compared with a fault-free
# loomrun job), within a time bound, with no process of the job left.
# Nothing here waits for the clock: the test edits the hosts once rank 0 has
# committed a given step, and in grow and remove the workers hold before the
# last quarter of the steps until the job's sizes are the ones expected
# (MPE_SIZES, bounded: see tests/mp_elastic.c), however long the new rank
# takes to start or the job to notice the host that left; the sequence of
# sizes rank 0 printed is then checked.
# LOOM_ELASTIC_REPEAT=N runs the shrink scenario N more times and prints the
# median time from the death to the resumed training.
# LOOM_ELASTIC_WORKER (an executable) replaces mp_elastic: the Python worker
# (tests/test_elastic_python.sh); LOOM_ELASTIC_SCENARIOS picks scenarios.
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.
# shellcheck disable=SC2086

top_builddir=${top_builddir:-.}
LOOMRUN="$top_builddir/tools/loomrun"
WORKER=${LOOM_ELASTIC_WORKER:-$top_builddir/tests/mp_elastic}
if [ ! -x "$LOOMRUN" ] || [ ! -x "$WORKER" ]; then
    echo "test_elastic: $LOOMRUN or $WORKER is not built (make check builds them)" >&2
    exit 1
fi
WORKER=$(cd "$(dirname "$WORKER")" && pwd)/$(basename "$WORKER")
scenarios=" ${LOOM_ELASTIC_SCENARIOS:-grow shrink split remove rebuild stale minnp resets} "
want() {
    case $scenarios in *" $1 "*) return 0 ;; esac
    return 1
}
unset SLURM_JOB_ID
if ! command -v pgrep >/dev/null 2>&1 || ! command -v timeout >/dev/null 2>&1; then
    echo "test_elastic: skipped: needs pgrep (procps) and timeout (coreutils)"
    exit 77
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_elastic.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-60}

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}

# wait_step DIR N [S]: until rank 0 has committed step N (at most S seconds).
wait_step() {
    i=0
    while [ "$i" -lt $((${3:-60} * 10)) ]; do
        s=$(cat "$1/progress" 2>/dev/null)
        [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# start NAME [loomrun options]: starts the job in the background with
# hosts from $tmp/NAME/hosts; the worker's environment comes from MPE_*.
start() {
    name=$1
    d=$tmp/$name
    mkdir -p "$d"
    printf '#!/bin/sh\ncat %s/hosts\n' "$d" >"$d/discover"
    chmod +x "$d/discover"
    shift
    MPE_DIR=$d timeout 150 "$LOOMRUN" --elastic --host-discovery-script "$d/discover" \
        --discovery-interval 0.3 --elastic-timeout 20 --blacklist-cooldown 600 "$@" "$WORKER" "tag=$d" \
        >"$d/out" 2>&1 &
    job=$!
}

# finish NAME EXPECTED_RC MAX_S: waits for the job, checks the exit code, the
# time, and that no process of it is left.
finish() {
    t0=$1
    wait "$job"
    rc=$?
    el=$(($(date +%s) - t0))
    if [ "$rc" -ne "$2" ]; then
        fail "$name: loomrun exited with $rc, expected $2"
        sed 's/^/    /' "$d/out" >&2
    fi
    if [ "$el" -gt "$3" ]; then
        fail "$name: took $el s (bound $3 s)"
    fi
    if grep -q "Sanitizer\|runtime error:" "$d/out"; then
        fail "$name: a sanitizer complained"
        grep -A12 "Sanitizer\|runtime error:" "$d/out" | sed 's/^/    /' >&2
    fi
    sleep 0.2
    if pgrep -f "tag=$d" >/dev/null; then
        fail "$name: processes left behind: $(pgrep -f "tag=$d" | tr '\n' ' ')"
        pkill -KILL -f "tag=$d"
    fi
}

# sizes NAME: the communicator sizes rank 0 printed, in order ("3 2 3").
sizes() {
    sed -n 's/.*\[mpe\] epoch [0-9]* size \([0-9]*\).*/\1/p' "$tmp/$1/out" | tr '\n' ' ' |
        sed 's/ $//'
}
model() {
    sed -n 's/.*\[mpe\] final .* model \([0-9a-f]*\) .*/\1/p' "$tmp/$1/out"
}

check_model() {
    m=$(model "$1")
    if ! grep -q 'MATCH$' "$tmp/$1/out" || [ "$m" != "$ref" ]; then
        fail "$1: the final model ($m) is not the fault-free one ($ref)"
        sed 's/^/    /' "$tmp/$1/out" >&2
    fi
}

export MPE_STEPS=40 MPE_SLEEP_MS=40

# The fault-free run everyone compares with.
mkdir -p "$tmp/ref" && printf 'localhost\n127.0.0.2\n127.0.0.3\n' >"$tmp/ref/hosts"
t=$(date +%s); start ref -np 3; finish "$t" 0 60
ref=$(model ref)
if [ -z "$ref" ] || [ "$(sizes ref)" != "3" ]; then
    fail "ref: the fault-free run did not finish with 3 ranks"
    sed 's/^/    /' "$tmp/ref/out" >&2
    exit 1
fi
echo "ok: fault-free run, model $ref"

# grow: 3 -> 2 -> 3
if want grow; then
    mkdir -p "$tmp/grow" && printf 'localhost\n127.0.0.2\n127.0.0.3\n' >"$tmp/grow/hosts"
    t=$(date +%s)
    MPE_KILL_ID=1 MPE_KILL_STEP=6 MPE_SIZES="3 2 3" start grow -np 3
    if wait_step "$tmp/grow" 14 60; then
        echo 127.0.0.4 >>"$tmp/grow/hosts"
    fi
    finish "$t" 0 90
    [ "$(sizes grow)" = "3 2 3" ] || fail "grow: sizes $(sizes grow), expected 3 2 3"
    check_model grow
    grep -q "blacklisted" "$tmp/grow/out" || fail "grow: the failed host was not blacklisted"
    [ "$failures" -eq 0 ] && echo "ok: 3 -> 2 -> 3 (kill mid-allreduce, host added): $(grep resumed "$tmp/grow/out" | sed 's/.*resumed/resumed/')$(grep -q '\[mpe\] holding' "$tmp/grow/out" && echo ", held for the new rank")"
fi

# shrink: 4 -> 3
shrink() {
    mkdir -p "$tmp/$1" && printf 'localhost\n127.0.0.2\n127.0.0.3\n127.0.0.4\n' >"$tmp/$1/hosts"
    t=$(date +%s)
    MPE_KILL_ID=2 MPE_KILL_STEP=6 start "$1" -np 4
    finish "$t" 0 90
    [ "$(sizes "$1")" = "4 3" ] || fail "$1: sizes $(sizes "$1"), expected 4 3"
    check_model "$1"
}
if want shrink; then
    f0=$failures
    shrink shrink
    [ "$failures" -eq "$f0" ] && echo "ok: 4 -> 3 (kill mid-allreduce): $(grep resumed "$tmp/shrink/out" | sed 's/.*resumed/resumed/')"
fi

# remove: 3 -> 2, a host leaves the discovery script
if want remove; then
    f0=$failures
    mkdir -p "$tmp/remove" && printf 'localhost\n127.0.0.2\n127.0.0.3\n' >"$tmp/remove/hosts"
    t=$(date +%s)
    MPE_SIZES="3 2" start remove -np 3
    if wait_step "$tmp/remove" 8 60; then
        printf 'localhost\n127.0.0.2\n' >"$tmp/remove/hosts"
    fi
    finish "$t" 0 90
    [ "$(sizes remove)" = "3 2" ] || fail "remove: sizes $(sizes remove), expected 3 2"
    grep -q "host 127.0.0.3 left" "$tmp/remove/out" || fail "remove: loomrun did not stop the rank of the host that left"
    check_model remove
    [ "$failures" -eq "$f0" ] && echo "ok: 3 -> 2 (host removed from the discovery script)"
fi

# rebuild: 4 -> 3 -> 2, the second death during the rebuild
if want rebuild; then
    f0=$failures
    mkdir -p "$tmp/rebuild" && printf 'localhost\n127.0.0.2\n127.0.0.3\n127.0.0.4\n' >"$tmp/rebuild/hosts"
    t=$(date +%s)
    MPE_KILL_ID=1 MPE_KILL_STEP=6 MPE_REBUILD_DIE_ID=3 start rebuild -np 4
    finish "$t" 0 90
    s=$(sizes rebuild)
    case $s in
    "4 2" | "4 3 2") ;;
    *)
        fail "rebuild: sizes $s, expected 4 2 or 4 3 2"
        sed 's/^/    /' "$tmp/rebuild/out" >&2
        ;;
    esac
    [ "$(grep -c 'killed by signal SIGKILL' "$tmp/rebuild/out")" -eq 2 ] ||
        fail "rebuild: expected two ranks killed"
    check_model rebuild
    [ "$failures" -eq "$f0" ] && echo "ok: sizes $s (a rank killed during the rebuild)"
fi

# stale: a rank revokes and comes back after the others rebuilt without it;
# its rebuild is refused, the others were not held up until LOOM_TIMEOUT.
# split: the same with the steps' allreduces on a split of the world: the
# revoke must reach the split, where the others wait for the stale rank.
stale() {
    f0=$failures
    mkdir -p "$tmp/$1" && printf 'localhost\n127.0.0.2\n127.0.0.3\n' >"$tmp/$1/hosts"
    t=$(date +%s)
    MPE_STALE_ID=2 MPE_STALE_STEP=5 start "$1" -np 3 --elastic-timeout 2
    finish "$t" 0 40
    [ "$(sizes "$1")" = "3 2" ] || fail "$1: sizes $(sizes "$1"), expected 3 2"
    grep -q "refused as stale: .*stale rank: id 2 (rank 2 of epoch 0) was left out of epoch 1" \
        "$tmp/$1/out" || fail "$1: the late rank was not refused as stale"
    # They learn it through the store (the revoked epoch) or straight from the
    # rank (its transport says it gave up), whichever comes first.
    grep -q "allreduce of step 5 failed: peer lost: .*\(epoch 0 was revoked by rank 2\|rank 2 gave up on this communicator\)" \
        "$tmp/$1/out" ||
        fail "$1: the other ranks' allreduce did not fail with \"peer lost\" naming the revoke"
    check_model "$1"
}
if want stale; then
    stale stale
    [ "$failures" -eq "$f0" ] && echo "ok: a rank of an older epoch is refused: $(sed -n 's/.*refused as stale: //p' "$tmp/stale/out")"
fi
if want split; then
    MPE_SPLIT=1 stale split
    [ "$failures" -eq "$f0" ] && echo "ok: the revoke reaches a split of the world communicator"
fi

# min-np: 2 -> 1 below --min-np 2 fails the job, saying so
if want minnp; then
    f0=$failures
    mkdir -p "$tmp/minnp" && printf 'localhost\n127.0.0.2\n' >"$tmp/minnp/hosts"
    t=$(date +%s)
    MPE_KILL_ID=1 MPE_KILL_STEP=4 start minnp -np 2 --min-np 2 --elastic-timeout 3
    finish "$t" 1 60
    grep -q "below --min-np 2" "$tmp/minnp/out" || fail "minnp: no word about --min-np"
    [ "$failures" -eq "$f0" ] && echo "ok: below --min-np the job fails: $(grep 'elastic job failed' "$tmp/minnp/out" | head -1)"
fi

# reset-limit: the first reset (a new epoch) past --reset-limit ends the job
if want resets; then
    f0=$failures
    mkdir -p "$tmp/resets" && printf 'localhost\n127.0.0.2\n127.0.0.3\n' >"$tmp/resets/hosts"
    t=$(date +%s)
    MPE_KILL_ID=1 MPE_KILL_STEP=4 start resets -np 3 --reset-limit 0
    finish "$t" 1 60
    grep -q "elastic job failed: 1 reset(s) exceed --reset-limit 0" "$tmp/resets/out" ||
        fail "resets: no word about --reset-limit"
    [ "$failures" -eq "$f0" ] && echo "ok: past --reset-limit the job fails"
fi

# Recovery time, median of N (not part of make check's default).
if [ "${LOOM_ELASTIC_REPEAT:-0}" -gt 0 ]; then
    i=0
    while [ "$i" -lt "$LOOM_ELASTIC_REPEAT" ]; do
        shrink "rep$i"
        grep resumed "$tmp/rep$i/out" | sed 's/.*resumed \([0-9.]*\) ms.*/\1/' >>"$tmp/times"
        i=$((i + 1))
    done
    echo "recovery times (ms): $(sort -n "$tmp/times" | tr '\n' ' ')"
    echo "median: $(sort -n "$tmp/times" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') ms"
fi

if [ "$failures" -ne 0 ]; then
    echo "test_elastic: $failures failure(s)" >&2
    exit 1
fi
echo "test_elastic: all scenarios passed"
exit 0
