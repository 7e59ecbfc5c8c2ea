#!/usr/bin/env bash
# pg_takeover_test.sh: the guarantee of Tailwind replication, tested by killing. Three nodes;
# each round one is the primary and two are backups (standbys seeded by
# scripts/seed_backup.sh, fed WAL only by one-sided writes, slipstream.min_sync_backups = 2).
# Clients commit in remote_memory (or remote_flush) transactions that each insert one row into
# a slipstream table and one into a heap table; the primary's postmaster is SIGKILLed at a
# random point; a backup chosen at random takes over with slipstream.promote(). On it:
#   - every commit that returned to its client is there (both rows);
#   - nothing is half there (the two tables hold the same transactions);
#   - every PREPARE TRANSACTION that returned is there, committed or still prepared (a fourth
#     client prepares each transaction and then commits it with COMMIT PREPARED);
#   - slipstream.verify passes and the node takes writes.
# Over shm in remote_memory the committing backends place their own WAL most of the time
# (slipstream.backend_placement), so the kills land among their appends; the test fails if
# none was made.
# Then the two other nodes are seeded again from the new primary as its backups, and the next
# round begins. With replay = deferred the backups replay in batches
# (slipstream.backup_replay = deferred, backup_replay_lag = 16MB): first it is checked that a
# backup holds its replay paused and replays a batch once 16 MB are waiting, then every
# takeover replays what the backup held unreplayed.
# With shipping = send_index the backups import the primary's levels (Send-Index: seeded with
# --send-index, slipstream.backup_engine = import, n1's segments LZ4-compressed), a client
# compacts the table all along so that kills land in the middle of shipped compactions, and a
# takeover replays the WAL from the backup's last imported horizon. Before the first round a
# backup is also SIGKILLed in the middle of the primary's compactions, and must recover,
# catch up and import on.
# With TAKEOVER_BY=script the takeover is scripts/failover.sh, as a user without Patroni runs
# it: it fences both backups, promotes the one holding the most WAL, and seeds the other and
# the killed primary again as the new primary's backups (the checks are the same).
#   tests/pg_takeover_test.sh [scratch dir] [base port] [rounds] [transport] [commit mode]
#                             [replay: continuous | deferred] [shipping: build_index | send_index]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-takeover}}
base=${2:-55700}
rounds=${3:-${ROUNDS:-5}}
transport=${4:-${TRANSPORT:-tcp}}
mode=${5:-remote_memory}
replay=${6:-continuous}
shipping=${7:-build_index}
clients=3
takeover_by=${TAKEOVER_BY:-promote}
case "$takeover_by" in
  promote|script) ;;
  *) echo "pg_takeover_test.sh: TAKEOVER_BY is promote or script, not $takeover_by" >&2; exit 2 ;;
esac
secret="takeover-test-$RANDOM$RANDOM"
pg="$root/scripts/pg_cluster.sh"
nodes=("$scratch/n0" "$scratch/n1" "$scratch/n2")

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
port_of() { echo $((base + $1)); }
serve_port_of() { echo $((base + 10 + $1)); }
sql() { local n=$1; shift; "$pg" psql "${nodes[$n]}" -qAt "$@"; }

rm -rf "$scratch"
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
(umask 077; echo "$secret" >"$scratch/secret")  # for scripts/failover.sh
trap 'for d in "${nodes[@]}"; do "$pg" stop "$d" immediate >/dev/null 2>&1 || true; done' EXIT

# Seeds node $2 as a backup of node $1 (running), starts it and makes it serve.
seed_backup() {
  local p=$1 b=$2 dir=${nodes[$2]}
  "$pg" stop "$dir" immediate >/dev/null 2>&1 || true
  rm -rf "$dir"
  mkdir -p "$dir/sock"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
  local extra=()
  [ "$shipping" = send_index ] && extra=(--send-index)
  as_postgres "$root/scripts/seed_backup.sh" "${extra[@]}" \
    --connstring "host=${nodes[$p]}/sock port=$(port_of "$p") user=postgres dbname=postgres" \
    --datadir "$dir/data" --name "n$b" --set "port = $(port_of "$b")" \
    --set "unix_socket_directories = '$dir/sock'" --set "slipstream.backup_replay = $replay" \
    --set "slipstream.backup_replay_lag = 16MB" >/dev/null
  "$pg" start "$dir"
  # The node's previous incarnation, SIGKILLed as a primary, may still hold its serve port for a
  # moment (its backup worker leaves once it sees the postmaster gone).
  for attempt in $(seq 1 40); do
    sql "$b" -c "SELECT slipstream.serve_backup('127.0.0.1:$(serve_port_of "$b")', '$secret', 8, '1MB')" \
      >/dev/null 2>"$scratch/serve.err" && return 0
    grep -q "already in use" "$scratch/serve.err" || break
    sleep 0.25
  done
  cat "$scratch/serve.err" >&2
  return 1
}

# Makes node $1 ship to node $2 and waits until it streams.
add_backup() {
  local p=$1 b=$2
  local lz4=false
  [ "$b" = 1 ] && lz4=true
  [ "$shipping" = send_index ] || lz4=false
  sql "$p" -c "SELECT slipstream.add_backup('n$b', '127.0.0.1:$(serve_port_of "$b")', '$transport', '$secret', '$shipping', $lz4)" >/dev/null
  for _ in $(seq 1 300); do
    [ "$(sql "$p" -c "SELECT state FROM slipstream.replication WHERE name = 'n$b'")" = streaming ] && return 0
    sleep 0.05
  done
  echo "backup n$b never streamed: $(sql "$p" -c 'SELECT * FROM slipstream.replication')" >&2
  tail -5 "${nodes[$b]}/server.log" >&2
  return 1
}

# Send-Index: compacts on node $1 until every backup $2... can take over (its imported levels
# cover WAL it holds: two L0 installs after its seed), 60 s at most.
wait_promotable() {
  local p=$1
  shift
  [ "$shipping" = send_index ] || return 0
  for _ in $(seq 1 60); do
    local ready=1
    for b in "$@"; do
      [ "$(sql "$b" -c "SELECT promotable FROM slipstream.index_import")" = t ] || ready=0
    done
    [ "$ready" = 1 ] && return 0
    sql "$p" -c "INSERT INTO churn SELECT g, repeat('f', 100) FROM generate_series(1, 2000) g" \
      -c "SELECT slipstream.compact('churn')" >/dev/null
    sleep 0.5
  done
  for b in "$@"; do echo "n$b: $(sql "$b" -c 'SELECT * FROM slipstream.index_import')" >&2; done
  echo "the Send-Index backups never became promotable" >&2
  return 1
}

# A client that compacts node $1's table all along (Send-Index rounds).
compactor() {
  while sql "$1" -c "SELECT slipstream.compact('ledger')" >/dev/null 2>&1; do sleep 0.3; done
}

# One client: each transaction inserts its (client, seq) into both tables; ACK once COMMIT returned.
workload() {
  local c=$1 first=$2
  echo "SET slipstream.commit_mode = $mode;"
  for n in $(seq "$first" $((first + 100000))); do
    echo "BEGIN;"
    echo "INSERT INTO ledger VALUES ($c, $n, repeat('x', $(((n * 37) % 1500))));"
    echo "INSERT INTO audit VALUES ($c, $n);"
    echo "COMMIT;"
    echo "\\echo ACK $c $n"
  done
}

# The two-phase client: each transaction is prepared (PREPARED once PREPARE TRANSACTION
# returned), then committed (ACK once COMMIT PREPARED returned).
preparer() {
  local first=$1
  echo "SET slipstream.commit_mode = $mode;"
  for n in $(seq "$first" $((first + 100000))); do
    echo "BEGIN;"
    echo "INSERT INTO ledger VALUES (99, $n, 'prepared');"
    echo "INSERT INTO audit VALUES (99, $n);"
    echo "PREPARE TRANSACTION 'p$n';"
    echo "\\echo PREPARED $n"
    echo "COMMIT PREPARED 'p$n';"
    echo "\\echo ACK 99 $n"
  done
}

# After a failed check, what CI's log needs to tell the cause: what the killed primary $1
# reported of its backups, and what every node logged of replication, recovery and promotion.
report_failure() {
  local killed=$1 new=$2
  echo "--- n$killed's slipstream.replication just before it was killed:" >&2
  cat "$scratch/replication.before-kill" >&2
  for n in 0 1 2; do
    local role=backup
    [ "$n" = "$killed" ] && role="killed primary"
    [ "$n" = "$new" ] && role="new primary"
    echo "--- n$n ($role), the last of its server log:" >&2
    grep -E "slipstream|redo|promot|recovery|invalid record|checksum|timeline|FATAL|PANIC|ERROR" \
      "${nodes[$n]}/server.log" | grep -v "terminating connection" | tail -40 >&2 || true
  done
  echo "--- n$new's pg_wal:" >&2
  ls -l "${nodes[$new]}/data/pg_wal" >&2 || true
}

# The first primary: n0, with two fresh backups.
"$pg" init "${nodes[0]}" "$(port_of 0)" "slipstream.min_sync_backups = 2" \
  "slipstream.backup_timeout = 2s" "wal_keep_size = 256MB" "max_prepared_transactions = 8" >/dev/null
"$pg" start "${nodes[0]}"
sql 0 -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE ledger (client int, seq int, payload text, PRIMARY KEY (client, seq)) USING slipstream" \
  -c "CREATE TABLE audit (client int, seq int, PRIMARY KEY (client, seq))" \
  -c "CREATE TABLE filler (n int, pad text)" \
  -c "CREATE TABLE churn (n int, pad text) USING slipstream" >/dev/null
primary=0
for b in 1 2; do seed_backup 0 "$b"; add_backup 0 "$b"; done
wait_promotable 0 1 2

if [ "$shipping" = send_index ]; then
  # A backup killed in the middle of the primary's compactions recovers from its images and
  # imports on: its installs go up and it reports no import error.
  sql 0 -c "INSERT INTO ledger SELECT 0, -g, repeat('k', 900) FROM generate_series(1, 20000) g" \
    -c "INSERT INTO audit SELECT 0, -g FROM generate_series(1, 20000) g" >/dev/null
  sql 0 -c "SELECT slipstream.compact('ledger')" >/dev/null &
  compacting=$!
  sleep 0.$((RANDOM % 5))
  "$pg" kill "${nodes[1]}" 2>/dev/null
  wait "$compacting" || true
  "$pg" start "${nodes[1]}"
  before=$(sql 1 -c "SELECT installed_compactions FROM slipstream.index_import")
  for _ in $(seq 1 300); do
    [ "$(sql 0 -c "SELECT state FROM slipstream.replication WHERE name = 'n1'")" = streaming ] && break
    sleep 0.05
  done
  sql 0 -c "SELECT slipstream.compact('ledger')" >/dev/null
  caught_up=0
  for _ in $(seq 1 200); do
    after=$(sql 1 -c "SELECT installed_compactions FROM slipstream.index_import")
    error=$(sql 1 -c "SELECT coalesce(error, '') FROM slipstream.index_import")
    [ -n "$error" ] && { echo "n1 stopped importing after its restart: $error" >&2; exit 1; }
    if [ "$after" -gt "$before" ]; then caught_up=1; break; fi
    sleep 0.05
  done
  [ "$caught_up" = 1 ] || { echo "n1 imported nothing after its restart: $(sql 1 -c 'SELECT * FROM slipstream.index_import')" >&2; exit 1; }
  wait_promotable 0 1 2
  echo "send-index: n1, killed in the middle of a compaction's shipping, recovered and imports again"
fi

# Waits until node $1's replay pause state is $2 (10 s at most).
wait_pause_state() {
  for _ in $(seq 1 200); do
    [ "$(sql "$1" -c "SELECT pg_get_wal_replay_pause_state()")" = "$2" ] && return 0
    sleep 0.05
  done
  echo "n$1: replay pause state is $(sql "$1" -c "SELECT pg_get_wal_replay_pause_state()"), not $2" >&2
  return 1
}

if [ "$replay" = deferred ]; then
  # A passive backup holds replay; 40 MB of WAL make it replay a batch (to less than one
  # segment behind), after which it holds again.
  wait_pause_state 1 paused
  before=$(sql 1 -c "SELECT pg_last_wal_replay_lsn()")
  sql 0 -c "SET slipstream.commit_mode = $mode" \
    -c "INSERT INTO filler SELECT g, repeat('p', 200) FROM generate_series(1, 150000) g" >/dev/null
  end=$(sql 0 -c "SELECT pg_current_wal_flush_lsn()")
  batched=0
  for _ in $(seq 1 600); do
    if [ "$(sql 1 -c "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '$before') > 16 * 1024 * 1024")" = t ]; then
      batched=1
      break
    fi
    sleep 0.05
  done
  [ "$batched" = 1 ] || { echo "n1 replayed no batch: at $(sql 1 -c "SELECT pg_last_wal_replay_lsn()"), from $before to $end" >&2; exit 1; }
  wait_pause_state 1 paused
  held=$(sql 1 -c "SELECT pg_wal_lsn_diff('$end', pg_last_wal_replay_lsn())")
  echo "deferred replay: n1 replayed a batch from $before and holds again $held bytes behind $end"
fi

acked="$scratch/acked"
: >"$acked"
backend_placed=0
for round in $(seq 1 "$rounds"); do
  pids=()
  for c in $(seq 1 "$clients"); do
    workload "$c" $((round * 1000000)) | "$pg" psql "${nodes[$primary]}" -qAt >"$scratch/client$c.out" 2>&1 &
    pids+=($!)
  done
  preparer $((round * 1000000)) | "$pg" psql "${nodes[$primary]}" -qAt >"$scratch/preparer.out" 2>&1 &
  pids+=($!)
  if [ "$shipping" = send_index ]; then
    compactor "$primary" &
    pids+=($!)
  fi
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.5 + (r % 2000) / 1000 }')"
  # In remote_memory, committing backends place their own WAL (backend_placement; over tcp
  # through their placer links): the kills must land among such placements, not only among
  # the shipper's.
  if [ "$mode" = remote_memory ]; then
    placed=$(sql "$primary" -c "SELECT coalesce(sum(backend_placements), 0) FROM slipstream.replication" 2>/dev/null || echo 0)
    backend_placed=$((backend_placed + ${placed:-0}))
  fi
  # What the primary reported of its backups just before the kill, for a failure's report.
  sql "$primary" -c "SELECT * FROM slipstream.replication" >"$scratch/replication.before-kill" 2>&1 || true
  "$pg" kill "${nodes[$primary]}" 2>/dev/null
  for p in "${pids[@]}"; do wait "$p" || true; done
  for c in $(seq 1 "$clients"); do sed -n 's/^ACK //p' "$scratch/client$c.out" >>"$acked"; done
  sed -n 's/^ACK //p' "$scratch/preparer.out" >>"$acked"

  backups=()
  for n in 0 1 2; do [ "$n" != "$primary" ] && backups+=("$n"); done
  if [ "$takeover_by" = script ]; then
    # scripts/failover.sh: fence, promote the most advanced backup, seed the two others again.
    args=()
    for n in "${backups[@]}"; do
      args+=(--backup "n$n" --conn "host=${nodes[$n]}/sock port=$(port_of "$n") user=postgres dbname=postgres"
             --serve "127.0.0.1:$(serve_port_of "$n")" --datadir "${nodes[$n]}/data")
    done
    args+=(--old-primary "n$primary" --serve "127.0.0.1:$(serve_port_of "$primary")"
           --datadir "${nodes[$primary]}/data")
    [ "$shipping" = send_index ] && args+=(--lz4)
    if ! "$root/scripts/failover.sh" --secret-file "$scratch/secret" --transport "$transport" \
        --buffers 8 --buffer-size 1MB "${args[@]}" >"$scratch/failover.out" 2>&1; then
      cat "$scratch/failover.out" >&2
      echo "round $round: scripts/failover.sh failed" >&2
      exit 1
    fi
    new=$(sed -n 's/^promoted n\([0-9]\) at .*/\1/p' "$scratch/failover.out")
    [ -n "$new" ] || { cat "$scratch/failover.out" >&2; exit 1; }
    sed 's/^/  failover.sh: /' "$scratch/failover.out"
  else
    # Take over on one of the two backups, at random.
    new=${backups[$((RANDOM % 2))]}
    sql "$new" -c "SELECT slipstream.promote(60)" >/dev/null
  fi
  sql "$new" -c "SELECT client || ' ' || seq FROM ledger" | sort >"$scratch/ledger"
  sql "$new" -c "SELECT client || ' ' || seq FROM audit" | sort >"$scratch/audit"
  sort "$acked" >"$scratch/acked.sorted"
  missing=$(comm -23 "$scratch/acked.sorted" "$scratch/ledger" | wc -l)
  # A prepared transaction the client was told of is committed or still prepared.
  sql "$new" -c "SELECT gid FROM pg_prepared_xacts" | sort >"$scratch/prepared"
  # One pass over both lists (a grep per prepared transaction took 10 of a test's 70 s).
  sed -n 's/^PREPARED //p' "$scratch/preparer.out" | awk -v ledger="$scratch/ledger" -v prepared="$scratch/prepared" '
    BEGIN {
      while ((getline line < ledger) > 0) if (line ~ /^99 /) found[substr(line, 4)] = 1
      while ((getline gid < prepared) > 0) if (gid ~ /^p/) found[substr(gid, 2)] = 1
    }
    !($0 in found) { print }' >"$scratch/prepared.lost"
  while read -r n; do
    echo "round $round: prepared transaction p$n is neither committed nor prepared on n$new" >&2
  done <"$scratch/prepared.lost"
  lost_prepared=$(wc -l <"$scratch/prepared.lost")
  half=$(comm -3 "$scratch/ledger" "$scratch/audit" | wc -l)
  bad=$(sql "$new" -c "SELECT count(*) FROM slipstream.verify('ledger') WHERE NOT ok")
  if [ "$shipping" = send_index ]; then
    # What the promotion replayed: from the imported horizon, not from the seed.
    grep -h "taking over the imported levels\|replayed .* WAL records" "${nodes[$new]}/server.log" | tail -2 | sed 's/^/  /'
  fi
  echo "round $round: n$primary killed, n$new took over: $(wc -l <"$scratch/acked.sorted") acknowledged, $missing missing, $half half-visible, verify failures $bad, $(wc -l <"$scratch/prepared") still prepared, $lost_prepared prepared lost"
  if [ "$missing" != 0 ] || [ "$half" != 0 ] || [ "$bad" != 0 ] || [ "$lost_prepared" != 0 ]; then
    # sed, not head: head leaves comm writing into a closed pipe, which pipefail turns into exit 141.
    comm -23 "$scratch/acked.sorted" "$scratch/ledger" | sed -n 1,5p >&2
    comm -3 "$scratch/ledger" "$scratch/audit" | sed -n 1,5p >&2
    report_failure "$primary" "$new"
    echo "takeover test FAILED in round $round" >&2
    exit 1
  fi
  # The transaction manager's part: what is still prepared is committed on the new primary.
  for gid in $(cat "$scratch/prepared"); do
    sql "$new" -c "COMMIT PREPARED '$gid'" >/dev/null
    echo "99 ${gid#p}" >>"$acked"
  done
  sql "$new" -c "INSERT INTO ledger VALUES (0, $round, 'written on the new primary')" \
    -c "INSERT INTO audit VALUES (0, $round)" >/dev/null
  echo "0 $round" >>"$acked"

  # The backup that did not take over still replays the old timeline: the new primary's
  # hello (timeline 2 and up) is refused until it is seeded again.
  if [ "$round" = 1 ] && [ "$takeover_by" = promote ]; then
    for n in 0 1 2; do [ "$n" != "$primary" ] && [ "$n" != "$new" ] && other=$n; done
    sql "$new" -c "SELECT slipstream.add_backup('n$other', '127.0.0.1:$(serve_port_of "$other")', '$transport', '$secret')" >/dev/null
    refused=0
    for _ in $(seq 1 200); do
      if sql "$new" -c "SELECT error FROM slipstream.replication WHERE name = 'n$other'" | grep -q timeline; then
        refused=1
        break
      fi
      sleep 0.05
    done
    [ "$refused" = 1 ] || { echo "a backup of the old timeline was not refused: $(sql "$new" -c 'SELECT * FROM slipstream.replication')" >&2; exit 1; }
    sql "$new" -c "SELECT slipstream.drop_backup('n$other')" >/dev/null
    echo "round $round: n$other, of the old timeline, was refused by n$new until seeded again"
  fi

  # The two others become the new primary's backups.
  primary=$new
  others=()
  for n in 0 1 2; do
    [ "$n" = "$primary" ] && continue
    if [ "$takeover_by" = promote ]; then
      seed_backup "$primary" "$n"
      add_backup "$primary" "$n"
    fi
    others+=("$n")
  done
  wait_promotable "$primary" "${others[@]}"
done
[ "$(wc -l <"$acked")" -ge 10 ] || { echo "too few commits were acknowledged" >&2; exit 1; }
if [ "$mode" = remote_memory ]; then
  [ "$backend_placed" -gt 0 ] || { echo "no commit was placed by its own backend" >&2; exit 1; }
  echo "placements by committing backends before the kills: $backend_placed"
fi
echo "takeover test ($transport, $mode, $replay replay, $shipping, $rounds rounds, takeover by $takeover_by) passed"
