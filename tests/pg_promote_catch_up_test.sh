#!/usr/bin/env bash
# pg_promote_catch_up_test.sh: slipstream.promote() takes over with every byte of WAL the backup
# holds, also when replay was paused while the backup waited for a segment file that did not
# exist yet. PostgreSQL's startup process pauses inside its wait for WAL; told to promote
# there, it ends recovery without looking at pg_wal again, so a promotion triggered before
# replay caught up dropped every commit since the pause (a CI run lost a whole round of
# pg_takeover_test.sh's deferred replay this way). promote() now ends the pause, waits until
# replay reached the end of the valid WAL in pg_wal, and only then promotes.
# slipstream.catch_up() does the same wait for a promotion made by someone else: Patroni's
# pre_promote hook fences with stop_serving(), calls catch_up(), and Patroni runs pg_ctl promote.
# Each case: a primary and one seeded backup, replay paused before any WAL reaches the backup
# (by the user with pg_wal_replay_pause(), or by deferred replay's own hold), 20000 rows
# committed in remote_memory, the primary SIGKILLed, promote() on the backup (or stop_serving(),
# catch_up() and pg_promote()): every row is there, and recovery ended at or past the primary's
# last flushed position.
#   tests/pg_promote_catch_up_test.sh [scratch dir] [base port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-promote-catch-up}}
base=${2:-55920}
pg="$root/scripts/pg_cluster.sh"
secret="catch-up-test-$RANDOM$RANDOM"
primary="$scratch/primary"
backup="$scratch/backup"

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
sql() { local dir=$1; shift; "$pg" psql "$dir" -qAt "$@"; }
trap 'for d in "$primary" "$backup"; do "$pg" stop "$d" immediate >/dev/null 2>&1 || true; done' EXIT

# Waits until `sql $1 -c $2` prints $3 (10 s at most).
wait_for() {
  for _ in $(seq 1 200); do
    [ "$(sql "$1" -c "$2")" = "$3" ] && return 0
    sleep 0.05
  done
  echo "$1: $2 gives $(sql "$1" -c "$2"), not $3" >&2
  return 1
}

# One case: $1 = user (pg_wal_replay_pause on a continuously replaying backup) or deferred,
# $2 = the transport, $3 = promote (slipstream.promote()) or catch_up (the fence,
# slipstream.catch_up() and pg_promote(), as Patroni's hook and Patroni do it).
run_case() {
  local pause=$1 transport=$2 via=$3 replay=continuous
  [ "$pause" = deferred ] && replay=deferred
  for d in "$primary" "$backup"; do "$pg" stop "$d" immediate >/dev/null 2>&1 || true; done
  rm -rf "$scratch"
  mkdir -p "$scratch" "$backup/sock"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$scratch"
  "$pg" init "$primary" "$base" "slipstream.min_sync_backups = 1" "wal_keep_size = 256MB" >/dev/null
  "$pg" start "$primary"
  sql "$primary" -c "CREATE EXTENSION slipstream" \
    -c "CREATE TABLE ledger (n int PRIMARY KEY, pad text) USING slipstream" \
    -c "CREATE TABLE audit (n int PRIMARY KEY)" >/dev/null
  as_postgres "$root/scripts/seed_backup.sh" \
    --connstring "host=$primary/sock port=$base user=postgres dbname=postgres" \
    --datadir "$backup/data" --name backup --set "port = $((base + 1))" \
    --set "unix_socket_directories = '$backup/sock'" --set "slipstream.backup_replay = $replay" \
    --set "slipstream.backup_replay_lag = 16MB" >/dev/null
  "$pg" start "$backup"
  # The seed ends with a segment switch: replay waits for a segment file nobody wrote yet.
  if [ "$pause" = user ]; then
    wait_for "$backup" "SELECT pg_is_in_recovery()" t
    sql "$backup" -c "SELECT pg_wal_replay_pause()" >/dev/null
    wait_for "$backup" "SELECT pg_get_wal_replay_pause_state()" paused
  fi
  local paused_at
  paused_at=$(sql "$backup" -c "SELECT pg_last_wal_replay_lsn()")
  sql "$backup" -c "SELECT slipstream.serve_backup('127.0.0.1:$((base + 11))', '$secret', 8, '1MB')" >/dev/null
  sql "$primary" -c "SELECT slipstream.add_backup('backup', '127.0.0.1:$((base + 11))', '$transport', '$secret')" >/dev/null
  wait_for "$primary" "SELECT state FROM slipstream.replication" streaming
  [ "$pause" = deferred ] && wait_for "$backup" "SELECT pg_get_wal_replay_pause_state()" paused
  sql "$primary" -c "SET slipstream.commit_mode = remote_memory" \
    -c "INSERT INTO ledger SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g" \
    -c "INSERT INTO audit SELECT generate_series(1, 20000)" >/dev/null
  local flushed
  flushed=$(sql "$primary" -c "SELECT pg_current_wal_flush_lsn()")
  # Still paused where it was: nothing of the load is replayed before the takeover.
  local held
  held=$(sql "$backup" -c "SELECT pg_get_wal_replay_pause_state() || ' at ' || pg_last_wal_replay_lsn()")
  [ "$held" = "paused at $paused_at" ] ||
    { echo "$pause pause, $transport: the backup was not held paused at $paused_at: $held" >&2; exit 1; }
  "$pg" kill "$primary"
  local ended rows audit
  if [ "$via" = promote ]; then
    ended=$(sql "$backup" -c "SELECT slipstream.promote(60)")
  else
    sql "$backup" -c "SELECT slipstream.stop_serving()" >/dev/null
    ended=$(sql "$backup" -c "SELECT slipstream.catch_up(60)")
    [ "$(sql "$backup" -c "SELECT pg_last_wal_replay_lsn() >= '$ended'::pg_lsn")" = t ] ||
      { echo "$pause pause, $transport: catch_up() returned $ended before replay got there" >&2; exit 1; }
    sql "$backup" -c "SELECT pg_promote(true, 60)" >/dev/null
  fi
  rows=$(sql "$backup" -c "SELECT count(*) FROM ledger")
  audit=$(sql "$backup" -c "SELECT count(*) FROM audit")
  # At or past the flush position: WAL written after it (a running-xacts record) may have come too.
  if [ "$rows" != 20000 ] || [ "$audit" != 20000 ] ||
     [ "$(sql "$backup" -c "SELECT '$ended'::pg_lsn >= '$flushed'::pg_lsn")" != t ]; then
    echo "$pause pause, $transport: $via returned $ended (the primary flushed to $flushed); ledger $rows rows, audit $audit rows of 20000" >&2
    grep -E "promot|redo|recovery|invalid record" "$backup/server.log" | tail -10 >&2 || true
    exit 1
  fi
  [ "$(sql "$backup" -c "SELECT count(*) FROM slipstream.verify('ledger') WHERE NOT ok")" = 0 ] ||
    { echo "$pause pause, $transport: verify failed on the promoted backup" >&2; exit 1; }
  echo "ok: replay paused by $pause at $paused_at, $transport: $via ended recovery at $ended, all 20000 rows there"
}

run_case user shm promote
run_case deferred tcp promote
run_case user tcp catch_up
echo "promote catch-up test passed"
