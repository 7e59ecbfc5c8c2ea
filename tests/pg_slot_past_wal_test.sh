#!/usr/bin/env bash
# pg_slot_past_wal_test.sh: a durable horizon past the WAL that survived a crash must not stop
# the server. Modules before 2026-12-02 could move the slot "slipstream" to the WAL insert
# position, ahead of the flushed WAL; a SIGKILL then lost that WAL, the end-of-recovery
# checkpoint record was written over it, and the worker's startup replay, looking for the first
# record after a position inside that record, waited forever for WAL nobody would write
# (docs/reliability.md). This test puts the slot there by hand: after a SIGKILL it rewrites the
# slot's state file (restart_lsn and its CRC-32C) to 16 bytes past the end of the WAL, where
# the end-of-recovery checkpoint record will start. Then the restarted server must answer
# reads of the slipstream table with every row, and log that there was nothing to replay.
#   tests/pg_slot_past_wal_test.sh [scratch dir] [port]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=${1:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-slot-past-wal}}
port=${2:-55456}
cluster="$scratch/cluster"
pg="$root/scripts/pg_cluster.sh"

# No autovacuum: nothing but this script may write WAL between its CHECKPOINT and the kill.
"$pg" init "$cluster" "$port" "autovacuum = off"
"$pg" start "$cluster"
trap '"$pg" stop "$cluster" immediate >/dev/null 2>&1 || true' EXIT
psql_c() { "$pg" psql "$cluster" -qAt "$@"; }
psql_c -c "CREATE EXTENSION slipstream" \
  -c "CREATE TABLE kept (id int PRIMARY KEY, payload text) USING slipstream" \
  -c "INSERT INTO kept SELECT g, repeat('k', g % 200) FROM generate_series(1, 5000) g" >/dev/null
# The old modules moved the slot past WAL only once the engine held every change below it: so
# first the worker syncs the engine and moves the slot past the inserts (every sync_interval).
inserted=$(psql_c -c "SELECT pg_current_wal_insert_lsn()")
for _ in $(seq 1 300); do
  [ "$(psql_c -c "SELECT restart_lsn >= '$inserted' FROM pg_replication_slots WHERE slot_name = 'slipstream'")" = t ] && break
  sleep 0.1
done
[ "$(psql_c -c "SELECT restart_lsn >= '$inserted' FROM pg_replication_slots WHERE slot_name = 'slipstream'")" = t ] ||
  { echo "the slot never passed the inserts ($inserted)" >&2; exit 1; }
as_postgres() { if [ "$(id -un)" = postgres ]; then "$@"; else runuser -u postgres -- "$@"; fi; }
bin=$(pg_config --bindir 2>/dev/null || echo /usr/lib/postgresql/15/bin)
[ -x "$bin/pg_waldump" ] || bin=/usr/lib/postgresql/15/bin

# A CHECKPOINT, then the kill with no statement between (a statement's catalog reads may prune
# a page and log it). The end of the WAL is where pg_waldump stops reading records: the
# end-of-recovery checkpoint record will be written there, unless a record was cut in two,
# when recovery writes another record first; then the round is tried again.
wal_end=""
for attempt in 1 2 3; do
  psql_c -c "CHECKPOINT" >/dev/null
  "$pg" kill "$cluster"
  from=$(as_postgres "$bin/pg_controldata" "$cluster/data" | sed -n 's/^Latest checkpoint location: *//p')
  stop=$(as_postgres "$bin/pg_waldump" -p "$cluster/data/pg_wal" -s "$from" 2>&1 >/dev/null | tail -n 1 || true)
  wal_end=$(echo "$stop" | sed -n 's/.*invalid record length at \([0-9A-F]*\/[0-9A-F]*\): wanted 24, got 0$/\1/p')
  [ -n "$wal_end" ] && break
  echo "attempt $attempt: the WAL does not end cleanly ($stop); again"
  "$pg" start "$cluster"
done
[ -n "$wal_end" ] || { echo "the WAL never ended at a whole record" >&2; exit 1; }
wal_end=$(( (16#${wal_end%/*} << 32) + 16#${wal_end#*/} ))

# ReplicationSlotOnDisk (PostgreSQL 15): magic, CRC-32C of everything after it, version,
# length, then the slot's data: name (64 bytes), database, persistency, xmin, catalog_xmin
# (4 bytes each), restart_lsn (8 bytes, at offset 96).
state="$cluster/data/pg_replslot/slipstream/state"
python3 - "$state" $((wal_end + 16)) <<'EOF'
import struct, sys
path, restart = sys.argv[1], int(sys.argv[2])
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
raw = bytearray(open(path, "rb").read())
magic, checksum = struct.unpack_from("<II", raw, 0)
assert magic == 0x1051CA1, "not a replication slot state file"
assert crc32c(raw[8:]) == checksum, "the state file's CRC does not match: layout changed?"
name = bytes(raw[16:80]).split(b"\0")[0]
assert name == b"slipstream", name
old = struct.unpack_from("<Q", raw, 96)[0]
assert 0 < old <= restart, (old, restart)
struct.pack_into("<Q", raw, 96, restart)
struct.pack_into("<I", raw, 4, crc32c(raw[8:]))
open(path, "wb").write(raw)
print("slot restart_lsn moved from %X/%X to %X/%X" % (old >> 32, old & 0xFFFFFFFF, restart >> 32, restart & 0xFFFFFFFF))
EOF
chown postgres: "$state" 2>/dev/null || true

"$pg" start "$cluster"
# A hung startup replay holds every reader of the table: the read gets 60 s, the client 90.
rows=$(timeout 90 "$pg" psql "$cluster" -qAt -c "SET statement_timeout = '60s'" -c "SELECT count(*) FROM kept" 2>&1 || true)
[ "$rows" = 5000 ] || { echo "expected 5000 rows after the restart, read: $rows" >&2; tail -n 20 "$cluster/server.log" >&2; exit 1; }
grep -q "durable horizon: nothing to replay" "$cluster/server.log" ||
  { echo "the worker did not report a horizon past the WAL" >&2; tail -n 20 "$cluster/server.log" >&2; exit 1; }
bad=$(psql_c -c "SELECT count(*) FROM slipstream.verify('kept') WHERE NOT ok")
[ "$bad" = 0 ] || { echo "verify failed after the restart" >&2; exit 1; }
psql_c -c "INSERT INTO kept VALUES (0, 'after the restart')" >/dev/null
echo "slot-past-WAL test passed: 5000 rows read, nothing replayed, verify ok"
