#!/bin/sh
# install-deps.sh - installs what the build and the whole test suite use, on
# Debian 12: the packages of tests/deps.txt (one list: README's test command
# and .ci/run both call this script), then the Python environments from PyPI:
# /opt/loom-tf (TensorFlow and Keras: PyPI's tensorflow-cpu brings NumPy 2,
# which Debian's python3-torch, built for NumPy 1, cannot load, so it has an
# environment of its own), /opt/loom-fuzz (atheris, for the Python fuzz
# target) and, where python/torch_env.sh exists, the one it makes
# (/opt/loom-torch, PyPI's PyTorch).
#   tests/install-deps.sh            install (as root, or through sudo)
#   tests/install-deps.sh --list     print the package names only
#   tests/install-deps.sh --dry-run  ask apt-get what it would do; no PyPI
# Exits non-zero when apt-get fails; a Python environment that cannot be made
# is a warning (its tests are then skipped, and `make check` says so).
set -u
cd "$(dirname "$0")/.." || exit 1
packages=$(sed -e 's/#.*//' tests/deps.txt | awk 'NF { print $1 }' | tr '\n' ' ')
case ${1:-} in
--list)
    echo "$packages"
    exit 0
    ;;
--dry-run) dry=1 ;;
"") dry=0 ;;
*)
    echo "usage: $0 [--list | --dry-run]" >&2
    exit 2
    ;;
esac

as_root=""
if [ "$(id -u)" != 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "install-deps: run as root (or install sudo)" >&2
        exit 1
    fi
    as_root=sudo
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: no apt-get: install the packages of tests/deps.txt (Debian 12 names) by hand" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
if [ "$dry" = 1 ]; then
    # shellcheck disable=SC2086
    $as_root apt-get install -s --no-install-recommends $packages
    exit
fi
$as_root apt-get update -qq || { echo "install-deps: apt-get update failed" >&2; exit 1; }
# shellcheck disable=SC2086
if ! $as_root apt-get install -y -qq --no-install-recommends $packages; then
    echo "install-deps: apt-get install failed" >&2
    exit 1
fi

# Debian's python3: the one the extension is built with in these environments.
if /opt/loom-tf/bin/python -c 'import tensorflow, keras' 2>/dev/null; then
    echo "install-deps: /opt/loom-tf has TensorFlow and Keras"
elif $as_root /usr/bin/python3 -m venv /opt/loom-tf && $as_root /opt/loom-tf/bin/pip install -q tensorflow-cpu; then
    echo "install-deps: made /opt/loom-tf (TensorFlow and Keras)"
else
    echo "install-deps: warning: could not install tensorflow-cpu into /opt/loom-tf: the TensorFlow and Keras tests will be skipped" >&2
fi
# atheris, for the Python fuzz target (tests/fuzz/fuzz_negotiation.py): an
# environment of its own, as it needs nothing else (without it, the target
# runs on a mutator of its own, without coverage).
if /opt/loom-fuzz/bin/python -c 'import atheris' 2>/dev/null; then
    echo "install-deps: /opt/loom-fuzz has atheris"
elif $as_root /usr/bin/python3 -m venv /opt/loom-fuzz && $as_root /opt/loom-fuzz/bin/pip install -q atheris; then
    echo "install-deps: made /opt/loom-fuzz (atheris)"
else
    echo "install-deps: warning: could not install atheris into /opt/loom-fuzz: the Python fuzz target runs without coverage" >&2
fi
if [ -x python/torch_env.sh ]; then
    $as_root python/torch_env.sh ||
        echo "install-deps: warning: python/torch_env.sh failed: the tests on PyPI's PyTorch will be skipped" >&2
fi
exit 0
