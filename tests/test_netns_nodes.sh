#!/bin/sh
# test_netns_nodes.sh - the collective matrix on emulated nodes that are
# network namespaces (tests/netns/testbed.sh): 2 nodes x 2 ranks and 3 nodes
# x 2 ranks, each rank started inside its node's namespace with the node's
# LOOM_HOST_ID, so ranks of a node talk through shared memory and nodes over
# the bridge (TCP), and the hierarchical algorithms take their two-level
# paths. Every algorithm is forced in turn and the automatic choice runs too
# (tests/mp_collectives --launched). Automake TESTS protocol: 0 pass, 1 fail,
# 77 skip (not root, or no network namespaces here).
# shellcheck disable=SC2086
set -u

NAME=test_netns_nodes
. "$(cd "${top_srcdir:-.}" && pwd)/tests/netns/lib.sh"
matrix=$builddir/tests/mp_collectives
[ -x "$matrix" ] || { echo "test_netns_nodes: $matrix is not built" >&2; exit 1; }

netns_up 3

npass=0
nfail=0
# run NODES PER_NODE: the matrix on NODES namespaces with PER_NODE ranks each;
# rank 0 (in namespace 0) serves the store.
run() {
    nodes=$1 per=$2 n=$(($1 * $2))
    port=$((20000 + $$ % 20000))
    pids=""
    r=0
    while [ $r -lt $n ]; do
        node=$((r / per))
        "$testbed" exec $node env LOOM_RANK=$r LOOM_SIZE=$n LOOM_JOB_ID="nodes$nodes-$$" \
            LOOM_STORE="tcp://$LOOMTB_NET.1:$port" LOOM_HOST_ID="node$node" LOOM_TIMEOUT=120 \
            "$matrix" --launched >"$tmp/out.$r" 2>&1 &
        pids="$pids $!"
        r=$((r + 1))
    done
    ok=1
    for p in $pids; do
        wait "$p" || ok=0
    done
    pids=""
    if [ $ok = 1 ] && grep -qx "collective matrix OK on $n ranks ($nodes nodes)" "$tmp/out.0"; then
        echo "PASS collective matrix on $nodes namespaces x $per ranks"
        npass=$((npass + 1))
    else
        echo "FAIL collective matrix on $nodes namespaces x $per ranks"
        tail -n 5 "$tmp"/out.* | head -n 40
        nfail=$((nfail + 1))
    fi
}
run 2 2
run 3 2
echo "$npass passed, $nfail failed"
[ $nfail -eq 0 ]
