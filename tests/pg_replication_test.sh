#!/usr/bin/env bash
# pg_replication_test.sh: a primary ships its WAL to a backup with Tailwind's one-sided writes
# (slipstream.commit_mode = remote_memory) under a concurrent write workload, and is killed
# with SIGKILL at a random point, ROUNDS times (restarted in between). At the end the WAL the
# backup holds is restored into segment files, and every transaction whose COMMIT returned to
# a client must be a COMMIT record in it (pg_waldump): nothing acknowledged is lost when the
# primary dies. Also checks the status view and that a stale primary is refused when it rejoins.
#   tests/pg_replication_test.sh [scratch dir] [base port] [rounds] [transport]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-replication}}
base=${2:-55620}
rounds=${3:-${ROUNDS:-5}}
transport=${4:-${TRANSPORT:-tcp}}
clients=3
secret="replication-test-$RANDOM$RANDOM"
pg="$root/scripts/pg_cluster.sh"
primary="$scratch/primary"
backup="$scratch/backup"
serve_port=$((base + 2))
restore_tool="$root/build/replication/slipstream_wal_restore"
pgbin=/usr/lib/postgresql/15/bin

rm -rf "$scratch"
mkdir -p "$scratch"
"$pg" init "$backup" "$((base + 1))" >/dev/null
"$pg" init "$primary" "$base" "cluster_name = 'p1'" "slipstream.backup_timeout = 2s" >/dev/null
"$pg" start "$backup"
"$pg" start "$primary"
trap '"$pg" stop "$primary" immediate >/dev/null 2>&1 || true; "$pg" stop "$backup" immediate >/dev/null 2>&1 || true' EXIT
p_sql() { "$pg" psql "$primary" -qAt "$@"; }
b_sql() { "$pg" psql "$backup" -qAt "$@"; }

# The backup is added before it serves: the shipper's slot then keeps WAL from mid-segment before
# the first connection, which must still start at a segment boundary (whole segment files, page
# headers included, or pg_waldump below cannot read the restored copy).
p_sql -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE ledger (client int, seq int, payload text, PRIMARY KEY (client, seq)) USING slipstream" \
  -c "SELECT slipstream.add_backup('b1', '127.0.0.1:$serve_port', '$transport', '$secret')" >/dev/null
slot_kept=""
for _ in $(seq 1 200); do
  slot_kept=$(p_sql -c "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'slipstream_backups'")
  [ -n "$slot_kept" ] && break
  sleep 0.05
done
if [ -z "$slot_kept" ]; then
  echo "the shipper never created its slot for the unreachable backup" >&2
  exit 1
fi
p_sql -c "SELECT pg_switch_wal()" -c "CREATE TABLE filler AS SELECT g FROM generate_series(1, 1000) g" >/dev/null
b_sql -c "CREATE EXTENSION slipstream" \
  -c "SELECT slipstream.serve_backup('127.0.0.1:$serve_port', '$secret', 8, '1MB')" >/dev/null

# Waits until the backup streams (the view of the primary says so).
wait_streaming() {
  for _ in $(seq 1 200); do
    [ "$(p_sql -c "SELECT state FROM slipstream.replication WHERE name = 'b1'")" = streaming ] && return 0
    sleep 0.05
  done
  echo "backup never reached streaming: $(p_sql -c 'SELECT * FROM slipstream.replication')" >&2
  return 1
}
wait_streaming
echo "status: $(p_sql -c "SELECT name, transport, state FROM slipstream.replication")"

# One client: each transaction inserts a row and reports its xid; "ACK xid" once COMMIT returned.
workload() {
  local c=$1 first=$2
  echo "SET slipstream.commit_mode = remote_memory;"
  for n in $(seq "$first" $((first + 100000))); do
    echo "BEGIN;"
    echo "INSERT INTO ledger VALUES ($c, $n, repeat('x', $((n % 300))));"
    echo "SELECT 'XID ' || txid_current();"
    echo "COMMIT;"
    echo "\\echo ACK"
  done
}

acked="$scratch/acked"
: >"$acked"
for round in $(seq 1 "$rounds"); do
  pids=()
  for c in $(seq 1 "$clients"); do
    workload "$c" $((round * 1000000)) | "$pg" psql "$primary" -qAt >"$scratch/client$c.out" 2>&1 &
    pids+=($!)
  done
  sleep "$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 1 + (r % 2000) / 1000 }')"
  "$pg" kill "$primary" 2>/dev/null
  for p in "${pids[@]}"; do wait "$p" || true; done
  # An xid counts as acknowledged when its ACK line followed (COMMIT returned).
  for c in $(seq 1 "$clients"); do
    awk '/^XID / { x = $2 } /^ACK$/ { if (x != "") print x; x = "" }' "$scratch/client$c.out" >>"$acked"
  done
  echo "round $round: $(wc -l <"$acked") commits acknowledged so far"
  "$pg" start "$primary"
  wait_streaming
done

# The backup persists the open buffers of a primary that went away; take the WAL it holds.
"$pg" stop "$primary" immediate
for _ in $(seq 1 100); do
  [ -z "$(b_sql -c "SELECT 1 FROM slipstream.backup_buffers LIMIT 1")" ] && break
  sleep 0.1
done
wal="$scratch/restored_wal"
mkdir -p "$wal"
range=$("$restore_tool" "$backup/data/slipstream_backup" p1 "$wal")
start=${range%% *}
echo "restored WAL ${range/ / to }"
# pg_waldump ends with an error at the end of the valid WAL: that is where the stream stops.
{ "$pgbin/pg_waldump" -p "$wal" -s "$start" 2>/dev/null || true; } |
  awk '/rmgr: Transaction/ && /desc: COMMIT/ { sub(",", "", $8); print $8 }' | sort -u >"$scratch/committed"
sort -u "$acked" >"$scratch/acked.sorted"
missing=$(comm -23 "$scratch/acked.sorted" "$scratch/committed" | wc -l)
total=$(wc -l <"$scratch/acked.sorted")
echo "acknowledged commits: $total, missing from the backup's WAL: $missing"
if [ "$total" -lt 10 ] || [ "$missing" != 0 ]; then
  comm -23 "$scratch/acked.sorted" "$scratch/committed" | sed -n 1,10p
  echo "replication test FAILED" >&2
  exit 1
fi

# A stale primary (an older version than the backup has seen) is refused.
"$pg" start "$primary"
wait_streaming
sed -i 's/^backup b1 \([^ ]*\) \([^ ]*\) [0-9]* /backup b1 \1 \2 1 /' "$primary/data/slipstream_replication.conf"
"$pg" stop "$primary" fast
"$pg" start "$primary"
for _ in $(seq 1 100); do
  err=$(p_sql -c "SELECT error FROM slipstream.replication WHERE name = 'b1'")
  case "$err" in *version*) break ;; esac
  sleep 0.05
done
case "$err" in
  *version*) echo "stale rejoin refused: $err" ;;
  *) echo "a stale primary was not refused: '$err'" >&2; exit 1 ;;
esac
echo "replication test ($transport, $rounds rounds) passed"
