#!/bin/sh
# test_loomrun.sh - the launcher's contract: rank prefixes and environment,
# exit code propagation, teardown of the other ranks, signal reports, -x,
# programs that cannot run, signal forwarding, argument errors.
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.
#
# The ranks' $VARs sit in single quotes on purpose (their sh expands them), and
# lists of pids are split into words on purpose.
# shellcheck disable=SC2016,SC2086

top_builddir=${top_builddir:-.}
LOOMRUN="$top_builddir/tools/loomrun"
if [ ! -x "$LOOMRUN" ]; then
    echo "test_loomrun: $LOOMRUN is not built" >&2
    exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_loomrun.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
pass() {
    echo "ok: $*"
    passes=$((passes + 1))
}
# Show what loomrun printed, for a failure's context.
dump() {
    echo "--- stdout:" >&2; cat "$tmp/out" >&2
    echo "--- stderr:" >&2; cat "$tmp/err" >&2
}
# run ARGS...: loomrun with stdout/stderr captured, status in $rc.
run() {
    "$LOOMRUN" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    rc=$?
}
# No process of the given pids is alive any more (waits up to ~2 s for
# the kernel to finish tearing them down).
all_gone() {
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        alive=""
        for p in "$@"; do
            kill -0 "$p" 2>/dev/null && alive="$alive $p"
        done
        [ -z "$alive" ] && return 0
        sleep 0.2
    done
    echo "still running:$alive" >&2
    kill -9 $alive 2>/dev/null
    return 1
}

# ---- rank prefixes and the environment ------------------------------------
run -np 3 sh -c 'echo $LOOM_RANK $LOOM_SIZE'
expected='[0]<stdout>: 0 3
[1]<stdout>: 1 3
[2]<stdout>: 2 3'
if [ $rc -eq 0 ] && [ "$(sort "$tmp/out")" = "$expected" ]; then
    pass "rank prefixes, LOOM_RANK, LOOM_SIZE"
else
    fail "rank prefixes / LOOM_RANK / LOOM_SIZE (rc=$rc)"; dump
fi

run -np 2 sh -c 'echo "$LOOM_LOCAL_RANK $LOOM_LOCAL_SIZE $LOOM_STORE $LOOM_JOB_ID"'
ok=1
[ $rc -eq 0 ] || ok=0
grep -q '^\[0\]<stdout>: 0 2 tcp://127\.0\.0\.1:[0-9][0-9]* [0-9a-f][0-9a-f]*$' "$tmp/out" || ok=0
grep -q '^\[1\]<stdout>: 1 2 tcp://127\.0\.0\.1:[0-9][0-9]* [0-9a-f][0-9a-f]*$' "$tmp/out" || ok=0
# One store and one job id for the whole job.
[ "$(sed 's/^[^:]*: [0-9]* [0-9]* //' "$tmp/out" | sort -u | wc -l)" -eq 1 ] || ok=0
if [ $ok -eq 1 ]; then
    pass "LOOM_LOCAL_RANK, LOOM_LOCAL_SIZE, LOOM_STORE, LOOM_JOB_ID"
else
    fail "local rank / store / job id environment (rc=$rc)"; dump
fi

run -np 1 sh -c 'echo to-out; echo to-err >&2; printf "no newline"'
if [ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = '[0]<stdout>: to-out
[0]<stdout>: no newline' ] && [ "$(cat "$tmp/err")" = '[0]<stderr>: to-err' ]; then
    pass "stdout/stderr tags, unfinished last line flushed"
else
    fail "stdout/stderr tags or partial line (rc=$rc)"; dump
fi

# A line far longer than any read buffer or pipe stays whole.
run -np 2 sh -c 'head -c 200000 /dev/zero | tr "\0" x; echo'
if [ $rc -eq 0 ] && [ "$(wc -l <"$tmp/out")" -eq 2 ] &&
   [ "$(awk '{ print length($0) }' "$tmp/out" | sort -u)" = "200013" ]; then
    pass "200000-byte lines stay whole"
else
    fail "long lines (rc=$rc)"; awk '{ print length($0), substr($0, 1, 20) }' "$tmp/out" >&2
fi

# ---- a failing rank ends the job with its exit code -----------------------
start=$(date +%s)
run -np 3 sh -c 'echo $$; if [ $LOOM_RANK = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 30'
elapsed=$(($(date +%s) - start))
pids=$(sed 's/^.*: //' "$tmp/out")
if [ $rc -eq 3 ] && [ $elapsed -lt 10 ] &&
   grep -qx 'loomrun: rank 1 exited with code 3' "$tmp/err" &&
   [ "$(grep -c '^loomrun:' "$tmp/err")" -eq 1 ] && [ "$(echo "$pids" | wc -l)" -eq 3 ] &&
   all_gone $pids; then
    pass "exit code 3 propagated, other ranks ended in ${elapsed}s"
else
    fail "exit code propagation (rc=$rc, ${elapsed}s)"; dump
fi

# A rank that ignores SIGTERM gets SIGKILL after the grace period.
start=$(date +%s)
run -np 2 sh -c 'trap "" TERM; echo $$; if [ $LOOM_RANK = 1 ]; then sleep 0.3; exit 4; fi
                 while :; do sleep 1; done'
elapsed=$(($(date +%s) - start))
pids=$(sed 's/^.*: //' "$tmp/out")
if [ $rc -eq 4 ] && [ $elapsed -lt 10 ] && all_gone $pids; then
    pass "rank ignoring SIGTERM killed after the grace period (${elapsed}s)"
else
    fail "SIGKILL after grace (rc=$rc, ${elapsed}s)"; dump
fi

run -np 2 sh -c 'if [ $LOOM_RANK = 0 ]; then kill -9 $$; fi; exec sleep 30'
if [ $rc -eq 137 ] && grep -qx 'loomrun: rank 0 was killed by signal SIGKILL (9)' "$tmp/err"; then
    pass "signal death reported, exit code 137"
else
    fail "signal death (rc=$rc)"; dump
fi

run -np 2 true
if [ $rc -eq 0 ] && [ ! -s "$tmp/err" ]; then
    pass "all ranks succeed: exit 0, nothing on stderr"
else
    fail "successful job (rc=$rc)"; dump
fi

# ---- -x and --timeout -----------------------------------------------------
LOOMRUN_TEST_COPY="copied value"
export LOOMRUN_TEST_COPY
run -np 2 -x LOOMRUN_TEST_SET=one=two -x LOOMRUN_TEST_COPY --timeout 42 \
    sh -c 'echo "$LOOMRUN_TEST_SET|$LOOMRUN_TEST_COPY|$LOOM_TIMEOUT"'
if [ $rc -eq 0 ] && [ "$(sed 's/^[^:]*: //' "$tmp/out" | sort -u)" = 'one=two|copied value|42' ] &&
   [ "$(wc -l <"$tmp/out")" -eq 2 ]; then
    pass "-x VAR=value, -x VAR, --timeout"
else
    fail "-x / --timeout (rc=$rc)"; dump
fi

# ---- a program that cannot be executed ------------------------------------
run -np 2 ./no-such-program-for-loomrun
if [ $rc -eq 127 ] &&
   grep -q 'loomrun: cannot execute ./no-such-program-for-loomrun: No such file or directory' \
       "$tmp/err" &&
   grep -q '^loomrun: rank [01] exited with code 127$' "$tmp/err"; then
    pass "missing program: exit 127"
else
    fail "missing program (rc=$rc)"; dump
fi

# ---- SIGTERM to loomrun ends every rank -----------------------------------
"$LOOMRUN" -np 3 sh -c 'echo $$; exec sleep 30' >"$tmp/out" 2>"$tmp/err" </dev/null &
lr=$!
i=0
while [ $i -lt 50 ]; do
    i=$((i + 1))
    [ "$(wc -l <"$tmp/out")" -ge 3 ] && break
    sleep 0.1
done
pids=$(sed 's/^.*: //' "$tmp/out")
start=$(date +%s)
kill -TERM $lr
wait $lr
rc=$?
elapsed=$(($(date +%s) - start))
if [ "$(echo "$pids" | wc -l)" -eq 3 ] && [ $rc -eq 143 ] && [ $elapsed -lt 10 ] &&
   all_gone $pids; then
    pass "SIGTERM forwarded, no rank left behind, exit 143"
else
    fail "SIGTERM forwarding (rc=$rc, ${elapsed}s, pids: $(printf "%s " $pids))"; dump
    kill -9 $pids 2>/dev/null
fi

# ---- argument errors ------------------------------------------------------
# expect_usage_error WHAT ARGS...: loomrun exits 2 and says why on stderr.
expect_usage_error() {
    what=$1
    shift
    run "$@"
    if [ $rc -eq 2 ] && grep -q '^loomrun: ' "$tmp/err" && [ ! -s "$tmp/out" ]; then
        pass "$what: exit 2"
    else
        fail "$what (rc=$rc)"; dump
    fi
}
expect_usage_error "-np 0" -np 0 true
expect_usage_error "-np not a number" -np two true
expect_usage_error "no program" -np 2
expect_usage_error "no -np" true
expect_usage_error "unknown option" -np 2 --no-such-option true
expect_usage_error "-x without a name" -np 2 -x =1 true
expect_usage_error "--timeout not a number" -np 2 --timeout soon true

run --help
if [ $rc -eq 0 ] && grep -q '^Usage: loomrun' "$tmp/out"; then
    pass "--help"
else
    fail "--help (rc=$rc)"; dump
fi

echo "$passes passed, $failures failed"
if [ $failures -ne 0 ]; then
    echo "test_loomrun: $failures check(s) failed" >&2
    exit 1
fi
exit 0
