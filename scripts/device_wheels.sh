#!/bin/bash
# .device_wheels/ for the GPU machine, which has torch, transformers, peft, lightning and accelerate but no
# network and none of the project's other packages: their wheels for its Python 3.12 (pure Python, or
# manylinux x86_64; peft too, pinned to the version the project is tested with, over the image's own;
# torchao for model.decoder.fp8),
# DeepSpeed built here as a wheel (PyPI has only its source), and the official tokenizer
# from ../shared/reference (the benchmarks refuse paper-size MLLM runs without it). About 16 MB: carry it
# with `carry: [".device_wheels"]`; scripts/device_env.sh installs it on the device.
#   bash scripts/device_wheels.sh      # after scripts/setup.sh (DeepSpeed's wheel is built with .venv's torch)
#   bash scripts/device_wheels.sh known_answer   # .device_wheels_ka/ instead, ~55 MB: what the known-answer
#       benchmark imports on the device (scripts/known_answer_gpu.sh), video decoding and scene cuts included
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-.venv/bin/pip}"
WHERE=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
if [ "${1:-}" = known_answer ]; then
    OUT=.device_wheels_ka
    mkdir -p "$OUT"
    "$PIP" download -q "${WHERE[@]}" -d "$OUT" diffusers==0.42.1 hydra-core==1.3.8 omegaconf==2.3.1 peft==0.21.2 \
        importlib_metadata==8.7.0 zipp==4.1.2 webdataset==1.0.2 braceexpand==0.1.7 av==18.1.0 scenedetect==0.7.2 \
        platformdirs==4.14.9
    # decord's only Linux wheel is tagged manylinux2010
    "$PIP" download -q "${WHERE[@]}" --platform manylinux2010_x86_64 -d "$OUT" decord==0.6.0
    "$PIP" wheel -q --no-deps -w "$OUT" antlr4-python3-runtime==4.9.3
    ls "$OUT"; du -sh "$OUT"
    exit 0
fi
OUT=.device_wheels
mkdir -p "$OUT"
"$PIP" download -q "${WHERE[@]}" -d "$OUT" diffusers==0.42.1 hydra-core==1.3.8 omegaconf==2.3.1 peft==0.21.2 \
    importlib_metadata==8.7.0 webdataset==1.0.2 braceexpand==0.1.7 hjson==3.1.0 pydantic==2.14.4 \
    pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5 torchao==0.18.0
# source-only on PyPI: built here; both are pure Python
"$PIP" wheel -q --no-deps -w "$OUT" antlr4-python3-runtime==4.9.3
"$PIP" wheel -q --no-deps --no-build-isolation -w "$OUT" deepspeed==0.19.8
TOKENIZER=../shared/reference/animegamer_tokenizer
if [ -d "$TOKENIZER" ]; then
    # the reference folder is read-only: a copy without its modes can be replaced by the next run
    rm -rf "$OUT/animegamer_tokenizer" && cp -r --no-preserve=mode "$TOKENIZER" "$OUT/"
else
    echo "no $TOKENIZER: paper-size MLLM benchmarks will need --tokenizer byte (another vocabulary)" >&2
fi
ls "$OUT"; du -sh "$OUT"
