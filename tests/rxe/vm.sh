#!/bin/sh
# tests/rxe/vm.sh - run a command list over a real kernel verbs stack: one or two
# QEMU VMs booted from this machine's own Debian kernel, each with a soft-RoCE
# device (rdma_rxe) on its virtio NIC.
#
#   vm.sh [--vms 1|2] [--timeout S] [--mem MB] --out DIR CMDS
#
# CMDS is a shell script run by /bin/sh inside every VM, in the directory
# vm.sh was started from (the host's root is the VM's root, read-only, under a tmpfs
# overlay: /usr, libibverbs with its rxe provider and the built tree are all
# there). It sees RXE_VM (0 or 1), RXE_NVMS, RXE_IP, RXE_PEER_IP, RXE_OUT (its
# own writable share, DIR/vmN on the host), RXE_SHARED (one writable share both
# VMs see, DIR/shared), and the helper rxe_barrier NAME (waits, bounded, for
# the other VM to reach NAME). Its output lands in DIR/vmN/cmds.log, its exit
# status in DIR/vmN/rc, the console in DIR/vmN/console.log; vm.sh exits with
# the first non-zero status of the VMs (1 where a VM gave none: it crashed or
# ran out of time), 77 where qemu, the kernel or busybox is missing.
#
# The machine: /boot/vmlinuz-$(uname -r), else the newest /boot/vmlinuz-*, with
# the modules of /lib/modules/<that version>; -smp 2. Two VMs are joined by a
# `-netdev socket` listen/connect pair over host loopback (10.11.0.1 and
# 10.11.0.2); one VM gets a NIC on a private hub. Acceleration: TCG unless
# /dev/kvm is a real KVM (kvm_intel or kvm_amd loaded, no kvm_pvm: a PVM
# /dev/kvm hangs a stock kernel); LOOM_RXE_ACCEL=tcg|kvm overrides.
# Every qemu runs under `timeout` and is killed when this script exits.
set -u

here=$(cd "$(dirname "$0")" && pwd)
nvms=1
limit=600
mem=1536
out=""
while [ $# -gt 0 ]; do
    case $1 in
        --vms) nvms=$2; shift 2 ;;
        --timeout) limit=$2; shift 2 ;;
        --mem) mem=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --) shift; break ;;
        -*) echo "vm.sh: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ $# != 1 ] || [ -z "$out" ]; then
    echo "usage: vm.sh [--vms 1|2] [--timeout S] [--mem MB] --out DIR CMDS" >&2
    exit 2
fi
cmds=$1
[ -r "$cmds" ] || { echo "vm.sh: cannot read $cmds" >&2; exit 2; }
case $nvms in 1|2) ;; *) echo "vm.sh: --vms takes 1 or 2" >&2; exit 2 ;; esac

skip() {
    echo "vm.sh: SKIP: $*"
    exit 77
}
qemu=$(command -v qemu-system-x86_64) || skip "no qemu-system-x86_64 (apt-get install qemu-system-x86)"
bb=""
for b in /bin/busybox /usr/bin/busybox; do [ -x "$b" ] && bb=$b && break; done
[ -n "$bb" ] || skip "no busybox (apt-get install busybox-static)"
ldd "$bb" >/dev/null 2>&1 && skip "$bb is linked dynamically: the initramfs needs busybox-static"
command -v cpio >/dev/null || skip "no cpio (apt-get install cpio)"
kver=""
if [ -r "/boot/vmlinuz-$(uname -r)" ] && [ -d "/lib/modules/$(uname -r)" ]; then
    kver=$(uname -r)
else
    for k in $(find /boot -maxdepth 1 -name 'vmlinuz-*' | sed 's|^/boot/vmlinuz-||' | sort -V); do
        [ -r "/boot/vmlinuz-$k" ] && [ -f "/lib/modules/$k/modules.dep" ] && kver=$k
    done
fi
[ -n "$kver" ] || skip "no readable /boot/vmlinuz-* with its /lib/modules (apt-get install linux-image-amd64)"
kernel=/boot/vmlinuz-$kver
moddir=/lib/modules/$kver
[ -f "$moddir/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko" ] ||
    [ -n "$(ls "$moddir"/kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko* 2>/dev/null)" ] ||
    skip "kernel $kver has no rdma_rxe module"
[ -x /usr/bin/rdma ] || skip "no /usr/bin/rdma (apt-get install iproute2)"
[ -e /etc/libibverbs.d/rxe.driver ] || skip "no rxe provider for libibverbs (apt-get install rdma-core ibverbs-providers)"

accel=${LOOM_RXE_ACCEL:-auto}
if [ "$accel" = auto ]; then
    accel=tcg
    if [ -r /dev/kvm ] && [ -w /dev/kvm ] && [ ! -d /sys/module/kvm_pvm ] &&
       { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
        accel=kvm
    fi
fi
case $accel in
    kvm) accel_args="-accel kvm -cpu host" ;;
    tcg) accel_args="-accel tcg,thread=multi -cpu max" ;;
    *) echo "vm.sh: LOOM_RXE_ACCEL=$accel: tcg, kvm or auto" >&2; exit 2 ;;
esac

mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/loom-rxe.XXXXXX") || exit 1
pids=""
# shellcheck disable=SC2317  # called from the trap
cleanup() {
    # $pids are timeout's: TERM reaches qemu through it (KILL would orphan qemu).
    for p in $pids; do kill "$p" 2>/dev/null; done
    for p in $pids; do wait "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

# ---- the initramfs: busybox, the modules with their dependencies, /init --------
mods="virtio_pci virtio_net 9pnet_virtio 9p overlay ib_uverbs rdma_rxe"
# Dependencies first (modules.dep lists each module's full closure; loading its
# entries from last to first is modprobe's order).
order=$(awk -v want="$mods" '
    { name = $1; sub(/:$/, "", name); deps[name] = ""
      for (i = NF; i >= 2; i--) deps[name] = deps[name] " " $i
      base = name; sub(/.*\//, "", base); sub(/\.ko.*$/, "", base); gsub(/-/, "_", base); path[base] = name }
    function visit(p,   n, d, i) {
        if (p in seen) return; seen[p] = 1
        n = split(deps[p], d, " "); for (i = 1; i <= n; i++) visit(d[i])
        print p }
    END { n = split(want, w, " ")
          for (i = 1; i <= n; i++) { b = w[i]; gsub(/-/, "_", b)
              if (!(b in path)) { print "MISSING " w[i]; continue } visit(path[b]) } }
' "$moddir/modules.dep")
if echo "$order" | grep -q '^MISSING'; then
    skip "kernel $kver lacks modules: $(echo "$order" | sed -n 's/^MISSING //p' | tr '\n' ' ')"
fi
ird=$work/initramfs
mkdir -p "$ird/bin" "$ird/mods" "$ird/proc" "$ird/sys" "$ird/dev" "$ird/lower" "$ird/rw" "$ird/newroot"
cp "$bb" "$ird/bin/busybox"
: > "$ird/mods/order"
for m in $order; do
    f=$(basename "$m")
    case $f in
        *.ko) cp "$moddir/$m" "$ird/mods/$f" ;;
        *.ko.xz) xz -dc "$moddir/$m" > "$ird/mods/${f%.xz}"; f=${f%.xz} ;;
        *.ko.zst) zstd -qdc "$moddir/$m" > "$ird/mods/${f%.zst}"; f=${f%.zst} ;;
        *.ko.gz) gzip -dc "$moddir/$m" > "$ird/mods/${f%.gz}"; f=${f%.gz} ;;
    esac || skip "cannot unpack module $m"
    echo "$f" >> "$ird/mods/order"
done
cat > "$ird/init" <<'EOF'
#!/bin/busybox sh
# Stage 1: modules, the host's root read-only over 9p under a tmpfs overlay,
# the output shares, then stage 2 (the share's guest.sh) as the new root's init.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
die() { echo "rxe-init: $*"; echo o > /proc/sysrq-trigger; sleep 30; }
while read -r m; do insmod "/mods/$m" || echo "rxe-init: insmod $m failed"; done < /mods/order
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower ||
    die "cannot mount the host root"
mount -t tmpfs -o mode=0755 tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot ||
    die "cannot mount the overlay"
mkdir -p /newroot/rxe-out /newroot/rxe-shared
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 out /newroot/rxe-out ||
    die "cannot mount the output share"
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=262144 shared /newroot/rxe-shared ||
    die "cannot mount the shared folder"
umount /proc /sys
umount /dev
exec switch_root /newroot /bin/sh /rxe-out/guest.sh
die "switch_root failed"
EOF
chmod 755 "$ird/init"
(cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initramfs.gz" ||
    { echo "vm.sh: cannot build the initramfs" >&2; exit 1; }

# ---- the VMs -------------------------------------------------------------------
# A free port on host loopback for the socket pair (the listener takes it
# before the connecting VM starts).
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port_listens() {  # port_listens PORT: a listening TCP socket on PORT
    hex=$(printf '%04X' "$1")
    awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' /proc/net/tcp
}
mkdir -p "$out/shared"
rm -f "$out"/shared/.barrier.* 2>/dev/null
port=$(free_port) || { echo "vm.sh: no free port" >&2; exit 1; }
t_start=$(date +%s)
i=0
while [ $i -lt "$nvms" ]; do
    d=$out/vm$i
    rm -rf "$d"
    mkdir -p "$d"
    cp "$here/guest.sh" "$d/guest.sh"
    cp "$cmds" "$d/cmds.sh"
    peer=$((2 - i))
    [ "$nvms" = 1 ] && peer=1
    cat > "$d/env" <<EOF
RXE_VM=$i
RXE_NVMS=$nvms
RXE_IP=10.11.0.$((i + 1))
RXE_PEER_IP=10.11.0.$peer
RXE_TOP=$(pwd)
RXE_BOOT_START=$t_start
EOF
    if [ "$nvms" = 1 ]; then
        net="-netdev hubport,id=n0,hubid=0"
    elif [ $i = 0 ]; then
        net="-netdev socket,id=n0,listen=127.0.0.1:$port"
    else
        net="-netdev socket,id=n0,connect=127.0.0.1:$port"
        # The listener must be up before the connect.
        n=0
        until port_listens "$port"; do
            n=$((n + 1))
            if [ $n -gt 300 ] || ! kill -0 "$pid0" 2>/dev/null; then
                echo "vm.sh: the first VM does not listen on port $port" >&2
                exit 1
            fi
            sleep 0.1
        done
    fi
    # shellcheck disable=SC2086
    timeout -k 5 "$limit" "$qemu" -nographic -no-reboot -nodefaults -serial stdio -monitor none \
        $accel_args -smp 2 -m "$mem" \
        -kernel "$kernel" -initrd "$work/initramfs.gz" \
        -append "console=ttyS0 panic=-1 loglevel=4 rdinit=/init" \
        $net -device virtio-net-pci,netdev=n0,mac=52:54:00:11:00:0$((i + 1)) \
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
        -virtfs "local,path=$(pwd),mount_tag=top,security_model=none,readonly=on,multidevs=remap" \
        -virtfs "local,path=$d,mount_tag=out,security_model=none" \
        -virtfs "local,path=$out/shared,mount_tag=shared,security_model=none" \
        < /dev/null > "$d/console.log" 2>&1 &
    pids="$pids $!"
    [ $i = 0 ] && pid0=$!
    i=$((i + 1))
done
for p in $pids; do wait "$p"; done
pids=""
echo "vm.sh: $nvms VM(s), $accel, $(( $(date +%s) - t_start )) s"
status=0
i=0
while [ $i -lt "$nvms" ]; do
    d=$out/vm$i
    if [ -f "$d/boot_s" ] && [ -f "$d/ready_at" ]; then
        echo "vm$i: rxe0 up $(( $(cat "$d/ready_at") - t_start )) s after qemu started (kernel uptime $(cat "$d/boot_s") s)"
    fi
    if [ -s "$d/rc" ]; then
        rc=$(cat "$d/rc")
    else
        echo "vm$i: no exit status (crashed or out of time, limit ${limit} s); the console's end:"
        tail -n 25 "$d/console.log"
        rc=1
    fi
    [ "$status" = 0 ] && status=$rc
    i=$((i + 1))
done
exit "$status"
