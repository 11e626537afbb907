#!/bin/sh
# run.sh SRCDIR BUILDDIR - build the libFuzzer targets of tests/fuzz with clang
# (-fsanitize=fuzzer,address,undefined), replay each target's corpus
# (tests/fuzz/corpus/<target>/), then fuzz each for FUZZ_SECONDS (default 30).
# `make fuzz` runs it. A crash leaves its input in BUILDDIR/fuzz-build/ as
# crash-<target>-*: add it to the corpus (it becomes a test case) and fix it.
#
# Environment: FUZZ_SECONDS, FUZZ_TARGETS (default: every fuzz_*.c and
# fuzz_*.py here), FUZZ_CC (default: clang, else clang-18 .. clang-14),
# HIREDIS_LIBS, LIBCRYPTO_LIBS. A new target is one file, tests/fuzz/fuzz_<name>.c defining
# LLVMFuzzerTestOneInput (or fuzz_<name>.py taking libFuzzer's arguments, run
# under atheris where /opt/loom-fuzz has it), plus a seed corpus in tests/fuzz/corpus/<name>/; it
# links with the whole library, instrumented (a target that #includes a
# source file, as fuzz_store_server.c does store/tcp_server.c, gets that file
# left out of its link: see own_source).
# Exit: 0 all clean, 1 a build failed or a target crashed, 77 no clang/libFuzzer.

srcdir=${1:?usage: run.sh SRCDIR BUILDDIR}
builddir=${2:?usage: run.sh SRCDIR BUILDDIR}
srcdir=$(cd "$srcdir" && pwd)
builddir=$(cd "$builddir" && pwd)
seconds=${FUZZ_SECONDS:-30}
out=$builddir/fuzz-build
mkdir -p "$out/obj" || exit 1

all_targets=$(cd "$srcdir/tests/fuzz" && ls fuzz_*.c fuzz_*.py | sed 's/^fuzz_//; s/\.[cp]y*$//')
targets=${FUZZ_TARGETS:-$all_targets}

# Python targets (fuzz_<name>.py, the decoders the Python package runs):
# under atheris where /opt/loom-fuzz has it (tests/install-deps.sh), else
# with the target's own mutator; the same corpus layout and arguments.
failed=0
py_targets=""
for t in $targets; do
    [ -f "$srcdir/tests/fuzz/fuzz_$t.py" ] && py_targets="$py_targets $t"
done
fuzz_py=python3
if /opt/loom-fuzz/bin/python -c 'import atheris' 2>/dev/null; then
    fuzz_py=/opt/loom-fuzz/bin/python
fi
for t in $py_targets; do
    seeds=$srcdir/tests/fuzz/corpus/$t
    work=$out/corpus/$t
    mkdir -p "$work"
    engine="$fuzz_py (atheris)"
    [ "$fuzz_py" = python3 ] && engine="python3 (no atheris: its own mutator)"
    if ! $fuzz_py "$srcdir/tests/fuzz/fuzz_$t.py" -runs=0 "$seeds" >"$out/$t.replay.log" 2>&1; then
        echo "fuzz: FAIL: fuzz_$t fails on its corpus ($out/$t.replay.log)" >&2
        tail -n 30 "$out/$t.replay.log" >&2
        failed=1
    elif $fuzz_py "$srcdir/tests/fuzz/fuzz_$t.py" -max_total_time="$seconds" -timeout=10 \
            -rss_limit_mb=2048 -artifact_prefix="$out/crash-$t-" -print_final_stats=1 \
            "$work" "$seeds" >"$out/$t.log" 2>&1; then
        echo "fuzz: ok: fuzz_$t under $engine, corpus of $(ls "$seeds" | wc -l) replayed, $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/$t.log" | grep -o '[0-9]*$') runs in ${seconds} s"
    else
        echo "fuzz: FAIL: fuzz_$t: $(tail -n 5 "$out/$t.log")" >&2
        echo "      add the crash-$t-* input in $out to tests/fuzz/corpus/$t/ and fix the bug" >&2
        failed=1
    fi
done
c_targets=""
for t in $targets; do
    [ -f "$srcdir/tests/fuzz/fuzz_$t.py" ] || c_targets="$c_targets $t"
done
[ -n "$c_targets" ] || exit $failed

skip() { echo "fuzz: skipped: $*"; [ "$failed" = 0 ] || exit 1; exit 77; }
cc=${FUZZ_CC:-}
if [ -z "$cc" ]; then
    for c in clang clang-18 clang-17 clang-16 clang-15 clang-14; do
        command -v $c >/dev/null 2>&1 && { cc=$c; break; }
    done
fi
[ -n "$cc" ] || skip "no clang (apt-get install clang)"
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$out/probe.c"
"$cc" -fsanitize=fuzzer "$out/probe.c" -o "$out/probe" >/dev/null 2>&1 ||
    skip "$cc cannot link libFuzzer (apt-get install libclang-rt-14-dev, or the one of your clang)"
[ -f "$builddir/config.h" ] || { echo "fuzz: run configure first" >&2; exit 1; }

san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cflags="-std=gnu11 -g -O1 -fno-omit-frame-pointer -Wall -Wno-unused-function $san"
# The host-memory library: the build's configuration without CUDA and verbs
# (their code needs nvcc or a device, and nothing fuzzed reaches it).
{ grep -v 'define LOOM_HAVE_CUDA\|define LOOM_HAVE_VERBS\|define LOOM_ACCEL_TABLE' "$builddir/config.h"
  echo '#define LOOM_ACCEL_TABLE loom_accel_null'; } >"$out/config.h.new"
cmp -s "$out/config.h.new" "$out/config.h" || mv "$out/config.h.new" "$out/config.h"
cppflags="-include $out/config.h -DLOOM_BUILDING -I$srcdir -I$srcdir/include -I$builddir"
common=$(cd "$srcdir" && ls base/*.c store/*.c src/*.c algorithms/*.c transports/*.c transports/tcp/*.c \
    transports/shm/*.c transports/ibverbs/ib_util.c transports/ibverbs/ib_regcache.c)
libs="-lpthread -lm -ldl ${LIBCRYPTO_LIBS:--lcrypto}"
if grep -q '^#define HAVE_HIREDIS 1' "$out/config.h"; then
    libs="$libs ${HIREDIS_LIBS:--lhiredis}"
else
    common=$(echo "$common" | grep -v store/redis)
fi

# The library sources, instrumented once for all targets.
for f in $common; do
    o=$out/obj/$(echo "$f" | tr / _ | sed 's/\.c$/.o/')
    if [ ! -f "$o" ] || [ "$srcdir/$f" -nt "$o" ] || [ "$out/config.h" -nt "$o" ]; then
        $cc $cflags -fsanitize=fuzzer-no-link $cppflags -c "$srcdir/$f" -o "$o" ||
            { echo "fuzz: cannot compile $f" >&2; exit 1; }
    fi
done

# The library source a target includes itself, if any.
own_source() { sed -n 's/^#include "\(.*\)\.c"$/\1.c/p' "$1"; }

for t in $c_targets; do
    src=$srcdir/tests/fuzz/fuzz_$t.c
    [ -f "$src" ] || { echo "fuzz: no target $t ($src)" >&2; failed=1; continue; }
    own=$(own_source "$src")
    objs=""
    for f in $common; do
        [ -n "$own" ] && [ "$f" = "$own" ] && continue
        objs="$objs $out/obj/$(echo "$f" | tr / _ | sed 's/\.c$/.o/')"
    done
    if ! $cc $cflags -fsanitize=fuzzer $cppflags "$src" $objs -o "$out/fuzz_$t" $libs; then
        echo "fuzz: cannot build fuzz_$t" >&2
        failed=1
        continue
    fi
    seeds=$srcdir/tests/fuzz/corpus/$t
    work=$out/corpus/$t
    mkdir -p "$work" "$seeds"
    # The corpus first: every kept case (crashes found before among them) must pass.
    if ! "$out/fuzz_$t" -runs=0 "$seeds" >"$out/$t.replay.log" 2>&1; then
        echo "fuzz: FAIL: fuzz_$t fails on its corpus ($out/$t.replay.log)" >&2
        tail -n 30 "$out/$t.replay.log" >&2
        failed=1
        continue
    fi
    # New inputs go to the work corpus (first directory), never into the tree.
    if "$out/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
            -artifact_prefix="$out/crash-$t-" -print_final_stats=1 \
            "$work" "$seeds" >"$out/$t.log" 2>&1; then
        echo "fuzz: ok: fuzz_$t, corpus of $(ls "$seeds" | wc -l) replayed, $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$out/$t.log" | grep -o '[0-9]*$') runs in ${seconds} s"
    else
        echo "fuzz: FAIL: fuzz_$t crashed ($out/$t.log); its input: $(ls "$out"/crash-$t-* 2>/dev/null | head -n 1)" >&2
        echo "      add that file to tests/fuzz/corpus/$t/ and fix the bug" >&2
        grep -A 12 'ERROR\|runtime error\|deadly signal' "$out/$t.log" | head -n 30 >&2
        failed=1
    fi
done
exit $failed
