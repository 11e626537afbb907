#!/bin/sh
# test_netns_flowcap.sh - the test bed's capped link (tests/netns/testbed.sh
# --rate 800mbit --flow-rate 200mbit) does what it says: one TCP flow between
# two namespaces (loom-perf p2p -t tcp) stays under the flow cap, while four
# flows at once move more than one flow may, and no more than the link; and
# one job with LOOM_SOCKETS_PER_PEER=4 moves clearly more than with 1. The
# bounds are loose (a loaded machine may be slower, never faster). Automake
# TESTS protocol: 0 pass, 1 fail, 77 skip (not root, no namespaces, no tc).
# shellcheck disable=SC2086
set -u

NAME=test_netns_flowcap
. "$(cd "${top_srcdir:-.}" && pwd)/tests/netns/lib.sh"
command -v tc >/dev/null || skip "no tc (apt-get install iproute2)"
perf=$builddir/tools/loom-perf
[ -x "$perf" ] || { echo "test_netns_flowcap: $perf is not built" >&2; exit 1; }
LINK_MBS=100     # 800 Mbit/s in MB/s
FLOW_MBS=25      # 200 Mbit/s

netns_up 2 --rate 800mbit --flow-rate 200mbit

# flows K: K loom-perf p2p pairs at once from namespace 0 to 1, each its own
# job and connection (3 windows of 64 x 256 KiB); prints the flows' MB/s, one
# a line, then the bytes all moved over the wall time.
flows() {
    k=$1
    pids=""
    start=$(date +%s.%N)
    j=0
    while [ $j -lt $k ]; do
        port=$((21000 + $$ % 20000 + j))
        for r in 0 1; do
            "$testbed" exec $r env LOOM_RANK=$r LOOM_SIZE=2 LOOM_JOB_ID="flow$j-$$" \
                LOOM_STORE="tcp://$LOOMTB_NET.1:$port" LOOM_HOST_ID="node$r" LOOM_TIMEOUT=60 \
                timeout 120 "$perf" p2p -t tcp -b 256K -e 256K -n 2 -w 1 >"$tmp/flow.$j.$r" 2>&1 &
            pids="$pids $!"
        done
        j=$((j + 1))
    done
    ok=1
    for p in $pids; do
        wait "$p" || ok=0
    done
    pids=""
    end=$(date +%s.%N)
    [ $ok = 1 ] || { echo "a flow failed:" >&2; cat "$tmp"/flow.* >&2; return 1; }
    j=0
    while [ $j -lt $k ]; do
        awk '$1 == 262144 { print $3 }' "$tmp/flow.$j.0"
        j=$((j + 1))
    done
    # 3 windows (one warm-up) of 64 x 256 KiB per flow.
    awk -v k="$k" -v s="$start" -v e="$end" 'BEGIN { printf "%.1f\n", k * 3 * 64 * 262144 / (e - s) / 1e6 }'
}

# streams S: one loom-perf p2p job from namespace 0 to 1 over S TCP streams
# per peer (LOOM_SOCKETS_PER_PEER; its 256 KiB messages are striped, the
# default LOOM_STRIPE_MIN_BYTES); prints its MB/s.
streams() {
    s=$1
    port=$((21000 + $$ % 20000 + 10 + s))
    pids=""
    for r in 0 1; do
        "$testbed" exec $r env LOOM_RANK=$r LOOM_SIZE=2 LOOM_JOB_ID="streams$s-$$" \
            LOOM_STORE="tcp://$LOOMTB_NET.1:$port" LOOM_HOST_ID="node$r" LOOM_TIMEOUT=60 \
            LOOM_SOCKETS_PER_PEER=$s \
            timeout 120 "$perf" p2p -t tcp -b 256K -e 256K -n 2 -w 1 >"$tmp/streams.$s.$r" 2>&1 &
        pids="$pids $!"
    done
    ok=1
    for p in $pids; do
        wait "$p" || ok=0
    done
    pids=""
    [ $ok = 1 ] || { echo "the $s-stream job failed:" >&2; cat "$tmp"/streams.$s.* >&2; return 1; }
    awk '$1 == 262144 { print $3 }' "$tmp/streams.$s.0"
}

fail=0
one=$(flows 1) || exit 1
rate=$(echo "$one" | head -n 1)
if awk -v r="$rate" -v c="$FLOW_MBS" 'BEGIN { exit !(r > 0 && r <= 1.2 * c) }'; then
    echo "PASS one flow: $rate MB/s, under the $FLOW_MBS MB/s flow cap"
else
    echo "FAIL one flow: $rate MB/s, the flow cap is $FLOW_MBS MB/s"
    fail=1
fi
four=$(flows 4) || exit 1
each=$(echo "$four" | head -n 4 | tr '\n' ' ')
total=$(echo "$four" | tail -n 1)
if echo "$four" | head -n 4 | awk -v c="$FLOW_MBS" '$1 > 1.2 * c { bad = 1 } END { exit bad }' &&
   awk -v t="$total" -v c="$FLOW_MBS" -v l="$LINK_MBS" 'BEGIN { exit !(t >= 1.5 * c && t <= 1.2 * l) }'; then
    echo "PASS four flows: $each MB/s each, $total MB/s together (flow cap $FLOW_MBS, link $LINK_MBS)"
else
    echo "FAIL four flows: $each MB/s each, $total MB/s together (flow cap $FLOW_MBS, link $LINK_MBS)"
    fail=1
fi
# One job striping over 4 streams gets what four flows get; over 1 stream it
# stays under the flow cap.
s1=$(streams 1) || exit 1
s4=$(streams 4) || exit 1
if awk -v a="$s1" -v b="$s4" -v c="$FLOW_MBS" -v l="$LINK_MBS" \
       'BEGIN { exit !(a > 0 && a <= 1.2 * c && b >= 1.5 * c && b >= 1.5 * a && b <= 1.2 * l) }'; then
    echo "PASS LOOM_SOCKETS_PER_PEER: 1 stream $s1 MB/s, 4 streams $s4 MB/s (flow cap $FLOW_MBS, link $LINK_MBS)"
else
    echo "FAIL LOOM_SOCKETS_PER_PEER: 1 stream $s1 MB/s, 4 streams $s4 MB/s (flow cap $FLOW_MBS, link $LINK_MBS)"
    fail=1
fi
exit $fail
