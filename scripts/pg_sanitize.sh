#!/usr/bin/env bash
# pg_sanitize.sh: the PostgreSQL suites against a slipstream.so built with AddressSanitizer
# and UndefinedBehaviorSanitizer (the C glue, the bridge, and the engine, rdma and replication
# libraries inside it), loaded by the system's PostgreSQL 15.
#
# The server itself is not instrumented, so the ASan runtime is preloaded into it
# (LD_PRELOAD, through SLIPSTREAM_SERVER_ENV of scripts/pg_cluster.sh: the clients are left
# alone). The sanitized module must not replace the installed one, so it goes into a private
# copy of the PostgreSQL installation under the scratch directory (PostgreSQL finds its lib
# and share directories relative to its binaries), and the suites run that copy's binaries.
# Leak detection is off: a backend's memory contexts live until it exits, by design.
# Any sanitizer report fails the run, even from a process whose test passed.
#
#   scripts/pg_sanitize.sh [asan build dir] [scratch dir] [suites...]
#   suites: regress contention crash stall (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
asan_build=$(cd "${1:-$root/build-pg-asan}" && pwd)
scratch=${2:-${SLIPSTREAM_SCRATCH:-/tmp/slipstream-sanitize}}
shift $(($# > 2 ? 2 : $#))
suites=${*:-regress contention crash stall}
tree="$scratch/pg"
pgbin="$tree/lib/postgresql/15/bin"
reports="$scratch/reports"

command -v patchelf >/dev/null || { echo "patchelf is missing (make test-pg-sanitize installs it)" >&2; exit 1; }
rm -rf "$scratch"
mkdir -p "$tree/lib/postgresql" "$tree/share/postgresql" "$tree/include" "$reports"
cp -a /usr/lib/postgresql/15 "$tree/lib/postgresql/"
cp -a /usr/share/postgresql/15 "$tree/share/postgresql/"
cp -a /usr/include/postgresql "$tree/include/"
[ "$("$pgbin/pg_config" --pkglibdir)" = "$tree/lib/postgresql/15/lib" ] || {
  echo "the copy of PostgreSQL under $tree does not relocate" >&2
  exit 1
}

# The module's C glue, built out of the source tree so that its objects never mix with the
# normal build's; the archives come from the sanitizer build of the libraries.
src="$scratch/src"
mkdir -p "$src"
cp -a "$root/extension" "$src/extension"
ln -s "$root/engine" "$src/engine"
find "$src/extension" \( -name '*.o' -o -name '*.so' -o -name '*.bc' \) -delete
sanitize="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
make -s -C "$src/extension" PG_CONFIG="$pgbin/pg_config" BUILD_DIR="$asan_build" COPT="$sanitize" \
  -j"$(nproc)" >"$scratch/build.log" 2>&1 || {
  tail -30 "$scratch/build.log" >&2
  exit 1
}
make -s -C "$src/extension" PG_CONFIG="$pgbin/pg_config" BUILD_DIR="$asan_build" COPT="$sanitize" \
  install >>"$scratch/build.log" 2>&1
linked=$(ldd "$tree/lib/postgresql/15/lib/slipstream.so")
grep -q libasan <<<"$linked" || {
  echo "the module is not linked with the ASan runtime" >&2
  exit 1
}
chown -R postgres: "$reports" 2>/dev/null || chmod 777 "$reports"

# A preloaded ASan runtime initialises on the first malloc, and libgpg-error's constructor
# (loaded by the server through libsystemd and libgcrypt) makes that malloc while it holds
# glibc's gettext lock; ASan's initialisation then takes the same lock and the server hangs
# before main. A copy of libgpg-error that needs the ASan runtime has its constructor run after
# ASan's initialisation; only the sanitized server finds it (LD_LIBRARY_PATH).
asan_runtime=$(gcc -print-file-name=libasan.so)
asan_soname=$(objdump -p "$asan_runtime" | sed -n 's/^ *SONAME *//p')
mkdir -p "$tree/asan-libs"
cp "$(ldconfig -p | sed -n 's/.*libgpg-error.so.0 (libc6,x86-64) => //p' | head -1)" "$tree/asan-libs/"
patchelf --add-needed "$asan_soname" "$tree/asan-libs/libgpg-error.so.0"
export PGBIN="$pgbin"
export SLIPSTREAM_SERVER_ENV="LD_PRELOAD=$asan_runtime LD_LIBRARY_PATH=$tree/asan-libs \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:disable_coredump=1:log_path=$reports/asan \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$reports/ubsan"
# JIT would load LLVM into the sanitized server for no gain here.
export SLIPSTREAM_EXTRA_CONF="jit = off"

# Preflight: a server of the copy runs with the ASan runtime and the sanitized module mapped.
"$root/scripts/pg_cluster.sh" init "$scratch/preflight" 55539 >/dev/null
"$root/scripts/pg_cluster.sh" start "$scratch/preflight"
maps=$(cat "/proc/$(head -1 "$scratch/preflight/data/postmaster.pid")/maps")
"$root/scripts/pg_cluster.sh" stop "$scratch/preflight" immediate
grep -q "libasan" <<<"$maps" && grep -q "$tree/lib/postgresql/15/lib/slipstream.so" <<<"$maps" || {
  echo "the server does not run the sanitized module with the ASan runtime" >&2
  exit 1
}

status=0
for suite in $suites; do
  echo "=== $suite (sanitized module)"
  case "$suite" in
    regress) "$root/scripts/pg_regress.sh" "$scratch/regress" 55540 || status=1 ;;
    contention) "$root/tests/pg_contention_test.sh" "$scratch/contention" 55545 || status=1 ;;
    crash) "$root/tests/pg_crash_test.sh" "$scratch/crash" 55550 || status=1 ;;
    stall) "$root/tests/pg_pinned_stall_test.sh" "$scratch/stall" 55555 || status=1 ;;
    *) echo "unknown suite $suite (regress contention crash stall)" >&2; exit 2 ;;
  esac
done

shopt -s nullglob
found=("$reports"/asan.* "$reports"/ubsan.*)
if [ ${#found[@]} -gt 0 ]; then
  echo "sanitizer reports (${#found[@]}):" >&2
  for f in "${found[@]}"; do
    echo "--- $f" >&2
    head -n 40 "$f" >&2
  done
  status=1
fi
[ "$status" = 0 ] && echo "the PostgreSQL suites passed with the sanitized module, no sanitizer report"
exit "$status"
