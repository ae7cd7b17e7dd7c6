//! Nexmark in process: the event generator as the query's source, each
//! query built with the library as a user would build it, and a sink that
//! counts rows. Reports events/s and events per CPU-second (per core), the
//! measure of Flink's Nexmark results.
//!
//! ```text
//! cargo run -p tidemark-bench --bin nexmark -- --events 10000000
//! cargo run -p tidemark-bench --bin nexmark -- --events 10000000 --query q11
//! ```
//!
//! Events are counted as the generator makes them, every kind; a query is
//! handed the kinds it reads (Flink's queries filter the mixed stream).

use clap::Parser;
use std::collections::BTreeMap;
use std::time::Instant;
use tidemark::decode::{ByTopicDecoder, JsonDecoder};
use tidemark::operators::{AggregateSpec, JoinTimeCondition, JoinType};
use tidemark::record::{Record, SourcePosition};
use tidemark::row::Row;
use tidemark::runtime::{
    BatchRequest, JoinInput, Query, QueryBuilder, Sink, Source, SourceBatch, Trigger,
};
use tidemark::window::WindowSpec;
use tidemark_bench::nexmark::{Generator, Kind};

/// Queries this runner knows, with the kinds each reads.
const QUERIES: &[(&str, &[Kind])] = &[
    ("q0", &[Kind::Bid]),
    ("q1", &[Kind::Bid]),
    ("q2", &[Kind::Bid]),
    ("q3", &[Kind::Auction, Kind::Person]),
    ("q11", &[Kind::Bid]),
];

/// Flink's published events/s per core (Nexmark on Flink), where known.
const FLINK_PER_CORE: &[(&str, u64)] = &[("q11", 40_000)];

#[derive(Parser)]
struct Args {
    /// Events to generate per query.
    #[arg(long, default_value_t = 10_000_000)]
    events: u64,
    /// One query (`q0`, `q1`, `q2`, `q3`, `q11`); all when omitted.
    #[arg(long)]
    query: Option<String>,
    /// Event-time rate of the generator (Nexmark's default: 10M/s).
    #[arg(long, default_value_t = 10_000_000)]
    rate: u64,
    /// Records per batch.
    #[arg(long, default_value_t = 100_000)]
    batch: usize,
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
    fn commit(&mut self, _: &BTreeMap<i32, String>) -> tidemark::Result<()> {
        Ok(())
    }
    fn offsets(&self) -> serde_json::Value {
        serde_json::json!({ "generated": self.generator.generated() })
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

/// The query `name` as Nexmark defines it (Flink's SQL in the comments).
fn build(name: &str, kinds: &[Kind], args: &Args) -> anyhow::Result<Query> {
    let base: QueryBuilder = Query::builder(&format!("nexmark-{name}"))
        .decoder(decoder(kinds))
        .trigger(Trigger::AvailableNow)
        .max_records_per_batch(args.batch);
    let query = match name {
        // SELECT auction, bidder, price, dateTime FROM bid
        "q0" => base.select(&[
            ("auction", "auction"),
            ("bidder", "bidder"),
            ("price", "price"),
            ("dateTime", "dateTime"),
        ]),
        // SELECT auction, bidder, 0.908 * price AS price, dateTime FROM bid
        "q1" => base.with_column("euros", "0.908 * price")?.select(&[
            ("auction", "auction"),
            ("bidder", "bidder"),
            ("euros", "price"),
            ("dateTime", "dateTime"),
        ]),
        // SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0
        "q2" => base
            .filter("auction % 123 = 0")?
            .select(&[("auction", "auction"), ("price", "price")]),
        // SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P
        // ON A.seller = P.id WHERE A.category = 10 AND P.state IN (OR, ID, CA)
        // (a regular join: both sides kept for ever, in Flink too)
        "q3" => base
            .event_time("dateTime")
            .main_stream("auction")
            .filter("category = 10")?
            .join(
                JoinInput::new("person")
                    .event_time("dateTime")
                    .filter("state = 'OR' or state = 'ID' or state = 'CA'")?,
                JoinType::Inner,
                &[("seller", "id")],
                JoinTimeCondition::None,
            )?,
        // SELECT bidder, count(*), SESSION_START, SESSION_END FROM bid
        // GROUP BY bidder, SESSION(dateTime, INTERVAL '10' SECOND), with
        // Flink Nexmark's watermark 4 seconds behind
        "q11" => base
            .event_time("dateTime")
            .watermark("4 seconds")?
            .window_aggregate(
                ["bidder"],
                WindowSpec::session("10 seconds")?,
                vec![AggregateSpec::count()],
            ),
        other => anyhow::bail!("unknown query `{other}`; known: q0, q1, q2, q3, q11"),
    };
    Ok(query.build()?)
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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let selected: Vec<&(&str, &[Kind])> = QUERIES
        .iter()
        .filter(|(name, _)| args.query.as_deref().is_none_or(|q| q == *name))
        .collect();
    anyhow::ensure!(
        !selected.is_empty(),
        "unknown query; known: q0, q1, q2, q3, q11"
    );
    println!(
        "| query | events | rows out | seconds | events/s | CPU s | events/s per core | Flink per core |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for (name, kinds) in selected {
        let query = build(name, kinds, &args)?;
        let mut source = GeneratorSource {
            generator: Generator::new(args.rate),
            events: args.events,
            kinds: kinds.to_vec(),
            offsets: BTreeMap::new(),
            handed_out: 0,
        };
        let mut sink = CountingSink::default();
        let (started, cpu) = (Instant::now(), cpu_seconds());
        let summary = query.run(&mut source, &mut sink)?;
        anyhow::ensure!(
            summary.input_records == source.handed_out,
            "{name} read {} of the {} records handed out",
            summary.input_records,
            source.handed_out
        );
        let seconds = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu;
        let flink = FLINK_PER_CORE
            .iter()
            .find(|(q, _)| q == name)
            .map_or("—".to_string(), |(_, n)| n.to_string());
        println!(
            "| {name} | {} | {} | {seconds:.2} | {:.0} | {cpu:.2} | {:.0} | {flink} |",
            args.events,
            sink.rows,
            args.events as f64 / seconds,
            args.events as f64 / cpu.max(0.01),
        );
    }
    Ok(())
}
