#!/usr/bin/env bash
# seed_backup.sh: seeds a slipstream standby from a running primary, in one command
# (docs/replication.md, "Seeding a backup"). Run it as the OS user that will own the standby's
# data directory (postgres).
#
#   scripts/seed_backup.sh --connstring CONNINFO --datadir DIR [--name NAME] [--streaming]
#                          [--send-index] [--set 'name = value']... [--scope S] [--role R]
#                          [--tablespace-mapping OLDDIR=NEWDIR]...
#
# CONNINFO reaches the primary as a superuser or slipstream_admin member with the replication
# privilege, in a database where CREATE EXTENSION slipstream was run (e.g.
# "host=/tmp/p/sock port=5432 user=postgres dbname=postgres").
#
# What it does:
#   1. pg_basebackup (WAL streamed, a fast checkpoint) into DIR, creating on the primary the
#      physical slot slipstream_seed_NAME that keeps the WAL the standby needs until its first
#      backup connection (the shipper drops it then) or, with --streaming, for good (as the
#      standby's primary_slot_name);
#   2. replaces the copied engine files, which are not consistent (they were copied while the
#      engine wrote them), by a consistent dump: slipstream.seed_snapshot() streamed into
#      DIR/slipstream_seed, which the standby loads at its first start; the dump is taken again
#      if its WAL horizon lies below the backup's start (the standby lacks the WAL before it);
#   3. drops the primary's replication configuration from the copy (a standby must not ship
#      to the primary's backups), then makes DIR a standby: standby.signal, and with
#      --streaming also primary_conninfo (PostgreSQL's streaming replication, the baseline);
#      without it, WAL arrives by slipstream's one-sided writes after
#      SELECT slipstream.serve_backup(...) on the standby and add_backup(...) on the primary.
#   4. appends each --set line to DIR/postgresql.conf (a port, a socket directory...).
#
# Tablespaces are copied where pg_basebackup puts them: their primary's directories, or, with
# --tablespace-mapping (pg_basebackup's -T, needed for a standby on the same host), NEWDIR.
# Slipstream tables in tablespaces need nothing more: the engine keeps their rows in its own
# files, which the seed carries.
#
# With --send-index the standby imports its primary's levels instead (Send-Index: it sets
# slipstream.backup_engine = import): step 2 leaves its engine empty, and the primary ships
# the levels as a seed when the backup, added with shipping => 'send_index', first connects.
#
# Patroni's create_replica_methods pass --scope, --role and --datadir: accepted (and the
# first two ignored).
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
connstring=""
datadir=""
name=""
streaming=0
send_index=0
settings=()
scope=""
basebackup_args=()   # -T mappings, and -R for --streaming

usage() {
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case "$1" in
    --connstring) connstring=${2:?}; shift 2 ;;
    --connstring=*) connstring=${1#*=}; shift ;;
    --datadir) datadir=${2:?}; shift 2 ;;
    --datadir=*) datadir=${1#*=}; shift ;;
    --name) name=${2:?}; shift 2 ;;
    --name=*) name=${1#*=}; shift ;;
    --streaming) streaming=1; shift ;;
    --send-index) send_index=1; shift ;;
    --tablespace-mapping) basebackup_args+=(-T "${2:?}"); shift 2 ;;
    --tablespace-mapping=*) basebackup_args+=(-T "${1#*=}"); shift ;;
    --set) settings+=("${2:?}"); shift 2 ;;
    --set=*) settings+=("${1#*=}"); shift ;;
    --scope) scope=${2:?}; shift 2 ;;
    --scope=*) scope=${1#*=}; shift ;;
    --role) shift 2 ;;
    --role=*) shift ;;
    -h|--help) usage ;;
    *) echo "seed_backup.sh: unknown argument $1" >&2; usage ;;
  esac
done
[ -n "$connstring" ] && [ -n "$datadir" ] || usage
if [ "$send_index" = 1 ] && [ "$streaming" = 1 ]; then
  echo "seed_backup.sh: --send-index needs slipstream's own replication, not --streaming" >&2
  exit 2
fi
# Under Patroni every node's data directory may have the same name: two seeds of one name at
# once would drop each other's slot.
if [ -n "$scope" ] && [ -z "$name" ]; then
  echo "seed_backup.sh: with --scope (Patroni), give each node its own --name" >&2
  exit 2
fi
[ -n "$name" ] || name=$(basename "$datadir")
slot="slipstream_seed_$(echo "$name" | tr -c 'a-z0-9_\n' '_')"
if [ -e "$datadir" ] && [ -n "$(ls -A "$datadir" 2>/dev/null)" ]; then
  echo "seed_backup.sh: $datadir exists and is not empty; remove it first" >&2
  exit 1
fi

psql_primary() { "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$connstring" "$@"; }

if [ "$(psql_primary -Atc "SELECT count(*) FROM pg_extension WHERE extname = 'slipstream'")" != 1 ]; then
  echo "seed_backup.sh: the database of --connstring has no slipstream extension" >&2
  echo "hint: connect to a database where CREATE EXTENSION slipstream was run" >&2
  exit 1
fi

# 1. The base backup. A slot left by an earlier, failed seed of the same name is replaced.
psql_primary -Atc "SELECT pg_drop_replication_slot('$slot') FROM pg_replication_slots
                   WHERE slot_name = '$slot'" >/dev/null
if [ "$streaming" = 1 ]; then basebackup_args+=(-R); fi
"$PGBIN/pg_basebackup" -d "$connstring" -D "$datadir" -X stream -c fast -C -S "$slot" \
  ${basebackup_args[@]+"${basebackup_args[@]}"}
start_lsn=$(sed -n 's/^START WAL LOCATION: \([0-9A-F]*\/[0-9A-F]*\).*/\1/p' "$datadir/backup_label")
lsn_value() { local hi=${1%/*} lo=${1#*/}; echo $(( (16#$hi << 32) | 16#$lo )); }

# 2. The engine: a consistent dump instead of the copied files (none with --send-index).
rm -rf "$datadir/slipstream" "$datadir/slipstream_backup" "$datadir/slipstream_backup_index"
mkdir -m 700 "$datadir/slipstream"
horizon=0
for attempt in 1 2 3 4 5; do
  [ "$send_index" = 1 ] && break
  psql_primary -c "COPY (SELECT * FROM slipstream.seed_snapshot()) TO STDOUT WITH (FORMAT binary)" \
    >"$datadir/slipstream_seed.tmp"
  # The trailer row's value ends the file: 8 bytes horizon, 8 bytes dump end, then -1 (2 bytes).
  horizon_hex=$(tail -c 18 "$datadir/slipstream_seed.tmp" | head -c 8 | od -An -tx1 | tr -d ' \n')
  horizon=$((16#$horizon_hex))
  if [ "$horizon" -ge "$(lsn_value "$start_lsn")" ]; then
    break
  fi
  echo "seed_backup.sh: the dump's horizon is below the backup's start $start_lsn; again" >&2
  rm -f "$datadir/slipstream_seed.tmp"
  [ "$attempt" = 5 ] && { echo "seed_backup.sh: no dump above the backup's start" >&2; exit 1; }
  sleep 1
done
[ "$send_index" = 1 ] || mv "$datadir/slipstream_seed.tmp" "$datadir/slipstream_seed"

# 3. A standby of its own: no replication configuration of the primary's.
rm -f "$datadir/slipstream_replication.conf"
touch "$datadir/standby.signal"

# 4. Local settings.
# Always said: a primary that was a Send-Index backup has import in its postgresql.conf.
if [ "$send_index" = 1 ]; then
  echo "slipstream.backup_engine = import" >>"$datadir/postgresql.conf"
else
  echo "slipstream.backup_engine = replay" >>"$datadir/postgresql.conf"
fi
for line in "${settings[@]+"${settings[@]}"}"; do
  echo "$line" >>"$datadir/postgresql.conf"
done
if [ "$send_index" = 1 ]; then
  printf 'seeded %s from the primary: WAL from %s, engine by Send-Index, slot %s\n' \
    "$datadir" "$start_lsn" "$slot"
  exit 0
fi
printf 'seeded %s from the primary: WAL from %s, engine horizon %X/%X, slot %s\n' \
  "$datadir" "$start_lsn" $((horizon >> 32)) $((horizon & 0xffffffff)) "$slot"
