#!/usr/bin/env bash
# copy_pg.sh: bulk loads (COPY) into heap and into slipstream, on one server in one run.
#
# `pgbench -i` (its COPY of pgbench_accounts, 100,000 rows per scale unit, then VACUUM and the
# primary keys) runs unmodified at each scale, into a database whose default_table_access_method
# is heap and then into one where it is slipstream. Printed per scale: pgbench's "client-side
# generate" time (the COPY) for each, their ratio, and what the slipstream engine worker wrote
# and spent meanwhile (bytes from /proc/PID/io, CPU from /proc/PID/stat), which shows the
# compactions a load causes (docs/benchmarks.md, "Bulk loads"). Then ANALYZE of each loaded
# pgbench_accounts, three times per access method, alternating: the median of each and their
# ratio (docs/benchmarks.md, "ANALYZE of big tables").
#
#   bench/copy_pg.sh [--scales=10,20,40] [--scratch=DIR] [--port=P]
#                     [--huge-pages=auto|on|off]
#
# Runs as root (it reads the worker's /proc/PID/io); the cluster runs as postgres.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scales=10,20,40
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-copy}
port=55485
for arg in "$@"; do
  case "$arg" in
    --scales=*) scales=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    --huge-pages=*) huge_pages=${arg#*=} ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
cluster="$scratch/cluster"
. "$root/bench/pgbench_pair.sh"

echo "== private PostgreSQL 15 cluster in $cluster (port $port); scales $scales"
pair_start "slipstream.l0_size = 32MB" "shared_buffers = 512MB" "max_wal_size = 8GB"
worker=$(pgrep -P "$(head -1 "$cluster/data/postmaster.pid")" -f 'slipstream worker')
[ -n "$worker" ] || { echo "no slipstream worker in the cluster" >&2; exit 1; }

# The worker's bytes written and CPU ticks so far.
worker_io() { awk '/^write_bytes/ { print $2 }' "/proc/$worker/io"; }
worker_cpu() { awk '{ print $14 + $15 }' "/proc/$worker/stat"; }
# pgbench -i into bench_AM at SCALE; prints the seconds of its COPY ("client-side generate").
load() {
  local out
  out=$(PGOPTIONS="-c default_table_access_method=$1" "$pgbench" -h "$cluster/sock" -p "$port" \
    -U postgres -i -q -s "$2" "bench_$1" 2>&1)
  echo "$out" | sed -n 's/.*client-side generate \([0-9.]*\) s.*/\1/p'
}

# Milliseconds an ANALYZE of bench_AM's pgbench_accounts takes.
analyze_ms() {
  "$pg" psql "$cluster" -qAt -d "bench_$1" -c '\timing on' -c 'ANALYZE pgbench_accounts' |
    sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p'
}
# The median of three ANALYZEs per access method, run alternating: "heap_ms slipstream_ms".
analyze_pair() {
  local h=() s=()
  for _ in 1 2 3; do
    h+=("$(analyze_ms heap)")
    s+=("$(analyze_ms slipstream)")
  done
  echo "$(printf '%s\n' "${h[@]}" | sort -n | sed -n 2p) $(printf '%s\n' "${s[@]}" | sort -n | sed -n 2p)"
}

ticks=$(getconf CLK_TCK)
printf '%6s %10s | %9s %12s %6s | %14s %12s | %12s %15s %6s\n' scale rows "heap s" "slipstream s" \
  ratio "worker wrote" "worker CPU" "ANALYZE heap" "slipstream" ratio
for scale in ${scales//,/ }; do
  "$pg" psql "$cluster" -qAt -c "CHECKPOINT"
  heap=$(load heap "$scale")
  "$pg" psql "$cluster" -qAt -c "CHECKPOINT"
  io0=$(worker_io)
  cpu0=$(worker_cpu)
  slip=$(load slipstream "$scale")
  io1=$(worker_io)
  cpu1=$(worker_cpu)
  read -r ah as < <(analyze_pair)
  awk -v s="$scale" -v h="$heap" -v p="$slip" -v w=$((io1 - io0)) -v c=$((cpu1 - cpu0)) -v t="$ticks" \
    -v ah="$ah" -v as="$as" \
    'BEGIN { printf "%6d %10d | %9.2f %12.2f %5.1fx | %11.0f MB %10.2f s | %9.0f ms %12.0f ms %5.2fx\n",
             s, s * 100000, h, p, p / h, w / 1e6, c / t, ah, as, as / ah }'
done
pair_verify
