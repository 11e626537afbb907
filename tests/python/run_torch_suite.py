#!/usr/bin/env python3
"""run_torch_suite.py - PyTorch's own torch.distributed suite against Loom.

Runs the CPU tests of torch/testing/_internal/distributed/distributed_test.py,
from the torch this interpreter imports (nothing of it is copied here), with
the test class built the way PyTorch's test/distributed/test_distributed_spawn.py
builds it (TestDistBackend + DistributedTest._DistTestBase, each test spawning
WORLD_SIZE processes that meet through a FileStore), once with BACKEND=loom and
once with BACKEND=gloo in the same run, then summarises passed / failed /
skipped side by side for each world size.

Two modes:
  plain        BACKEND=loom beside BACKEND=gloo. The suite's feature sets
               (DistTestCases.backend_feature "ddp", "subgroup", "plugin")
               name loom, as a plugin backend that runs DDP and sub-groups.
  gloo-mapped  the tests the suite runs only for a backend literally named
               "gloo" (those gloo ran and loom skipped in the plain mode, or
               with --mapped-all every test), run with BACKEND=gloo while
               torch's "gloo" plugin entry creates a Loom backend: the
               program believes it runs gloo, every collective goes through
               Loom. Compared with real gloo.

Usage:
  run_torch_suite.py [--world-sizes 2,3,4] [--modes plain,gloo-mapped]
                     [-k SUBSTRING]... [--tests FILE] [--jobs N] [--json OUT]
                     [--require-gloo-parity]

--require-gloo-parity exits 1 when a test gloo passes fails on loom (in
either mode); without it the exit status is 0 once the suite ran.
The package (loom.torch._c10d) must be importable: PYTHONPATH as
tests/test_torch_suite.sh sets it, or an installed loom.
"""
import os
import sys

CHILD = os.environ.get("LOOM_SUITE_AS")   # loom | gloo | gloo-mapped in a test process

if CHILD:
    # The test module, as test_distributed_spawn.py is one. The processes a
    # test spawns import this file again (as __mp_main__), so what follows runs
    # in every rank: the backend set-up must be at module level.
    os.environ["BACKEND"] = "gloo" if CHILD.startswith("gloo") else "loom"
    import torch
    import torch.distributed as dist

    from torch.testing._internal.common_distributed import DistTestCases

    if CHILD == "loom":
        import loom.torch.distributed  # noqa: F401  registers "loom"
        for feature in ("ddp", "subgroup", "plugin"):
            DistTestCases.backend_feature[feature].add("loom")
    elif CHILD == "gloo-mapped":
        import loom.torch.distributed as _ld
        _ld.map_gloo_to_loom()

    from torch.testing._internal.distributed.distributed_test import (
        DistributedTest, TestDistBackend)

    torch.backends.cuda.matmul.allow_tf32 = False

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if os.environ.get("LOOM_SUITE_START") == "fork":
                self._start_processes(torch.multiprocessing.get_context("fork").Process)
            else:
                self._spawn_processes()
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    TestDistBackendWithSpawn.__name__ = "TestDistBackendWithSpawn" + CHILD.upper().replace("-", "_")
    TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__
    globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn


def child_main(names_file, out_file):
    """Run the tests named in names_file (all with an empty file) and write
    one line per test: NAME STATUS [first line of the reason]."""
    import unittest
    cls = globals()[TestDistBackendWithSpawn.__name__]
    loader = unittest.TestLoader()
    all_names = loader.getTestCaseNames(cls)
    with open(names_file) as f:
        wanted = [l.strip() for l in f if l.strip()]
    names = [n for n in wanted if n in all_names] if wanted else list(all_names)

    class Result(unittest.TextTestResult):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.rows = []

        def _row(self, test, status, why=""):
            lines = [l.strip() for l in str(why).strip().splitlines() if l.strip()]
            told = [l for l in lines if "Error" in l or "Exception" in l or "exit code" in l]
            why = (told or lines or [""])[-1][:300]
            self.rows.append((test._testMethodName, status, why))
            with open(out_file, "a") as f:
                f.write(f"{test._testMethodName}\t{status}\t{why}\n")

        def addSuccess(self, test):
            super().addSuccess(test)
            self._row(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._row(test, "failed", self._exc_info_to_string(err, test))

        def addError(self, test, err):
            super().addError(test, err)
            self._row(test, "failed", self._exc_info_to_string(err, test))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._row(test, "skipped", reason)

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._row(test, "passed")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._row(test, "failed", "unexpected success")

    suite = unittest.TestSuite(cls(n) for n in names)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=Result)
    runner.run(suite)
    return 0


# ---- The orchestrating side. ----------------------------------------------

def list_tests(py):
    """Every test name of the class (the same for every backend)."""
    import subprocess
    code = ("import unittest, run_torch_suite as m; "
            "print('\\n'.join(unittest.TestLoader().getTestCaseNames(m.TestDistBackendWithSpawnLOOM)))")
    env = dict(os.environ, LOOM_SUITE_AS="loom", WORLD_SIZE="2", TEMP_DIR="/tmp")
    env["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__)) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([py, "-c", code], env=env, check=True, capture_output=True, text=True)
    return [l for l in out.stdout.split() if l.startswith("test")]


def run_shards(py, backend_as, world_size, names, jobs, logdir, per_test_s, start="spawn"):
    """Run names in jobs concurrent test processes; {name: (status, why)}."""
    import subprocess
    import tempfile
    import time
    shards = [names[i::jobs] for i in range(jobs)]
    procs = []
    for i, shard in enumerate(shards):
        if not shard:
            continue
        tmp = tempfile.mkdtemp(prefix=f"suite-{backend_as}-{world_size}-{i}-", dir=logdir)
        os.mkdir(os.path.join(tmp, "barrier"))
        names_file = os.path.join(tmp, "names")
        with open(names_file, "w") as f:
            f.write("\n".join(shard) + "\n")
        out_file = os.path.join(tmp, "results")
        open(out_file, "w").close()
        env = dict(os.environ, LOOM_SUITE_AS=backend_as, WORLD_SIZE=str(world_size),
                   TEMP_DIR=tmp, OMP_NUM_THREADS="1", LOOM_SUITE_START=start,
                   DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(per_test_s))
        env.pop("TORCH_DISTRIBUTED_DEBUG", None)
        log = open(os.path.join(tmp, "log"), "w")
        p = subprocess.Popen([py, os.path.abspath(__file__), "--child", names_file, out_file],
                             env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                             start_new_session=True)
        procs.append((p, shard, out_file, log, time.monotonic()))
    results = {}
    for p, shard, out_file, log, t0 in procs:
        # Each test is bounded by torch's own per-test timeout; the shard by all of them.
        limit = per_test_s * (len(shard) + 1)
        try:
            p.wait(timeout=max(1, limit - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
        log.close()
        with open(out_file) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 2:
                    results[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
        for n in shard:
            results.setdefault(n, ("failed", f"no result (test process exit {p.returncode}; "
                                             f"log {log.name})"))
    return results


def count(res, names):
    c = {"passed": 0, "failed": 0, "skipped": 0}
    for n in names:
        c[res[n][0]] += 1
    return c


def main(argv):
    import argparse
    import json
    import tempfile
    import time
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", default="2,3,4")
    ap.add_argument("--modes", default="plain,gloo-mapped")
    ap.add_argument("-k", action="append", default=[], help="run tests whose name holds this")
    ap.add_argument("--tests", help="a file naming the tests to run, one a line")
    ap.add_argument("--jobs", type=int, default=2, help="test processes at once per backend")
    ap.add_argument("--per-test-timeout", type=int, default=300)
    ap.add_argument("--start-method", choices=("spawn", "fork"), default="spawn",
                    help="how a test starts its ranks: spawn (test_distributed_spawn.py's "
                         "way; each rank imports torch anew) or fork (PyTorch's former "
                         "test_distributed_fork.py's: MultiProcessTestCase's processes forked; "
                         "much quicker on a busy machine)")
    ap.add_argument("--mapped-all", action="store_true",
                    help="gloo-mapped: every selected test, not only the gloo-only ones")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--logdir", help="keep the test processes' logs here")
    ap.add_argument("--require-gloo-parity", action="store_true")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child_main(*args.child)

    py = sys.executable
    names = list_tests(py)
    if args.tests:
        with open(args.tests) as f:
            want = {l.split("#")[0].strip() for l in f} - {""}
        names = [n for n in names if n in want]
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    logdir = args.logdir or tempfile.mkdtemp(prefix="torch-suite-")
    os.makedirs(logdir, exist_ok=True)
    modes = args.modes.split(",")
    table, regressions, everything = [], [], {}
    torch_version = __import__("importlib.metadata").metadata.version("torch")
    print(f"PyTorch {torch_version} distributed_test.py: {len(names)} tests selected, "
          f"ranks started by {args.start_method}; logs in {logdir}", flush=True)
    for ws in [int(w) for w in args.world_sizes.split(",")]:
        t0 = time.monotonic()
        gloo = run_shards(py, "gloo", ws, names, args.jobs, logdir, args.per_test_timeout,
                          args.start_method)
        loom = run_shards(py, "loom", ws, names, args.jobs, logdir, args.per_test_timeout,
                          args.start_method)
        everything[f"{ws}/gloo"], everything[f"{ws}/loom"] = gloo, loom
        if "plain" in modes:
            table.append((ws, "plain", len(names), count(loom, names), count(gloo, names)))
            # A test the suite runs for "gloo" alone is skipped here; the
            # gloo-mapped run covers it.
            regressions += [(ws, "plain", n, loom[n][1]) for n in names
                            if gloo[n][0] == "passed" and (loom[n][0] == "failed" or (
                                loom[n][0] == "skipped" and "gloo-mapped" not in modes))]
        if "gloo-mapped" in modes:
            only = names if args.mapped_all else [
                n for n in names if loom[n][0] == "skipped" and gloo[n][0] != "skipped"]
            mapped = run_shards(py, "gloo-mapped", ws, only, args.jobs, logdir,
                                args.per_test_timeout, args.start_method) if only else {}
            everything[f"{ws}/gloo-mapped"] = mapped
            table.append((ws, "gloo-mapped", len(only), count(mapped, only), count(gloo, only)))
            regressions += [(ws, "gloo-mapped", n, mapped[n][1]) for n in only
                            if gloo[n][0] == "passed" and mapped[n][0] != "passed"]
        print(f"world size {ws}: {time.monotonic() - t0:.0f} s", flush=True)

    print()
    print("| world size | run | tests | loom passed | loom failed | loom skipped "
          "| gloo passed | gloo failed | gloo skipped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for ws, mode, n, lc, gc in table:
        print(f"| {ws} | {mode} | {n} | {lc['passed']} | {lc['failed']} | {lc['skipped']} "
              f"| {gc['passed']} | {gc['failed']} | {gc['skipped']} |")
    if regressions:
        print("\nPassed on gloo, not on loom:")
        for ws, mode, n, why in regressions:
            print(f"  [{ws} {mode}] {n}: {why}")
    else:
        print("\nEvery test gloo passed, loom passed too.")
    for key, res in everything.items():
        fails = sorted(n for n, (st, _) in res.items() if st == "failed")
        if fails and "gloo" in key and "mapped" not in key:
            print(f"(gloo itself failed at {key.split('/')[0]}: {', '.join(fails)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({k: {n: list(v) for n, v in r.items()} for k, r in everything.items()},
                      f, indent=1, sort_keys=True)
    return 1 if (args.require_gloo_parity and regressions) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
