#!/usr/bin/env bash
# pg_patroni_failover_test.sh: Patroni's automatic failover of a slipstream cluster, tested by
# killing. scripts/patroni_cluster.sh starts one etcd and three Patroni nodes (a leader and two
# streaming replicas seeded by scripts/seed_backup.sh, synchronous_mode_strict). Each round,
# three clients commit transactions that each insert one row into a slipstream table and one
# into a heap table, printing ACK once COMMIT returned; after 1-3 s the leader's postmaster is
# SIGKILLed. Patroni (not this test) fails over; the new leader must be the standby Patroni had
# published as synchronous. On it:
#   - every commit that returned to its client is there;
#   - nothing is half there (the two tables hold the same transactions);
#   - slipstream.verify passes and the node takes writes.
# Then Patroni brings the killed node back (re-seeded by the create_replica_methods command
# when its timeline diverged) and the test waits until the leader streams to both replicas
# again, one of them synchronous, and checks that every replica holds the leader's rows.
#   tests/pg_patroni_failover_test.sh [scratch dir] [rounds]
# (default /tmp/slipstream-patroni, or $SLIPSTREAM_PATRONI_DIR; rounds: $ROUNDS or 3;
# REPLICA_READS=0: the replicas are not read, only waited for until they replayed the leader's WAL;
# with replica reads the test fails today, on the row-id reuse described in docs/failover.md)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_PATRONI_DIR:-/tmp/slipstream-patroni}}
rounds=${2:-${ROUNDS:-3}}
# REPLICA_READS=0 leaves the replicas unread (see docs/failover.md, "Known problem"): a
# hot-standby query on a slipstream table makes a later promotion reuse row ids.
replica_reads=${REPLICA_READS:-1}
export SLIPSTREAM_PATRONI_DIR=$scratch
cluster="$root/scripts/patroni_cluster.sh"
pgbin=/usr/lib/postgresql/15/bin
clients=3
nodes=(node0 node1 node2)
failover_timeout=60
rejoin_timeout=240
client_pids=()

# Stops the clients this test started, then every process of the scratch directory.
cleanup() {
  local p
  for p in "${client_pids[@]+"${client_pids[@]}"}"; do kill "$p" 2>/dev/null || true; done
  "$cluster" stop || true
}
trap cleanup EXIT

# Runs psql on node $1 (0..2) through its socket, quiet and unaligned; the rest are psql args.
sql() {
  local i=$1
  shift
  "$pgbin/psql" -X -qAt -v ON_ERROR_STOP=1 -h "$scratch/${nodes[$i]}/sock" -p $((55890 + i)) \
    -U postgres -d postgres "$@"
}

# Prints the HTTP status of GET $2 on the Patroni REST API of node $1 (000 if it does not answer).
rest() { curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$((55895 + $1))$2" || true; }

# Prints seconds since the epoch, with fractions.
now() { date +%s.%N; }

# Prints $2 - $1 in seconds, one decimal.
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Prints the index of a node other than $1 that holds the leader key and runs a primary.
new_leader() {
  local i
  for i in 0 1 2; do
    [ "$i" = "$1" ] && continue
    if [ "$(rest "$i" /primary)" = 200 ] && [ "$(sql "$i" -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = f ]; then
      echo "$i"
      return 0
    fi
  done
  return 1
}

# True once node $1 leads a settled cluster: it streams to both other nodes, and the standby
# Patroni published as synchronous is its synchronous standby (scripts/patroni_cluster.sh).
settled_under() { [ "$("$cluster" leader 2>/dev/null)" = "${nodes[$1]}" ] && "$cluster" settled; }

# Prints the synchronous standby Patroni published in etcd.
sync_standby() {
  curl -sf -m 2 "http://127.0.0.1:$((55895 + $1))/cluster" |
    jq -r '[.members[] | select(.role == "sync_standby") | .name] | join(" ")'
}

# Prints what the tables hold on node $1: count and an order-independent checksum of each.
summary() {
  sql "$1" -c "SELECT (SELECT count(*) || ':' || coalesce(sum(hashtext(client || ' ' || seq)), 0) FROM ledger)
                 || ' ' || (SELECT count(*) || ':' || coalesce(sum(hashtext(client || ' ' || seq)), 0) FROM audit)"
}

# Waits until replica $2 has replayed everything leader $1 has flushed, then (with replica
# reads) compares what their tables hold.
replica_matches() {
  local l=$1 r=$2 target end=$((SECONDS + 60))
  target=$(sql "$l" -c "SELECT pg_current_wal_flush_lsn()")
  while [ "$(sql "$r" -c "SELECT pg_last_wal_replay_lsn() >= '$target'" 2>/dev/null)" != t ]; do
    if [ "$SECONDS" -ge "$end" ]; then
      echo "${nodes[$r]} did not replay up to $target within 60 s" >&2
      return 1
    fi
    sleep 0.2
  done
  [ "$replica_reads" = 1 ] || return 0
  local a b
  a=$(summary "$l")
  b=$(summary "$r")
  [ "$a" = "$b" ] || { echo "${nodes[$r]} differs from the leader ${nodes[$l]}: $b against $a" >&2; return 1; }
}

# Says what the cluster looks like, and the logs' tails, after a failure.
explain() {
  "$cluster" status >&2 || true
  for n in "${nodes[@]}"; do
    echo "--- $n: patroni.log" >&2
    grep -v -e "no action" -e "Lock owner" "$scratch/$n/patroni.log" | tail -15 >&2 || true
    echo "--- $n: postgresql.log" >&2
    tail -15 "$scratch/$n/log/postgresql.log" >&2 || true
  done
}

# SIGKILLs the postmaster of node $1 (the time in t_kill) and waits until its children have gone.
kill_postmaster() {
  local dir=$scratch/${nodes[$1]}/data pid children alive
  pid=$(head -1 "$dir/postmaster.pid")
  children=$(pgrep -P "$pid" || true)
  kill -9 "$pid"
  t_kill=$(now)
  for _ in $(seq 1 300); do
    alive=0
    for c in $children; do kill -0 "$c" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
}

# How many replicas node $1's Patroni has created with the slipstream_seed method so far.
seeds_of() { grep -c "replica has been created using slipstream_seed" "$scratch/${nodes[$1]}/patroni.log" || true; }

# One client: each transaction inserts its (client, seq) into both tables; ACK once COMMIT returned.
workload() {
  local c=$1 first=$2
  for n in $(seq "$first" $((first + 100000))); do
    echo "BEGIN;"
    echo "INSERT INTO ledger VALUES ($c, $n, repeat('x', $(((n * 37) % 1500))));"
    echo "INSERT INTO audit VALUES ($c, $n);"
    echo "COMMIT;"
    echo "\\echo ACK $c $n"
  done
}

started=$(now)
"$cluster" start >/dev/null
work="$scratch/test"
mkdir -p "$work"
leader_name=$("$cluster" leader)
leader=${leader_name#node}
sql "$leader" -c "CREATE TABLE ledger (client int, seq int, payload text, PRIMARY KEY (client, seq)) USING slipstream" \
  -c "CREATE TABLE audit (client int, seq int, PRIMARY KEY (client, seq))" >/dev/null
"$cluster" settled || { echo "the cluster is not settled after start" >&2; explain; exit 1; }
echo "cluster up in $(elapsed "$started" "$(now)") s: ${nodes[$leader]} leads, $(sync_standby "$leader") is its synchronous standby"

acked="$work/acked"
: >"$acked"
for round in $(seq 1 "$rounds"); do
  # The commit load on the leader, then the SIGKILL of its postmaster.
  seeds_before=()
  for i in 0 1 2; do seeds_before+=("$(seeds_of "$i")"); done
  sync_name=$(sync_standby "$leader")
  client_pids=()
  for c in $(seq 1 "$clients"); do
    workload "$c" $((round * 1000000)) |
      "$pgbin/psql" -X -qAt -v ON_ERROR_STOP=1 -h "$scratch/${nodes[$leader]}/sock" \
        -p $((55890 + leader)) -U postgres -d postgres >"$work/client$c.round$round" 2>&1 &
    client_pids+=($!)
  done
  load=$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 1 + (r % 2000) / 1000 }')
  sleep "$load"
  killed=$leader
  kill_postmaster "$killed"
  for p in "${client_pids[@]}"; do wait "$p" || true; done
  client_pids=()
  for c in $(seq 1 "$clients"); do sed -n 's/^ACK //p' "$work/client$c.round$round" >>"$acked"; done

  # Patroni elects a new leader by itself.
  end=$((SECONDS + failover_timeout))
  until leader=$(new_leader "$killed"); do
    if [ "$SECONDS" -ge "$end" ]; then
      echo "round $round: no new leader ${failover_timeout} s after ${nodes[$killed]}'s postmaster was killed" >&2
      if [ "$(rest "$killed" /primary)" = 200 ]; then
        echo "(Patroni restarted ${nodes[$killed]} as the leader: it found no synchronous standby to fail over to)" >&2
      fi
      explain
      exit 1
    fi
    sleep 0.2
  done
  t_leader=$(now)
  if [ "${nodes[$leader]}" != "$sync_name" ]; then
    echo "round $round: ${nodes[$leader]} took over, but $sync_name was the synchronous standby" >&2
    explain
    exit 1
  fi

  # Every acknowledged commit is on it, nothing is half there, the engine verifies.
  sql "$leader" -c "SELECT client || ' ' || seq FROM ledger" | sort >"$work/ledger"
  sql "$leader" -c "SELECT client || ' ' || seq FROM audit" | sort >"$work/audit"
  sort "$acked" >"$work/acked.sorted"
  missing=$(comm -23 "$work/acked.sorted" "$work/ledger" | wc -l)
  half=$(comm -3 "$work/ledger" "$work/audit" | wc -l)
  bad=$(sql "$leader" -c "SELECT count(*) FROM slipstream.verify('ledger') WHERE NOT ok")
  if [ "$missing" != 0 ] || [ "$half" != 0 ] || [ "$bad" != 0 ]; then
    echo "round $round: ${nodes[$killed]} killed, ${nodes[$leader]} took over: $(wc -l <"$work/acked.sorted") acknowledged, $missing missing, $half half-visible, verify failures $bad" >&2
    comm -23 "$work/acked.sorted" "$work/ledger" | head -5 >&2
    comm -3 "$work/ledger" "$work/audit" | head -5 >&2
    echo "patroni failover test FAILED" >&2
    exit 1
  fi

  # It takes writes (in strict synchronous mode a commit waits until a standby follows it).
  if ! timeout "$rejoin_timeout" "$pgbin/psql" -X -qAt -v ON_ERROR_STOP=1 \
      -h "$scratch/${nodes[$leader]}/sock" -p $((55890 + leader)) -U postgres -d postgres \
      -c "INSERT INTO ledger VALUES (0, $round, 'written on the new leader')" \
      -c "INSERT INTO audit VALUES (0, $round)" >/dev/null; then
    echo "round $round: the new leader ${nodes[$leader]} took no write within $rejoin_timeout s" >&2
    explain
    exit 1
  fi
  echo "0 $round" >>"$acked"
  t_write=$(now)

  # Patroni brings the killed node back; both replicas stream again, one synchronously.
  end=$((SECONDS + rejoin_timeout))
  until settled_under "$leader"; do
    if [ "$SECONDS" -ge "$end" ]; then
      echo "round $round: the replicas of ${nodes[$leader]} were not streaming again within $rejoin_timeout s" >&2
      explain
      exit 1
    fi
    sleep 0.5
  done
  t_back=$(now)
  back=""
  for i in 0 1 2; do
    [ "$i" = "$leader" ] && continue
    replica_matches "$leader" "$i" || { explain; exit 1; }
    how="followed"
    [ "$(seeds_of "$i")" -gt "${seeds_before[$i]}" ] && how="re-seeded"
    back+="${back:+, }${nodes[$i]} $how"
  done
  echo "round $round: ${nodes[$killed]} killed after ${load} s of load, ${nodes[$leader]} leads after $(elapsed "$t_kill" "$t_leader") s: $(wc -l <"$work/acked.sorted") acknowledged, $missing missing, $half half-visible, verify failures $bad, writable after $(elapsed "$t_kill" "$t_write") s; streaming again after $(elapsed "$t_kill" "$t_back") s ($back), $([ "$replica_reads" = 1 ] && echo "replicas match" || echo "replicas caught up (not read)")"
done
[ "$(wc -l <"$acked")" -ge 10 ] || { echo "too few commits were acknowledged" >&2; exit 1; }
echo "patroni failover test ($rounds rounds, replica reads $([ "$replica_reads" = 1 ] && echo on || echo off)) passed in $(elapsed "$started" "$(now)") s"
