#!/usr/bin/env bash
# Speed figures on a 2-GPU host, in one run of about 8 minutes on two H200s:
#   1. the game turn on one GPU vs two (CFG branches split) and the VAE decode options, both GPUs;
#   2. then, side by side, FP8 vs bf16 for the decoder (GPU 0) and batched evaluation throughput (GPU 1).
# Needs .device_wheels on the host (wheels + the official tokenizer; `bash scripts/device_wheels.sh` builds it).
# BENCH_COMMIT / BENCH_TREE name the code measured; every JSON records them. Results go to $OUT.
# With --one-gpu (a one-GPU machine): step 1 is left out and step 2's two runs go one after the other.
set -u
ONE_GPU=0; [ "${1:-}" = "--one-gpu" ] && ONE_GPU=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
TOKENIZER=.device_wheels/animegamer_tokenizer
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ $ONE_GPU = 0 ]; then
    timeout 260 python3 benchmarks/game_turn_two_gpu.py --tokenizer "$TOKENIZER" --steps 20 --compile --deadline 200 \
        --out "$OUT/game_turn_two_gpu_h200x2.json" > "$OUT/game_turn_two_gpu.log" 2>&1
    echo "game_turn_two_gpu rc=$?"; grep -vi warn "$OUT/game_turn_two_gpu.log" | tail -25
fi
CUDA_VISIBLE_DEVICES=0 timeout 250 python3 benchmarks/fp8_decoder.py --out "$OUT" > "$OUT/fp8_decoder.log" 2>&1 &
FP8=$!
[ $ONE_GPU = 1 ] && { wait $FP8; echo "fp8_decoder rc=$?"; }
CUDA_VISIBLE_DEVICES=$((1 - ONE_GPU)) timeout 250 python3 benchmarks/evaluation_throughput.py --tokenizer "$TOKENIZER" --deadline 215 \
    > "$OUT/evaluation_throughput.log" 2>&1 &
EVAL=$!
[ $ONE_GPU = 0 ] && { wait $FP8; echo "fp8_decoder rc=$?"; }
wait $EVAL; echo "evaluation_throughput rc=$?"
grep -vi warn "$OUT/fp8_decoder.log" | tail -20
grep -vi warn "$OUT/evaluation_throughput.log" | tail -20
ls -la "$OUT"
