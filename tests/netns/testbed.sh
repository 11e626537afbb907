#!/bin/sh
# testbed.sh - act out a small cluster on one Linux machine: N network
# namespaces joined by a bridge in the root namespace, one veth pair each.
#
#   eval "$(testbed.sh up N [--rate RATE [--flow-rate RATE]])"   # sets and exports LOOMTB_*
#   testbed.sh exec I cmd args...             # run cmd in namespace I (0-based)
#   testbed.sh down [PREFIX]                  # remove everything; safe twice
#
# `up` prints shell assignments for the caller to eval:
#   LOOMTB_PREFIX  prefix of every name (namespaces $LOOMTB_PREFIX-0 ..)
#   LOOMTB_NET     first three octets: namespace I has $LOOMTB_NET.(I+1),
#                  the bridge (in the root namespace) $LOOMTB_NET.254
#   LOOMTB_N       number of namespaces
# (Not LOOM_*: loomrun passes those on to remote ranks.)
# `exec` and `down` read them from the environment (`down` takes the prefix as
# an argument too). With --rate (a tc rate such as 1gbit or 100mbit) both ends
# of every veth get a token-bucket filter, so transfers meet a real bandwidth
# limit. --flow-rate (with --rate) also caps every TCP connection a namespace
# sends on, as clouds cap single flows below the NIC's rate: `--rate 2gbit
# --flow-rate 500mbit` is a 2 Gbit/s link on which one flow gets 500 Mbit/s
# and four get it all. (Where the kernel has sch_fq that is `fq maxrate` under
# the link's limit; this one is built of what every kernel with tc has: an HTB
# class per flow, ceiling the flow rate, under a class at the link rate,
# chosen by a classic-BPF filter that hashes the TCP ports.)
# Needs root, iproute2 and a kernel with network namespaces; exits 77
# (the Automake skip code) when namespaces cannot be made here.
set -u

die() {
    echo "testbed.sh: $*" >&2
    exit 1
}

# Interface names are limited to 15 bytes: keep them short and derived from
# the numeric part of the prefix.
names() {
    id=${1#loomt}
    bridge=lmb$id
}

# The namespace's processes (sshd and anything left of a test) hold it open;
# ending them is what lets `ip netns del` free it.
kill_ns_pids() {
    pids=$(ip netns pids "$1" 2>/dev/null)
    [ -n "$pids" ] || return 0
    # shellcheck disable=SC2086
    kill -TERM $pids 2>/dev/null
    i=0
    while [ $i -lt 20 ] && [ -n "$(ip netns pids "$1" 2>/dev/null)" ]; do
        sleep 0.1
        i=$((i + 1))
    done
    pids=$(ip netns pids "$1" 2>/dev/null)
    # shellcheck disable=SC2086
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null
}

down() {
    prefix=${1:-${LOOMTB_PREFIX:-}}
    [ -n "$prefix" ] || die "down: no testbed named (LOOMTB_PREFIX is not set)"
    case $prefix in
        loomt[0-9]*) ;;
        *) die "down: '$prefix' is not a testbed prefix (loomtNNN)" ;;
    esac
    names "$prefix"
    for ns in $(ip netns list 2>/dev/null | sed -n "s/^\($prefix-[0-9]*\)\( .*\)\{0,1\}$/\1/p"); do
        kill_ns_pids "$ns"
        ip netns del "$ns" 2>/dev/null
    done
    # Deleting a namespace deletes the veth ends in it and with them their
    # peers; an `up` that failed half way may have left root-side ends.
    for dev in $(ip -o link show 2>/dev/null | sed -n "s/^[0-9]*: \(lmv$id-[0-9]*\)[@:].*/\1/p"); do
        ip link del "$dev" 2>/dev/null
    done
    ip link del "$bridge" 2>/dev/null
    return 0
}

# A /24 in 10.231.0.0/16 that no interface here uses yet.
pick_net() {
    used=$(ip -4 -o addr show 2>/dev/null)
    x=$(( $$ % 250 + 1 ))
    tries=0
    while [ $tries -lt 250 ]; do
        if ! printf '%s\n' "$used" | grep -q " 10\.231\.$x\."; then
            echo "10.231.$x"
            return 0
        fi
        x=$(( x % 250 + 1 ))
        tries=$((tries + 1))
    done
    return 1
}

# Classic BPF for tc's bpf classifier, run on the Ethernet frame: an IPv4 TCP
# segment goes to class 1:(0x10 + ((sport ^ dport) & 63)), anything else to
# the default class. The two ends of a connection hash alike, and the
# connections to one peer differ in their ephemeral port.
FLOW_BPF="14,40 0 0 12,21 0 11 2048,48 0 0 23,21 0 9 6,177 0 0 14,72 0 0 14,2 0 0 0,\
72 0 0 16,97 0 0 0,172 0 0 0,84 0 0 63,4 0 0 65552,22 0 0 0,6 0 0 0"

# eth0 of namespace $1: an HTB class at the link rate $2 holding one class
# per flow bucket that may reach $3, and a default class for the rest.
flow_caps() {
    {
        echo "qdisc add dev eth0 root handle 1: htb default 2"
        echo "class add dev eth0 parent 1: classid 1:1 htb rate $2 ceil $2 burst 256kb cburst 256kb quantum 65536"
        echo "class add dev eth0 parent 1:1 classid 1:2 htb rate 1mbit ceil $2 quantum 65536"
        b=0
        while [ $b -lt 64 ]; do
            printf 'class add dev eth0 parent 1:1 classid 1:%x htb rate 1mbit ceil %s burst 64kb cburst 64kb quantum 65536\n' \
                $((16 + b)) "$3"
            b=$((b + 1))
        done
        echo "filter add dev eth0 parent 1: prio 1 bpf bytecode \"$FLOW_BPF\""
    } | tc -n "$1" -batch -
}

up() {
    [ $# -ge 1 ] || die "up: how many namespaces?"
    n=$1
    shift
    rate=""
    flow_rate=""
    while [ $# -gt 0 ]; do
        case $1 in
            --rate) [ $# -ge 2 ] || die "up: --rate needs a value"; rate=$2; shift 2 ;;
            --rate=*) rate=${1#--rate=}; shift ;;
            --flow-rate) [ $# -ge 2 ] || die "up: --flow-rate needs a value"; flow_rate=$2; shift 2 ;;
            --flow-rate=*) flow_rate=${1#--flow-rate=}; shift ;;
            *) die "up: unknown argument '$1'" ;;
        esac
    done
    case $n in
        ''|*[!0-9]*) die "up: '$n' is not a number of namespaces" ;;
    esac
    if [ "$n" -lt 1 ] || [ "$n" -gt 200 ]; then
        die "up: between 1 and 200 namespaces"
    fi
    [ "$(id -u)" = 0 ] || { echo "testbed.sh: up: needs root" >&2; exit 77; }
    command -v ip >/dev/null || { echo "testbed.sh: up: needs ip (iproute2)" >&2; exit 77; }
    if [ -n "$rate" ]; then
        command -v tc >/dev/null || { echo "testbed.sh: up: --rate needs tc (iproute2)" >&2; exit 77; }
    fi
    [ -z "$flow_rate" ] || [ -n "$rate" ] || die "up: --flow-rate needs --rate (the link's limit)"

    # Unique per run: this script's pid, unless an earlier testbed whose
    # script had the same pid is still up.
    id=$$
    while ip netns list 2>/dev/null | grep -q "^loomt$id-" ||
          ip link show "lmb$id" >/dev/null 2>&1; do
        id=$((id + 1))
    done
    prefix=loomt$id
    names "$prefix"
    net=$(pick_net) || die "up: no free /24 left in 10.231.0.0/16"
    if ! ip netns add "$prefix-0" 2>/dev/null; then
        echo "testbed.sh: up: cannot create a network namespace here" >&2
        exit 77
    fi
    # From here on a failure takes down what was made, so a failed `up`
    # leaves nothing behind.
    trap 'down "$prefix" >/dev/null 2>&1' EXIT
    run() {
        "$@" || die "up: failed: $*"
    }
    run ip link add name "$bridge" type bridge
    # Bridged frames must not meet the root namespace's iptables FORWARD
    # rules (br_netfilter, e.g. Docker's DROP policy); older kernels lack the
    # per-bridge switch, which is fine when nobody filters.
    ip link set dev "$bridge" type bridge nf_call_iptables 0 nf_call_ip6tables 0 \
        nf_call_arptables 0 2>/dev/null
    run ip addr add "$net.254/24" dev "$bridge"
    run ip link set "$bridge" up
    i=0
    while [ $i -lt "$n" ]; do
        ns=$prefix-$i
        [ $i -eq 0 ] || run ip netns add "$ns"
        run ip link add "lmv$id-$i" type veth peer name "lmp$id-$i"
        run ip link set "lmp$id-$i" netns "$ns"
        run ip -n "$ns" link set "lmp$id-$i" name eth0
        run ip -n "$ns" addr add "$net.$((i + 1))/24" dev eth0
        run ip -n "$ns" link set lo up
        run ip -n "$ns" link set eth0 up
        run ip link set "lmv$id-$i" master "$bridge"
        run ip link set "lmv$id-$i" up
        if [ -n "$rate" ]; then
            # burst: enough for the rate at a 1 ms timer tick, at least 64 KiB;
            # latency: how long a packet may queue before it is dropped.
            run tc qdisc add dev "lmv$id-$i" root tbf rate "$rate" burst 256kb latency 50ms
            if [ -n "$flow_rate" ]; then
                flow_caps "$ns" "$rate" "$flow_rate" || die "up: cannot cap flows in $ns (tc htb, bpf)"
            else
                run tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
            fi
        fi
        i=$((i + 1))
    done
    trap - EXIT
    echo "LOOMTB_PREFIX=$prefix; LOOMTB_NET=$net; LOOMTB_N=$n;"
    echo "export LOOMTB_PREFIX LOOMTB_NET LOOMTB_N"
}

[ $# -ge 1 ] || die "usage: testbed.sh up N [--rate RATE [--flow-rate RATE]] | exec I cmd... | down [PREFIX]"
cmd=$1
shift
case $cmd in
    up) up "$@" ;;
    down) down "$@" ;;
    exec)
        [ $# -ge 2 ] || die "exec: usage: testbed.sh exec I cmd args..."
        [ -n "${LOOMTB_PREFIX:-}" ] || die "exec: LOOMTB_PREFIX is not set (eval the output of up)"
        i=$1
        shift
        exec ip netns exec "$LOOMTB_PREFIX-$i" "$@"
        ;;
    *) die "unknown command '$cmd' (up, exec, down)" ;;
esac
