#!/usr/bin/env bash
# Builds the Kafka Streams peer of the side-by-side benchmarks with Maven
# (Kafka Streams from Maven Central; ~/.m2 caches the downloads) and prints
# the path of its jar, which stays in the Maven project's target/ (ignored
# by git). Used as:
#   cargo run -p tidemark-bench --bin e2e -- --kafka-streams "$(bench/peers/build.sh)"
set -euo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/kafka-streams"
mvn -q -B -f "$dir/pom.xml" package -DskipTests >&2
echo "$dir/target/streams-peer.jar"
