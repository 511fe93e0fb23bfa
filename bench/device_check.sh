#!/usr/bin/env bash
# Issue #33's GPU figures in one run: the table of bench/xla_bench.py --models (LiteRT on the
# CPU, Interpreter + XlaDelegate, to_jax + jit, the bfloat16 policy; first-call and
# second-process seconds) on the device machine, which has JAX but neither TensorFlow nor pip access.
#
# Here, once, in the repository root (TensorFlow and pip needed):
#   bash bench/device_check.sh prepare          # bench/.device: the models and two wheels (~43 MB)
# Then with the device tool:
#   run(command="bash bench/device_check.sh", carry=["bench/.device"], timeout_s=540)
# The table comes back as $OUT/xla_table.txt and $OUT/xla_table.json (rows as they finish).
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE_DIR=bench/.device

if [ "${1:-}" = "prepare" ]; then
    set -e
    EXCLUDE=$(git rev-parse --git-path info/exclude)   # the folder travels only as carry, never committed
    grep -qx '/bench/.device/' "$EXCLUDE" 2>/dev/null || echo '/bench/.device/' >> "$EXCLUDE"
    PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
    PYTHONPATH=$PWD "$PY" bench/xla_bench.py --build "$DEVICE_DIR/models"
    # the device's python is 3.12; tflite (kiln's schema) and ai-edge-litert (the LiteRT column)
    # are all it lacks (numpy, flatbuffers, ml-dtypes, protobuf, jax are there)
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$DEVICE_DIR/wheels" tflite==2.18.0 ai-edge-litert==2.3.0
    du -sh "$DEVICE_DIR"
    exit 0
fi

OUT=${OUT:-/tmp/kiln-device-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$DEVICE_DIR"/wheels/*.whl \
    || { echo "cannot install the carried wheels (run 'bash bench/device_check.sh prepare' here first)"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export KILN_XLA_CACHE=/tmp/kiln-xla-cache          # fresh: the first call compiles, the second process reads it
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" | tee -a "$OUT/gpu.txt"
# 8 minutes at most, whatever happens: every row is in $OUT/xla_table.json as soon as it is measured
timeout 480 python3 bench/xla_bench.py --models "$DEVICE_DIR/models" --device gpu --seconds 2 \
    --out "$OUT/xla_table.json" 2>&1 | tee "$OUT/xla_table.txt"
echo "exit $?"
