#!/bin/bash
# The known-answer learning benchmark at gpu size on one GPU of a host without network, in time-limited runs
# that resume:
#   bash scripts/known_answer_gpu.sh [overrides for every stage, e.g. phase.max_steps=800]
# WHEELS (default .device_wheels_ka, git-ignored) holds the wheels the host lacks, for Python 3.12 (written on a
# machine with network by `bash scripts/device_wheels.sh known_answer`). Copies the results to $OUT (an existing
# folder, required):
# known_answer.json, known_answer.md, curves.png, gallery.png, the VAE's training.json, the evaluation's
# metrics.json and report.md, and the log (known_answer.json is written once the benchmark finishes). Stage
# lengths: benchmarks/known_answer/configs/train/experiment/known_answer_gpu_{base,a,b,c}.yaml (phase.max_steps)
# and the VAE's max_seconds (benchmarks/known_answer/driver.py, SIZES["gpu"]); docs/plans/known_answer.md has the
# expected time of each.
set -u
WORK=/tmp/known_answer
BUDGET_S=${BUDGET_S:-500}  # seconds of benchmark per run; the install (up to ~50 s) and the copies come on top
source scripts/known_answer_env.sh
export CUDA_VISIBLE_DEVICES=0
# 16 pipeline workers: the films are drawn and cut on the host's cores while one GPU trains.
# The whole benchmark takes ~17 min on one H200 with both ablations (films, clips and the VAE ~2 min, decoder
# base ~340 s, a1/a2 ~80 s, b 32 s, c 16 s, evaluations ~140 s, the ablations ~130 s and ~100 s);
# playing every held-out game (evaluation.games=40) adds ~2.5 min. A run stopped at BUDGET_S saves a checkpoint (training/faults.py); run this
# script again on the same host (its /tmp kept) and it resumes every stage where it stopped (the VAE, finished
# stages and finished evaluations are reused). ABLATIONS="" (or one name) saves ~2 min per ablation left out.
ABLATIONS=${ABLATIONS-no_motion_scope no_warmup}
timeout "$BUDGET_S" python3 -m benchmarks.known_answer "$WORK" --size gpu pipeline.workers=16 "$@" \
  --ablations $ABLATIONS > /tmp/known_answer.log 2>&1
echo "benchmark rc=$? (124: stopped at BUDGET_S=$BUDGET_S with a checkpoint; run again on this host to resume)"
tail -c 15000000 /tmp/known_answer.log > "$OUT/known_answer.log"  # the log's last 15 MB
grep -E "held-out PSNR|done at step|decoder base|evaluation:|known-answer|Error|error" /tmp/known_answer.log | cut -c1-300 | tail -25
for f in known_answer.json known_answer.md curves.png gallery.png; do
  cp "$WORK/$f" "$OUT/" 2>/dev/null
done
cp "$WORK/vae/training.json" "$OUT/vae_training.json" 2>/dev/null
seed=0 prev=""
for arg in "$@"; do  # --seed N trains into seed_N/
  [ "$prev" = "--seed" ] && seed=$arg
  case $arg in --seed=*) seed=${arg#--seed=} ;; esac
  prev=$arg
done
cp "$WORK/seed_$seed/eval/metrics.json" "$OUT/eval_metrics.json" 2>/dev/null
cp "$WORK/seed_$seed/eval/report.md" "$OUT/eval_report.md" 2>/dev/null
cat "$WORK/known_answer.md" 2>/dev/null
ls -la "$OUT"
