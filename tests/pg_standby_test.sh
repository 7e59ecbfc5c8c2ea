#!/usr/bin/env bash
# pg_standby_test.sh: a standby seeded by scripts/seed_backup.sh carries slipstream tables
# through PostgreSQL's own streaming replication (the baseline mode: the standby's startup
# process applies our WAL records to its engine). Checks, against the primary, after each of:
# the seed; inserts, updates, deletes, TRUNCATE, CREATE and DROP TABLE, large values; a SIGKILL
# of the standby under a write load and its restart; a promotion (then writes and
# slipstream.verify on the new primary). Also: a standby copied without the seed refuses to
# read slipstream tables with a hint, and keeps replaying heap tables.
#   tests/pg_standby_test.sh [scratch dir] [base port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-standby}}
base=${2:-55660}
pg="$root/scripts/pg_cluster.sh"
primary="$scratch/primary"
standby="$scratch/standby"
raw="$scratch/raw"
pgbin=/usr/lib/postgresql/15/bin

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }

rm -rf "$scratch"
mkdir -p "$scratch"
[ "$(id -u)" = 0 ] && chown postgres: "$scratch"
"$pg" init "$primary" "$base" "slipstream.sync_interval = 200ms" >/dev/null
"$pg" start "$primary"
trap 'for c in "$primary" "$standby" "$raw"; do "$pg" stop "$c" immediate >/dev/null 2>&1 || true; done' EXIT
p_sql() { "$pg" psql "$primary" -qAt "$@"; }
s_sql() { "$pg" psql "$standby" -qAt "$@"; }

p_sql -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE t (id int PRIMARY KEY, v text) USING slipstream" \
  -c "CREATE TABLE big (id int PRIMARY KEY, v text) USING slipstream" \
  -c "CREATE TABLE gone (id int) USING slipstream" \
  -c "CREATE TABLE h (id int PRIMARY KEY, v text)" \
  -c "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 5000) g" \
  -c "INSERT INTO big SELECT g, repeat(md5(g::text), 100) FROM generate_series(1, 200) g" \
  -c "INSERT INTO gone SELECT generate_series(1, 100)" \
  -c "INSERT INTO h SELECT g, md5(g::text) FROM generate_series(1, 1000) g" >/dev/null

# Seeds a standby in directory $1 (port $2) from the primary; extra arguments go to the script.
seed() {
  local dir=$1 port=$2
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir/sock"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
  as_postgres "$root/scripts/seed_backup.sh" \
    --connstring "host=$primary/sock port=$base user=postgres dbname=postgres" \
    --datadir "$dir/data" --set "port = $port" \
    --set "unix_socket_directories = '$dir/sock'" "$@"
}

# What a table holds, as one line (count and an order-independent checksum).
summary() { echo "SELECT count(*), coalesce(sum(hashtext(x::text)), 0) FROM $1 x"; }

# Waits until the standby has replayed everything the primary has flushed.
wait_caught_up() {
  local target
  target=$(p_sql -c "SELECT pg_current_wal_flush_lsn()")
  for _ in $(seq 1 600); do
    [ "$(s_sql -c "SELECT pg_last_wal_replay_lsn() >= '$target'" 2>/dev/null)" = t ] && return 0
    sleep 0.1
  done
  echo "the standby did not catch up to $target" >&2
  tail -20 "$standby/server.log" >&2
  return 1
}

# Compares every table on the primary and the standby.
compare() {
  local what=$1
  wait_caught_up
  for table in "${@:2}"; do
    local p s
    p=$(p_sql -c "$(summary "$table")")
    s=$(s_sql -c "$(summary "$table")")
    if [ "$p" != "$s" ]; then
      echo "$what: $table differs: primary $p, standby $s" >&2
      exit 1
    fi
  done
  # Through t's index alone: the visibility map the standby replayed agrees with its rows.
  local by_index
  by_index=$(s_sql -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
    -c "SELECT count(*) FROM t WHERE id IS NOT NULL")
  if [ "$by_index" != "$(p_sql -c "SELECT count(*) FROM t")" ]; then
    echo "$what: t has $by_index rows through the standby's index" >&2
    exit 1
  fi
  echo "$what: standby matches the primary ($(s_sql -c "SELECT count(*) FROM t") rows in t)"
}

# 1. A seeded streaming standby, seeded while tables are created, filled, truncated and
# dropped on the primary (a keyspace dropped during the dump is left out, not an error).
( for i in $(seq 1 60); do
    echo "CREATE TABLE churn$i (id int) USING slipstream;"
    echo "INSERT INTO churn$i SELECT generate_series(1, 200);"
    echo "TRUNCATE churn$i;"
    echo "INSERT INTO churn$i VALUES ($i);"
    [ $((i % 2)) = 0 ] && echo "DROP TABLE churn$i;"
  done | "$pg" psql "$primary" -qAt >/dev/null ) &
churn=$!
# slipstream.pinned_wait = 3s: a replayed write finds its memtables pinned after 3 s of a
# reader, not 30 (section 2c), so the cursors there need to stay open for seconds, not a minute.
seed "$standby" $((base + 1)) --streaming --name s1 --set "slipstream.pinned_wait = 3s" >/dev/null
wait "$churn"
"$pg" start "$standby"
compare "after the seed" t big h churn1 churn59
# What only a primary does is refused on the standby, with a reason.
for call in "slipstream.add_backup('x', '127.0.0.1:1', 'tcp', 's')" "count(*) FROM slipstream.seed_snapshot()"; do
  err=$(s_sql -c "SELECT $call" 2>&1 || true)
  case "$err" in
    *"only"*"primary"*) ;;
    *) echo "the standby did not refuse $call: $err" >&2; exit 1 ;;
  esac
done

# 2. Every kind of change.
p_sql -c "UPDATE t SET v = v || 'u' WHERE id % 3 = 0" \
  -c "DELETE FROM t WHERE id % 7 = 0" \
  -c "UPDATE big SET v = repeat('z', 3000) WHERE id < 50" \
  -c "TRUNCATE gone" -c "INSERT INTO gone SELECT generate_series(1, 10)" \
  -c "CREATE TABLE fresh (id int PRIMARY KEY, v text) USING slipstream" \
  -c "INSERT INTO fresh SELECT g, g::text FROM generate_series(1, 300) g" \
  -c "VACUUM t" >/dev/null
compare "after updates, deletes, truncate, create, vacuum" t big h fresh
[ "$(s_sql -c "SELECT count(*) FROM gone")" = 10 ] || { echo "gone differs" >&2; exit 1; }
p_sql -c "DROP TABLE gone" >/dev/null
compare "after a drop" t fresh

# 2b. A hot-standby query keeps its snapshot while the primary deletes and VACUUMs: it either
# still sees every row it saw, or is cancelled by a recovery conflict (never a silent loss).
echo "max_standby_streaming_delay = 0" >>"$standby/data/postgresql.conf"
s_sql -c "SELECT pg_reload_conf()" >/dev/null
before=$(s_sql -c "SELECT count(*) FROM t")
conflict_out="$scratch/conflict.out"
{ echo "BEGIN ISOLATION LEVEL REPEATABLE READ;"
  echo "SELECT 'first ' || count(*) FROM t;"
  echo "SELECT pg_sleep(4);"
  echo "SELECT 'second ' || count(*) FROM t;"
  echo "COMMIT;"; } | "$pg" psql "$standby" -qAt -v ON_ERROR_STOP=0 >"$conflict_out" 2>&1 &
reader=$!
sleep 1
p_sql -c "DELETE FROM t WHERE id % 11 = 0" -c "VACUUM t" >/dev/null
wait "$reader" || true
first=$(sed -n 's/^first //p' "$conflict_out")
second=$(sed -n 's/^second //p' "$conflict_out")
if [ "$first" != "$before" ]; then
  echo "the reading transaction did not start before the vacuum: $(cat "$conflict_out")" >&2
  exit 1
elif [ -n "$second" ] && [ "$second" != "$first" ]; then
  echo "a standby snapshot lost rows to VACUUM: $first then $second" >&2
  exit 1
elif [ -z "$second" ] && ! grep -q "conflict with recovery" "$conflict_out"; then
  echo "the standby query failed otherwise: $(cat "$conflict_out")" >&2
  exit 1
fi
echo "a standby snapshot under VACUUM: ${second:+kept $second rows}${second:-cancelled by a recovery conflict}"
compare "after the vacuum" t

# 2c. Hot-standby cursors opened at different times pin every memtable but the active one, so
# replaying large inserts must wait for them (as replay waits for conflicting queries): it
# waits, says so, and goes on once they end; it never gives the standby's engine up.
p_sql -c "CREATE TABLE w (id int, v text) USING slipstream" >/dev/null
wait_caught_up
for n in 1 2 3 4; do
  s_sql -c "BEGIN" -c "DECLARE c CURSOR FOR SELECT * FROM t" -c "FETCH 1 FROM c" \
    -c "SELECT pg_sleep(10)" -c "COMMIT" >/dev/null 2>&1 &
  sleep 1
  p_sql -c "INSERT INTO w SELECT g + $n * 100000, repeat('x', 300) FROM generate_series(1, 20000) g" >/dev/null
done
wait
compare "after replay waited for pinned memtables" w t
if ! grep -q "replay waits for hot-standby queries" "$standby/server.log"; then
  echo "(replay did not have to wait for the cursors this time)"
fi

# 3. The standby killed under a write load after a restartpoint that passed its engine's
# horizon (held back by a long sync interval), restarted: the records between the horizon and
# the restartpoint are applied from its pg_wal before redo, the rest by redo.
echo "slipstream.sync_interval = 1h" >>"$standby/data/postgresql.conf"
s_sql -c "SELECT pg_reload_conf()" >/dev/null
( for i in $(seq 1 3000); do
    echo "INSERT INTO t VALUES (100000 + $i, 'load $i') ON CONFLICT (id) DO UPDATE SET v = 'again';"
    echo "UPDATE t SET v = 'load' WHERE id = $((i % 4000 + 1));"
  done | "$pg" psql "$primary" -qAt >/dev/null ) &
load=$!
sleep 1
p_sql -c "CHECKPOINT" >/dev/null
wait_caught_up
s_sql -c "CHECKPOINT" >/dev/null
"$pg" kill "$standby"
sed -i '/^slipstream.sync_interval = 1h$/d' "$standby/data/postgresql.conf"
"$pg" start "$standby"
wait "$load"
grep -q "before redo" "$standby/server.log" ||
  { echo "the restart did not apply records from below the restartpoint" >&2; exit 1; }
compare "after a SIGKILL of the standby" t big fresh h

# 3b. Reads on the standby before rows arrive by replay (a Patroni failover test found this):
# the standby must not cache a row-id high-water mark that replay then passes, or a parallel
# scan misses the new rows and, after a promotion, inserts reuse their ids.
parallel="SET max_parallel_workers_per_gather = 2; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0"
p_sql -c "CREATE TABLE r (id int PRIMARY KEY, v text) USING slipstream" \
  -c "INSERT INTO r SELECT g, 'first' FROM generate_series(1, 100) g" >/dev/null
wait_caught_up
s_sql -c "$parallel" -c "SELECT count(*) FROM r" -c "EXPLAIN SELECT * FROM r" >/dev/null
p_sql -c "INSERT INTO r SELECT g, 'second' FROM generate_series(101, 300) g" >/dev/null
wait_caught_up
r_rows=$(s_sql -c "$parallel" -c "SELECT count(*) FROM r" | tail -1)
[ "$r_rows" = 300 ] || { echo "a scan on the standby saw $r_rows of 300 rows of r" >&2; exit 1; }

# 3c. The shared chain cache outlives a promotion, and the row ids of removed versions at the
# top of a table are handed out again after it: a fetch may start where the standby's cache
# says only if the very version it saw is still there (its xmin is checked), or it returns
# another chain's row (a review found this). Here the standby caches row 2 of hc's chain.
hc_fetch="SET enable_seqscan = off; SET enable_bitmapscan = off; SELECT v FROM hc WHERE k = 1"
p_sql -c "CREATE TABLE hc (k int PRIMARY KEY, v int) USING slipstream" \
  -c "INSERT INTO hc VALUES (1, 0)" -c "UPDATE hc SET v = 1 WHERE k = 1" \
  -c "UPDATE hc SET v = 2 WHERE k = 1" >/dev/null
wait_caught_up
hc_v=$(s_sql -c "$hc_fetch" | tail -1)
hc_reads=$(s_sql -c "BEGIN" -c "$hc_fetch" \
  -c "SELECT pg_stat_get_xact_blocks_hit('hc'::regclass)" -c "COMMIT" | sed -n 2p)
[ "$hc_v" = 2 ] && [ "$hc_reads" = 1 ] ||
  { echo "standby: hc's fetch gave $hc_v reading $hc_reads versions (expected 2, 1)" >&2; exit 1; }
# The primary deletes the row and prunes the chain to a redirect to its root, removing rows 1
# and 2; with INDEX_CLEANUP off the redirect and its index entry stay. A snapshot elsewhere
# (an autovacuum's ANALYZE of t, in CI) can hold VACUUM's horizon below the DELETE, so VACUUM is
# repeated until the standby, which reads the high-water mark from its engine, sees only row 0.
p_sql -c "DELETE FROM hc WHERE k = 1" >/dev/null
for try in $(seq 1 100); do
  p_sql -c "VACUUM (INDEX_CLEANUP off) hc" >/dev/null
  wait_caught_up
  [ "$(s_sql -c "SELECT rowid_high FROM slipstream.table_stats('hc')")" = 1 ] && break
  [ "$try" = 100 ] && { echo "VACUUM did not remove hc's rows 1 and 2" >&2; exit 1; }
  sleep 0.3
done

# 4. Promotion: the standby becomes a primary with the same rows, writable and verified.
s_sql -c "SELECT pg_promote(true, 60)" >/dev/null
# hc's new row takes row id 1 and its HOT update row id 2; the old entry must not reach it.
s_sql -c "INSERT INTO hc VALUES (5, 50)" -c "UPDATE hc SET v = 51 WHERE k = 5" >/dev/null
hc_old=$(s_sql -c "$hc_fetch" | tail -1)
hc_new=$(s_sql -c "SET enable_seqscan = off; SELECT ctid, v FROM hc WHERE k = 5" | tail -1)
[ -z "$hc_old" ] && [ "$hc_new" = "(0,3)|51" ] ||
  { echo "promoted: k = 1 gave '$hc_old' (expected nothing), k = 5 gave '$hc_new'" >&2; exit 1; }
echo "promoted: a cached chain start whose row id was handed out again is not followed"
s_sql -c "INSERT INTO t VALUES (-1, 'on the promoted node')" \
  -c "UPDATE fresh SET v = 'x' WHERE id = 1" >/dev/null
s_sql -c "INSERT INTO r SELECT g, 'promoted' FROM generate_series(301, 310) g" >/dev/null
r_rows=$(s_sql -c "SELECT count(*) FROM r")
r_bad=$(s_sql -c "SELECT count(*) FROM slipstream.verify('r') WHERE NOT ok")
[ "$r_rows" = 310 ] && [ "$r_bad" = 0 ] ||
  { echo "promoted: r has $r_rows rows of 310 (inserts overwrote replayed rows?)" >&2; s_sql -c "SELECT * FROM slipstream.verify('r')" >&2; exit 1; }
p_rows=$(p_sql -c "SELECT count(*) FROM t")
s_rows=$(s_sql -c "SELECT count(*) FROM t")
[ "$s_rows" = $((p_rows + 1)) ] || { echo "promoted: t has $s_rows rows, expected $((p_rows + 1))" >&2; exit 1; }
bad=$(s_sql -c "SELECT count(*) FROM slipstream.verify('t') WHERE NOT ok")
[ "$bad" = 0 ] || { s_sql -c "SELECT * FROM slipstream.verify('t')" >&2; exit 1; }
echo "promoted: writable, $s_rows rows in t, verify passes"
"$pg" stop "$standby" fast

# 5. A plain pg_basebackup copy (no seed) keeps replaying heap, and refuses slipstream tables.
rm -rf "$raw"
mkdir -p "$raw/sock"
[ "$(id -u)" = 0 ] && chown -R postgres: "$raw"
as_postgres "$pgbin/pg_basebackup" -d "host=$primary/sock port=$base user=postgres" \
  -D "$raw/data" -X stream -c fast -R
echo "port = $((base + 2))" >>"$raw/data/postgresql.conf"
echo "unix_socket_directories = '$raw/sock'" >>"$raw/data/postgresql.conf"
"$pg" start "$raw"
err=$("$pg" psql "$raw" -qAt -c "SELECT count(*) FROM t" 2>&1 || true)
case "$err" in
  *"not a copy of the primary"*) echo "an unseeded standby refuses: ${err#*ERROR:  }" ;;
  *) echo "an unseeded standby answered: $err" >&2; exit 1 ;;
esac
[ "$("$pg" psql "$raw" -qAt -c "SELECT count(*) FROM h")" = 1000 ] || exit 1
echo "standby test passed"
