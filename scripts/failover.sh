#!/usr/bin/env bash
# failover.sh: a slipstream failover by hand, for clusters that Patroni does not run
# (docs/failover.md, "Without Patroni"). The same steps as Patroni's hooks in the tailwind mode:
#
#   1. fence: every backup given stops serving (slipstream.stop_serving(): each primary
#      connection closed, the open buffers written into pg_wal). A primary that is still alive
#      can then acknowledge no remote_memory or remote_flush commit, since no backup takes its
#      writes; a backup that cannot be reached is not fenced and not a candidate.
#   2. choose: the fenced backup that holds the most WAL (slipstream.backup's held_lsn) among
#      those that can take over (an importing backup must be promotable, see
#      slipstream.index_import); ties go to the first given.
#   3. promote it: slipstream.promote().
#   4. re-point the others: a backup of the old timeline is refused by the new primary, so every
#      other backup given with --datadir is seeded again from the new primary
#      (scripts/seed_backup.sh, keeping its port, sockets, listen addresses, engine mode and
#      replay settings), started, made to serve at its address, and added on the new primary
#      (add_backup, Send-Index if it imported before); for one without --datadir (another host)
#      the commands to run there are printed instead.
#   5. the old primary, given with --old-primary and --datadir, is stopped if it still runs and
#      becomes a fresh backup of the new primary in the same way.
#
#   scripts/failover.sh --secret-file FILE [--transport tcp|shm] [--lz4] [--buffers N]
#       [--buffer-size SIZE] [--wait SECONDS]
#       --backup NAME --conn CONNINFO --serve HOST:PORT [--datadir DIR] [--log FILE]
#       [--backup NAME ...]... [--old-primary NAME --serve HOST:PORT --datadir DIR [--log FILE]]
#
# --conn, --serve, --datadir and --log belong to the --backup or --old-primary before them.
# CONNINFO reaches the backup as a superuser or slipstream_admin member (with the replication
# privilege, to seed from it once promoted); FILE holds the backups' shared secret. --log is the
# server log of a node this script starts (default: server.log beside its data directory).
# Nodes with a --datadir are local: this runs their pg_ctl and seeds as the postgres OS user.
# Prints "promoted NAME at LSN" and exits 0 once every local node serves the new primary;
# exits 1 if no backup could take over (nothing was promoted) or a later step failed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}

secret_file=""
transport=tcp
lz4=false
buffers=8
buffer_size=8MB
wait_seconds=60
names=() conns=() serves=() datadirs=() logs=()
old_name="" old_serve="" old_datadir="" old_log=""
target=""  # which node the next --conn/--serve/--datadir/--log belongs to: backup or old

usage() {
  sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() { echo "failover.sh: $*" >&2; exit 1; }

# Sets field $1 of the node the options currently describe to $2.
set_field() {
  local field=$1 value=$2 i=$((${#names[@]} - 1))
  case "$target" in
    backup)
      case "$field" in
        conn) conns[$i]=$value ;; serve) serves[$i]=$value ;;
        datadir) datadirs[$i]=$value ;; log) logs[$i]=$value ;;
      esac ;;
    old)
      case "$field" in
        conn) ;; serve) old_serve=$value ;; datadir) old_datadir=$value ;; log) old_log=$value ;;
      esac ;;
    *) echo "failover.sh: --$field before any --backup or --old-primary" >&2; usage ;;
  esac
}

while [ $# -gt 0 ]; do
  case "$1" in
    --secret-file) secret_file=${2:?}; shift 2 ;;
    --transport) transport=${2:?}; shift 2 ;;
    --lz4) lz4=true; shift ;;
    --buffers) buffers=${2:?}; shift 2 ;;
    --buffer-size) buffer_size=${2:?}; shift 2 ;;
    --wait) wait_seconds=${2:?}; shift 2 ;;
    --backup)
      names+=("${2:?}"); conns+=(""); serves+=(""); datadirs+=(""); logs+=("")
      target=backup; shift 2 ;;
    --old-primary) old_name=${2:?}; target=old; shift 2 ;;
    --conn|--serve|--datadir|--log) set_field "${1#--}" "${2:?}"; shift 2 ;;
    -h|--help) usage ;;
    *) echo "failover.sh: unknown argument $1" >&2; usage ;;
  esac
done
[ -n "$secret_file" ] && [ "${#names[@]}" -gt 0 ] || usage
[ -r "$secret_file" ] || die "cannot read the secret file $secret_file"
secret=$(head -1 "$secret_file")
[ -n "$secret" ] || die "the secret file $secret_file is empty"
case "$transport" in tcp|shm) ;; *) die "transport is tcp or shm, not $transport" ;; esac
for i in "${!names[@]}"; do
  [ -n "${conns[$i]}" ] && [ -n "${serves[$i]}" ] || die "backup ${names[$i]} needs --conn and --serve"
done
if [ -n "$old_name" ] && { [ -z "$old_serve" ] || [ -z "$old_datadir" ]; }; then
  die "the old primary $old_name needs --serve and --datadir"
fi

as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }

# psql on backup $1 (an index), quiet and unaligned; the rest are psql arguments.
bsql() {
  local i=$1
  shift
  PGCONNECT_TIMEOUT=5 "$PGBIN/psql" -X -qAt -v ON_ERROR_STOP=1 -d "${conns[$i]}" "$@"
}

# Prints a pg_lsn as a number, for comparing.
lsn_number() { local hi=${1%/*} lo=${1#*/}; echo $(( (16#$hi << 32) | 16#$lo )); }

# Quotes $1 as an SQL literal.
literal() { printf "'%s'" "${1//\'/\'\'}"; }

# 1. Fence every backup that answers.
fenced=()
for i in "${!names[@]}"; do
  if out=$(bsql "$i" -c "SELECT slipstream.stop_serving()" 2>&1); then
    fenced+=("$i")
    echo "fenced ${names[$i]} (it served: $out)"
  else
    echo "could not fence ${names[$i]}: it is not a candidate ($out)" >&2
  fi
done
[ "${#fenced[@]}" -gt 0 ] || die "no backup could be fenced; nothing was promoted"

# 2. Choose the candidate holding the most WAL.
best="" best_lsn=-1
for i in "${fenced[@]}"; do
  row=$(bsql "$i" -F ' ' -c "SELECT standby, coalesce(held_lsn, replay_lsn, '0/0')
                              FROM slipstream.backup") || { echo "${names[$i]} does not answer any more" >&2; continue; }
  read -r standby held <<<"$row"
  if [ "$standby" != t ]; then
    echo "${names[$i]} is not a standby: not a candidate" >&2
    continue
  fi
  promotable=$(bsql "$i" -c "SELECT promotable FROM slipstream.index_import") || promotable=""
  if [ "$promotable" = f ]; then
    echo "${names[$i]} imports levels that its WAL does not cover yet: not a candidate" >&2
    continue
  fi
  echo "${names[$i]} holds WAL up to $held"
  n=$(lsn_number "$held")
  if [ "$n" -gt "$best_lsn" ]; then best=$i; best_lsn=$n; fi
done
[ -n "$best" ] || die "no fenced backup can take over; nothing was promoted"

# 3. Promote it.
promoted_at=$(bsql "$best" -c "SELECT slipstream.promote($wait_seconds)") ||
  die "the promotion of ${names[$best]} failed"
echo "promoted ${names[$best]} at $promoted_at"
primary_conn=${conns[$best]}
primary_datadir=$(bsql "$best" -c "SHOW data_directory") || primary_datadir=""

# Seeds node $1 (name) with data directory $2, server log $3 and serve address $4 again from
# the new primary, keeping the settings in $5 (lines for postgresql.conf) and importing if $6 is
# send_index; starts it, makes it serve and adds it on the new primary.
reseed() {
  local name=$1 datadir=$2 log=$3 serve=$4 settings=$5 shipping=$6 line args=()
  while IFS= read -r line; do [ -n "$line" ] && args+=(--set "$line"); done <<<"$settings"
  [ "$shipping" = send_index ] && args+=(--send-index)
  # The directory is removed below: it must be a PostgreSQL data directory, and not the one the
  # new primary runs in (a --datadir given to the wrong node).
  if [ -e "$datadir" ] && [ ! -f "$datadir/PG_VERSION" ]; then
    echo "$name: $datadir is not a PostgreSQL data directory; not seeded again" >&2
    return 1
  fi
  if [ "$(readlink -f "$datadir")" = "$(readlink -f "$primary_datadir")" ]; then
    echo "$name: $datadir is the data directory of the new primary ${names[$best]}; not seeded again" >&2
    return 1
  fi
  if [ -f "$datadir/postmaster.pid" ]; then
    as_postgres "$PGBIN/pg_ctl" -D "$datadir" -m fast -w -t "$wait_seconds" stop >/dev/null 2>&1 ||
      as_postgres "$PGBIN/pg_ctl" -D "$datadir" -m immediate -w -t "$wait_seconds" stop >/dev/null 2>&1 || true
  fi
  as_postgres rm -rf "$datadir"
  as_postgres "$root/scripts/seed_backup.sh" --connstring "$primary_conn" --datadir "$datadir" \
    --name "$name" "${args[@]}" >/dev/null
  as_postgres "$PGBIN/pg_ctl" -D "$datadir" -l "$log" -w -t "$wait_seconds" start >/dev/null
  local host
  host=$(settings_value "$settings" unix_socket_directories)
  host=${host%%,*}
  [ -n "$host" ] || { host=$(settings_value "$settings" listen_addresses); host=${host%%,*}; }
  local conn="host=${host:-127.0.0.1} port=$(settings_value "$settings" port) user=postgres dbname=postgres"
  # The address may still be held for a moment by the node's previous incarnation.
  local attempt out
  for attempt in $(seq 1 40); do
    out=$(PGCONNECT_TIMEOUT=5 "$PGBIN/psql" -X -qAt -v ON_ERROR_STOP=1 -d "$conn" \
      -c "SELECT slipstream.serve_backup($(literal "$serve"), $(literal "$secret"), $buffers, $(literal "$buffer_size"))" 2>&1) && break
    [[ "$out" == *"already in use"* ]] || { echo "$name cannot serve at $serve: $out" >&2; return 1; }
    sleep 0.25
  done
  add_to_primary "$name" "$serve" "$shipping"
}

# Prints the value of setting $2 in the postgresql.conf lines $1 (quotes removed).
settings_value() {
  sed -n "s/^$2 = '\{0,1\}\([^']*\)'\{0,1\}\$/\1/p" <<<"$1" | tail -1
}

# Adds backup $1 at $2 with shipping $3 on the new primary (replacing a configuration of that
# name) and waits until it streams.
add_to_primary() {
  local name=$1 serve=$2 shipping=$3 node_lz4=false
  [ "$shipping" = send_index ] && node_lz4=$lz4
  "$PGBIN/psql" -X -qAt -v ON_ERROR_STOP=1 -d "$primary_conn" \
    -c "SELECT slipstream.drop_backup(name) FROM slipstream.replication WHERE name = $(literal "$name")" \
    -c "SELECT slipstream.add_backup($(literal "$name"), $(literal "$serve"), '$transport', $(literal "$secret"), '$shipping', $node_lz4)" >/dev/null
  local end=$((SECONDS + wait_seconds)) state=""
  while [ "$SECONDS" -lt "$end" ]; do
    state=$("$PGBIN/psql" -X -qAt -d "$primary_conn" \
      -c "SELECT state || coalesce(': ' || error, '') FROM slipstream.replication WHERE name = $(literal "$name")")
    [ "$state" = streaming ] && { echo "$name serves ${names[$best]} as a backup ($shipping)"; return 0; }
    sleep 0.2
  done
  echo "$name does not stream from ${names[$best]} after $wait_seconds s: $state" >&2
  return 1
}

# The settings a node keeps across its re-seed (the rest comes from the new primary's copy).
kept_settings=(port unix_socket_directories listen_addresses slipstream.backup_engine
               slipstream.backup_replay slipstream.backup_replay_lag)

# Prints the kept settings of the running node reached by CONNINFO $1, as postgresql.conf lines.
node_settings() {
  local list
  list=$(printf "'%s'," "${kept_settings[@]}")
  "$PGBIN/psql" -X -qAt -v ON_ERROR_STOP=1 -d "$1" -c "
    SELECT name || ' = ' || CASE WHEN setting ~ '^[0-9]+$' THEN setting
                                 ELSE quote_literal(setting) END FROM pg_settings
     WHERE name IN (${list%,}) ORDER BY name"
}

# Prints the kept settings of the node with data directory $1 from its configuration files
# (it need not run), as postgresql.conf lines.
file_settings() {
  local s v
  for s in "${kept_settings[@]}"; do
    v=$(as_postgres "$PGBIN/postgres" -D "$1" -C "$s" 2>/dev/null) || continue
    if [[ "$v" =~ ^[0-9]+$ ]]; then echo "$s = $v"; elif [ -n "$v" ]; then echo "$s = '$v'"; fi
  done
  return 0
}

# 4. Re-point the other fenced backups (seed them again), or say how.
status=0
for i in "${!names[@]}"; do
  [ "$i" = "$best" ] && continue
  if [ -z "${datadirs[$i]}" ]; then
    echo "${names[$i]} has no --datadir here: on its host, seed it again from ${names[$best]}:"
    echo "  scripts/seed_backup.sh --connstring '$primary_conn' --datadir DIR --name ${names[$i]} [--send-index]"
    echo "  then SELECT slipstream.serve_backup('${serves[$i]}', ...) there and add_backup on ${names[$best]}"
    continue
  fi
  settings=$(node_settings "${conns[$i]}" 2>/dev/null) || settings=$(file_settings "${datadirs[$i]}")
  [ -n "$(settings_value "$settings" port)" ] ||
    { echo "cannot read the settings of ${names[$i]}; not seeded again" >&2; status=1; continue; }
  shipping=build_index
  grep -q "^slipstream.backup_engine = 'import'" <<<"$settings" && shipping=send_index
  reseed "${names[$i]}" "${datadirs[$i]}" "${logs[$i]:-$(dirname "${datadirs[$i]}")/server.log}" \
    "${serves[$i]}" "$settings" "$shipping" || status=1
done

# 5. The old primary becomes a fresh backup. Its settings come from its configuration files
# (it is down, or stopped here), as postgres -C reads them.
if [ -n "$old_name" ]; then
  if [ -f "$old_datadir/postmaster.pid" ]; then
    as_postgres "$PGBIN/pg_ctl" -D "$old_datadir" -m immediate -w -t "$wait_seconds" stop >/dev/null 2>&1 || true
  fi
  settings=$(file_settings "$old_datadir" | grep -v '^slipstream.backup_engine')
  # It imports if the node promoted did (a backup like the others).
  shipping=build_index
  [ "$(bsql "$best" -c "SHOW slipstream.backup_engine" 2>/dev/null)" = import ] && shipping=send_index
  settings+=$'\n'"slipstream.backup_engine = '$([ "$shipping" = send_index ] && echo import || echo replay)'"
  reseed "$old_name" "$old_datadir" "${old_log:-$(dirname "$old_datadir")/server.log}" \
    "$old_serve" "$settings" "$shipping" || status=1
fi
exit "$status"
