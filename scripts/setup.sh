#!/usr/bin/env bash
# Create .venv (if missing) and install the project with its test extras. Safe to re-run.
# EXTRAS (default dev) names the extras of setup.cfg to install, comma-separated: CI adds docs, so that
# the documentation build finds mkdocs in the one dependency resolution done here.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch first, pinned: installed alone it comes from the local CPU wheel, never a CUDA build.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[$EXTRAS]"
