#!/bin/bash
# The two-node rehearsal on a host with two GPUs (two torchrun nodes of one GPU each, NCCL, phase (b)
# with node 1 killed after a checkpoint and both restarted), and with --weak-scaling weak scaling
# 1 -> 2 GPUs of phases (b) and (a2) under ZeRO-2 and FSDP. Options: scripts/multinode_rehearsal.py --help.
#   bash scripts/multinode_rehearsal.sh --weak-scaling --out results/
# Where the project's packages are missing (a bare GPU machine), the wheels in $WHEELS (default
# .device_wheels; benchmarks/README.md lists them) are installed into /tmp/site first.
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
exec "$PYTHON" scripts/multinode_rehearsal.py "$@"
