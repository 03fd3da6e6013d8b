# Sourced by the GPU launch scripts: on a bare GPU machine, install the project's missing packages from
# the wheels in $WHEELS (default .device_wheels, built by scripts/device_wheels.sh) into /tmp/site, and
# keep NVLink multicast off (on a shared host it can take every GPU out of service). Sets $PYTHON.
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import hydra, omegaconf, diffusers, webdataset, deepspeed, torchao" 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${WHEELS:-.device_wheels}"/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$PYTHON" -c "import importlib.metadata as m; assert m.entry_points(group='animegamer.pipeline')" 2>/dev/null; then
    # Run from the checkout, not installed: record its entry points (the recipes find the pipeline by them).
    "$PYTHON" scripts/register_checkout.py /tmp/site
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
