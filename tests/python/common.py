"""Helpers shared by the Python tests: a tally of checks that prints one
"N passed, N failed" line per rank and sets the exit code."""
import os
import sys
import traceback

# False over the CUDA double (tests/torch_cuda_double.sh sets
# LOOM_TEST_NO_TORCH_KERNELS=1), which runs none of torch's own kernels.
TORCH_KERNELS = os.environ.get("LOOM_TEST_NO_TORCH_KERNELS") != "1"


def left_out_without_kernels(test, rank, what):
    """Whether this run leaves out what, which needs a kernel of torch's on the
    device; rank 0 names it in one line (the double's permanent limit, not a
    skip: a GPU runs it)."""
    if not TORCH_KERNELS and rank == 0:
        print("%s: left out (needs a GPU: a kernel of torch's): %s" % (test, what), flush=True)
    return not TORCH_KERNELS


class Tally:
    def __init__(self, rank):
        self.rank, self.passed, self.failed = rank, 0, 0

    def check(self, cond, what):
        if cond:
            self.passed += 1
        else:
            self.failed += 1
            print("rank %d FAIL: %s" % (self.rank, what), flush=True)

    def raises(self, what, fn, *words):
        """Check that fn() raises an error whose text holds every one of words."""
        try:
            fn()
        except Exception as e:   # noqa: BLE001 - the text is what is checked
            msg = str(e)
            self.check(all(w in msg for w in words), "%s: %r does not name %s" % (what, msg, words))
            return
        self.check(False, "%s: no error" % what)

    def run(self, fn, *args):
        """Run one test function; an exception is a failure, not the end."""
        try:
            fn(*args)
        except Exception:   # noqa: BLE001 - reported and counted
            self.failed += 1
            print("rank %d FAIL: %s raised:\n%s" % (self.rank, fn.__name__, traceback.format_exc()),
                  flush=True)

    def finish(self):
        print("rank %d: %d passed, %d failed" % (self.rank, self.passed, self.failed), flush=True)
        sys.exit(1 if self.failed else 0)
