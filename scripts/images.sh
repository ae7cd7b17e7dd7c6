#!/usr/bin/env bash
# Builds tidemark's container images on this machine, with no image registry:
#
#   tidemark/base:bookworm   Debian 12 (bookworm) made by `debootstrap
#                            --variant=minbase` from Debian's package archive
#                            and `docker import`ed. Bookworm because the
#                            tidemark binary is built on a bookworm host and
#                            links its glibc, OpenSSL and libcurl.
#   tidemark/kafka:4.1.1     the base + openjdk-17-jre-headless + the Kafka
#                            jars scripts/kafka.sh assembles from Maven
#                            Central: a single-node KRaft broker advertised on
#                            127.0.0.1, ports set by KAFKA_PORT and
#                            KAFKA_CONTROLLER_PORT (docker/kafka/kafka-start);
#                            `kafka-tool` inside produces and consumes.
#   tidemark/tidemark:latest the base + the `tidemark` CLI the README's
#                            commands build (debug info stripped) + the
#                            Debian packages of the shared libraries it links
#                            (found with ldd and dpkg); entrypoint `tidemark`,
#                            working directory /var/lib/tidemark, user
#                            tidemark. Mount pipeline files and run
#                            `docker run --network host -v $PWD:/pipelines:ro
#                            tidemark/tidemark run /pipelines/p.yaml`.
#
# Each image carries the hash of what it is made from (label
# tidemark.content): one whose hash matches is left alone, so a second run
# takes a few seconds (hashing the binary). Measured cold on the 2-core
# machine: base 40 s, Kafka 25 s, tidemark 15 s (plus the binary's build,
# which the tests have already done).
#
#   scripts/images.sh [base|kafka|tidemark|all]   (default: all)
#
# Environment:
#   TIDEMARK_DEBIAN_MIRROR   the Debian archive (default http://deb.debian.org/debian)
#   TIDEMARK_KAFKA_IMAGE     the Kafka image's name:tag (default tidemark/kafka:4.1.1)
#   TIDEMARK_IMAGE           the tidemark image's name:tag (default tidemark/tidemark:latest)
#   CARGO_TARGET_DIR         where the tidemark binary is built (default ~/.cache/tidemark-target)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target}"

SUITE=bookworm
MIRROR="${TIDEMARK_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_IMAGE="tidemark/base:$SUITE"
KAFKA_IMAGE="${TIDEMARK_KAFKA_IMAGE:-tidemark/kafka:4.1.1}"
TIDEMARK_IMAGE="${TIDEMARK_IMAGE:-tidemark/tidemark:latest}"
WORK="$CARGO_TARGET_DIR/images"

log() { echo "images.sh: $*" >&2; }
die() { log "$*"; exit 1; }

command -v docker >/dev/null || die "docker not found (scripts/setup.sh installs it)"
docker info >/dev/null 2>&1 || die "no Docker engine answers (scripts/setup.sh starts dockerd)"

# The content hash an image was built from, or nothing.
built_hash() {
  docker image inspect --format '{{ index .Config.Labels "tidemark.content" }}' "$1" 2>/dev/null || true
}

hash_of() { sha256sum | cut -c1-32; }

build_base() {
  # What the base is made from: the suite, the variant and the apt sources it
  # is given (a change here makes a new base, and so new images over it).
  local sources hash
  sources="deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main"
  hash="$(printf '%s\n%s\n' "minbase $SUITE" "$sources" | hash_of)"
  if [[ "$(built_hash "$BASE_IMAGE")" == "$hash" ]]; then
    log "$BASE_IMAGE is up to date"
    return 0
  fi
  command -v debootstrap >/dev/null || die "debootstrap not found (scripts/setup.sh installs it)"
  # debootstrap makes device nodes and root-owned files: root, or sudo.
  local t0=$SECONDS rootfs="$WORK/base-rootfs" sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  $sudo rm -rf "$rootfs"
  mkdir -p "$WORK"
  log "debootstrap --variant=minbase $SUITE from $MIRROR ..."
  $sudo debootstrap --variant=minbase "$SUITE" "$rootfs" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 ||
    { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log: $WORK/debootstrap.log)"; }
  printf '%s\n' "$sources" | $sudo tee "$rootfs/etc/apt/sources.list" >/dev/null
  $sudo rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  $sudo tar -C "$rootfs" -c . | docker import \
    --change "LABEL tidemark.content=$hash" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  $sudo rm -rf "$rootfs"
  log "built $BASE_IMAGE in $((SECONDS - t0)) s"
}

base_id() { docker image inspect --format '{{ .Id }}' "$BASE_IMAGE"; }

build_kafka() {
  local libs context hash t0=$SECONDS
  libs="$(bash scripts/kafka.sh assemble)"
  hash="$({
    base_id
    cat "$root/scripts/kafka/pom.xml"
    (cd docker/kafka && sha256sum Dockerfile kafka-start kafka-tool)
  } | hash_of)"
  if [[ "$(built_hash "$KAFKA_IMAGE")" == "$hash" ]]; then
    log "$KAFKA_IMAGE is up to date"
    return 0
  fi
  context="$WORK/kafka"
  rm -rf "$context" && mkdir -p "$context"
  cp docker/kafka/Dockerfile docker/kafka/kafka-start docker/kafka/kafka-tool "$context/"
  cp -r "$libs" "$context/libs"
  log "building $KAFKA_IMAGE ..."
  docker build -q --network host --build-arg "BASE=$BASE_IMAGE" --label "tidemark.content=$hash" \
    -t "$KAFKA_IMAGE" "$context" >/dev/null 2>"$WORK/kafka-build.log" ||
    { tail -n 30 "$WORK/kafka-build.log" >&2; die "building $KAFKA_IMAGE failed"; }
  rm -rf "$context"
  log "built $KAFKA_IMAGE in $((SECONDS - t0)) s"
}

# The Debian packages holding the shared libraries a binary links; fails
# naming a library no package holds (run inside $(...), where errexit is off,
# so every failure is returned).
runtime_packages() {
  local lib owner libs pkgs=()
  libs="$(ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')" || return 1
  for lib in $libs; do
    # merged /usr: dpkg may know the file under /lib or /usr/lib
    owner="$(dpkg -S "$lib" 2>/dev/null || dpkg -S "/usr$lib" 2>/dev/null || dpkg -S "${lib#/usr}" 2>/dev/null)" ||
      { log "no Debian package holds $lib, which $1 links"; return 1; }
    pkgs+=("${owner%%:*}")
  done
  ((${#pkgs[@]})) || { log "ldd found no library $1 links"; return 1; }
  printf '%s\n' "${pkgs[@]}" | sort -u | tr '\n' ' '
}

build_tidemark() {
  local t0=$SECONDS binary="$CARGO_TARGET_DIR/debug/tidemark" context packages hash
  # The whole workspace's examples and binaries: the same dependency features
  # as the tests' build, so this reuses its artifacts (a one-package build
  # would recompile dependencies with other features).
  log "cargo build --workspace --bins --examples ..."
  cargo build -q --workspace --bins --examples
  [[ -x "$binary" ]] || die "no $binary after the build"
  context="$WORK/tidemark"
  rm -rf "$context" && mkdir -p "$context"
  cp docker/tidemark/Dockerfile "$context/"
  objcopy --strip-debug "$binary" "$context/tidemark"
  packages="$(runtime_packages "$binary")" || die "could not find the packages of the libraries $binary links"
  hash="$({
    base_id
    echo "$packages"
    sha256sum <"$context/tidemark"
    sha256sum <docker/tidemark/Dockerfile
  } | hash_of)"
  if [[ "$(built_hash "$TIDEMARK_IMAGE")" == "$hash" ]]; then
    rm -rf "$context"
    log "$TIDEMARK_IMAGE is up to date"
    return 0
  fi
  log "building $TIDEMARK_IMAGE (runtime packages: $packages) ..."
  docker build -q --network host --build-arg "BASE=$BASE_IMAGE" --build-arg "PACKAGES=$packages" \
    --label "tidemark.content=$hash" -t "$TIDEMARK_IMAGE" "$context" >/dev/null 2>"$WORK/tidemark-build.log" ||
    { tail -n 30 "$WORK/tidemark-build.log" >&2; die "building $TIDEMARK_IMAGE failed"; }
  rm -rf "$context"
  log "built $TIDEMARK_IMAGE in $((SECONDS - t0)) s"
}

# One call a line: inside `a && b` bash runs a with errexit off.
what="${1:-all}"
case "$what" in
  base | kafka | tidemark | all) ;;
  *) echo "usage: $0 [base|kafka|tidemark|all]" >&2; exit 2 ;;
esac
build_base
if [[ "$what" == kafka || "$what" == all ]]; then build_kafka; fi
if [[ "$what" == tidemark || "$what" == all ]]; then build_tidemark; fi
# The versions a rebuild replaced (untagged now; a new binary each test run
# would otherwise leave ~150 MB behind every time).
docker image prune -f --filter label=tidemark.content >/dev/null
