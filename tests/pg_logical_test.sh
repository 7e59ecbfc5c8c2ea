#!/usr/bin/env bash
# pg_logical_test.sh: logical decoding of slipstream tables (host/decode.c), with real clusters.
#   1. test_decoding: the same statements run on a heap table and on a slipstream table of the
#      same shape decode to the same changes (inserts, multi-row inserts and COPY, updates with
#      and without a key change, deletes, INSERT ... ON CONFLICT, rolled-back subtransactions,
#      a TOASTed value, REPLICA IDENTITY FULL, a table in a tablespace), and a table rewrite
#      (VACUUM FULL, ALTER TABLE ... SET TABLESPACE) decodes to nothing, as on heap.
#   2. pgoutput: a publication of slipstream tables (and a heap one) on one cluster, a
#      subscription on another whose tables are slipstream tables too; after a workload of the
#      same kinds plus TRUNCATE, every subscribed table equals the publisher's, row for row.
#   tests/pg_logical_test.sh [scratch dir] [base port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-logical}}
base=${2:-55680}
pg="$root/scripts/pg_cluster.sh"
pub="$scratch/pub"
sub="$scratch/sub"

rm -rf "$scratch"
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
"$pg" init "$pub" "$base" "wal_level = logical" "max_replication_slots = 10" \
  "max_wal_senders = 10" >/dev/null
"$pg" init "$sub" $((base + 1)) "max_replication_slots = 10" "max_logical_replication_workers = 6" >/dev/null
"$pg" start "$pub"
"$pg" start "$sub"
trap 'for c in "$pub" "$sub"; do "$pg" stop "$c" immediate >/dev/null 2>&1 || true; done' EXIT
p_sql() { "$pg" psql "$pub" -qAt -v ON_ERROR_STOP=1 "$@"; }
s_sql() { "$pg" psql "$sub" -qAt -v ON_ERROR_STOP=1 "$@"; }
fail() { echo "logical test FAILED: $*" >&2; exit 1; }

p_sql -c "CREATE EXTENSION slipstream" >/dev/null
s_sql -c "CREATE EXTENSION slipstream" >/dev/null
# A tablespace for tables whose records must name it (decoding maps files back to relations).
p_sql -c "SET allow_in_place_tablespaces = true" -c "CREATE TABLESPACE dec_space LOCATION ''" >/dev/null

# ---- 1. test_decoding: heap and slipstream decode alike ----
# Statements on table TBL (created with access method AM), the same for both.
statements() {
  local tbl=$1 am=$2
  cat <<EOF
CREATE TABLE $tbl (id int PRIMARY KEY, v text, n int) USING $am;
CREATE TABLE ${tbl}_full (a int, b text) USING $am;
ALTER TABLE ${tbl}_full REPLICA IDENTITY FULL;
INSERT INTO $tbl VALUES (1, 'one', 1);
INSERT INTO $tbl SELECT g, 'v' || g, g FROM generate_series(2, 5) g;
COPY $tbl FROM STDIN;
6	six	6
7	seven	7
\\.
UPDATE $tbl SET v = 'one, updated' WHERE id = 1;
UPDATE $tbl SET id = 10 WHERE id = 2;
DELETE FROM $tbl WHERE id = 3;
INSERT INTO $tbl VALUES (4, 'conflict', 0) ON CONFLICT (id) DO UPDATE SET v = 'upserted';
INSERT INTO $tbl VALUES (11, 'new by upsert', 0) ON CONFLICT (id) DO UPDATE SET v = 'x';
INSERT INTO $tbl VALUES (5, 'ignored', 0) ON CONFLICT (id) DO NOTHING;
BEGIN;
INSERT INTO $tbl VALUES (20, 'kept', 0);
SAVEPOINT s;
INSERT INTO $tbl VALUES (21, 'rolled back', 0);
ROLLBACK TO s;
UPDATE $tbl SET n = n + 100 WHERE id = 20;
COMMIT;
BEGIN;
INSERT INTO $tbl VALUES (30, 'aborted', 0);
ROLLBACK;
INSERT INTO $tbl SELECT 40, string_agg(md5(g::text), ''), 0 FROM generate_series(1, 300) g;
UPDATE $tbl SET n = 41 WHERE id = 40;
INSERT INTO ${tbl}_full VALUES (1, 'a'), (2, 'b');
UPDATE ${tbl}_full SET b = 'bb' WHERE a = 2;
DELETE FROM ${tbl}_full WHERE a = 1;
VACUUM FULL $tbl;
DELETE FROM $tbl WHERE id = 40;
CREATE TABLE ${tbl}_spc (id int PRIMARY KEY, v text) USING $am TABLESPACE dec_space;
INSERT INTO ${tbl}_spc VALUES (1, 'in a tablespace'), (2, 'b');
UPDATE ${tbl}_spc SET v = 'moved key' , id = 3 WHERE id = 2;
DELETE FROM ${tbl}_spc WHERE id = 1;
ALTER TABLE ${tbl}_spc SET TABLESPACE pg_default;
INSERT INTO ${tbl}_spc VALUES (4, 'after the move');
EOF
}

# Decodes the statements on a fresh slot; prints the changes with the table name made neutral.
decode() {
  local tbl=$1 am=$2
  p_sql -c "SELECT 'slot' FROM pg_create_logical_replication_slot('dec_$tbl', 'test_decoding')" >/dev/null
  statements "$tbl" "$am" | "$pg" psql "$pub" -qAt -v ON_ERROR_STOP=1 >/dev/null
  p_sql -c "SELECT data FROM pg_logical_slot_get_changes('dec_$tbl', NULL, NULL,
                    'include-xids', '0', 'skip-empty-xacts', '1')" |
    sed "s/public\.$tbl/public.TBL/g"
  p_sql -c "SELECT pg_drop_replication_slot('dec_$tbl')" >/dev/null
}

decode dec_heap heap >"$scratch/heap.decoded"
decode dec_ss slipstream >"$scratch/slipstream.decoded"
if ! diff "$scratch/heap.decoded" "$scratch/slipstream.decoded" >"$scratch/decoded.diff"; then
  cat "$scratch/decoded.diff" >&2
  fail "test_decoding's output for the slipstream table differs from heap's"
fi
changes=$(grep -c '^table ' "$scratch/slipstream.decoded" || true)
[ "$changes" -ge 20 ] || fail "only $changes changes decoded: $(cat "$scratch/slipstream.decoded")"
for kind in INSERT UPDATE DELETE; do
  grep -q "^table public.TBL: $kind" "$scratch/slipstream.decoded" || fail "no $kind decoded"
done
grep -q "old-key: id\[integer\]:2" "$scratch/slipstream.decoded" || fail "a key change has no old key"
echo "ok: test_decoding decodes $changes changes of slipstream tables exactly as heap's"

# ---- 2. pgoutput: a subscriber follows a publication of slipstream tables ----
schema="CREATE TABLE items (id int PRIMARY KEY, v text, n int) USING slipstream;
CREATE TABLE docs (id int PRIMARY KEY, body text) USING slipstream;
CREATE TABLE events (at int, what text) USING slipstream;
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE TABLE h (id int PRIMARY KEY, v text);"
p_sql -c "$schema" >/dev/null
s_sql -c "$schema" >/dev/null
p_sql -c "INSERT INTO items SELECT g, 'initial ' || g, g FROM generate_series(1, 2000) g" \
  -c "INSERT INTO h SELECT g, 'heap ' || g FROM generate_series(1, 200) g" \
  -c "CREATE PUBLICATION pub FOR TABLE items, docs, events, h" >/dev/null
s_sql -c "CREATE SUBSCRIPTION sub CONNECTION 'host=$pub/sock port=$base user=postgres dbname=postgres'
          PUBLICATION pub" >/dev/null 2>&1

# The subscriber has copied the initial rows once its table sync is done.
for _ in $(seq 1 300); do
  [ "$(s_sql -c "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'")" = 0 ] &&
    [ "$(s_sql -c "SELECT count(*) FROM pg_subscription_rel")" = 4 ] && break
  sleep 0.1
done
[ "$(s_sql -c "SELECT count(*) FROM items")" = 2000 ] || fail "the initial copy is incomplete"

"$pg" psql "$pub" -qAt -v ON_ERROR_STOP=1 >/dev/null <<'EOF'
INSERT INTO items SELECT g, 'later ' || g, g FROM generate_series(2001, 3000) g;
UPDATE items SET v = v || ' (updated)', n = n * 2 WHERE id % 3 = 0;
UPDATE items SET id = id + 100000 WHERE id % 50 = 1;
DELETE FROM items WHERE id % 7 = 0;
INSERT INTO items VALUES (14, 'upserted', 0), (3000000, 'new', 1)
  ON CONFLICT (id) DO UPDATE SET v = excluded.v, n = items.n + 1;
BEGIN;
INSERT INTO items VALUES (5000000, 'kept', 0);
SAVEPOINT s;
DELETE FROM items WHERE id < 100;
ROLLBACK TO s;
COMMIT;
INSERT INTO docs SELECT g, (SELECT string_agg(md5(g::text || x::text), '') FROM generate_series(1, 300) x)
  FROM generate_series(1, 40) g;
UPDATE docs SET body = body || 'tail' WHERE id % 2 = 0;
DELETE FROM docs WHERE id % 5 = 0;
INSERT INTO events SELECT g, 'event ' || g FROM generate_series(1, 300) g;
UPDATE events SET what = what || '!' WHERE at % 4 = 0;
DELETE FROM events WHERE at % 9 = 0;
VACUUM FULL items;
UPDATE items SET n = -1 WHERE id = 5000000;
INSERT INTO h VALUES (201, 'heap 201');
TRUNCATE docs;
INSERT INTO docs VALUES (1, 'after the truncate');
EOF

# Waits until the subscriber has applied everything the publisher wrote.
target=$(p_sql -c "SELECT pg_current_wal_lsn()")
for _ in $(seq 1 600); do
  done_=$(p_sql -c "SELECT coalesce(bool_and(confirmed_flush_lsn >= '$target'), false)
                    FROM pg_replication_slots WHERE slot_name = 'sub'")
  [ "$done_" = t ] && break
  sleep 0.1
done
[ "$done_" = t ] || fail "the subscriber did not catch up: $(p_sql -c 'SELECT * FROM pg_replication_slots')"

# Every table, row for row.
for t in items docs events h; do
  q="SELECT count(*) || ' ' || coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '-') FROM $t t"
  a=$(p_sql -c "$q")
  b=$(s_sql -c "$q")
  [ "$a" = "$b" ] || fail "$t differs: publisher $a, subscriber $b"
  echo "ok: $t on the subscriber equals the publisher's ($a)"
done
s_sql -c "SELECT count(*) FROM slipstream.verify('items') WHERE NOT ok" | grep -qx 0 ||
  fail "verify fails on the subscriber"
echo "logical decoding test passed"
