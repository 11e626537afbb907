#!/bin/sh
# loom-perf: every collective on 1 to 5 ranks, every type and op (and root), each
# result checked by loom-perf itself; the output must keep nccl-tests' layout,
# which scripts parse. Also: --json/--csv/--plot files, -z 1, -c 0, p2p, and
# the exits for a bad flag and for a Loom error.
set -u
top_builddir=${top_builddir:-.}
perf="$top_builddir/tools/loom-perf"
loomrun="$top_builddir/tools/loomrun"
[ -x "$perf" ] || { echo "missing $perf"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
result() {
    if [ "$1" = 0 ]; then echo "PASS $2"; passed=$((passed + 1)); else echo "FAIL $2"; failed=$((failed + 1)); fi
}

# Rank 0's stdout without loomrun's prefix, into $tmp/out; returns loom-perf's status.
run() {
    np=$1
    shift
    "$loomrun" -np "$np" "$perf" "$@" > "$tmp/raw" 2> "$tmp/err"
    rc=$?
    sed -n 's/^\[0\]<stdout>: //p' "$tmp/raw" > "$tmp/out"
    return $rc
}

# Check $tmp/out: every line a "#" comment or a 13-field row with #wrong 0
# ($2: "ip-na" lets the in-place #wrong be N/A), exactly $1 rows, the footer.
check_table() {
    awk -v want="$1" -v mode="${2:-}" '
        BEGIN { num = "^-?[0-9]+(\\.[0-9]+)?(e[-+][0-9]+)?$"; intre = "^-?[0-9]+$"
                types = " int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 none "
                ops = " sum prod max min avg band bor bxor none " }
        /^#/ { if ($0 ~ /^# Out of bounds values : 0 OK$/) ok = 1
               if ($0 ~ /^# Avg bus bandwidth    : [0-9.e+-]+$/) avg = 1
               if ($0 ~ /^#  *size  *count  *type  *redop  *root  *time  *algbw  *busbw  *#wrong  *time  *algbw  *busbw  *#wrong$/) hdr = 1
               next }
        { rows++
          if (NF != 13) { print "bad row (" NF " fields): " $0; bad++; next }
          if ($1 !~ intre || $2 !~ intre || $5 !~ intre || index(types, " " $3 " ") == 0 ||
              index(ops, " " $4 " ") == 0) { print "bad row: " $0; bad++; next }
          for (i = 6; i <= 12; i++)
              if (i != 9 && $i !~ num) { print "bad number in row: " $0; bad++; next }
          if ($9 != "0" || !($13 == "0" || (mode == "ip-na" && $13 == "N/A"))) {
              print "wrong elements: " $0; bad++ } }
        END { if (!hdr) { print "no column header"; bad++ }
              if (!ok) { print "no \"Out of bounds values : 0 OK\" line"; bad++ }
              if (!avg) { print "no \"Avg bus bandwidth\" line"; bad++ }
              if (rows != want) { print rows " rows, expected " want; bad++ }
              exit bad != 0 }' "$tmp/out"
}

# Sizes 8, 64, 512, 4K, 32K: 5 rows per type x op x root. 10 types x 5 arithmetic
# ops, and the 3 bitwise ops on the 6 integer types: 68 type-op pairs.
for np in 1 2 3 4 5; do
    for coll in allreduce broadcast reduce allgather reduce_scatter alltoall gather scatter sendrecv barrier; do
        rows=50
        mode=
        case $coll in
            allreduce|reduce_scatter) rows=340 ;;
            reduce) rows=$((340 * np)) ;;
            broadcast|gather|scatter) rows=$((50 * np)) ;;
            sendrecv) mode=ip-na ;;
            barrier) rows=1 ;;
        esac
        run "$np" "$coll" -b 8 -e 64K -f 8 -n 2 -w 1 -c 1 -d all -o all -r all &&
            check_table "$rows" $mode
        rc=$?
        [ $rc = 0 ] || { head -20 "$tmp/out"; cat "$tmp/err"; }
        result $rc "loom-perf $coll on $np ranks, all types, ops and roots, checked"
    done
done

# The whole layout of a small run, byte for byte where nccl-tests fixes it.
run 2 allreduce -b 1K -e 1K -n 2 -w 1
rc=$?
awk 'NR == 1 && !/^# Loom loom-perf version [0-9]+\.[0-9]+\.[0-9]+$/ { bad = 1 }
     NR == 2 && $0 != "# Collective test starting: allreduce" { bad = 1 }
     NR == 3 && $0 != "# nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 step: 2(factor) warmup iters: 1 iters: 2 agg iters: 1 validation: 1 graph: 0" { bad = 1 }
     /^#  Rank  [01] Group  0 Pid +[0-9]+ on .* device -1 \[cpu\] host memory$/ { ranks++ }
     !/^#/ { row = $0 }
     END { if (ranks != 2 || bad || $0 != "# Collective test concluded: allreduce") exit 1
           # "%12zu  %12zu  %8s  %6s  %6s" and twice "  %7s  %6s  %6s  %6s"
           if (length(row) != 12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6 + 2 * (2 + 7 + 2 + 6 + 2 + 6 + 2 + 6)) exit 1
           if (substr(row, 1, 52) != sprintf("%12s  %12s  %8s  %6s  %6s", 1024, 256, "float", "sum", -1)) exit 1 }' "$tmp/out" ||
    rc=1
[ $rc = 0 ] || cat "$tmp/out" "$tmp/err"
result $rc "output layout: header, device lines, row widths, footer"

# Machine-readable output and the plot.
run 3 allgather -b 64 -e 4K -f 4 -n 2 -w 1 --json "$tmp/r.json" --csv "$tmp/r.csv" --plot "$tmp/r.svg"
rc=$?
if [ $rc = 0 ] && command -v python3 > /dev/null 2>&1; then
    python3 -c '
import csv, json, sys
d = json.load(open(sys.argv[1]))
assert d["collective"] == "allgather" and d["nranks"] == 3 and len(d["devices"]) == 3
assert len(d["results"]) == 4 and d["out_of_bounds"]["okay"] is True
for r in d["results"]:
    assert r["out_of_place"]["nwrong"] == 0 and r["in_place"]["nwrong"] == 0
    assert r["out_of_place"]["bus_bw"] >= 0 and r["redop"] == "none" and r["root"] == -1
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(rows) == 4 and rows[0]["size"] == "60" and rows[0]["oop_nwrong"] == "0"
' "$tmp/r.json" "$tmp/r.csv"
    rc=$?
elif [ $rc = 0 ]; then
    grep -q '"results"' "$tmp/r.json" && [ "$(wc -l < "$tmp/r.csv")" -eq 5 ]
    rc=$?
fi
result $rc "--json and --csv write files that parse"
[ -s "$tmp/r.svg" ] && [ "$(head -c 4 "$tmp/r.svg")" = "<svg" ] && [ "$(tail -n 1 "$tmp/r.svg")" = "</svg>" ] &&
    grep -q '<polyline' "$tmp/r.svg" && grep -q 'in-place' "$tmp/r.svg"
result $? "--plot writes an SVG with a polyline per series"

# Non-blocking calls, -c 0 (#wrong is N/A), -i steps, -a 3.
run 3 reduce_scatter -z 1 -b 96 -e 1000 -i 300 -n 3 -w 1 -d int32 -o max -c 0 -a 3 &&
    grep -q '^# Non-blocking' "$tmp/out" &&
    [ "$(grep -c '^ *[0-9].*N/A  *[0-9.]*  *[0-9.]*  *[0-9.]*  *N/A$' "$tmp/out")" = 4 ] &&
    grep -q 'step: 300(bytes)' "$tmp/out"
rc=$?
[ $rc = 0 ] || cat "$tmp/out" "$tmp/err"
result $rc "-z 1 (loom_i* calls), -c 0, -i 300, -a 3"

run 4 allreduce -z 1 -b 8 -e 64K -f 8 -n 2 -w 1 -d all -o all && check_table 340
result $? "-z 1 on 4 ranks: every type and op right"

# p2p between ranks 0 and 1; rank 2 waits.
run 3 p2p -t tcp -b 1 -e 64K -f 16 -n 3 -w 1 --json "$tmp/p.json"
rc=$?
[ $rc = 0 ] && grep -q '^#       size   latency(us)   bandwidth(MB/s)$' "$tmp/out" &&
    [ "$(grep -c '^ *[0-9][0-9]*  *[0-9.][0-9.]*  *[0-9.][0-9.]*$' "$tmp/out")" = 5 ] &&
    grep -q '"latency_us"' "$tmp/p.json"
rc=$?
[ $rc = 0 ] || cat "$tmp/out" "$tmp/err"
result $rc "p2p on 3 ranks: latency and bandwidth rows"

run 1 p2p
[ $? = 2 ] && grep -q 'p2p needs at least 2 ranks' "$tmp/err"
result $? "p2p on 1 rank: a clear error"

# Bad usage: non-zero, a message on stderr, nothing started.
for args in "allreduce --no-such-flag" "allreduce -d float8" "allreduce -b 1X" "nosuch" \
            "allreduce -f 2 -i 8" "p2p -t ibverbs" "broadcast -r 7" "allreduce -d half -o bxor"; do
    # shellcheck disable=SC2086
    run 2 $args
    rc=$?
    [ $rc != 0 ] && [ -s "$tmp/err" ] && grep -q 'loom-perf: ' "$tmp/err"
    result $? "bad usage '$args': exit $rc with a message"
done

# A Loom error: exit 2 and loom_comm_last_error's words on stderr.
(LOOM_ALGO=allreduce=nosuch && export LOOM_ALGO && run 2 allreduce -b 8 -e 8)
rc=$?
[ $rc = 2 ] && grep -q 'allreduce failed: invalid argument: LOOM_ALGO forces allreduce=nosuch' "$tmp/err"
result $? "a Loom error: exit 2 with the library's message"

out=$("$perf" --help)
[ $? = 0 ] && echo "$out" | grep -q 'busbw'
result $? "--help"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
