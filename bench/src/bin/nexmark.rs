//! Nexmark: each query is a pipeline file (`bench/nexmark/q*.yaml`), run
//! in process with the event generator as its source and a sink that counts
//! rows, or through Kafka (`--through-kafka`): the generator's events
//! produced first to one topic per kind, then the pipeline file run from
//! them by `PipelineRunner`, as `tidemark run` would run it. Reports events/s
//! and events per CPU-second of this process (per core), the measure of
//! Flink's Nexmark results.
//!
//! ```text
//! cargo run -p tidemark-bench --bin nexmark -- --events 10000000
//! cargo run -p tidemark-bench --bin nexmark -- --events 10000000 --query q11
//! cargo run -p tidemark-bench --bin nexmark -- --events 2000000 --through-kafka
//! ```
//!
//! Events are counted as the generator makes them, every kind; a query is
//! handed (or reads the topics of) the kinds it reads (Flink's queries
//! filter the mixed stream).

use clap::Parser;
use std::collections::BTreeMap;
use std::time::Instant;
use tidemark::decode::{ByTopicDecoder, JsonDecoder};
use tidemark::record::{Record, SourcePosition};
use tidemark::row::Row;
use tidemark::runtime::{BatchRequest, Sink, Source, SourceBatch};
use tidemark_bench::nexmark::{Generator, Kind};
use tidemark_pipeline::PipelineFile;

/// Queries this runner knows: the kinds each reads (the first is its main
/// stream) and its pipeline file, whose `__BID__`, `__AUCTION__` and
/// `__PERSON__` stand for the topics of those kinds.
const QUERIES: &[(&str, &[Kind], &str)] = &[
    ("q0", &[Kind::Bid], include_str!("../../nexmark/q0.yaml")),
    ("q1", &[Kind::Bid], include_str!("../../nexmark/q1.yaml")),
    ("q2", &[Kind::Bid], include_str!("../../nexmark/q2.yaml")),
    (
        "q3",
        &[Kind::Auction, Kind::Person],
        include_str!("../../nexmark/q3.yaml"),
    ),
    ("q5", &[Kind::Bid], include_str!("../../nexmark/q5.yaml")),
    ("q7", &[Kind::Bid], include_str!("../../nexmark/q7.yaml")),
    (
        "q8",
        &[Kind::Person, Kind::Auction],
        include_str!("../../nexmark/q8.yaml"),
    ),
    ("q11", &[Kind::Bid], include_str!("../../nexmark/q11.yaml")),
];

/// Flink's published events/s per core (Nexmark on Flink), where known.
const FLINK_PER_CORE: &[(&str, u64)] = &[
    ("q5", 22_000),
    ("q7", 12_000),
    ("q8", 146_000),
    ("q11", 40_000),
];

#[derive(Parser)]
struct Args {
    /// Events to generate per query.
    #[arg(long, default_value_t = 10_000_000)]
    events: u64,
    /// One query (`q0`, `q1`, `q2`, `q3`, `q5`, `q7`, `q8`, `q11`); all when omitted.
    #[arg(long)]
    query: Option<String>,
    /// Event-time rate of the generator (Nexmark's default: 10M/s).
    #[arg(long, default_value_t = 10_000_000)]
    rate: u64,
    /// Records per batch.
    #[arg(long, default_value_t = 100_000)]
    batch: usize,
    /// Produce the events to Kafka first (one single-partition topic per
    /// kind), then run each pipeline file from those topics.
    #[arg(long)]
    through_kafka: bool,
    /// The broker for `--through-kafka` (`KAFKA_BOOTSTRAP`, else
    /// 127.0.0.1:9092).
    #[arg(long)]
    bootstrap: Option<String>,
}

/// The generator as a source: ends after `events` events.
struct GeneratorSource {
    generator: Generator,
    events: u64,
    kinds: Vec<Kind>,
    offsets: BTreeMap<&'static str, i64>,
    handed_out: u64,
}

impl Source for GeneratorSource {
    fn describe(&self) -> String {
        "Nexmark[generator]".into()
    }
    fn next_batch(&mut self, request: &BatchRequest) -> tidemark::Result<SourceBatch> {
        let mut records = Vec::with_capacity(request.max_records);
        while records.len() < request.max_records && self.generator.generated() < self.events {
            let (kind, value) = self.generator.next_event();
            if !self.kinds.contains(&kind) {
                continue;
            }
            let offset = self.offsets.entry(kind.topic()).or_default();
            records.push(Record {
                value: Some(value),
                position: SourcePosition::new(kind.topic(), 0, *offset),
                ..Default::default()
            });
            *offset += 1;
        }
        self.handed_out += records.len() as u64;
        Ok(SourceBatch {
            records,
            exhausted: self.generator.generated() >= self.events,
            ..Default::default()
        })
    }
    fn commit(
        &mut self,
        _: &BTreeMap<i32, tidemark::runtime::TaskCheckpoint>,
    ) -> tidemark::Result<()> {
        Ok(())
    }
    fn offsets(&self) -> tidemark::runtime::SourceOffsets {
        tidemark::runtime::SourceOffsets::sequence("generated", self.generator.generated() as i64)
    }
}

/// Counts the rows written.
#[derive(Default)]
struct CountingSink {
    rows: u64,
}

impl Sink for CountingSink {
    fn describe(&self) -> String {
        "Counting".into()
    }
    fn write(&mut self, _: u64, rows: &[Row]) -> tidemark::Result<()> {
        self.rows += rows.len() as u64;
        Ok(())
    }
    fn commit(&mut self, _: u64) -> tidemark::Result<()> {
        Ok(())
    }
}

fn decoder(kinds: &[Kind]) -> ByTopicDecoder {
    let main = JsonDecoder::new(kinds[0].schema());
    kinds[1..]
        .iter()
        .fold(ByTopicDecoder::new(Box::new(main)), |d, k| {
            d.topic(k.topic(), Box::new(JsonDecoder::new(k.schema())))
        })
}

/// The pipeline file `text` with each kind's topic filled in, and the
/// query's name (its consumer group) made unique by `run`.
fn pipeline(text: &str, run: &str, topic: impl Fn(Kind) -> String) -> anyhow::Result<PipelineFile> {
    let text = text
        .replace("__BID__", &topic(Kind::Bid))
        .replace("__AUCTION__", &topic(Kind::Auction))
        .replace("__PERSON__", &topic(Kind::Person))
        .replace("name: nexmark-", &format!("name: nexmark-{run}"));
    PipelineFile::parse(&text).map_err(|e| anyhow::anyhow!("pipeline file: {e}"))
}

/// Runs `name` in process over a fresh generator; returns rows out.
fn run_in_process(name: &str, kinds: &[Kind], text: &str, args: &Args) -> anyhow::Result<u64> {
    let file = pipeline(text, "", |k| k.topic().to_string())?;
    let query = file
        .query_builder()?
        .decoder(decoder(kinds))
        .max_records_per_batch(args.batch)
        .build()?;
    let mut source = GeneratorSource {
        generator: Generator::new(args.rate),
        events: args.events,
        kinds: kinds.to_vec(),
        offsets: BTreeMap::new(),
        handed_out: 0,
    };
    let mut sink = CountingSink::default();
    let summary = query.run(&mut source, &mut sink)?;
    anyhow::ensure!(
        summary.input_records == source.handed_out,
        "{name} read {} of the {} records handed out",
        summary.input_records,
        source.handed_out
    );
    Ok(sink.rows)
}

/// CPU seconds this process has used (user + system).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th fields of the line, in clock ticks (100 per second).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// The topics of one `--through-kafka` run, one partition per kind.
struct KafkaTopics {
    bootstrap: String,
    run: String,
    /// Records produced per kind.
    produced: BTreeMap<&'static str, u64>,
}

impl KafkaTopics {
    fn topic(&self, kind: Kind) -> String {
        format!("nexmark-{}-{}", kind.topic(), self.run)
    }

    /// Produces `args.events` generator events, each to its kind's topic,
    /// keyed as the queries expect their co-partitioning: bids by bidder,
    /// auctions by seller, persons by id.
    fn produce(args: &Args, bootstrap: String) -> anyhow::Result<Self> {
        use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
        let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
        let mut topics = KafkaTopics {
            bootstrap,
            run,
            produced: BTreeMap::new(),
        };
        for kind in [Kind::Bid, Kind::Auction, Kind::Person] {
            tidemark_connectors::kafka::ensure_topic(
                &tidemark_connectors::kafka::KafkaConnection::new(&topics.bootstrap),
                &topics.topic(kind),
                1,
            )?;
        }
        let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &topics.bootstrap)
            .set("linger.ms", "20")
            .set("compression.type", "lz4")
            .create()?;
        let mut generator = Generator::new(args.rate);
        let names: BTreeMap<&str, String> = [Kind::Bid, Kind::Auction, Kind::Person]
            .into_iter()
            .map(|k| (k.topic(), topics.topic(k)))
            .collect();
        while generator.generated() < args.events {
            let (kind, value) = generator.next_event();
            let json: serde_json::Value = serde_json::from_slice(&value)?;
            let key = json[match kind {
                Kind::Bid => "bidder",
                Kind::Auction => "seller",
                Kind::Person => "id",
            }]
            .to_string();
            let record = BaseRecord::to(&names[kind.topic()])
                .key(&key)
                .payload(&value);
            tidemark_connectors::kafka::send_with_backpressure(&producer, record)?;
            *topics.produced.entry(kind.topic()).or_default() += 1;
        }
        producer.flush(std::time::Duration::from_secs(60))?;
        Ok(topics)
    }

    /// Runs `name`'s pipeline file from these topics; returns rows out.
    fn run_query(&self, name: &str, kinds: &[Kind], text: &str) -> anyhow::Result<u64> {
        let file = pipeline(text, &format!("{}-", self.run), |k| self.topic(k))?;
        let dir = tempfile::tempdir()?;
        let summary = tidemark_connectors::PipelineRunner::new(file, dir.path()).run()?;
        let expected: u64 = kinds
            .iter()
            .map(|k| self.produced.get(k.topic()).copied().unwrap_or(0))
            .sum();
        anyhow::ensure!(
            summary.input_records == expected,
            "{name} read {} of the {expected} records in its topics",
            summary.input_records
        );
        Ok(summary.output_rows)
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let selected: Vec<_> = QUERIES
        .iter()
        .filter(|(name, _, _)| args.query.as_deref().is_none_or(|q| q == *name))
        .collect();
    anyhow::ensure!(
        !selected.is_empty(),
        "unknown query; known: q0, q1, q2, q3, q5, q7, q8, q11"
    );
    let topics = if args.through_kafka {
        let bootstrap = args
            .bootstrap
            .clone()
            .unwrap_or_else(tidemark_connectors::kafka::default_bootstrap);
        let started = Instant::now();
        let topics = KafkaTopics::produce(&args, bootstrap)?;
        eprintln!(
            "produced {} events to nexmark-*-{} in {:.1} s: {:?}",
            args.events,
            topics.run,
            started.elapsed().as_secs_f64(),
            topics.produced
        );
        Some(topics)
    } else {
        None
    };
    println!(
        "| query | source | events | rows out | seconds | events/s | CPU s | events/s per core | Flink per core |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (name, kinds, text) in selected {
        let (started, cpu) = (Instant::now(), cpu_seconds());
        let rows = match &topics {
            Some(topics) => topics.run_query(name, kinds, text)?,
            None => run_in_process(name, kinds, text, &args)?,
        };
        let seconds = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu;
        let flink = FLINK_PER_CORE
            .iter()
            .find(|(q, _)| q == name)
            .map_or("—".to_string(), |(_, n)| n.to_string());
        println!(
            "| {name} | {} | {} | {rows} | {seconds:.2} | {:.0} | {cpu:.2} | {:.0} | {flink} |",
            if topics.is_some() {
                "Kafka"
            } else {
                "generator"
            },
            args.events,
            args.events as f64 / seconds,
            args.events as f64 / cpu.max(0.01),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(events: u64) -> Args {
        Args::parse_from([
            "nexmark",
            "--events",
            &events.to_string(),
            "--batch",
            "5000",
        ])
    }

    /// Nexmark q8's rows for the first `events` events at `rate`, worked
    /// out from the generator's JSON: distinct (person, 10 s window) where
    /// the person also sold an auction in that window.
    fn q8_expected(events: u64, rate: u64) -> usize {
        let mut generator = Generator::new(rate);
        let window = |v: &serde_json::Value| {
            let t = tidemark::time::parse_rfc3339(v["dateTime"].as_str().unwrap()).unwrap();
            t.div_euclid(10_000_000)
        };
        let (mut persons, mut sellers) = (Vec::new(), std::collections::HashSet::new());
        while generator.generated() < events {
            let (kind, value) = generator.next_event();
            let v: serde_json::Value = serde_json::from_slice(&value).unwrap();
            match kind {
                Kind::Person => persons.push((v["id"].as_i64().unwrap(), window(&v))),
                Kind::Auction => {
                    sellers.insert((v["seller"].as_i64().unwrap(), window(&v)));
                }
                Kind::Bid => {}
            }
        }
        let rows: std::collections::HashSet<_> = persons
            .into_iter()
            .filter(|p| sellers.contains(p))
            .collect();
        rows.len()
    }

    #[test]
    fn q8_writes_one_row_per_new_seller_and_window() {
        let (_, kinds, text) = QUERIES.iter().find(|(q, _, _)| *q == "q8").unwrap();
        let mut args = args(100_000);
        // 100 µs apart: the events span 10 s of event time, over two
        // windows, so an auction in the window after its seller's
        // registration must not count.
        args.rate = 10_000;
        let expected = q8_expected(args.events, args.rate);
        assert!(expected > 1_000, "{expected}");
        assert_eq!(
            run_in_process("q8", kinds, text, &args).unwrap(),
            expected as u64
        );
    }

    /// The bids of the first `events` generator events, as JSON.
    fn bids(events: u64) -> Vec<serde_json::Value> {
        bids_at(events, 10_000_000)
    }

    /// The bids of the first `events` events at `rate` events/s.
    fn bids_at(events: u64, rate: u64) -> Vec<serde_json::Value> {
        let mut generator = Generator::new(rate);
        let mut out = Vec::new();
        while generator.generated() < events {
            let (kind, value) = generator.next_event();
            if kind == Kind::Bid {
                out.push(serde_json::from_slice(&value).unwrap());
            }
        }
        out
    }

    fn rows_out(name: &str, events: u64) -> u64 {
        let (_, kinds, text) = QUERIES.iter().find(|(q, _, _)| *q == name).unwrap();
        run_in_process(name, kinds, text, &args(events)).unwrap()
    }

    #[test]
    fn every_pipeline_file_parses_and_q0_to_q2_keep_the_bids_nexmark_says() {
        let events = 20_000;
        let bids = bids(events);
        assert_eq!(rows_out("q0", events), bids.len() as u64);
        assert_eq!(rows_out("q1", events), bids.len() as u64);
        let selected = bids
            .iter()
            .filter(|b| b["auction"].as_i64().unwrap() % 123 == 0)
            .count();
        assert!(selected > 0);
        assert_eq!(rows_out("q2", events), selected as u64);
        // q3 and q11 run; their rows are checked by their operators' tests.
        rows_out("q3", events);
        rows_out("q11", events);
    }

    /// Runs `query` over 20,000 events 2 ms apart (40 s of event time);
    /// the rows it wrote, the bids' event times and the final watermark
    /// (4 seconds behind the latest bid).
    fn run_slow(query: &str) -> (u64, Vec<i64>, i64) {
        let (_, kinds, text) = QUERIES.iter().find(|(q, _, _)| *q == query).unwrap();
        let mut args = args(20_000);
        args.rate = 500;
        let times: Vec<i64> = bids_at(args.events, args.rate)
            .iter()
            .map(|b| tidemark::time::parse_rfc3339(b["dateTime"].as_str().unwrap()).unwrap())
            .collect();
        let watermark = times.iter().max().unwrap() - 4_000_000;
        (
            run_in_process(query, kinds, text, &args).unwrap(),
            times,
            watermark,
        )
    }

    /// q7: one row per 10-second window the watermark has closed.
    #[test]
    fn q7_writes_one_row_per_closed_window() {
        let (rows, times, watermark) = run_slow("q7");
        let closed: std::collections::BTreeSet<i64> = times
            .iter()
            .map(|t| t.div_euclid(10_000_000))
            .filter(|w| (w + 1) * 10_000_000 <= watermark)
            .collect();
        assert!(closed.len() > 1, "{}", closed.len());
        assert_eq!(rows, closed.len() as u64);
    }

    /// q5: one row per 10-second sliding window (every 2 seconds) that
    /// holds a bid and that the watermark has closed: the second
    /// aggregation sees each sliding window in exactly one 2-second window.
    #[test]
    fn q5_writes_one_row_per_closed_sliding_window() {
        let (rows, times, watermark) = run_slow("q5");
        let (slide, size) = (2_000_000i64, 10_000_000i64);
        let closed_ends: std::collections::BTreeSet<i64> = times
            .iter()
            .flat_map(|t| {
                let last_start = t.div_euclid(slide) * slide;
                (0..size / slide).map(move |i| last_start - i * slide + size)
            })
            .filter(|end| *end <= watermark)
            .collect();
        assert!(closed_ends.len() > 5, "{}", closed_ends.len());
        assert_eq!(rows, closed_ends.len() as u64);
    }
}
