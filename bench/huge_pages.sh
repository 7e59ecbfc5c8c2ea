# huge_pages.sh: sourced by the PostgreSQL benchmarks (bench/ycsb_pg.sh, bench/pgbench_pair.sh).
# Puts the benchmark's cluster on 2-MB huge pages, as PostgreSQL's documentation advises for a
# server with gigabytes of shared memory, or explicitly on 4-kB pages.
#
# Why it matters here (docs/benchmarks.md, "F's gap is 4-kB pages"): slipstream's arena (row
# cache ring, memtables, log buffers, chain cache) is hundreds of MB of shared memory whose
# pages every backend touches as the rings go round. On 4-kB pages each backend takes a page
# fault the first time it touches each page and a TLB miss on most accesses; heap touches a few
# hot buffers a transaction and barely notices. Both tables of a run share the one setting.
#
# Modes (the benchmark's --huge-pages=): on (fail unless the pages can be had), off (4-kB
# pages), auto (on if the pages can be had, else off, said so). As root, the number of reserved
# pages (vm.nr_hugepages) is raised to what the cluster needs and put back on exit.

huge_pages_raised_from=""
huge_pages_in_use=""

# Runs a command as the postgres OS user.
huge_pages_as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

# Huge pages free and not promised to a running server.
huge_pages_free() {
  awk '/^HugePages_Free:/ { f = $2 } /^HugePages_Rsvd:/ { r = $2 } END { print f - r }' /proc/meminfo
}

# Appends "huge_pages = VALUE" to the configuration of the cluster in DIR.
huge_pages_set() {
  echo "huge_pages = $2" | huge_pages_as_postgres tee -a "$1/data/postgresql.conf" >/dev/null
  huge_pages_in_use=$2
}

# Chooses the page size for MODE in the stopped cluster DIR's configuration, reserving huge
# pages first if needed; sets huge_pages_in_use to "on" or "off". Not for a subshell: the
# reservation it records is what huge_pages_release gives back.
huge_pages_prepare() {
  local dir=$1 mode=$2 need free total
  case "$mode" in
    off) huge_pages_set "$dir" off; return 0 ;;
    on | auto) ;;
    *) echo "--huge-pages is on, off or auto, not $mode" >&2; return 2 ;;
  esac
  # PostgreSQL computes the pages its shared memory needs (with slipstream's arena) itself.
  need=$(huge_pages_as_postgres /usr/lib/postgresql/15/bin/postgres -D "$dir/data" \
    -C shared_memory_size_in_huge_pages 2>/dev/null || echo 0)
  free=$(huge_pages_free)
  if [ "${need:-0}" -gt 0 ] && [ "$free" -lt "$need" ] && [ "$(id -u)" = 0 ] &&
    [ -w /proc/sys/vm/nr_hugepages ]; then
    total=$(cat /proc/sys/vm/nr_hugepages)
    echo $((total + need - free)) >/proc/sys/vm/nr_hugepages 2>/dev/null || true
    [ -z "$huge_pages_raised_from" ] && huge_pages_raised_from=$total
    free=$(huge_pages_free)
  fi
  if [ "${need:-0}" -gt 0 ] && [ "$free" -ge "$need" ]; then
    huge_pages_set "$dir" on
    return 0
  fi
  if [ "$mode" = on ]; then
    echo "--huge-pages=on: the cluster needs ${need:-?} huge pages and $free are free;" \
      "reserve them (sysctl vm.nr_hugepages) or run with --huge-pages=off" >&2
    return 1
  fi
  echo "(--huge-pages=auto: ${need:-?} huge pages needed, $free free: running on 4-kB pages)" >&2
  huge_pages_set "$dir" off
}

# Gives back the pages huge_pages_prepare reserved; call after the cluster has stopped.
huge_pages_release() {
  if [ -n "$huge_pages_raised_from" ]; then
    echo "$huge_pages_raised_from" >/proc/sys/vm/nr_hugepages 2>/dev/null || true
    huge_pages_raised_from=""
  fi
}
