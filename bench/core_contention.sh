#!/usr/bin/env bash
# core_contention.sh: how much this machine's cores slow each other down. A pure arithmetic
# loop (no memory traffic) runs pinned to CPU 0 alone, then again while the same loop runs on
# CPU 1. On separate physical cores the times match; on hyperthreads of one core (or a host
# that lowers the clock when both are busy) the second is slower. Replication's benchmarks
# run the primary, the backups and the clients on these cores, so a ratio above 1 means that
# every process beside the primary's backends costs them speed, not only when the cores are
# all busy. Run it on an idle machine: anything else running inflates the ratio.
#
#   bench/core_contention.sh [--rounds=3]
set -euo pipefail
rounds=3
for arg in "$@"; do
  case "$arg" in
    --rounds=*) rounds=${arg#*=} ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(nproc)" -ge 2 ] || { echo "needs 2 CPUs" >&2; exit 1; }
command -v cc >/dev/null || { echo "needs a C compiler (cc)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/spin.c" <<'C'
#include <stdio.h>
#include <time.h>
int main(void) {
  volatile unsigned long x = 0;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (unsigned long i = 0; i < 1500000000UL; i++) x += i * i;
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("%.3f\n", (double) (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
  return 0;
}
C
cc -O1 -o "$work/spin" "$work/spin.c"
for r in $(seq 1 "$rounds"); do
  alone=$(taskset -c 0 "$work/spin")
  taskset -c 1 "$work/spin" >/dev/null &
  beside=$(taskset -c 0 "$work/spin")
  wait
  awk -v a="$alone" -v b="$beside" -v r="$r" \
    'BEGIN { printf "round %d: alone %.3f s, beside a busy CPU 1 %.3f s, ratio %.2fx\n", r, a, b, b / a }'
done
