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
if [ $setup != 0 ]; then
    echo "guest: setting up eth0 or rxe0 failed" >> $o/setup.log
    echo 1 > $o/rc
    off
fi
ulimit -l unlimited 2>/dev/null
ulimit -c 0

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
cd "$RXE_TOP" || { echo 1 > $o/rc; off; }
# shellcheck disable=SC1091
(. $o/cmds.sh) > $o/cmds.log 2>&1 < /dev/null
echo $? > $o/rc
off
