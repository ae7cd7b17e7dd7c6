#!/usr/bin/env bash
# Coverage-guided fuzzing of every target in fuzz/src/lib.rs with libFuzzer
# (cargo fuzz, nightly Rust), each for FUZZ_SECONDS (default 60), starting from
# fuzz/corpus/<target>/ (inputs that add coverage are kept in the fuzz
# target directory, not in the repository). Not part of CI: the first build
# compiles every dependency again with sanitizer flags (RocksDB's C++
# among them), 30-60 minutes on 2 cores. CI runs the same bodies over the
# corpus and mutated inputs, without coverage, in `cargo test -p
# tidemark-fuzz` (10 s per target).
#
#   scripts/fuzz.sh [TARGET...]          every target, or those named
#   FUZZ_SECONDS=600 scripts/fuzz.sh parquet
#
# A crash leaves its input in fuzz/libfuzzer/artifacts/<target>/: copy it
# into fuzz/corpus/<target>/ (it becomes a regression the tests replay),
# then fix the decoder.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds="${FUZZ_SECONDS:-60}"
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$HOME/.cache/tidemark-fuzz-target}"
if (($#)); then
  targets=("$@")
else
  mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir fuzz/libfuzzer)
fi
status=0
for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  echo "== $target: ${seconds} s"
  # New inputs that add coverage go to a scratch directory: the corpus in
  # the repository keeps seeds and regressions only.
  scratch="$CARGO_TARGET_DIR/corpus/$target"
  mkdir -p "$scratch"
  if ! cargo +nightly fuzz run --fuzz-dir fuzz/libfuzzer "$target" \
      "$scratch" "fuzz/corpus/$target" -- -max_total_time="$seconds" -rss_limit_mb=4096; then
    echo "!! $target crashed: see fuzz/libfuzzer/artifacts/$target/"
    status=1
  fi
done
exit $status
