//! What idle HTTP connections cost a running query (#44 item 6): the same
//! `tidemark run` (a windowed count, Kafka → Kafka, with `serve:` and
//! `metrics:`) reads one pre-filled topic from its start, once with no
//! client on the interactive-query port and once with `--idle` (300)
//! connections held open on it — each sends half a request and waits, and
//! is opened again when the server's header deadline closes it. Measured
//! per run, after a warm-up: input rows per second (from the run's own
//! `tidemark_input_rows_total`, scraped every second) and the slowest of
//! one real request a second. Runs alternate (without, with, without,
//! with) and the ratio of the medians is printed.
//!
//! ```text
//! cargo build -p tidemark-cli && cargo run -p tidemark-bench --bin http_idle
//! ```

use anyhow::Context;
use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark_connectors::kafka::{default_bootstrap, ensure_topic, KafkaConnection};

#[derive(Debug, Parser)]
struct Args {
    /// Records in the input topic.
    #[arg(long, default_value_t = 4_000_000)]
    records: u64,
    /// Connections held open during the runs with idle clients.
    #[arg(long, default_value_t = 300)]
    idle: usize,
    /// Seconds measured per run, after a 4-second warm-up.
    #[arg(long, default_value_t = 8)]
    seconds: u64,
    /// Runs of each kind.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    /// The `tidemark` binary.
    #[arg(long)]
    tidemark: Option<String>,
    /// Bootstrap servers (default: `KAFKA_BOOTSTRAP`, else 127.0.0.1:9092).
    #[arg(long, default_value_t = default_bootstrap())]
    bootstrap: String,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn fill(args: &Args, topic: &str) -> anyhow::Result<()> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    for i in 0..args.records {
        let value = format!(
            r#"{{"event_time": "2026-01-01T10:{:02}:{:02}Z", "id": "k{}"}}"#,
            (i / 60) % 60,
            i % 60,
            i % 1000
        );
        let key = format!("k{}", i % 1000);
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

/// Keeps `count` connections open on `address`, each with half a request
/// sent, until `stop`.
fn hold_idle(address: String, count: usize, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let open = |address: &str| {
            let mut socket = TcpStream::connect(address).ok()?;
            socket
                .write_all(b"GET /v1/stores HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .ok()?;
            socket.set_nonblocking(true).ok()?;
            Some(socket)
        };
        let mut sockets: Vec<TcpStream> = (0..count).filter_map(|_| open(&address)).collect();
        while !stop.load(Ordering::Relaxed) {
            // A socket the server closed reads 0 bytes (or a 408 first).
            sockets.retain(|s| {
                let mut byte = [0u8; 1];
                matches!(s.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            });
            while sockets.len() < count {
                match open(&address) {
                    Some(s) => sockets.push(s),
                    None => break,
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

/// The counter `name` in Prometheus' text at `address`.
fn scrape(address: &str, name: &str) -> Option<f64> {
    let text = ureq::get(&format!("http://{address}/metrics"))
        .timeout(Duration::from_secs(5))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

struct Measured {
    rows_per_second: f64,
    slowest_request: Duration,
}

fn run_once(args: &Args, tidemark: &str, input: &str, idle: usize) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir()?;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (serve, metrics) = (free_port()?, free_port()?);
    let output = format!("idle-out-{id}");
    ensure_topic(&KafkaConnection::new(&args.bootstrap), &output, 1)?;
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            r#"name: idle-{id}
kafka: {{bootstrap: "{bootstrap}"}}
source: {{kind: kafka, topic: {input}, format: json, schema: {{event_time: timestamp, id: string}}}}
event_time: event_time
watermark: 1 minute
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}]
output_mode: update
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
serve: {{listen: "127.0.0.1:{serve}"}}
metrics: {{prometheus: "127.0.0.1:{metrics}"}}
"#,
            bootstrap = args.bootstrap
        ),
    )?;
    let mut child = std::process::Command::new(tidemark)
        .args(["run", file.to_str().unwrap_or_default()])
        .current_dir(dir.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {tidemark}"))?;
    let (serve, metrics) = (format!("127.0.0.1:{serve}"), format!("127.0.0.1:{metrics}"));
    let started = Instant::now();
    while scrape(&metrics, "tidemark_input_rows_total").unwrap_or(0.0) == 0.0 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the run never read a row"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let holder = (idle > 0).then(|| hold_idle(serve.clone(), idle, stop.clone()));
    std::thread::sleep(Duration::from_secs(4));
    let first = scrape(&metrics, "tidemark_input_rows_total").unwrap_or(0.0);
    let from = Instant::now();
    let mut slowest = Duration::ZERO;
    while from.elapsed() < Duration::from_secs(args.seconds) {
        let asked = Instant::now();
        let answered = ureq::get(&format!("http://{serve}/v1/stores"))
            .timeout(Duration::from_secs(10))
            .call();
        anyhow::ensure!(answered.is_ok(), "a real request failed: {answered:?}");
        slowest = slowest.max(asked.elapsed());
        std::thread::sleep(Duration::from_secs(1).saturating_sub(asked.elapsed()));
    }
    let last = scrape(&metrics, "tidemark_input_rows_total").unwrap_or(0.0);
    let elapsed = from.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    if let Some(holder) = holder {
        let _ = holder.join();
    }
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let _ = child.wait();
    anyhow::ensure!(last > first, "no row read while measured: a failed run");
    anyhow::ensure!(
        last < args.records as f64,
        "the input ran out while measured: raise --records"
    );
    Ok(Measured {
        rows_per_second: (last - first) / elapsed,
        slowest_request: slowest,
    })
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tidemark = args.tidemark.clone().unwrap_or_else(|| {
        let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
        format!("{target}/debug/tidemark")
    });
    let input = format!("idle-in-{}", uuid::Uuid::new_v4().simple());
    ensure_topic(&KafkaConnection::new(&args.bootstrap), &input, 2)?;
    eprintln!("filling {input} with {} records", args.records);
    fill(&args, &input)?;
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        for idle in [0, args.idle] {
            let m = run_once(&args, &tidemark, &input, idle)?;
            println!(
                "run {run}: {idle:>4} idle connections: {:>9.0} rows/s, slowest request {:?}",
                m.rows_per_second, m.slowest_request
            );
            match idle {
                0 => without.push(m.rows_per_second),
                _ => with.push(m.rows_per_second),
            }
        }
    }
    let (a, b) = (median(without), median(with));
    println!(
        "median rows/s: {a:.0} without, {b:.0} with {} idle connections: ratio {:.3}",
        args.idle,
        b / a
    );
    Ok(())
}
