//! Helpers for tests against a real Kafka broker (`KAFKA_BOOTSTRAP`, default
//! `127.0.0.1:9092`; `scripts/test.sh` starts one).

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::TopicPartitionList;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The broker under test.
pub fn bootstrap() -> String {
    tidemark_connectors::kafka::default_bootstrap()
}

/// A client configuration for the broker under test, in plaintext.
pub fn plain() -> ClientConfig {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap());
    config
}

/// The secured listener of the broker under test: SASL_SSL with SCRAM.
/// From `KAFKA_SECURE_BOOTSTRAP`, `KAFKA_SECURE_CA`, `KAFKA_SECURE_OTHER_CA`,
/// `KAFKA_SECURE_USER` and `KAFKA_SECURE_PASSWORD` when set, else from
/// `scripts/kafka.sh secure-env` (the broker the script runs).
#[derive(Debug, Clone)]
pub struct Secured {
    /// Its bootstrap servers.
    pub bootstrap: String,
    /// The CA file that signed the broker's certificate.
    pub ca: String,
    /// A CA file that did not sign it.
    pub other_ca: String,
    /// A SCRAM user allowed the `secure-*` topics, groups and transactional ids.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl Secured {
    /// The secured listener under test; panics (failing the test) when
    /// there is none.
    pub fn from_env() -> Secured {
        let mut settings: BTreeMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with("KAFKA_SECURE_"))
            .collect();
        if !settings.contains_key("KAFKA_SECURE_BOOTSTRAP") {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/kafka.sh");
            let out = std::process::Command::new("bash")
                .args([script, "secure-env"])
                .output()
                .expect("scripts/kafka.sh secure-env");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if let Some((k, v)) = line.split_once('=') {
                    settings.insert(k.to_string(), v.to_string());
                }
            }
        }
        let get = |key: &str| {
            settings.get(key).cloned().unwrap_or_else(|| {
                panic!("no secured Kafka listener: set {key} (or run scripts/kafka.sh start)")
            })
        };
        let password = match settings.get("KAFKA_SECURE_PASSWORD") {
            Some(password) => password.clone(),
            None => std::fs::read_to_string(get("KAFKA_SECURE_PASSWORD_FILE"))
                .expect("the secured listener's password file")
                .trim()
                .to_string(),
        };
        Secured {
            bootstrap: get("KAFKA_SECURE_BOOTSTRAP"),
            ca: get("KAFKA_SECURE_CA"),
            other_ca: get("KAFKA_SECURE_OTHER_CA"),
            user: get("KAFKA_SECURE_USER"),
            password,
        }
    }

    /// A client configuration for it.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "SCRAM-SHA-512")
            .set("sasl.username", &self.user)
            .set("sasl.password", &self.password)
            .set("ssl.ca.location", &self.ca);
        config
    }
}

/// A name unique to this test run.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// Creates a topic.
pub fn create_topic(name: &str, partitions: i32) {
    tidemark_connectors::kafka::ensure_topic(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        name,
        partitions,
    )
    .expect("create topic");
}

/// Produces `(key, value)` records and waits for their acknowledgement.
pub fn produce(topic: &str, records: &[(String, Vec<u8>)]) {
    produce_to(topic, None, records)
}

/// Produces to one partition (or by key hash when `None`), in order.
pub fn produce_to(topic: &str, partition: Option<i32>, records: &[(String, Vec<u8>)]) {
    produce_with(&plain(), topic, partition, records)
}

/// [`produce_to`] with the client configuration `base` (another listener,
/// a compression codec).
pub fn produce_with(
    base: &ClientConfig,
    topic: &str,
    partition: Option<i32>,
    records: &[(String, Vec<u8>)],
) {
    let records: Vec<_> = records
        .iter()
        .map(|(key, value)| (partition, key.clone(), value.clone()))
        .collect();
    produce_each_with(base, topic, &records);
}

/// Produces `(partition, key, value)` records to `topic` with one producer,
/// in their order (the partition `None`: by key), and waits for them all.
pub fn produce_each_with(
    base: &ClientConfig,
    topic: &str,
    records: &[(Option<i32>, String, Vec<u8>)],
) {
    let producer: ThreadedProducer<DefaultProducerContext> = base
        .clone()
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    for (partition, key, value) in records {
        let mut pending = BaseRecord::to(topic).key(key).payload(value);
        if let Some(p) = partition {
            pending = pending.partition(*p);
        }
        loop {
            match producer.send(pending) {
                Ok(()) => break,
                Err((_, back)) => {
                    std::thread::sleep(Duration::from_millis(5));
                    pending = back;
                }
            }
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// Produces a tombstone (a record with a key and no value) to `topic`.
pub fn produce_tombstone(topic: &str, key: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .expect("producer");
    producer
        .send(BaseRecord::<str, [u8]>::to(topic).key(key))
        .map_err(|(e, _)| e)
        .expect("send");
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// One consumed record.
#[derive(Debug, Clone)]
pub struct Consumed {
    /// Partition.
    pub partition: i32,
    /// Key.
    pub key: Option<Vec<u8>>,
    /// Value.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: BTreeMap<String, String>,
}

/// Reads `topic` from the beginning until `expected` records arrived or
/// `timeout` passed, then keeps reading one more second to catch extras.
pub fn consume_all(topic: &str, expected: usize, timeout: Duration) -> Vec<Consumed> {
    consume_until(topic, timeout, |out| out.len() >= expected)
}

/// Reads `topic` (committed records) from the beginning until `done`
/// holds for what arrived or `timeout` passed, then keeps reading one more
/// second to catch extras.
pub fn consume_until(
    topic: &str,
    timeout: Duration,
    done: impl Fn(&[Consumed]) -> bool,
) -> Vec<Consumed> {
    consume_with(&plain(), topic, timeout, "read_committed", done)
}

/// Every record of `topic`, committed or not (aborted transactions' and
/// open ones' too), read for `timeout`: to tell, when a test misses
/// records, whether they were never written or are held back.
pub fn consume_uncommitted(topic: &str, timeout: Duration) -> Vec<Consumed> {
    consume_with(&plain(), topic, timeout, "read_uncommitted", |_| false)
}

/// Reads `topic` from the beginning with the client configuration `base`
/// and `isolation_level` until `done` holds or `timeout` passed, then one
/// more second to catch extras.
pub fn consume_with(
    base: &ClientConfig,
    topic: &str,
    timeout: Duration,
    isolation_level: &str,
    done: impl Fn(&[Consumed]) -> bool,
) -> Vec<Consumed> {
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", unique("reader"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation_level)
        .create()
        .expect("consumer");
    consumer.subscribe(&[topic]).expect("subscribe");
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    let mut settle: Option<Instant> = None;
    while Instant::now() < deadline {
        if settle.is_some() || done(&out) {
            let s = *settle.get_or_insert_with(|| Instant::now() + Duration::from_secs(1));
            if Instant::now() >= s {
                break;
            }
        }
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let headers = m
                .headers()
                .map(|hs| {
                    hs.iter()
                        .map(|h| {
                            (
                                h.key.to_string(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).to_string(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Consumed {
                partition: m.partition(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers,
            });
        }
    }
    out
}

/// The group's committed offset and the end offset of each partition.
pub fn committed_and_end(group: &str, topic: &str, partitions: i32) -> Vec<(i64, i64)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed");
    (0..partitions)
        .map(|p| {
            let c = committed
                .find_partition(topic, p)
                .and_then(|e| e.offset().to_raw())
                .unwrap_or(-1);
            let (_, high) = consumer
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks");
            (c, high)
        })
        .collect()
}

/// Compacts the Delta table at `path` with the Python `deltalake` package
/// (`optimize.compact()`): another writer's commit, as a maintenance job
/// makes one. Returns its metrics and the table's new version.
pub fn optimize_delta(path: &std::path::Path) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/optimize_delta.py");
    let output = std::process::Command::new("python3")
        .arg(script)
        .arg(path)
        .output()
        .expect("running python3");
    assert!(
        output.status.success(),
        "optimize_delta.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("optimize_delta.py prints JSON")
}

/// Reads the Delta table at `path` with the Python `deltalake` package
/// (installed by `scripts/test.sh`): version, schema, partition columns,
/// files, rows, history and, with `app_id`, its `txn` version.
pub fn read_delta(path: &std::path::Path, app_id: Option<&str>) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/read_delta.py");
    let mut command = std::process::Command::new("python3");
    command.arg(script).arg(path);
    if let Some(app) = app_id {
        command.arg(app);
    }
    let output = command.output().expect("running python3");
    assert!(
        output.status.success(),
        "read_delta.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("read_delta.py prints JSON")
}
