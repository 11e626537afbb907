# lib.sh - what the network-namespace tests share, sourced after setting NAME
# (the test's name, for its messages): the skip rule (exit 77 where it is not
# root or has no iproute2), builddir, srcdir and testbed, a temporary
# directory tmp, and a test bed that is torn down however the test ends,
# together with the processes listed in pids.
#   NAME=test_x
#   . "$(cd "${top_srcdir:-.}" && pwd)/tests/netns/lib.sh"
#   netns_up 2 [--rate R ...]     # testbed.sh up; LOOMTB_* set here
# shellcheck shell=sh

skip() {
    echo "$NAME: SKIP: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "no ip (apt-get install iproute2)"

# shellcheck disable=SC2034 # used by the tests that source this
builddir=$(cd "${top_builddir:-.}" && pwd)
srcdir=$(cd "${top_srcdir:-.}" && pwd)
testbed=$srcdir/tests/netns/testbed.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/$NAME.XXXXXX") || exit 1
pids=""
netns_cleanup() {
    for p in $pids; do
        kill -KILL "$p" 2>/dev/null
    done
    [ -n "${LOOMTB_PREFIX:-}" ] && "$testbed" down "$LOOMTB_PREFIX"
    rm -rf "$tmp"
}
trap netns_cleanup EXIT
trap 'exit 1' INT TERM HUP

# Bring the test bed up (testbed.sh's arguments); skip where namespaces
# cannot be made here.
netns_up() {
    netns_out=$("$testbed" up "$@" 2>"$tmp/up.err")
    netns_rc=$?
    [ $netns_rc -eq 77 ] && skip "$(cat "$tmp/up.err")"
    [ $netns_rc -eq 0 ] || { echo "$NAME: testbed up failed: $(cat "$tmp/up.err")"; exit 1; }
    eval "$netns_out"
}
