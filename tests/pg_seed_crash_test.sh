#!/usr/bin/env bash
# pg_seed_crash_test.sh: a seed must never hold a change whose transaction id a crash of the
# primary could hand out again. slipstream.seed_snapshot() dumps every stored row, those of
# transactions still open included; a standby seeded from it applies the primary's WAL from the
# dump's horizon on. If the open transaction's WAL were still only in the primary's WAL buffers
# when the primary crashed, recovery would not know its xid, the next transaction would get the
# same xid, and its commit would make the dumped row of the dead transaction visible on the
# standby. So the seed flushes WAL to the dump's end before it returns (replication/seed.c).
#
# Each round opens a transaction that inserts rows and stays open, takes a seed, and at once
# SIGKILLs every process of the server (postmaster and children together, so that nothing
# writes WAL on its way out). A checkpoint first writes out all earlier WAL; then the WAL
# writer, the background writer and the slipstream worker are stopped (SIGSTOP), the WAL
# buffers (64 MB) never wrap, and nothing else commits, so only the seed's flush can put the
# open transaction's WAL in the files. After the restart the open transaction's xid must be one
# the server knows the crash ended ("aborted"), not one in its future that it would hand out
# again. A module without the flush fails every round.
#   tests/pg_seed_crash_test.sh [scratch dir] [port] [rounds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-seed-crash}}
port=${2:-55458}
rounds=${3:-4}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"

"$pg" init "$cluster" "$port" "autovacuum = off" "wal_writer_delay = 10s" "wal_buffers = 64MB" \
  "checkpoint_timeout = 1h" "slipstream.flush_interval = 10s" "slipstream.sync_interval = 1h"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
psql_c() { "$pg" psql "$cluster" -qAt "$@"; }
psql_c -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE seeded (id int PRIMARY KEY, round int, payload text) USING slipstream" \
  -c "INSERT INTO seeded SELECT g, 0, 'committed' FROM generate_series(1, 1000) g" >/dev/null

# SIGKILLs the postmaster and every child in one call.
kill_server() {
  local pid children
  pid=$(head -1 "$cluster/data/postmaster.pid")
  children=$(pgrep -P "$pid" | tr '\n' ' ' || true)
  # shellcheck disable=SC2086 # one word per process id
  kill -9 "$pid" $children
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
}

failed=0
for round in $(seq 1 "$rounds"); do
  xid_file="$scratch/open_xid.$round"
  rm -f "$xid_file"
  psql_c -c "CHECKPOINT"
  # Nothing but the sessions below may write WAL out: the WAL writer's wake-ups, the background
  # writer's page writes (each flushes WAL to its page's LSN first) and the slipstream worker's
  # write-outs (its write-ahead barrier) would each flush the open transaction's WAL by chance.
  # They stay stopped until the kill.
  postmaster=$(head -1 "$cluster/data/postmaster.pid")
  writers=$(ps --ppid "$postmaster" -o pid=,args= |
    awk '/walwriter|background writer|slipstream worker/ { print $1 }' | tr '\n' ' ')
  [ "$(echo "$writers" | wc -w)" = 3 ] || { echo "round $round: expected three writer processes, found: $writers"; exit 1; }
  # shellcheck disable=SC2086 # one word per process id
  kill -STOP $writers
  # The open transaction: its rows are stored, its WAL is in the buffers, it never commits.
  psql_c -c "BEGIN" \
    -c "INSERT INTO seeded SELECT 100000 * $round + g, $round, 'open' FROM generate_series(1, 200) g" \
    -c "SELECT txid_current()" -o "$xid_file" -c "SELECT pg_sleep(600)" >/dev/null 2>&1 &
  opener=$!
  for _ in $(seq 1 600); do
    [ -s "$xid_file" ] && break
    sleep 0.05
  done
  open_xid=$(tr -d '[:space:]' <"$xid_file" 2>/dev/null || true)
  if ! [[ "$open_xid" =~ ^[0-9]+$ ]]; then
    echo "round $round: the open transaction did not start"
    exit 1
  fi
  # The dump must hold the open rows (the standby's copy of them is what is at stake).
  dumped=$(psql_c -c "SELECT count(*) FROM slipstream.seed_snapshot()")
  kill_server
  wait "$opener" 2>/dev/null || true
  if [ "$dumped" -lt 1200 ]; then
    echo "round $round: the seed dumped $dumped rows, not the 1,000 committed and 200 open ones"
    failed=$((failed + 1))
  fi
  "$pg" start "$cluster"
  # Known to the restarted server, and as a transaction the crash ended: "aborted". Had its WAL
  # been lost, the xid would lie in the server's future (an error here) or belong to whichever
  # transaction took it after the restart.
  status=$(psql_c -c "SELECT txid_status($open_xid)" 2>&1 || true)
  if [ "$status" != aborted ]; then
    echo "round $round: xid $open_xid of the open transaction, after the restart: $status"
    failed=$((failed + 1))
  fi
  # The crashed transaction's rows are invisible, the committed ones all there.
  got=$(psql_c -c "SELECT count(*) FILTER (WHERE round = 0), count(*) FILTER (WHERE round > 0) FROM seeded")
  if [ "$got" != "1000|0" ]; then
    echo "round $round: after the restart the table holds committed|open rows $got, not 1000|0"
    failed=$((failed + 1))
  fi
done
bad=$(psql_c -c "SELECT count(*) FROM slipstream.verify('seeded') WHERE NOT ok")
[ "$bad" = 0 ] || { echo "slipstream.verify reports $bad problems"; failed=$((failed + 1)); }
if [ "$failed" != 0 ]; then
  echo "FAILED: $failed checks over $rounds rounds"
  exit 1
fi
echo "seed-crash: $rounds seeds of open transactions, the primary SIGKILLed after each, no xid handed out twice"
