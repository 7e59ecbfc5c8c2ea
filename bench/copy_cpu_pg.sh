#!/usr/bin/env bash
# copy_cpu_pg.sh: the backend's CPU time for a COPY into heap and into slipstream, in one run.
#
# A file of pgbench_accounts rows (100,000 per scale unit) is written once; then, alternating
# heap and slipstream for --rounds rounds, one session creates a table in a transaction and
# COPYs the file into it with FREEZE (as pgbench -i does), reading its own CPU time from
# /proc/self/stat before and after. Printed per round: the COPY's wall time and the backend's
# CPU time for each access method; at the end the medians and their ratios. The backend's CPU
# is the write path's cost per row, apart from the engine worker's compactions, which run in
# their own process (bench/copy_pg.sh shows those) and the client's parsing.
#
#   bench/copy_cpu_pg.sh [--scale=10] [--rounds=5] [--scratch=DIR] [--port=P]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scale=10
rounds=5
scratch=${SLIPSTREAM_SCRATCH:-/tmp/slipstream-copy-cpu}
port=55486
for arg in "$@"; do
  case "$arg" in
    --scale=*) scale=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    --scratch=*) scratch=${arg#*=} ;;
    --port=*) port=${arg#*=} ;;
    *) echo "unknown argument $arg (see the header of $0)" >&2; exit 2 ;;
  esac
done
cluster="$scratch/cluster"
. "$root/bench/pgbench_pair.sh"

echo "== private PostgreSQL 15 cluster in $cluster (port $port); scale $scale, $rounds rounds"
pair_start "slipstream.l0_size = 32MB" "shared_buffers = 512MB" "max_wal_size = 8GB"
rows=$((scale * 100000))
data="$cluster/accounts.tsv"
"$pg" psql "$cluster" -qAt -d bench_heap -c "COPY (SELECT g, (g - 1) / 100000 + 1, 0, ''
  FROM generate_series(1, $rows) g) TO '$data'"

# One COPY into a new table of access method $1: prints "wall_ms cpu_ms".
copy_once() {
  "$pg" psql "$cluster" -qAt -d bench_slipstream <<SQL
SELECT split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
     + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint AS t0,
       clock_timestamp() AS w0 \gset
BEGIN;
DROP TABLE IF EXISTS copy_cpu;
CREATE TABLE copy_cpu (aid int, bid int, abalance int, filler char(84)) USING $1;
COPY copy_cpu FROM '$data' WITH (FREEZE);
COMMIT;
SELECT round(extract(epoch FROM clock_timestamp() - :'w0') * 1000),
       (split_part(pg_read_file('/proc/self/stat'), ' ', 14)::bigint
      + split_part(pg_read_file('/proc/self/stat'), ' ', 15)::bigint - :t0) * 1000
       / $(getconf CLK_TCK);
SQL
}

printf '%6s | %12s %12s | %12s %12s\n' round "heap wall ms" "CPU ms" "slip wall ms" "CPU ms"
hw=() hc=() sw=() sc=()
for r in $(seq 1 "$rounds"); do
  read -r a b < <(copy_once heap 2>/dev/null | tr '|' ' ')
  read -r c d < <(copy_once slipstream 2>/dev/null | tr '|' ' ')
  hw+=("$a") hc+=("$b") sw+=("$c") sc+=("$d")
  printf '%6d | %12s %12s | %12s %12s\n' "$r" "$a" "$b" "$c" "$d"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
mhw=$(median "${hw[@]}") mhc=$(median "${hc[@]}") msw=$(median "${sw[@]}") msc=$(median "${sc[@]}")
awk -v r="$rows" -v hw="$mhw" -v hc="$mhc" -v sw="$msw" -v sc="$msc" 'BEGIN {
  printf "median | %12d %12d | %12d %12d\n", hw, hc, sw, sc
  printf "%d rows: slipstream/heap wall %.2fx, backend CPU %.2fx (%.2f against %.2f us a row)\n",
         r, sw / hw, sc / hc, sc * 1000 / r, hc * 1000 / r }'
"$pg" psql "$cluster" -qAt -d bench_slipstream -c "DROP TABLE copy_cpu"
rm -f "$data"
