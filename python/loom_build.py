"""PEP 517 build backend for pip install ./python: setuptools' own, except
that the environment being installed into stays importable, last on the path.

pip builds in an isolated environment holding only the build requirements, so
setup.py would not see the torch it must compile loom.torch._c10d against (and
the extension would silently be left out). The interpreter pip runs is the
target's, so its own site-packages (sysconfig's purelib and platlib) hold that
torch; they go after the isolated ones, which keep precedence for setuptools.
"""
import atexit
import os
import shutil
import sys
import sysconfig
import tempfile

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - the PEP 517 hooks


def _target_site_packages():
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and path not in sys.path:
            sys.path.append(path)


_target_site_packages()
# A build directory of this build's own: pip builds in the source tree, where
# an earlier build for another interpreter (the venv's, with loom.torch._c10d)
# would otherwise be packaged again (setup.py reads LOOM_BUILD_BASE).
if "LOOM_BUILD_BASE" not in os.environ:
    os.environ["LOOM_BUILD_BASE"] = tempfile.mkdtemp(prefix="loom-build-")
    atexit.register(shutil.rmtree, os.environ["LOOM_BUILD_BASE"], True)
__all__ = _setuptools.__all__
