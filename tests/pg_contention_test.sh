#!/usr/bin/env bash
# pg_contention_test.sh: many clients updating the same few rows (pgbench), the race-prone
# path of READ COMMITTED updates (wait, re-check, follow the update chain). Every committed
# increment must be counted exactly once, no key may have two live versions, and
# slipstream.verify must pass.
#   tests/pg_contention_test.sh [scratch dir] [port] [seconds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-contention}}
port=${2:-55460}
seconds=${3:-10}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"

"$pg" init "$cluster" "$port"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
psql_c() { "$pg" psql "$cluster" -qAt "$@"; }
psql_c -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE hot (id int PRIMARY KEY, v bigint, filler char(88)) USING slipstream" \
  -c "INSERT INTO hot SELECT g, 0, 'x' FROM generate_series(1, 5) g"
cat > "$scratch/hot.sql" <<'SQL'
\set k random(1, 5)
UPDATE hot SET v = v + 1 WHERE id = :k;
SQL
out=$(/usr/lib/postgresql/15/bin/pgbench -h "$cluster/sock" -p "$port" -U postgres -n -c 4 -j 4 \
  -T "$seconds" -f "$scratch/hot.sql" postgres 2>&1) || true
processed=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
read -r rows total < <(psql_c -F' ' -c "SELECT count(*), sum(v) FROM hot")
bad=$(psql_c -c "SELECT count(*) FROM slipstream.verify('hot') WHERE NOT ok")
echo "processed $processed, rows $rows, sum $total, verify failures $bad"
if echo "$out" | grep -q "error"; then echo "$out" | grep error | head -5; exit 1; fi
[ "$rows" = 5 ] && [ "$total" = "$processed" ] && [ "$bad" = 0 ] && [ "${processed:-0}" -gt 0 ]
echo "contention test passed"
