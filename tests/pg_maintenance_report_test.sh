#!/usr/bin/env bash
# pg_maintenance_report_test.sh: VACUUM, CREATE INDEX and CLUSTER of slipstream tables report
# as heap's do.
#  - autovacuum logs what it did (rows removed, chain versions pruned, system usage) when
#    log_autovacuum_min_duration is 0, and keeps quiet about a table whose threshold its
#    vacuum did not reach;
#  - pg_stat_progress_vacuum follows a VACUUM through its phases (slowed by the cost delay so
#    that a poll sees it) and forgets it when it ends;
#  - pg_stat_progress_create_index shows a build's table scan block by block (slowed by an
#    index expression that sleeps), pg_stat_progress_cluster a VACUUM FULL's scan and writes;
#  - a chain pruned on access while VACUUM waits to prune it is walked again, nothing lost.
#   tests/pg_maintenance_report_test.sh [scratch dir] [port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-maintenance-report}}
port=${2:-55467}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"
sql() { "$pg" psql "$cluster" -qAtX -v ON_ERROR_STOP=1 "$@"; }
# Appends `columns` of progress view `view` for table `table` to `file` every `interval`
# seconds while process `pid` runs, then waits for it (and fails if it failed).
poll_progress() {
  local pid=$1 file=$2 interval=$3 view=$4 table=$5 columns=$6
  : >"$file"
  while kill -0 "$pid" 2>/dev/null; do
    sql -c "SELECT $columns FROM $view p JOIN pg_class c ON c.oid = p.relid
             WHERE c.relname = '$table'" >>"$file"
    sleep "$interval"
  done
  wait "$pid"
}

"$pg" init "$cluster" "$port" "autovacuum_naptime = 1" "log_autovacuum_min_duration = 0" \
  "log_min_messages = log"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
log="$cluster/server.log"

sql -c "CREATE EXTENSION slipstream"
# `logged` is vacuumed with the server's setting (0: every run is logged); `quiet` only logs a
# run of an hour or more. Autovacuum may look at them only once all their changes are made.
sql -c "CREATE TABLE logged (id int PRIMARY KEY, v int) USING slipstream
          WITH (autovacuum_enabled = off)" \
  -c "CREATE TABLE quiet (id int PRIMARY KEY, v int) USING slipstream
        WITH (autovacuum_enabled = off, log_autovacuum_min_duration = 3600000)" \
  -c "INSERT INTO logged SELECT g, 0 FROM generate_series(1, 20000) g" \
  -c "INSERT INTO quiet SELECT g, 0 FROM generate_series(1, 20000) g" \
  -c "DELETE FROM logged WHERE id <= 10000" \
  -c "UPDATE logged SET v = 1 WHERE id > 19000" \
  -c "DELETE FROM quiet WHERE id <= 10000" \
  -c "ALTER TABLE logged SET (autovacuum_enabled = on)" \
  -c "ALTER TABLE quiet SET (autovacuum_enabled = on)"

# Autovacuum comes within a few naptimes; wait for both tables to have been vacuumed.
for _ in $(seq 1 240); do
  done_count=$(sql -c "SELECT count(*) FROM pg_stat_user_tables
                        WHERE relname IN ('logged', 'quiet') AND autovacuum_count > 0")
  [ "$done_count" = 2 ] && break
  sleep 0.5
done
[ "$done_count" = 2 ] || { echo "autovacuum did not vacuum both tables"; tail -n 30 "$log"; exit 1; }
sleep 1  # the log line is written before the statistics are
line=$(grep 'automatic vacuum of table "postgres.public.logged"' "$log" | head -1)
echo "$line"
# 10,000 deleted rows and 1,000 roots whose rows the HOT update left dead, pruned to redirects.
echo "$line" | grep -q ': 11000 rows removed (1 index scans), 10000 remain, 0 are dead but not yet removable'
grep -A7 'automatic vacuum of table "postgres.public.logged"' "$log" | grep -q '10000 dead rows from'
grep -A7 'automatic vacuum of table "postgres.public.logged"' "$log" | grep -q '1000 pruned chain versions'
grep -A7 'automatic vacuum of table "postgres.public.logged"' "$log" | grep -q 'system usage: CPU'
if grep -q 'automatic vacuum of table "postgres.public.quiet"' "$log"; then
  echo "the vacuum of quiet was logged, below its log_autovacuum_min_duration"
  exit 1
fi
[ "$(sql -c "SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'quiet'")" = 10000 ]

# pg_stat_progress_vacuum during a manual VACUUM. Autovacuum is off for the table so that the
# only VACUUM is ours; the cost delay stretches it over a second or more.
sql -c "CREATE TABLE progress (id int PRIMARY KEY, v text) USING slipstream
          WITH (autovacuum_enabled = off)" \
  -c "INSERT INTO progress SELECT g, repeat('x', 40) FROM generate_series(1, 200000) g" \
  -c "DELETE FROM progress WHERE id % 3 = 0"
sql -c "SET maintenance_work_mem = '1MB'" -c "SET vacuum_cost_delay = '2ms'" \
  -c "SET vacuum_cost_limit = 1" -c "VACUUM progress" &
seen="$scratch/progress.txt"
poll_progress $! "$seen" 0.05 pg_stat_progress_vacuum progress \
  "phase, heap_blks_total, heap_blks_scanned, index_vacuum_count, max_dead_tuples"
sort "$seen" | uniq -c | sort -rn | head -20
# 200,000 row ids are 782 blocks of 256; half of 1 MB holds 65,536 row ids, so the 66,666 dead
# rows take two passes over the index.
grep -q '^scanning heap|782|[0-9]*|0|65536$' "$seen"
awk -F'|' '$1 == "scanning heap" && $3 > 0 && $3 < 782 { found = 1 } END { exit !found }' "$seen"
grep -Eq '^(vacuuming indexes|vacuuming heap|scanning heap)\|782\|[0-9]+\|1\|65536$' "$seen"
[ "$(sql -c "SELECT count(*) FROM pg_stat_progress_vacuum")" = 0 ]
[ "$(sql -c "SELECT count(*) FROM progress")" = 133334 ]
sql -c "SELECT bool_and(ok) FROM slipstream.verify('progress')" | grep -qx t

# pg_stat_progress_create_index during a build whose expression sleeps 2 ms a row: 1,500 rows
# are 6 blocks of 256 row ids, scanned over 3 s.
sql -c "CREATE FUNCTION slow_id(int) RETURNS int LANGUAGE plpgsql IMMUTABLE
          AS \$\$ BEGIN PERFORM pg_sleep(0.002); RETURN \$1; END \$\$" \
  -c "CREATE TABLE built (id int, v int) USING slipstream" \
  -c "INSERT INTO built SELECT g, g FROM generate_series(1, 1500) g"
sql -c "SET max_parallel_maintenance_workers = 0" -c "CREATE INDEX built_slow ON built (slow_id(id))" &
seen="$scratch/create_index.txt"
poll_progress $! "$seen" 0.05 pg_stat_progress_create_index built "phase, blocks_total, blocks_done"
sort "$seen" | uniq -c
awk -F'|' '$1 == "building index: scanning table" && $2 == 6 && $3 > 0 && $3 < 6 { found = 1 }
           END { exit !found }' "$seen"
[ "$(sql -c "SELECT count(*) FROM pg_stat_progress_create_index")" = 0 ]
[ "$(sql -c "SET enable_seqscan = off" -c "SELECT count(*) FROM built WHERE slow_id(id) > 1000")" = 500 ]

# pg_stat_progress_cluster during a VACUUM FULL of 800,000 rows (3,125 blocks): its scan, which
# writes the new table as it goes (as heap's does), for a second or more.
sql -c "CREATE TABLE rewritten (id int PRIMARY KEY, v text) USING slipstream" \
  -c "INSERT INTO rewritten SELECT g, repeat('r', 60) FROM generate_series(1, 800000) g" \
  -c "DELETE FROM rewritten WHERE id % 4 = 0"
sql -c "VACUUM FULL rewritten" &
seen="$scratch/cluster.txt"
poll_progress $! "$seen" 0.02 pg_stat_progress_cluster rewritten \
  "phase, heap_blks_total, heap_blks_scanned, heap_tuples_scanned, heap_tuples_written"
sort "$seen" | uniq -c | sort -rn | head -8
awk -F'|' '$1 == "seq scanning heap" && $2 == 3125 && $3 > 0 && $4 > 0 && $5 > 0
           { found = 1 } END { exit !found }' "$seen"
[ "$(sql -c "SELECT count(*) FROM rewritten")" = 600000 ]
sql -c "SELECT bool_and(ok) FROM slipstream.verify('rewritten')" | grep -qx t

# A chain pruned on access between VACUUM's scan and its prune: VACUUM finds the root naming
# another version than its scan saw and walks the chain again (ss_prune_chain_seen's fallback).
# Without the chain cache a fetch walks from the root and prunes the two dead versions it
# passes; the cost delay holds VACUUM's prunes (a sleep after each) long enough for the reads,
# which begin once the progress view says the scan is over, and go from the last root down to
# meet the roots VACUUM has not reached yet.
sql -c "ALTER SYSTEM SET slipstream.chain_cache_entries = 0"
"$pg" stop "$cluster"
"$pg" start "$cluster"
sql -c "CREATE TABLE chains (id int PRIMARY KEY, v int) USING slipstream
          WITH (autovacuum_enabled = off)" \
  -c "INSERT INTO chains SELECT g, 0 FROM generate_series(1, 2000) g" \
  -c "UPDATE chains SET v = v + 1" -c "UPDATE chains SET v = v + 1" -c "VACUUM chains" \
  -c "UPDATE chains SET v = v + 1" -c "UPDATE chains SET v = v + 1"
# Every root is now a redirect to a dead version, followed by a dead one and the live one.
walked=0
for attempt in 1 2 3; do
  sql -c "SET vacuum_cost_delay = '1ms'" -c "SET vacuum_cost_limit = 10" \
    -c "VACUUM (VERBOSE) chains" 2>"$scratch/vacuum_verbose.txt" &
  vacuum=$!
  for _ in $(seq 1 400); do
    at=$(sql -c "SELECT heap_blks_scanned = heap_blks_total AND phase = 'scanning heap'
                   FROM pg_stat_progress_vacuum p JOIN pg_class c ON c.oid = p.relid
                  WHERE c.relname = 'chains'")
    [ "$at" = t ] && break
    kill -0 "$vacuum" 2>/dev/null || break
    sleep 0.01
  done
  sql -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
    -c "DO \$\$ DECLARE x int; BEGIN
          FOR i IN REVERSE 2000..1 LOOP SELECT v INTO x FROM chains WHERE id = i; END LOOP;
        END \$\$"
  wait "$vacuum"
  cat "$scratch/vacuum_verbose.txt"
  walked=$(sed -n 's/.*chains changed since the scan, walked again: \([0-9]*\).*/\1/p' \
    "$scratch/vacuum_verbose.txt")
  [ -n "$walked" ] && [ "$walked" -gt 0 ] && break
  # Nothing met VACUUM in flight this time: make the chains again and retry.
  sql -c "UPDATE chains SET v = v + 1" -c "UPDATE chains SET v = v + 1"
done
[ -n "$walked" ] && [ "$walked" -gt 0 ] || { echo "no chain changed under VACUUM in 3 tries"; exit 1; }
# Every row is there once, with its last value, through the index and through a scan.
expect=$(sql -c "SELECT count(*) || ' ' || sum(v) FROM chains")
[ "$(sql -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
       -c "SELECT count(*) || ' ' || sum(v) FROM chains WHERE id > 0")" = "$expect" ]
case "$expect" in "2000 "*) ;; *) echo "chains: $expect"; exit 1 ;; esac
[ "$(sql -c "SELECT count(DISTINCT v) FROM chains")" = 1 ]
sql -c "SELECT bool_and(ok) FROM slipstream.verify('chains')" | grep -qx t
# A second VACUUM finds nothing more to prune.
sql -c "VACUUM (VERBOSE) chains" 2>&1 | grep -q ': 0 rows removed'
echo "maintenance report test passed"
