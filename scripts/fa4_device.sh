#!/bin/bash
# FlashAttention-4 on a GPU host without network, from what scripts/fa4_wheels.sh downloaded, in two steps
# on the same host (the first keeps piece aa in /tmp):
#   with .fa4_big/cu13.part.aa on the host:                              bash scripts/fa4_device.sh keep
#   then with .fa4_big/cu13.part.ab, .fa4_wheels and .device_wheels:     source scripts/fa4_device.sh install
# and the benchmarks after it in the same shell, behind && (PYTHONPATH is set only when the install worked). nvidia-cutlass-dsl's .pth is not read from a
# --target folder, so its dsl_packages folder goes on PYTHONPATH by hand; the unpacked compiler is copied over
# /tmp/site after pip, which would delete it.
case "${1:-}" in
keep)
    mkdir -p /tmp/cu13parts && cp .fa4_big/cu13.part.aa /tmp/cu13parts/ && ls -la /tmp/cu13parts ;;
install)
    if [ ! -s /tmp/cu13parts/cu13.part.aa ]; then
        echo "/tmp/cu13parts/cu13.part.aa is missing: /tmp was cleared since the keep step; run it again" >&2
        return 1 2>/dev/null || exit 1
    fi
    mkdir -p /tmp/cu13 && cat /tmp/cu13parts/cu13.part.aa .fa4_big/cu13.part.ab | tar -xJf - -C /tmp/cu13 \
        && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .device_wheels/*.whl \
            .fa4_wheels/*.whl \
        && cp -a /tmp/cu13/. /tmp/site/ \
        && export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD/src \
        && source scripts/device_env.sh ;;  # finds the packages installed; sets $PYTHON and NVLink multicast off
*)
    echo "usage: bash scripts/fa4_device.sh keep | source scripts/fa4_device.sh install" >&2
    return 2 2>/dev/null || exit 2 ;;
esac
