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
# Each start resumes what an earlier start on the same host left in $ROOT; on a fresh host it all starts again.
if [ -d "$ROOT" ]; then echo "resuming the variants kept in $ROOT"
else echo "no earlier start on this host: every variant starts from the beginning"; fi
source scripts/known_answer_env.sh
export CUDA_VISIBLE_DEVICES=0
left() { echo $((BUDGET_S - ($(date +%s) - STARTED))); }

# The latent probe (benchmarks/known_answer/latent_probe.py) on the first variant's clips and VAE, in the
# background once the VAE is written (host CPUs and a little GPU beside the decoder bases): what the VAE makes
# of latents that move, for reading the sweeps' frames against. LATENT_PROBE=0 leaves it out.
latent_probe() {  # WORK PID: the variant's folder and process
  [ "${LATENT_PROBE:-1}" = 1 ] || return 0
  local work=$1 pid=$2
  (while [ ! -f "$work/vae/training.json" ] && kill -0 "$pid" 2>/dev/null; do sleep 3; done  # no VAE of its own (--vae-from): none
   [ -f "$work/vae/training.json" ] && [ ! -f "$work/latent_probe.json" ] && [ "$(left)" -gt 0 ] && \
     timeout "$(left)" python3 -m benchmarks.known_answer.latent_probe "$work/pipeline" --vae "$work/vae" \
       --device cuda --out "$work/latent_probe.json" > "$work/latent_probe.log" 2>&1) &
}

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
  if [ "$first" = "$name" ] && [ -z "${first_pid:-}" ]; then first_pid=$!; latent_probe "$work" "$first_pid"; fi
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
    eval_metrics.json eval_report.md reconstruction_metrics.json vae_training.json run.log latent_probe.json \
    latent_probe.log \
    $(find seed_* \( -name metrics.json -o -name motion_sweep.png \) -size -4M 2>/dev/null) 2>/dev/null)
done
ls -la "$OUT"
