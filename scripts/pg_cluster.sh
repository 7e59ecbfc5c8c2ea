#!/usr/bin/env bash
# pg_cluster.sh: a private PostgreSQL 15 cluster with slipstream preloaded, run as the postgres
# OS user on a loopback port and a private socket directory (never the system cluster).
#
#   scripts/pg_cluster.sh init  DIR PORT [extra postgresql.conf lines...]
#   scripts/pg_cluster.sh start DIR
#   scripts/pg_cluster.sh stop  DIR [mode]
#   scripts/pg_cluster.sh kill  DIR          # SIGKILL the postmaster (crash tests)
#   scripts/pg_cluster.sh psql  DIR [psql args...]
# PGBIN picks another PostgreSQL 15 installation; SLIPSTREAM_SERVER_ENV (VAR=value words) is
# the environment of the server alone (the sanitizer runtime, scripts/pg_sanitize.sh), and
# SLIPSTREAM_EXTRA_CONF a postgresql.conf line added by init.
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
cmd=${1:?command}
dir=${2:?cluster directory}

as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi
}

port_of() { sed -n 's/^port = \([0-9]*\).*/\1/p' "$dir/data/postgresql.conf" | tail -1; }

case "$cmd" in
  init)
    port=${3:?port}
    shift 3
    # A server still running in DIR would outlive its removed directory and, when it noticed,
    # unlink the socket of the new one at the same path.
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$dir"
    mkdir -p "$dir/sock"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$dir"
    as_postgres "$PGBIN/initdb" -D "$dir/data" -U postgres -A trust --no-sync >"$dir/initdb.log"
    {
      echo "port = $port"
      echo "listen_addresses = ''"
      echo "unix_socket_directories = '$dir/sock'"
      echo "shared_preload_libraries = 'slipstream'"
      echo "max_connections = 40"
      echo "shared_buffers = 128MB"
      echo "slipstream.l0_size = 4MB"
      echo "max_prepared_transactions = 10"
      echo "log_min_messages = warning"
      [ -n "${SLIPSTREAM_EXTRA_CONF:-}" ] && echo "$SLIPSTREAM_EXTRA_CONF"
      for line in "$@"; do echo "$line"; done
    } | as_postgres tee -a "$dir/data/postgresql.conf" >/dev/null
    ;;
  start)
    # shellcheck disable=SC2086 # the words of SLIPSTREAM_SERVER_ENV are separate variables
    if ! as_postgres env ${SLIPSTREAM_SERVER_ENV:-} "$PGBIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 120 start >/dev/null; then
      # CI keeps only this output: show why the server did not start, and what still runs.
      echo "--- last lines of $dir/server.log:" >&2
      tail -n 25 "$dir/server.log" >&2 || true
      echo "--- processes of the postgres user:" >&2
      ps -u postgres -o pid,ppid,stat,etime,args >&2 || true
      exit 1
    fi
    ;;
  stop)
    as_postgres "$PGBIN/pg_ctl" -D "$dir/data" -m "${3:-fast}" -w -t 120 stop >/dev/null
    ;;
  kill)
    pid=$(head -1 "$dir/data/postmaster.pid")
    children=$(pgrep -P "$pid" || true)
    kill -9 "$pid"
    # Children notice the postmaster's death and exit; wait for every one of them.
    for _ in $(seq 1 300); do
      alive=0
      for c in $children; do kill -0 "$c" 2>/dev/null && alive=1; done
      [ "$alive" = 0 ] && break
      sleep 0.1
    done
    if [ "$alive" = 1 ]; then
      echo "children of the killed postmaster still run after 30 s:" >&2
      for c in $children; do
        if kill -0 "$c" 2>/dev/null; then ps -o pid,stat,wchan:24,args -p "$c" | tail -n +2 >&2; fi
      done
    fi
    true
    ;;
  psql)
    shift 2
    "$PGBIN/psql" -X -v ON_ERROR_STOP=1 -h "$dir/sock" -p "$(port_of)" -U postgres "$@"
    ;;
  *)
    echo "unknown command $cmd" >&2
    exit 2
    ;;
esac
