#!/usr/bin/env bash
# pg_big_table_test.sh: a slipstream table past row id 33.5 M, that is past block 131,072, where
# the first 1 GB segment of the table's (empty) md file would end. With PostgreSQL's default
# prefetch settings, ANALYZE (by hand and by autovacuum) and bitmap heap scans there used to
# fail in md.c ("previous segment is only 0 blocks"); tableam/prefetch.c turns those prefetches
# off. About a minute: 34 M rows are loaded.
#   tests/pg_big_table_test.sh [scratch dir] [port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-big-table}}
port=${2:-55468}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"
sql() { "$pg" psql "$cluster" -qAtX -v ON_ERROR_STOP=1 "$@"; }
rows=34000000

"$pg" init "$cluster" "$port" "slipstream.l0_size = 32MB" "max_wal_size = 4GB" \
  "autovacuum_naptime = 1" "log_autovacuum_min_duration = 0" "log_min_messages = log"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true; rm -rf "$cluster"' EXIT

sql -c "CREATE EXTENSION slipstream"
[ "$(sql -c "SHOW effective_io_concurrency")" != 0 ]
[ "$(sql -c "SHOW maintenance_io_concurrency")" != 0 ]
# Autovacuum may analyze the table but has no reason to vacuum it (nothing is dead).
sql -c "CREATE TABLE big (id int) USING slipstream
          WITH (autovacuum_enabled = off, autovacuum_vacuum_insert_threshold = 2000000000)"
sql -c "COPY big FROM PROGRAM 'seq 1 $rows'"
[ "$(sql -c "SELECT rowid_high FROM slipstream.table_stats('big')")" = "$rows" ]

# ANALYZE samples blocks up to the last (132,813): it used to fail at the first past 131,071.
# The setting is the session's again afterwards.
[ "$(sql -c "ANALYZE big" -c "SHOW maintenance_io_concurrency")" = 10 ]
[ "$(sql -c "SELECT relpages FROM pg_class WHERE relname = 'big'")" = 132813 ]
[ "$(sql -c "SELECT abs(reltuples - $rows) < $rows / 100 FROM pg_class WHERE relname = 'big'")" = t ]
[ "$(sql -c "SELECT n_distinct FROM pg_stats WHERE tablename = 'big' AND attname = 'id'")" = -1 ]
# ANALYZE of a parent samples the child's rows under the parent's name in the progress report.
sql -c "CREATE TABLE parent (id int)" -c "ALTER TABLE big INHERIT parent" -c "ANALYZE parent"
[ "$(sql -c "SELECT count(*) FROM pg_stats WHERE tablename = 'parent' AND inherited")" = 1 ]
sql -c "ALTER TABLE big NO INHERIT parent"

# A bitmap heap scan of rows past the segment: the partial index holds the last 10,000.
sql -c "CREATE INDEX big_tail ON big (id) WHERE id > $((rows - 10000))"
plan=$(sql -c "SET enable_seqscan = off" -c "SET enable_indexscan = off" \
  -c "EXPLAIN (COSTS OFF) SELECT count(*) FROM big WHERE id > $((rows - 10000)) AND id % 7 = 0")
echo "$plan"
echo "$plan" | grep -q "Bitmap Heap Scan on big"
[ "$(sql -c "SET enable_seqscan = off" -c "SET enable_indexscan = off" \
       -c "SELECT count(*), sum(id) FROM big WHERE id > $((rows - 10000)) AND id % 7 = 0")" = \
  "$(sql -c "SELECT count(*), sum(g) FROM generate_series($((rows - 9999)), $rows) g
              WHERE g % 7 = 0")" ]

# Autovacuum's ANALYZE of it: the statistics age once rows change.
sql -c "DELETE FROM big WHERE id > $((rows - 10000)) AND id % 5 = 0" \
  -c "ALTER TABLE big SET (autovacuum_enabled = on, autovacuum_analyze_threshold = 500,
                           autovacuum_analyze_scale_factor = 0)"
for _ in $(seq 1 240); do
  [ "$(sql -c "SELECT autoanalyze_count FROM pg_stat_user_tables WHERE relname = 'big'")" -gt 0 ] && break
  sleep 0.5
done
[ "$(sql -c "SELECT autoanalyze_count FROM pg_stat_user_tables WHERE relname = 'big'")" -gt 0 ]
if grep -q "previous segment is only" "$cluster/server.log"; then
  grep "previous segment is only" "$cluster/server.log" | head -3
  exit 1
fi
echo "big table test passed"
