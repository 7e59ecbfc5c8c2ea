#!/usr/bin/env bash
# demo.sh: slipstream in a local PostgreSQL cluster. Starts a private cluster (as the postgres
# OS user), creates a YCSB-style usertable USING slipstream, loads it, runs a short workload A
# (50% reads, 50% updates, zipfian keys), and prints throughput, latency and the engine's
# statistics. The cluster is stopped at the end.
#   scripts/demo.sh [scratch dir] [port] [records] [seconds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-demo}}
port=${2:-55400}
records=${3:-200000}
seconds=${4:-15}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"
pgbench=/usr/lib/postgresql/15/bin/pgbench

echo "== starting a private PostgreSQL 15 cluster in $cluster (port $port)"
"$pg" init "$cluster" "$port" "slipstream.l0_size = 16MB"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" >/dev/null 2>&1 || true' EXIT
psql_c() { "$pg" psql "$cluster" "$@"; }

echo "== loading $records rows into usertable USING slipstream"
psql_c -q -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE usertable (ycsb_key bigint PRIMARY KEY, field0 text) USING slipstream"
start=$(date +%s.%N)
psql_c -q -c "INSERT INTO usertable SELECT g, repeat(md5(g::text), 3) FROM generate_series(1, $records) g" \
  -c "VACUUM ANALYZE usertable"
end=$(date +%s.%N)
awk -v n="$records" -v s="$start" -v e="$end" 'BEGIN { printf "loaded %d rows in %.2f s (%.0f rows/s)\n", n, e - s, n / (e - s) }'

echo "== workload A for $seconds s: 50% reads, 50% updates, zipfian keys, 2 clients"
cat > "$scratch/workload_a.sql" <<SQL
\set key random_zipfian(1, $records, 1.01)
\set op random(1, 100)
\if :op <= 50
SELECT field0 FROM usertable WHERE ycsb_key = :key;
\else
UPDATE usertable SET field0 = md5(random()::text) WHERE ycsb_key = :key;
\endif
SQL
"$pgbench" -h "$cluster/sock" -p "$port" -U postgres -n -c 2 -j 2 -T "$seconds" -M prepared \
  -f "$scratch/workload_a.sql" postgres | grep -E "^(number of transactions|latency|tps)"

echo "== engine statistics (SELECT * FROM slipstream.engine)"
psql_c -c "SELECT name, round(value::numeric, 2) AS value FROM slipstream.engine
           WHERE name IN ('l0_entries', 'levels_in_use', 'compactions', 'write_amplification',
                          'log_flushes', 'records_per_flush', 'stalls', 'segments_in_use')"
psql_c -c "SELECT * FROM slipstream.levels WHERE entries > 0"
echo "== slipstream.verify('usertable')"
psql_c -c "SELECT check_name, ok, detail FROM slipstream.verify('usertable')"
