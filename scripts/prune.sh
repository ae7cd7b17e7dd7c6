#!/usr/bin/env bash
# Keeps the persistent target dir and the broker's data from filling the
# disk. Each build variant (profile flags, features, a test or bench binary)
# leaves its own incremental cache and executables, which cargo never deletes:
# on 2026-12-04 the target dir had grown to 70 GB and the disk filled during a
# run (the broker stopped, and the shell with it). Old things go; what a build
# still uses is kept, so builds stay warm:
#
#   incremental caches   session dirs not written for a day (cargo writes one
#                        per compile of that crate variant)
#   executables in deps  test, bench and example binaries not run for three
#                        days (access time, which the disk's relatime mount
#                        updates about once a day; a current one deleted is
#                        compiled again)
#   when under MIN_FREE_GB (default 25) are left after that: incremental
#                        caches and executables older than six hours too
#   the broker's data    when the broker is not running and no start or stop
#                        holds its lock, and its data passes
#                        TIDEMARK_KAFKA_DATA_MAX_GB (default 2): tests create
#                        topics of their own and never read old ones
#
# rlibs are never touched: deleting one would rebuild RocksDB. Nothing here
# fails the run: a file cargo removes meanwhile is simply gone.
#
# Usage: scripts/prune.sh   (scripts/test.sh runs it first)
set -uo pipefail

target="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"
kafka_home="${TIDEMARK_KAFKA_HOME:-$HOME/.cache/tidemark-kafka}"
min_free_gb="${MIN_FREE_GB:-25}"

free_gb() { df -P --block-size=1G "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }

# Deletes incremental sessions written and executables run more than the
# given minutes ago.
prune_builds() { # incremental_minutes executable_minutes
  local profile_dir
  for profile_dir in "$target"/*/; do
    if [[ -d "$profile_dir/incremental" ]]; then
      find "$profile_dir/incremental" -mindepth 2 -maxdepth 2 -mmin +"$1" \
        -exec rm -rf {} + 2>/dev/null
      find "$profile_dir/incremental" -mindepth 1 -maxdepth 1 -type d -empty \
        -delete 2>/dev/null
    fi
    if [[ -d "$profile_dir/deps" ]]; then
      find "$profile_dir/deps" -maxdepth 1 -type f -executable \
        ! -name '*.so' ! -name '*.rlib' ! -name '*.rmeta' -amin +"$2" -delete 2>/dev/null
    fi
  done
}

# The broker's data, when no broker runs on it and no start or stop is
# under way (scripts/kafka.sh holds this lock for them).
prune_broker_data() {
  local data="$kafka_home/data" pid
  [[ -d "$data" ]] || return 0
  exec 9>"$kafka_home/.lock"
  flock -n 9 || return 0
  pid="$(cat "$kafka_home/broker.pid" 2>/dev/null)"
  if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
    exec 9>&-
    return 0
  fi
  local data_gb
  data_gb=$(du -s --block-size=1G "$data" 2>/dev/null | cut -f1)
  if ((${data_gb:-0} > ${TIDEMARK_KAFKA_DATA_MAX_GB:-2})); then
    echo "==> the stopped broker's data is ${data_gb} GB: deleting it (the next start formats anew)" >&2
    rm -rf "$data"
  fi
  exec 9>&-
}

if [[ -d "$target" ]]; then
  prune_builds $((24 * 60)) $((3 * 24 * 60))
  if (($(free_gb "$target") < min_free_gb)); then
    echo "==> under ${min_free_gb} GB free: deleting build caches older than six hours" >&2
    prune_builds $((6 * 60)) $((6 * 60))
  fi
fi
[[ -d "$kafka_home" ]] && prune_broker_data
[[ -d "$target" ]] && echo "==> $(free_gb "$target") GB free beside the target dir" >&2
exit 0
