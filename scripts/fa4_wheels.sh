#!/bin/bash
# FlashAttention-4 (flash-attn-4) and SageAttention 1 for a GPU host without network: the wheels for its
# Python 3.12 / CUDA 13 image, with the largest split in two pieces so that no file to copy passes 64 MB.
#   .fa4_big/cu13.part.aa, .ab  the CUDA 13 build of the CuTe DSL compiler (a 92 MB wheel, 64 MB as
#                         tar.xz) in two pieces;
#   .fa4_wheels/          the rest (about 10 MB).
# On the host, scripts/fa4_device.sh: `keep` stores piece aa in /tmp, `install` joins the pieces, unpacks them
# and installs everything into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-.venv/bin/pip}"
WHERE=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p .fa4_wheels .fa4_big
"$PIP" download "${WHERE[@]}" -d .fa4_wheels flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
    nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 apache-tvm-ffi==0.1.15.post2 \
    quack-kernels==0.6.5 torch-c-dlpack-ext==0.1.5 sageattention==1.0.6
if [ ! -s .fa4_big/cu13.part.aa ] || [ ! -s .fa4_big/cu13.part.ab ]; then
    tmp=$(mktemp -d)
    "$PIP" download "${WHERE[@]}" -d "$tmp" nvidia-cutlass-dsl-libs-cu13==4.8.1
    (cd "$tmp" && mkdir tree && cd tree && unzip -q ../nvidia_cutlass_dsl_libs_cu13-*.whl && tar -cf - . | xz -9 -T2) \
        > "$tmp/cu13.tar.xz"
    # two pieces exactly (scripts/fa4_device.sh joins .aa and .ab), written whole before they are moved in
    mkdir "$tmp/parts" && split -n 2 "$tmp/cu13.tar.xz" "$tmp/parts/cu13.part."
    rm -f .fa4_big/cu13.part.* && mv "$tmp/parts/"cu13.part.* .fa4_big/
    rm -rf "$tmp"
fi
ls -la .fa4_wheels .fa4_big
