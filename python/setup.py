"""Build the loom package: the C extension loom._loom over libloom, and the
pure-Python adapters (loom.numpy, loom.torch, loom.tensorflow, loom.keras).

libloom is found, in this order:
  1. LOOM_BUILD_DIR: a build tree's directory holding libloom.so (its .libs),
     with the header from LOOM_INCLUDE_DIR or the source tree next to python/;
  2. pkg-config loom (an installed Loom; PKG_CONFIG_PATH for a custom prefix);
  3. the default compiler paths (-lloom).
The library directory is recorded as the extension's rpath, so no
LD_LIBRARY_PATH is needed afterwards.
"""
import os
import shlex
import subprocess

from setuptools import Extension, setup

here = os.path.dirname(os.path.abspath(__file__))


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args, "loom"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return shlex.split(out)


include_dirs, library_dirs, extra_compile = [], [], []
build_dir = os.environ.get("LOOM_BUILD_DIR")
if build_dir:
    build_dir = os.path.abspath(build_dir)
    library_dirs.append(build_dir)
    include_dirs.append(os.environ.get("LOOM_INCLUDE_DIR",
                                       os.path.join(here, os.pardir, "include")))
else:
    cflags, libs = pkg_config("--cflags"), pkg_config("--libs")
    if cflags is not None and libs is not None:
        include_dirs += [f[2:] for f in cflags if f.startswith("-I")]
        library_dirs += [f[2:] for f in libs if f.startswith("-L")]
    elif os.path.exists(os.path.join(here, os.pardir, "include", "loom.h")):
        include_dirs.append(os.path.join(here, os.pardir, "include"))

ext = Extension(
    "loom._loom",
    sources=["loom/_loom.c"],
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    runtime_library_dirs=library_dirs,
    libraries=["loom"],
    extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                        "-Wno-cast-function-type"] + extra_compile,
)

setup(
    name="loom",
    version="0.1.0",
    description="Loom collectives for NumPy, PyTorch, TensorFlow and Keras with Horovod's API",
    packages=["loom", "loom.torch", "loom.tensorflow", "loom.keras"],
    ext_modules=[ext],
    python_requires=">=3.8",
)
