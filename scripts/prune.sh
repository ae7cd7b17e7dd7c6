#!/usr/bin/env bash
# Keeps the persistent target dir and the broker's data from filling the
# disk. Each build variant (profile flags, features, a test or bench binary)
# leaves its own incremental cache and executables, which cargo never deletes:
# on 2026-12-04 the target dir had grown to 70 GB and the disk filled during a
# run (the broker stopped, and the shell with it). What was not used for a day
# goes; what a build still uses is kept, so builds stay warm:
#
#   incremental caches   session dirs not written for a day (cargo writes one
#                        per compile of that crate variant)
#   executables in deps  test, bench and example binaries not run for a day
#                        (access time; a current one deleted is only relinked)
#   the broker's data    when the broker is stopped and its data passes
#                        TIDEMARK_KAFKA_DATA_MAX_GB (default 2): tests create
#                        topics of their own and never read old ones
#
# rlibs are never touched: deleting one would rebuild RocksDB.
#
# Usage: scripts/prune.sh   (scripts/test.sh runs it first)
set -euo pipefail

target="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"
kafka_data="${TIDEMARK_KAFKA_HOME:-$HOME/.cache/tidemark-kafka}/data"
day_minutes=1440

free_gb() { df -P --block-size=1G "$1" | awk 'NR == 2 { print $4 }'; }

for profile_dir in "$target"/*/; do
  [[ -d "$profile_dir/incremental" ]] || continue
  find "$profile_dir/incremental" -mindepth 2 -maxdepth 2 -mmin +"$day_minutes" \
    -exec rm -rf {} +
  find "$profile_dir/incremental" -mindepth 1 -maxdepth 1 -type d -empty -delete
  find "$profile_dir/deps" -maxdepth 1 -type f -executable \
    ! -name '*.so' ! -name '*.rlib' ! -name '*.rmeta' -amin +"$day_minutes" -delete
done

if [[ -d "$kafka_data" ]] && ! bash "$(dirname "${BASH_SOURCE[0]}")/kafka.sh" status >/dev/null 2>&1; then
  data_gb=$(du -s --block-size=1G "$kafka_data" | cut -f1)
  if ((data_gb > ${TIDEMARK_KAFKA_DATA_MAX_GB:-2})); then
    echo "==> the stopped broker's data is ${data_gb} GB: deleting it (next start formats anew)" >&2
    bash "$(dirname "${BASH_SOURCE[0]}")/kafka.sh" reset >/dev/null
  fi
fi

[[ -d "$target" ]] && echo "==> $(free_gb "$target") GB free beside the target dir" >&2
exit 0
