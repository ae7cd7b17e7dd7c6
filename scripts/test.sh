#!/usr/bin/env bash
# Runs every check a change must pass: installs what is missing, starts a real
# Apache Kafka broker when KAFKA_BOOTSTRAP is unset, then fmt, clippy and all
# tests. `.ci/run` calls exactly this.
#
#   scripts/test.sh                          every check
#   scripts/test.sh --repeat N ARGS...       `cargo test ARGS...` N times in a
#                                            row against the broker, stopping at
#                                            the first failure (flaky tests:
#                                            e.g. --repeat 5 -p tidemark-cli
#                                            --test watermark_scope)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# One persistent target dir outside the clone, shared by development, this
# script and CI, so that builds start warm.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { echo "==> $*"; }

# ---- what building and the tests need (idempotent; see scripts/setup.sh)
bash scripts/setup.sh
# ---- what old builds and test topics left on the disk (see scripts/prune.sh)
bash scripts/prune.sh

# ---- a real broker
started_kafka=0
if [[ -z "${KAFKA_BOOTSTRAP:-}" ]]; then
  step "starting Apache Kafka (scripts/kafka.sh)"
  bash scripts/kafka.sh status >/dev/null 2>&1 || started_kafka=1
  # Also when running: start restarts a broker left from an older
  # configuration (without the secured listener the tests need).
  bash scripts/kafka.sh start
  export KAFKA_BOOTSTRAP=127.0.0.1:${TIDEMARK_KAFKA_PORT:-9092}
fi
cleanup() { if ((started_kafka)) && [[ -z "${TIDEMARK_KEEP_KAFKA:-}" ]]; then bash scripts/kafka.sh stop || true; fi; }
trap cleanup EXIT
echo "KAFKA_BOOTSTRAP=$KAFKA_BOOTSTRAP"
# Tests that run tidemark processes keep their logs here, for diagnosing a
# failure after the fact.
export TIDEMARK_TEST_LOG_DIR="${TIDEMARK_TEST_LOG_DIR:-$CARGO_TARGET_DIR/test-logs/$(date +%Y%m%dT%H%M%S)}"
echo "TIDEMARK_TEST_LOG_DIR=$TIDEMARK_TEST_LOG_DIR"

if [[ "${1:-}" == "--repeat" ]]; then
  runs="${2:?usage: scripts/test.sh --repeat N CARGO_TEST_ARGS...}"
  shift 2
  for ((run = 1; run <= runs; run++)); do
    step "run $run of $runs: cargo test $*"
    cargo test "$@" || { echo "failed on run $run of $runs: cargo test $*"; exit 1; }
  done
  echo "passed $runs runs in a row: cargo test $*"
  exit 0
fi

step "import circles (scripts/module_cycles.py)"
python3 scripts/module_cycles.py

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

# The crates a user adds as dependencies package as crates.io takes them:
# versions on every internal dependency, metadata, no file outside the
# package (no compile: the build below checks the code).
step "cargo package (publishable crates)"
if ! packaged="$(cargo package --workspace --no-verify --allow-dirty \
  --exclude tidemark-bench --exclude tidemark-fuzz --exclude tidemark-integration-tests 2>&1)"; then
  echo "$packaged"
  exit 1
fi

step "cargo test"
log="$(mktemp)"
cargo test --workspace 2>&1 | tee "$log"
# The container images the testkit's container tests run (built on this
# machine, no registry; skipped when their content hash is unchanged).
step "container images (scripts/images.sh)"
bash scripts/images.sh
# The testcontainers helper is a workspace of its own (see testkit/Cargo.toml).
step "cargo test (testkit)"
testkit=(--manifest-path testkit/Cargo.toml)
cargo fmt "${testkit[@]}" -- --check
cargo clippy "${testkit[@]}" --all-targets -- -D warnings
# KAFKA_BOOTSTRAP's broker: the unit tests, the doc example, tests/broker.rs.
cargo test "${testkit[@]}" --lib --test broker 2>&1 | tee -a "$log"
cargo test "${testkit[@]}" --doc 2>&1 | tee -a "$log"
# What a killed earlier run left: the testkit's containers (labelled) and
# the compose test's projects.
stale="$(docker ps -aq --filter label=tidemark.testkit)"
stale+=" $(docker ps -a --format '{{.ID}} {{.Label "com.docker.compose.project"}}' | awk '$2 ~ /^tidemark-compose-test-/ { print $1 }')"
# shellcheck disable=SC2086
[[ -z "${stale// /}" ]] || docker rm -f $stale >/dev/null
# What a killed earlier run left: the testkit's containers (labelled) and
# the compose test's projects.
stale="$(docker ps -aq --filter label=tidemark.testkit)"
stale+=" $(docker ps -a --format '{{.ID}} {{.Label "com.docker.compose.project"}}' | awk '$2 ~ /^tidemark-compose-test-/ { print $1 }')"
# shellcheck disable=SC2086
[[ -z "${stale// /}" ]] || docker rm -f $stale >/dev/null
# Docker's: with KAFKA_BOOTSTRAP unset, KafkaContainer::start() starts the
# Kafka image; docker-compose.yml runs the broker and tidemark's image.
env -u KAFKA_BOOTSTRAP cargo test "${testkit[@]}" --test container --test compose 2>&1 | tee -a "$log"
# One closing line over every test binary (cargo prints one per binary).
awk '/^test result:/ { passed += $4; failed += $6; ignored += $8 }
     END { printf "tests: %d passed, %d failed, %d skipped\n", passed, failed, ignored }' "$log"
rm -f "$log"
