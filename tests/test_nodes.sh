#!/bin/sh
# The collective matrix on emulated nodes (LOOM_HOST_ID per rank, see
# tests/mp_util.h): 2x2 and 3x2 ranks, every algorithm forced (hierarchical
# takes its two-level path here, the flat ones ignore the topology) and
# allreduce once more with the automatic choice, which picks hierarchical from
# 256 KiB. About 40 s on 2 cores.
set -u
top_builddir=${top_builddir:-.}
prog="$top_builddir/tests/mp_collectives"
[ -x "$prog" ] || { echo "missing $prog"; exit 1; }
LOOM_MP_NODES=2 LOOM_MP_SIZES="4 6" "$prog"
