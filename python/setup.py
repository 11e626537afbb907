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
import ctypes
import ctypes.util
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
    cuda = c10d_cuda(torch, cpp_extension)
    return cpp_extension.CppExtension(
        "loom.torch._c10d",
        sources=["loom/torch/_c10d.cpp"],
        include_dirs=include_dirs + cuda.get("include_dirs", []),
        library_dirs=library_dirs + cuda.get("library_dirs", []),
        runtime_library_dirs=library_dirs,
        libraries=["loom"] + cuda.get("libraries", []),
        define_macros=cuda.get("define_macros", []),
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"] + extra_compile,
    ), cpp_extension.BuildExtension.with_options(use_ninja=False)   # ninja would compile _loom.c as C++


def libloom_has_cuda():
    """Whether the libloom the extension links was built with CUDA: its
    header loom_cuda.h is found and the library exports the stream-ordered
    calls (a libloom without CUDA has neither)."""
    dirs = include_dirs + ["/usr/local/include", "/usr/include"]
    if not any(os.path.exists(os.path.join(d, "loom_cuda.h")) for d in dirs):
        return False
    candidates = [os.path.join(d, "libloom.so") for d in library_dirs]
    candidates.append(ctypes.util.find_library("loom"))
    for path in candidates:
        if path and (os.path.exists(path) or not os.path.isabs(path)):
            try:
                return hasattr(ctypes.CDLL(path), "loom_comm_set_device")
            except OSError:
                continue
    return False


def c10d_cuda(torch, cpp_extension):
    """What the extension needs to take CUDA tensors (compiled with
    LOOM_C10D_CUDA), where torch is a CUDA build, a CUDA toolkit's headers
    are found and libloom has CUDA; else nothing, and the extension is the
    CPU-only one. g++ compiles it (no .cu files): torch's c10_cuda and
    torch_cuda give streams, events and the caching allocator.
    LOOM_TORCH_CUDA=0 leaves CUDA out, =1 makes its absence an error."""
    want = os.environ.get("LOOM_TORCH_CUDA", "auto")
    if want == "0":
        return {}
    why = None
    if not torch.backends.cuda.is_built():
        why = "torch is not a CUDA build"
    elif cpp_extension.CUDA_HOME is None:
        why = "no CUDA toolkit (CUDA_HOME) for the headers"
    elif not libloom_has_cuda():
        why = "libloom was built without CUDA"
    if why is None:
        try:
            inc = cpp_extension.include_paths(device_type="cuda")
            lib = cpp_extension.library_paths(device_type="cuda")
        except TypeError:   # an older torch: include_paths(cuda=True)
            inc = cpp_extension.include_paths(cuda=True)
            lib = cpp_extension.library_paths(cuda=True)
        if not any(os.path.exists(os.path.join(d, "cuda_runtime_api.h")) for d in inc):
            why = "cuda_runtime_api.h is not in " + ", ".join(inc)
    if why is not None:
        if want == "1":
            raise SystemExit("loom.torch._c10d: LOOM_TORCH_CUDA=1, but " + why)
        return {}
    return {"include_dirs": inc, "library_dirs": lib, "libraries": ["c10_cuda", "torch_cuda"],
            "define_macros": [("LOOM_C10D_CUDA", "1")]}


if os.environ.get("LOOM_TORCH_C10D", "auto") != "0":
    found = torch_c10d_extension()
    if found is not None:
        ext_modules.append(found[0])
        cmdclass["build_ext"] = found[1]


def tf_async_op_extension():
    """loom.tensorflow._async_op, the op that runs a collective in a graph
    without holding one of TensorFlow's threads (loom/tensorflow/_async.py),
    where the interpreter running this has TensorFlow: compiled against that
    TensorFlow's headers and framework library, which loom.tensorflow loads
    it into. Without it graphs fall back to tf.py_function.
    LOOM_TF_OP=0 leaves it out, =1 makes its absence an error."""
    want = os.environ.get("LOOM_TF_OP", "auto")
    if want == "0":
        return None
    try:
        import tensorflow as tf
    except ImportError as exc:
        if want == "1":
            raise SystemExit("loom.tensorflow._async_op: LOOM_TF_OP=1, but %s" % exc)
        return None
    return Extension(
        "loom.tensorflow._async_op",
        sources=["loom/tensorflow/_async_op.cc"],
        language="c++",
        # TensorFlow's headers as system headers: -Wall for this file only.
        extra_compile_args=["-isystem" + f[2:] if f.startswith("-I") else f
                            for f in tf.sysconfig.get_compile_flags()] + ["-O2", "-Wall", "-Wextra"],
        extra_link_args=tf.sysconfig.get_link_flags(),
    )


found = tf_async_op_extension()
if found is not None:
    ext_modules.append(found)

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
