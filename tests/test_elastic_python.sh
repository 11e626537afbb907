#!/bin/sh
# Elastic training from Python: tests/test_elastic.sh's scenarios (3 -> 2 -> 3
# with a rank SIGKILLed mid-step and a host added, 4 -> 3, a host removed from
# the discovery script, a rank killed during the reset, below --min-np) run by
# tests/python/elastic_worker.py, a Horovod-style script (hvd.elastic.run,
# TorchState, DistributedOptimizer, commit), under loomrun --elastic. Each must
# end with the model of a fault-free run, bit for bit, with no process left.
# Where a host is added, the workers hold late in the training until its rank
# has joined (MPE_SIZES, bounded): starting Python and PyTorch or TensorFlow
# on a busy machine takes as long as it takes.
# Automake TESTS protocol: 0 pass, 1 fail, 77 skip.
name=test_elastic_python
. "${top_srcdir:-$(dirname "$0")/..}/tests/python_build.sh"
if ! "$py" -c 'import torch' 2>/dev/null; then
    echo "$name: SKIP: $py has no PyTorch (apt-get install python3-torch)"
    exit 77
fi
# loomrun runs an executable: the worker with this interpreter and tree.
cat > "$tmp/elastic_worker" <<WORKER
#!/bin/sh
exec "$py" "$srcdir/tests/python/elastic_worker.py" "\$@"
WORKER
chmod +x "$tmp/elastic_worker"
LOOM_ELASTIC_WORKER="$tmp/elastic_worker" \
    LOOM_ELASTIC_SCENARIOS=${LOOM_ELASTIC_SCENARIOS:-"grow shrink remove rebuild minnp"} \
    sh "$srcdir/tests/test_elastic.sh"
rc=$?

# examples/python/elastic_torch.py as its README tells: 3 ranks, one killed
# during training, a host added later: 3 -> 2 -> 3, and the loss falls.
# (A copy in $tmp: its path tells this job's processes apart.)
# job_dir DIR SCRIPT: DIR with a copy of SCRIPT and a discovery script that
# lists DIR/hosts, three local hosts at first.
job_dir() {
    mkdir -p "$1"
    cp "$2" "$1/"
    printf 'localhost\n127.0.0.2\n127.0.0.3\n' > "$1/hosts"
    printf '#!/bin/sh\ncat %s/hosts\n' "$1" > "$1/discover"
    chmod +x "$1/discover"
}
# wait_for FILE PATTERN SECONDS
wait_for() {
    i=0
    while [ $i -lt $(($3 * 10)) ] && ! grep -q "$2" "$1"; do sleep 0.1; i=$((i + 1)); done
}
ex=$tmp/example
job_dir "$ex" "$srcdir/examples/python/elastic_torch.py"
timeout 400 "$builddir/tools/loomrun" --elastic --host-discovery-script "$ex/discover" \
    --discovery-interval 0.3 --elastic-timeout 20 -np 3 \
    "$py" "$ex/elastic_torch.py" --epochs 12 --samples 16384 > "$ex/out" 2>&1 &
job=$!
wait_for "$ex/out" "epoch 1:" 60
victim=$(pgrep -f "$ex/elastic_torch.py" | tail -n 1)
[ -n "$victim" ] && kill -KILL "$victim"
wait_for "$ex/out" "reset: now 2 ranks" 30
echo 127.0.0.4 >> "$ex/hosts"
wait $job
ex_rc=$?
sleep 0.2
if [ $ex_rc = 0 ] && grep -q "reset: now 2 ranks" "$ex/out" && grep -q "reset: now 3 ranks" "$ex/out" &&
        grep -q "loss fell" "$ex/out" && ! pgrep -f "$ex/elastic_torch.py" > /dev/null; then
    echo "ok: examples/python/elastic_torch.py: 3 -> 2 -> 3, the loss fell"
else
    echo "FAIL: examples/python/elastic_torch.py under loomrun --elastic (exit $ex_rc)"
    sed 's/^/    /' "$ex/out"
    pkill -KILL -f "$ex/elastic_torch.py"
    rc=1
fi

# Keras: model.fit inside hvd.elastic.run (KerasState and its callbacks); a
# rank killed at a batch of epoch 1, so the others fail inside the compiled
# train step; then a host is added: 3 -> 2 -> 3, every epoch done, the same
# weights everywhere. In the TensorFlow interpreter test_python.sh uses.
tfpy=""
for cand in ${LOOM_TF_PYTHON:-} /opt/loom-tf/bin/python "$py"; do
    if { [ -x "$cand" ] || command -v "$cand" >/dev/null 2>&1; } &&
            "$cand" -c 'import tensorflow, keras, numpy' 2>/dev/null; then
        tfpy=$cand
        break
    fi
done
if [ -n "$tfpy" ]; then
    tf_package "$tfpy"
    kd=$tmp/keras
    job_dir "$kd" "$srcdir/tests/python/elastic_keras.py"
    MPE_KILL_ID=1 MPE_SIZES="3 2 3" KERAS_EPOCHS=16 TF_CPP_MIN_LOG_LEVEL=3 timeout 400 "$builddir/tools/loomrun" --elastic \
        --host-discovery-script "$kd/discover" --discovery-interval 0.3 --elastic-timeout 30 -np 3 \
        "$tfpy" "$kd/elastic_keras.py" > "$kd/out" 2>&1 &
    job=$!
    wait_for "$kd/out" "epoch [0-9]* done on 2 ranks" 120
    echo 127.0.0.4 >> "$kd/hosts"
    wait $job
    k_rc=$?
    sleep 0.2
    if [ $k_rc = 0 ] && grep -q "final: epoch 16, 3 ranks, resets \[2, 3\], weights the same everywhere.*ok" "$kd/out" &&
            ! pgrep -f "$kd/elastic_keras.py" > /dev/null; then
        echo "ok: Keras model.fit under hvd.elastic.run: 3 -> 2 -> 3, $(sed -n 's/.*final: //p' "$kd/out")"
    else
        echo "FAIL: Keras elastic training (exit $k_rc)"
        grep -v "WARNING\|I0000\|E0000\|W0000" "$kd/out" | tail -n 40 | sed 's/^/    /'
        pkill -KILL -f "$kd/elastic_keras.py"
        rc=1
    fi
else
    echo "$name: SKIP: the Keras scenario: no interpreter with TensorFlow and Keras (tests/install-deps.sh makes /opt/loom-tf)"
fi
exit $rc
