#!/usr/bin/env bash
# patroni_callback.sh: Patroni's hooks for the tailwind mode of scripts/patroni_cluster.sh, in
# which the replicas are slipstream Tailwind backups (docs/failover.md, "The Tailwind mode").
# Patroni runs it as the postgres OS user; it works on its own node through the node's socket.
#
#   patroni_callback.sh --env ENV --node NODE on_start|on_role_change|on_restart ROLE SCOPE
#       postgresql.callbacks (Patroni appends the last three words). A replica serves as a
#       backup (slipstream.serve_backup on its serve port) unless it does already; the leader
#       ships to every other member (slipstream.add_backup, if not configured yet) and starts
#       the reconciler below in the background.
#   patroni_callback.sh --env ENV --node NODE pre_promote
#       postgresql.pre_promote, on the node Patroni is about to promote, synchronously: fences
#       the old primary (slipstream.stop_serving(): every primary connection closed, the open
#       buffers written into pg_wal), waits until that is done and until replay reached the end
#       of pg_wal. A non-zero exit refuses the promotion (and the node serves again).
#   patroni_callback.sh --env ENV --node NODE reconcile [SECONDS]
#       on the leader, detached, until both backups stream (SECONDS at most, 900 by default):
#       keeps add_backup configured for every other member, and asks Patroni
#       (patronictl reinit --force) to re-seed a member whose backup refuses this leader (it
#       was seeded before a failover: another timeline, or a stale version) or that has not
#       streamed for 45 s; the member is seeded again by scripts/patroni_seed.sh.
#
# ENV is the scratch directory's tailwind.env (written by scripts/patroni_cluster.sh: members,
# ports, transport, buffers, the file holding the backups' secret). Each run appends what it
# does to NODE/callback.log in the scratch directory. Every action is idempotent.
set -uo pipefail

env_file=""
node=""
while [ $# -gt 0 ]; do
  case "$1" in
    --env) env_file=${2:?}; shift 2 ;;
    --node) node=${2:?}; shift 2 ;;
    *) break ;;
  esac
done
action=${1:-}
[ $# -gt 0 ] && shift
if [ -z "$env_file" ] || [ -z "$node" ] || [ -z "$action" ]; then
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
# shellcheck source=/dev/null
. "$env_file"
scratch=$(cd "$(dirname "$env_file")" && pwd)
me=-1
for i in "${!members[@]}"; do [ "${members[$i]}" = "$node" ] && me=$i; done
[ "$me" -ge 0 ] || { echo "patroni_callback.sh: $node is not a member (${members[*]})" >&2; exit 2; }
sock=$scratch/$node/sock
logfile=$scratch/$node/callback.log

log() { printf '%s %s[%d] %s\n' "$(date '+%F %T.%3N')" "$action" $$ "$*" >>"$logfile"; }

# psql on this node, quiet and unaligned; the rest are psql arguments.
lsql() {
  PGCONNECT_TIMEOUT=3 "$pgbin/psql" -X -qAt -v ON_ERROR_STOP=1 -h "$sock" -p "${pg_ports[$me]}" \
    -U postgres -d postgres "$@"
}

# Waits up to $1 seconds until this node answers and pg_is_in_recovery() is $2 (t or f).
wait_state() {
  local end=$((SECONDS + $1))
  while [ "$SECONDS" -lt "$end" ]; do
    [ "$(lsql -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" = "$2" ] && return 0
    sleep 0.2
  done
  return 1
}

# True if some process listens on TCP port $1 (this node's backup server, on its own port).
listening() {
  local hex
  hex=$(printf '%04X' "$1")
  awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# The secret the leader and its backups share.
secret() { cat "$secret_file"; }

# A replica serves as a Tailwind backup on its port (kept in slipstream_replication.conf, so a
# restart serves again by itself: then nothing is done).
serve() {
  local out
  if listening "${serve_ports[$me]}"; then
    log "serves already on 127.0.0.1:${serve_ports[$me]}"
    return 0
  fi
  if out=$(lsql -v secret="$(secret)" 2>&1 <<EOF
SELECT slipstream.serve_backup('127.0.0.1:${serve_ports[$me]}', :'secret', $serve_buffers, '$serve_buffer_size');
EOF
  ); then
    log "serving as a Tailwind backup at $out"
  else
    log "serve_backup failed: $out"
    return 1
  fi
}

# The leader: every other member is configured as a backup (the shipper connects, and keeps
# reconnecting, by itself), and this node does not serve.
ensure_backups() {
  local j m n out
  if listening "${serve_ports[$me]}"; then
    lsql -c "SELECT slipstream.stop_serving()" >/dev/null 2>&1 && log "stopped serving: a primary does not serve"
  fi
  for j in "${!members[@]}"; do
    [ "$j" = "$me" ] && continue
    m=${members[$j]}
    n=$(lsql -c "SELECT count(*) FROM slipstream.replication WHERE name = '$m'" 2>&1) || { log "cannot read slipstream.replication: $n"; return 1; }
    [ "$n" = 0 ] || continue
    if out=$(lsql -v secret="$(secret)" 2>&1 <<EOF
SELECT slipstream.add_backup('$m', '127.0.0.1:${serve_ports[$j]}', '$transport', :'secret');
EOF
    ); then
      log "ships WAL to $m at 127.0.0.1:${serve_ports[$j]} ($transport)"
    else
      log "add_backup $m failed: $out"
    fi
  done
}

# Starts the reconciler, detached (Patroni kills a callback's children when the next callback
# comes while it runs; this one is no child by then).
start_reconcile() {
  ( setsid "$0" --env "$env_file" --node "$node" reconcile </dev/null >>"$logfile" 2>&1 & )
}

# Prints the HTTP status of GET $2 on the REST API of member index $1.
rest_status() {
  curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:${rest_ports[$1]}$2" || true
}

# Fences the old primary and waits until replay holds everything this node received.
pre_promote() {
  local t0=$SECONDS out
  local start_ns
  start_ns=$(date +%s%N)
  elapsed() { awk -v a="$start_ns" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }'; }
  if ! wait_state 20 t; then
    log "PostgreSQL does not answer as a standby: the promotion is refused"
    exit 1
  fi
  # 1. Fence: from now on no primary writes here; with 2 of 2 backups required, a primary that
  # were still alive could no longer acknowledge a commit.
  if ! out=$(lsql -c "SELECT slipstream.stop_serving()" 2>&1); then
    log "stop_serving failed: $out; the promotion is refused"
    exit 1
  fi
  # 2. The backup worker closes every primary's connection and writes the valid prefix of each
  # open buffer into pg_wal; its listening socket closes last.
  while listening "${serve_ports[$me]}"; do
    if [ $((SECONDS - t0)) -ge 30 ]; then
      log "the backup server still listens 30 s after stop_serving(): the promotion is refused"
      serve
      exit 1
    fi
    sleep 0.05
  done
  log "fenced: stopped serving (it served: $out) in $(elapsed) s"
  # 3. Replay up to the end of pg_wal before Patroni promotes: a startup process told to promote
  # while paused in its wait for WAL, or holding an error its read-ahead met at the end of
  # pg_wal earlier, ends recovery there without reading what arrived since
  # (docs/replication.md, "Why a promotion waits for replay first"). slipstream.catch_up()
  # finds where the valid WAL in pg_wal ends, ends any pause of replay (as the promotion would)
  # and wakes the startup process until replay is there.
  local wait=$((60 - (SECONDS - t0)))
  [ "$wait" -ge 1 ] || wait=1
  if ! out=$(lsql -c "SELECT slipstream.catch_up($wait)" 2>&1); then
    log "catch_up failed: $out; the promotion is refused"
    serve
    exit 1
  fi
  log "replay reached the end of pg_wal at $out $(elapsed) s after the fence began: promote"
  exit 0
}

# The leader, detached: see the header.
reconcile() {
  local limit=${1:-900} j m row state err mstate reason cluster out settled=0
  local -A asked=() down_since=()
  exec 9>"$scratch/$node/reconcile.lock"
  if ! flock -n 9; then
    log "another reconciler runs"
    exit 0
  fi
  log "started (at most $limit s)"
  local deadline=$((SECONDS + limit))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ "$(lsql -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" != f ] ||
       [ "$(rest_status "$me" /primary)" != 200 ]; then
      log "this node no longer leads: stops"
      exit 0
    fi
    ensure_backups
    cluster=$(curl -sf -m 2 "http://127.0.0.1:${rest_ports[$me]}/cluster" 2>/dev/null || true)
    local all=1
    for j in "${!members[@]}"; do
      [ "$j" = "$me" ] && continue
      m=${members[$j]}
      row=$(lsql -F '|' -c "SELECT state, coalesce(error, '') FROM slipstream.replication WHERE name = '$m'" 2>/dev/null)
      state=${row%%|*}
      err=${row#*|}
      if [ "$state" = streaming ]; then
        unset "down_since[$m]"
        continue
      fi
      all=0
      [ -n "${down_since[$m]:-}" ] || down_since[$m]=$SECONDS
      reason=""
      if [[ "$err" == *"seed it again"* || "$err" == *"re-seed"* || "$err" == *"reseed"* ]]; then
        reason="its backup refuses this leader: $err"
      elif [ $((SECONDS - down_since[$m])) -ge 45 ]; then
        reason="it has not streamed for 45 s: ${err:-no error}"
      fi
      [ -n "$reason" ] || continue
      mstate=$(jq -r --arg m "$m" '[.members[] | select(.name == $m) | .state] | first // ""' <<<"$cluster" 2>/dev/null)
      case "$mstate" in
        ""|"creating replica"|starting|restarting|stopping) continue ;;  # unknown, or on its way
      esac
      if [ -n "${asked[$m]:-}" ] && [ $((SECONDS - asked[$m])) -lt 60 ]; then continue; fi
      log "re-seeding $m (Patroni state $mstate): $reason"
      if out=$(patronictl -c "$scratch/$node.yml" reinit "$scope" "$m" --force 2>&1); then
        log "patronictl reinit $m: $(echo "$out" | tail -1)"
      else
        log "patronictl reinit $m failed: $(echo "$out" | tail -1)"
      fi
      asked[$m]=$SECONDS
    done
    if [ "$all" = 1 ]; then
      settled=$((settled + 1))
      if [ "$settled" -ge 3 ]; then
        log "every backup streams: done"
        exit 0
      fi
    else
      settled=0
    fi
    sleep 1
  done
  log "gave up after $limit s"
  exit 1
}

case "$action" in
  pre_promote)
    log "Patroni is about to promote $node"
    pre_promote
    ;;
  reconcile)
    reconcile "${1:-900}"
    ;;
  on_start|on_role_change|on_restart)
    role=${1:-}
    log "role $role"
    case "$role" in
      master|primary|promoted)
        # After pg_ctl promote the node may still be in recovery for a moment.
        if ! wait_state 120 f; then
          log "not a primary within 120 s: nothing done"
          exit 1
        fi
        ensure_backups
        start_reconcile
        ;;
      replica)
        if ! wait_state 120 t; then
          log "not a standby that answers within 120 s: nothing done"
          exit 1
        fi
        serve
        ;;
      *)
        log "nothing to do for role $role"
        ;;
    esac
    ;;
  on_stop|on_reload)
    ;;
  *)
    echo "patroni_callback.sh: unknown action $action" >&2
    exit 2
    ;;
esac
