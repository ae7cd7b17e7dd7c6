#!/usr/bin/env bash
# The cost of TLS + SASL/SCRAM, side by side in one run on one broker: the
# stateless filter pipeline (Kafka -> filter -> Kafka) and raw librdkafka
# consume, first over the PLAINTEXT listener, then over the SASL_SSL one
# (scripts/kafka.sh's test listener: SCRAM-SHA-512, the test CA). Prints
# each run's rates and the ratios. The project's one profile (dev: dependencies
# at -O2), as docs/benchmarks.md's other runs.
#
#   bench/secured.sh [--records N] [--partitions P] [other bench e2e flags]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"
bash scripts/kafka.sh start >/dev/null
eval "$(bash scripts/kafka.sh secure-env)"
# The whole workspace, so features unify with the tests' build (no rebuild).
cargo build -q --workspace --bins
e2e="$CARGO_TARGET_DIR/debug/e2e"
out="$(mktemp -d)"
"$e2e" --pipeline filter --bootstrap 127.0.0.1:9092 --json "$out/plaintext.json" "$@"
"$e2e" --pipeline filter --bootstrap "$KAFKA_SECURE_BOOTSTRAP" --json "$out/sasl_ssl.json" \
  --property security.protocol=SASL_SSL --property sasl.mechanism=SCRAM-SHA-512 \
  --property sasl.username="$KAFKA_SECURE_USER" \
  --property sasl.password="$(cat "$KAFKA_SECURE_PASSWORD_FILE")" \
  --property ssl.ca.location="$KAFKA_SECURE_CA" "$@"
python3 - "$out/plaintext.json" "$out/sasl_ssl.json" <<'PY'
import json, sys
plain, secure = (json.load(open(p)) for p in sys.argv[1:3])
def rates(r):
    return r["raw_consume"]["records_per_second"], r["tidemark_pipeline"]["records_per_second"]
(pr, pt), (sr, st) = rates(plain), rates(secure)
print("| listener | raw librdkafka consume (rec/s) | tidemark filter (rec/s) | tidemark / raw |")
print("|---|---:|---:|---:|")
print(f"| PLAINTEXT | {pr:,.0f} | {pt:,.0f} | {pt/pr:.2f} |")
print(f"| SASL_SSL (SCRAM-SHA-512, TLS) | {sr:,.0f} | {st:,.0f} | {st/sr:.2f} |")
print(f"SASL_SSL / PLAINTEXT: raw consume {sr/pr:.2f}, tidemark {st/pt:.2f}")
PY
