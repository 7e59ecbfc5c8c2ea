#!/usr/bin/env bash
# pg_send_index_test.sh: a Send-Index backup (scripts/seed_backup.sh --send-index, shipping =>
# 'send_index') against the cases the takeover kill test does not reach: DDL between imports
# (tables created, truncated in place and by a new file, dropped, and one created after the
# last import), a hot-standby read refused with a hint while slipstream.verify checks the
# imported levels, the views on both sides, a refusal of slipstream.promote() before the backup
# is promotable, and after a SIGKILL of the primary a promotion whose tables hold exactly what
# the primary's held (row counts and checksums of every table, computed on the primary before
# the kill).
#   tests/pg_send_index_test.sh [scratch dir] [base port] [transport]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-/tmp/slipstream-send-index}
base=${2:-55820}
transport=${3:-tcp}
secret="send-index-$RANDOM$RANDOM"
pg="$root/scripts/pg_cluster.sh"
p="$scratch/primary"
b="$scratch/backup"

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
p_sql() { "$pg" psql "$p" -qAt "$@"; }
b_sql() { "$pg" psql "$b" -qAt "$@"; }
fail() { echo "send-index test FAILED: $*" >&2; exit 1; }

rm -rf "$scratch"
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
trap 'for d in "$p" "$b"; do "$pg" stop "$d" immediate >/dev/null 2>&1 || true; done' EXIT

"$pg" init "$p" "$base" "wal_keep_size = 256MB" >/dev/null
"$pg" start "$p"
p_sql -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE kept (id int PRIMARY KEY, v text) USING slipstream" \
  -c "CREATE TABLE emptied (id int PRIMARY KEY, v text) USING slipstream" \
  -c "CREATE TABLE refiled (id int, v text) USING slipstream" \
  -c "CREATE TABLE dropped (id int, v text) USING slipstream" \
  -c "CREATE TABLE churn (id int, v text) USING slipstream" \
  -c "INSERT INTO kept SELECT g, repeat(md5(g::text), 1 + g % 60) FROM generate_series(1, 20000) g" \
  -c "INSERT INTO emptied SELECT g, 'e' || g FROM generate_series(1, 5000) g" \
  -c "INSERT INTO refiled SELECT g, 'r' || g FROM generate_series(1, 5000) g" \
  -c "INSERT INTO dropped SELECT g, 'd' || g FROM generate_series(1, 5000) g" >/dev/null

mkdir -p "$b/sock"
[ "$(id -u)" = 0 ] && chown -R postgres: "$b"
as_postgres "$root/scripts/seed_backup.sh" --send-index \
  --connstring "host=$p/sock port=$base user=postgres dbname=postgres" \
  --datadir "$b/data" --name backup --set "port = $((base + 1))" \
  --set "unix_socket_directories = '$b/sock'" >/dev/null
"$pg" start "$b"
b_sql -c "SELECT slipstream.serve_backup('127.0.0.1:$((base + 11))', '$secret', 8, '1MB')" >/dev/null
p_sql -c "SELECT slipstream.add_backup('backup', '127.0.0.1:$((base + 11))', '$transport', '$secret', 'send_index', true)" >/dev/null
for _ in $(seq 1 200); do
  [ "$(p_sql -c "SELECT state FROM slipstream.replication")" = streaming ] && break
  sleep 0.05
done
[ "$(p_sql -c "SELECT shipping, lz4 FROM slipstream.replication")" = "send_index|t" ] ||
  fail "the replication view does not show the shipping mode: $(p_sql -c 'SELECT * FROM slipstream.replication')"

# Before any import covers its WAL, the backup cannot take over: promote() refuses, and says why.
if [ "$(b_sql -c "SELECT promotable FROM slipstream.index_import")" = f ]; then
  out=$(b_sql -c "SELECT slipstream.promote(5)" 2>&1 || true)
  echo "$out" | grep -q "not yet imported" || fail "promote() before an import: $out"
  echo "ok: promote() refuses before the backup imported levels its WAL covers"
fi

# Imports: compactions on the primary until the backup is promotable.
for _ in $(seq 1 60); do
  [ "$(b_sql -c "SELECT promotable FROM slipstream.index_import")" = t ] && break
  p_sql -c "INSERT INTO churn SELECT g, 'c' FROM generate_series(1, 500) g" \
    -c "SELECT slipstream.compact('churn')" >/dev/null
  sleep 0.3
done
[ "$(b_sql -c "SELECT promotable FROM slipstream.index_import")" = t ] ||
  fail "never promotable: $(b_sql -c 'SELECT * FROM slipstream.index_import')"
[ "$(p_sql -c "SELECT index_seeds > 0 AND index_installs > 0 FROM slipstream.replication")" = t ] ||
  fail "no seed or install counted: $(p_sql -c 'SELECT * FROM slipstream.replication')"
# The view counts what was imported and the time its rewriting took.
[ "$(b_sql -c "SELECT segments_imported > 0 AND segment_bytes >= segments_imported * 4096 AND rewrite_ms > 0
               FROM slipstream.index_import")" = t ] ||
  fail "the import's segment counters do not move: $(b_sql -c 'SELECT * FROM slipstream.index_import')"
# Monitoring queries keep working on the importing backup: the size functions report
# PostgreSQL's answer (the stub) instead of reading its engine.
[ "$(b_sql -c "SELECT pg_relation_size('kept') >= 0 AND pg_total_relation_size('kept') > 0")" = t ] ||
  fail "the size functions fail on the importing backup"
echo "ok: the backup imported the levels ($(b_sql -c "SELECT installed_compactions || ' installs, ' || segments_imported || ' segments (' || pg_size_pretty(segment_bytes) || ') rewritten in ' || round(rewrite_ms::numeric, 1) || ' ms, horizon ' || horizon FROM slipstream.index_import"))"

# On the backup: reads refused with a hint, the imported levels verified.
out=$(b_sql -c "SELECT count(*) FROM kept" 2>&1 || true)
echo "$out" | grep -q "imports its" || fail "a read on the importing backup: $out"
[ "$(b_sql -c "SELECT bool_and(ok) FROM slipstream.verify('kept')")" = t ] ||
  fail "verify on the backup: $(b_sql -c "SELECT * FROM slipstream.verify('kept')")"
echo "ok: reads are refused on the importing backup, and verify checks its levels"

# DDL, some of it imported, some only in the WAL after the last import.
p_sql -c "TRUNCATE emptied" \
  -c "BEGIN" -c "TRUNCATE refiled" -c "INSERT INTO refiled SELECT g, 'again' || g FROM generate_series(1, 300) g" -c "COMMIT" \
  -c "DROP TABLE dropped" \
  -c "UPDATE kept SET v = 'updated' WHERE id % 7 = 0" \
  -c "DELETE FROM kept WHERE id % 11 = 0" >/dev/null
p_sql -c "SELECT slipstream.compact('kept')" >/dev/null
p_sql -c "SELECT slipstream.compact('kept')" >/dev/null
p_sql -c "CREATE TABLE late (id int, v text) USING slipstream" \
  -c "INSERT INTO late SELECT g, 'l' || g FROM generate_series(1, 777) g" \
  -c "UPDATE kept SET v = 'after the last import' WHERE id % 13 = 0" >/dev/null

summary() {
  "$1" -c "SELECT string_agg(t || ':' || n || ':' || h, ' ' ORDER BY t) FROM (
    SELECT 'kept' AS t, count(*) AS n, coalesce(sum(hashtext(id || v)::bigint), 0) AS h FROM kept
    UNION ALL SELECT 'emptied', count(*), coalesce(sum(hashtext(id || v)::bigint), 0) FROM emptied
    UNION ALL SELECT 'refiled', count(*), coalesce(sum(hashtext(id || v)::bigint), 0) FROM refiled
    UNION ALL SELECT 'late', count(*), coalesce(sum(hashtext(id || v)::bigint), 0) FROM late) s"
}
expected=$(summary p_sql)
# Every commit above returned in local mode: wait until the backup holds the WAL, then kill.
end=$(p_sql -c "SELECT pg_current_wal_flush_lsn()")
for _ in $(seq 1 200); do
  [ "$(p_sql -c "SELECT placed_lsn >= '$end' FROM slipstream.replication")" = t ] && break
  sleep 0.05
done
"$pg" kill "$p"
b_sql -c "SELECT slipstream.promote(60)" >/dev/null
got=$(summary b_sql)
[ "$got" = "$expected" ] || fail "after the promotion: $got, the primary held $expected"
[ "$(b_sql -c "SELECT count(*) FROM pg_class WHERE relname = 'dropped'")" = 0 ] || fail "dropped came back"
for t in kept refiled late; do
  [ "$(b_sql -c "SELECT bool_and(ok) FROM slipstream.verify('$t')")" = t ] ||
    fail "verify($t) on the new primary: $(b_sql -c "SELECT * FROM slipstream.verify('$t')")"
done
grep -h "taking over the imported levels\|replayed .* WAL records" "$b/server.log" | sed 's/^.*slipstream: /  /'
b_sql -c "CREATE TABLE fresh (id int) USING slipstream" -c "INSERT INTO fresh SELECT generate_series(1, 10)" >/dev/null
[ "$(b_sql -c "SELECT count(*) FROM fresh")" = 10 ] || fail "the new primary does not take new tables"
echo "ok: the promoted backup holds what the primary held ($got)"
echo "send-index test ($transport) passed"
