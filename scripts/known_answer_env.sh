# Sourced by the known-answer device scripts (scripts/known_answer_gpu*.sh): installs the wheels the H200 host
# lacks from WHEELS (default .device_wheels_ka, git-ignored; written by
# `bash scripts/device_wheels.sh known_answer`) and checks that every package the benchmark imports is there.
WHEELS=${WHEELS:-.device_wheels_ka}
if [ -z "${OUT:-}" ] || [ ! -d "$OUT" ]; then  # where the results are copied, named by the caller
  echo "OUT must name an existing folder for the results: OUT=results bash $0 ..." >&2; exit 2
fi
if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "no wheels in WHEELS=$WHEELS: write them with 'bash scripts/device_wheels.sh known_answer' on a machine" \
    "with network and copy the folder here (or name it: WHEELS=folder bash $0 ...)" >&2; exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$WHEELS"/*.whl || exit 1
python3 scripts/register_checkout.py /tmp/site || exit 1  # the entry points the recipes find the pipeline by
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if ! python3 -c "import torch, diffusers, decord, webdataset, hydra, cv2, av, scenedetect, matplotlib; \
print(torch.__version__, diffusers.__version__, cv2.__version__, av.__version__, torch.cuda.get_device_name(0))"; then
  echo "missing packages: add their wheels to $WHEELS and run again"; exit 1
fi
if ! python3 -c "from animegamer.pipeline_port import load_pipeline; load_pipeline()"; then
  echo "the data pipeline is not found through its entry point (scripts/register_checkout.py)"; exit 1
fi
