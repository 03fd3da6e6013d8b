#!/usr/bin/env bash
# Create .venv (if missing) and install the project with its test extras. Safe to re-run.
# EXTRAS (default dev: the tests' packages and the documentation build's) names the extras of setup.cfg to
# install, comma-separated.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch first, pinned: installed alone it comes from the local CPU wheel, never a CUDA build.
# pip compiles the bytecode here on purpose: where PYTHONDONTWRITEBYTECODE is set, nothing writes it at import,
# and every process (each test's launches) would compile torch and its neighbours from source again.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[$EXTRAS]"
