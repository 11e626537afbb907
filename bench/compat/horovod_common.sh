# horovod_common.sh - sourced by horovod_suite.sh and horovod_elastic.sh:
# where a Horovod test file lies, the interpreter for it, and the part of the
# horovod shim package both write.

# horovod_find DIR SUBDIR FILE: sets tdir to the test/ folder of DIR holding
# SUBDIR/FILE (DIR may be a checkout or its test/ folder), else exits 2.
horovod_find() {
    if [ -f "$1/test/$2/$3" ]; then
        tdir=$1/test
    elif [ -f "$1/$2/$3" ]; then
        tdir=$1
    else
        echo "$name: no test/$2/$3 under $1" >&2
        exit 2
    fi
}

# horovod_python FILE: for a TensorFlow or Keras file, PYTHON defaults to the
# first of $LOOM_TF_PYTHON and /opt/loom-tf/bin/python with both (as
# test_python.sh); then python_build.sh picks and builds as for make check.
horovod_python() {
    case $1 in
    *tensorflow*|*keras*)
        if [ -z "${PYTHON:-}" ]; then
            for cand in ${LOOM_TF_PYTHON:-} /opt/loom-tf/bin/python; do
                if "$cand" -c 'import tensorflow, keras' 2>/dev/null; then
                    PYTHON=$cand
                    break
                fi
            done
        fi
        py_need='import numpy, tensorflow, keras'
        export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3} ;;
    esac
}

# horovod_shim DIR: the horovod package under DIR as far as both kinds of
# test import it: horovod.torch, horovod.keras and horovod.tensorflow.keras
# over loom's, and horovod.runner.util.threads.in_thread. Nothing of Horovod
# is copied: each module is an import of loom's, or a helper of our own.
horovod_shim() {
    mkdir -p "$1/horovod/torch" "$1/horovod/runner/util" "$1/horovod/tensorflow/keras" \
        "$1/horovod/keras"
    echo '__version__ = "0.28.1"' > "$1/horovod/__init__.py"
    echo 'from loom.torch import *  # noqa: F401,F403' > "$1/horovod/torch/__init__.py"
    printf '%s\n' 'from loom.keras import *  # noqa: F401,F403' 'from loom.keras import callbacks, elastic  # noqa: F401' |
        tee "$1/horovod/keras/__init__.py" > "$1/horovod/tensorflow/keras/__init__.py"
    : > "$1/horovod/runner/__init__.py"
    : > "$1/horovod/runner/util/__init__.py"
    cat > "$1/horovod/runner/util/threads.py" <<'PY'
import threading


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Start target(*args) in a daemon thread and return it."""
    t = threading.Thread(target=target, args=args, name=name, daemon=daemon)
    t.start()
    return t
PY
}
