#!/bin/sh
# test_elastic_ssh.sh - loomrun --elastic with ranks started over ssh, on two
# network namespaces of this machine (tests/netns/testbed.sh), each running
# its own sshd (the set-up is test_multihost.sh's). Host A has one slot, host
# B two; the worker is tests/mp_elastic (see test_elastic.sh). A rank on B
# SIGKILLs itself mid-allreduce: B is blacklisted and, as Horovod's driver
# drops a failed host, loomrun stops B's other rank over ssh (3 -> 1); B then
# leaves the discovery script too. The final model must be the fault-free one
# and nothing may be left in the namespaces.
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip (not root, no network
# namespaces, no sshd).
# shellcheck disable=SC2086,SC2317
set -u

skip() {
    echo "test_elastic_ssh: SKIP: $*"
    exit 77
}
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces, sshd)"
[ -x /usr/sbin/sshd ] || skip "no /usr/sbin/sshd (apt-get install openssh-server)"
for t in ssh ssh-keygen ip timeout; do
    command -v "$t" >/dev/null || skip "no $t (apt-get install openssh-client iproute2)"
done
real_ssh=$(command -v ssh)
builddir=$(cd "${top_builddir:-.}" && pwd)
srcdir=$(cd "${top_srcdir:-.}" && pwd)
LOOMRUN=$builddir/tools/loomrun
WORKER=$builddir/tests/mp_elastic
testbed=$srcdir/tests/netns/testbed.sh
for f in "$LOOMRUN" "$WORKER"; do
    [ -x "$f" ] || { echo "test_elastic_ssh: $f is not built" >&2; exit 1; }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_elastic_ssh.XXXXXX") || exit 1
sshd_pids=""
cleanup() {
    for p in $sshd_pids; do
        kill "$p" 2>/dev/null
    done
    [ -n "${LOOMTB_PREFIX:-}" ] && "$testbed" down "$LOOMTB_PREFIX"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

up=$("$testbed" up 2 2>"$tmp/up.err")
rc=$?
if [ $rc -ne 0 ]; then
    cat "$tmp/up.err" >&2
    [ $rc -eq 77 ] && skip "$(cat "$tmp/up.err")"
    echo "test_elastic_ssh: the testbed did not come up" >&2
    exit 1
fi
eval "$up"
A=$LOOMTB_NET.1
B=$LOOMTB_NET.2

ssh-keygen -q -t ed25519 -N '' -C loom-test-host -f "$tmp/host_key" || exit 1
ssh-keygen -q -t ed25519 -N '' -C loom-test-client -f "$tmp/id" || exit 1
cp "$tmp/id.pub" "$tmp/authorized_keys"
mkdir -p /run/sshd
for i in 0 1; do
    cat >"$tmp/sshd_$i.conf" <<EOC
ListenAddress $LOOMTB_NET.$((i + 1))
Port 22
HostKey $tmp/host_key
PidFile $tmp/sshd_$i.pid
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
EOC
    "$testbed" exec $i /usr/sbin/sshd -D -e -f "$tmp/sshd_$i.conf" 2>"$tmp/sshd_$i.log" &
    sshd_pids="$sshd_pids $!"
done
mkdir "$tmp/bin"
printf 'UserKnownHostsFile %s/known_hosts\nGlobalKnownHostsFile /dev/null\n' "$tmp" \
    >"$tmp/ssh_config"
printf '#!/bin/sh\nexec %s -F %s "$@"\n' "$real_ssh" "$tmp/ssh_config" >"$tmp/bin/ssh"
chmod +x "$tmp/bin/ssh"
PATH=$tmp/bin:$PATH
export PATH
for h in $A $B; do
    i=0
    until ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -o ConnectTimeout=2 \
          -i "$tmp/id" "$h" true 2>"$tmp/ssh.err"; do
        i=$((i + 1))
        if [ $i -ge 50 ]; then
            echo "test_elastic_ssh: sshd on $h does not take logins:" >&2
            cat "$tmp/ssh.err" "$tmp"/sshd_*.log >&2
            exit 1
        fi
        sleep 0.2
    done
done

namespaces_clean() {
    for _ in $(seq 40); do
        left=""
        for i in 0 1; do
            for p in $(ip netns pids "$LOOMTB_PREFIX-$i"); do
                case " $sshd_pids " in
                    *" $p "*) ;;
                    *) left="$left $p" ;;
                esac
            done
        done
        [ -z "$left" ] && return 0
        sleep 0.2
    done
    echo "left running in the namespaces:" >&2
    for p in $left; do ps -o pid=,args= -p "$p" >&2; done
    return 1
}

failures=0
fail() {
    echo "FAIL: $*" >&2
    failures=$((failures + 1))
}
sizes() {
    sed -n 's/.*\[mpe\] epoch [0-9]* size \([0-9]*\).*/\1/p' "$1" | tr '\n' ' ' | sed 's/ $//'
}

printf '%s:1\n%s:2\n' "$A" "$B" >"$tmp/hosts"
printf '#!/bin/sh\ncat %s/hosts\n' "$tmp" >"$tmp/discover"
chmod +x "$tmp/discover"
start=$(date +%s)
MPE_DIR=$tmp MPE_STEPS=40 MPE_SLEEP_MS=60 MPE_KILL_ID=1 MPE_KILL_STEP=6 \
    timeout 150 "$LOOMRUN" --elastic --ssh-identity-file "$tmp/id" \
    --host-discovery-script "$tmp/discover" --discovery-interval 0.3 --elastic-timeout 20 \
    --blacklist-cooldown 600 -np 3 -x MPE_DIR -x MPE_STEPS -x MPE_SLEEP_MS -x MPE_KILL_ID \
    -x MPE_KILL_STEP "$WORKER" >"$tmp/out" 2>&1 </dev/null &
lr=$!
i=0
while [ $i -lt 600 ]; do
    s=$(cat "$tmp/progress" 2>/dev/null)
    [ -n "$s" ] && [ "$s" -ge 14 ] && break
    sleep 0.1
    i=$((i + 1))
done
printf '%s:1\n' "$A" >"$tmp/hosts"
wait $lr
rc=$?
el=$(($(date +%s) - start))
# As Horovod's driver: the host of the killed rank is blacklisted and its other
# rank (started over ssh) is stopped with it, so the job goes from 3 to 1.
if [ $rc -ne 0 ] || [ "$(sizes "$tmp/out")" != "3 1" ] || ! grep -q 'MATCH$' "$tmp/out" ||
   ! grep -q "host $B is blacklisted: stopping rank" "$tmp/out" || [ $el -gt 120 ]; then
    fail "elastic over ssh: rc=$rc, sizes $(sizes "$tmp/out") (expected 3 1), $el s"
    sed 's/^/    /' "$tmp/out" >&2
fi
namespaces_clean || fail "processes left in the namespaces"
if [ $failures -ne 0 ]; then
    exit 1
fi
echo "ok: elastic over ssh: 3 -> 1 (a remote rank killed, its host's other rank stopped over ssh), in $el s"
exit 0
