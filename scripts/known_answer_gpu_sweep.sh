#!/bin/bash
# Variants of the known-answer benchmark at gpu size side by side on one GPU of a host without network, in
# one time-limited run (the `small` models leave most of the GPU idle: a step is mostly Python overhead):
#   bash scripts/known_answer_gpu_sweep.sh "NAME [ARGS of python -m benchmarks.known_answer]" ...
# e.g. "b64 --stage base:phase.batch_size=64" "deep --stage base:phase.batch_size=64 model.decoder.num_layers=12",
# or seeds of one variant: "s0 --seed 0 --words shared" "s1 --seed 1 --words shared" "s2 --seed 2 --words shared".
# The first variant starts at once and trains the VAE; each other one starts when that VAE is written,
# with a copy of it and of the films: its own cut of the same films has the same clip content, so the
# copy is reused (animegamer/toy_vae.py: the VAE's identity is the clips' content). A variant without
# --ablations runs none. Every variant stops at BUDGET_S after the start of the run; its known_answer.json
# holds what it finished. Returns $OUT/NAME.tgz per variant (results, curves, gallery, the evaluation's
# metrics and report, the log's tail) and prints each variant's table. WHEELS as for
# scripts/known_answer_gpu.sh.
set -u
ROOT=/tmp/known_answer_sweep
BUDGET_S=${BUDGET_S:-548}
WORKERS=${WORKERS:-8}  # pipeline workers per variant (16 cores on the host)
STARTED=$(date +%s)
source scripts/known_answer_env.sh
export CUDA_VISIBLE_DEVICES=0
left() { echo $((BUDGET_S - ($(date +%s) - STARTED))); }

first=""
names=()
for spec in "$@"; do
  read -r name args <<< "$spec"
  work=$ROOT/$name
  mkdir -p "$work"
  case " $args " in *" --ablations"*) ;; *) args="$args --ablations" ;; esac  # last: it takes the words after it
  if [ -n "$first" ]; then
    while [ ! -f "$work/vae/training.json" ] && [ ! -f "$ROOT/$first/vae/training.json" ] && [ "$(left)" -gt 0 ]; do
      kill -0 "${first_pid:-}" 2>/dev/null || break  # the first variant stopped before its VAE: this one trains its own
      sleep 2
    done
    if [ ! -f "$work/vae/training.json" ]; then  # a run resumed on the same host keeps its own copy
      cp -r "$ROOT/$first/films" "$ROOT/$first/vae" "$work/" || echo "$name: no VAE to copy; it trains its own"
    fi
  else
    first=$name
  fi
  if [ "$(left)" -le 0 ]; then echo "$name: not started, no time left"; continue; fi  # timeout 0 would never stop
  echo "$name starts at $(( $(date +%s) - STARTED )) s: $args"
  # shellcheck disable=SC2086  # the variant's arguments are words
  timeout "$(left)" python3 -m benchmarks.known_answer "$work" --size gpu pipeline.workers="$WORKERS" $args \
    > "$ROOT/$name.log" 2>&1 &
  [ "$first" = "$name" ] && [ -z "${first_pid:-}" ] && first_pid=$!
  names+=("$name")
done
wait
for name in "${names[@]}"; do
  work=$ROOT/$name
  echo "=== $name (ended at $(( $(date +%s) - STARTED )) s)"
  grep -E "held-out PSNR|done at step|decoder base|known-answer|Error|error" "$ROOT/$name.log" | cut -c1-250 | tail -8
  cat "$work/known_answer.md" 2>/dev/null
  tail -c 2000000 "$ROOT/$name.log" > "$work/run.log"
  runs=$(ls -d "$work"/seed_* 2>/dev/null | head -1)  # the variant's --seed N trains into seed_N/
  cp "$runs/eval/metrics.json" "$work/eval_metrics.json" 2>/dev/null
  cp "$runs/eval/report.md" "$work/eval_report.md" 2>/dev/null
  cp "$runs/eval/reconstruction/metrics.json" "$work/reconstruction_metrics.json" 2>/dev/null
  cp "$work/vae/training.json" "$work/vae_training.json" 2>/dev/null
  # Every evaluation's metrics and motion-sweep plot too (the renderers' and ablations' folders under seed_N/).
  (cd "$work" && tar czf "$OUT/$name.tgz" --ignore-failed-read known_answer.json known_answer.md curves.png gallery.png \
    eval_metrics.json eval_report.md reconstruction_metrics.json vae_training.json run.log \
    $(find seed_* \( -name metrics.json -o -name motion_sweep.png \) -size -4M 2>/dev/null) 2>/dev/null)
done
ls -la "$OUT"
