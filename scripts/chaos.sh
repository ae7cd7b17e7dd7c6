#!/usr/bin/env bash
# The long chaos soak (#15, #43): three exactly-once replicas, a producer
# throughout, KILLS random SIGKILLs (default 100), a broker restart, a
# replica added and one stopped, then an available-now run; every window
# must be written exactly once, into a Kafka topic and (another soak) into
# one Delta table all replicas commit to; each with replicas sharing a
# state directory (static members by their slot's id into Kafka, dynamic
# members into Delta) and with static members named by TIDEMARK_INSTANCE_ID
# (a state directory each). Prints a report line `chaos: ...` per soak.
#
#   scripts/chaos.sh [KILLS] [SEED] [FILTER]
#
# FILTER picks soaks by test name (`static`, `delta`, ...; default all four).
#
# Uses the broker scripts/kafka.sh manages (started here if it is not
# running), as the test suite does; the short version (6 kills) runs in
# scripts/test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"
bash scripts/setup.sh
if [[ -z "${KAFKA_BOOTSTRAP:-}" ]]; then
  bash scripts/kafka.sh status >/dev/null 2>&1 || bash scripts/kafka.sh start
  export KAFKA_BOOTSTRAP=127.0.0.1:${TIDEMARK_KAFKA_PORT:-9092}
fi
export CHAOS_KILLS="${1:-100}"
[[ -n "${2:-}" ]] && export CHAOS_SEED="$2"
exec cargo test --workspace --test chaos -- --nocapture ${3:+"$3"}
