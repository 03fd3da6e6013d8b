#!/bin/bash
# The known-answer learning benchmark on one GPU of the lent H200 machine, in two calls (see below):
#   bash scripts/known_answer_gpu.sh [overrides for every stage, e.g. phase.max_steps=800]
# carrying WHEELS (default .device_wheels_ka, git-ignored): the wheels the device lacks, for Python 3.12
# (55 MB, written by `bash scripts/device_wheels.sh known_answer`). Writes to $OUT (at most 8 files): known_answer.json,
# known_answer.md, curves.png, gallery.png, the VAE's training.json, the evaluation's metrics.json and
# report.md, and the log (of this call: known_answer.json is written once the benchmark finishes). Stage lengths: configs/experiment/known_answer_gpu_{base,a,b,c}.yaml (phase.max_steps)
# and the VAE's max_seconds (animegamer/known_answer.py, SIZES["gpu"]); docs/plans/known_answer.md
# has the expected time of each.
set -u
WORK=/tmp/known_answer
BUDGET_S=${BUDGET_S:-500}  # the benchmark itself; the install (up to ~50 s) and the copies come on top, and
# the call ends at 600 s without returning anything (2026-12-02: at 560 the first call lost its files)
source scripts/known_answer_env.sh
export CUDA_VISIBLE_DEVICES=0
# 16 pipeline workers: the films are drawn and cut on the host's cores while one GPU trains.
# The whole benchmark takes ~17 min on one H200 (2026-12-01, both ablations: films, clips and the VAE ~2 min,
# decoder base ~340 s, a1/a2 ~80 s, b 32 s, c 16 s, evaluations 139 s, the ablations 128 s and 101 s): more
# than one 600-s device call, and with every held-out game (evaluation.games=40 since run 8) ~2.5 min
# more: a short third call may be needed. Call this script again at once, on the still-warm machine: the first call's stop at
# BUDGET_S saves a checkpoint (training/faults.py), and the second resumes every stage where it stopped
# (the VAE, finished stages and finished evaluations are reused, the cut stage resumes from its step). A machine handed back loses
# /tmp and starts over. ABLATIONS="" (or one name) saves ~2 min per ablation left out.
ABLATIONS=${ABLATIONS-no_motion_scope no_warmup}
timeout "$BUDGET_S" python3 -m animegamer.known_answer "$WORK" --size gpu pipeline.workers=16 "$@" \
  --ablations $ABLATIONS > /tmp/known_answer.log 2>&1
echo "benchmark rc=$? (124: stopped at BUDGET_S=$BUDGET_S with a checkpoint; call again on the warm machine to resume)"
tail -c 15000000 /tmp/known_answer.log > "$OUT/known_answer.log"  # the size limit of a returned file
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
