#!/usr/bin/env bash
# pg_crash_test.sh: kills the postmaster with SIGKILL in the middle of a concurrent write
# workload, restarts it, and checks that every acknowledged commit survived whole, that no
# unacknowledged transaction is half-visible, that slipstream.verify (engine structure and
# index/table agreement) passes, and that an index-only count (the visibility map, which a
# VACUUM loop keeps setting during the workload) equals the table's. Repeats for ROUNDS rounds
# on one cluster. Then a VACUUM sleeping in its cost delay must leave with a killed postmaster.
#   tests/pg_crash_test.sh [scratch dir] [port] [rounds]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-crash}}
port=${2:-55450}
rounds=${3:-${ROUNDS:-8}}
clients=3
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"

# Engine flushes are rare and the durable horizon moves slowly, so most crashes need WAL replay.
"$pg" init "$cluster" "$port" "slipstream.flush_interval = 500ms" "slipstream.sync_interval = 2s" \
  "slipstream.l0_size = 2MB"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
psql_c() { "$pg" psql "$cluster" -qAt "$@"; }
psql_c -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE ledger (client int, seq int, part int, payload text, PRIMARY KEY (client, seq, part)) USING slipstream" \
  -c "CREATE INDEX ledger_seq ON ledger (seq)" \
  -c "CREATE TABLE counters (client int PRIMARY KEY, last int) USING slipstream" \
  -c "INSERT INTO counters SELECT g, 0 FROM generate_series(1, $clients) g" \
  -c "CREATE UNLOGGED TABLE scratch (x int) USING slipstream"

# One client: transactions of three rows plus a counter update; "ACK n" once COMMIT returned.
workload() {
  local c=$1 first=$2 round=$3
  # Odd rounds' rewrites are HOT updates (chains under kills); even rounds' are not, so that
  # the blocks of their rows can end all-visible (a chain's root keeps its block from it) and
  # VACUUM skips them.
  [ $((round % 2)) = 0 ] && echo "SET slipstream.hot_updates = off;"
  for n in $(seq "$first" $((first + 100000))); do
    echo "BEGIN;"
    # Part 2 is 1,000-1,899 bytes, below TOAST's threshold: a large value in the engine, whose
    # header changes (the lock and the update's old version) are written as patches.
    echo "INSERT INTO ledger VALUES ($c,$n,1,'small'), ($c,$n,2,repeat('m',$((1000 + n % 900)))), ($c,$n,3,repeat(md5('$n'),$((n % 90))));"
    echo "UPDATE counters SET last = $n WHERE client = $c;"
    [ $((n % 7)) = 0 ] && echo "UPDATE ledger SET payload = 'rewritten' WHERE client = $c AND seq = $((n - 3)) AND part = 1;"
    if [ $((n % 5)) = 0 ]; then
      echo "SELECT 1 FROM ledger WHERE client = $c AND seq = $((n - 2)) AND part = 2 FOR UPDATE;"
      echo "UPDATE ledger SET payload = payload WHERE client = $c AND seq = $((n - 2)) AND part = 2;"
    fi
    echo "COMMIT;"
    echo "\\echo ACK $n"
  done
}

failures=0
total_replayed=0
total_patches=0
for round in $(seq 1 "$rounds"); do
  psql_c -c "INSERT INTO scratch SELECT generate_series(1, 100)"
  pids=()
  for c in $(seq 1 $clients); do
    first=$(( $(psql_c -c "SELECT last FROM counters WHERE client = $c") + 1 ))
    workload "$c" "$first" "$round" | "$pg" psql "$cluster" -qAt >"$scratch/acks.$c" 2>/dev/null &
    pids+=($!)
  done
  # VACUUM marks blocks all-visible while the clients' changes clear the marks (vismap.c).
  for _ in $(seq 1 1000); do echo "VACUUM ledger;"; echo "SELECT pg_sleep(0.2);"; done |
    "$pg" psql "$cluster" -qAt >/dev/null 2>&1 &
  pids+=($!)
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.5 + (r % 200) / 100 }')"
  "$pg" kill "$cluster"
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  "$pg" start "$cluster"

  for c in $(seq 1 $clients); do
    acked=$(grep -o 'ACK [0-9]*' "$scratch/acks.$c" | tail -1 | cut -d' ' -f2)
    acked=${acked:-0}
    read -r last seqs complete maxseq < <(psql_c -F' ' -c "
      SELECT (SELECT last FROM counters WHERE client = $c),
             count(DISTINCT seq), count(*) FILTER (WHERE parts = 3), coalesce(max(seq), 0)
      FROM (SELECT seq, count(*) AS parts FROM ledger WHERE client = $c GROUP BY seq) s")
    missing=$(psql_c -c "SELECT count(*) FROM generate_series(1, $acked) n
      WHERE NOT EXISTS (SELECT 1 FROM ledger WHERE client = $c AND seq = n)")
    if [ "$missing" != 0 ] || [ "$seqs" != "$complete" ] || [ "$last" != "$maxseq" ] ||
       [ "$maxseq" -lt "$acked" ] || [ "$maxseq" -gt $((acked + 1)) ]; then
      echo "round $round client $c: FAILED acked=$acked last=$last seqs=$seqs complete=$complete max=$maxseq missing=$missing"
      failures=$((failures + 1))
    else
      echo "round $round client $c: ok (acked $acked, present $maxseq)"
    fi
  done
  # Counting through the index alone (all-visible blocks are not read) agrees with the table.
  by_table=$(psql_c -c "SET enable_indexscan = off" -c "SET enable_indexonlyscan = off" \
    -c "SET enable_bitmapscan = off" -c "SELECT count(*) FROM ledger")
  by_index=$(psql_c -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
    -c "SELECT count(*) FROM ledger WHERE seq > 0")
  if [ "$by_table" != "$by_index" ]; then
    echo "round $round: FAILED: $by_table rows in the table, $by_index through the index"
    failures=$((failures + 1))
  fi
  # Every large row reads back whole, its header patched or not.
  torn=$(psql_c -c "SELECT count(*) FROM ledger WHERE part = 2 AND payload <> repeat('m', 1000 + seq % 900)")
  if [ "$torn" != 0 ]; then
    echo "round $round: FAILED: $torn large rows read back other bytes"
    failures=$((failures + 1))
  fi
  visible=$(psql_c -c "SELECT relallvisible FROM pg_class WHERE relname = 'ledger'")
  echo "round $round: $by_table rows, by the index too; $visible blocks all-visible at the last VACUUM"
  bad=$(psql_c -c "SELECT (SELECT count(*) FROM slipstream.verify('ledger') WHERE NOT ok) +
                          (SELECT count(*) FROM slipstream.verify('counters') WHERE NOT ok)")
  replayed=$(psql_c -c "SELECT value FROM slipstream.engine WHERE name = 'wal_records_replayed_at_start'")
  unlogged=$(psql_c -c "SELECT count(*) FROM scratch")
  if [ "$unlogged" != 0 ]; then
    echo "round $round: FAILED: the unlogged table kept $unlogged rows across a crash"
    failures=$((failures + 1))
  fi
  patches=$(psql_c -c "SELECT value FROM slipstream.engine_stats() WHERE name = 'large_patches'")
  echo "round $round: verify failures $bad, WAL records replayed at restart $replayed, large patches since the restart $patches"
  total_replayed=$((total_replayed + ${replayed%.*}))
  total_patches=$((total_patches + ${patches%.*}))
  [ "$bad" = 0 ] || { failures=$((failures + 1)); psql_c -c "SELECT * FROM slipstream.verify('ledger')"; }
done
# A VACUUM running when the postmaster dies leaves with it. Rows are not in shared buffers, so
# VACUUM charges its cost per block of rows (as heap does per page), sleeps in the cost-based
# delay and checks the postmaster there. The soak found an autovacuum worker that ran on for
# minutes after the postmaster's death, holding the old shared memory: no restart was possible.
# No index and no dead row: the only cost charged is that of the rows' own blocks.
psql_c -c "CREATE TABLE vacuum_probe (x int) USING slipstream" \
  -c "INSERT INTO vacuum_probe SELECT generate_series(1, 30000)"
("$pg" psql "$cluster" -qAt -c "SET vacuum_cost_delay = '50ms'" -c "SET vacuum_cost_limit = 1" \
  -c "VACUUM vacuum_probe" >"$scratch/vacuum.out" 2>&1 || true) &
vacuum_pid=""
for _ in $(seq 1 300); do
  vacuum_pid=$(psql_c -c "SELECT pid FROM pg_stat_activity WHERE query = 'VACUUM vacuum_probe'
                            AND wait_event = 'VacuumDelay'")
  [ -n "$vacuum_pid" ] && break
  sleep 0.1
done
if [ -z "$vacuum_pid" ]; then
  echo "vacuum: FAILED: a VACUUM with a cost delay never slept in it (its cost is not charged)"
  cat "$scratch/vacuum.out"
  psql_c -c "SELECT pid, wait_event_type, wait_event, state, query FROM pg_stat_activity"
  failures=$((failures + 1))
else
  "$pg" kill "$cluster"
  if kill -0 "$vacuum_pid" 2>/dev/null; then
    echo "vacuum: FAILED: the VACUUM (pid $vacuum_pid) outlived the postmaster"
    failures=$((failures + 1))
  else
    echo "vacuum: a VACUUM in its cost delay left with the postmaster"
  fi
  wait
  "$pg" start "$cluster"
  bad=$(psql_c -c "SELECT count(*) FROM slipstream.verify('vacuum_probe') WHERE NOT ok")
  [ "$bad" = 0 ] || { echo "vacuum: FAILED: verify after the restart"; failures=$((failures + 1)); }
fi
if [ "$total_replayed" = 0 ]; then
  echo "crash test: no round needed WAL replay, so the replay path went untested"
  failures=$((failures + 1))
fi
if [ "$total_patches" = 0 ]; then
  echo "crash test: no replay changed a large row's header, so patches went untested across crashes"
  failures=$((failures + 1))
fi
if [ "$failures" != 0 ]; then
  tail -40 "$cluster/server.log"
  echo "crash test: $failures failures"
  exit 1
fi
echo "crash test: $rounds rounds passed"
