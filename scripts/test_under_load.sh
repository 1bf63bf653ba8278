#!/usr/bin/env bash
# `make test` N times in a row while busy loops keep every core loaded (docs/architecture.md "Test
# layers": no test may depend on wall-clock sample counts or latency differences a busy machine
# erases). Prints each run's result, wall time and the load average around it; exits non-zero when
# any run failed. The busy loops are this script's children and end with it (bounded by --max-s).
#
#   bash scripts/test_under_load.sh [--runs 3] [--spinners 8] [--max-s 5400]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3 spinners=8 max_s=5400
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2;;
    --spinners) spinners=$2; shift 2;;
    --max-s) max_s=$2; shift 2;;
    *) echo "test_under_load: unknown option $1" >&2; exit 2;;
  esac
done
pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop EXIT
for _ in $(seq "$spinners"); do
  timeout "$max_s" bash -c 'while :; do :; done' &
  pids+=($!)
done
sleep 20  # let the load average climb before the first run
failed=0
logs=$(mktemp -d "${TMPDIR:-/tmp}/k3fleet-test-under-load.XXXXXX")
echo "logs: $logs"
for n in $(seq "$runs"); do
  before=$(cut -d' ' -f1-3 /proc/loadavg)
  start=$(date +%s)
  if make test > "$logs/run-$n.log" 2>&1; then result=passed; else result=FAILED; failed=1; fi
  after=$(cut -d' ' -f1-3 /proc/loadavg)
  summary=$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed)' "$logs/run-$n.log" | tail -1)
  echo "run $n: $result in $(( $(date +%s) - start ))s, load before $before, after $after: $summary"
done
exit "$failed"
