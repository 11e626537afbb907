#!/bin/sh
# tests/gpu/carry.sh HOROVOD_DIR - prepares tests/gpu/carry/ (ignored by git)
# with what tests/gpu/run.sh needs on a GPU machine that can download nothing:
#   horovod/  Horovod's test folder (test/parallel, test/utils) from HOROVOD_DIR,
#             a checkout or `git -C <horovod> archive v0.28.1 test | tar -x -C DIR`:
#             read and run beside Loom, never committed;
#   pylib/    pytest, mock, cloudpickle, parameterized and packaging as pure-Python
#             wheels for any Python 3 (what horovod_suite.sh imports).
# Then hand the folder to the device run (carry: ["tests/gpu/carry"]); run.sh
# runs Horovod's test_torch.py with CUDA tensors when it is there.
set -eu
[ $# = 1 ] || { sed -n '2,11p' "$0"; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
carry=$here/carry
tdir=$1
[ -d "$tdir/test" ] && tdir=$tdir/test
[ -f "$tdir/parallel/test_torch.py" ] && [ -f "$tdir/utils/common.py" ] ||
    { echo "no test/parallel/test_torch.py and test/utils/common.py under $1"; exit 2; }
rm -rf "$carry"
mkdir -p "$carry/horovod/test"
cp -r "$tdir/parallel" "$tdir/utils" "$carry/horovod/test/"
python3 -m pip install -q --target "$carry/pylib" --only-binary=:all: --python-version 3.8 \
    --implementation py --no-compile pytest mock cloudpickle parameterized packaging \
    exceptiongroup tomli
du -sh "$carry"
