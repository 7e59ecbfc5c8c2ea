#!/usr/bin/env bash
# pg_patroni_failover_test.sh: Patroni's automatic failover of a slipstream cluster, tested by
# killing, in either mode of scripts/patroni_cluster.sh (docs/failover.md):
#   baseline  one etcd and three Patroni nodes, a leader and two streaming replicas seeded by
#             scripts/seed_backup.sh, synchronous_mode_strict; the new leader must be the standby
#             Patroni had published as synchronous;
#   tailwind  the two replicas are slipstream Tailwind backups (WAL by one-sided writes, the
#             leader refuses their walreceivers), slipstream.min_sync_backups = 2 and the clients
#             commit in remote_memory; Patroni's pre_promote hook (scripts/patroni_callback.sh)
#             must have fenced the node it promoted, and the leader's hook re-seeds the node
#             left on the old timeline and the killed one.
# Each round, three clients commit transactions that each insert one row into a slipstream table
# and one into a heap table, printing ACK once COMMIT returned; after 1-3 s the leader's
# postmaster is SIGKILLed. Patroni (not this test) fails over. On the new leader:
#   - every commit that returned to its client is there;
#   - nothing is half there (the two tables hold the same transactions);
#   - slipstream.verify passes and the node takes writes (tailwind: a local commit, then a
#     remote_memory one, which waits until both backups are re-seeded and stream).
# Then Patroni brings the killed node back (re-seeded by the create_replica_methods command
# when needed) and the test waits until the cluster is settled again (baseline: the leader
# streams to both replicas, one of them synchronous; tailwind: both stream as Tailwind backups,
# and no replica streams by walreceiver), and checks that every replica holds the leader's rows.
#   tests/pg_patroni_failover_test.sh [scratch dir] [rounds] [baseline | tailwind]
# (default /tmp/slipstream-patroni, or $SLIPSTREAM_PATRONI_DIR; rounds: $ROUNDS or 3; mode:
# $SLIPSTREAM_PATRONI_MODE or baseline; REPLICA_READS=0: the replicas are not read, only waited
# for until they replayed the leader's WAL)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_PATRONI_DIR:-/tmp/slipstream-patroni}}
rounds=${2:-${ROUNDS:-3}}
mode=${3:-${SLIPSTREAM_PATRONI_MODE:-baseline}}
case "$mode" in
  baseline|tailwind) ;;
  *) echo "pg_patroni_failover_test.sh: mode is baseline or tailwind, not $mode" >&2; exit 2 ;;
esac
export SLIPSTREAM_PATRONI_MODE=$mode
# REPLICA_READS=0 leaves the replicas unread, for diagnosis only (docs/failover.md, "Found by
# this test": hot-standby reads once made a later promotion reuse row ids).
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
    grep -v "rejects replication connection\|could not connect to the primary server\|waiting for WAL to become available\|invalid record length" \
      "$scratch/$n/log/postgresql.log" | tail -15 >&2 || true
    if [ -f "$scratch/$n/callback.log" ]; then
      echo "--- $n: callback.log (the tailwind hooks)" >&2
      tail -15 "$scratch/$n/callback.log" >&2 || true
    fi
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

# How many promotions node $1's pre_promote hook let through (it fenced and replayed first).
fenced_of() { grep -c "pre_promote.*replay reached" "$scratch/${nodes[$1]}/callback.log" 2>/dev/null || true; }

# How many walreceiver connections the leaders refused so far (tailwind: every replica's
# walreceiver tries, and is refused, whenever replay reaches the end of its pg_wal).
refusals() { cat "$scratch"/node*/log/postgresql.log 2>/dev/null | grep -c 'rejects replication connection for host "127.0.0.1", user "replicator"' || true; }

# Tailwind: checks what Patroni and PostgreSQL show of the backups on leader $1: no replica
# streams by walreceiver (pg_stat_replication is empty), and Patroni knows each replica's
# timeline and lag (patronictl list), from its replay position.
# Patroni publishes a member's position once per loop: it is given 20 s.
check_tailwind_view() {
  local l=$1 n json end=$((SECONDS + 20))
  n=$(sql "$l" -c "SELECT count(*) FROM pg_stat_replication")
  [ "$n" = 0 ] || { echo "${nodes[$l]} has $n streaming replicas in the tailwind mode" >&2; return 1; }
  while :; do
    json=$(curl -sf -m 2 "http://127.0.0.1:$((55895 + l))/cluster" || true)
    n=$(jq '[.members[] | select(.role == "replica" and (.lag | type) == "number" and .timeline != null)] | length' <<<"$json" 2>/dev/null || true)
    [ "$n" = 2 ] && return 0
    if [ "$SECONDS" -ge "$end" ]; then
      echo "Patroni does not show the lag and timeline of both replicas: $json" >&2
      return 1
    fi
    sleep 0.5
  done
}

# One client: each transaction inserts its (client, seq) into both tables; ACK once COMMIT returned.
workload() {
  local c=$1 first=$2
  [ "$mode" = tailwind ] && echo "SET slipstream.commit_mode = remote_memory;"
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
  -c "CREATE TABLE audit (client int, seq int, PRIMARY KEY (client, seq))" \
  -c "CREATE TABLE probe (round int, at timestamptz)" >/dev/null
"$cluster" settled || { echo "the cluster is not settled after start" >&2; explain; exit 1; }
if [ "$mode" = tailwind ]; then
  check_tailwind_view "$leader" || { explain; exit 1; }
  echo "cluster up in $(elapsed "$started" "$(now)") s (tailwind): ${nodes[$leader]} leads and ships to its two Tailwind backups"
  patronictl -c "$scratch/node0.yml" list 2>&1 | sed 's/^/  /'
else
  echo "cluster up in $(elapsed "$started" "$(now)") s: ${nodes[$leader]} leads, $(sync_standby "$leader") is its synchronous standby"
fi
refused_before=$(refusals)

acked="$work/acked"
: >"$acked"
for round in $(seq 1 "$rounds"); do
  # The commit load on the leader, then the SIGKILL of its postmaster.
  seeds_before=()
  fenced_before=()
  for i in 0 1 2; do seeds_before+=("$(seeds_of "$i")"); fenced_before+=("$(fenced_of "$i")"); done
  sync_name=""
  [ "$mode" = baseline ] && sync_name=$(sync_standby "$leader")
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
  if [ "$mode" = baseline ] && [ "${nodes[$leader]}" != "$sync_name" ]; then
    echo "round $round: ${nodes[$leader]} took over, but $sync_name was the synchronous standby" >&2
    explain
    exit 1
  fi
  if [ "$mode" = tailwind ] && [ "$(fenced_of "$leader")" -le "${fenced_before[$leader]}" ]; then
    echo "round $round: ${nodes[$leader]} was promoted without its pre_promote hook fencing it" >&2
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
    comm -23 "$work/acked.sorted" "$work/ledger" | sed -n 1,5p >&2
    comm -3 "$work/ledger" "$work/audit" | sed -n 1,5p >&2
    echo "patroni failover test FAILED" >&2
    exit 1
  fi

  # It takes writes (in strict synchronous mode a commit waits until a standby follows it; in
  # the tailwind mode a local commit returns at once, and a remote_memory one waits until both
  # backups stream, that is until the two other nodes are re-seeded).
  if [ "$mode" = tailwind ]; then
    if ! timeout "$rejoin_timeout" "$pgbin/psql" -X -qAt -v ON_ERROR_STOP=1 \
        -h "$scratch/${nodes[$leader]}/sock" -p $((55890 + leader)) -U postgres -d postgres \
        -c "SET slipstream.commit_mode = local" -c "INSERT INTO probe VALUES ($round, now())" >/dev/null; then
      echo "round $round: the new leader ${nodes[$leader]} took no local write within $rejoin_timeout s" >&2
      explain
      exit 1
    fi
    t_local=$(now)
  fi
  if ! timeout "$rejoin_timeout" "$pgbin/psql" -X -qAt -v ON_ERROR_STOP=1 \
      -h "$scratch/${nodes[$leader]}/sock" -p $((55890 + leader)) -U postgres -d postgres \
      -c "$([ "$mode" = tailwind ] && echo "SET slipstream.commit_mode = remote_memory" || echo "SELECT 1")" \
      -c "BEGIN" -c "INSERT INTO ledger VALUES (0, $round, 'written on the new leader')" \
      -c "INSERT INTO audit VALUES (0, $round)" -c "COMMIT" >/dev/null; then
    echo "round $round: the new leader ${nodes[$leader]} took no write within $rejoin_timeout s" >&2
    explain
    exit 1
  fi
  echo "0 $round" >>"$acked"
  t_write=$(now)
  if [ "$mode" = tailwind ]; then
    # A remote_memory commit returns only once placed on both backups: they stream now (a
    # leader without configured backups would have acknowledged it unreplicated).
    n=$(sql "$leader" -c "SELECT count(*) FROM slipstream.replication WHERE state = 'streaming'")
    if [ "$n" != 2 ]; then
      echo "round $round: a remote_memory commit returned on ${nodes[$leader]} while $n backups streamed" >&2
      explain
      exit 1
    fi
  fi

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
  if [ "$mode" = tailwind ]; then
    check_tailwind_view "$leader" || { explain; exit 1; }
  fi
  back=""
  for i in 0 1 2; do
    [ "$i" = "$leader" ] && continue
    replica_matches "$leader" "$i" || { explain; exit 1; }
    how="followed"
    [ "$(seeds_of "$i")" -gt "${seeds_before[$i]}" ] && how="re-seeded"
    back+="${back:+, }${nodes[$i]} $how"
  done
  if [ "$mode" = tailwind ]; then
    echo "round $round: ${nodes[$killed]} killed after ${load} s of load, ${nodes[$leader]} fenced by pre_promote and leads after $(elapsed "$t_kill" "$t_leader") s: $(wc -l <"$work/acked.sorted") acknowledged, $missing missing, $half half-visible, verify failures $bad, writable after $(elapsed "$t_kill" "$t_local") s (local commit), durable writes after $(elapsed "$t_kill" "$t_write") s (remote_memory); both backups streaming again after $(elapsed "$t_kill" "$t_back") s ($back), $([ "$replica_reads" = 1 ] && echo "replicas match" || echo "replicas caught up (not read)")"
  else
    echo "round $round: ${nodes[$killed]} killed after ${load} s of load, ${nodes[$leader]} leads after $(elapsed "$t_kill" "$t_leader") s: $(wc -l <"$work/acked.sorted") acknowledged, $missing missing, $half half-visible, verify failures $bad, writable after $(elapsed "$t_kill" "$t_write") s; streaming again after $(elapsed "$t_kill" "$t_back") s ($back), $([ "$replica_reads" = 1 ] && echo "replicas match" || echo "replicas caught up (not read)")"
  fi
done
[ "$(wc -l <"$acked")" -ge 10 ] || { echo "too few commits were acknowledged" >&2; exit 1; }
if [ "$mode" = tailwind ]; then
  echo "walreceiver connections the leaders refused during the rounds: $(( $(refusals) - refused_before ))"
fi
echo "patroni failover test ($mode, $rounds rounds, replica reads $([ "$replica_reads" = 1 ] && echo on || echo off)) passed in $(elapsed "$started" "$(now)") s"
