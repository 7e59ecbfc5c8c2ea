#!/usr/bin/env bash
# pg_device_size_test.sh: slipstream.max_device_size bounds the engine's device file.
#  1. A size that is not a multiple of slipstream.segment_size stops the server at start, with
#     an error naming both settings and a hint.
#  2. With 64MB, inserts fail with "device is full" once the file is full; the rows of the
#     transactions that committed before are all there, and the server goes on serving.
#  3. Lowered below the file's size, the engine refuses to open and says which setting to raise.
#  4. Raised to 1GB, the same data opens whole and takes more rows.
#   tests/pg_device_size_test.sh [scratch dir] [port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-device-size}}
port=${2:-55475}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"
conf="$cluster/data/postgresql.conf"
sql() { "$pg" psql "$cluster" -qAt "$@"; }
set_size() { echo "slipstream.max_device_size = '$1'" >>"$conf"; }

"$pg" init "$cluster" "$port" "slipstream.l0_size = 4MB"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT

echo "== 1. a size between two segments (segment_size is 2MB): the server does not start"
set_size 999MB
if "$pg" start "$cluster" >/dev/null 2>&1; then echo "FAIL: the server started" >&2; exit 1; fi
grep -q 'slipstream.max_device_size (999 MB) must be a multiple of slipstream.segment_size (2048 kB)' "$cluster/server.log"
grep -q 'HINT:  Set slipstream.max_device_size to a multiple of slipstream.segment_size' "$cluster/server.log"

echo "== 2. 64MB: inserts end with 'device is full', committed rows stay"
set_size 64MB
"$pg" start "$cluster"
sql -c "CREATE EXTENSION slipstream" \
    -c "CREATE TABLE t (id int PRIMARY KEY, pad text) USING slipstream"
committed=0
err=""
for batch in $(seq 0 199); do
  # 2,000 rows of 1 kB of incompressible text a batch, one transaction each.
  if out=$(sql -c "INSERT INTO t SELECT g, p FROM generate_series($((batch * 2000 + 1)), $(((batch + 1) * 2000))) g
             CROSS JOIN LATERAL (SELECT string_agg(md5(random()::text || g || i), '') AS p
                                 FROM generate_series(1, 32) i) x" 2>&1); then
    committed=$(((batch + 1) * 2000))
  else
    err=$out
    break
  fi
done
echo "committed $committed rows; then: $err"
echo "$err" | grep -q "device is full"
[ "$committed" -gt 0 ]
[ "$(sql -c "SELECT count(*) FROM t")" = "$committed" ]
[ "$(sql -c "SELECT count(*) = max(id) AND min(id) = 1 FROM t")" = t ]
sql -c "SELECT ok, detail FROM slipstream.verify('t')" | grep -q '^t|'
"$pg" stop "$cluster"

echo "== 3. 40MB, below the file's size: the engine refuses to open"
set_size 40MB
"$pg" start "$cluster"
out=$(sql -c "SELECT count(*) FROM t" 2>&1 || true)
echo "$out"
echo "$out" | grep -q "max_device_size"
"$pg" stop "$cluster"

echo "== 4. 1GB: the rows are all there, and more fit"
set_size 1GB
"$pg" start "$cluster"
[ "$(sql -c "SELECT count(*) FROM t")" = "$committed" ]
sql -c "INSERT INTO t SELECT g, repeat('x', 1000) FROM generate_series($((committed + 1)), $((committed + 20000))) g"
[ "$(sql -c "SELECT count(*) FROM t")" = "$((committed + 20000))" ]
sql -c "SELECT ok, detail FROM slipstream.verify('t')" | grep -q '^t|'
echo "device size test passed"
