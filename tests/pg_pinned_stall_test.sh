#!/usr/bin/env bash
# pg_pinned_stall_test.sh: long-lived readers (cursors opened at different times) pin every
# memtable but the active one, so a large write must wait for room that only they can free.
# The wait must end: a statement timeout or pg_cancel_backend cancels it with the usual error,
# otherwise it fails after the engine's pinned-wait limit with a clear error and hint; once the
# readers finish, the same write succeeds. (Before the fix the writer hung, uncancellable.)
#   tests/pg_pinned_stall_test.sh [scratch dir] [port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-pinned}}
port=${2:-55466}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"

# A 5 s pinned-wait limit (30 s by default) keeps the test short.
"$pg" init "$cluster" "$port" "slipstream.memtables = 4" "slipstream.pinned_wait = 5s"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
P() { timeout 150 "$pg" psql "$cluster" -qAt "$@"; }  # a hung writer fails the test
P -c "CREATE EXTENSION slipstream" -c "CREATE TABLE t (i int) USING slipstream" \
  -c "INSERT INTO t SELECT generate_series(1, 10)" -c "CREATE TABLE w (id int, v text) USING slipstream"
ins="INSERT INTO w SELECT g, repeat('x', 300) FROM generate_series(1, 20000) g"   # ~7 MB, l0_size 4 MB

# Three sessions hold a cursor each, opened between large inserts so that they pin different
# memtable generations, and keep their transactions open until released.
for n in 1 2 3; do
  P -c "BEGIN" -c "DECLARE c CURSOR FOR SELECT * FROM t" -c "FETCH 1 FROM c" \
    -c "SELECT pg_sleep(300)" -c "COMMIT" >/dev/null 2>&1 &
  sleep 1
  P -c "SET statement_timeout = '60s'" -c "$ins" >/dev/null 2>&1 || true
done

failures=0
expect() {  # expect <name> <pattern> <output>
  if echo "$3" | grep -q "$2"; then
    echo "$1: ok"
  else
    echo "$1: FAILED, got: $3"
    failures=$((failures + 1))
  fi
}

out=$(P -c "SET statement_timeout = '3s'" -c "$ins" 2>&1 || true)
expect "statement_timeout ends the wait" "canceling statement due to statement timeout" "$out"

P -c "$ins" >"$scratch/cancelled.out" 2>&1 &
writer=$!
sleep 3
P -c "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE 'INSERT INTO w%' AND pid <> pg_backend_pid()" >/dev/null
wait "$writer" || true
expect "pg_cancel_backend ends the wait" "canceling statement due to user request" "$(cat "$scratch/cancelled.out")"

out=$(P -c "$ins" 2>&1 || true)
expect "the wait ends with an error after the pinned-wait limit" "every memtable is pinned by long-running readers (scans or cursors open for 5000 ms" "$out"
expect "the error has a hint" "HINT: *Long-running scans" "$out"

# Release the readers: the same write goes through.
P -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'" >/dev/null
sleep 1
out=$(P -c "$ins" -c "SELECT 'inserted'" 2>&1 || true)
expect "writes resume once the readers are gone" "inserted" "$out"
bad=$(P -c "SELECT count(*) FROM slipstream.verify('w') WHERE NOT ok")
expect "verify passes" "^0$" "$bad"

if [ "$failures" != 0 ]; then
  tail -20 "$cluster/server.log"
  echo "pinned stall test: $failures failures"
  exit 1
fi
echo "pinned stall test passed"
