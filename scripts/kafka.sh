#!/usr/bin/env bash
# Run a real, single-node Apache Kafka 4.1.1 broker (KRaft, combined
# broker+controller, node.id=1) assembled from Maven Central jars; no Docker,
# no tarball.
#
#   scripts/kafka.sh start    assemble jars if needed, format storage if needed,
#                             start the broker, wait until it answers a metadata
#                             request; prints KAFKA_BOOTSTRAP=host:port.
#                             Idempotent: a running broker is left alone.
#   scripts/kafka.sh stop     SIGTERM, up to 30 s, then SIGKILL. 0 if not running.
#   scripts/kafka.sh restart  stop + start
#   scripts/kafka.sh status   prints "running" and exits 0 if the broker answers,
#                             otherwise prints "not running" and exits 1.
#   scripts/kafka.sh reset    stop and delete the data dir (next start formats anew)
#   scripts/kafka.sh logs     tail of broker.log
#   scripts/kafka.sh classpath  prints the classpath glob (for running Kafka CLI
#                             classes: java -cp "$(scripts/kafka.sh classpath)" ...)
#   scripts/kafka.sh assemble   fetches the jars if needed (no broker started) and
#                             prints their folder (scripts/images.sh copies it
#                             into the Kafka container image)
#   scripts/kafka.sh secure-env prints the secured listener's settings as
#                             KEY=value lines (see below)
#
# Besides PLAINTEXT on 127.0.0.1:9092 the broker has a secured listener,
# SASL_SSL on localhost:9094: TLS with a certificate signed by a CA made at the
# first start (tls/ca.pem; tls/other-ca.pem is a second CA that signed
# nothing, for testing a wrong CA), SASL SCRAM-SHA-512 and SCRAM-SHA-256 with
# the user `tidemark` (password in tls/scram-password, made at random). An
# authorizer with prefixed ACLs gives the topics, groups and transactional ids
# named `secure-*` to User:tidemark alone: a client reaching them over
# PLAINTEXT (User:ANONYMOUS) is refused; everything else stays open to all.
#
# Environment:
#   TIDEMARK_KAFKA_HOME             work dir (default ~/.cache/tidemark-kafka):
#                                   libs/, data/, server.properties, log4j2 config,
#                                   broker.log, broker.pid
#   TIDEMARK_KAFKA_PORT             client port (default 9092)
#   TIDEMARK_KAFKA_CONTROLLER_PORT  controller port (default 9093)
#   TIDEMARK_KAFKA_SECURE_PORT      SASL_SSL port (default 9094)
#   TIDEMARK_KAFKA_HEAP_OPTS        default "-Xmx2g -Xms1g" (with 768 MB the broker
#                                   collected every few seconds once benchmark
#                                   topics piled up: 10 ms pauses in latency runs)
#   TIDEMARK_KAFKA_START_TIMEOUT    seconds to wait for readiness (default 90)
#   JAVA_HOME                       java to use (default: java on PATH; needs 17+)
#
# The first start runs Maven (mvn -q -B) to copy the runtime jars into libs/;
# ~/.m2 caches the downloads. Later starts skip Maven entirely while the hash of
# scripts/kafka/pom.xml matches the one stored next to libs/.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
POM="$SCRIPT_DIR/kafka/pom.xml"

KH="${TIDEMARK_KAFKA_HOME:-$HOME/.cache/tidemark-kafka}"
HOST=127.0.0.1
PORT="${TIDEMARK_KAFKA_PORT:-9092}"
CPORT="${TIDEMARK_KAFKA_CONTROLLER_PORT:-9093}"
SPORT="${TIDEMARK_KAFKA_SECURE_PORT:-9094}"
SECURE_HOST=localhost
SCRAM_USER=tidemark
SECURE_PREFIX=secure-
HEAP_OPTS="${TIDEMARK_KAFKA_HEAP_OPTS:--Xmx2g -Xms1g}"
START_TIMEOUT="${TIDEMARK_KAFKA_START_TIMEOUT:-90}"
STOP_TIMEOUT=30
BOOTSTRAP="$HOST:$PORT"

LIBS="$KH/libs"
LIBS_HASH_FILE="$KH/libs.pom.sha256"
DATA="$KH/data"
PROPS="$KH/server.properties"
LOG4J="$KH/log4j2.properties"
TOOLS_LOG4J="$KH/tools-log4j2.properties"
CLIENT_PROPS="$KH/client.properties"
LOG="$KH/broker.log"
OUT="$KH/broker.out"
PID_FILE="$KH/broker.pid"
TLS="$KH/tls"

if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA="$(command -v java || true)"
fi

log() { echo "kafka.sh: $*" >&2; }
die() { log "$*"; exit 1; }

need_java() {
  [[ -n "$JAVA" ]] || die "java not found (install a JDK 17+ or set JAVA_HOME)"
}

# ---------------------------------------------------------------- process state

# Prints the broker pid if the pid file names a live kafka.Kafka process.
broker_pid() {
  local pid
  [[ -f "$PID_FILE" ]] || return 1
  pid="$(cat "$PID_FILE" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  # guard against pid reuse: it must be our broker
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka' || return 1
  echo "$pid"
}

port_open() { # host port
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# Runs a Kafka CLI class with the assembled classpath, quiet logging and a fast,
# small client JVM: kafka_tool [timeout-seconds] class args...
kafka_tool() {
  local limit=600
  if [[ "$1" =~ ^[0-9]+$ ]]; then limit="$1"; shift; fi
  timeout "$limit" "$JAVA" -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xshare:auto \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$TOOLS_LOG4J" \
    -cp "$LIBS/*" "$@"
}

# True when the broker answers a metadata request (TopicCommand --list sends a
# MetadataRequest through the AdminClient). The cheap TCP probe comes first so
# polling does not launch a JVM while the port is still closed.
broker_answers() {
  port_open "$HOST" "$PORT" || return 1
  [[ -f "$CLIENT_PROPS" && -f "$TOOLS_LOG4J" ]] || return 1
  compgen -G "$LIBS/kafka-tools-*.jar" >/dev/null || return 1
  kafka_tool 30 org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" \
    --command-config "$CLIENT_PROPS" --list >/dev/null 2>&1
}

# ---------------------------------------------------------------- assembly

pom_hash() { sha256sum "$POM" | cut -d' ' -f1; }

libs_ready() {
  [[ -f "$LIBS_HASH_FILE" && "$(cat "$LIBS_HASH_FILE")" == "$(pom_hash)" ]] || return 1
  compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null
}

assemble() {
  if libs_ready; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found (apt-get install maven), needed once to fetch the Kafka jars"
  log "assembling Kafka jars from Maven Central into $LIBS (first time only) ..."
  local t0=$SECONDS tmp="$KH/libs.tmp.$$"
  rm -rf "$tmp"
  # -DlibsDir is the copy-dependencies output folder; nothing is built in the repo
  # Output goes to stderr (start's stdout is only the KAFKA_BOOTSTRAP line), minus
  # the stray ANSI resets that Debian's Maven 3.8 prints even in batch mode.
  if ! mvn -q -B -Dstyle.color=never -f "$POM" -DlibsDir="$tmp" package 2>&1 \
      | sed 's/\x1b\[[0-9;]*m//g' >&2; then
    rm -rf "$tmp"
    die "mvn failed to assemble the Kafka jars"
  fi
  compgen -G "$tmp/kafka_2.13-*.jar" >/dev/null || { rm -rf "$tmp"; die "mvn produced no kafka_2.13 jar in $tmp"; }
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
  pom_hash >"$LIBS_HASH_FILE"
  local jars=("$LIBS"/*.jar)
  log "assembled ${#jars[@]} jars in $((SECONDS - t0)) s"
}

# ---------------------------------------------------------------- config

write_config() {
  cat >"$PROPS" <<EOF
# Generated by scripts/kafka.sh; rewritten on every start.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@$HOST:$CPORT
controller.listener.names=CONTROLLER
listeners=PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CPORT,SASL_SSL://$HOST:$SPORT
advertised.listeners=PLAINTEXT://$HOST:$PORT,SASL_SSL://$SECURE_HOST:$SPORT
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL
log.dirs=$DATA

# the secured listener: TLS + SCRAM
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PKCS12
listener.name.sasl_ssl.ssl.keystore.location=$TLS/broker.p12
listener.name.sasl_ssl.ssl.keystore.password=$(cat "$TLS/store-password")
listener.name.sasl_ssl.ssl.key.password=$(cat "$TLS/store-password")
# ACLs guard only what has ACLs (the secure-* resources)
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=true

# single node: every replication factor / min ISR is 1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
default.replication.factor=1
min.insync.replicas=1

auto.create.topics.enable=true
num.partitions=1
group.initial.rebalance.delay.ms=0
EOF

  cat >"$LOG4J" <<EOF
# Generated by scripts/kafka.sh: broker logging at INFO to broker.log.
status = warn
name = tidemark-kafka
# Kafka's own shutdown hook logs the clean shutdown; log4j's hook would stop
# the appender first and cut those lines off.
shutdownHook = disable

appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = $LOG
appender.file.filePattern = $LOG.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3

rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE

# noisy loggers
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
logger.cleaner.name = org.apache.kafka.storage.internals.log.LogCleaner
logger.cleaner.level = WARN
logger.purgatoryreaper.name = org.apache.kafka.server.purgatory.DelayedOperationPurgatory\$ExpiredOperationReaper
logger.purgatoryreaper.level = WARN
logger.throttlereaper.name = kafka.server.ClientQuotaManager\$ThrottledChannelReaper
logger.throttlereaper.level = WARN
logger.timerreaper.name = org.apache.kafka.server.util.timer.SystemTimerReaper\$Reaper
logger.timerreaper.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.appinfo.name = org.apache.kafka.common.utils.AppInfoParser
logger.appinfo.level = WARN
logger.netclient.name = org.apache.kafka.clients.NetworkClient
logger.netclient.level = WARN
EOF

  cat >"$TOOLS_LOG4J" <<EOF
# Generated by scripts/kafka.sh: Kafka CLI tools log only warnings, to stderr.
status = error
name = tidemark-kafka-tools
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
logger.netclient.name = org.apache.kafka.clients.NetworkClient
logger.netclient.level = ERROR
EOF

  cat >"$CLIENT_PROPS" <<EOF
# Generated by scripts/kafka.sh: short timeouts for the readiness probe.
request.timeout.ms=5000
default.api.timeout.ms=8000
socket.connection.setup.timeout.ms=2000
socket.connection.setup.timeout.max.ms=2000
reconnect.backoff.max.ms=500
EOF
}

# A CA, a broker certificate it signs (localhost / 127.0.0.1), a second CA
# that signs nothing, and the SCRAM password; made once.
make_tls() {
  [[ -f "$TLS/broker.p12" && -f "$TLS/other-ca.pem" && -f "$TLS/scram-password" ]] && return 0
  local keytool store_pw
  keytool="$(dirname "$(readlink -f "$JAVA")")/keytool"
  rm -rf "$TLS" && mkdir -p "$TLS"
  store_pw="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
  echo "$store_pw" >"$TLS/store-password"
  head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$TLS/scram-password"
  chmod 600 "$TLS"/*
  local kt=("$keytool" -storetype PKCS12 -storepass "$store_pw" -keypass "$store_pw")
  local san="SAN=dns:localhost,ip:127.0.0.1"
  for ca in ca other-ca; do
    "${kt[@]}" -genkeypair -alias "$ca" -keyalg RSA -keysize 2048 -validity 3650 \
      -dname "CN=tidemark test $ca" -ext bc:c -keystore "$TLS/$ca.p12" 2>/dev/null
    "${kt[@]}" -exportcert -rfc -alias "$ca" -keystore "$TLS/$ca.p12" -file "$TLS/$ca.pem" 2>/dev/null
  done
  "${kt[@]}" -genkeypair -alias broker -keyalg RSA -keysize 2048 -validity 3650 \
    -dname "CN=localhost" -ext "$san" -keystore "$TLS/broker.p12" 2>/dev/null
  "${kt[@]}" -certreq -alias broker -keystore "$TLS/broker.p12" 2>/dev/null |
    "${kt[@]}" -gencert -rfc -alias ca -keystore "$TLS/ca.p12" -ext "$san" -validity 3650 \
      -outfile "$TLS/broker.pem" 2>/dev/null
  "${kt[@]}" -importcert -noprompt -alias ca -file "$TLS/ca.pem" -keystore "$TLS/broker.p12" 2>/dev/null
  "${kt[@]}" -importcert -alias broker -file "$TLS/broker.pem" -keystore "$TLS/broker.p12" 2>/dev/null
  log "made a test CA and broker certificate in $TLS"
}

# The SCRAM user and the ACLs that give it the secure-* resources (both
# idempotent: adding what exists changes nothing).
secure_listener_users() {
  local pw
  pw="$(cat "$TLS/scram-password")"
  local mechanism resource
  # One mechanism per request: the broker refuses two for a user at once.
  for mechanism in SCRAM-SHA-512 SCRAM-SHA-256; do
    kafka_tool 60 kafka.admin.ConfigCommand --bootstrap-server "$BOOTSTRAP" \
      --command-config "$CLIENT_PROPS" --alter --entity-type users --entity-name "$SCRAM_USER" \
      --add-config "$mechanism=[password=$pw]" >/dev/null || return 1
  done
  for resource in "--topic $SECURE_PREFIX" "--group $SECURE_PREFIX" "--transactional-id $SECURE_PREFIX"; do
    # shellcheck disable=SC2086
    kafka_tool 60 org.apache.kafka.tools.AclCommand --bootstrap-server "$BOOTSTRAP" \
      --command-config "$CLIENT_PROPS" --add --allow-principal "User:$SCRAM_USER" \
      --operation All $resource --resource-pattern-type prefixed >/dev/null || return 1
  done
}

cmd_secure_env() {
  echo "KAFKA_SECURE_BOOTSTRAP=$SECURE_HOST:$SPORT"
  echo "KAFKA_SECURE_CA=$TLS/ca.pem"
  echo "KAFKA_SECURE_OTHER_CA=$TLS/other-ca.pem"
  echo "KAFKA_SECURE_USER=$SCRAM_USER"
  echo "KAFKA_SECURE_PASSWORD_FILE=$TLS/scram-password"
}

format_storage() {
  if [[ -f "$DATA/meta.properties" ]]; then
    return 0
  fi
  local cid
  cid="$(kafka_tool kafka.tools.StorageTool random-uuid | tail -n1)"
  [[ -n "$cid" ]] || die "StorageTool random-uuid printed nothing"
  log "formatting $DATA with cluster id $cid"
  # Static controller.quorum.voters: no --standalone (that is for
  # controller.quorum.bootstrap.servers / dynamic quorums).
  kafka_tool kafka.tools.StorageTool format -t "$cid" -c "$PROPS" --ignore-formatted >&2
}

# ---------------------------------------------------------------- commands

print_bootstrap() { echo "KAFKA_BOOTSTRAP=$BOOTSTRAP"; }

# Tail of what this start-up wrote (broker.log keeps earlier runs too).
LOG_OFFSET=0
show_log_tail() {
  log "---- tail of $LOG (this start-up) ----"
  if [[ -f "$LOG" ]]; then
    tail -c "+$((LOG_OFFSET + 1))" "$LOG" | tail -n 60 >&2 || true
  fi
  if [[ -s "$OUT" ]]; then
    log "---- tail of $OUT (stdout/stderr) ----"
    tail -n 30 "$OUT" >&2 || true
  fi
}

wait_ready() { # pid
  local pid="$1" deadline=$((SECONDS + START_TIMEOUT))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "broker process $pid exited during start-up"
      rm -f "$PID_FILE"
      show_log_tail
      return 1
    fi
    if broker_answers; then
      return 0
    fi
    sleep 0.5
  done
  log "broker did not answer on $BOOTSTRAP within ${START_TIMEOUT} s (pid $pid still running; see '$0 stop')"
  show_log_tail
  return 1
}

cmd_start() {
  need_java
  mkdir -p "$KH"
  # serialise concurrent start/stop calls; the broker must not inherit the lock fd
  exec 9>"$KH/.lock"
  flock -w 300 9 || die "could not lock $KH/.lock"

  local pid t0=$SECONDS
  if pid="$(broker_pid)" && ! port_open "$HOST" "$SPORT"; then
    log "running without the secured listener (an older configuration): restarting"
    flock -u 9
    cmd_stop
    exec 9>"$KH/.lock"
    flock -w 300 9 || die "could not lock $KH/.lock"
  fi
  if pid="$(broker_pid)"; then
    if broker_answers; then
      log "already running (pid $pid)"
      print_bootstrap
      return 0
    fi
    log "broker pid $pid is running but not answering yet; waiting"
    wait_ready "$pid" || exit 1
    print_bootstrap
    return 0
  fi
  rm -f "$PID_FILE"

  if port_open "$HOST" "$PORT" || port_open "$HOST" "$CPORT" || port_open "$HOST" "$SPORT"; then
    die "port $PORT or $CPORT on $HOST is already in use by a process not started from $KH (set TIDEMARK_KAFKA_PORT / TIDEMARK_KAFKA_CONTROLLER_PORT or stop it)"
  fi

  assemble
  make_tls
  write_config
  mkdir -p "$DATA"
  format_storage

  log "starting broker on $BOOTSTRAP (controller $HOST:$CPORT), log: $LOG"
  : >"$OUT"
  LOG_OFFSET="$(stat -c %s "$LOG" 2>/dev/null || echo 0)"
  # setsid + nohup: own session, survives the calling shell. The inner bash
  # writes its own pid and execs java, so the pid file names the JVM.
  # shellcheck disable=SC2086,SC2016
  setsid nohup bash -c 'echo $$ >"$1"; shift; exec "$@"' kafka-launch "$PID_FILE" \
    "$JAVA" $HEAP_OPTS -server \
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
    -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 \
    -Djava.awt.headless=true \
    -Dkafka.logs.dir="$KH" \
    -Dlog4j2.configurationFile="$LOG4J" \
    -cp "$LIBS/*" kafka.Kafka "$PROPS" \
    </dev/null >>"$OUT" 2>&1 9>&- &

  local _
  for _ in $(seq 1 50); do
    pid="$(cat "$PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] && break
    sleep 0.1
  done
  [[ "$pid" =~ ^[0-9]+$ ]] || die "broker launcher did not write $PID_FILE"

  wait_ready "$pid" || exit 1
  secure_listener_users || die "could not create the SCRAM user and ACLs of the secured listener"
  log "broker ready (pid $pid) in $((SECONDS - t0)) s"
  print_bootstrap
}

cmd_stop() {
  mkdir -p "$KH"
  exec 9>"$KH/.lock"
  flock -w 300 9 || die "could not lock $KH/.lock"
  local pid
  if ! pid="$(broker_pid)"; then
    rm -f "$PID_FILE"
    log "not running"
    return 0
  fi
  log "stopping broker (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "broker did not exit within ${STOP_TIMEOUT} s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  fi
  rm -f "$PID_FILE"
  log "stopped"
}

cmd_status() {
  need_java
  if broker_answers; then
    echo "running"
    return 0
  fi
  if pid="$(broker_pid)"; then
    echo "not running (pid $pid alive but not answering on $BOOTSTRAP)"
  else
    echo "not running"
  fi
  return 1
}

cmd_reset() {
  cmd_stop
  log "deleting $DATA"
  rm -rf "$DATA"
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  restart) cmd_stop; cmd_start ;;
  status) cmd_status ;;
  reset) cmd_reset ;;
  logs) tail -n "${2:-100}" "$LOG" ;;
  classpath) echo "$LIBS/*" ;;
  assemble) mkdir -p "$KH"; assemble; echo "$LIBS" ;;
  secure-env) cmd_secure_env ;;
  *)
    echo "usage: $0 start|stop|restart|status|reset|logs [N]|classpath|assemble|secure-env" >&2
    exit 2
    ;;
esac
