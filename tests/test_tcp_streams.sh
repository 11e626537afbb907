#!/bin/sh
# test_tcp_streams.sh - with several TCP streams per peer (LOOM_SOCKETS_PER_PEER=4),
# losing any one of a pair's connections fails the pair at once: `ss -K`
# resets one of rank 1's connections to rank 0 while two ranks run allreduces
# (16 MiB ones, striped, and 8-byte ones, which leave streams 1-3 idle); both
# ranks must fail with PEER_LOST within seconds, not at LOOM_TIMEOUT (30 s).
# The 8-byte run is repeated once per connection, so the stream that carries
# the frames and every striping stream are each cut once, whatever order the
# kernel gave their ports. Automake TESTS protocol: 0 pass, 1 fail, 77 skip
# (not root, or no `ss` that can kill sockets).
# shellcheck disable=SC2086
set -u
skip() {
    echo "test_tcp_streams: SKIP: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (ss -K)"
command -v ss >/dev/null || skip "no ss (apt-get install iproute2)"
command -v pgrep >/dev/null || skip "no pgrep (apt-get install procps)"
top_builddir=${top_builddir:-.}
perf=$top_builddir/tools/loom-perf
[ -x "$perf" ] || { echo "test_tcp_streams: $perf is not built" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_tcp_streams.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
passed=0
run=0

now() { date +%s.%N; }

# cut SIZE PICK NAME: run 2 ranks of loom-perf allreduce at SIZE bytes, then reset
# rank 1's PICK-th connection to rank 0 (in order of its local port).
cut() {
    size=$1 pick=$2 name=$3
    run=$((run + 1))
    port=$((23000 + ($$ * 7 + run) % 20000))
    pids=""
    for r in 0 1; do
        LOOM_RANK=$r LOOM_SIZE=2 LOOM_STORE="tcp://127.0.0.1:$port" LOOM_JOB_ID="cut$$-$run" \
            LOOM_SHM=0 LOOM_TIMEOUT=30 LOOM_SOCKETS_PER_PEER=4 \
            timeout 120 "$perf" allreduce -b "$size" -e "$size" -n 100000000 -w 0 -c 0 \
            >"$tmp/out.$r" 2>&1 &
        pids="$pids $!"
    done
    set -- $pids
    # Rank 1's connections other than the store's, once all four are up.
    conns=""
    i=0
    while [ $i -lt 100 ]; do
        rp=$(pgrep -P "$2" | head -n 1)
        if [ -n "$rp" ]; then
            conns=$(ss -tnpH state established 2>/dev/null | grep "pid=$rp," |
                awk -v sp=":$port" '$4 !~ sp"$" { print $3 }' | sort -t: -k2 -n)
            [ "$(echo "$conns" | grep -c :)" = 4 ] && break
        fi
        sleep 0.1
        i=$((i + 1))
    done
    victim=$(echo "$conns" | sed -n "${pick}p")
    if [ -z "$victim" ] || [ "$(echo "$conns" | grep -c :)" != 4 ]; then
        kill $pids 2>/dev/null
        wait
        echo "FAIL $name: rank 1 never had 4 connections to rank 0: $conns"
        cat "$tmp/out.0" "$tmp/out.1"
        fail=1
        return
    fi
    sleep 0.5   # well inside the run
    t0=$(now)
    if ! ss -K -tn state established "( sport = :${victim##*:} )" >/dev/null 2>"$tmp/ss.err" ||
       ss -tnH state established "( sport = :${victim##*:} )" | grep -q .; then
        kill $pids 2>/dev/null
        wait
        skip "ss -K cannot reset sockets here (a kernel without CONFIG_INET_DIAG_DESTROY?): $(cat "$tmp/ss.err")"
    fi
    wait "$1"
    rc0=$?
    wait "$2"
    rc1=$?
    took=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
    if [ $rc0 != 0 ] && [ $rc0 != 124 ] && [ $rc1 != 0 ] && [ $rc1 != 124 ] &&
       grep -q "peer lost" "$tmp/out.0" && grep -q "peer lost" "$tmp/out.1" &&
       awk -v t="$took" 'BEGIN { exit !(t < 10) }'; then
        echo "PASS $name: both ranks fail in $took s: $(grep -h 'peer lost' "$tmp/out.0" "$tmp/out.1" | sed 's/.*failed: //' | tr '\n' ';')"
        passed=$((passed + 1))
    else
        echo "FAIL $name: exit codes $rc0 $rc1 after $took s"
        cat "$tmp/out.0" "$tmp/out.1"
        fail=1
    fi
}

cut 16M 4 "a connection reset during 16 MiB allreduces (striped)"
for k in 1 2 3 4; do
    cut 8 $k "connection $k of 4 reset during 8-byte allreduces (streams 1-3 idle)"
done
echo "$passed passed, $((run - passed)) failed"
exit $fail
