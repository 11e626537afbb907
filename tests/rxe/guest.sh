#!/bin/sh
# Stage 2 of a tests/rxe VM, its init (PID 1) in the overlay over the host's
# root: file systems, the NIC, the soft-RoCE device, then the command list
# (cmds.sh) with its output and status in the output share; power off by sysrq.
# Copied into the share by vm.sh; see vm.sh for what cmds.sh gets.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
o=/rxe-out
off() {
    sync
    echo o > /proc/sysrq-trigger
    sleep 60
}
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
# shellcheck disable=SC1091
. $o/env
export RXE_VM RXE_NVMS RXE_IP RXE_PEER_IP RXE_TOP
# The tree the commands run in, shared on its own: under /tmp (a CI clone, say)
# the host root's copy is hidden by the tmpfs just mounted there, and a tree on
# another file system than / would not show through the root share at all.
mkdir -p "$RXE_TOP" &&
    mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 top "$RXE_TOP"
RXE_OUT=$o
RXE_SHARED=/rxe-shared
export RXE_OUT RXE_SHARED
HOME=/root
export HOME
hostname "rxe-vm$RXE_VM"
{
    echo "guest: kernel $(uname -r), $(nproc) CPUs, uptime $(cut -d' ' -f1 /proc/uptime) s at stage 2"
    ip link set lo up &&
        ip addr add "$RXE_IP/24" dev eth0 &&
        ip link set eth0 up &&
        rdma link add rxe0 type rxe netdev eth0 &&
        rdma link show
} > $o/setup.log 2>&1
setup=$?
cut -d' ' -f1 /proc/uptime > $o/boot_s
date +%s > $o/ready_at
if [ $setup != 0 ]; then
    echo "guest: setting up eth0 or rxe0 failed" >> $o/setup.log
    echo 1 > $o/rc
    off
fi
# shellcheck disable=SC3045  # dash, the guest's /bin/sh, has both
{ ulimit -l unlimited; ulimit -c 0; } 2>/dev/null

# rxe_barrier NAME: both VMs reach NAME before either goes on (at most 300 s).
rxe_barrier() {
    : > "$RXE_SHARED/.barrier.$1.vm$RXE_VM"
    [ "$RXE_NVMS" = 1 ] && return 0
    n=0
    while [ ! -e "$RXE_SHARED/.barrier.$1.vm$((1 - RXE_VM))" ]; do
        n=$((n + 1))
        [ $n -gt 3000 ] && { echo "rxe_barrier $1: the other VM did not come"; return 1; }
        sleep 0.1
    done
}
# rxe_step NAME LIMIT CMD...: one step of a test, bounded by LIMIT seconds;
# prints "PASS NAME (T s)" or "FAIL NAME (...)" with the end of its output
# (all of it in $RXE_OUT/NAME.log). Returns CMD's status.
rxe_step() {
    _n=$1 _l=$2
    shift 2
    _t0=$(date +%s)
    timeout -k 5 "$_l" "$@" > "$RXE_OUT/$_n.log" 2>&1
    _rc=$?
    if [ $_rc = 0 ]; then
        echo "PASS $_n ($(( $(date +%s) - _t0 )) s)"
    else
        echo "FAIL $_n (status $_rc$([ $_rc = 124 ] && echo ": out of time"), $(( $(date +%s) - _t0 )) s)"
        grep -v '^PASS' "$RXE_OUT/$_n.log" | tail -n 30 | sed 's/^/    /'
    fi
    return $_rc
}

# rxe_ranks NAME LIMIT SIZE FIRST COUNT CMD...: ranks FIRST..FIRST+COUNT-1 of
# a SIZE-rank job, started here by LOOM_* variables (as a launcher would) and
# waited for; rank 0 serves the store on 10.11.0.1 (the first VM), at a port
# of the step's own. Both VMs meet at a barrier first. A step as rxe_step's.
rxe_port=29500
rxe_ranks() {
    _n=$1 _l=$2 _size=$3 _first=$4 _count=$5
    shift 5
    rxe_port=$((rxe_port + 1))
    rxe_barrier "$_n" || { echo "FAIL $_n (the other VM did not come)"; return 1; }
    _t0=$(date +%s)
    _pids=""
    _k=0
    while [ $_k -lt "$_count" ]; do
        LOOM_RANK=$((_first + _k)) LOOM_SIZE=$_size LOOM_LOCAL_RANK=$_k LOOM_JOB_ID=$_n \
            LOOM_STORE=tcp://10.11.0.1:$rxe_port \
            timeout -k 5 "$_l" "$@" > "$RXE_OUT/$_n.rank$((_first + _k)).log" 2>&1 &
        _pids="$_pids $!"
        _k=$((_k + 1))
    done
    _rc=0
    _k=$_first
    _bad=""
    for _p in $_pids; do
        wait "$_p"
        _s=$?
        [ $_s = 0 ] || { _rc=1; _bad="$_bad rank $_k: status $_s$([ $_s = 124 ] && echo " (out of time)");"; }
        _k=$((_k + 1))
    done
    if [ $_rc = 0 ]; then
        echo "PASS $_n ($(( $(date +%s) - _t0 )) s)"
    else
        echo "FAIL $_n ($_bad $(( $(date +%s) - _t0 )) s)"
        _k=$_first
        while [ "$_k" -lt $((_first + _count)) ]; do
            grep -v '^PASS' "$RXE_OUT/$_n.rank$_k.log" | tail -n 15 | sed "s/^/    [$_k] /"
            _k=$((_k + 1))
        done
    fi
    return $_rc
}

# rxe_perftest NAME PROG ARGS...: a perftest program (ib_write_lat...) as a
# control of the verbs stack without Loom: its server on the first VM, its
# client on the second (both on the first with one VM). perftest reads its
# peer's TCP handshake ("reports") with one read() and fails on a short one,
# which a TCG VM on a busy host produces before the verbs stack is reached:
# when either side failed there, both VMs try once more.
rxe_perftest() {
    _name=$1
    shift
    rxe_perftest_once "$_name" "$_name" "$@" > "$RXE_OUT/$_name.try1" 2>&1
    _ok=$?
    grep -qs "Couldn't read reports" "$RXE_OUT/$_name.log" "$RXE_OUT/$_name.server.log" &&
        : > "$RXE_SHARED/.handshake.$_name.vm$RXE_VM"
    if ! rxe_barrier "$_name.verdict"; then
        cat "$RXE_OUT/$_name.try1"
        return 1
    fi
    if ls "$RXE_SHARED/.handshake.$_name.vm"* > /dev/null 2>&1; then
        echo "$_name: perftest's own TCP handshake failed (a short read), once more:"
        sed 's/^/    /' "$RXE_OUT/$_name.try1"
        rxe_perftest_once "$_name" "$_name.again" "$@"
        return $?
    fi
    cat "$RXE_OUT/$_name.try1"
    return $_ok
}

# rxe_perftest_once NAME TAG PROG ARGS...: one run of it, reported as NAME,
# meeting the other VM at barriers named after TAG.
rxe_perftest_once() {
    _n=$1 _tag=$2
    shift 2
    command -v "$1" > /dev/null || { echo "SKIP $_n: no $1 (apt-get install perftest)"; return 0; }
    if [ "$RXE_VM" = 0 ]; then
        timeout -k 5 120 "$@" -d rxe0 -x 1 > "$RXE_OUT/$_n.server.log" 2>&1 &
        _srv=$!
        _k=0
        until ss -ltn 2>/dev/null | grep -q ':18515 '; do
            _k=$((_k + 1))
            [ $_k -gt 300 ] && break
            sleep 0.1
        done
    fi
    rxe_barrier "$_tag" || { echo "FAIL $_n (the other VM did not come)"; return 1; }
    _rc=0
    if [ "$RXE_NVMS" = 1 ] || [ "$RXE_VM" = 1 ]; then
        rxe_step "$_n" 120 "$@" -d rxe0 -x 1 10.11.0.1
        _rc=$?
        tail -n 3 "$RXE_OUT/$_n.log" | sed 's/^/    /'
    fi
    if [ "$RXE_VM" = 0 ] && ! wait "$_srv"; then
        echo "FAIL $_n (the server side)"
        tail -n 5 "$RXE_OUT/$_n.server.log" | sed 's/^/    /'
        _rc=1
    fi
    rxe_barrier "$_tag.done"
    return $_rc
}

cd "$RXE_TOP" || { echo 1 > $o/rc; off; }
# shellcheck disable=SC1091
(. $o/cmds.sh) > $o/cmds.log 2>&1 < /dev/null
echo $? > $o/rc
off
