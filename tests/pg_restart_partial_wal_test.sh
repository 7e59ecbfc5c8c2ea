#!/usr/bin/env bash
# pg_restart_partial_wal_test.sh: the worker's startup replay must end cleanly where the flushed
# WAL ends inside a record. The replay reads our records from the engine's durable horizon to the
# WAL flushed when the worker starts; the WAL writer flushes whole pages, so a large record
# logged by a session right after the start (here a logical message; in the wild a page prune
# with a full-page image, logged by a catalog read) can be flushed in part by then. Modules of
# 2026-12-02 read that record, found its end missing, and failed every read of a slipstream
# table until a restart found the WAL otherwise (4 of 10 restarts here). Each round stops the
# server cleanly, starts it, logs large records from the moment it accepts connections, then
# reads every row.
#   tests/pg_restart_partial_wal_test.sh [scratch dir] [port] [rounds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-restart-partial-wal}}
port=${2:-55457}
rounds=${3:-10}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"
as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
bin=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
[ -x "$bin/pg_ctl" ] || bin=/usr/lib/postgresql/15/bin

# A short WAL writer delay: the partial flushes come within milliseconds of each record.
"$pg" init "$cluster" "$port" "autovacuum = off" "wal_writer_delay = 10ms"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
psql_c() { "$pg" psql "$cluster" -qAt "$@"; }
psql_c -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE kept (id int PRIMARY KEY, payload text) USING slipstream" \
  -c "INSERT INTO kept SELECT g, repeat('k', g % 100) FROM generate_series(1, 2000) g" >/dev/null

# Records of 96 kB (twelve WAL pages each), not flushed by the session that logs them.
emit="$scratch/emit.sql"
for _ in $(seq 1 60); do
  echo "SELECT pg_logical_emit_message(false, 'partial', repeat(md5(random()::text), 3000));"
done >"$emit"
chmod 644 "$emit"

failed=0
for round in $(seq 1 "$rounds"); do
  "$pg" stop "$cluster"
  # Not pg_ctl -w: its wait polls once a second, and the records must come at once.
  as_postgres "$bin/pg_ctl" -D "$cluster/data" -l "$cluster/server.log" start >/dev/null
  for _ in $(seq 1 2000); do
    [ -S "$cluster/sock/.s.PGSQL.$port" ] && psql_c -c "SELECT 1" >/dev/null 2>&1 && break
    sleep 0.005
  done
  psql_c -f "$emit" >/dev/null
  got=$(psql_c -c "SELECT count(*), sum(length(payload)) FROM kept" 2>&1 | tr '\n' ' ' || true)
  if [ "$got" != "2000|99000 " ]; then
    echo "round $round: reading the table after the restart gave: $got"
    failed=$((failed + 1))
  fi
done
if grep -q 'could not read WAL' "$cluster/server.log"; then
  grep 'could not read WAL' "$cluster/server.log" | head -3
  failed=$((failed + 1))
fi
bad=$(psql_c -c "SELECT count(*) FROM slipstream.verify('kept') WHERE NOT ok")
[ "$bad" = 0 ] || { echo "slipstream.verify reports $bad problems"; failed=$((failed + 1)); }
psql_c -c "INSERT INTO kept VALUES (2001, 'after')" >/dev/null
[ "$(psql_c -c "SELECT count(*) FROM kept")" = 2001 ] || { echo "the write after the restarts is missing"; failed=$((failed + 1)); }
if [ "$failed" != 0 ]; then
  echo "FAILED: $failed of $rounds restarts (or checks after them)"
  exit 1
fi
echo "restart-partial-wal: $rounds clean restarts with records flushed in part, every row read"
