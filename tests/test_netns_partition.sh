#!/bin/sh
# test_netns_partition.sh - a network partition in the middle of a job: 2
# emulated nodes (network namespaces, tests/netns/testbed.sh) x 2 ranks, the
# ranks of a node on shared memory, the nodes over TCP, all in a loop of
# allreduces (loom-perf). Once data flows between the nodes, node 1's link is
# cut (its veth goes down: no RST, no FIN, packets simply vanish, as when a
# switch port dies). Each side then sees the other stop answering; every rank
# must fail within LOOM_TIMEOUT + 3 s of the cut, naming a rank of the other
# node (not a rank of its own node that only passed the news on). Prints each
# rank's end time. Automake TESTS protocol: 0 pass, 1 fail, 77 skip (not root,
# or no network namespaces here).
set -u

NAME=test_netns_partition
. "$(cd "${top_srcdir:-.}" && pwd)/tests/netns/lib.sh"
perf=$builddir/tools/loom-perf
[ -x "$perf" ] || { echo "test_netns_partition: $perf is not built" >&2; exit 1; }
timeout_s=${PARTITION_TIMEOUT:-4}
slack_s=3

netns_up 2
cut_dev=lmv${LOOMTB_PREFIX#loomt}-1

now() { date +%s.%N; }

# Each rank runs in its node's namespace; a wrapper records when it ended, so
# the end times are the processes' own, not when this script got round to them.
port=$((20000 + $$ % 20000))
r=0
while [ $r -lt 4 ]; do
    node=$((r / 2))
    (
        "$testbed" exec $node env LOOM_RANK=$r LOOM_SIZE=4 LOOM_JOB_ID="partition-$$" \
            LOOM_STORE="tcp://$LOOMTB_NET.1:$port" LOOM_HOST_ID="node$node" \
            LOOM_TIMEOUT="$timeout_s" \
            "$perf" allreduce -b 64K -e 64K -n 1000000 -w 0 -c 0 >"$tmp/out.$r" 2>&1
        echo "$? $(now)" >"$tmp/end.$r"
    ) &
    pids="$pids $!"
    r=$((r + 1))
done

# The event to cut on: allreduce traffic through node 1's link (connections
# made and collectives running), bounded by 60 s for slow, loaded machines.
rx_bytes() { cat "/sys/class/net/$cut_dev/statistics/rx_bytes" 2>/dev/null || echo 0; }
waited=0
while [ "$(rx_bytes)" -lt 20000000 ]; do
    if [ $waited -ge 600 ]; then
        echo "FAIL no allreduce traffic through $cut_dev within 60 s"
        tail -n 5 "$tmp"/out.*
        exit 1
    fi
    sleep 0.1
    waited=$((waited + 1))
done
cut_at=$(now)
ip link set "$cut_dev" down || { echo "FAIL could not cut $cut_dev"; exit 1; }

# Every rank must end by LOOM_TIMEOUT + slack; give them twice that before
# calling it a hang (they are killed by cleanup then).
limit=$(( (timeout_s + slack_s) * 2 * 10 ))
waited=0
while [ $waited -lt $limit ]; do
    ended=$(ls "$tmp"/end.* 2>/dev/null | wc -l)
    [ "$ended" -eq 4 ] && break
    sleep 0.1
    waited=$((waited + 1))
done

fail=0
r=0
while [ $r -lt 4 ]; do
    node=$((r / 2))
    other=$((1 - node))
    if [ ! -f "$tmp/end.$r" ]; then
        echo "# rank $r (node $node) still running $((limit / 10)) s after the cut"
        fail=1
        r=$((r + 1))
        continue
    fi
    read -r status end_at <"$tmp/end.$r"
    after=$(echo "$end_at $cut_at" | awk '{ printf "%.2f", $1 - $2 }')
    msg=$(grep -m1 -e "failed" -e "error" "$tmp/out.$r" | cut -c1-300)
    echo "# rank $r (node $node) ended $after s after the cut, status $status: $msg"
    # The blamed rank must be on the other node: rank 2*other or 2*other+1.
    named=0
    for v in $((2 * other)) $((2 * other + 1)); do
        if grep -q -e "rank $v stopped answering" -e "rank $v was lost" \
            -e "lost rank $v:" -e "lost the connection to rank $v:" "$tmp/out.$r"; then
            named=1
        fi
    done
    if [ "$status" = 0 ]; then
        echo "#   ... but it reported success"
        fail=1
    elif [ $named = 0 ]; then
        echo "#   ... without naming a rank of node $other"
        fail=1
    elif awk -v a="$after" -v l=$((timeout_s + slack_s)) 'BEGIN { exit !(a > l) }'; then
        echo "#   ... later than LOOM_TIMEOUT ($timeout_s s) + $slack_s s"
        fail=1
    fi
    r=$((r + 1))
done
pids=""
if [ $fail = 0 ]; then
    echo "PASS partition of 2 nodes x 2 ranks: every rank fails within LOOM_TIMEOUT ($timeout_s s) + $slack_s s, naming a rank of the other node"
    echo "1 passed, 0 failed"
else
    echo "FAIL partition of 2 nodes x 2 ranks"
    for f in "$tmp"/out.*; do
        echo "== $f"
        tail -n 5 "$f"
    done
    echo "0 passed, 1 failed"
fi
exit $fail
