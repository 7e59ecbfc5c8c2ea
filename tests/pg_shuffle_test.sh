#!/usr/bin/env bash
# pg_shuffle_test.sh: the SQL shuffle (docs/shuffle.md) between three nodes on loopback. Each
# node is a private cluster with slipstream preloaded and the same schema (its user-defined
# types created after a different number of other objects, so that their OIDs differ between
# the nodes), and each has the peer groups 'g' (transport auto: shm on one host) and 'gt' (tcp)
# naming the three nodes by their socket directories. Every check prints PASS or FAIL:
#   a. every row arrives exactly once at its owner: keys 1..N, a third on each node, shuffled by
#      key with shuffle_on_group into a table on every node; the rows of all nodes together are
#      the input (multiset of key and md5 of the row), no key is on two nodes, each node's
#      checksum is that of the input rows with the keys it received, and the counts that
#      shuffle_on_group reports are the rows each node holds. The same by hand with
#      slipstream.shuffle_id set on every node, two shuffles of one group at once, and over tcp.
#   b. every type class (int2/4/8, numeric and float8 with NaN and infinities, text, TOASTed
#      100 kB values compressed and out of line, bytea, bool, date, timestamptz, uuid, jsonb,
#      int[] and text[], a composite, an enum, an enum array and a domain whose OIDs differ
#      between the nodes, NULL in every column): the rows received are the rows sent (md5 of
#      their text form), shuffled by a key of each type; NULL keys go to node 0; no key value
#      lands on two nodes, also for keys with few values sent from every node (where a hash
#      that depends on OIDs shows). Built-in types only (rows travel as heap tuples) over shm
#      and tcp. Rows of 1000 columns; rows of 500 kB and 3 MB against 1 MB receive buffers:
#      whole, or a clear ERROR (which one is printed).
#   c. empty input on one node and on all nodes; every row with one key (all at one node);
#      every key NULL (all at node 0).
#   d. slipstream tables (USING slipstream) as source and destination; a repartitioned join
#      (two shuffles in one statement) with two ids, and with the one id shuffle_on_group sets.
#   e. a node SIGKILLed in the middle of a long shuffle (its postmaster, scripts/pg_cluster.sh
#      kill: shuffle_on_group over shm, then the building block on every node over tcp), and a
#      node's shuffling backend SIGKILLed (over shm): the survivors fail with an ERROR within
#      60 s, keep no entry in slipstream.shuffle_progress and no shuffling backend; after the
#      restarts the group shuffles again.
#   f. pg_cancel_backend of one node's shuffle backend, and a statement_timeout on one node:
#      every node's shuffle fails with an ERROR within 60 s, and nothing is left behind.
#   g. a peer group naming a node nobody listens for: an ERROR with a HINT within 60 s; a node
#      of the group that never joins the shuffle: the others fail within 60 s, with a HINT.
#   h. a node whose peer group has another secret: the shuffle fails with an ERROR on every
#      node within 60 s, one error naming the secret. (g and h run at once: each waits out the
#      time a node gives its peers to join, slipstream.shuffle_join_timeout, 10 s here.)
# About 80-120 s on 2 cores.
#   tests/pg_shuffle_test.sh [scratch dir] [base port]     (ports base..base+2; base+9 unused)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-shuffle}}
base=${2:-55860}
rows_a=${SHUFFLE_ROWS:-300000}
pg="$root/scripts/pg_cluster.sh"
dirs=("$scratch/n0" "$scratch/n1" "$scratch/n2")
work="$scratch/work"
secret="shuffle-test-$RANDOM$RANDOM"
bound=60       # seconds within which a failed shuffle must have failed everywhere
hang=150       # a client still running after this long is killed and counts as a hang
failures=0
started=$(date +%s)

port_of() { echo $((base + $1)); }
conninfo_of() { echo "host=${dirs[$1]}/sock port=$(port_of "$1") dbname=postgres user=postgres"; }
sql() { local n=$1; shift; "$pg" psql "${dirs[$n]}" -qAt "$@"; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }
pass() { echo "  PASS: $*"; }
fail() { echo "  FAIL: $*"; failures=$((failures + 1)); }
check() {  # check DESCRIPTION CONDITION-COMMAND...
  local what=$1; shift
  if "$@"; then pass "$what"; else fail "$what"; return 1; fi
}
case_title() { echo; echo "== $* ($(($(date +%s) - started)) s)"; }

rm -rf "$scratch"
mkdir -p "$work"
[ "$(id -u)" = 0 ] && chown -R postgres: "$scratch"
for i in 0 1 2; do
  "$pg" init "${dirs[$i]}" "$(port_of "$i")" "autovacuum = off" \
    "slipstream.shuffle_join_timeout = 10s" >/dev/null
done
for i in 0 1 2; do "$pg" start "${dirs[$i]}"; done
trap 'for d in "${dirs[@]}"; do "$pg" stop "$d" immediate >/dev/null 2>&1 || true; done' EXIT
# The setting is honoured from postgresql.conf (it was once dropped as an unknown placeholder).
for i in 0 1 2; do
  shown=$("$pg" psql "${dirs[$i]}" -qAt -c "SHOW slipstream.shuffle_join_timeout")
  [ "$shown" = 10s ] || { echo "n$i: slipstream.shuffle_join_timeout is $shown, not 10s" >&2; exit 1; }
done

nodes_sql="ARRAY['$(conninfo_of 0)', '$(conninfo_of 1)', '$(conninfo_of 2)']"

# The schema, the same on every node; node i first creates 5*i throwaway types, so that the
# enum, its labels, the composite and the domain get other OIDs on every node.
for i in 0 1 2; do
  {
    echo "CREATE EXTENSION slipstream;"
    for j in $(seq 1 $((5 * i))); do echo "CREATE TYPE filler_$j AS ENUM ('a', 'b', 'c');"; done
    cat <<'EOF'
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy', 'ecstatic');
CREATE TYPE pair AS (a int, b text, m mood);
CREATE TYPE df AS (d date, f float8);
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE src (k int, v text);
CREATE TABLE dst (k int, v text);
CREATE TABLE types_src (id int, k int, i2 int2, i8 int8, n numeric, f float8, t text, big text,
                        b bytea, bo bool, d date, ts timestamptz, u uuid, j jsonb, ia int[],
                        ta text[], c pair, e mood, ea mood[], dm posint);
CREATE TABLE types_dst (LIKE types_src);
CREATE TABLE wide_big_src (id int, v text);
CREATE TABLE wide_big_dst (LIKE wide_big_src);
CREATE TABLE ss_src (k int PRIMARY KEY, v text, n numeric) USING slipstream;
CREATE TABLE ss_dst (k int PRIMARY KEY, v text, n numeric) USING slipstream;
CREATE TABLE empty_src (k int, v text);
CREATE TABLE dfs (k int, v df);
-- hash partitioning's owner of a key (informational: docs/shuffle.md says its hash is used)
CREATE TABLE hp (k int) PARTITION BY HASH (k);
CREATE TABLE hp0 PARTITION OF hp FOR VALUES WITH (MODULUS 3, REMAINDER 0);
CREATE TABLE hp1 PARTITION OF hp FOR VALUES WITH (MODULUS 3, REMAINDER 1);
CREATE TABLE hp2 PARTITION OF hp FOR VALUES WITH (MODULUS 3, REMAINDER 2);
-- one row in 20000 sleeps 20 ms: a long shuffle that is not CPU-bound
CREATE FUNCTION pace(g bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF g % 20000 = 0 THEN PERFORM pg_sleep(0.02); END IF;
  RETURN true;
END $$;
EOF
    echo "SELECT slipstream.create_peer_group('g', $nodes_sql, $i, '$secret');"
    echo "SELECT slipstream.create_peer_group('gt', $nodes_sql, $i, '$secret', 'tcp');"
  } | sql "$i" >/dev/null
done
echo "three nodes on ports $(port_of 0)-$(port_of 2); oids of mood, its label 'happy', pair:" \
  "$(for i in 0 1 2; do echo -n "n$i $(sql "$i" -c "SELECT 'mood'::regtype::oid || '/' || (SELECT oid FROM pg_enum WHERE enumlabel = 'happy') || '/' || 'pair'::regtype::oid") "; done)"
echo "peer group on n0: $(sql 0 -c "SELECT * FROM slipstream.peer_groups" | tr '\n' ' ')"

# The call of slipstream.shuffle: shuffle_call QUERY KEY COLUMNS [GROUP] [ID] [ALIAS]
shuffle_call() {
  local id=${5:-}
  echo "slipstream.shuffle(\$q\$$1\$q\$, '$2', '${4:-g}'${id:+, $id}) AS ${6:-t}($3)"
}
# Runs STATEMENT on every node of GROUP with shuffle_on_group from node 0: "node|command|rows".
on_group() {
  sql 0 -F'|' -c "SELECT node, command, rows FROM slipstream.shuffle_on_group('$1', \$s\$$2\$s\$) ORDER BY node"
}
# Rows of a query on every node, sorted, into FILE: dump_all FILE QUERY
dump_all() {
  local f=$1 q=$2
  for i in 0 1 2; do sql "$i" -F' ' -c "$q"; done | LC_ALL=C sort >"$f"
}
# Whether no line occurs in two of the files (each holds distinct lines).
disjoint() { [ -z "$(cat "$@" | LC_ALL=C sort | uniq -d | head -1)" ]; }
same_files() { cmp -s "$1" "$2"; }
eq() { [ "$1" = "$2" ]; }
# Background client: bg NAME NODE SQL... (psql -c each); NAME.rc / .out / .err / .end in $work.
bg() {
  local name=$1 n=$2; shift 2
  local args=()
  for c in "$@"; do args+=(-c "$c"); done
  (
    set +e
    timeout -s KILL "$hang" "$pg" psql "${dirs[$n]}" -qAt "${args[@]}" >"$work/$name.out" 2>"$work/$name.err"
    echo $? >"$work/$name.rc"
    now >"$work/$name.end"
  ) &
  echo $! >"$work/$name.pid"
}
bg_wait() { wait "$(cat "$work/$1.pid")" 2>/dev/null || true; }
# A client failed with an ERROR, within `bound` seconds of REFERENCE: failed_in_time NAME REF
failed_in_time() {
  local name=$1 ref=$2 rc t
  rc=$(cat "$work/$name.rc")
  t=$(elapsed "$ref" "$(cat "$work/$name.end")")
  echo "    $name: exit $rc after ${t}s: $(grep -m1 -E 'ERROR|FATAL|server closed' "$work/$name.err" || head -c 200 "$work/$name.out")"
  [ "$rc" != 0 ] && [ "$rc" != 137 ] && grep -q 'ERROR' "$work/$name.err" &&
    awk -v t="$t" -v b="$bound" 'BEGIN { exit !(t < b) }'
}
# Whether shuffle_on_group's error (client NAME) reports a failure of each node NODE... too (in
# its DETAIL: the statement failed there by itself, not only because it was cancelled).
detail_names() {
  local name=$1 n; shift
  for n in "$@"; do
    grep -A3 '^DETAIL' "$work/$name.err" | grep -q "node $n: " || grep -q "^ERROR:  node $n of" "$work/$name.err" || return 1
  done
  echo "    $(grep -m1 '^DETAIL' "$work/$name.err" | cut -c1-300)"
}
# Waits until node N shows a running shuffle that has moved rows (up to 30 s).
wait_progress() {
  local n=$1
  for _ in $(seq 1 300); do
    [ "$(sql "$n" -c "SELECT count(*) FROM slipstream.shuffle_progress WHERE rows_sent + rows_received > 0")" -gt 0 ] && return 0
    sleep 0.1
  done
  return 1
}
# Whether node N is clean after a failed shuffle: no shuffle_progress entry, no backend still
# shuffling (waits up to 20 s for them to go).
clean_after() {
  local n=$1 p=-1 b=-1
  for _ in $(seq 1 200); do
    p=$(sql "$n" -c "SELECT count(*) FROM slipstream.shuffle_progress")
    b=$(sql "$n" -c "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state <> 'idle' AND query LIKE '%slipstream.shuffle%'")
    [ "$p" = 0 ] && [ "$b" = 0 ] && return 0
    sleep 0.1
  done
  echo "    n$n after 20 s: $p shuffle_progress rows, $b backends shuffling"
  sql "$n" -c "SELECT * FROM slipstream.shuffle_progress" | head -5 | sed 's/^/      /'
  return 1
}
# The long shuffle of cases e and f: 100M generated rows per node (streamed: generate_series in
# the target list, not materialized as in FROM), paced; counted on arrival.
long_query='SELECT g AS k, md5(g::text) AS v FROM (SELECT generate_series(1, 100000000) AS g) s WHERE pace(g)'
long_shuffle() { echo "SELECT count(*) FROM $(shuffle_call "$long_query" k 'k int, v text' "$@")"; }

# From here on every check reports for itself; a failing command is not the end of the test.
set +e

################################################################################################
case_title "a. every row arrives exactly once at its owner ($rows_a keys, a third on each node, heap)"
third=$((rows_a / 3))
for i in 0 1 2; do
  lo=$((i * third + 1)); hi=$(( i == 2 ? rows_a : (i + 1) * third ))
  sql "$i" -c "INSERT INTO src SELECT g, md5(g::text) || repeat('v', g % 50) FROM generate_series($lo, $hi) g"
done
t0=$(now)
on_group g "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text')" >"$work/a.group"
echo "    shuffle_on_group took $(elapsed "$t0" "$(now)")s: $(tr '\n' ' ' <"$work/a.group")"
check "shuffle_on_group returns one row per node, 0..2" eq "$(cut -d'|' -f1 "$work/a.group" | tr '\n' ,)" "0,1,2,"
check "the rows it reports add up to $rows_a" eq "$(awk -F'|' '{ s += $3 } END { print s }' "$work/a.group")" "$rows_a"
counts_ok=1
for i in 0 1 2; do
  reported=$(awk -F'|' -v n="$i" '$1 == n { print $3 }' "$work/a.group")
  held=$(sql "$i" -c "SELECT count(*) FROM dst")
  command=$(awk -F'|' -v n="$i" '$1 == n { print $2 }' "$work/a.group")
  echo "    n$i holds $held rows (reported $reported, command '$command')"
  [ "$reported" = "$held" ] && [ "$command" = "INSERT 0 $held" ] || counts_ok=0
done
check "each node's reported count and command match the rows it holds" eq "$counts_ok" 1
dump_all "$work/a.src" "SELECT k, md5(rw::text) FROM src rw"
dump_all "$work/a.dst" "SELECT k, md5(rw::text) FROM dst rw"
check "the rows of all nodes together are exactly the input rows (key, md5 of the row)" same_files "$work/a.src" "$work/a.dst"
for i in 0 1 2; do sql "$i" -c "SELECT k FROM dst" | LC_ALL=C sort >"$work/a.keys$i"; done
check "no key is on two nodes" disjoint "$work/a.keys0" "$work/a.keys1" "$work/a.keys2"
# Per node: the checksum of what it received against that of the input rows with its keys
# (the input spread over all three nodes).
sums_ok=1
for i in 0 1 2; do
  got=$(sql "$i" -c "SELECT count(*) || ' ' || coalesce(sum(('x' || left(md5(rw::text), 8))::bit(32)::bigint), 0) FROM dst rw")
  want_count=0; want_sum=0
  for j in 0 1 2; do
    r=$( { echo "CREATE TEMP TABLE keys (k int); COPY keys FROM STDIN;"; cat "$work/a.keys$i"; echo '\.';
           echo "SELECT count(*) || ' ' || coalesce(sum(('x' || left(md5(rw::text), 8))::bit(32)::bigint), 0) FROM src rw WHERE k IN (SELECT k FROM keys);"; } | sql "$j" | tail -1)
    want_count=$((want_count + ${r% *})); want_sum=$((want_sum + ${r#* }))
  done
  echo "    n$i: received $got, input with its keys $want_count $want_sum"
  [ "$got" = "$want_count $want_sum" ] || sums_ok=0
done
check "each node's checksum equals that of the input rows with the keys it received" eq "$sums_ok" 1
hp_mismatch=0
for i in 0 1 2; do
  m=$(sql "$i" -c "SELECT count(*) FROM dst WHERE NOT satisfies_hash_partition('hp'::regclass, 3, $i, k)")
  hp_mismatch=$((hp_mismatch + m))
done
echo "    (info) rows whose node differs from hash partitioning's remainder (MODULUS 3): $hp_mismatch of $rows_a"

# The same shuffle with slipstream.shuffle_id set in each session instead of given, one
# client per node: the building block, as a user runs it by hand.
for i in 0 1 2; do sql "$i" -c "TRUNCATE dst"; done
for i in 0 1 2; do
  bg "a_guc$i" "$i" "SET slipstream.shuffle_id = 4242" \
    "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text')"
done
for i in 0 1 2; do bg_wait "a_guc$i"; done
ok=1
for i in 0 1 2; do [ "$(cat "$work/a_guc$i.rc")" = 0 ] || { ok=0; cat "$work/a_guc$i.err"; }; done
dump_all "$work/a.dst2" "SELECT k, md5(rw::text) FROM dst rw"
for i in 0 1 2; do sql "$i" -c "SELECT k FROM dst" | LC_ALL=C sort >"$work/a.keys2_$i"; done
check "by hand on every node with SET slipstream.shuffle_id: same rows, same owners" \
  eval '[ $ok = 1 ] && same_files "$work/a.src" "$work/a.dst2" && same_files "$work/a.keys0" "$work/a.keys2_0" && same_files "$work/a.keys1" "$work/a.keys2_1"'

# Two shuffles of the same group at once (different random ids): neither disturbs the other.
for i in 0 1 2; do sql "$i" -c "TRUNCATE dst" -c "CREATE TABLE dst2 (LIKE dst)"; done
bg a_par1 0 "SELECT node, command, rows FROM slipstream.shuffle_on_group('g', \$s\$INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text')\$s\$)"
bg a_par2 1 "SELECT node, command, rows FROM slipstream.shuffle_on_group('g', \$s\$INSERT INTO dst2 SELECT * FROM $(shuffle_call 'SELECT k, v FROM src WHERE k % 2 = 0' k 'k int, v text')\$s\$)"
bg_wait a_par1; bg_wait a_par2
dump_all "$work/a.par1" "SELECT k, md5(rw::text) FROM dst rw"
dump_all "$work/a.par2" "SELECT k, md5(rw::text) FROM dst2 rw"
dump_all "$work/a.src_even" "SELECT k, md5(rw::text) FROM src rw WHERE k % 2 = 0"
check "two shuffles of one group at once: both complete with exactly their rows" \
  eval '[ "$(cat $work/a_par1.rc)$(cat $work/a_par2.rc)" = 00 ] && same_files "$work/a.src" "$work/a.par1" && same_files "$work/a.src_even" "$work/a.par2"' ||
  { cat "$work/a_par1.err" "$work/a_par2.err"; }

# The same shuffle over the tcp transport (peer group 'gt'; 'g' is 'auto', shm on one host).
for i in 0 1 2; do sql "$i" -c "TRUNCATE dst"; done
t0=$(now)
out=$(on_group gt "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text' gt)" 2>&1)
echo "    over tcp: $(elapsed "$t0" "$(now)")s: $(echo "$out" | tr '\n' ' ')"
dump_all "$work/a.tcp" "SELECT k, md5(rw::text) FROM dst rw"
for i in 0 1 2; do sql "$i" -c "SELECT k FROM dst" | LC_ALL=C sort >"$work/a.tcpkeys$i"; done
check "over tcp: every row exactly once, at the same owners as over shm" \
  eval 'same_files "$work/a.src" "$work/a.tcp" && same_files "$work/a.keys0" "$work/a.tcpkeys0" && same_files "$work/a.keys1" "$work/a.tcpkeys1" && same_files "$work/a.keys2" "$work/a.tcpkeys2"'

################################################################################################
case_title "b. every type class, NULLs, user-defined types with other OIDs on every node, wide rows"
for i in 0 1 2; do
  lo=$((i * 1000 + 1)); hi=$(((i + 1) * 1000))
  sql "$i" <<EOF
INSERT INTO types_src
SELECT g,
  CASE WHEN g % 37 = 1 THEN NULL ELSE g % 200 END,
  CASE WHEN g % 37 = 2 THEN NULL ELSE (g % 32767 - 16000)::int2 END,
  CASE WHEN g % 37 = 3 THEN NULL ELSE g::int8 * 1000000007 * (CASE WHEN g % 2 = 0 THEN -1 ELSE 1 END) END,
  CASE WHEN g % 37 = 4 THEN NULL WHEN g % 101 = 0 THEN 'NaN'::numeric WHEN g % 103 = 0 THEN 'Infinity'::numeric
       WHEN g % 107 = 0 THEN '-Infinity'::numeric WHEN g % 109 = 0 THEN 1e-100
       ELSE (g::numeric / 7) * 10 ^ (g % 20 - 10) END,
  CASE WHEN g % 37 = 5 THEN NULL WHEN g % 101 = 0 THEN 'NaN'::float8 WHEN g % 103 = 0 THEN 'Infinity'::float8
       WHEN g % 107 = 0 THEN '-Infinity'::float8 WHEN g % 109 = 0 THEN '-0'::float8 ELSE g / 3.0::float8 END,
  CASE WHEN g % 37 = 6 THEN NULL WHEN g % 41 = 0 THEN '' ELSE 'row ' || g || ' ünïcødé ☃ "q" \\ , ' || repeat('é', g % 7) END,
  CASE WHEN g % 250 = 1 THEN (SELECT string_agg(md5(g::text || x::text), '') FROM generate_series(1, 3200) x)  -- 100 kB, out of line
       WHEN g % 250 = 2 THEN repeat('compressible ' || g, 8000)                                                -- ~100 kB, compressed
       ELSE NULL END,
  CASE WHEN g % 37 = 8 THEN NULL ELSE decode(md5(g::text), 'hex') || '\x00ff00'::bytea END,
  CASE WHEN g % 37 = 9 THEN NULL ELSE g % 2 = 0 END,
  CASE WHEN g % 37 = 10 THEN NULL WHEN g % 113 = 0 THEN 'infinity'::date ELSE date '2000-01-01' + g END,
  CASE WHEN g % 37 = 11 THEN NULL WHEN g % 113 = 0 THEN '-infinity'::timestamptz
       ELSE timestamptz '2020-03-29 00:30:00.123456+00' + g * interval '1 hour 1.5 second' END,
  CASE WHEN g % 37 = 12 THEN NULL ELSE md5(g::text)::uuid END,
  CASE WHEN g % 37 = 13 THEN NULL
       ELSE jsonb_build_object('g', g, 'arr', jsonb_build_array(g, 'x', NULL, true, g / 3.0), 'nested', jsonb_build_object('s', 'é"\\')) END,
  CASE WHEN g % 37 = 14 THEN NULL WHEN g % 43 = 0 THEN '{}'::int[] WHEN g % 47 = 0 THEN '{{1,2},{3,NULL}}'::int[]
       ELSE ARRAY[g, NULL, -g] END,
  CASE WHEN g % 37 = 15 THEN NULL ELSE ARRAY['a' || g, NULL, 'with "quote"', 'comma,brace}', '', 'NULL'] END,
  CASE WHEN g % 37 = 16 THEN NULL WHEN g % 53 = 0 THEN ROW(NULL, NULL, NULL)::pair
       ELSE ROW(g, 'p,(' || g, (ARRAY['sad', 'ok', 'happy', 'ecstatic'])[g % 4 + 1])::pair END,
  CASE WHEN g % 37 = 17 THEN NULL ELSE (ARRAY['sad', 'ok', 'happy', 'ecstatic'])[g % 4 + 1]::mood END,
  CASE WHEN g % 37 = 18 THEN NULL ELSE ARRAY[(ARRAY['sad', 'ok', 'happy', 'ecstatic'])[g % 4 + 1]::mood, NULL, 'ok'] END,
  CASE WHEN g % 37 = 19 THEN NULL ELSE g END
FROM generate_series($lo, $hi) g;
-- a row of NULLs but its id
INSERT INTO types_src (id) VALUES (-$i - 1);
EOF
done
cols_b="id int, k int, i2 int2, i8 int8, n numeric, f float8, t text, big text, b bytea, bo bool, d date, ts timestamptz, u uuid, j jsonb, ia int[], ta text[], c pair, e mood, ea mood[], dm posint"
echo "    $(sql 0 -c "SELECT count(*) || ' rows on n0, ' || count(*) FILTER (WHERE pg_column_size(big) < length(big)) || ' TOASTed values compressed, ' || count(*) FILTER (WHERE pg_column_size(big) >= 100000) || ' out of line uncompressed' FROM types_src")"
dump_all "$work/b.src" "SELECT id, md5(rw::text) FROM types_src rw"
for key in k i2 i8 n f t big b bo d ts u j ia ta c dm; do
  for i in 0 1 2; do sql "$i" -c "TRUNCATE types_dst"; done
  out=$(on_group g "INSERT INTO types_dst SELECT * FROM $(shuffle_call 'SELECT * FROM types_src' "$key" "$cols_b")" 2>&1) || true
  dump_all "$work/b.dst" "SELECT id, md5(rw::text) FROM types_dst rw"
  for i in 0 1 2; do sql "$i" -c "SELECT DISTINCT $key::text FROM types_dst WHERE $key::text IS NOT NULL" >"$work/b.keys$i"; done
  nulls_elsewhere=$(for i in 1 2; do sql "$i" -c "SELECT count(*) FROM types_dst WHERE $key::text IS NULL"; done | awk '{ s += $1 } END { print s + 0 }')
  spread=$(for i in 0 1 2; do sql "$i" -c "SELECT count(*) FROM types_dst"; done | tr '\n' /)
  if [ "$(echo "$out" | wc -l)" = 3 ] && same_files "$work/b.src" "$work/b.dst"; then
    pass "key $key: every row arrives unchanged (md5 of its text form; rows per node ${spread%/})"
  else
    fail "key $key: rows differ from the input: $(echo "$out" | head -3 | tr '\n' ' ')"
    diff "$work/b.src" "$work/b.dst" | head -4 | sed 's/^/      /'
  fi
  check "key $key: no key value on two nodes" disjoint "$work/b.keys0" "$work/b.keys1" "$work/b.keys2" ||
    { LC_ALL=C sort "$work"/b.keys[012] | uniq -d | head -3 | sed 's/^/      on two nodes: /'; }
  check "key $key: NULL keys all at node 0 ($nulls_elsewhere elsewhere)" eq "$nulls_elsewhere" 0
done
# Keys with few values, each value on every node: a value must go to one node from all three.
# For user-defined types (an enum, an enum array, a composite holding an enum, a domain) this
# needs a hash that does not depend on OIDs, which differ between the nodes.
q_low="SELECT id, (id % 5)::int AS small, e, ea, CASE WHEN e IS NULL THEN NULL ELSE ROW(id % 2, 'x', e)::pair END AS c2, (abs(id) % 5 + 1)::posint AS dm2 FROM types_src"
cols_low="id int, small int, e mood, ea mood[], c2 pair, dm2 posint"
dump_all "$work/b.lowsrc" "SELECT id, md5(rw::text) FROM ($q_low) rw"
for i in 0 1 2; do sql "$i" -c "CREATE TABLE types_low_dst ($cols_low)"; done
for key in small dm2 e ea c2; do
  for i in 0 1 2; do sql "$i" -c "TRUNCATE types_low_dst"; done
  out=$(on_group g "INSERT INTO types_low_dst SELECT * FROM $(shuffle_call "$q_low" "$key" "$cols_low")" 2>&1)
  dump_all "$work/b.lowdst" "SELECT id, md5(rw::text) FROM types_low_dst rw"
  for i in 0 1 2; do sql "$i" -c "SELECT DISTINCT $key::text FROM types_low_dst WHERE $key::text IS NOT NULL" >"$work/b.lkeys$i"; done
  check "key $key ($(cat "$work"/b.lkeys[012] | LC_ALL=C sort -u | wc -l) values): every row unchanged" same_files "$work/b.lowsrc" "$work/b.lowdst" ||
    echo "      $(echo "$out" | head -2 | tr '\n' ' ')"
  check "key $key: each value at one node only" disjoint "$work/b.lkeys0" "$work/b.lkeys1" "$work/b.lkeys2" ||
    for i in 0 1 2; do echo "      n$i holds: $(tr '\n' ' ' <"$work/b.lkeys$i" | head -c 150)"; done
done

# A user-defined type travels in its text form: a sender whose session has another DateStyle and
# extra_float_digits than the receivers' must still deliver the same values (direct shuffles
# over tcp; n0's session sets 'SQL, DMY' and extra_float_digits 0).
for i in 0 1 2; do
  sql "$i" -c "INSERT INTO dfs SELECT g, ROW(date '2020-03-04' + g, 1.0 / 3 + g)::df FROM generate_series($((i * 8 + 1)), $((i * 8 + 8))) g"
done
q_df="SELECT count(*) || ' ' || count(*) FILTER (WHERE v = ROW(date '2020-03-04' + k, 1.0 / 3 + k)::df) || ' ' || coalesce(string_agg(k || '=' || v::text, ' ') FILTER (WHERE v <> ROW(date '2020-03-04' + k, 1.0 / 3 + k)::df), '') FROM $(shuffle_call 'SELECT k, v FROM dfs' k 'k int, v df' gt 7100)"
bg b_df0 0 "SET DateStyle = 'SQL, DMY'" "SET extra_float_digits = 0" "$q_df"
bg b_df1 1 "$q_df"
bg b_df2 2 "$q_df"
for i in 0 1 2; do bg_wait "b_df$i"; done
df_ok=1
for i in 0 1 2; do
  r=$(cat "$work/b_df$i.out" "$work/b_df$i.err")
  echo "    n$i received (rows, intact, wrong ones): $(echo "$r" | tr '\n' ' ' | cut -c1-200)"
  read -r total intact _ <<<"$r"
  [ -n "$total" ] && [ "$total" = "$intact" ] || df_ok=0
done
check "a sender with DateStyle 'SQL, DMY' and extra_float_digits 0: a composite of a date and a float8 arrives unchanged" eq "$df_ok" 1

# Built-in types only: the rows travel as heap tuples (the codec's raw path), over shm and tcp.
cols_raw="id int, k int, i2 int2, i8 int8, n numeric, f float8, t text, big text, b bytea, bo bool, d date, ts timestamptz, u uuid, j jsonb, ia int[], ta text[]"
q_raw="SELECT id, k, i2, i8, n, f, t, big, b, bo, d, ts, u, j, ia, ta FROM types_src"
dump_all "$work/b.rawsrc" "SELECT id, md5(rw::text) FROM ($q_raw) rw"
for i in 0 1 2; do sql "$i" -c "CREATE TABLE types_raw_dst ($cols_raw)"; done
for group in g gt; do
  for key in k t n ia; do
    for i in 0 1 2; do sql "$i" -c "TRUNCATE types_raw_dst"; done
    out=$(on_group "$group" "INSERT INTO types_raw_dst SELECT * FROM $(shuffle_call "$q_raw" "$key" "$cols_raw" "$group")" 2>&1)
    dump_all "$work/b.rawdst" "SELECT id, md5(rw::text) FROM types_raw_dst rw"
    for i in 0 1 2; do sql "$i" -c "SELECT DISTINCT $key::text FROM types_raw_dst WHERE $key::text IS NOT NULL" >"$work/b.rkeys$i"; done
    check "built-in types only (heap tuples on the wire), group $group, key $key: every row unchanged, no key on two nodes" \
      eval 'same_files "$work/b.rawsrc" "$work/b.rawdst" && disjoint "$work/b.rkeys0" "$work/b.rkeys1" "$work/b.rkeys2"' ||
      { echo "      $(echo "$out" | head -2 | tr '\n' ' ')"; diff "$work/b.rawsrc" "$work/b.rawdst" | head -5 | sed 's/^/      /';
        LC_ALL=C sort "$work"/b.rkeys[012] | uniq -d | head -3 | sed 's/^/      on two nodes: /'; }
  done
done

# The values themselves at one spot: the out-of-line one and its md5.
check "the 100 kB values arrived intact (length and md5 at their destination)" eq \
  "$(for i in 0 1 2; do sql "$i" -c "SELECT id, length(big), md5(big) FROM types_dst WHERE big IS NOT NULL"; done | LC_ALL=C sort | md5sum)" \
  "$(for i in 0 1 2; do sql "$i" -c "SELECT id, length(big), md5(big) FROM types_src WHERE big IS NOT NULL"; done | LC_ALL=C sort | md5sum)"

# A row of 1000 columns.
wide_cols=$(seq 1 1000 | sed 's/.*/c& int/' | paste -sd,)
wide_vals=$(seq 1 1000 | sed 's/.*/g * 1000 + &/' | paste -sd,)
for i in 0 1 2; do
  sql "$i" -c "CREATE TABLE w1000_src ($wide_cols)" -c "CREATE TABLE w1000_dst ($wide_cols)" \
    -c "INSERT INTO w1000_src SELECT $wide_vals FROM generate_series($((i * 100 + 1)), $((i * 100 + 100))) g" \
    -c "UPDATE w1000_src SET c500 = NULL, c1000 = NULL WHERE c1 % 3 = 0"
done
out=$(on_group g "INSERT INTO w1000_dst SELECT * FROM $(shuffle_call 'SELECT * FROM w1000_src' c1 "$wide_cols")" 2>&1) || true
dump_all "$work/w.src" "SELECT c1, md5(rw::text) FROM w1000_src rw"
dump_all "$work/w.dst" "SELECT c1, md5(rw::text) FROM w1000_dst rw"
check "rows of 1000 columns arrive unchanged ($(echo "$out" | tr '\n' ' ' | head -c 150))" same_files "$work/w.src" "$work/w.dst"

# Rows larger than much of a buffer (500 kB) and than a whole one (3 MB; buffer_size 1MB):
# incompressible values, so that the rows are that large on the wire.
for size_kb in 500 3000; do
  for i in 0 1 2; do
    sql "$i" -c "TRUNCATE wide_big_src, wide_big_dst" \
      -c "INSERT INTO wide_big_src SELECT $i * 10 + r, (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, $size_kb * 32)) FROM generate_series(1, 3) r" \
      -c "INSERT INTO wide_big_src SELECT 100 + $i * 1000 + g, md5(g::text) FROM generate_series(1, 500) g"
  done
  t0=$(now)
  out=$(timeout -s KILL "$hang" "$pg" psql "${dirs[0]}" -qAt -F'|' -c "SELECT node, command, rows FROM slipstream.shuffle_on_group('g', \$s\$INSERT INTO wide_big_dst SELECT * FROM $(shuffle_call 'SELECT * FROM wide_big_src' id 'id int, v text')\$s\$)" 2>&1)
  rc=$?
  t=$(elapsed "$t0" "$(now)")
  dump_all "$work/big.src" "SELECT id, length(v), md5(v) FROM wide_big_src"
  dump_all "$work/big.dst" "SELECT id, length(v), md5(v) FROM wide_big_dst"
  if [ "$rc" = 0 ] && same_files "$work/big.src" "$work/big.dst"; then
    pass "rows of $size_kb kB: they WORK, every row arrives whole (${t}s)"
  elif [ "$rc" != 0 ] && [ "$rc" != 137 ] && echo "$out" | grep -q ERROR; then
    pass "rows of $size_kb kB: a clear ERROR after ${t}s: $(echo "$out" | grep -A1 ERROR | tr '\n' ' ')"
    for i in 0 1 2; do clean_after "$i" || fail "n$i keeps shuffle state after the failed shuffle"; done
  else
    fail "rows of $size_kb kB: exit $rc after ${t}s, rows $(wc -l <"$work/big.dst") of $(wc -l <"$work/big.src"): $(echo "$out" | head -3 | tr '\n' ' ')"
  fi
done

################################################################################################
case_title "c. empty input on one node and on all; every row with the same key"
for i in 0 1 2; do sql "$i" -c "TRUNCATE dst"; done
out=$(on_group g "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT k, v FROM src WHERE k % 3 = 0 AND (k - 1) / '$third' <> 1' k 'k int, v text')")
dump_all "$work/c.src" "SELECT k, md5(rw::text) FROM src rw WHERE k % 3 = 0 AND (k - 1) / $third <> 1"
dump_all "$work/c.dst" "SELECT k, md5(rw::text) FROM dst rw"
for i in 0 1 2; do sql "$i" -c "SELECT k FROM dst" | LC_ALL=C sort >"$work/c.keys$i"; done
check "n1 sends nothing: every row of n0 and n2 arrives once ($(echo "$out" | tr '\n' ' '))" \
  eval 'same_files "$work/c.src" "$work/c.dst" && disjoint "$work/c.keys0" "$work/c.keys1" "$work/c.keys2"'
out=$(on_group g "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT k, v FROM empty_src' k 'k int, v text')" | tr '\n' ' ')
check "every node empty: each reports INSERT 0 0 ($out)" eq "$out" "0|INSERT 0 0|0 1|INSERT 0 0|0 2|INSERT 0 0|0 "
out=$(on_group g "SELECT count(*) FROM $(shuffle_call 'SELECT k, v FROM src WHERE false' k 'k int, v text')" | tr '\n' ' ')
check "a query with no rows anywhere, counted: SELECT 1 on each node ($out)" eq "$out" "0|SELECT 1|1 1|SELECT 1|1 2|SELECT 1|1 "
for i in 0 1 2; do sql "$i" -c "TRUNCATE dst"; done
out=$(on_group g "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT 42 AS k, v FROM src' k 'k int, v text')")
per_node=$(for i in 0 1 2; do sql "$i" -c "SELECT count(*) FROM dst"; done | tr '\n' ' ')
dump_all "$work/c.skew_src" "SELECT 42, md5(ROW(42, v)::text) FROM src"
dump_all "$work/c.skew_dst" "SELECT k, md5(rw::text) FROM dst rw"
check "all $rows_a rows with key 42 go to one node (rows per node: $per_node)" \
  eval 'same_files "$work/c.skew_src" "$work/c.skew_dst" && [ "$(echo $per_node | tr " " "\n" | grep -c "^0$")" = 2 ]'
for i in 0 1 2; do sql "$i" -c "TRUNCATE dst"; done
out=$(on_group g "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT NULL::int AS k, v FROM src WHERE k % 10 = 0' k 'k int, v text')")
per_node=$(for i in 0 1 2; do sql "$i" -c "SELECT count(*) FROM dst"; done | tr '\n' ' ')
check "all rows with a NULL key go to node 0 (rows per node: $per_node)" eq "$per_node" "$((rows_a / 10)) 0 0 "

################################################################################################
case_title "d. slipstream tables as source and destination"
for i in 0 1 2; do
  lo=$((i * 40000 + 1)); hi=$(((i + 1) * 40000))
  sql "$i" -c "INSERT INTO ss_src SELECT g, repeat(md5(g::text), g % 40), g * 1.5 FROM generate_series($lo, $hi) g" \
    -c "UPDATE ss_src SET v = 'updated ' || k WHERE k % 7 = 0" -c "DELETE FROM ss_src WHERE k % 11 = 0"
done
# the key shuffled on is v's length: rows of one key come from every node
out=$(on_group g "INSERT INTO ss_dst SELECT * FROM $(shuffle_call 'SELECT k, v, n FROM ss_src' v 'k int, v text, n numeric')")
dump_all "$work/d.src" "SELECT k, md5(rw::text) FROM ss_src rw"
dump_all "$work/d.dst" "SELECT k, md5(rw::text) FROM ss_dst rw"
for i in 0 1 2; do sql "$i" -c "SELECT DISTINCT v FROM ss_dst" >"$work/d.keys$i"; done
check "slipstream to slipstream, by a text key: every row once, unchanged ($(echo "$out" | tr '\n' ' '))" \
  eval 'same_files "$work/d.src" "$work/d.dst" && disjoint "$work/d.keys0" "$work/d.keys1" "$work/d.keys2"'
verify=$(for i in 0 1 2; do sql "$i" -c "SELECT count(*) FROM slipstream.verify('ss_dst') WHERE NOT ok"; done | awk '{ s += $1 } END { print s + 0 }')
check "slipstream.verify passes on every node's destination" eq "$verify" 0
# A repartitioned join, as docs/shuffle.md describes it: ss_src (slipstream) and src (heap)
# shuffled on k in one statement, joined on every node. First with two shuffle ids (the
# second derived from slipstream.shuffle_id).
expected=$(for i in 0 1 2; do sql "$i" -c "SELECT k FROM ss_src WHERE k <= 120000"; done | wc -l)
for i in 0 1 2; do sql "$i" -c "CREATE TABLE joined (k int, n numeric, v text)"; done
join_stmt() {
  echo "INSERT INTO joined SELECT k, a.n, b.v FROM $(shuffle_call 'SELECT k, n FROM ss_src' k 'k int, n numeric' g "$1" a)
        JOIN $(shuffle_call 'SELECT k, v FROM src WHERE k <= 120000' k 'k int, v text' g "$2" b) USING (k)"
}
out=$(on_group g "$(join_stmt "" "current_setting('slipstream.shuffle_id')::bigint + 1")" 2>&1)
dump_all "$work/d.join" "SELECT k, md5(rw::text) FROM joined rw"
# ss_src's and src's rows are functions of k: the joined row each k must give
sql 0 -F' ' -c "SELECT k, md5(ROW(k, k * 1.5, md5(k::text) || repeat('v', k % 50))::text) FROM generate_series(1, 120000) k WHERE k % 11 <> 0" >"$work/d.joinlocal"
check "a repartitioned join (two shuffles, two ids): $expected rows, each joined row as the local join gives it" \
  eval '[ "$(wc -l <"$work/d.join")" = "$expected" ] && [ "$(sort -n "$work/d.join" | md5sum)" = "$(sort -n "$work/d.joinlocal" | md5sum)" ]' ||
  echo "      $(echo "$out" | head -2 | tr '\n' ' ')"
# Then both shuffles under the one slipstream.shuffle_id shuffle_on_group sets, as a user
# following docs/shuffle.md writes it. The nodes leave the first shuffle at slightly different
# moments; one that asks a peer for its port while the peer is still registered under the id
# in the first shuffle is given that shuffle's listener, which is closing. Seen failing about
# once in 40 rounds (the first shuffle's rows all go to one node, key 2 being n1's): 5 rounds.
same_id_ok=1
for round in 1 2 3 4 5; do
  t0=$(now)
  out=$(on_group g "SELECT (SELECT count(*) FROM $(shuffle_call 'SELECT 2 AS k, v FROM src' k 'k int, v text' g "" a)) + (SELECT count(*) FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text' g "" b))" 2>&1)
  if [ "$(echo "$out" | wc -l)" != 3 ]; then
    same_id_ok=0
    echo "    round $round failed after $(elapsed "$t0" "$(now)")s: $(echo "$out" | head -1 | cut -c1-400)"
    break
  fi
done
check "two shuffles in one statement under one slipstream.shuffle_id (shuffle_on_group), 5 rounds" eq "$same_id_ok" 1

################################################################################################
case_title "e. a node SIGKILLed in the middle of a long shuffle"
t0=$(now)
bg e_group 0 "SELECT node, command, rows FROM slipstream.shuffle_on_group('g', \$s\$$(long_shuffle)\$s\$)"
if wait_progress 0; then
  sleep 1
  echo "    n0's progress: $(sql 0 -c "SELECT sum(rows_sent) || ' rows sent, ' || sum(rows_received) || ' received' FROM slipstream.shuffle_progress")"
  killed=$(now)
  "$pg" kill "${dirs[2]}"
  echo "    n2 killed $(elapsed "$t0" "$killed")s into the shuffle"
  bg_wait e_group
  check "shuffle_on_group on n0 fails with an ERROR within ${bound}s of the kill" failed_in_time e_group "$killed"
  check "... and the statement failed on n0 and n1 themselves" detail_names e_group 0 1
  check "n0 is clean afterwards (no shuffle_progress entry, no shuffling backend)" clean_after 0
  check "n1 is clean afterwards" clean_after 1
else
  fail "the long shuffle never showed progress on n0: $(cat "$work/e_group.err" 2>/dev/null)"
  kill -9 "$(cat "$work/e_group.pid")" 2>/dev/null || true
  "$pg" kill "${dirs[2]}"
fi
"$pg" start "${dirs[2]}" 2>/dev/null

# The building block on every node, shuffle id 7001; n1 killed in the middle.
t0=$(now)
for i in 0 1 2; do bg "e_direct$i" "$i" "$(long_shuffle gt 7001)"; done
if wait_progress 0; then
  sleep 1
  echo "    n0's progress: $(sql 0 -c "SELECT sum(rows_sent) || ' rows sent, ' || sum(rows_received) || ' received' FROM slipstream.shuffle_progress")"
  killed=$(now)
  "$pg" kill "${dirs[1]}"
  echo "    n1 killed $(elapsed "$t0" "$killed")s into the shuffle"
  for i in 0 2; do bg_wait "e_direct$i"; done
  check "direct shuffle on n0 fails with an ERROR within ${bound}s of n1's kill" failed_in_time e_direct0 "$killed"
  check "direct shuffle on n2 fails with an ERROR within ${bound}s of n1's kill" failed_in_time e_direct2 "$killed"
  check "n0 is clean afterwards" clean_after 0
  check "n2 is clean afterwards" clean_after 2
else
  fail "the direct long shuffle never showed progress on n0"
  "$pg" kill "${dirs[1]}"
fi
bg_wait e_direct1
"$pg" start "${dirs[1]}" 2>/dev/null

# The shuffling backend itself SIGKILLed on n2 (its postmaster then restarts every backend):
# direct shuffles over shm, id 7006.
for i in 0 1 2; do bg "e_backend$i" "$i" "$(long_shuffle g 7006)"; done
if wait_progress 2; then
  sleep 1
  victim=$(sql 2 -c "SELECT DISTINCT pid FROM slipstream.shuffle_progress WHERE shuffle_id = 7006")
  killed=$(now)
  kill -9 "$victim"
  echo "    n2's shuffling backend (pid $victim) killed"
  for i in 0 1; do bg_wait "e_backend$i"; done
  for i in 0 1; do
    check "direct shuffle on n$i fails with an ERROR within ${bound}s of the kill" failed_in_time "e_backend$i" "$killed"
    check "n$i is clean afterwards" clean_after "$i"
  done
else
  fail "the long shuffle never showed progress on n2"
fi
bg_wait e_backend2
for _ in $(seq 1 300); do sql 2 -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.2; done
for i in 0 1 2; do sql "$i" -c "TRUNCATE dst"; done
out=$(on_group g "INSERT INTO dst SELECT * FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text')" 2>&1) || true
dump_all "$work/e.dst" "SELECT k, md5(rw::text) FROM dst rw"
check "after both restarts the group shuffles again, every row once" same_files "$work/a.src" "$work/e.dst" ||
  echo "      $out"

################################################################################################
case_title "f. a cancelled shuffle and a statement_timeout on one node"
bg f_group 0 "SELECT node, command, rows FROM slipstream.shuffle_on_group('g', \$s\$$(long_shuffle)\$s\$)"
if wait_progress 1; then
  sleep 1
  cancelled=$(sql 1 -c "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend' AND query LIKE '%slipstream.shuffle(%' AND query NOT LIKE '%shuffle_on_group%'")
  t_cancel=$(now)
  echo "    cancelled $cancelled backend(s) on n1"
  bg_wait f_group
  check "shuffle_on_group fails with an ERROR within ${bound}s of the cancel on n1" failed_in_time f_group "$t_cancel"
  check "... and the statement failed on every node" detail_names f_group 0 1 2
  for i in 0 1 2; do check "n$i is clean afterwards" clean_after "$i"; done
else
  fail "the long shuffle never showed progress on n1"
fi
bg_wait f_group

t0=$(now)
bg f_direct0 0 "$(long_shuffle gt 7002)"
bg f_direct1 1 "$(long_shuffle gt 7002)"
bg f_direct2 2 "SET statement_timeout = '3s'" "$(long_shuffle gt 7002)"
for i in 0 1 2; do bg_wait "f_direct$i"; done
for i in 0 1 2; do
  check "statement_timeout 3s on n2: n$i's shuffle fails with an ERROR within ${bound}s" failed_in_time "f_direct$i" "$t0"
done
grep -q 'statement timeout' "$work/f_direct2.err" && pass "n2's error is its statement timeout" ||
  fail "n2's error is not its statement timeout: $(cat "$work/f_direct2.err")"
for i in 0 1 2; do check "n$i is clean afterwards" clean_after "$i"; done

################################################################################################
case_title "g. a node nobody listens for; a node that never joins. h. a node with another secret (at once)"
# All of g and h run at the same time (each failure takes up to the 10 s a node waits here for
# its peers to join); they use different groups and ids.
unreachable="host=127.0.0.1 port=$((base + 9)) dbname=postgres user=postgres"
for i in 0 1; do
  sql "$i" -c "SELECT slipstream.create_peer_group('gu', ARRAY['$(conninfo_of 0)', '$(conninfo_of 1)', '$unreachable'], $i, '$secret')" >/dev/null
done
for i in 0 1 2; do
  s=$secret; [ "$i" = 2 ] && s="another-$secret"
  sql "$i" -c "SELECT slipstream.create_peer_group('gh', $nodes_sql, $i, '$s')" >/dev/null
done
count_of() { echo "SELECT count(*) FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text' "$@")"; }
t0=$(now)
bg g_group 0 "SELECT * FROM slipstream.shuffle_on_group('gu', \$s\$$(count_of gu)\$s\$)"
for i in 0 1; do bg "g_direct$i" "$i" "$(count_of gu 7003)"; done
for i in 0 1; do bg "g_absent$i" "$i" "$(count_of g 7004)"; done
bg h_group 0 "SELECT * FROM slipstream.shuffle_on_group('gh', \$s\$$(count_of gh)\$s\$)"
for i in 0 1 2; do bg "h_direct$i" "$i" "$(count_of gh 7005)"; done
for c in g_group g_direct0 g_direct1 g_absent0 g_absent1 h_group h_direct0 h_direct1 h_direct2; do bg_wait "$c"; done
echo " g. unreachable node (port $((base + 9)), nothing listens):"
check "shuffle_on_group over a group with an unreachable node fails with an ERROR within ${bound}s" failed_in_time g_group "$t0"
check "... and the error has a HINT ($(grep -m1 HINT "$work/g_group.err" || true))" grep -q HINT "$work/g_group.err"
for i in 0 1; do
  check "direct shuffle on n$i over the unreachable node fails with an ERROR within ${bound}s" failed_in_time "g_direct$i" "$t0"
  check "... with a HINT ($(grep -m1 HINT "$work/g_direct$i.err" || true))" grep -q HINT "$work/g_direct$i.err"
done
echo " g. n2 never joins shuffle 7004:"
for i in 0 1; do
  check "n$i fails with an ERROR within ${bound}s" failed_in_time "g_absent$i" "$t0"
  check "... with a HINT ($(grep -m1 HINT "$work/g_absent$i.err" || true))" grep -q HINT "$work/g_absent$i.err"
done
echo " h. n2's group 'gh' has another secret:"
check "shuffle_on_group fails with an ERROR within ${bound}s" failed_in_time h_group "$t0"
for i in 0 1 2; do
  check "direct shuffle on n$i fails with an ERROR within ${bound}s" failed_in_time "h_direct$i" "$t0"
done
check "the errors name the authentication ($(cat "$work"/h_*.err | grep -m1 -iE 'authenticat|secret' | cut -c1-200))" \
  grep -qiE 'authenticat|secret' "$work"/h_*.err
for i in 0 1 2; do check "n$i is clean afterwards" clean_after "$i"; done

################################################################################################
if [ "${SHUFFLE_SLOW_NODE:-0}" = 1 ]; then
  case_title "i. (SHUFFLE_SLOW_NODE=1) a node whose query takes 75 s before its first row"
  t0=$(now)
  bg i_slow0 0 "SELECT count(*) FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text' gt 7200)"
  bg i_slow1 1 "SELECT count(*) FROM $(shuffle_call 'SELECT k, v FROM src' k 'k int, v text' gt 7200)"
  bg i_slow2 2 "SELECT count(*) FROM $(shuffle_call 'SELECT k, v FROM src WHERE (SELECT true FROM pg_sleep(75))' k 'k int, v text' gt 7200)"
  for i in 0 1 2; do bg_wait "i_slow$i"; done
  for i in 0 1 2; do
    echo "    n$i after $(elapsed "$t0" "$(cat "$work/i_slow$i.end")")s: $(cat "$work/i_slow$i.out" "$work/i_slow$i.err" | head -1)"
    check "n$i's shuffle waits for the slow node and completes" eq "$(cat "$work/i_slow$i.rc")" 0
  done
fi

################################################################################################
echo
for i in 0 1 2; do
  crashes=$(grep -cE 'terminated by signal|PANIC|TRAP' "${dirs[$i]}/server.log" || true)
  [ "$i" != 0 ] && [ "$crashes" -gt 0 ] && echo "  (n$i's log: $crashes lines of crashes, the SIGKILLs of case e included)"
  [ "$i" = 0 ] && { [ "$crashes" = 0 ] && pass "n0 never crashed" || fail "n0's server log shows a crash: $(grep -m1 -E 'terminated by signal|PANIC|TRAP' "${dirs[0]}/server.log")"; }
done
echo "$(($(date +%s) - started)) s in all"
if [ "$failures" != 0 ]; then
  echo "shuffle test FAILED: $failures check(s)" >&2
  exit 1
fi
echo "shuffle test passed"
