#!/usr/bin/env bash
# pg_vismap_churn_test.sh: the visibility map under churn. Two pgbench clients HOT-update,
# delete, upsert and key-update random rows of a slipstream table while a loop VACUUMs it
# (which prunes chains and marks blocks all-visible, those of redirects included) and another
# counts it twice in one REPEATABLE READ snapshot: through the index alone (an index-only scan,
# which trusts the map) and by a sequential scan (which reads every row). A block marked while
# a change it holds, or a change to a chain version whose root it holds, is not visible to all
# makes the two counts differ. Every pair must agree, and slipstream.verify must pass.
#   tests/pg_vismap_churn_test.sh [scratch dir] [port] [seconds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-vismap-churn}}
port=${2:-55462}
seconds=${3:-30}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"

"$pg" init "$cluster" "$port" "autovacuum = off"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
psql_c() { "$pg" psql "$cluster" -qAt "$@"; }
psql_c -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE s (id int PRIMARY KEY, v int, pad text) USING slipstream" \
  -c "INSERT INTO s SELECT g, 0, 'x' FROM generate_series(1, 20000) g" \
  -c "CREATE SEQUENCE moved START 1000000" -c "VACUUM s"
# Six in ten HOT updates, then a delete, an upsert, a key update (a new root at a fresh key)
# and a delete of a moved row.
cat > "$scratch/churn.sql" <<'SQL'
\set id random(1, 30000)
\set op random(1, 10)
\if :op <= 6
UPDATE s SET v = v + 1 WHERE id = :id;
\elif :op <= 7
DELETE FROM s WHERE id = :id;
\elif :op <= 8
INSERT INTO s VALUES (:id, 0, 'y') ON CONFLICT (id) DO UPDATE SET v = s.v + 1;
\elif :op <= 9
UPDATE s SET id = nextval('moved') WHERE id = :id;
\else
DELETE FROM s WHERE id = (SELECT max(id) FROM s WHERE id >= 1000000);
\endif
SQL
cat > "$scratch/check.sql" <<'SQL'
BEGIN ISOLATION LEVEL REPEATABLE READ;
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT count(*) || ' ' || coalesce(sum(id), 0) FROM s WHERE id > 0;
SET LOCAL enable_seqscan = on;
SET LOCAL enable_indexscan = off;
SET LOCAL enable_indexonlyscan = off;
SELECT count(*) || ' ' || coalesce(sum(id), 0) FROM s;
COMMIT;
SQL
chmod 644 "$scratch/churn.sql" "$scratch/check.sql"
plan=$(psql_c -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
  -c "EXPLAIN (COSTS OFF) SELECT count(*) FROM s WHERE id > 0")
echo "$plan" | grep -q "Index Only Scan" || { echo "no index-only scan: $plan" >&2; exit 1; }

/usr/lib/postgresql/15/bin/pgbench -h "$cluster/sock" -p "$port" -U postgres -n -c 2 -j 2 \
  -T "$seconds" -f "$scratch/churn.sql" postgres >"$scratch/pgbench.log" 2>&1 &
load=$!
( end=$((SECONDS + seconds))
  while [ $SECONDS -lt $end ]; do psql_c -c "VACUUM s"; sleep 0.3; done ) >"$scratch/vacuum.log" 2>&1 &
vacuums=$!

checks=0
marked_seen=0
end=$((SECONDS + seconds))
while [ $SECONDS -lt $end ]; do
  mapfile -t counts < <(psql_c -f "$scratch/check.sql")
  if [ "${#counts[@]}" != 2 ] || [ "${counts[0]}" != "${counts[1]}" ]; then
    echo "index-only and sequential counts differ in one snapshot: ${counts[*]}" >&2
    exit 1
  fi
  checks=$((checks + 1))
  marked=$(psql_c -c "SELECT relallvisible FROM pg_class WHERE relname = 's'")
  [ "$marked" -gt "$marked_seen" ] && marked_seen=$marked
  sleep 0.2
done
wait "$load" || { cat "$scratch/pgbench.log" >&2; exit 1; }
wait "$vacuums" || { cat "$scratch/vacuum.log" >&2; exit 1; }
processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$scratch/pgbench.log")
if grep -q "error" "$scratch/pgbench.log"; then grep error "$scratch/pgbench.log" | head -5 >&2; exit 1; fi
bad=$(psql_c -c "SELECT count(*) FROM slipstream.verify('s') WHERE NOT ok")
echo "processed $processed, $checks snapshot pairs agreed, up to $marked_seen blocks all-visible, verify failures $bad"
[ "$bad" = 0 ] && [ "$checks" -gt 0 ] && [ "$marked_seen" -gt 0 ] && [ "${processed:-0}" -gt 0 ]
echo "visibility map churn test passed"
