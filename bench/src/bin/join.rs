//! Stream-stream join throughput and state size as the watermark delay
//! grows, in process, one core: `--events` impressions of `--ads` ads, one a
//! millisecond of event time, half of them clicked 30 s later; a left outer
//! join on the ad within `[0, 1 minute]`, both streams with watermark
//! `--delay-minutes`. Batches of `--batch` impressions and their clicks;
//! the watermark follows Spark's rules (the previous batch's maximum minus
//! the delay, `min` of the two streams). Prints rows/s, output rows, state
//! rows and bytes at the end, peak RSS.
//!
//! ```text
//! for d in 1 10 60; do cargo run -p tidemark-bench --bin join -- --delay-minutes $d; done
//! cargo run -p tidemark-bench --bin join -- --delay-minutes 60 --memory-mb 512
//! ```
//!
//! With `--memory-mb` the rows are read through a RocksDB store under that
//! budget, as a pipeline file's `state: {dir, memory_mb}` gives them, and
//! every batch checkpoints.

use clap::Parser;
use std::sync::Arc;
use std::time::Instant;
use tidemark::operators::{
    BatchContext, JoinSpec, JoinTimeCondition, JoinType, Operator, StreamJoin,
};
use tidemark::row::{Row, Value};

#[derive(Parser)]
struct Args {
    /// Impressions in total (clicks: half as many).
    #[arg(long, default_value_t = 4_000_000)]
    events: u64,
    /// Distinct ads.
    #[arg(long, default_value_t = 100_000)]
    ads: u64,
    /// Impressions per batch.
    #[arg(long, default_value_t = 50_000)]
    batch: u64,
    /// Watermark delay of both streams, minutes.
    #[arg(long, default_value_t = 10)]
    delay_minutes: i64,
    /// Instead of the operator in process: produce the streams to two
    /// co-partitioned topics of this many partitions on the broker in
    /// `KAFKA_BOOTSTRAP` and run the join query Kafka to Kafka,
    /// available-now.
    #[arg(long)]
    through_kafka: Option<i32>,
    /// State read through RocksDB under this budget (MiB); 0 keeps every
    /// row in memory.
    #[arg(long, default_value_t = 0)]
    memory_mb: usize,
}

const MS: i64 = 1000;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(partitions) = args.through_kafka {
        return through_kafka(&args, partitions);
    }
    let delay = args.delay_minutes * 60_000 * MS;
    let mut join = StreamJoin::new(JoinSpec {
        join_type: JoinType::LeftOuter,
        left_keys: vec!["adId".into()],
        right_keys: vec!["adId".into()],
        left_time: "impressionTime".into(),
        right_time: "clickTime".into(),
        time: JoinTimeCondition::between("0 seconds", "1 minute")?,
        right_name: "clicks".into(),
        right_columns: vec!["adId".into(), "clickTime".into()],
        left_columns: vec!["adId".into(), "impressionTime".into()],
    })?;
    let state_dir = tempfile::tempdir()?;
    let _backend = open_store(&mut join, &args, state_dir.path())?;
    let names: (Arc<str>, Arc<str>, Arc<str>) =
        ("adId".into(), "impressionTime".into(), "clickTime".into());
    let (mut late, mut watermark) = (0i64, 0i64);
    let mut out = Vec::new();
    let (mut emitted, mut rows_in) = (0u64, 0u64);
    let (mut peak_state_rows, mut peak_state_bytes) = (0u64, 0u64);
    let started = Instant::now();
    let mut done = 0u64;
    let mut batch_id = 0;
    while done < args.events {
        let n = args.batch.min(args.events - done);
        let ctx = BatchContext {
            batch_id,
            processing_time: 0,
            late_threshold: late,
            watermark,
            collect_late_rows: false,
            real_time: false,
        };
        let ad = |i: u64| Value::from(format!("ad{}", i % args.ads).as_str());
        // Column names shared across rows, as a decoder with a schema
        // hands them out.
        let (ad_id, impression_time, click_time) = (&names.0, &names.1, &names.2);
        for i in done..done + n {
            let mut row = Row::new();
            row.set(ad_id.clone(), ad(i));
            row.set(impression_time.clone(), Value::Timestamp(1 + i as i64 * MS));
            join.on_input_row(0, row, &ctx, &mut out)?;
            rows_in += 1;
            // The click of impression i - 30 000 (30 s earlier), if even.
            if i >= 30_000 && (i - 30_000) % 2 == 0 {
                let c = i - 30_000;
                let mut row = Row::new();
                row.set(ad_id.clone(), ad(c));
                row.set(click_time.clone(), Value::Timestamp(1 + i as i64 * MS));
                join.on_input_row(1, row, &ctx, &mut out)?;
                rows_in += 1;
            }
        }
        join.on_batch_end(&ctx, &mut out)?;
        join.checkpoint()?;
        emitted += out.len() as u64;
        out.clear();
        let p = join.state_progress().expect("stateful");
        peak_state_rows = peak_state_rows.max(p.num_rows_total);
        peak_state_bytes = peak_state_bytes.max(p.memory_used_bytes);
        // Both streams' maximum is the last impression's time (clicks lag
        // 30 s): min policy takes the clicks'.
        let max_click = 1 + (done + n) as i64 * MS - MS;
        late = watermark;
        watermark = watermark.max(max_click - delay);
        done += n;
        batch_id += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "delay_minutes": args.delay_minutes,
            "memory_mb": args.memory_mb,
            "events": args.events,
            "rows_in": rows_in,
            "rows_per_second": (rows_in as f64 / seconds).round(),
            "rows_emitted": emitted,
            "peak_state_rows": peak_state_rows,
            "peak_state_mib": peak_state_bytes >> 20,
            "peak_rss_mib": tidemark_bench::peak_rss_mib(),
        })
    );
    Ok(())
}

/// With `--memory-mb`, hands `join` a RocksDB store under that budget and
/// returns the backend that keeps it open.
fn open_store(
    join: &mut StreamJoin,
    args: &Args,
    dir: &std::path::Path,
) -> anyhow::Result<Option<tidemark_connectors::state_backend::RocksDbStateBackend>> {
    use tidemark::runtime::StateBackend;
    if args.memory_mb == 0 {
        return Ok(None);
    }
    let (rocksdb_bytes, operator_bytes) =
        tidemark_connectors::split_memory_budget(args.memory_mb << 20, 1);
    let mut backend = tidemark_connectors::state_backend::RocksDbStateBackend::new(
        dir,
        "bench-join",
        rocksdb_bytes,
        operator_bytes,
        None,
    )?;
    join.open_state(backend.open(0, "join")?, Some(operator_bytes))?;
    Ok(Some(backend))
}

/// Produces `(key, value)` records to `topic`, keyed so that both streams
/// land alike (co-partitioned).
fn produce(
    bootstrap: &str,
    topic: &str,
    records: impl Iterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    for (key, value) in records {
        tidemark_connectors::kafka::send_with_backpressure(
            &producer,
            BaseRecord::to(topic).key(&key).payload(&value),
        )?;
    }
    producer.flush(std::time::Duration::from_secs(120))?;
    Ok(())
}

/// The join query from Kafka to Kafka: rows/s over the whole run
/// (reading both topics, joining, writing, committing).
fn through_kafka(args: &Args, partitions: i32) -> anyhow::Result<()> {
    use std::collections::BTreeMap;
    use tidemark::prelude::*;
    use tidemark::runtime::JoinInput;
    use tidemark_connectors::kafka::{
        default_bootstrap, ensure_topic, KafkaSink, KafkaSource, KafkaSourceConfig, KeyColumns,
        ValueFormat,
    };
    let bootstrap = default_bootstrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (impressions, clicks, output) = (
        format!("bench-join-imp-{run}"),
        format!("bench-join-clk-{run}"),
        format!("bench-join-out-{run}"),
    );
    for topic in [&impressions, &clicks, &output] {
        ensure_topic(
            &tidemark_connectors::kafka::KafkaConnection::new(&bootstrap),
            topic,
            partitions,
        )?;
    }
    let at = |i: u64| tidemark::time::format_rfc3339(1 + i as i64 * MS);
    let ad = |i: u64| format!("ad{}", i % args.ads);
    produce(
        &bootstrap,
        &impressions,
        (0..args.events).map(|i| {
            (
                ad(i),
                format!(r#"{{"adId": "{}", "impressionTime": "{}"}}"#, ad(i), at(i)),
            )
        }),
    )?;
    produce(
        &bootstrap,
        &clicks,
        (0..args.events).step_by(2).map(|c| {
            (
                ad(c),
                format!(
                    r#"{{"adId": "{}", "clickTime": "{}"}}"#,
                    ad(c),
                    at(c + 30_000)
                ),
            )
        }),
    )?;
    let rows_in = args.events + args.events.div_ceil(2);
    let mut source = KafkaSource::new(KafkaSourceConfig {
        cluster: tidemark_connectors::kafka::KafkaConnection::new(bootstrap.clone()),
        topics: vec![impressions.clone(), clicks.clone()],
        group: format!("bench-join-{run}"),
        earliest: true,
        properties: BTreeMap::from([(
            "partition.assignment.strategy".to_string(),
            "range".to_string(),
        )]),
    })?;
    let mut sink = KafkaSink::new(
        &tidemark_connectors::kafka::KafkaConnection::new(&bootstrap),
        &output,
        KeyColumns(vec!["adId".into()]),
        ValueFormat::Json,
    )?;
    let decoder = tidemark::decode::ByTopicDecoder::new(Box::new(
        tidemark::decode::JsonDecoder::new(tidemark::schema::Schema::new([
            ("adId", tidemark::schema::FieldType::String),
            ("impressionTime", tidemark::schema::FieldType::Timestamp),
        ])),
    ))
    .topic(
        &clicks,
        Box::new(tidemark::decode::JsonDecoder::new(
            tidemark::schema::Schema::new([
                ("adId", tidemark::schema::FieldType::String),
                ("clickTime", tidemark::schema::FieldType::Timestamp),
            ]),
        )),
    );
    let delay = format!("{} minutes", args.delay_minutes);
    let peak_state = Arc::new(std::sync::Mutex::new(0u64));
    let seen = peak_state.clone();
    let query = Query::builder("bench-join")
        .decoder(decoder)
        .event_time("impressionTime")
        .watermark(&delay)?
        .main_stream(&impressions)
        .join(
            JoinInput::new("clicks")
                .topics(&[&clicks])
                .event_time("clickTime")
                .watermark(&delay)?,
            JoinType::LeftOuter,
            &[("adId", "adId")],
            JoinTimeCondition::between("0 seconds", "1 minute")?,
        )?
        .trigger(Trigger::AvailableNow)
        .max_records_per_batch(args.batch as usize * 3 / 2)
        .on_progress(move |p: &QueryProgress| {
            let rows: u64 = p.state_operators.iter().map(|s| s.num_rows_total).sum();
            let mut peak = seen.lock().unwrap_or_else(|e| e.into_inner());
            *peak = (*peak).max(rows);
        })
        .build()?;
    let started = Instant::now();
    let summary = query.run(&mut source, &mut sink)?;
    let seconds = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        summary.input_records == rows_in,
        "read {} of {rows_in}",
        summary.input_records
    );
    println!(
        "{}",
        serde_json::json!({
            "through_kafka": true,
            "partitions": partitions,
            "delay_minutes": args.delay_minutes,
            "rows_in": rows_in,
            "rows_per_second": (rows_in as f64 / seconds).round(),
            "rows_emitted": summary.output_rows,
            "batches": summary.batches,
            "peak_state_rows": *peak_state.lock().unwrap_or_else(|e| e.into_inner()),
            "peak_rss_mib": tidemark_bench::peak_rss_mib(),
        })
    );
    Ok(())
}
