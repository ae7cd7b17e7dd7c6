#!/usr/bin/env bash
# The README's first command: installs what building needs (scripts/setup.sh
# --build-only: cmake, clang/libclang, curl headers; nothing when present),
# then runs the quickstart example: a stream of sensor readings produced to
# Kafka, a windowed pipeline, windows and progress printed. With no
# KAFKA_BOOTSTRAP it runs on librdkafka's embedded mock cluster.
#
# It builds into the same persistent target directory as scripts/test.sh and
# CI (~/.cache/tidemark-target, or $CARGO_TARGET_DIR), and builds the whole
# workspace's examples rather than `cargo run --example quickstart` alone:
# cargo unifies dependency features over the packages it builds, so only a
# workspace-wide build gives the very artifacts `cargo test --workspace`
# uses, and whichever of the two README commands runs second starts from the
# first one's build instead of recompiling rdkafka, deltalake and their
# dependencies (measured: 9.5 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"
bash scripts/setup.sh --build-only
cargo build --workspace --examples
exec "$CARGO_TARGET_DIR/debug/examples/quickstart" "$@"
