#!/usr/bin/env bash
# Runs every check a change must pass: installs what is missing, starts a real
# Apache Kafka broker when KAFKA_BOOTSTRAP is unset, then fmt, clippy and all
# tests. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# One persistent target dir outside the clone, shared by development, this
# script and CI, so that builds start warm.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { echo "==> $*"; }

# ---- system packages (idempotent; apt only when something is missing)
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v c++ >/dev/null || missing+=(g++)
command -v pkg-config >/dev/null || missing+=(pkg-config)
# RocksDB's bindings are generated with libclang at build time.
command -v clang >/dev/null || missing+=(clang)
compgen -G "/usr/lib/llvm-*/lib/libclang*.so*" >/dev/null || compgen -G "/usr/lib/x86_64-linux-gnu/libclang*.so*" >/dev/null || missing+=(libclang-dev)
# librdkafka 2.12's cmake build includes curl/curl.h even with curl off.
[[ -f /usr/include/x86_64-linux-gnu/curl/curl.h || -f /usr/include/curl/curl.h ]] || missing+=(libcurl4-openssl-dev)
command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v python3 >/dev/null || missing+=(python3 python3-pip)
if ((${#missing[@]})); then
  step "installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

# ---- independent readers used by the tests: Avro bytes checked by
# fastavro, Delta tables read back by the Python `deltalake` package
# (delta-rs's Python build, its own reader, no Rust of ours)
pip_install() {
  python3 -m pip install -q "$@" || python3 -m pip install -q --break-system-packages "$@"
}
python3 -c 'import fastavro' 2>/dev/null || { step "installing fastavro"; pip_install fastavro; }
python3 -c 'import deltalake, pyarrow' 2>/dev/null || { step "installing deltalake"; pip_install "deltalake>=1.1" pyarrow; }

# ---- a real broker
started_kafka=0
if [[ -z "${KAFKA_BOOTSTRAP:-}" ]]; then
  step "starting Apache Kafka (scripts/kafka.sh)"
  if ! bash scripts/kafka.sh status >/dev/null 2>&1; then
    bash scripts/kafka.sh start
    started_kafka=1
  fi
  export KAFKA_BOOTSTRAP=127.0.0.1:${TIDEMARK_KAFKA_PORT:-9092}
fi
cleanup() { if ((started_kafka)) && [[ -z "${TIDEMARK_KEEP_KAFKA:-}" ]]; then bash scripts/kafka.sh stop || true; fi; }
trap cleanup EXIT
echo "KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP"

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test"
log="$(mktemp)"
cargo test --workspace 2>&1 | tee "$log"
# One closing line over every test binary (cargo prints one per binary).
awk '/^test result:/ { passed += $4; failed += $6; ignored += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
rm -f "$log"
