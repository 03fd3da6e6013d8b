#!/usr/bin/env bash
# Several scripts/stress_two_process.sh loops at once, for a machine with many cores: each loop runs its
# own burner beside its pytest, so the cores stay oversubscribed as on a loaded 2-core CI machine.
#
#   LOOPS=8 SECONDS_BUDGET=480 scripts/stress_parallel.sh TEST_ID...
#
# Each loop repeats the given tests (all of them every round) until SECONDS_BUDGET has passed, then
# finishes its round. The totals (rounds, passed, rounds with an abort at exit) go to
# $STRESS_DIR/parallel-summary.txt; every loop's summary.txt and round logs stay beside it.
set -u
cd "$(dirname "$0")/.."
LOOPS=${LOOPS:-4}
SECONDS_BUDGET=${SECONDS_BUDGET:-600}
ROOT=${STRESS_DIR:-/tmp}/stress_parallel
mkdir -p "$ROOT"
deadline=$(( $(date +%s) + SECONDS_BUDGET ))
for loop in $(seq 1 "$LOOPS"); do
    (
        export STRESS_DIR=$ROOT/loop-$loop
        # Rounds are counted by the inner script; a large count with a deadline check in between
        # would need changing it, so run single rounds until the deadline instead.
        trap 'kill $(jobs -p) 2>/dev/null; exit 143' TERM  # stopped: end the round in progress too
        while [ "$(date +%s)" -lt "$deadline" ]; do
            scripts/stress_two_process.sh 1 "$@" > /dev/null 2>&1 &
            wait $!
        done
    ) &
done
summarize() {
    # Finished rounds only: a round cut off by a timeout has no line in its loop's summary.txt.
    local lines rounds passed aborted
    lines=$(cat "$ROOT"/loop-*/stress_two_process/*/summary.txt 2>/dev/null | grep '^round ')
    rounds=$(printf '%s\n' "$lines" | grep -c '^round ')
    passed=$(printf '%s\n' "$lines" | grep -c 'exit 0,')
    aborted=$(printf '%s\n' "$lines" | grep '^round ' | grep -vc 'abort lines 0')
    echo "loops=$LOOPS rounds=$rounds passed=$passed rounds_with_abort=$aborted tests=$*" | tee "$ROOT/parallel-summary.txt"
    printf '%s\n' "$lines" >> "$ROOT/parallel-summary.txt"
    [ "$passed" = "$rounds" ]
}
# An outer `timeout` (a time limit on the whole run) still gets the totals of the rounds that finished.
on_stop() {
    trap - TERM INT
    kill $(jobs -p) 2>/dev/null  # the loops; each one's own EXIT trap stops its burner
    summarize "$@"
    exit 124
}
trap 'on_stop "$@"' TERM INT
wait
summarize "$@"
