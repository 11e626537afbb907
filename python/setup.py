"""Build the loom package: the C extension loom._loom over libloom, and the
pure-Python adapters (loom.numpy, loom.torch, loom.tensorflow, loom.keras).
`pip install ./python` runs this through pyproject.toml (PEP 517); the tests
run `setup.py build` with LOOM_BUILD_DIR set to this tree's build.

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

ext_modules, cmdclass = [ext], {}


def torch_c10d_extension():
    """loom.torch._c10d, the torch.distributed backend, where the interpreter
    running this has a torch whose C++ API has c10d::Backend (2.1 and later;
    Debian's 1.13 has not: the Horovod API alone is built for it)."""
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return None
    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (2, 1) or not torch.distributed.is_available():
        return None
    return cpp_extension.CppExtension(
        "loom.torch._c10d",
        sources=["loom/torch/_c10d.cpp"],
        include_dirs=include_dirs,
        library_dirs=library_dirs,
        runtime_library_dirs=library_dirs,
        libraries=["loom"],
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"] + extra_compile,
    ), cpp_extension.BuildExtension.with_options(use_ninja=False)   # ninja would compile _loom.c as C++


if os.environ.get("LOOM_TORCH_C10D", "auto") != "0":
    found = torch_c10d_extension()
    if found is not None:
        ext_modules.append(found[0])
        cmdclass["build_ext"] = found[1]

# The package's name, version, packages and the torch.distributed.backends entry
# point are in pyproject.toml.
# pip install (loom_build.py) builds in a fresh directory of its own.
options = {}
if os.environ.get("LOOM_BUILD_BASE"):
    options["build"] = {"build_base": os.environ["LOOM_BUILD_BASE"]}
setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options=options,
)
