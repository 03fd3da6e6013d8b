#!/usr/bin/env bash
# The project installed like a library: a non-editable `pip install '.[fp8]'` into a fresh venv, then the
# command line from another folder, with its configs found inside the installed package. The fresh venv
# reuses .venv's dependencies (a path file naming .venv's site-packages, whose own path files, among them
# the editable install's, are not read) so the check needs no download; the installed wheel comes first.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PYTHON=${PYTHON:-$REPO/.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv --without-pip "$work/venv"
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/reused_dependencies.pth"
# .venv's pip installs into the fresh venv's interpreter; the build runs in a copy, so no build/ folder
# lands in the checkout.
mkdir "$work/source"
cp -r setup.cfg pyproject.toml README.md src data_pipeline "$work/source/"
"$PYTHON" -m pip --python "$work/venv/bin/python" install --quiet --no-deps --no-build-isolation "$work/source[fp8]"
cd "$work"  # another folder: nothing of the checkout on the path
bin="$work/venv/bin"
"$bin/python" - <<'PY'
import animegamer, data_pipeline, sys
from animegamer.config.compose import config_dir
prefix = sys.prefix
for module in (animegamer, data_pipeline):
    assert module.__file__.startswith(prefix), f"{module.__name__} imported from {module.__file__}, not the install"
assert str(config_dir()).startswith(prefix) and (config_dir() / "train.yaml").is_file(), config_dir()
PY
# The commands side by side (each spends its time importing); a failing one stops the check at its wait.
"$bin/animegamer" --help >"$work/help" & help=$!
"$bin/animegamer" train --help >"$work/train" & train=$!
"$bin/animegamer" pipeline --help >"$work/pipeline" & pipeline=$!
"$bin/python" -m animegamer eval --help >"$work/eval" & evaluate=$!
"$bin/animegamer" train no_such_key=1 >/dev/null 2>"$work/err" & refused=$!
wait "$help"; wait "$train"; wait "$pipeline"; wait "$evaluate"
if wait "$refused"; then echo "an unknown key was accepted" >&2; exit 1; fi
grep -q "quickstart" "$work/help"
grep -q "^experiment: .*quickstart_a" "$work/train"
grep -q "^experiment: " "$work/pipeline"
grep -q "^model: " "$work/eval"
grep -q "no_such_key" "$work/err"
echo "install check: a wheel install runs animegamer from another folder, its configs inside the package"
