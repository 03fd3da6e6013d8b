#!/bin/bash
# Phase (b) through train.py against the benchmark loop (part a), a 2-GPU ZeRO-2 kill and resume step by
# step (part b), phase (a2) weak scaling (part c): benchmarks/phase_b_gap.py's docstring. On two H200s:
#   bash benchmarks/phase_b_gap.sh                  # parts a and b, about 6 min
#   bash benchmarks/phase_b_gap.sh --parts a        # part a only, about 3.5 min (b: 2.5, c: 4-5)
# Where the project's packages are missing (a bare GPU machine), the wheels in $WHEELS (default
# .device_wheels; benchmarks/README.md lists them) are installed into /tmp/site first. Results in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import hydra, omegaconf, diffusers, webdataset, deepspeed" 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${WHEELS:-.device_wheels}"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# NVLink multicast stays off: on a shared host it can take every GPU out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
exec "$PYTHON" benchmarks/phase_b_gap.py "$@"
