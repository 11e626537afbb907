#!/bin/sh
# skip_summary.sh [--not-built TEXT]... LOG... - `make check` ends with this:
# one line saying which tests were skipped (automake's .trs says SKIP: the
# test exited 77) and which parts of the tests that ran were left out, each
# with the reason the test printed, so that a run that tested less than CI
# does says so. A test states a reason with a line holding "SKIP" (the whole
# test, or a part of it: "SKIP: no ::1 on this machine"), "skipping" or "not
# run". --not-built names a test configure left out.
# Always exits 0: it reports, the tests decide.
not_built=""
while [ "${1:-}" = --not-built ]; do
    not_built="$not_built; $2"
    shift 2
done

# why LOG PATTERN: the first reason in LOG, without the test's name and the
# word SKIP in front of it.
why() {
    grep -m1 -E "$2" "$1" | sed -E -e 's/^[A-Za-z0-9_.\/-]+: //' -e 's/^(SKIP|skipped)(:| )+//' \
        -e 's/[[:space:]]+$//'
}

skipped=""
parts=""
nskip=0
for log; do
    [ -f "$log" ] || continue
    t=${log%.log}
    if grep -q '^:test-result: SKIP' "$t.trs" 2>/dev/null; then
        w=$(why "$log" 'SKIP|[Ss]kipp|not run')
        [ -n "$w" ] || w=$(tail -n 1 "$log")
        skipped="$skipped; $t ($w)"
        nskip=$((nskip + 1))
    elif grep -q '^:test-result: PASS' "$t.trs" 2>/dev/null; then
        grep -E '(^|: )SKIP|[Ss]kipping|not run' "$log" >"$log.skips" 2>/dev/null
        while IFS= read -r line; do
            w=$(printf '%s\n' "$line" > "$log.line" && why "$log.line" '.')
            parts="$parts; $t: $w"
        done <"$log.skips"
        rm -f "$log.skips" "$log.line"
    fi
done

if [ -z "$skipped$parts$not_built" ]; then
    echo "make check: nothing skipped: every test ran in full"
    exit 0
fi
line="make check:"
[ -n "$not_built" ] && line="$line NOT BUILT: ${not_built#; }."
[ -n "$skipped" ] && line="$line SKIPPED $nskip: ${skipped#; }."
[ -n "$parts" ] && line="$line PARTS LEFT OUT: ${parts#; }."
echo "$line (tests/install-deps.sh installs what they need; docs/testing.md: \"What the tests need\")"
exit 0
