//! The card_velocity rules side by side (#45 item 8): tidemark's
//! `examples/card_velocity` (a user's stateful processor, RocksDB state
//! under its 256 MiB default budget, exactly_once) against the same rules
//! in Kafka Streams' Processor API (`bench/peers/`, exactly_once_v2), on
//! the same input topic, one after the other in one run.
//!
//! Each is timed from its start until its consumer group's committed
//! offsets reach the input's end; its output is then read back
//! (`read_committed`): the alerts of both must be the same rows and
//! neither may be empty.
//!
//! ```sh
//! cargo build --workspace --bins --examples
//! $CARGO_TARGET_DIR/debug/card_rules --records 2000000 --cards 1000000 \
//!     --kafka-streams "$(bench/peers/build.sh)"
//! ```

use anyhow::{ensure, Context};
use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidemark::time::format_rfc3339;

#[derive(Parser)]
struct Args {
    /// Transactions to produce.
    #[arg(long, default_value_t = 2_000_000)]
    records: u64,
    /// Distinct cards (a tenth of the rows go to 1,000 hot cards, where
    /// declines bunch up into alerts).
    #[arg(long, default_value_t = 1_000_000)]
    cards: u64,
    /// Input partitions.
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Bootstrap servers (default: `KAFKA_BOOTSTRAP`, else 127.0.0.1:9092).
    #[arg(long)]
    bootstrap: Option<String>,
    /// The Kafka Streams peer's jar (`bench/peers/build.sh`).
    #[arg(long)]
    kafka_streams: Option<PathBuf>,
    /// The example's binary (default: `examples/card_velocity` beside this one).
    #[arg(long)]
    example: Option<PathBuf>,
}

/// One run's outcome.
struct Measured {
    seconds: f64,
    peak_rss_mib: Option<f64>,
    rows: BTreeMap<String, u64>,
    alerts: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bootstrap = args
        .bootstrap
        .clone()
        .or_else(|| std::env::var("KAFKA_BOOTSTRAP").ok())
        .unwrap_or_else(|| "127.0.0.1:9092".into());
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let input = format!("bench-cards-in-{run}");
    let connection = tidemark_connectors::kafka::KafkaConnection::new(bootstrap.clone());
    tidemark_connectors::kafka::ensure_topic(&connection, &input, args.partitions)?;
    let started = Instant::now();
    produce(&bootstrap, &input, &args)?;
    eprintln!(
        "{} transactions produced in {:.1} s",
        args.records,
        started.elapsed().as_secs_f64()
    );

    let tidemark = run_tidemark(&args, &bootstrap, &input, &run)?;
    eprintln!(
        "tidemark: {:.2} s, rows {:?}",
        tidemark.seconds, tidemark.rows
    );
    ensure!(
        !tidemark.alerts.is_empty(),
        "tidemark wrote no alert: a failed run"
    );
    let peer = match &args.kafka_streams {
        Some(jar) => {
            let peer = run_kafka_streams(jar, &bootstrap, &input, &run, args.partitions)?;
            eprintln!("Kafka Streams: {:.2} s, rows {:?}", peer.seconds, peer.rows);
            ensure!(
                peer.alerts == tidemark.alerts,
                "the alerts differ: tidemark {}, Kafka Streams {}",
                tidemark.alerts.len(),
                peer.alerts.len()
            );
            Some(peer)
        }
        None => None,
    };
    let rate = |m: &Measured| args.records as f64 / m.seconds.max(1e-9);
    println!(
        "{}",
        serde_json::json!({
            "records": args.records,
            "cards": args.cards,
            "partitions": args.partitions,
            "profile": tidemark_bench::profile(),
            "tidemark": {"seconds": tidemark.seconds, "records_per_s": rate(&tidemark),
                "peak_rss_mib": tidemark.peak_rss_mib, "rows": tidemark.rows},
            "kafka_streams": peer.as_ref().map(|p| serde_json::json!({"seconds": p.seconds,
                "records_per_s": rate(p), "rows": p.rows})),
            "ratio_tidemark_to_kafka_streams": peer.as_ref().map(|p| rate(&tidemark) / rate(p)),
        })
    );
    Ok(())
}

/// A deterministic stream of transactions in event-time order.
fn transaction(i: u64, cards: u64, seed: &mut u64) -> (String, Vec<u8>) {
    let mut next = |n: u64| {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (*seed >> 33) % n
    };
    // 2026-03-01T00:00:00Z, a row every 100 ms of event time.
    let ts = 1_772_323_200_000_000 + i as i64 * 100_000;
    let card = if next(10) == 0 {
        next(1_000)
    } else {
        next(cards)
    };
    let declined = next(100) < 40;
    let amount = match (declined, next(5)) {
        (false, 0) => 500.0 + next(1_000) as f64,
        _ => 10.25 + next(300) as f64,
    };
    let card = format!("card-{card:07}");
    let value = serde_json::json!({
        "card": card,
        "ts": format_rfc3339(ts),
        "amount": amount,
        "status": if declined { "declined" } else { "approved" },
    });
    (card, value.to_string().into_bytes())
}

fn produce(bootstrap: &str, topic: &str, args: &Args) -> anyhow::Result<()> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .context("creating the producer")?;
    let mut seed = 0x5eed;
    for i in 0..args.records {
        let (key, value) = transaction(i, args.cards, &mut seed);
        let record = BaseRecord::to(topic).key(&key).payload(&value);
        tidemark_connectors::kafka::send_with_backpressure(&producer, record)?;
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the producer")?;
    Ok(())
}

fn consumer(bootstrap: &str, group: &str) -> anyhow::Result<BaseConsumer> {
    Ok(ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .create()?)
}

/// Whether `group` committed the end of every partition of `topic`.
fn caught_up(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> anyhow::Result<bool> {
    let probe = consumer(bootstrap, group)?;
    let mut list = TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let committed = probe.committed_offsets(list, Duration::from_secs(10))?;
    for p in 0..partitions {
        let (_, end) = probe.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        let done = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o >= end,
            _ => end == 0,
        };
        if !done {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Reads `topic` to its end: rows counted by rule, the alerts as text.
fn read_output(
    bootstrap: &str,
    topic: &str,
) -> anyhow::Result<(BTreeMap<String, u64>, Vec<String>)> {
    let reader = consumer(
        bootstrap,
        &format!("bench-cards-reader-{}", uuid::Uuid::new_v4()),
    )?;
    reader.subscribe(&[topic])?;
    let (mut rows, mut alerts) = (BTreeMap::new(), Vec::new());
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(5) {
        let Some(message) = reader.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message?;
        quiet_since = Instant::now();
        let value: serde_json::Value =
            serde_json::from_slice(message.payload().unwrap_or_default())?;
        let rule = value["rule"].as_str().unwrap_or("?").to_string();
        *rows.entry(rule.clone()).or_insert(0) += 1;
        if rule == "declines_then_large" {
            let ts = tidemark::time::parse_rfc3339(value["ts"].as_str().unwrap_or_default());
            alerts.push(format!(
                "{} {:?} {} {}",
                value["card"],
                ts,
                value["declines"],
                value["amount"].as_f64().unwrap_or(f64::NAN)
            ));
        }
    }
    alerts.sort();
    Ok((rows, alerts))
}

fn example_binary(args: &Args) -> anyhow::Result<PathBuf> {
    let path = match &args.example {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("this binary's directory")?
            .join("examples/card_velocity"),
    };
    ensure!(
        path.exists(),
        "{} is missing: cargo build --workspace --examples",
        path.display()
    );
    Ok(path)
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn run_tidemark(args: &Args, bootstrap: &str, input: &str, run: &str) -> anyhow::Result<Measured> {
    let (app, output) = (
        format!("bench-cards-{run}"),
        format!("bench-cards-out-{run}"),
    );
    let state = tempfile::tempdir()?;
    let started = Instant::now();
    let mut child = std::process::Command::new(example_binary(args)?)
        .env("KAFKA_BOOTSTRAP", bootstrap)
        .env("STATE_DIR", state.path())
        .env("APP_ID", &app)
        .env("INPUT_TOPIC", input)
        .env("OUTPUT_TOPIC", &output)
        .spawn()
        .context("starting the example")?;
    let seconds = wait_caught_up(
        bootstrap,
        &app,
        input,
        args.partitions,
        started,
        &mut |_| child.try_wait().ok().flatten().is_none(),
    )?;
    let peak = peak_rss_mib(child.id());
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait()?;
    ensure!(status.success(), "the example ended with {status:?}");
    let (rows, alerts) = read_output(bootstrap, &output)?;
    Ok(Measured {
        seconds,
        peak_rss_mib: peak,
        rows,
        alerts,
    })
}

/// Seconds from `started` until `group` caught up with `input`, while
/// `alive` holds.
fn wait_caught_up(
    bootstrap: &str,
    group: &str,
    input: &str,
    partitions: i32,
    started: Instant,
    alive: &mut dyn FnMut(()) -> bool,
) -> anyhow::Result<f64> {
    let deadline = started + Duration::from_secs(1800);
    loop {
        if caught_up(bootstrap, group, input, partitions)? {
            return Ok(started.elapsed().as_secs_f64());
        }
        ensure!(alive(()), "{group} ended before it caught up");
        ensure!(
            Instant::now() < deadline,
            "{group} did not catch up in 30 minutes"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_kafka_streams(
    jar: &Path,
    bootstrap: &str,
    input: &str,
    run: &str,
    partitions: i32,
) -> anyhow::Result<Measured> {
    let output = format!("bench-cards-ks-out-{run}");
    let connection = tidemark_connectors::kafka::KafkaConnection::new(bootstrap.to_string());
    tidemark_connectors::kafka::ensure_topic(&connection, &output, partitions)?;
    let out = std::process::Command::new("java")
        .arg("-jar")
        .arg(jar)
        .args([
            "card_velocity",
            bootstrap,
            input,
            &output,
            &format!("bench-cards-ks-{run}"),
            "exactly_once_v2",
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
    let (rows, alerts) = read_output(bootstrap, &output)?;
    Ok(Measured {
        seconds: line["seconds"].as_f64().unwrap_or(f64::NAN),
        peak_rss_mib: None,
        rows,
        alerts,
    })
}
