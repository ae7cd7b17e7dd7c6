#!/usr/bin/env bash
# Builds every publishable crate from its packaged tarball, as crates.io
# users get it, each on its own with its own features (what
# `cargo package` verifies), its tidemark dependencies the packaged ones
# beside it, in one scratch workspace with one target directory of its
# own: a dependency built with the same features for two crates is built
# once.
#
#   bash scripts/package-verify.sh            # every publishable crate
#   bash scripts/package-verify.sh tidemark-delta tidemark-cli
#
# Outside CI: measured on 2026-12-07 on the 2-core machine, the eleven
# crates of then (before tidemark-pipeline, not timed) took 70 minutes (RocksDB is built again for each feature set its
# dependents unify to: tidemark-state, -core, -files, -serve 13 minutes
# each, -delta 14; the others under 2) and about 24 GB, deleted at the
# end (KEEP_PACKAGE_BUILD=1 keeps them). CARGO_TARGET_DIR is honoured
# (default: target/ of the repository); the build goes in a directory
# below it.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
target="${CARGO_TARGET_DIR:-$root/target}"
scratch="$target/package-verify"
build="$target/package-verify-build"
if [ "${KEEP_PACKAGE_BUILD:-0}" != 1 ]; then
  trap 'rm -rf "$scratch" "$build"' EXIT
fi

crates=(tidemark-types tidemark-state tidemark-operators tidemark-core tidemark-pipeline tidemark-avro
  tidemark-kafka tidemark-delta tidemark-files tidemark-serve tidemark-connectors tidemark-cli)
if [ "$#" -gt 0 ]; then
  check=("$@")
else
  check=("${crates[@]}")
fi

echo "== cargo package --no-verify"
cargo package --workspace --no-verify --allow-dirty \
  --exclude tidemark-bench --exclude tidemark-fuzz --exclude tidemark-integration-tests >/dev/null

rm -rf "$scratch"
mkdir -p "$scratch"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
members=""
patches=""
for crate in "${crates[@]}"; do
  tar -xzf "$target/package/$crate-$version.crate" -C "$scratch"
  members="$members\"$crate-$version\", "
  patches="$patches$crate = { path = \"$crate-$version\" }"$'\n'
done
# The packaged crates name each other by version (crates.io); the patch
# points those names at the tarballs unpacked here, never at the sources.
cat >"$scratch/Cargo.toml" <<EOF
[workspace]
resolver = "2"
members = [${members%, }]

[patch.crates-io]
$patches
EOF
# The repository's lock file: the same dependency versions as CI builds.
cp Cargo.lock "$scratch/Cargo.lock"

for crate in "${check[@]}"; do
  echo "== build $crate from its package"
  start=$(date +%s)
  (cd "$scratch" && CARGO_TARGET_DIR="$build" cargo build -p "$crate")
  echo "   $crate: built in $(( $(date +%s) - start )) s"
done
echo "every crate built from its package: ${check[*]}"
