#!/bin/sh
# The libibverbs test double's own test (tests/verbs-provider/test_provider.c), on a
# registry segment of its own that this script removes, pass or fail; afterwards no
# segment of the run (nor the default /loomfake-<uid>, if it was not there before) may
# be left in /dev/shm.
set -u
top_builddir=${top_builddir:-.}
dir="$top_builddir/tests/verbs-provider"
lib="$dir/.libs/libibverbs.so.1"
prog="$dir/test_provider"
if [ ! -e "$lib" ] || [ ! -x "$prog" ]; then
    echo "SKIP: the verbs test double was not built (it needs infiniband/verbs.h, from apt-get install libibverbs-dev before configure, and a shared build)"
    exit 77
fi
reg="loomfake-provtest-$$"
default="/dev/shm/loomfake-$(id -u)"
default_before=no
[ -e "$default" ] && default_before=yes
cleanup() {
    rm -f "/dev/shm/$reg"   # shm_unlink, for a POSIX shm name on Linux
}
trap cleanup EXIT
trap 'exit 1' HUP INT TERM

FAKEVERBS_REGISTRY="/$reg" LD_LIBRARY_PATH="$(cd "$dir/.libs" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    "$prog"
rc=$?
[ "$rc" = 77 ] && exit 77
failed=0
# The provider must have used the registry it was given, and no other.
if [ ! -e "/dev/shm/$reg" ]; then
    echo "FAIL the provider did not create FAKEVERBS_REGISTRY=/$reg"
    failed=1
fi
if [ "$default_before" = no ] && [ -e "$default" ]; then
    echo "FAIL the provider created the default registry $default despite FAKEVERBS_REGISTRY"
    rm -f "$default"
    failed=1
fi
cleanup
left=$(ls /dev/shm 2>/dev/null | grep -F "$reg")
if [ -n "$left" ]; then
    echo "FAIL left in /dev/shm: $left"
    failed=1
else
    echo "PASS nothing of the registry is left in /dev/shm"
fi
[ "$rc" = 0 ] && [ "$failed" = 0 ]
