#!/bin/sh
# test_store_file_security.sh - the file:// store against another local user.
# User A (the victim) runs ranks; user B (the attacker) prepared the directory
# or planted entries in it. A must refuse a directory that is a symlink, that
# B owns, or that anyone may write without the sticky bit; in a sticky shared
# directory, planted symlinks, FIFOs and B's files must fail the rank quickly
# and never be followed (no file created where B pointed, no private file read
# as a value), never waited on past LOOM_TIMEOUT. What A creates is 0700/0600,
# or 0770/0660 with LOOM_FILE_STORE_GROUP=1.
# Needs root to create the two users (useradd) and to run as them (setpriv).
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.

top_builddir=${top_builddir:-.}
skip() { echo "test_store_file_security: skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (two local users)"
for t in useradd setpriv mkfifo; do
    command -v $t >/dev/null 2>&1 || skip "no $t"
done
prog=$(cd "$top_builddir" && pwd)/examples/allreduce
[ -x "$prog" ] || { echo "test_store_file_security: $prog is not built" >&2; exit 1; }

ua=loomsec_a
ub=loomsec_b
made_users=""
for u in $ua $ub; do
    if ! id -u $u >/dev/null 2>&1; then
        useradd -M -N -s /bin/sh $u 2>/dev/null || skip "useradd $u failed"
        made_users="$made_users $u"
    fi
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_store_file_sec.XXXXXX") || exit 1
cleanup() {
    rm -rf "$tmp"
    for u in $made_users; do userdel $u 2>/dev/null; done
}
trap cleanup EXIT
chmod 1777 "$tmp"   # like /tmp: everyone may create, nobody may replace others' names
uid_a=$(id -u $ua)
uid_b=$(id -u $ub)
gid_a=$(id -g $ua)
gid_b=$(id -g $ub)
as_a() { setpriv --reuid="$uid_a" --regid="$gid_a" --clear-groups -- "$@"; }
as_b() { setpriv --reuid="$uid_b" --regid="$gid_b" --clear-groups -- "$@"; }

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# victim RANK DIR [VAR=VALUE...]: one rank of a 2-rank job, as A, with a short
# LOOM_TIMEOUT; status in $rc, seconds in $took, stderr in $tmp/err.
victim() {
    r=$1 dir=$2
    shift 2
    start=$(date +%s)
    as_a env LOOM_RANK="$r" LOOM_SIZE=2 LOOM_JOB_ID=jj LOOM_TIMEOUT=3 \
        LOOM_STORE="file://$dir" "$@" timeout 30 "$prog" >"$tmp/out" 2>"$tmp/err" </dev/null
    rc=$?
    took=$(($(date +%s) - start))
}
# expect_refused WHAT PATTERN: the victim failed within 10 s, saying PATTERN.
expect_refused() {
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -lt 10 ] && grep -q "$2" "$tmp/err"; then
        pass "$1 (${took} s)"
    else
        fail "$1: rc=$rc after ${took} s"; cat "$tmp/err" >&2
    fi
}

key0='k.loom%2Fjj%2Fworld0%2Faddr%2F0'
lock1='l.loom%2Fjj%2Fworld0%2Faddr%2F1'

# A's own private corner: a secret file and a directory B cannot write.
as_a mkdir -m 700 "$tmp/a-private"
as_a sh -c "echo PRIVATE-CONTENT > '$tmp/a-private/secret'; chmod 600 '$tmp/a-private/secret'"

# ---- the directory itself ---------------------------------------------------
as_b mkdir -m 777 "$tmp/b-store"
victim 1 "$tmp/b-store"
expect_refused "a store directory another user owns is refused" "belongs to uid"

as_a mkdir -m 700 "$tmp/a-real"
as_b ln -s "$tmp/a-real" "$tmp/b-link"
victim 1 "$tmp/b-link"
expect_refused "a store directory that is a symlink is refused" "symbolic link"

as_a mkdir "$tmp/a-open"
chmod 777 "$tmp/a-open"
victim 1 "$tmp/a-open"
expect_refused "a store directory everyone may write, not sticky, is refused" "not sticky"

# ---- entries planted in a sticky shared directory ---------------------------
newdir() { as_a mkdir "$tmp/$1" && chmod 1777 "$tmp/$1"; }

newdir s1
as_b ln -s "$tmp/a-private/secret" "$tmp/s1/$key0"
victim 1 "$tmp/s1"
if grep -q PRIVATE-CONTENT "$tmp/err" "$tmp/out"; then
    fail "a planted symlink made the victim read its private file"
else
    expect_refused "a value planted as a symlink is not followed" "symbolic link"
fi

newdir s2
as_b ln -s "$tmp/a-private/created" "$tmp/s2/$lock1"
victim 1 "$tmp/s2"
if [ -e "$tmp/a-private/created" ]; then
    fail "a planted lock symlink made the victim create a file where the attacker pointed"
else
    # (Where fs.protected_symlinks is on, the kernel refuses first.)
    expect_refused "a lock planted as a symlink is not followed" "symbolic link\|Permission denied"
fi

newdir s3
as_b mkfifo "$tmp/s3/$key0"
victim 1 "$tmp/s3"
expect_refused "a value planted as a FIFO fails at once, no hang" "not a regular file"

newdir s4
as_b sh -c "printf '2\n127.0.0.1:1\nforged\n-' > '$tmp/s4/$key0'"
victim 1 "$tmp/s4"
expect_refused "a value file of another user is not believed" "owned by another user"

# ---- what the store creates -------------------------------------------------
# A whole job (both ranks) in a directory that does not exist yet.
run_job() {
    dir=$1
    shift
    for r in 0 1; do
        as_a env LOOM_RANK=$r LOOM_SIZE=2 LOOM_JOB_ID=jj LOOM_STORE="file://$dir" "$@" \
            sh -c 'umask 022; exec timeout 60 "$0"' "$prog" >"$tmp/out.$r" 2>&1 </dev/null &
    done
    wait
}
run_job "$tmp/a-fresh/store"
loose=$(find "$tmp/a-fresh" -perm /077 | head -n 3)
nfiles=$(find "$tmp/a-fresh/store" -type f | wc -l)
if grep -q 'allreduce OK' "$tmp/out.0" && grep -q 'allreduce OK' "$tmp/out.1" &&
   [ "$nfiles" -gt 0 ] && [ -z "$loose" ]; then
    pass "directories 0700 and files 0600 under umask 022 ($nfiles files)"
else
    fail "modes of a private store: $loose"; cat "$tmp/out.0" "$tmp/out.1" >&2
    ls -laR "$tmp/a-fresh" >&2
fi

run_job "$tmp/a-group/store" LOOM_FILE_STORE_GROUP=1
dmode=$(stat -c %a "$tmp/a-group/store")
fmodes=$(find "$tmp/a-group/store" -type f -exec stat -c %a {} + | sort -u | tr '\n' ' ')
if grep -q 'allreduce OK' "$tmp/out.0" && grep -q 'allreduce OK' "$tmp/out.1" &&
   [ "$dmode" = 770 ] && [ "$fmodes" = "660 " ]; then
    pass "LOOM_FILE_STORE_GROUP=1: directories 0770, files 0660"
else
    fail "group mode: directory $dmode, files $fmodes"; cat "$tmp/out.0" "$tmp/out.1" >&2
fi

[ $failures -eq 0 ] || { echo "test_store_file_security: $failures check(s) failed" >&2; exit 1; }
exit 0
