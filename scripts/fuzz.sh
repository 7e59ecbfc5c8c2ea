#!/usr/bin/env bash
# fuzz.sh: runs every libFuzzer target (tests/fuzz, built in build-asan with ASan and UBSan)
# for SECONDS each, starting from its checked-in seeds (tests/fuzz/corpus/NAME) and first
# replaying every input that once found a bug (tests/fuzz/regressions/NAME). Fails, and keeps
# the input that did it under $FUZZ_WORK/findings, when a target crashes, leaks, hangs or
# breaks one of its checks. Prints the executions of each target.
#   scripts/fuzz.sh [seconds per target] [build dir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-60}
build=${2:-$root/build-asan}
work=${FUZZ_WORK:-/tmp/slipstream-fuzz}
findings="$work/findings"
mkdir -p "$findings"

shopt -s nullglob
targets=("$build"/tests/fuzz/*_fuzz)
if [ ${#targets[@]} = 0 ]; then
  echo "no fuzz targets in $build/tests/fuzz (make fuzz builds them)" >&2
  exit 1
fi

jobs=${FUZZ_JOBS:-$(nproc)}

# Fuzzes target $1 (an executable); writes its line of the table to $work/NAME.result, or
# what it found to $work/NAME.failure.
fuzz_one() {
  local exe=$1 name corpus log regressions runs rate size
  name=$(basename "$exe" _fuzz)
  corpus="$work/corpus/$name"
  mkdir -p "$corpus"
  log="$work/$name.log"
  rm -f "$work/$name.result" "$work/$name.failure"
  regressions=("$root/tests/fuzz/regressions/$name"/*)
  if [ ${#regressions[@]} -gt 0 ] && ! "$exe" "${regressions[@]}" >"$log" 2>&1; then
    { echo "$name: a regression input fails again:"; tail -n 30 "$log"; } >"$work/$name.failure"
    return
  fi
  # -timeout catches hangs, -rss_limit_mb runaway allocation; one process per target (not
  # -jobs), FUZZ_JOBS targets at a time.
  if "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$findings/$name-" "$corpus" "$root/tests/fuzz/corpus/$name" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    size=$(find "$corpus" -type f | wc -l)
    printf "%-20s %12s %10s %8s\n" "$name" "${runs:-?}" "${rate:-?}" "$size" >"$work/$name.result"
  else
    { echo "$name: FOUND A FAILURE (input kept in $findings):"
      grep -E "ERROR|SUMMARY|==[0-9]+==|#[0-9]+ 0x|runtime error|abort|Test unit written" "$log" | head -n 40
    } >"$work/$name.failure"
  fi
}

running=0
for exe in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
  fuzz_one "$exe" &
  running=$((running + 1))
done
wait

failed=()
total=0
printf "%-20s %12s %10s %8s\n" target executions "exec/s" corpus
for exe in "${targets[@]}"; do
  name=$(basename "$exe" _fuzz)
  if [ -f "$work/$name.result" ]; then
    cat "$work/$name.result"
    runs=$(awk '{print $2}' "$work/$name.result")
    [[ "$runs" =~ ^[0-9]+$ ]] && total=$((total + runs))
  else
    if [ -f "$work/$name.failure" ]; then cat "$work/$name.failure" >&2; else echo "$name: no result" >&2; fi
    failed+=("$name")
  fi
done
echo "executions in all: $total (${#targets[@]} targets, $seconds s each, $jobs at a time)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzing failed for: ${failed[*]}" >&2
  echo "Reproduce with: $build/tests/fuzz/NAME_fuzz FILE; keep the file in tests/fuzz/regressions/NAME and add a test." >&2
  exit 1
fi
