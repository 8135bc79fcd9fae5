#!/usr/bin/env bash
# Runs the whole test suite several times in a row while a CPU hog keeps every core busy:
# the suite must stay green on a loaded machine (tests wait on conditions, never on time).
#
#   scripts/stress.sh                      # 3 full runs (./scripts/test.sh) under load
#   STRESS_RUNS=1 scripts/stress.sh tests/integration/wire/test_batching.py   # one focused run
#
# STRESS_RUNS (3) runs; STRESS_HOGS (one per core) busy processes; STRESS_MAX_S (7200)
# bounds the hog's life even if this script is killed without running its trap. The hog
# is stopped by pid on every exit (success, failure, Ctrl-C, TERM). Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${STRESS_RUNS:-3}"
hogs="${STRESS_HOGS:-$(nproc)}"
max_s="${STRESS_MAX_S:-7200}"
hog_pids=()

stop_hog() {
  for pid in "${hog_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${hog_pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  hog_pids=()
}
trap stop_hog EXIT
trap 'stop_hog; exit 130' INT
trap 'stop_hog; exit 143' TERM

for _ in $(seq "$hogs"); do
  # A busy loop in its own process, bounded in time by timeout(1).
  timeout "$max_s" python3 -c 'while True: pass' &
  hog_pids+=("$!")
done
echo "stress: ${#hog_pids[@]} CPU hogs (pids ${hog_pids[*]}), ${runs} run(s)" >&2

for run in $(seq "$runs"); do
  echo "stress: run ${run}/${runs}" >&2
  ./scripts/test.sh "$@"
done
echo "stress: ${runs} run(s) green under load" >&2
