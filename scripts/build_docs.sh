#!/usr/bin/env bash
# Build the documentation site into site/ with `mkdocs build --strict`: a broken link, a missing page,
# a page left out of the nav or a bad anchor fails the build, and so does a configuration reference page
# that differs from the config schema (rewrite it with `python scripts/mkdocs_hooks.py`). Works offline once the
# `docs` extra is installed; it is installed here when mkdocs is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
if ! "$PYTHON" -c "import mkdocs, material" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet -e ".[docs]"
fi
NO_MKDOCS_2_WARNING=1 "$PYTHON" -m mkdocs build --strict --site-dir "${SITE_DIR:-site}" "$@"
