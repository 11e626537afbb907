#!/bin/sh
# test_loomrun.sh - the launcher's contract: rank prefixes and environment,
# exit code propagation, teardown of the other ranks, signal reports, -x,
# programs that cannot run, signal forwarding, argument errors; the hosts
# options with local hosts only (-H, --hostfile, LOOM_LOCAL_RANK and
# LOOM_HOST_ID per host), --wdir, --output-filename, and the srun command line
# inside a Slurm allocation, with a fake srun. Remote hosts over ssh:
# test_multihost.sh.
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

# Inside a real Slurm allocation loomrun would hand every job to srun.
unset SLURM_JOB_ID
me=$(uname -n)

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

# Horovod's variables: rank, size, local rank and size, cross rank and size, host.
run -H localhost:2,127.0.0.1:1 sh -c 'echo "$HOROVOD_RANK $HOROVOD_SIZE $HOROVOD_LOCAL_RANK/$HOROVOD_LOCAL_SIZE $HOROVOD_CROSS_RANK/$HOROVOD_CROSS_SIZE $HOROVOD_HOSTNAME"'
expected="[0]<stdout>: 0 3 0/2 0/2 localhost
[1]<stdout>: 1 3 1/2 0/1 localhost
[2]<stdout>: 2 3 0/1 1/2 127.0.0.1"
if [ $rc -eq 0 ] && [ "$(sort "$tmp/out")" = "$expected" ]; then
    pass "HOROVOD_RANK, _SIZE, _LOCAL_*, _CROSS_*, _HOSTNAME"
else
    fail "Horovod's variables (rc=$rc)"; dump
fi

run -np 1 sh -c 'echo to-out; echo to-err >&2; printf "no newline"'
if [ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = '[0]<stdout>: to-out
[0]<stdout>: no newline' ] && [ "$(cat "$tmp/err")" = '[0]<stderr>: to-err' ]; then
    pass "stdout/stderr tags, unfinished last line flushed"
else
    fail "stdout/stderr tags or partial line (rc=$rc)"; dump
fi

# --no-tag-output: the lines as written, still whole; --tag-output (the
# default) restores the tags, the last of the two wins.
run -np 2 --no-tag-output sh -c 'echo "out $LOOM_RANK"; echo "err $LOOM_RANK" >&2; printf "tail $LOOM_RANK"'
if [ $rc -eq 0 ] && [ "$(sort "$tmp/out")" = 'out 0
out 1
tail 0
tail 1' ] && [ "$(sort "$tmp/err")" = 'err 0
err 1' ]; then
    pass "--no-tag-output prints lines untagged, each whole"
else
    fail "--no-tag-output (rc=$rc)"; dump
fi
run -np 1 --no-tag-output --tag-output sh -c 'echo x'
if [ $rc -eq 0 ] && [ "$(cat "$tmp/out")" = '[0]<stdout>: x' ]; then
    pass "--tag-output after --no-tag-output tags again"
else
    fail "--tag-output (rc=$rc)"; dump
fi
run -np 1 --no-tag-output=1 true
if [ $rc -ne 0 ] && grep -q "takes no value" "$tmp/err"; then
    pass "--no-tag-output=1 refused"
else
    fail "--no-tag-output=1 accepted (rc=$rc)"; dump
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
if [ $rc -eq 3 ] && [ $elapsed -lt 25 ] &&
   grep -qxF "loomrun: rank 1 on host $me exited with code 3" "$tmp/err" &&
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
if [ $rc -eq 4 ] && [ $elapsed -lt 25 ] && all_gone $pids; then
    pass "rank ignoring SIGTERM killed after the grace period (${elapsed}s)"
else
    fail "SIGKILL after grace (rc=$rc, ${elapsed}s)"; dump
fi

run -np 2 sh -c 'if [ $LOOM_RANK = 0 ]; then kill -9 $$; fi; exec sleep 30'
if [ $rc -eq 137 ] &&
   grep -qxF "loomrun: rank 0 on host $me was killed by signal SIGKILL (9)" "$tmp/err"; then
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
   grep -q '^loomrun: rank [01] on host .* exited with code 127$' "$tmp/err"; then
    pass "missing program: exit 127"
else
    fail "missing program (rc=$rc)"; dump
fi

# ---- SIGTERM to loomrun ends every rank -----------------------------------
"$LOOMRUN" -np 3 sh -c 'echo $$; exec sleep 30' >"$tmp/out" 2>"$tmp/err" </dev/null &
lr=$!
i=0
while [ $i -lt 600 ]; do
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
if [ "$(echo "$pids" | wc -l)" -eq 3 ] && [ $rc -eq 143 ] && [ $elapsed -lt 25 ] &&
   all_gone $pids; then
    pass "SIGTERM forwarded, no rank left behind, exit 143"
else
    fail "SIGTERM forwarding (rc=$rc, ${elapsed}s, pids: $(printf "%s " $pids))"; dump
    kill -9 $pids 2>/dev/null
fi

# ---- local hosts: -H, --hostfile ------------------------------------------
# Ranks fill the hosts in order; each host name is a node of its own
# (LOOM_HOST_ID), and the local rank counts within it. Both names are this
# machine, so everything is forked here, with the store on loopback.
run -H localhost:2,127.0.0.1:2 \
    sh -c 'echo "$LOOM_RANK $LOOM_SIZE $LOOM_LOCAL_RANK $LOOM_LOCAL_SIZE $LOOM_HOST_ID $LOOM_STORE"'
expected='[0]<stdout>: 0 4 0 2 localhost
[1]<stdout>: 1 4 1 2 localhost
[2]<stdout>: 2 4 0 2 127.0.0.1
[3]<stdout>: 3 4 1 2 127.0.0.1'
if [ $rc -eq 0 ] && [ "$(sed 's/ tcp:[^ ]*$//' "$tmp/out" | sort)" = "$expected" ] &&
   [ "$(grep -c ' tcp://127\.0\.0\.1:[0-9]*$' "$tmp/out")" -eq 4 ]; then
    pass "-H localhost:2,127.0.0.1:2: 4 local ranks, local rank and host id per host"
else
    fail "-H localhost:2,127.0.0.1:2 (rc=$rc)"; dump
fi

# -np below the slots fills the first host first; a host left without ranks
# is not used at all.
run -np 3 -H "localhost:2,$me:5" sh -c 'echo "$LOOM_LOCAL_RANK/$LOOM_LOCAL_SIZE $LOOM_HOST_ID"'
expected="[0]<stdout>: 0/2 localhost
[1]<stdout>: 1/2 localhost
[2]<stdout>: 0/1 $me"
if [ $rc -eq 0 ] && [ "$(sort "$tmp/out")" = "$expected" ]; then
    pass "-np 3 over localhost:2 and this machine's name: filled in order"
else
    fail "-np with -H (rc=$rc)"; dump
fi

printf '%s\n' '# the whole job on this machine' 'localhost slots=3   # three here' '' \
    '127.0.0.1 slots=1 max_slots=4' >"$tmp/hostfile"
run --hostfile "$tmp/hostfile" sh -c 'echo "$LOOM_RANK $LOOM_SIZE $LOOM_LOCAL_RANK $LOOM_HOST_ID"'
expected='[0]<stdout>: 0 4 0 localhost
[1]<stdout>: 1 4 1 localhost
[2]<stdout>: 2 4 2 localhost
[3]<stdout>: 3 4 0 127.0.0.1'
if [ $rc -eq 0 ] && [ "$(sort "$tmp/out")" = "$expected" ]; then
    pass "--hostfile with comments and slots=N: -np from the slots"
else
    fail "--hostfile (rc=$rc)"; dump
fi

# ---- --wdir and --output-filename -----------------------------------------
mkdir "$tmp/work dir"
run -np 2 --wdir "$tmp/work dir" --output-filename "$tmp/logs" \
    sh -c 'pwd; echo "err $LOOM_RANK" >&2; printf "last $LOOM_RANK"'
ok=1
[ $rc -eq 0 ] || ok=0
[ "$(grep -cxF "[0]<stdout>: $tmp/work dir" "$tmp/out")" -eq 1 ] || ok=0
[ "$(grep -cxF "[1]<stdout>: $tmp/work dir" "$tmp/out")" -eq 1 ] || ok=0
grep -qx '\[1\]<stderr>: err 1' "$tmp/err" || ok=0
for r in 0 1; do
    [ "$(cat "$tmp/logs/rank.$r/stdout" 2>/dev/null)" = "$tmp/work dir
last $r" ] || ok=0
    [ "$(cat "$tmp/logs/rank.$r/stderr" 2>/dev/null)" = "err $r" ] || ok=0
    # The file holds what the rank wrote, byte for byte: no newline added.
    [ "$(tail -c 1 "$tmp/logs/rank.$r/stdout" 2>/dev/null)" = "$r" ] || ok=0
done
if [ $ok -eq 1 ]; then
    pass "--wdir; --output-filename writes DIR/rank.N/{stdout,stderr} besides the console"
else
    fail "--wdir / --output-filename (rc=$rc)"; dump
    find "$tmp/logs" -type f -exec sh -c 'echo "--- $1"; cat "$1"' _ {} \; >&2
fi

run -np 1 --wdir "$tmp/no such dir" true
if [ $rc -eq 127 ] && grep -qF "loomrun: cannot change to directory $tmp/no such dir" "$tmp/err"; then
    pass "--wdir that does not exist: exit 127"
else
    fail "--wdir missing (rc=$rc)"; dump
fi

# ---- Slurm: the srun command line, with a fake srun -------------------------
# There is no slurmctld here. The fake srun prints its arguments and the
# variables it was given, then plays srun: it starts the tasks itself with
# SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, so the job really meets through
# loomrun's store.
mkdir "$tmp/bin"
cat >"$tmp/bin/srun" <<'FAKE_SRUN'
#!/bin/sh
printf 'srun-arg: %s\n' "$@"
env | grep -E '^(LOOM_|LOOMRUN_TEST_|RANK=)' | sed 's/^/srun-env: /' | sort
n=
for a in "$@"; do case $a in --ntasks=*) n=${a#--ntasks=} ;; esac; done
while [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done
i=0
pids=
while [ "$i" -lt "$n" ]; do
    SLURM_PROCID=$i SLURM_NTASKS=$n SLURM_LOCALID=$i "$@" &
    pids="$pids $!"
    i=$((i + 1))
done
rc=0
for p in $pids; do wait "$p" || rc=$?; done
exit $rc
FAKE_SRUN
chmod +x "$tmp/bin/srun"
allreduce="$top_builddir/examples/allreduce"
# Variables of an enclosing launcher must not reach the tasks: loom_init
# would prefer them to SLURM_PROCID.
SLURM_JOB_ID=4242 SLURM_JOB_NODELIST=localhost SLURM_NTASKS=3 PATH="$tmp/bin:$PATH" \
    LOOM_RANK=7 RANK=7 run -x LOOMRUN_TEST_X=one --timeout 33 "$allreduce" 'an arg'
expected_args="srun-arg: --ntasks=3
srun-arg: --kill-on-bad-exit=1
srun-arg: $allreduce
srun-arg: an arg"
ok=1
[ $rc -eq 0 ] || ok=0
[ "$(grep '^srun-arg: ' "$tmp/out")" = "$expected_args" ] || ok=0
grep -q '^srun-env: LOOM_STORE=tcp://127\.0\.0\.1:[0-9][0-9]*$' "$tmp/out" || ok=0
grep -q '^srun-env: LOOM_JOB_ID=[0-9a-f][0-9a-f]*$' "$tmp/out" || ok=0
grep -qx 'srun-env: LOOM_TIMEOUT=33' "$tmp/out" || ok=0
grep -qx 'srun-env: LOOMRUN_TEST_X=one' "$tmp/out" || ok=0
grep -q '^srun-env: \(LOOM_RANK\|LOOM_SIZE\|RANK\)=' "$tmp/out" && ok=0
[ "$(grep -c 'allreduce OK' "$tmp/out")" -eq 3 ] || ok=0
# srun's output is the job's own: loomrun does not tag it.
grep -q '^\[' "$tmp/out" && ok=0
if [ $ok -eq 1 ]; then
    pass "in a Slurm allocation: srun --ntasks=3 --kill-on-bad-exit=1 prog args, store served"
else
    fail "srun command line (rc=$rc)"; dump
fi

SLURM_JOB_ID=4242 PATH="$tmp/bin:$PATH" run -np 2 sh -c 'exit 5'
if [ $rc -eq 5 ] && grep -qx 'loomrun: srun exited with code 5' "$tmp/err"; then
    pass "srun's failure is loomrun's exit code"
else
    fail "srun failure (rc=$rc)"; dump
fi

# -H (or --hostfile) wins over the allocation.
SLURM_JOB_ID=4242 PATH="$tmp/bin:$PATH" run -H localhost:2 sh -c 'echo "$LOOM_RANK"'
if [ $rc -eq 0 ] && ! grep -q srun-arg "$tmp/out" && [ "$(wc -l <"$tmp/out")" -eq 2 ]; then
    pass "-H localhost:2 inside an allocation forks locally"
else
    fail "-H inside an allocation (rc=$rc)"; dump
fi

# ---- remote hosts, through a stand-in ssh -----------------------------------
# The real thing (sshd in network namespaces) is test_multihost.sh, which
# needs root. This ssh runs the remote command right here, as sshd would
# (with SSH_CLIENT set), or fails like ssh or hangs, as LOOMRUN_TEST_SSH says.
# "fakehost" is not this machine, so loomrun goes through ssh; as the name
# does not resolve, the remote command takes the store's address from
# $SSH_CLIENT.
cat >"$tmp/bin/ssh" <<'FAKE_SSH'
#!/bin/sh
printf '%s\n' "$@" >"$LOOMRUN_TEST_SSH_LOG.$$"
case ${LOOMRUN_TEST_SSH:-} in
    fail) echo "ssh: connect to host fakehost port 22: Connection refused" >&2; exit 255 ;;
    hang) exec sleep 60 ;;
esac
for last; do :; done
SSH_CLIENT="127.0.0.1 40000 22" exec sh -c "$last"
FAKE_SSH
chmod +x "$tmp/bin/ssh"
LOOMRUN_TEST_SSH_LOG=$tmp/ssh.args
export LOOMRUN_TEST_SSH_LOG

PATH="$tmp/bin:$PATH" run -H fakehost:2 --ssh-port 2022 --ssh-identity-file "$tmp/key" --timeout 45 \
    -x "LOOMRUN_TEST_Q=it's \$HOME \"quoted\"" \
    sh -c 'echo "$LOOM_RANK $LOOM_LOCAL_RANK $LOOM_LOCAL_SIZE $LOOM_HOST_ID $LOOMRUN_TEST_Q $(pwd)"
           echo "$LOOM_STORE" >&2'
expected="[0]<stdout>: 0 0 2 fakehost it's \$HOME \"quoted\" $PWD
[1]<stdout>: 1 1 2 fakehost it's \$HOME \"quoted\" $PWD"
args=$(cat "$tmp"/ssh.args.* 2>/dev/null | head -n 15)
ok=1
[ $rc -eq 0 ] || ok=0
[ "$(sort "$tmp/out")" = "$expected" ] || ok=0
[ "$(grep -c '^\[[01]\]<stderr>: tcp://127\.0\.0\.1:[0-9][0-9]*$' "$tmp/err")" -eq 2 ] || ok=0
[ "$(echo "$args" | head -n 14 | tr '\n' ' ')" = "-o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=45 -o LogLevel=ERROR -p 2022 -i $tmp/key -- fakehost " ] ||
    ok=0
if [ $ok -eq 1 ]; then
    pass "ssh command line, quoting, remote environment, store address from \$SSH_CLIENT"
else
    fail "remote ranks through ssh (rc=$rc)"; dump; echo "--- ssh args:" >&2; echo "$args" >&2
fi
rm -f "$tmp"/ssh.args.*

# Secrets never ride on a command line (ps shows those on both hosts): the
# remote shell reads them from ssh's stdin. The ranks still get them, and a
# keyed job meets.
rm -f "$tmp"/ssh.args.*
# (The ranks show checksums: the secrets themselves must not appear in the
# program's own arguments either.)
want=$(printf '%s' 's3cret key;$(x)' | cksum)/$(printf '%s' 'redis-pw-42' | cksum)
LOOM_AUTH_KEY='s3cret key;$(x)' PATH="$tmp/bin:$PATH" run -H fakehost:2 \
    -x 'LOOM_REDIS_PASSWORD=redis-pw-42' \
    sh -c 'echo "secrets $(printf %s "$LOOM_AUTH_KEY" | cksum)/$(printf %s "$LOOM_REDIS_PASSWORD" | cksum)"
           exec "$0"' "$top_builddir/examples/allreduce"
nargs=$(cat "$tmp"/ssh.args.* 2>/dev/null | wc -l)
if [ $rc -eq 0 ] && [ "$(grep -cF "secrets $want" "$tmp/out")" -eq 2 ] &&
   [ "$(grep -c 'allreduce OK' "$tmp/out")" -eq 2 ] && [ "$nargs" -gt 10 ] &&
   ! grep -q 's3cret\|redis-pw' "$tmp"/ssh.args.*; then
    pass "LOOM_AUTH_KEY and LOOM_REDIS_PASSWORD reach remote ranks, on no command line"
else
    fail "secrets to remote ranks (rc=$rc)"; dump; echo "--- ssh args:" >&2; cat "$tmp"/ssh.args.* >&2
fi
rm -f "$tmp"/ssh.args.*
LOOM_AUTH_KEY='two
lines' PATH="$tmp/bin:$PATH" run -H fakehost:1 true
if [ $rc -ne 0 ] && grep -q 'LOOM_AUTH_KEY_FILE' "$tmp/err" && ! ls "$tmp"/ssh.args.* >/dev/null 2>&1; then
    pass "a secret with a newline is refused, pointing to LOOM_AUTH_KEY_FILE"
else
    fail "secret with a newline (rc=$rc)"; dump
fi

PATH="$tmp/bin:$PATH" run -H fakehost:3 "$top_builddir/examples/allreduce"
if [ $rc -eq 0 ] && [ "$(grep -c 'allreduce OK' "$tmp/out")" -eq 3 ]; then
    pass "a job of 3 remote ranks meets through loomrun's store"
else
    fail "remote allreduce (rc=$rc)"; dump
fi

# A death by signal over there is reported as such.
PATH="$tmp/bin:$PATH" run -H fakehost:2 \
    sh -c 'if [ $LOOM_RANK = 1 ]; then kill -9 $$; fi; exec sleep 30'
if [ $rc -eq 137 ] &&
   grep -qx 'loomrun: rank 1 on host fakehost was killed by signal SIGKILL (9)' "$tmp/err"; then
    pass "remote rank killed: reported with its host, exit 137"
else
    fail "remote signal death (rc=$rc)"; dump
fi

# SIGTERM to loomrun travels over ssh's stdin; the remote rank gets SIGTERM.
PATH="$tmp/bin:$PATH" "$LOOMRUN" -H fakehost:2 \
    sh -c 'trap "echo got TERM; exit 9" TERM; echo ready; while :; do sleep 0.1; done' \
    >"$tmp/out" 2>"$tmp/err" </dev/null &
lr=$!
i=0
while [ $i -lt 600 ] && [ "$(grep -c ready "$tmp/out")" -lt 2 ]; do
    i=$((i + 1))
    sleep 0.1
done
kill -TERM $lr
wait $lr
rc=$?
if [ $rc -eq 143 ] && [ "$(grep -c 'got TERM' "$tmp/out")" -eq 2 ]; then
    pass "SIGTERM forwarded to remote ranks by name"
else
    fail "SIGTERM to remote ranks (rc=$rc)"; dump
fi

start=$(date +%s)
LOOMRUN_TEST_SSH=fail PATH="$tmp/bin:$PATH" run -H fakehost:2 true
if [ $rc -eq 255 ] && [ "$(date +%s)" -lt $((start + 5)) ] &&
   grep -qx 'loomrun: cannot reach host fakehost: ssh: connect to host fakehost port 22: Connection refused' \
       "$tmp/err" && [ "$(grep -c . "$tmp/err")" -eq 1 ] && [ ! -s "$tmp/out" ]; then
    pass "ssh cannot connect: \"cannot reach host\" with ssh's reason, exit 255"
else
    fail "ssh failure (rc=$rc)"; dump
fi

start=$(date +%s)
LOOMRUN_TEST_SSH=hang PATH="$tmp/bin:$PATH" run --timeout 1 -H fakehost:1 true
elapsed=$(($(date +%s) - start))
if [ $rc -eq 255 ] && [ $elapsed -lt 6 ] &&
   grep -qx 'loomrun: cannot reach host fakehost: no answer within 1 s' "$tmp/err"; then
    pass "host that does not answer: given up after --timeout (${elapsed} s)"
else
    fail "silent host (rc=$rc, ${elapsed} s)"; dump
fi

# The same two hosts in an elastic job: ssh's reason reaches the report, and
# a silent host is given up after --timeout and blacklisted like a crash
# (the fake ssh would hang 60 s). With no host left the job fails.
LOOMRUN_TEST_SSH=fail PATH="$tmp/bin:$PATH" run --elastic -np 1 -H fakehost:1 true
if [ $rc -ne 0 ] &&
   grep -qx 'loomrun: cannot reach host fakehost: ssh: connect to host fakehost port 22: Connection refused' \
       "$tmp/err" && grep -q 'host fakehost blacklisted' "$tmp/err"; then
    pass "elastic: ssh cannot connect: the report gives ssh's reason, the host is blacklisted"
else
    fail "elastic ssh failure (rc=$rc)"; dump
fi

start=$(date +%s)
LOOMRUN_TEST_SSH=hang PATH="$tmp/bin:$PATH" run --elastic --timeout 1 -np 1 -H fakehost:1 true
elapsed=$(($(date +%s) - start))
if [ $rc -ne 0 ] && [ $elapsed -lt 40 ] &&
   grep -qx 'loomrun: cannot reach host fakehost: no answer within 1 s; rank 0 given up' "$tmp/err" &&
   grep -q 'host fakehost blacklisted' "$tmp/err"; then
    pass "elastic: a host that does not answer is given up after --timeout (${elapsed} s)"
else
    fail "elastic silent host (rc=$rc, ${elapsed} s)"; dump
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
expect_usage_error "-np above the slots" -np 5 -H localhost:2,127.0.0.1:2 true
expect_usage_error "-H slots not a number" -H localhost:two true
expect_usage_error "-H slots 0" -H localhost:0 true
expect_usage_error "-H empty host" -H localhost:1,,127.0.0.1 true
expect_usage_error "-H and --hostfile" -H localhost --hostfile "$tmp/hostfile" true
expect_usage_error "--hostfile missing" --hostfile "$tmp/no-such-hostfile" true
printf 'localhost slots=2 cpus=4\n' >"$tmp/badhosts"
expect_usage_error "--hostfile unknown word" --hostfile "$tmp/badhosts" true
: >"$tmp/nohosts"
expect_usage_error "--hostfile without hosts" --hostfile "$tmp/nohosts" true
expect_usage_error "--ssh-port not a port" -H localhost --ssh-port 70000 true
expect_usage_error "-x not a variable name" -np 1 -x 'A-B=1' true
expect_usage_error "--max-np all without hosts to fill" --elastic -np 2 --max-np all true
expect_usage_error "--max-np neither a count nor all" --elastic -np 2 --max-np every true

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
