#!/usr/bin/env bash
# tpcb_pg.sh: pgbench's TPC-B on heap and on slipstream, on one server in one run.
#
# `pgbench -i` runs unmodified in two databases, one with default_table_access_method = heap
# and one with slipstream; then the TPC-B script runs on each in turn, ROUNDS times (heap first
# in odd rounds and slipstream first in even ones, so that neither always runs right after the
# other on a machine whose fsync latency drifts), and the ratio of the summed transactions is
# printed.
#
#   bench/tpcb_pg.sh [--scale=N] [--seconds=S] [--clients=C] [--rounds=R] [--scratch=DIR] [--port=P]
#                     [--huge-pages=auto|on|off]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scale=10
seconds=15
clients=2
rounds=2
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-tpcb}
port=55480
for arg in "$@"; do
  case "$arg" in
    --scale=*) scale=${arg#*=} ;;
    --seconds=*) seconds=${arg#*=} ;;
    --clients=*) clients=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    --huge-pages=*) huge_pages=${arg#*=} ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
cluster="$scratch/cluster"
. "$root/bench/pgbench_pair.sh"

echo "== private PostgreSQL 15 cluster in $cluster (port $port); scale $scale, $clients clients, ${seconds}s x $rounds rounds"
pair_start "slipstream.l0_size = 32MB" "shared_buffers = 512MB" "max_wal_size = 4GB"

for am in heap slipstream; do
  PGOPTIONS="-c default_table_access_method=$am" "$pgbench" -h "$cluster/sock" -p "$port" -U postgres \
    -i -q -s "$scale" "bench_$am" 2>&1 | tail -1
done
"$pg" psql "$cluster" -qAt -d bench_slipstream -c "SELECT c.relname, a.amname FROM pg_class c
  JOIN pg_am a ON a.oid = c.relam WHERE c.relname LIKE 'pgbench_%' AND c.relkind = 'r' ORDER BY 1"

declare -A total=([heap]=0 [slipstream]=0)
for round in $(seq 1 "$rounds"); do
  order="heap slipstream"
  [ $((round % 2)) = 0 ] && order="slipstream heap"
  for am in $order; do
    "$pg" psql "$cluster" -qAt -d "bench_$am" -c "CHECKPOINT"
    out=$("$pgbench" -h "$cluster/sock" -p "$port" -U postgres -n -c "$clients" -j "$clients" \
      -T "$seconds" -M prepared "bench_$am" 2>&1)
    tx=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
    lat=$(echo "$out" | sed -n 's/^latency average = \(.*\)/\1/p')
    printf 'round %d %-10s %8.0f tps  latency %s\n' "$round" "$am" "$tps" "$lat"
    total[$am]=$((total[$am] + tx))
  done
done
awk -v s="${total[slipstream]}" -v h="${total[heap]}" \
  'BEGIN { printf "TPC-B slipstream/heap: %.2fx (%d vs %d transactions)\n", s / h, s, h }'
pair_verify
