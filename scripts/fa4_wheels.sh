#!/bin/bash
# FlashAttention-4 (flash-attn-4) and SageAttention 1 for the GPU machine, which has no network: the wheels
# for its Python 3.12 / CUDA 13 image, split in two because a device call carries at most 64 MiB.
#   .fa4_big/cu13.tar.xz  the CUDA 13 build of the CuTe DSL compiler (a 92 MB wheel, 64 MB as tar.xz),
#                         unpacked on the device into /tmp/cu13 by a first call;
#   .fa4_wheels/          the rest (about 10 MB), installed by the next call on the still-warm machine,
#                         which then copies /tmp/cu13 over /tmp/site (pip --target would delete it).
# benchmarks/README.md ("Attention kernels") has the two device commands.
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="${PIP:-.venv/bin/pip}"
WHERE=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
       --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p .fa4_wheels .fa4_big
"$PIP" download "${WHERE[@]}" -d .fa4_wheels flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
    nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 apache-tvm-ffi==0.1.15.post2 \
    quack-kernels==0.6.5 torch-c-dlpack-ext==0.1.5 sageattention==1.0.6
if [ ! -s .fa4_big/cu13.tar.xz ]; then
    tmp=$(mktemp -d)
    "$PIP" download "${WHERE[@]}" -d "$tmp" nvidia-cutlass-dsl-libs-cu13==4.8.1
    (cd "$tmp" && mkdir tree && cd tree && unzip -q ../nvidia_cutlass_dsl_libs_cu13-*.whl && tar -cf - . | xz -9 -T2) \
        > .fa4_big/cu13.tar.xz
    rm -rf "$tmp"
fi
ls -la .fa4_wheels .fa4_big
