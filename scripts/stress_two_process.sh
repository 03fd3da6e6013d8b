#!/usr/bin/env bash
# Repeat the 2-process tests beside a CPU-heavy job and count passes and aborts at exit.
#
#   scripts/stress_two_process.sh [ROUNDS] [PYTEST_ARGS...]
#
# Default: 50 rounds of tests/test_fsdp_gather.py and tests/test_distributed.py (about 15 min a round
# on 2 loaded cores). With ROTATE=1 the arguments are test ids and round r runs only the r-th of them
# (cyclically), so every kind repeats without each round running all of them, e.g.
#
#   ROTATE=1 scripts/stress_two_process.sh 50 \
#       'tests/test_fsdp_gather.py::test_units_are_gathered_one_at_a_time_and_resharded[b]' \
#       'tests/test_fsdp_gather.py::test_units_are_gathered_one_at_a_time_and_resharded[c]'
#
# One pytest runs at a time; beside it one burner process keeps BURN_THREADS threads (default: every
# core) multiplying matrices. Each round's output goes to $STRESS_DIR/<start time>/round-<r>.log;
# summary.txt there has one line per round (exit code, seconds, aborts seen) and the totals.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
ROUNDS=${1:-50}
shift $(( $# > 0 ? 1 : 0 ))
if [ $# -eq 0 ]; then
    set -- tests/test_fsdp_gather.py tests/test_distributed.py
fi
BURN_THREADS=${BURN_THREADS:-$(nproc)}
OUT=${STRESS_DIR:-/tmp}/stress_two_process/$(date +%Y%m%d-%H%M%S)
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt

"$PYTHON" -c "
import torch
torch.set_num_threads($BURN_THREADS)
a = torch.randn(800, 800)
while True:
    a @ a
" &
BURNER=$!
trap 'kill $BURNER 2>/dev/null' EXIT

echo "rounds=$ROUNDS burner_threads=$BURN_THREADS rotate=${ROTATE:-0} args=$*" | tee "$SUMMARY"
passed=0
aborted=0
began=$(date +%s)
for round in $(seq 1 "$ROUNDS"); do
    if [ "${ROTATE:-0}" = 1 ]; then
        ids=("$@")
        selection=("${ids[$(( (round - 1) % ${#ids[@]} ))]}")
    else
        selection=("$@")
    fi
    log=$OUT/round-$round.log
    start=$(date +%s)
    "$PYTHON" -m pytest -q -p no:cacheprovider "${selection[@]}" > "$log" 2>&1
    code=$?
    # An abort at exit shows as this message from the C++ runtime, or as a rank ended by SIGABRT.
    aborts=$(grep -c -E "terminate called|SIGABRT" "$log")
    [ "$code" = 0 ] && passed=$((passed + 1))
    [ "$aborts" != 0 ] && aborted=$((aborted + 1))
    echo "round $round: exit $code, $(( $(date +%s) - start )) s, abort lines $aborts: ${selection[*]}" | tee -a "$SUMMARY"
done
echo "passed $passed of $ROUNDS rounds; rounds with an abort: $aborted; $(( $(date +%s) - began )) s" | tee -a "$SUMMARY"
[ "$passed" = "$ROUNDS" ]
