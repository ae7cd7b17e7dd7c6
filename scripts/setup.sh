#!/usr/bin/env bash
# Installs what building and testing tidemark needs, and nothing when it is
# all there already (idempotent, quiet, a few milliseconds on a set-up
# machine). Both README commands run it first: scripts/quickstart.sh and
# scripts/test.sh.
#
#   system packages  cmake, a C++ compiler, pkg-config; clang and libclang
#                    (RocksDB's bindings are generated with libclang at build
#                    time); curl headers (librdkafka 2.12's cmake build
#                    includes curl/curl.h; with curl on it fetches OAUTHBEARER
#                    OIDC tokens); OpenSSL and Cyrus SASL headers (librdkafka's
#                    TLS, SCRAM and GSSAPI); for the tests
#                    only, Java 17 and Maven (the real broker is assembled
#                    from Maven Central jars), Chromium (the web page's
#                    test loads it headless), a Docker engine (docker.io),
#                    docker-compose and debootstrap (the container tests run
#                    images scripts/images.sh builds locally); dockerd is
#                    started when no Docker engine answers
#   rust components  rustfmt, clippy (tests only)
#   python readers   fastavro and deltalake + pyarrow, the independent readers
#                    the tests check Avro bytes and Delta tables with (tests only)
#
# Usage: scripts/setup.sh [--build-only]   (--build-only: what building needs)
set -euo pipefail

build_only=0
[[ "${1:-}" == "--build-only" ]] && build_only=1

note() { echo "==> $*" >&2; }

missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v c++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v clang >/dev/null || missing+=(clang)
compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null ||
  compgen -G "/usr/lib/llvm-*/lib/libclang-[0-9]*.so*" >/dev/null ||
  compgen -G "/usr/lib/*-linux-gnu/libclang.so*" >/dev/null ||
  compgen -G "/usr/lib/*-linux-gnu/libclang-[0-9]*.so*" >/dev/null || missing+=(libclang-dev)
compgen -G "/usr/include/*-linux-gnu/curl/curl.h" >/dev/null ||
  [[ -f /usr/include/curl/curl.h ]] || missing+=(libcurl4-openssl-dev)
[[ -f /usr/include/openssl/ssl.h ]] || missing+=(libssl-dev)
[[ -f /usr/include/sasl/sasl.h ]] || missing+=(libsasl2-dev)
if ((!build_only)); then
  command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null || missing+=(maven)
  command -v python3 >/dev/null || missing+=(python3)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  # Headless Chromium loads the web page (`ui:`) in cli/tests/web_ui.rs.
  command -v chromium >/dev/null || missing+=(chromium)
  # The container tests (testkit/tests): an engine, compose, and debootstrap
  # for the base image. A Docker that already answers is used as it is.
  docker info >/dev/null 2>&1 || command -v dockerd >/dev/null || missing+=(docker.io)
  docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null || missing+=(docker-compose)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
fi
if ((${#missing[@]})); then
  note "installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

((build_only)) && exit 0

# dockerd where no Docker engine answers (machines without systemd do not
# start it): its own session, so it outlives this script; log in /var/log.
if ! docker info >/dev/null 2>&1; then
  SUDO=""
  [[ $(id -u) -eq 0 ]] || SUDO="sudo"
  if ! pgrep -x dockerd >/dev/null; then
    note "starting dockerd (log: /var/log/tidemark-dockerd.log)"
    $SUDO sh -c 'setsid nohup dockerd >>/var/log/tidemark-dockerd.log 2>&1 </dev/null &'
  fi
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || {
    tail -n 20 /var/log/tidemark-dockerd.log >&2
    note "dockerd did not answer within 30 s"
    exit 1
  }
fi

rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

pip_install() {
  python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
python3 -c 'import fastavro' 2>/dev/null || { note "installing fastavro"; pip_install fastavro; }
python3 -c 'import deltalake, pyarrow' 2>/dev/null || { note "installing deltalake"; pip_install "deltalake>=1.1" pyarrow; }
exit 0
