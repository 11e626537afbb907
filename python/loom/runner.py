"""horovodrun's command line over loomrun:

    python3 -m loom.runner -np 4 -H host1:2,host2:2 python3 train.py

takes horovodrun's common flags and starts the job with loomrun (found as
$LOOMRUN, else `loomrun` on PATH). --gloo, --mpi, --jsm and the network and
logging flags are accepted and ignored (Loom has one transport layer);
--timeline-filename starts loom.torch's timeline (HOROVOD_TIMELINE) in every
rank; the tunables become LOOM_FUSION_THRESHOLD, LOOM_CYCLE_TIME and
LOOM_CACHE_CAPACITY; --min-np, --max-np, --host-discovery-script and the other
elastic flags make it `loomrun --elastic`. --print-command prints the loomrun
command instead of running it."""
import argparse
import os
import shutil
import sys

ELASTIC = ("min_np", "max_np", "host_discovery_script", "slots_per_host", "elastic_timeout",
           "reset_limit", "blacklist_cooldown_range")


def parser():
    p = argparse.ArgumentParser(prog="python3 -m loom.runner",
                                description="horovodrun's command line, run by loomrun")
    p.add_argument("-np", "--num-proc", dest="np", type=int)
    p.add_argument("-H", "--hosts", dest="hosts")
    p.add_argument("-hostfile", "--hostfile", dest="hostfile")
    p.add_argument("-p", "--ssh-port", dest="ssh_port", type=int)
    p.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file")
    p.add_argument("--output-filename", dest="output_filename")
    p.add_argument("--timeline-filename", dest="timeline_filename")
    p.add_argument("--timeline-mark-cycles", dest="timeline_mark_cycles", action="store_true")
    p.add_argument("--fusion-threshold-mb", dest="fusion_threshold_mb", type=float)
    p.add_argument("--cycle-time-ms", dest="cycle_time_ms", type=float)
    p.add_argument("--cache-capacity", dest="cache_capacity", type=int)
    p.add_argument("--disable-cache", dest="disable_cache", action="store_true")
    p.add_argument("--start-timeout", dest="start_timeout", type=int)
    # Elastic.
    p.add_argument("--min-np", "--min-num-proc", dest="min_np", type=int)
    p.add_argument("--max-np", "--max-num-proc", dest="max_np", type=int)
    p.add_argument("--host-discovery-script", dest="host_discovery_script")
    p.add_argument("--slots-per-host", "--slots", dest="slots_per_host", type=int)
    p.add_argument("--elastic-timeout", dest="elastic_timeout", type=int)
    p.add_argument("--reset-limit", dest="reset_limit", type=int)
    p.add_argument("--blacklist-cooldown-range", dest="blacklist_cooldown_range", type=int, nargs=2)
    # Accepted and ignored: Loom picks its transports itself.
    for flag in ("--gloo", "--mpi", "--jsm", "--verbose", "--disable-hierarchical-allreduce",
                 "--hierarchical-allreduce", "--hierarchical-allgather", "--autotune", "-v",
                 "--check-build", "--nccl", "--ccl"):
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in ("--network-interface", "--network-interfaces", "--nics", "--log-level",
                 "--mpi-args", "--tcp", "--binding-args", "--num-nccl-streams", "--autotune-log-file",
                 "--config-file", "--gloo-timeout-seconds"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    p.add_argument("--print-command", action="store_true",
                   help="print the loomrun command line and environment, do not run")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def loomrun_command(a):
    """(argv, extra environment) for loomrun from parsed horovodrun arguments."""
    exe = os.environ.get("LOOMRUN") or shutil.which("loomrun") or "loomrun"
    argv, env = [exe], {}
    elastic = any(getattr(a, k) is not None for k in ELASTIC)
    if elastic:
        argv.append("--elastic")
    if a.np is not None:
        argv += ["-np", str(a.np)]
    if a.hosts:
        argv += ["-H", a.hosts]
    if a.hostfile:
        argv += ["--hostfile", a.hostfile]
    if a.ssh_port is not None:
        argv += ["--ssh-port", str(a.ssh_port)]
    if a.ssh_identity_file:
        argv += ["--ssh-identity-file", a.ssh_identity_file]
    if a.output_filename:
        argv += ["--output-filename", a.output_filename]
    if elastic and a.max_np is None and (a.hosts or a.hostfile or a.host_discovery_script):
        # horovodrun without --max-np fills every slot its hosts have, now and
        # as hosts come; loomrun without it stays at -np.
        argv += ["--max-np", "all"]
    for opt, key in (("--min-np", "min_np"), ("--max-np", "max_np"),
                     ("--host-discovery-script", "host_discovery_script"),
                     ("--slots-per-host", "slots_per_host"), ("--elastic-timeout", "elastic_timeout"),
                     ("--reset-limit", "reset_limit")):
        v = getattr(a, key)
        if v is not None:
            argv += [opt, str(v)]
    if a.blacklist_cooldown_range is not None:
        # loomrun has one cooldown: the range's upper end.
        argv += ["--blacklist-cooldown", str(a.blacklist_cooldown_range[1])]
    if a.timeline_filename:
        env["HOROVOD_TIMELINE"] = a.timeline_filename
        if a.timeline_mark_cycles:
            env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
    if a.fusion_threshold_mb is not None:
        env["LOOM_FUSION_THRESHOLD"] = str(int(a.fusion_threshold_mb * (1 << 20)))
    if a.cycle_time_ms is not None:
        env["LOOM_CYCLE_TIME"] = str(a.cycle_time_ms)
    if a.cache_capacity is not None:
        env["LOOM_CACHE_CAPACITY"] = str(a.cache_capacity)
    if a.disable_cache:
        env["LOOM_CACHE_CAPACITY"] = "0"
    for k in env:
        argv += ["-x", k]   # to remote hosts too
    command = a.command[1:] if a.command and a.command[0] == "--" else a.command
    return argv + ["--"] + command, env


def main(args=None):
    a = parser().parse_args(args)
    if not a.command:
        parser().error("no command to run")
    if a.np is None and not a.hosts and not a.hostfile and a.host_discovery_script is None:
        parser().error("-np is required (or -H, --hostfile, --host-discovery-script)")
    argv, env = loomrun_command(a)
    if a.print_command:
        print(" ".join("%s=%s" % kv for kv in sorted(env.items())), " ".join(argv))
        return 0
    os.environ.update(env)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        sys.stderr.write("loom.runner: cannot run %s: %s (set LOOMRUN to loomrun's path)\n" % (argv[0], e))
        return 127


if __name__ == "__main__":
    sys.exit(main())
