#!/usr/bin/env bash
# make test-stress: the whole `make test`, twice in a row, while two busy processes hog the CPUs.
# A test that passes only on an idle machine asserts the machine's speed, not the code; this
# check finds such tests. Both runs must pass; the wall time of each is printed.
#
# Bounded: the hogs are started under `timeout` (STRESS_HOG_MAX_S, default 3 h) and killed on
# any exit (success, failure, Ctrl-C); each `make test` runs under `timeout` too
# (STRESS_RUN_MAX_S, default 90 min, the CI budget).
set -u

MAKE_CMD=${MAKE:-make}
HOGS=${STRESS_HOGS:-2}
HOG_MAX_S=${STRESS_HOG_MAX_S:-10800}
RUN_MAX_S=${STRESS_RUN_MAX_S:-5400}

hogs=()
running=""
cleanup() {
    for pid in $running "${hogs[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in $running "${hogs[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for _ in $(seq "$HOGS"); do
    timeout "$HOG_MAX_S" bash -c 'while :; do :; done' &
    hogs+=("$!")
done
echo "test-stress: $HOGS CPU hogs running (pids ${hogs[*]})"

failed=0
for run in 1 2; do
    started=$(date +%s)
    # In the background so that a TERM to this script is handled at once (bash runs traps only
    # between commands, and `wait` is interruptible); the trap then stops this run too.
    timeout "$RUN_MAX_S" "$MAKE_CMD" test &
    running=$!
    wait "$running"
    rc=$?
    running=""
    echo "test-stress: run $run of 2: exit $rc, wall $(( $(date +%s) - started )) s"
    [ "$rc" -eq 0 ] || failed=1
done
exit "$failed"
