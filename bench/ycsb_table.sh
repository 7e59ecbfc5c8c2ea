# ycsb_table.sh: sourced by bench/module_ab.sh and bench/module_bytes.sh. The YCSB-like table
# they load (`usertable`, as bench/ycsb_pg.sh's) and the pgbench scripts they run over it. The
# caller sets `records` and `mix` first.

# Sets `small` and `medium`, the percentages of rows of 20 and 300 bytes (the rest: 1,500).
case "$mix" in
  SD) small=60 medium=20 ;;
  L) small=0 medium=0 ;;
  *) echo "unknown mix $mix (SD, L)" >&2; exit 2 ;;
esac

# A value of key expression $1's class (classes by key % 100), fresh if $2 is random().
value_sql() {
  echo "CASE WHEN ($1) % 100 < $small THEN left(md5($2::text), 20)
        WHEN ($1) % 100 < $((small + medium)) THEN left(repeat(md5($2::text), 10), 300)
        ELSE left(repeat(md5($2::text), 47), 1500) END"
}

# Creates and fills the table in the cluster of directory $1.
load_usertable() {
  "$pg" psql "$1" -qAt -c "CREATE EXTENSION slipstream" \
    -c "CREATE TABLE usertable (ycsb_key int PRIMARY KEY, field0 text) USING slipstream" \
    -c "INSERT INTO usertable SELECT k, $(value_sql k k) FROM generate_series(1, $records) k" \
    -c "VACUUM ANALYZE usertable"
}

# Writes the pgbench script of workload $1 (zipfian keys) to file $2: `update` (YCSB A's
# update), `read` (a point SELECT), `scan` (E's SELECT of 1-100 rows in key order), `rmw` (F's
# read-modify-write: SELECT ... FOR UPDATE, then the UPDATE, in one transaction).
write_workload_script() {
  local update body
  update="UPDATE usertable SET field0 = $(value_sql :key 'random()') WHERE ycsb_key = :key;"
  case "$1" in
    update) body=$update ;;
    read) body="SELECT field0 FROM usertable WHERE ycsb_key = :key;" ;;
    scan) body="\\set len random(1, 100)
SELECT ycsb_key, field0 FROM usertable WHERE ycsb_key >= :key ORDER BY ycsb_key LIMIT :len;" ;;
    rmw) body="BEGIN;
SELECT field0 FROM usertable WHERE ycsb_key = :key FOR UPDATE;
$update
COMMIT;" ;;
    *) echo "unknown workload $1 (update, read, scan, rmw)" >&2; exit 2 ;;
  esac
  printf '\\set z random_zipfian(1, %d, 1.01)\n\\set key (:z * 2654435761) %% %d + 1\n%s\n' \
    "$records" "$records" "$body" >"$2"
  chmod 644 "$2"
}
