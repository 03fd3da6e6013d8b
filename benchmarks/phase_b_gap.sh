#!/bin/bash
# Phase (b) through train.py against the benchmark loop (part a), a 2-GPU ZeRO-2 kill and resume step by
# step (part b), phase (a2) weak scaling (part c): benchmarks/phase_b_gap.py's docstring. On two H200s:
#   bash benchmarks/phase_b_gap.sh                  # parts a and b, about 6 min
#   bash benchmarks/phase_b_gap.sh --parts a        # part a only, about 3.5 min (b: 2.5, c: 4-5); over 7 min
#                                                   # on one GPU, where its two sides run in turn
# Where the project's packages are missing (a bare GPU machine), the wheels in $WHEELS (default
# .device_wheels; benchmarks/README.md lists them) are installed into /tmp/site first. Results in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
exec "$PYTHON" benchmarks/phase_b_gap.py "$@"
