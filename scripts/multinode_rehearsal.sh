#!/bin/bash
# The two-node rehearsal on a host with two GPUs (two torchrun nodes of one GPU each, NCCL, phase (b)
# with node 1 killed after a checkpoint and both restarted), and with --weak-scaling weak scaling
# 1 -> 2 GPUs of phases (b) and (a2) under ZeRO-2 and FSDP. Options: scripts/multinode_rehearsal.py --help.
#   bash scripts/multinode_rehearsal.sh --weak-scaling --out results/
# Where the project's packages are missing (a bare GPU machine), the wheels in $WHEELS (default
# .device_wheels; benchmarks/README.md lists them) are installed into /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
exec "$PYTHON" scripts/multinode_rehearsal.py "$@"
