#!/usr/bin/env bash
# pg_core_regress.sh: PostgreSQL's own core regression suite (src/test/regress, parallel_schedule)
# run twice, on plain heap (the baseline) and with default_table_access_method = slipstream, each
# in its own private cluster started through scripts/pg_cluster.sh (postgres OS user, loopback
# port, private socket directory; the system cluster is never touched). Run it as root or as
# postgres, after `make install`:
#
#   scripts/pg_core_regress.sh [scratch dir]        (default /tmp/pg-core-regress)
#
# Environment: PGSRC (directory holding postgresql-15_*.orig.tar.bz2, default /tmp/pgsrc; when
# it has no tarball the Debian source package is downloaded there as /work/shared/NOTES.md
# describes), HEAP_PORT / SLIP_PORT (default 55490 / 55491), RUN_TIMEOUT (seconds per run,
# default 750), STATEMENT_TIMEOUT (postgresql.conf statement_timeout of both clusters so a hung
# statement fails its test instead of stalling the run, default 180s). Both clusters also run
# with fsync = off (nothing in the suite depends on it; it spares the shared disk).
#
# What it does: extracts src/test/regress and contrib/spi from the tarball into the scratch
# directory, builds regress.so, refint.so and autoinc.so against the installed server headers,
# initialises two clusters (heap: no slipstream at all; slipstream: shared_preload_libraries,
# CREATE EXTENSION slipstream in template1, default_table_access_method = slipstream), creates
# the database `regression` from template1 with the settings pg_regress itself would give it,
# checks that a table created there gets the expected access method, runs pg_regress
# --use-existing --schedule=parallel_schedule on each cluster one after the other, and prints
# per-test results for both and a summary. Outputs stay in the scratch directory:
#   <scratch>/{heap,slipstream}/out/regression.{out,diffs}, results/   pg_regress output
#   <scratch>/{heap,slipstream}/pg_regress.log                          pg_regress console output
#   <scratch>/{heap,slipstream}/cluster/server.log                      server logs (clusters stopped)
#   <scratch>/slipstream/only/<test>.diff                               diffs of slipstream-only failures
#   <scratch>/results.tsv                                               test, heap, slipstream, note
# A test counts as passed when pg_regress says ok (or "failed (ignored)" for `random`). For a
# test failing on both, the summary says whether heap and slipstream produced the same output.
# Exit status 0 when both runs completed, whatever the test results; 1 otherwise.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-/tmp/pg-core-regress}
case "$scratch" in /*/*) ;; *) echo "scratch directory must be an absolute path below /: $scratch" >&2; exit 2 ;; esac
pgsrc=${PGSRC:-/tmp/pgsrc}
heap_port=${HEAP_PORT:-55490}
slip_port=${SLIP_PORT:-55491}
run_timeout=${RUN_TIMEOUT:-750}
statement_timeout=${STATEMENT_TIMEOUT:-180s}
pgbin=${PGBIN:-/usr/lib/postgresql/15/bin}
pg_regress="$(dirname "$(dirname "$(pg_config --pgxs)")")/test/regress/pg_regress"
cluster_sh="$root/scripts/pg_cluster.sh"

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
log() { printf '== %s\n' "$*" >&2; }

# --- sources ---------------------------------------------------------------------------------
fetch_sources() {
  log "no PostgreSQL 15 source tarball in $pgsrc: downloading the Debian source package"
  mkdir -p "$pgsrc/lists/partial"
  # First stanza only (the security suite serves no sources); the system's apt configuration
  # is left alone: lists and sources live in $pgsrc.
  sed -e '/^$/q' -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
    >"$pgsrc/src.sources"
  local o=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$pgsrc"
    -o "Dir::State::Lists=$pgsrc/lists")
  (cd "$pgsrc" && apt-get "${o[@]}" update && apt-get "${o[@]}" source --download-only postgresql-15)
}

find_tarball() {
  [ -d "$pgsrc" ] || return 0
  find "$pgsrc" -maxdepth 1 -name 'postgresql-15_*.orig.tar.bz2' | sort -V | tail -1
}
tarball=$(find_tarball)
if [ -z "$tarball" ]; then
  fetch_sources
  tarball=$(find_tarball)
  [ -n "$tarball" ] || { echo "no postgresql-15 source tarball in $pgsrc" >&2; exit 1; }
fi
version=$(basename "$tarball" | sed 's/^postgresql-15_\(.*\)\.orig\.tar\.bz2$/\1/')
top="postgresql-$version"

# Stop clusters left running by an earlier, interrupted run before wiping the scratch directory.
for c in heap slipstream; do
  if [ -f "$scratch/$c/cluster/data/postmaster.pid" ]; then
    "$cluster_sh" stop "$scratch/$c/cluster" immediate || true
  fi
done
rm -rf "$scratch"
mkdir -p "$scratch/src" "$scratch/lib"
log "extracting $top/src/test/regress and $top/contrib/spi from $tarball"
tar -xjf "$tarball" -C "$scratch/src" "$top/src/test/regress" "$top/contrib/spi"
regress="$scratch/src/$top/src/test/regress"

log "building regress.so, refint.so, autoinc.so against $(pg_config --includedir-server)"
cflags=$(pg_config --cflags)
for f in "$regress/regress.c" "$scratch/src/$top/contrib/spi/refint.c" \
  "$scratch/src/$top/contrib/spi/autoinc.c"; do
  # shellcheck disable=SC2086  # pg_config prints a list of flags
  gcc $cflags -fPIC -shared -I"$(pg_config --includedir-server)" \
    -o "$scratch/lib/$(basename "$f" .c).so" "$f"
done
# The server reads data files (COPY ... FROM :abs_srcdir/data/...) and loads the libraries;
# pg_regress writes results only to the output directories, which postgres owns.
chmod -R a+rX "$scratch"

# --- clusters ----------------------------------------------------------------------------------
common_conf=("statement_timeout = '$statement_timeout'" "fsync = off")
cluster_dir() { echo "$scratch/$1/cluster"; }

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  for c in heap slipstream; do
    if [ -f "$(cluster_dir "$c")/data/postmaster.pid" ]; then
      "$cluster_sh" stop "$(cluster_dir "$c")" immediate || true
    fi
  done
}
trap cleanup EXIT

setup_cluster() {
  local name=$1 port=$2 dir
  dir=$(cluster_dir "$name")
  mkdir -p "$scratch/$name"
  if [ "$name" = heap ]; then
    # Plain heap: the later line overrides pg_cluster.sh's shared_preload_libraries.
    "$cluster_sh" init "$dir" "$port" "${common_conf[@]}" "shared_preload_libraries = ''"
  else
    "$cluster_sh" init "$dir" "$port" "${common_conf[@]}" \
      "default_table_access_method = slipstream"
  fi
  "$cluster_sh" start "$dir"
  if [ "$name" = slipstream ]; then
    "$cluster_sh" psql "$dir" -q -d template1 -c "CREATE EXTENSION slipstream"
  fi
  # What pg_regress's create_database() does, but from template1 (which carries the extension).
  "$cluster_sh" psql "$dir" -q -d postgres \
    -c "CREATE DATABASE regression TEMPLATE=template1" \
    -c "ALTER DATABASE regression SET lc_messages TO 'C'" \
    -c "ALTER DATABASE regression SET lc_monetary TO 'C'" \
    -c "ALTER DATABASE regression SET lc_numeric TO 'C'" \
    -c "ALTER DATABASE regression SET lc_time TO 'C'" \
    -c "ALTER DATABASE regression SET bytea_output TO 'hex'" \
    -c "ALTER DATABASE regression SET timezone_abbreviations TO 'Default'"
  local am
  am=$("$cluster_sh" psql "$dir" -qAt -d regression \
    -c "CREATE TABLE relam_probe (i int)" \
    -c "SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE c.relname = 'relam_probe'" \
    -c "DROP TABLE relam_probe")
  log "$name: a new table in database regression uses access method '$am'"
  local want=heap
  [ "$name" = slipstream ] && want=slipstream
  if [ "$am" != "$want" ]; then
    echo "expected access method $want, got '$am'" >&2
    exit 1
  fi
}

run_suite() {
  local name=$1 port=$2 out="$scratch/$1/out" dir status=0
  dir=$(cluster_dir "$name")
  mkdir -p "$out"
  [ "$(id -u)" = 0 ] && chown postgres: "$out"
  log "$name: running parallel_schedule (timeout ${run_timeout}s)"
  local start=$SECONDS
  # pg_regress runs from inside the output directory so nothing is written elsewhere.
  (cd "$out" && as_postgres timeout -k 30 "$run_timeout" "$pg_regress" \
    --use-existing --host="$dir/sock" --port="$port" --user=postgres \
    --bindir="$pgbin" --inputdir="$regress" --outputdir="$out" --dlpath="$scratch/lib" \
    --max-concurrent-tests=20 --schedule="$regress/parallel_schedule" \
    >"$scratch/$name/pg_regress.log" 2>&1) || status=$?
  echo "$status" >"$scratch/$name/status"
  echo "$((SECONDS - start))" >"$scratch/$name/seconds"
  log "$name: pg_regress exit status $status after $((SECONDS - start))s"
  if [ "$status" = 124 ] || [ "$status" = 137 ]; then
    log "$name: run timed out; tests not reached count as not run; active backends:"
    timeout 30 "$cluster_sh" psql "$dir" -d postgres -c \
      "SELECT pid, backend_type, wait_event_type, wait_event, now() - query_start AS running,
              left(regexp_replace(query, '\s+', ' ', 'g'), 80) AS query
       FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() ORDER BY pid" \
      2>&1 | tee "$scratch/$name/active_at_timeout.txt" >&2 || true
  fi
  # Tables of the finished run, by access method (shows that the suite's tables use ours).
  timeout 60 "$cluster_sh" psql "$dir" -qAt -F ' ' -d regression -c \
    "SELECT a.amname, c.relkind, count(*) FROM pg_class c JOIN pg_am a ON a.oid = c.relam
     WHERE c.relkind IN ('r', 'm', 't') AND c.relnamespace <> 'pg_catalog'::regnamespace
       AND c.relnamespace NOT IN ('pg_toast'::regnamespace, 'information_schema'::regnamespace)
     GROUP BY 1, 2 ORDER BY 1, 2" >"$scratch/$name/relams.txt" 2>&1 || true
  # Server crashes and their causes.
  grep -E 'terminated by signal|was terminated by|PANIC|TRAP:|server process .* exited with exit code' \
    "$dir/server.log" >"$scratch/$name/crashes.txt" || true
  # A backend stuck in an engine wait ignores the fast shutdown's SIGTERM: fall back to immediate.
  timeout 60 "$cluster_sh" stop "$dir" fast || "$cluster_sh" stop "$dir" immediate || true
}

# --- run -----------------------------------------------------------------------------------------
setup_cluster heap "$heap_port"
run_suite heap "$heap_port"
setup_cluster slipstream "$slip_port"
run_suite slipstream "$slip_port"

# --- results -------------------------------------------------------------------------------------
# Every test of the schedule, in schedule order.
tests=$(sed -n 's/^test: *//p' "$regress/parallel_schedule" | tr -s ' ' '\n' | grep -v '^$')

# Prints "<test> <ok|FAILED|ignored>" for each status line of a pg_regress output.
parse() {
  sed -n -E 's/^(test +| +)([A-Za-z0-9_.]+) +\.\.\. (.*)$/\2 \3/p' "$1" | while read -r t rest; do
    case "$rest" in
      *"failed (ignored)"*) echo "$t ignored" ;;
      *FAILED*) echo "$t FAILED" ;;
      ok*) echo "$t ok" ;;
      *) echo "$t FAILED" ;;
    esac
  done
}
parse "$scratch/heap/pg_regress.log" >"$scratch/heap/parsed"
parse "$scratch/slipstream/pg_regress.log" >"$scratch/slipstream/parsed"
result_of() { awk -v t="$2" '$1 == t { r = $2 } END { print (r == "" ? "not-run" : r) }' "$1"; }

total=0 heap_ok=0 slip_ok=0 only_slip=0 only_heap=0 both_fail=0 both_same=0
only_slip_list=""
# Per-test diffs of the tests failing only on slipstream: <scratch>/slipstream/only/<test>.diff
mkdir -p "$scratch/slipstream/only"
printf '%-28s %-10s %-10s\n' test heap slipstream
printf 'test\theap\tslipstream\tnote\n' >"$scratch/results.tsv"
for t in $tests; do
  h=$(result_of "$scratch/heap/parsed" "$t")
  s=$(result_of "$scratch/slipstream/parsed" "$t")
  total=$((total + 1))
  # A failure pg_regress ignores (the schedule's `ignore: random`) counts as a pass.
  hp=0 sp=0
  case "$h" in ok | ignored) hp=1 heap_ok=$((heap_ok + 1)) ;; esac
  case "$s" in ok | ignored) sp=1 slip_ok=$((slip_ok + 1)) ;; esac
  mark=""
  if [ "$hp" = 1 ] && [ "$sp" = 0 ]; then
    only_slip=$((only_slip + 1)) mark="slipstream only"
    only_slip_list="$only_slip_list $t"
    awk -v t="results/$t.out" 'BEGIN { p = 0 } /^diff / { p = (index($0, t) > 0) } p' \
      "$scratch/slipstream/out/regression.diffs" >"$scratch/slipstream/only/$t.diff" || true
  elif [ "$hp" = 0 ] && [ "$sp" = 1 ]; then
    only_heap=$((only_heap + 1)) mark="heap only"
  elif [ "$hp" = 0 ] && [ "$sp" = 0 ]; then
    both_fail=$((both_fail + 1)) mark="both fail"
    # The expected file does not fit this server (version gap, environment); what matters is
    # whether slipstream's output equals heap's.
    if cmp -s "$scratch/heap/out/results/$t.out" "$scratch/slipstream/out/results/$t.out"; then
      both_same=$((both_same + 1)) mark="both fail, identical output"
    else
      mark="both fail, outputs differ"
    fi
  fi
  printf '%-28s %-10s %-10s%s\n' "$t" "$h" "$s" "${mark:+  <- $mark}"
  printf '%s\t%s\t%s\t%s\n' "$t" "$h" "$s" "$mark" >>"$scratch/results.tsv"
done

echo
echo "PostgreSQL sources $version, server $("$pgbin/postgres" --version | sed 's/^postgres (PostgreSQL) //')"
for c in heap slipstream; do
  echo "$c run: pg_regress exit status $(cat "$scratch/$c/status"), $(cat "$scratch/$c/seconds")s;" \
    "tables in database regression by access method and relkind: $(tr '\n' ';' <"$scratch/$c/relams.txt")"
  if [ -s "$scratch/$c/crashes.txt" ]; then
    echo "$c server log, crashes:"
    sed 's/^/  /' "$scratch/$c/crashes.txt"
  fi
done
echo "total tests:                 $total"
echo "passed on heap:              $heap_ok"
echo "passed on slipstream:        $slip_ok"
echo "failing only on slipstream:  $only_slip:$only_slip_list"
echo "failing only on heap:        $only_heap"
echo "failing on both:             $both_fail ($both_same of them with identical heap and slipstream output)"
echo "diffs: $scratch/heap/out/regression.diffs, $scratch/slipstream/out/regression.diffs;" \
  "slipstream-only ones per test in $scratch/slipstream/only/"

rc=0
for c in heap slipstream; do
  case "$(cat "$scratch/$c/status")" in 124 | 137) rc=1 ;; esac
done
exit "$rc"
