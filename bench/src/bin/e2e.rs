//! End-to-end throughput against a real Kafka broker, in one run:
//!
//! 1. creates a fresh input topic and produces `--records` keyed JSON records
//!    of about `--value-bytes` bytes (10% with a negative amount);
//! 2. measures the raw consume rate of a plain rdkafka `BaseConsumer` (fresh
//!    group, earliest) reading every record and touching each payload;
//!    for the filter, also the raw pipe: that consumer producing the
//!    records the filter keeps, unchanged and undecoded, to a third topic
//!    (the ceiling of a pipeline that writes what it reads);
//! 3. measures tidemark's pipeline on the same topic, available-now:
//!    `--pipeline filter` (default) is Kafka → JSON decode → the filter
//!    `amount >= 0` → Kafka (JSON), checked to write exactly the 90% of
//!    records that pass; `--pipeline window` is a 5-minute tumbling count
//!    and sum of `amount` per `id` in update mode, checked by the latest
//!    row of every window adding up to every input record (run from a
//!    pipeline file with RocksDB state and a changelog, as `tidemark run`
//!    runs it; `--state memory` keeps the windows in memory);
//!    `--guarantee exactly-once` runs that file with `processing_guarantee:
//!    exactly_once` (Kafka Streams with `exactly_once_v2`);
//! 4. with `--kafka-streams JAR` (built by `bench/peers/build.sh`), runs
//!    Kafka Streams on the same topic with the same pipeline, checked the
//!    same way, and reports tidemark / Kafka Streams;
//! 5. prints a markdown table (and writes JSON with `--json PATH`).
//!
//! ```text
//! cargo run -p tidemark-bench --bin e2e -- --records 300000
//! cargo run -p tidemark-bench --bin e2e -- --records 2000000 --pipeline window \
//!     --kafka-streams "$(bench/peers/build.sh)"
//! ```

use anyhow::{ensure, Context};
use clap::Parser;
use hdrhistogram::Histogram;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark::decode::JsonDecoder;
use tidemark::prelude::*;
use tidemark_connectors::kafka::{
    default_bootstrap, ensure_topic, KafkaSink, KafkaSource, KafkaSourceConfig, KeyColumns,
    ValueFormat,
};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(about = "End-to-end Kafka throughput: raw rdkafka consume vs tidemark's filter pipeline")]
struct Args {
    /// Records to produce and process.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Partitions of the input and output topics.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Bootstrap servers (default: `KAFKA_BOOTSTRAP`, else 127.0.0.1:9092).
    #[arg(long, default_value_t = default_bootstrap())]
    bootstrap: String,
    /// A librdkafka property every client of the run gets, `name=value`
    /// (repeatable): `--property security.protocol=SASL_SSL ...` measures
    /// over a secured listener (`bench/secured.sh`).
    #[arg(long = "property", value_parser = parse_property)]
    properties: Vec<(String, String)>,
    /// Approximate size of each record value in bytes.
    #[arg(long, default_value_t = 100)]
    value_bytes: usize,
    /// tidemark's `max_records_per_batch`.
    #[arg(long, default_value_t = 50_000)]
    max_records_per_batch: usize,
    /// Raw consume runs (each in a fresh group); the median is reported, as
    /// a single short run is noisy on a small machine.
    #[arg(long, default_value_t = 3)]
    raw_runs: usize,
    /// librdkafka's `fetch.queue.backoff.ms` for both consumers. With its
    /// default (1000), once the prefetch queue passes its threshold the
    /// fetcher waits a whole second even if the application drains the queue
    /// in milliseconds, which made the raw consume time bimodal (0.36 s or
    /// 1.3 s for 300k records). tidemark's source gets the same value, so
    /// both read with the same settings.
    #[arg(long, default_value_t = 10)]
    fetch_queue_backoff_ms: u32,
    /// Also write the results as JSON to this path.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Keep the input and output topics instead of deleting them at the end.
    #[arg(long)]
    keep_topics: bool,
    /// The pipeline both engines run.
    #[arg(long, value_enum, default_value_t = PipelineKind::Filter)]
    pipeline: PipelineKind,
    /// The Kafka Streams peer's jar (`bench/peers/build.sh` prints its
    /// path): runs the same pipeline on the same topic, side by side.
    #[arg(long)]
    kafka_streams: Option<PathBuf>,
    /// Where tidemark's window state lives: `rocksdb` (with a changelog
    /// topic, as Kafka Streams keeps it; run as `tidemark run` runs a
    /// pipeline file) or `memory`.
    #[arg(long, value_enum, default_value_t = StateKind::Rocksdb)]
    state: StateKind,
    /// Processing guarantee on both sides: `exactly-once` runs tidemark's
    /// window pipeline file with `processing_guarantee: exactly_once` and
    /// Kafka Streams with `exactly_once_v2`; outputs are then read
    /// `read_committed`.
    #[arg(long, value_enum, default_value_t = Guarantee::AtLeastOnce)]
    guarantee: Guarantee,
    /// The window pipeline's `watermark_scope`: `partition` (by default
    /// here: Kafka Streams' stream time is per partition, so the two
    /// engines compute the same thing) or `query` (Spark's, the pipeline
    /// file's default; batches planned by offsets per partition).
    #[arg(long, default_value = "partition", value_parser = parse_scope)]
    watermark_scope: tidemark::watermark::WatermarkScope,
    /// How the in-memory pipelines (`--state memory`, or the stateless
    /// filter) carry records: `columns` (the engine's own choice: decoded
    /// into Arrow columns, and for the filter written to Kafka from them)
    /// or `rows` (the row route forced, to compare the two in one run).
    #[arg(long, value_enum, default_value_t = Route::Columns)]
    route: Route,
}

/// How the engine carries the records (`--route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Route {
    /// The columnar route where the chain allows it.
    Columns,
    /// Rows only.
    Rows,
}

/// A `watermark_scope` named as in a pipeline file.
fn parse_scope(name: &str) -> Result<tidemark::watermark::WatermarkScope, String> {
    serde_json::from_value(serde_json::Value::String(name.to_string()))
        .map_err(|_| format!("`{name}`: expected `query` or `partition`"))
}

/// The processing guarantee both engines run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Guarantee {
    AtLeastOnce,
    ExactlyOnce,
}

impl Guarantee {
    /// The pipeline file's `processing_guarantee`.
    fn tidemark(self) -> &'static str {
        match self {
            Guarantee::AtLeastOnce => "at_least_once",
            Guarantee::ExactlyOnce => "exactly_once",
        }
    }
    /// Kafka Streams' `processing.guarantee`.
    fn kafka_streams(self) -> &'static str {
        match self {
            Guarantee::AtLeastOnce => "at_least_once",
            Guarantee::ExactlyOnce => "exactly_once_v2",
        }
    }
}

/// Where the window pipeline's state lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StateKind {
    /// RocksDB under a temporary directory, with a changelog topic.
    Rocksdb,
    /// In the operator's memory, no changelog.
    Memory,
}

/// The benchmarked pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PipelineKind {
    /// Stateless: decode, `amount >= 0`, encode.
    Filter,
    /// 5-minute tumbling count and sum of `amount` per `id`, update mode.
    Window,
}

impl PipelineKind {
    fn name(self) -> &'static str {
        match self {
            PipelineKind::Filter => "filter",
            PipelineKind::Window => "window",
        }
    }
}

/// Times of the Kafka Streams peer.
struct PeerResult {
    records: u64,
    seconds: f64,
}

/// The Kafka Streams version `bench/peers/kafka-streams/pom.xml` builds.
const KAFKA_STREAMS_VERSION: &str = "4.4.0";

/// Times of the raw consumer.
struct RawResult {
    records: u64,
    payload_bytes: u64,
    elapsed: Duration,
    first_record_after: Duration,
}

/// The raw pipe: consume, keep what the filter keeps, produce, no decode.
struct RawPipeResult {
    records_in: u64,
    records_out: u64,
    elapsed: Duration,
}

/// Times and counts of the tidemark pipeline.
struct PipelineResult {
    summary: tidemark::runtime::RunSummary,
    elapsed: Duration,
    output_records: u64,
    batches: BatchStats,
}

/// What the progress listener collects over the batches of a run.
#[derive(Clone)]
struct BatchStats {
    /// Summed phase durations over all batches (`getBatch`, `addBatch`,
    /// `commitOffsets`, `triggerExecution`), in milliseconds.
    phases_ms: BTreeMap<String, u64>,
    /// Per-batch `triggerExecution`, in milliseconds.
    batch_ms: Histogram<u64>,
}

fn parse_property(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{text}` is not name=value"))
}

impl Args {
    /// The cluster every tidemark client of the run connects to.
    fn cluster(&self) -> tidemark_connectors::kafka::KafkaConnection {
        let mut cluster = tidemark_connectors::kafka::KafkaConnection::new(&self.bootstrap);
        for (name, value) in &self.properties {
            cluster = cluster.property(name, value);
        }
        cluster
    }

    /// A librdkafka configuration for the raw clients: the same cluster.
    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.records > 0, "--records must be positive");
    ensure!(args.partitions > 0, "--partitions must be positive");
    ensure!(args.raw_runs > 0, "--raw-runs must be positive");
    ensure!(
        args.properties.is_empty() || args.kafka_streams.is_none(),
        "--property does not reach the Kafka Streams peer: run it without --kafka-streams"
    );
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let input = format!("bench-e2e-in-{run}");
    let output = format!("bench-e2e-out-{run}");
    eprintln!(
        "broker {}, {} records of ~{} bytes, {} partitions, profile {}",
        args.bootstrap,
        args.records,
        args.value_bytes,
        args.partitions,
        tidemark_bench::profile()
    );

    ensure_topic(&args.cluster(), &input, args.partitions)
        .with_context(|| format!("creating `{input}`"))?;
    ensure_topic(&args.cluster(), &output, args.partitions)
        .with_context(|| format!("creating `{output}`"))?;

    let result = measure(&args, &input, &output);
    if !args.keep_topics {
        let raw_pipe = format!("{output}-raw-pipe");
        let mut topics = vec![input.as_str(), output.as_str()];
        if args.pipeline == PipelineKind::Filter {
            topics.push(&raw_pipe);
        }
        if let Err(e) = delete_topics(&args, &topics) {
            eprintln!("warning: deleting the benchmark topics: {e:#}");
        }
    }
    result
}

fn measure(args: &Args, input: &str, output: &str) -> anyhow::Result<()> {
    // 1. Input.
    eprintln!("producing to `{input}` ...");
    let produce_time = produce(args, input, args.records, args.value_bytes)?;
    let in_topic = end_offsets_total(args, input, args.partitions)?;
    ensure!(
        in_topic == args.records,
        "`{input}` holds {in_topic} records, expected {}",
        args.records
    );
    eprintln!(
        "produced {} records in {:.2} s ({:.0} rec/s)",
        args.records,
        produce_time.as_secs_f64(),
        rate(args.records, produce_time)
    );

    // 2. Raw consume.
    let mut raw_runs = Vec::with_capacity(args.raw_runs);
    for run in 1..=args.raw_runs {
        eprintln!("raw rdkafka consume, run {run}/{} ...", args.raw_runs);
        let raw = raw_consume(args, input)?;
        eprintln!(
            "raw: {} records in {:.2} s",
            raw.records,
            raw.elapsed.as_secs_f64()
        );
        raw_runs.push(raw);
    }
    raw_runs.sort_by_key(|r| r.elapsed);

    // 2b. The raw pipe: the ceiling of consume + produce on this machine.
    let raw_pipe = match args.pipeline {
        PipelineKind::Filter => {
            eprintln!("raw rdkafka consume -> produce (no decode) ...");
            let pipe = raw_pipe(args, input, &format!("{output}-raw-pipe"))?;
            eprintln!(
                "raw pipe: {} in, {} out in {:.2} s",
                pipe.records_in,
                pipe.records_out,
                pipe.elapsed.as_secs_f64()
            );
            Some(pipe)
        }
        PipelineKind::Window => None,
    };

    // 3. tidemark.
    eprintln!(
        "tidemark {} pipeline `{input}` -> `{output}` ...",
        args.pipeline.name()
    );
    let pipeline = tidemark_pipeline(args, input, output)?;
    ensure!(
        pipeline.summary.input_records == args.records,
        "tidemark read {} records, expected {}",
        pipeline.summary.input_records,
        args.records
    );
    check_output(args, output, "tidemark")?;
    eprintln!(
        "tidemark: {} in, {} out in {:.2} s",
        pipeline.summary.input_records,
        pipeline.output_records,
        pipeline.elapsed.as_secs_f64()
    );

    // 4. Kafka Streams on the same topic.
    let peer = match &args.kafka_streams {
        Some(jar) => Some(kafka_streams(args, jar, input)?),
        None => None,
    };

    // 5. Report.
    report(
        args,
        produce_time,
        &raw_runs,
        raw_pipe.as_ref(),
        &pipeline,
        peer.as_ref(),
    )
}

/// Checks what `engine` wrote to `output`: the filter's 90%, or windows
/// whose latest rows count every input record.
fn check_output(args: &Args, output: &str, engine: &str) -> anyhow::Result<()> {
    match args.pipeline {
        PipelineKind::Filter => {
            let expected = tidemark_bench::expected_kept(args.records);
            let written = end_offsets_total(args, output, args.partitions)?;
            ensure!(
                written == expected,
                "{engine}: `{output}` holds {written} records; expected {expected}"
            );
        }
        PipelineKind::Window => {
            let counted = latest_window_counts(args, output)?;
            ensure!(
                counted == args.records,
                "{engine}: the latest rows of its windows count {counted} records; expected {}",
                args.records
            );
        }
    }
    Ok(())
}

/// Reads `output` whole (`read_committed`: under exactly-once, aborted
/// writes do not count) and adds up the `count` of the latest row of each
/// (`id`, `window_start`): rows are keyed by `id`, so one window's updates
/// are in one partition, in order.
fn latest_window_counts(args: &Args, output: &str) -> anyhow::Result<u64> {
    let consumer: BaseConsumer = reader_config(args, "check")
        .create()
        .context("creating the output reader")?;
    consumer.subscribe(&[output])?;
    let mut ends = Vec::new();
    for partition in 0..args.partitions {
        let (_, high) = consumer.fetch_watermarks(output, partition, Duration::from_secs(10))?;
        ends.push((partition, high));
    }
    let mut latest: BTreeMap<(String, String), u64> = BTreeMap::new();
    let (mut read, deadline) = (0u64, Instant::now() + Duration::from_secs(300));
    // The end offsets count transaction markers too: done when the
    // reader's position (which passes them) reaches every end.
    while !reached(&consumer, output, &ends) {
        ensure!(
            Instant::now() < deadline,
            "reading `{output}`: {read} rows, the end not reached"
        );
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message?;
            read += 1;
            let row: serde_json::Value =
                serde_json::from_slice(message.payload().unwrap_or_default())?;
            let window = (row["id"].to_string(), row["window_start"].to_string());
            latest.insert(window, row["count"].as_u64().unwrap_or(0));
        }
    }
    Ok(latest.values().sum())
}

/// A consumer in a fresh group `bench-e2e-<purpose>-<uuid>` that reads
/// committed records from the earliest offset and commits nothing.
fn reader_config(args: &Args, purpose: &str) -> ClientConfig {
    let mut config = args.client_config();
    config
        .set(
            "group.id",
            format!("bench-e2e-{purpose}-{}", uuid::Uuid::new_v4()),
        )
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed");
    config
}

/// Whether `consumer`'s position in `topic` reached every `(partition, end)`.
fn reached(consumer: &BaseConsumer, topic: &str, ends: &[(i32, i64)]) -> bool {
    let Ok(position) = consumer.position() else {
        return false;
    };
    ends.iter().all(|(partition, end)| {
        *end == 0
            || position
                .find_partition(topic, *partition)
                .and_then(|e| e.offset().to_raw())
                .is_some_and(|o| o >= *end)
    })
}

/// Runs the Kafka Streams peer on `input` (at-least-once), into a topic of
/// its own, and checks its output as tidemark's.
fn kafka_streams(args: &Args, jar: &std::path::Path, input: &str) -> anyhow::Result<PeerResult> {
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let output = format!("bench-e2e-ks-out-{run}");
    ensure_topic(&args.cluster(), &output, args.partitions)?;
    eprintln!(
        "Kafka Streams {} pipeline `{input}` -> `{output}` ...",
        args.pipeline.name()
    );
    let out = std::process::Command::new("java")
        .arg("-jar")
        .arg(jar)
        .args([
            args.pipeline.name(),
            &args.bootstrap,
            input,
            &output,
            &format!("bench-e2e-ks-{run}"),
            args.guarantee.kafka_streams(),
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running java -jar (Java 17 and bench/peers/build.sh)")?;
    ensure!(
        out.status.success(),
        "Kafka Streams peer failed: {:?}",
        out.status
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("peer output: {}", String::from_utf8_lossy(&out.stdout)))?;
    let result = PeerResult {
        records: line["records"].as_u64().unwrap_or(0),
        seconds: line["seconds"].as_f64().unwrap_or(0.0),
    };
    ensure!(
        result.records == args.records,
        "the peer saw {} records",
        result.records
    );
    check_output(args, &output, "Kafka Streams")?;
    if !args.keep_topics {
        delete_topics(args, &[&output])?;
    }
    eprintln!(
        "Kafka Streams: {} records in {:.2} s",
        result.records, result.seconds
    );
    Ok(result)
}

fn rate(records: u64, elapsed: Duration) -> f64 {
    records as f64 / elapsed.as_secs_f64().max(1e-9)
}

/// Produces `records` keyed payloads and waits for every acknowledgement.
fn produce(args: &Args, topic: &str, records: u64, value_bytes: usize) -> anyhow::Result<Duration> {
    let producer: ThreadedProducer<DefaultProducerContext> = args
        .client_config()
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .context("creating the producer")?;
    let start = Instant::now();
    for i in 0..records {
        let key = tidemark_bench::id(i);
        let value = tidemark_bench::payload(i, value_bytes);
        let record = BaseRecord::to(topic).key(&key).payload(&value);
        tidemark_connectors::kafka::send_with_backpressure(&producer, record)
            .with_context(|| format!("producing to `{topic}`"))?;
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the producer")?;
    Ok(start.elapsed())
}

/// The sum of the end offsets of `topic`'s partitions (its record count on a
/// fresh topic).
fn end_offsets_total(args: &Args, topic: &str, partitions: i32) -> anyhow::Result<u64> {
    let consumer: BaseConsumer = args
        .client_config()
        .set(
            "group.id",
            format!("bench-e2e-offsets-{}", uuid::Uuid::new_v4()),
        )
        .create()
        .context("creating a consumer for end offsets")?;
    let mut total = 0;
    for p in 0..partitions {
        let (low, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .with_context(|| format!("end offsets of {topic}/{p}"))?;
        total += (high - low).max(0) as u64;
    }
    Ok(total)
}

/// A plain consumer in a fresh group (`purpose` in its name), with the
/// same fetch settings as tidemark's source, without its commits.
fn raw_consumer(args: &Args, purpose: &str) -> anyhow::Result<BaseConsumer> {
    reader_config(args, purpose)
        .set("fetch.wait.max.ms", "100")
        .set(
            "fetch.queue.backoff.ms",
            args.fetch_queue_backoff_ms.to_string(),
        )
        .create()
        .with_context(|| format!("creating the {purpose} consumer"))
}

/// Reads all `expected` records of `topic` with a plain consumer in a fresh
/// group, touching each payload. The time includes the group join, as the
/// tidemark run's does.
fn raw_consume(args: &Args, topic: &str) -> anyhow::Result<RawResult> {
    let expected = args.records;
    let consumer = raw_consumer(args, "raw")?;
    let start = Instant::now();
    consumer.subscribe(&[topic])?;
    let deadline = start + Duration::from_secs(600);
    let (mut records, mut payload_bytes, mut checksum) = (0u64, 0u64, 0u64);
    let mut first_record_after = None;
    while records < expected {
        ensure!(
            Instant::now() < deadline,
            "raw consumer: only {records} of {expected} records after 10 minutes"
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => eprintln!("raw consumer: {e}"),
            Some(Ok(m)) => {
                first_record_after.get_or_insert_with(|| start.elapsed());
                let payload = m.payload().unwrap_or_default();
                payload_bytes += payload.len() as u64;
                checksum = checksum.wrapping_add(payload.first().copied().unwrap_or(0) as u64);
                records += 1;
            }
        }
    }
    let elapsed = start.elapsed();
    std::hint::black_box(checksum);
    Ok(RawResult {
        records,
        payload_bytes,
        elapsed,
        first_record_after: first_record_after.unwrap_or_default(),
    })
}

/// Consumes all of `input` as [`raw_consume`] does and produces the
/// records the filter keeps (found by a byte search for a negative amount,
/// no JSON decode) to `output`, unchanged, with the sink's producer
/// defaults; timed until every record is acknowledged. No engine can copy
/// records faster on the same machine: the ceiling of a stateless
/// pipeline that writes what it reads.
fn raw_pipe(args: &Args, input: &str, output: &str) -> anyhow::Result<RawPipeResult> {
    ensure_topic(&args.cluster(), output, args.partitions)
        .with_context(|| format!("creating `{output}`"))?;
    let consumer = raw_consumer(args, "raw-pipe")?;
    let producer: ThreadedProducer<DefaultProducerContext> = args
        .client_config()
        .create()
        .context("creating the raw pipe's producer")?;
    let start = Instant::now();
    consumer.subscribe(&[input])?;
    let deadline = start + Duration::from_secs(600);
    let (mut records_in, mut records_out) = (0u64, 0u64);
    while records_in < args.records {
        ensure!(
            Instant::now() < deadline,
            "raw pipe: only {records_in} of {} records after 10 minutes",
            args.records
        );
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => eprintln!("raw pipe: {e}"),
            Some(Ok(m)) => {
                records_in += 1;
                let payload = m.payload().unwrap_or_default();
                if payload.windows(11).any(|w| w == b"\"amount\": -") {
                    continue;
                }
                let mut record = BaseRecord::to(output).payload(payload);
                if let Some(key) = m.key() {
                    record = record.key(key);
                }
                tidemark_connectors::kafka::send_with_backpressure(&producer, record)
                    .with_context(|| format!("producing to `{output}`"))?;
                records_out += 1;
            }
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the raw pipe's producer")?;
    let elapsed = start.elapsed();
    let written = end_offsets_total(args, output, args.partitions)?;
    ensure!(
        records_out == tidemark_bench::expected_kept(args.records) && written == records_out,
        "raw pipe: kept {records_out}, {written} in `{output}`, expected {}",
        tidemark_bench::expected_kept(args.records)
    );
    Ok(RawPipeResult {
        records_in,
        records_out,
        elapsed,
    })
}

/// The window pipeline as a pipeline file, with RocksDB state and a
/// changelog: what `tidemark run` would run.
fn window_pipeline_file(
    args: &Args,
    input: &str,
    output: &str,
    state_dir: &std::path::Path,
) -> String {
    let properties: Vec<String> = args
        .properties
        .iter()
        .map(|(k, v)| format!("{k}: \"{v}\""))
        .collect();
    format!(
        r#"name: bench-e2e-{run}
kafka: {{properties: {{{properties}}}}}
source:
  kind: kafka
  bootstrap: "{bootstrap}"
  topic: {input}
  keyed_by: [id]
  schema: {{event_time: timestamp, id: string, amount: double}}
  properties: {{fetch.queue.backoff.ms: "{backoff}"}}
event_time: event_time
watermark: 10 minutes
watermark_scope: {scope}
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 5 minutes}}
      aggregates: [{{fn: count, as: count}}, {{fn: sum, column: amount, as: sum}}]
output_mode: update
trigger: available_now
max_records_per_batch: {batch}
sink: {{kind: kafka, bootstrap: "{bootstrap}", topic: {output}, key: [id]}}
state: {{dir: "{dir}", changelog: true}}
processing_guarantee: {guarantee}
"#,
        run = uuid::Uuid::new_v4().simple(),
        properties = properties.join(", "),
        bootstrap = args.bootstrap,
        backoff = args.fetch_queue_backoff_ms,
        batch = args.max_records_per_batch,
        dir = state_dir.display(),
        guarantee = args.guarantee.tidemark(),
        scope = serde_json::to_value(args.watermark_scope)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default(),
    )
}

/// The progress listener that sums phases and batch times into `stats`.
fn collect_stats(stats: Arc<Mutex<BatchStats>>) -> impl Fn(&QueryProgress) + Send + 'static {
    move |p: &QueryProgress| {
        let mut stats = stats.lock().unwrap_or_else(|e| e.into_inner());
        for (phase, ms) in &p.duration_ms {
            *stats.phases_ms.entry(phase.clone()).or_default() += ms;
        }
        if let Some(ms) = p.duration_ms.get("triggerExecution") {
            // Saturates rather than fails on an out-of-range value.
            stats.batch_ms.saturating_record(*ms);
        }
    }
}

/// Runs the window pipeline file through `connect`, as `tidemark run`
/// does: RocksDB state, changelog, Kafka sink.
fn tidemark_file_pipeline(
    args: &Args,
    input: &str,
    output: &str,
) -> anyhow::Result<PipelineResult> {
    let dir = tempfile::tempdir()?;
    let text = window_pipeline_file(args, input, output, &dir.path().join("state"));
    let file = tidemark_pipeline::PipelineFile::parse(&text)
        .map_err(|e| anyhow::anyhow!("the window pipeline file: {e}"))?;
    let connected = tidemark_connectors::connect(&file, dir.path())?;
    let (builder, mut source, mut sink) = connected.wire(file.query_builder()?);
    let stats = Arc::new(Mutex::new(BatchStats {
        phases_ms: BTreeMap::new(),
        batch_ms: Histogram::new(3).context("histogram")?,
    }));
    let query = builder.on_progress(collect_stats(stats.clone())).build()?;
    let start = Instant::now();
    let summary = query.run(source.as_mut(), sink.as_mut())?;
    let elapsed = start.elapsed();
    drop(sink);
    let output_records = end_offsets_total(args, output, args.partitions)?;
    let batches = stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(PipelineResult {
        summary,
        elapsed,
        output_records,
        batches,
    })
}

/// Runs KafkaSource → JsonDecoder → filter (or the in-memory window) →
/// KafkaSink (JSON), available-now.
fn tidemark_pipeline(args: &Args, input: &str, output: &str) -> anyhow::Result<PipelineResult> {
    if args.pipeline == PipelineKind::Window && args.state == StateKind::Rocksdb {
        return tidemark_file_pipeline(args, input, output);
    }
    ensure!(
        args.guarantee == Guarantee::AtLeastOnce,
        "--guarantee exactly-once runs the window pipeline from its file: \
         use it with --pipeline window --state rocksdb"
    );
    let mut source = KafkaSource::new(KafkaSourceConfig {
        cluster: args.cluster(),
        topics: vec![input.to_string()],
        group: format!("bench-e2e-tidemark-{}", uuid::Uuid::new_v4()),
        earliest: true,
        properties: BTreeMap::from([(
            "fetch.queue.backoff.ms".to_string(),
            args.fetch_queue_backoff_ms.to_string(),
        )]),
    })?;
    // Window rows are keyed by `id`, so one window's updates stay in order.
    let key = match args.pipeline {
        PipelineKind::Filter => vec![],
        PipelineKind::Window => vec!["id".to_string()],
    };
    let mut sink = KafkaSink::new(&args.cluster(), output, KeyColumns(key), ValueFormat::Json)?;
    let stats = Arc::new(Mutex::new(BatchStats {
        phases_ms: BTreeMap::new(),
        batch_ms: Histogram::new(3).context("histogram")?,
    }));
    let decoder = JsonDecoder::new(tidemark_bench::schema());
    let builder = match args.route {
        Route::Columns => Query::builder("bench-e2e").decoder(decoder),
        Route::Rows => Query::builder("bench-e2e").decoder(tidemark_bench::RowsOnly(decoder)),
    };
    let builder = match args.pipeline {
        PipelineKind::Filter => builder.filter(tidemark_bench::FILTER)?,
        // Kafka Streams' windowed aggregation: every update written.
        PipelineKind::Window => builder
            .event_time("event_time")
            .watermark("10 minutes")?
            .watermark_scope(args.watermark_scope)
            .window_aggregate(
                ["id"],
                WindowSpec::tumbling("5 minutes")?,
                vec![
                    AggregateSpec::new(AggregateFn::built_in("count")?, AggregateInput::Star)
                        .alias("count"),
                    AggregateSpec::new(
                        AggregateFn::built_in("sum")?,
                        AggregateInput::Column("amount".into()),
                    )
                    .alias("sum"),
                ],
            )
            .output_mode(OutputMode::Update),
    };
    let query = builder
        .trigger(Trigger::AvailableNow)
        .max_records_per_batch(args.max_records_per_batch)
        .on_progress(collect_stats(stats.clone()))
        .build()?;
    let start = Instant::now();
    let summary = query.run(&mut source, &mut sink)?;
    let elapsed = start.elapsed();
    let output_records = end_offsets_total(args, output, args.partitions)?;
    let batches = stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(PipelineResult {
        summary,
        elapsed,
        output_records,
        batches,
    })
}

fn report(
    args: &Args,
    produce_time: Duration,
    raw_runs: &[RawResult],
    raw_pipe: Option<&RawPipeResult>,
    pipeline: &PipelineResult,
    peer: Option<&PeerResult>,
) -> anyhow::Result<()> {
    // `raw_runs` is sorted by time: report the median run.
    let raw = &raw_runs[raw_runs.len() / 2];
    let raw_rate = rate(raw.records, raw.elapsed);
    let tm_rate = rate(pipeline.summary.input_records, pipeline.elapsed);
    let ratio = tm_rate / raw_rate;
    // The raw rate without the group join, which dominates short runs.
    let raw_steady_rate = rate(
        raw.records.saturating_sub(1),
        raw.elapsed.saturating_sub(raw.first_record_after),
    );
    let mb = |bytes: u64, d: Duration| bytes as f64 / 1e6 / d.as_secs_f64().max(1e-9);
    let cpus = tidemark_bench::cpus();
    let cpu_model = tidemark_bench::cpu_model().unwrap_or_else(|| "unknown".into());
    let profile = tidemark_bench::profile();
    let avg_value = raw.payload_bytes as f64 / raw.records.max(1) as f64;

    println!();
    let librdkafka = rdkafka::util::get_rdkafka_version().1;
    println!(
        "records: {} (~{avg_value:.0} B values, keyed, {} partitions); machine: {cpus} CPUs ({cpu_model}); profile: {profile}; broker: {}; librdkafka {librdkafka}, fetch.queue.backoff.ms={}",
        args.records, args.partitions, args.bootstrap, args.fetch_queue_backoff_ms
    );
    println!();
    println!("| measurement | records | wall time (s) | records/s | value MB/s |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| produce (input, acks=all) | {} | {:.2} | {:.0} | {:.1} |",
        args.records,
        produce_time.as_secs_f64(),
        rate(args.records, produce_time),
        mb(raw.payload_bytes, produce_time)
    );
    println!(
        "| raw rdkafka consume (BaseConsumer, median of {}) | {} | {:.2} | {:.0} | {:.1} |",
        raw_runs.len(),
        raw.records,
        raw.elapsed.as_secs_f64(),
        raw_rate,
        mb(raw.payload_bytes, raw.elapsed)
    );
    println!(
        "| tidemark Kafka → decode → {}{} → Kafka, {} | {} | {:.2} | {:.0} | {:.1} |",
        args.pipeline.name(),
        match (args.pipeline, args.state) {
            (PipelineKind::Window, StateKind::Rocksdb) => " (RocksDB + changelog)",
            (PipelineKind::Window, StateKind::Memory) => " (state in memory)",
            _ => "",
        },
        args.guarantee.tidemark(),
        pipeline.summary.input_records,
        pipeline.elapsed.as_secs_f64(),
        tm_rate,
        mb(raw.payload_bytes, pipeline.elapsed)
    );
    println!("| **ratio tidemark / raw** | | | **{ratio:.3}** | |");
    if let Some(pipe) = raw_pipe {
        pipe.print_rows(raw_rate, tm_rate, raw.payload_bytes);
    }
    let peer_rate = peer.map(|p| p.records as f64 / p.seconds.max(1e-9));
    if let (Some(p), Some(peer_rate)) = (peer, peer_rate) {
        println!(
            "| Kafka Streams {}, same pipeline, {} | {} | {:.2} | {:.0} | |",
            KAFKA_STREAMS_VERSION,
            args.guarantee.kafka_streams(),
            p.records,
            p.seconds,
            peer_rate
        );
        println!(
            "| **ratio tidemark / Kafka Streams** | | | **{:.2}** | |",
            tm_rate / peer_rate
        );
    }
    print_details(args, raw_runs, raw_steady_rate, pipeline);

    if let Some(path) = &args.json {
        let rates = Rates {
            raw: raw_rate,
            raw_steady: raw_steady_rate,
            tidemark: tm_rate,
            peer: peer_rate,
            raw_pipe: raw_pipe.map(|pipe| pipe.to_json(raw_rate, tm_rate)),
        };
        write_json(path, args, produce_time, raw_runs, pipeline, peer, &rates)?;
    }
    Ok(())
}

/// The lines under the table: what the output held, the raw consumer's
/// runs, tidemark's batches and phases.
fn print_details(
    args: &Args,
    raw_runs: &[RawResult],
    raw_steady_rate: f64,
    pipeline: &PipelineResult,
) {
    let raw = &raw_runs[raw_runs.len() / 2];
    let raw_seconds: Vec<f64> = raw_runs.iter().map(|r| r.elapsed.as_secs_f64()).collect();
    let phase = |name: &str| pipeline.batches.phases_ms.get(name).copied().unwrap_or(0);
    println!();
    match args.pipeline {
        PipelineKind::Filter => println!(
            "output: {} of {} records (expected {}, {:.1}%), verified from the output topic's end offsets; bad records: {}",
            pipeline.output_records,
            pipeline.summary.input_records,
            tidemark_bench::expected_kept(args.records),
            100.0 * pipeline.output_records as f64 / pipeline.summary.input_records.max(1) as f64,
            pipeline.summary.bad_records
        ),
        PipelineKind::Window => println!(
            "output: {} window rows; the latest row of each window counts every input record (checked for both engines); bad records: {}",
            pipeline.output_records, pipeline.summary.bad_records
        ),
    }
    println!(
        "raw consumer (median run): first record after {:.2} s (group join + first fetch), {:.0} records/s after it; all runs: {} s",
        raw.first_record_after.as_secs_f64(),
        raw_steady_rate,
        raw_seconds
            .iter()
            .map(|s| format!("{s:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "tidemark: {} batches (max {} records each); summed phases: getBatch {} ms, addBatch {} ms, commitOffsets {} ms; batch time p50 {} ms, max {} ms",
        pipeline.summary.batches,
        args.max_records_per_batch,
        phase("getBatch"),
        phase("addBatch"),
        phase("commitOffsets"),
        pipeline.batches.batch_ms.value_at_quantile(0.5),
        pipeline.batches.batch_ms.max()
    );
}

impl RawPipeResult {
    /// Its lines of the results table: its rate and its ratios.
    fn print_rows(&self, raw_rate: f64, tm_rate: f64, payload_bytes: u64) {
        let pipe_rate = rate(self.records_in, self.elapsed);
        println!(
            "| raw rdkafka consume → produce the kept {} (no decode), the ceiling | {} | {:.2} | {:.0} | {:.1} |",
            self.records_out,
            self.records_in,
            self.elapsed.as_secs_f64(),
            pipe_rate,
            payload_bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
        );
        println!(
            "| raw pipe / raw consume | | | {:.3} | |",
            pipe_rate / raw_rate
        );
        println!(
            "| **ratio tidemark / raw pipe** | | | **{:.3}** | |",
            tm_rate / pipe_rate
        );
    }

    /// Its counts, time and ratios for the JSON results.
    fn to_json(&self, raw_rate: f64, tm_rate: f64) -> serde_json::Value {
        let pipe_rate = rate(self.records_in, self.elapsed);
        serde_json::json!({
            "records_in": self.records_in,
            "records_out": self.records_out,
            "seconds": self.elapsed.as_secs_f64(),
            "records_per_second": pipe_rate,
            "ratio_to_raw_consume": pipe_rate / raw_rate,
            "ratio_tidemark_to_raw_pipe": tm_rate / pipe_rate,
        })
    }
}

/// The rates `report` computed, for the JSON results.
struct Rates {
    raw: f64,
    raw_steady: f64,
    tidemark: f64,
    peer: Option<f64>,
    /// The raw pipe's counts, time and ratios (filter only).
    raw_pipe: Option<serde_json::Value>,
}

/// Writes the results as JSON to `path`.
fn write_json(
    path: &std::path::Path,
    args: &Args,
    produce_time: Duration,
    raw_runs: &[RawResult],
    pipeline: &PipelineResult,
    peer: Option<&PeerResult>,
    rates: &Rates,
) -> anyhow::Result<()> {
    let raw = &raw_runs[raw_runs.len() / 2];
    let raw_seconds: Vec<f64> = raw_runs.iter().map(|r| r.elapsed.as_secs_f64()).collect();
    let (raw_rate, raw_steady_rate, tm_rate, peer_rate) =
        (rates.raw, rates.raw_steady, rates.tidemark, rates.peer);
    let ratio = tm_rate / raw_rate;
    let avg_value = raw.payload_bytes as f64 / raw.records.max(1) as f64;
    let json = serde_json::json!({
        "records": args.records,
        "partitions": args.partitions,
        "value_bytes_avg": avg_value,
        "bootstrap": args.bootstrap,
        "security_protocol": args.properties.iter().find(|(k, _)| k == "security.protocol").map(|(_, v)| v.as_str()).unwrap_or("PLAINTEXT"),
        "profile": tidemark_bench::profile(),
        "cpus": tidemark_bench::cpus(),
        "cpu_model": tidemark_bench::cpu_model().unwrap_or_else(|| "unknown".into()),
        "librdkafka": rdkafka::util::get_rdkafka_version().1,
        "max_records_per_batch": args.max_records_per_batch,
        "fetch_queue_backoff_ms": args.fetch_queue_backoff_ms,
        "produce": {
            "seconds": produce_time.as_secs_f64(),
            "records_per_second": rate(args.records, produce_time),
        },
        "raw_consume": {
            "records": raw.records,
            "seconds": raw.elapsed.as_secs_f64(),
            "records_per_second": raw_rate,
            "first_record_seconds": raw.first_record_after.as_secs_f64(),
            "records_per_second_after_first_record": raw_steady_rate,
            "runs_seconds": raw_seconds,
        },
        "tidemark_pipeline": {
            "input_records": pipeline.summary.input_records,
            "output_records": pipeline.output_records,
            "expected_output_records": tidemark_bench::expected_kept(args.records),
            "bad_records": pipeline.summary.bad_records,
            "batches": pipeline.summary.batches,
            "seconds": pipeline.elapsed.as_secs_f64(),
            "records_per_second": tm_rate,
            "phases_ms": pipeline.batches.phases_ms,
            "batch_ms_p50": pipeline.batches.batch_ms.value_at_quantile(0.5),
            "batch_ms_max": pipeline.batches.batch_ms.max(),
        },
        "ratio": ratio,
        "raw_pipe": rates.raw_pipe,
        "pipeline": args.pipeline.name(),
        "kafka_streams": peer.map(|p| serde_json::json!({
            "version": KAFKA_STREAMS_VERSION,
            "records": p.records,
            "seconds": p.seconds,
            "records_per_second": peer_rate,
            "ratio_tidemark_to_kafka_streams": peer_rate.map(|r| tm_rate / r),
        })),
    });
    std::fs::write(path, serde_json::to_string_pretty(&json)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Deletes the benchmark's topics.
fn delete_topics(args: &Args, topics: &[&str]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = args.client_config().create()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in runtime.block_on(admin.delete_topics(topics, &options))? {
        if let Err((topic, code)) = result {
            eprintln!("warning: deleting `{topic}`: {code}");
        }
    }
    Ok(())
}
