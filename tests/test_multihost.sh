#!/bin/sh
# test_multihost.sh - loomrun across hosts for real, on one machine: two
# network namespaces (tests/netns/testbed.sh) each run their own sshd, and
# loomrun, in the root namespace, starts ranks in them over ssh. Checks: the
# collective matrix on 4 ranks counts 2 nodes (LOOM_HOST_ID), the remote
# ranks' environment, -x, --wdir, --ssh-port and --output-filename; a rank
# killed remotely ends the job with a line naming it; SIGTERM to loomrun
# reaches the remote ranks; a remote rank dies with its ssh connection; an
# unreachable host ends the job in time with "cannot reach host".
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip (not root, no network
# namespaces, no sshd).
#
# The ranks' $VARs sit in single quotes on purpose (their sh expands them),
# lists of pids are split into words on purpose, and cleanup runs from a trap.
# shellcheck disable=SC2016,SC2086,SC2317
set -u

skip() {
    echo "test_multihost: SKIP: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, sshd)"
[ -x /usr/sbin/sshd ] || skip "no /usr/sbin/sshd (apt-get install openssh-server)"
for t in ssh ssh-keygen ip; do
    command -v "$t" >/dev/null || skip "no $t (apt-get install openssh-client iproute2)"
done
real_ssh=$(command -v ssh)

# Absolute paths: the ranks run in other namespaces, found there through the
# shared file system.
builddir=$(cd "${top_builddir:-.}" && pwd)
srcdir=$(cd "${top_srcdir:-.}" && pwd)
LOOMRUN=$builddir/tools/loomrun
matrix=$builddir/tests/mp_collectives
testbed=$srcdir/tests/netns/testbed.sh
for f in "$LOOMRUN" "$matrix"; do
    [ -x "$f" ] || { echo "test_multihost: $f is not built" >&2; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_multihost.XXXXXX") || exit 1
sshd_pids=""
cleanup() {
    for p in $sshd_pids; do
        kill "$p" 2>/dev/null
    done
    [ -n "${LOOMTB_PREFIX:-}" ] && "$testbed" down "$LOOMTB_PREFIX"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

up=$("$testbed" up 2 --rate 1gbit 2>"$tmp/up.err")
rc=$?
if [ $rc -ne 0 ]; then
    cat "$tmp/up.err" >&2
    [ $rc -eq 77 ] && skip "$(cat "$tmp/up.err")"
    echo "test_multihost: the testbed did not come up" >&2
    exit 1
fi
eval "$up"
A=$LOOMTB_NET.1
B=$LOOMTB_NET.2
echo "testbed $LOOMTB_PREFIX: hosts $A and $B, this machine $LOOMTB_NET.254"

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
dump() {
    echo "--- stdout:" >&2; cat "$tmp/out" >&2
    echo "--- stderr:" >&2; cat "$tmp/err" >&2
}

# ---- sshd in each namespace -------------------------------------------------
# Throw-away keys: one host key for both, one client key authorized for root.
ssh-keygen -q -t ed25519 -N '' -C loom-test-host -f "$tmp/host_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -C loom-test-client -f "$tmp/id" || exit 1
cp "$tmp/id.pub" "$tmp/authorized_keys"
mkdir -p /run/sshd   # sshd's privilege separation directory
for i in 0 1; do
    # StrictModes would refuse keys under /tmp, which everyone can write.
    cat >"$tmp/sshd_$i.conf" <<EOF
ListenAddress $LOOMTB_NET.$((i + 1))
Port 22
Port 2222
HostKey $tmp/host_key
PidFile $tmp/sshd_$i.pid
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
EOF
    "$testbed" exec $i /usr/sbin/sshd -D -e -f "$tmp/sshd_$i.conf" 2>"$tmp/sshd_$i.log" &
    sshd_pids="$sshd_pids $!"
done

# loomrun finds ssh in PATH: this one keeps the test's host keys out of
# root's ~/.ssh/known_hosts (and ignores root's ssh config).
mkdir "$tmp/bin"
cat >"$tmp/ssh_config" <<EOF
UserKnownHostsFile $tmp/known_hosts
GlobalKnownHostsFile /dev/null
EOF
printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$real_ssh" "$tmp/ssh_config" >"$tmp/bin/ssh"
chmod +x "$tmp/bin/ssh"
PATH=$tmp/bin:$PATH
export PATH

# Wait for both sshds to take logins.
for h in $A $B; do
    i=0
    until ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=2 \
          -i "$tmp/id" "$h" true 2>"$tmp/ssh.err"; do
        i=$((i + 1))
        if [ $i -ge 50 ]; then
            echo "test_multihost: sshd on $h does not take logins:" >&2
            cat "$tmp/ssh.err" "$tmp"/sshd_*.log >&2
            exit 1
        fi
        sleep 0.2
    done
done

# run ARGS...: loomrun with our key, output captured, status in $rc.
run() {
    "$LOOMRUN" --ssh-identity-file "$tmp/id" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    rc=$?
}
# Start loomrun in the background ($lr) with ranks that print their pid and
# wait; return once all N have printed (pids in $pids, by rank).
start_waiting_job() {
    n=$1
    shift
    "$LOOMRUN" --ssh-identity-file "$tmp/id" "$@" sh -c 'echo $$; exec sleep 600' \
        >"$tmp/out" 2>"$tmp/err" </dev/null &
    lr=$!
    # Until every rank said its pid, up to 300 s by the clock (ssh and the ranks
    # start slowly on a busy machine: 60 s, counted in naps, once was not enough).
    t0=$(date +%s)
    while [ $(($(date +%s) - t0)) -lt 300 ] && [ "$(wc -l <"$tmp/out")" -lt "$n" ]; do
        sleep 0.1
    done
    pids=$(sort "$tmp/out" | sed 's/^.*: //')
}
# Nothing but sshd is left in either namespace (waits up to ~30 s: a remote
# rank gets SIGTERM, then SIGKILL 3 s later, and a busy machine is slow to
# reap; the loop ends as soon as the namespaces are clean).
namespaces_clean() {
    for _ in $(seq 150); do
        left=""
        for i in 0 1; do
            for p in $(ip netns pids "$LOOMTB_PREFIX-$i"); do
                case " $sshd_pids " in
                    *" $p "*) ;;
                    *) left="$left $p" ;;
                esac
            done
        done
        [ -z "$left" ] && return 0
        sleep 0.2
    done
    echo "left running in the namespaces:" >&2
    for p in $left; do ps -o pid=,args= -p "$p" >&2; done
    return 1
}
elapsed_since() {
    echo $(($(date +%s) - $1))
}

# ---- the collective matrix on 2 hosts x 2 ranks ------------------------------
start=$(date +%s)
run -H "$A:2,$B:2" "$matrix" --launched
if [ $rc -eq 0 ] && grep -qx '\[0\]<stdout>: collective matrix OK on 4 ranks (2 nodes)' "$tmp/out"
then
    pass "collective matrix OK on 4 ranks (2 nodes) over ssh, in $(elapsed_since "$start") s"
else
    fail "collective matrix over ssh (rc=$rc)"; dump
fi
namespaces_clean || fail "processes left after the matrix"

# ---- this machine and remote hosts in one job --------------------------------
# Our address on the bridge is this machine: its rank is forked here, and it
# must listen where the remote ranks reach it, not on loopback.
run -H "$LOOMTB_NET.254:1,$A:1,$B:1" "$builddir/examples/allreduce"
if [ $rc -eq 0 ] && [ "$(grep -c 'allreduce OK' "$tmp/out")" -eq 3 ]; then
    pass "one local and two remote ranks in one job"
else
    fail "local and remote ranks together (rc=$rc)"; dump
fi

# ---- what a remote rank gets -----------------------------------------------
# Rank 0 on A, ranks 1 and 2 on B; through the second port of each sshd.
mkdir "$tmp/wd"
run -H "$A:1,$B:2" --ssh-port 2222 --wdir "$tmp/wd" --output-filename "$tmp/logs" \
    -x "LOOMRUN_TEST_X=it's a value" \
    sh -c 'echo "$LOOM_RANK $LOOM_SIZE $LOOM_LOCAL_RANK $LOOM_LOCAL_SIZE $LOOM_HOST_ID" \
                "$(pwd)|$LOOMRUN_TEST_X|${SSH_CONNECTION##* }|$LOOM_TIMEOUT"
           echo "$LOOM_STORE $LOOM_JOB_ID" >&2'
expected="[0]<stdout>: 0 3 0 1 $A $tmp/wd|it's a value|2222|${LOOM_TIMEOUT:-}
[1]<stdout>: 1 3 0 2 $B $tmp/wd|it's a value|2222|${LOOM_TIMEOUT:-}
[2]<stdout>: 2 3 1 2 $B $tmp/wd|it's a value|2222|${LOOM_TIMEOUT:-}"
ok=1
[ $rc -eq 0 ] || ok=0
[ "$(sort "$tmp/out")" = "$expected" ] || ok=0
# The store at this machine's address on the bridge, one job id.
[ "$(grep -c "^\[[012]\]<stderr>: tcp://$LOOMTB_NET\.254:[0-9]* [0-9a-f]*\$" "$tmp/err")" -eq 3 ] ||
    ok=0
# Every rank saw the same store and job id. Only those lines: the remote
# login shell may print what the user's rc files say (pyenv's rehash, run by two
# ssh logins at once, complains that the other holds its lock).
[ "$(sed -n 's/^[^:]*: \(tcp:\/\/\)/\1/p' "$tmp/err" | sort -u | wc -l)" -eq 1 ] || ok=0
[ "$(cat "$tmp/logs/rank.2/stdout" 2>/dev/null)" = "2 3 1 2 $B $tmp/wd|it's a value|2222|${LOOM_TIMEOUT:-}" ] ||
    ok=0
grep -q "^tcp://$LOOMTB_NET\.254:" "$tmp/logs/rank.1/stderr" 2>/dev/null || ok=0
if [ $ok -eq 1 ]; then
    pass "remote environment, -x, --wdir, --ssh-port, --output-filename"
else
    fail "remote environment (rc=$rc)"; dump
fi

# ---- a rank killed remotely --------------------------------------------------
start_waiting_job 2 -H "$A:1,$B:1"
p0=$(echo "$pids" | sed -n 1p)
p1=$(echo "$pids" | sed -n 2p)
if [ -n "$p1" ]; then
    # The namespaces share our pid namespace: this is a kill on host B.
    kill -KILL "$p1"
else
    kill -KILL "$lr"   # the ranks never started: fail below, not after the job's sleep
fi
start=$(date +%s)
wait $lr
rc=$?
if [ -n "$p1" ] && [ $rc -eq 137 ] && [ "$(elapsed_since "$start")" -lt 60 ] &&
   grep -qxF "loomrun: rank 1 on host $B was killed by signal SIGKILL (9)" "$tmp/err" &&
   [ "$(grep -c '^loomrun:' "$tmp/err")" -eq 1 ] && namespaces_clean; then
    pass "rank killed on its host: exit 137, named with its host, rank 0 stopped"
else
    fail "remote kill (rc=$rc, pids $p0 $p1)"; dump
fi

# ---- SIGTERM to loomrun reaches the remote ranks ------------------------------
start_waiting_job 2 -H "$A:1,$B:1"
start=$(date +%s)
kill -TERM $lr
wait $lr
rc=$?
if [ "$(echo "$pids" | wc -w)" -eq 2 ] && [ $rc -eq 143 ] &&
   [ "$(elapsed_since "$start")" -lt 60 ] && namespaces_clean; then
    pass "SIGTERM to loomrun ends the remote ranks, exit 143"
else
    fail "SIGTERM forwarding to remote ranks (rc=$rc, pids $(printf '%s ' $pids))"; dump
fi

# ---- the ssh connection goes, the remote rank goes ---------------------------
# SIGKILL leaves loomrun no chance to signal anyone: its ssh clients die
# with it (parent-death signal), and the remote watchers see their stdin end.
start_waiting_job 2 -H "$A:1,$B:1"
kill -KILL $lr
wait $lr 2>/dev/null
if [ "$(echo "$pids" | wc -w)" -eq 2 ] && namespaces_clean; then
    pass "loomrun killed outright: the remote ranks end with their ssh connections"
else
    fail "remote ranks outlived their ssh connections (pids $(printf '%s ' $pids))"; dump
fi

# ---- an unreachable host -----------------------------------------------------
# Nobody has .99 on the bridge: ssh fails (no route to host, or no answer
# within the timeout), before any rank starts there.
start=$(date +%s)
run --timeout 10 -H "$LOOMTB_NET.99:1,$A:1" sh -c 'exec sleep 120'
elapsed=$(elapsed_since "$start")
if [ $rc -ne 0 ] && [ "$elapsed" -le 15 ] &&
   grep -q "^loomrun: cannot reach host $LOOMTB_NET\.99: ." "$tmp/err" && namespaces_clean; then
    pass "unreachable host: exit $rc in ${elapsed} s, \"$(grep 'cannot reach' "$tmp/err")\""
else
    fail "unreachable host (rc=$rc, ${elapsed} s)"; dump
fi

echo "$passes passed, $failures failed"
if [ $failures -ne 0 ]; then
    echo "--- sshd logs:" >&2
    cat "$tmp"/sshd_*.log >&2
    exit 1
fi
exit 0
