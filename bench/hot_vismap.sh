#!/usr/bin/env bash
# hot_vismap.sh: what VACUUM and index-only scans cost on a table whose rows were HOT-updated,
# heap against slipstream on one server in one run (docs/benchmarks.md, "Pruned chains in the
# visibility map").
#
# Each access method gets a table of --rows rows (an int key, an int, 100 bytes of text),
# VACUUMed, then --updated percent of its rows updated twice in a non-indexed column (HOT
# updates: chains of three versions). Then, timed: the VACUUM that prunes those chains, a
# second VACUUM with nothing left to do, and an index-only count over the whole key range
# (median of three; seq and bitmap scans off), with its "Heap Fetches" and the share of blocks
# the visibility map marks all-visible. Printed per access method, with slipstream/heap ratios.
#
#   bench/hot_vismap.sh [--rows=1000000] [--updated=10] [--scratch=DIR] [--port=P]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rows=1000000
updated=10
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-hot-vismap}
port=55487
for arg in "$@"; do
  case "$arg" in
    --rows=*) rows=${arg#*=} ;;
    --updated=*) updated=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
cluster="$scratch/cluster"
. "$root/bench/pgbench_pair.sh"

echo "== private PostgreSQL 15 cluster in $cluster (port $port); $rows rows, $updated% updated"
pair_start "slipstream.l0_size = 32MB" "shared_buffers = 512MB" "max_wal_size = 8GB" \
  "autovacuum = off"

psql_am() { "$pg" psql "$cluster" -qAt -d "bench_$1" "${@:2}"; }
# Milliseconds statement $2 takes in bench_$1.
timed_ms() {
  psql_am "$1" -c '\timing on' -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
    -c "$2" | sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1
}

declare -A result
for am in heap slipstream; do
  psql_am "$am" -c "CREATE TABLE hv (id int PRIMARY KEY, v int, pad text) USING $am" \
    -c "INSERT INTO hv SELECT g, 0, repeat('x', 100) FROM generate_series(1, $rows) g" \
    -c "VACUUM hv" -c "CHECKPOINT" \
    -c "UPDATE hv SET v = v + 1 WHERE id % 100 < $updated" \
    -c "UPDATE hv SET v = v + 1 WHERE id % 100 < $updated" -c "CHECKPOINT"
  first=$(timed_ms "$am" "VACUUM hv")
  second=$(timed_ms "$am" "VACUUM hv")
  counts=()
  for _ in 1 2 3; do counts+=("$(timed_ms "$am" "SELECT count(*) FROM hv WHERE id > 0")"); done
  count_ms=$(printf '%s\n' "${counts[@]}" | sort -n | sed -n 2p)
  fetches=$(psql_am "$am" -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
    -c "EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF) SELECT count(*) FROM hv WHERE id > 0" |
    sed -n 's/.*Heap Fetches: \([0-9]*\).*/\1/p')
  visible=$(psql_am "$am" -c "SELECT relallvisible || '/' || relpages FROM pg_class WHERE relname = 'hv'")
  result[$am]="$first $second $count_ms $fetches $visible"
done

printf '\n%-11s %14s %14s %18s %14s %14s\n' "table AM" "pruning VACUUM" "second VACUUM" \
  "index-only count" "heap fetches" "all-visible"
for am in heap slipstream; do
  read -r first second count_ms fetches visible <<<"${result[$am]}"
  printf '%-11s %11.1f ms %11.1f ms %15.1f ms %14s %14s\n' "$am" "$first" "$second" "$count_ms" \
    "$fetches" "$visible"
done
read -r hf hs hc _ <<<"${result[heap]}"
read -r sf ss sc _ <<<"${result[slipstream]}"
awk -v hf="$hf" -v hs="$hs" -v hc="$hc" -v sf="$sf" -v ss="$ss" -v sc="$sc" 'BEGIN {
  printf "%-11s %13.2fx %13.2fx %17.2fx   (slipstream time / heap time)\n", "ratio", sf / hf, ss / hs, sc / hc }'
bad=$(psql_am slipstream -c "SELECT count(*) FROM slipstream.verify('hv') WHERE NOT ok")
echo "slipstream.verify failures: $bad"
[ "$bad" = 0 ]
