//! End-to-end latency of the real-time trigger through a real Kafka broker.
//!
//! For each pipeline (a passthrough, and a rolling 10-minute sum per key over
//! `--keys` keys) and each rate in `--rates`: a paced producer stamps each
//! record with its send time in microseconds; tidemark reads the input topic
//! in real-time mode and writes the output topic; a consumer of the output
//! topic takes each row's stamp (the passthrough copies it, the rolling
//! window carries the latest one of the key as a lifetime `max`) and records
//! now − stamp. Prints p50, p99, p99.9 and max per run, after a warm-up.
//! `--throughput` instead measures the rolling operator alone, in process,
//! on one core.
//!
//! ```text
//! cargo run -p tidemark-bench --bin latency -- --rates 1000,10000,50000 --seconds 20
//! cargo run -p tidemark-bench --bin latency -- --throughput
//! ```

use anyhow::Context;
use clap::Parser;
use hdrhistogram::Histogram;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark::decode::JsonDecoder;
use tidemark::operators::{BatchContext, FrontierSpec, Operator, RollingMeasure, RollingWindow};
use tidemark::prelude::*;
use tidemark::runtime::StopHandle;
use tidemark::schema::FieldType;
use tidemark_connectors::kafka::{
    default_bootstrap, ensure_topic, KafkaSink, KafkaSource, KafkaSourceConfig, KeyColumns,
    ValueFormat,
};

#[derive(Debug, Parser)]
struct Args {
    /// Input rates to run, events per second.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000")]
    rates: Vec<u64>,
    /// Seconds measured per run (after a 3-second warm-up).
    #[arg(long, default_value_t = 15)]
    seconds: u64,
    /// Distinct keys of the rolling pipeline.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Partitions of the input topic.
    #[arg(long, default_value_t = 2)]
    partitions: i32,
    /// Which pipelines: broker (no tidemark: the input topic read back),
    /// passthrough, rolling, both (the last two) or all.
    #[arg(long, default_value = "both")]
    pipelines: String,
    /// `linger.ms` of tidemark's output producer (as real-time mode's
    /// default) and of the bench's input producer.
    #[arg(long, default_value_t = 1)]
    linger_ms: u32,
    /// Extra librdkafka properties of tidemark's consumer, `key=value,...`.
    #[arg(long, value_delimiter = ',')]
    source_properties: Vec<String>,
    /// Measure the rolling operator's throughput on one core instead.
    #[arg(long)]
    throughput: bool,
    /// Bootstrap servers (default: `KAFKA_BOOTSTRAP`, else 127.0.0.1:9092).
    #[arg(long, default_value_t = default_bootstrap())]
    bootstrap: String,
    /// Declare the event time `ts` (epoch milliseconds) a `timestamp`
    /// column instead of a `long`: the passthrough then takes the columnar
    /// route (each poll's records decoded into columns and written to
    /// Kafka from them).
    #[arg(long)]
    timestamp_event_time: bool,
    /// Force the row route (`rows`), to compare with the columns in one
    /// session.
    #[arg(long, default_value = "columns")]
    route: String,
}

const WARM_UP: Duration = Duration::from_secs(3);

fn now_us() -> i64 {
    tidemark::time::now_micros()
}

fn rolling_measures() -> anyhow::Result<Vec<RollingMeasure>> {
    Ok(vec![
        RollingMeasure::of("sum", "v")?
            .over("10 minutes")?
            .alias("sum_10m"),
        // The newest stamp of the key: what the output's latency is
        // measured from.
        RollingMeasure::of("max", "sent_us")?.alias("sent_us"),
    ])
}

fn run_once(args: &Args, pipeline: &str, rate: u64) -> anyhow::Result<serde_json::Value> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (input, output) = (format!("lat-in-{id}"), format!("lat-out-{id}"));
    ensure_topic(
        &tidemark_connectors::kafka::KafkaConnection::new(&args.bootstrap),
        &input,
        args.partitions,
    )?;
    ensure_topic(
        &tidemark_connectors::kafka::KafkaConnection::new(&args.bootstrap),
        &output,
        1,
    )?;
    let ts = match args.timestamp_event_time {
        true => FieldType::Timestamp,
        false => FieldType::Long,
    };
    let schema = Schema::new([
        ("ts", ts),
        ("k", FieldType::String),
        ("v", FieldType::Long),
        ("sent_us", FieldType::Long),
    ]);
    let builder = Query::builder(&format!("latency-{id}"));
    let builder = match args.route.as_str() {
        "rows" => builder.decoder(tidemark_bench::RowsOnly(JsonDecoder::new(schema))),
        "columns" => builder.decoder(JsonDecoder::new(schema)),
        other => anyhow::bail!("--route {other}: expected columns or rows"),
    };
    let mut builder = builder
        .event_time("ts")
        .output_mode(OutputMode::Update)
        .trigger(Trigger::RealTime {
            checkpoint_interval: Duration::from_secs(5),
        });
    if pipeline == "rolling" {
        builder =
            builder.rolling_window(&["k"], None, FrontierSpec::default(), rolling_measures()?)?;
    }
    let stop = StopHandle::default();
    let checkpoints = Arc::new(Mutex::new(Vec::new()));
    let seen = checkpoints.clone();
    let query = builder
        .on_progress(move |p: &QueryProgress| {
            seen.lock().unwrap().push((
                p.duration_ms.get("commitOffsets").copied().unwrap_or(0),
                p.latency_ms.clone(),
            ))
        })
        .build()?
        .with_stop_handle(stop.clone());
    let mut source = KafkaSource::new(KafkaSourceConfig {
        cluster: tidemark_connectors::kafka::KafkaConnection::new(args.bootstrap.clone()),
        topics: vec![input.clone()],
        group: format!("latency-{id}"),
        earliest: true,
        properties: args
            .source_properties
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })?;
    let mut sink = KafkaSink::new(
        &tidemark_connectors::kafka::KafkaConnection::new(&args.bootstrap).with_overrides(
            &[("linger.ms".to_string(), args.linger_ms.to_string())]
                .into_iter()
                .collect(),
        ),
        &output,
        KeyColumns(vec!["k".into()]),
        ValueFormat::Json,
    )?;
    // `broker`: no tidemark at all, the reader consumes the input topic:
    // what the broker and clients alone cost on this machine.
    let measured_topic = if pipeline == "broker" {
        stop.stop();
        input.clone()
    } else {
        output.clone()
    };
    let running = std::thread::spawn(move || query.run(&mut source, &mut sink));

    // The consumer of the output topic measures.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", format!("latency-reader-{id}"))
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "5")
        .create()?;
    consumer.subscribe(&[measured_topic.as_str()])?;
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1, 60_000_000, 3,
    )?));
    let done = Arc::new(AtomicBool::new(false));
    let measuring_from = Arc::new(Mutex::new(None::<i64>));
    let reader = spawn_reader(
        consumer,
        histogram.clone(),
        done.clone(),
        measuring_from.clone(),
    );

    let (sent, elapsed) = produce_paced(args, &input, rate, &measuring_from)?;
    std::thread::sleep(Duration::from_secs(2));
    stop.stop();
    running
        .join()
        .map_err(|_| anyhow::anyhow!("query panicked"))??;
    done.store(true, Ordering::Relaxed);
    let rows = reader
        .join()
        .map_err(|_| anyhow::anyhow!("reader panicked"))?;
    let h = histogram.lock().unwrap();
    let ms = |us: u64| us as f64 / 1000.0;
    let result = serde_json::json!({
        "pipeline": pipeline,
        "target_rate": rate,
        "achieved_rate": (sent as f64 / elapsed).round(),
        "rows_out": rows,
        "measured": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.5)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "p99_9_ms": ms(h.value_at_quantile(0.999)),
        "max_ms": ms(h.max()),
        // Per checkpoint: how long it held records back, and tidemark's own
        // record-timestamp-to-sink latency.
        "checkpoints": checkpoints.lock().unwrap().iter().map(|(commit_ms, latency)| {
            serde_json::json!({"commit_ms": commit_ms, "latency_ms": latency})
        }).collect::<Vec<_>>(),
    });
    Ok(result)
}

/// The consumer of the output topic: records each row's latency from its
/// `sent_us` once measuring started; returns the rows read.
fn spawn_reader(
    consumer: BaseConsumer,
    histogram: Arc<Mutex<Histogram<u64>>>,
    done: Arc<AtomicBool>,
    measuring_from: Arc<Mutex<Option<i64>>>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut rows = 0u64;
        while !done.load(Ordering::Relaxed) {
            let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) else {
                continue;
            };
            let received = now_us();
            rows += 1;
            let Ok(row) =
                serde_json::from_slice::<serde_json::Value>(m.payload().unwrap_or_default())
            else {
                continue;
            };
            let Some(sent) = row["sent_us"].as_i64() else {
                continue;
            };
            let from = *measuring_from.lock().unwrap();
            if from.is_some_and(|f| sent >= f) {
                let _ = histogram
                    .lock()
                    .unwrap()
                    .record((received - sent).max(1) as u64);
            }
        }
        rows
    })
}

/// The paced producer: one burst of rate/1000 records every millisecond
/// for the warm-up and the measured seconds; measuring starts after the
/// warm-up. Returns the records sent and the seconds it took.
fn produce_paced(
    args: &Args,
    input: &str,
    rate: u64,
    measuring_from: &Mutex<Option<i64>>,
) -> anyhow::Result<(u64, f64)> {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("linger.ms", args.linger_ms.to_string())
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let total_time = WARM_UP + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut tick = 0u64;
    while started.elapsed() < total_time {
        if measuring_from.lock().unwrap().is_none() && started.elapsed() >= WARM_UP {
            *measuring_from.lock().unwrap() = Some(now_us());
        }
        tick += 1;
        let due = rate * tick / 1000;
        while sent < due {
            let key = format!("k{}", (sent * 7919) % args.keys);
            let t = now_us();
            let value = format!(r#"{{"ts":{},"k":"{key}","v":1,"sent_us":{t}}}"#, t / 1000);
            let mut record = BaseRecord::to(input).key(&key).payload(&value);
            loop {
                match producer.send(record) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        record = back;
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
            }
            sent += 1;
        }
        let next = started + Duration::from_millis(tick);
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    producer.flush(Duration::from_secs(30))?;
    Ok((sent, elapsed))
}

/// The rolling operator alone: events per second on one core, 100k keys,
/// 10-minute sum plus a lifetime max, micro-batches of 100k events.
fn throughput(keys: u64) -> anyhow::Result<serde_json::Value> {
    let mut op = RollingWindow::new(&["k"], "ts", FrontierSpec::default(), rolling_measures()?)?;
    let events = 5_000_000u64;
    let base = 1_800_000_000_000_000i64;
    let key_names: Vec<Value> = (0..keys)
        .map(|i| Value::from(format!("k{i}").as_str()))
        .collect();
    let started = Instant::now();
    let mut out = Vec::new();
    let mut emitted = 0u64;
    for batch in 0..events / 100_000 {
        // One second of processing time per batch, events spread over it:
        // after ten minutes the oldest ones leave the ranges.
        let processing_time = base + (batch as i64 + 1) * 30_000_000;
        let ctx = BatchContext {
            batch_id: batch,
            processing_time,
            late_threshold: 0,
            watermark: 0,
            collect_late_rows: false,
            real_time: false,
        };
        for i in batch * 100_000..(batch + 1) * 100_000 {
            let mut row = Row::new();
            row.set("k", key_names[((i * 7919) % keys) as usize].clone());
            row.set(
                "ts",
                Value::Timestamp(processing_time - (i % 1000) as i64 * 1000),
            );
            row.set("v", Value::Long(1));
            row.set("sent_us", Value::Long(i as i64));
            op.on_row(row, &ctx, &mut out)?;
        }
        op.on_batch_end(&ctx, &mut out)?;
        emitted += out.len() as u64;
        out.clear();
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(serde_json::json!({
        "events": events,
        "keys": keys,
        "seconds": seconds,
        "events_per_second_per_core": (events as f64 / seconds).round(),
        "rows_emitted": emitted,
    }))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.throughput {
        println!("{}", throughput(args.keys)?);
        return Ok(());
    }
    let pipelines: Vec<&str> = match args.pipelines.as_str() {
        "both" => vec!["passthrough", "rolling"],
        "all" => vec!["broker", "passthrough", "rolling"],
        one => vec![one],
    };
    println!("| pipeline | target ev/s | achieved ev/s | p50 ms | p99 ms | p99.9 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for pipeline in pipelines {
        for &rate in &args.rates {
            let r = run_once(&args, pipeline, rate)
                .with_context(|| format!("{pipeline} at {rate}/s"))?;
            println!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                pipeline,
                rate,
                r["achieved_rate"],
                r["p50_ms"].as_f64().unwrap_or(0.0),
                r["p99_ms"].as_f64().unwrap_or(0.0),
                r["p99_9_ms"].as_f64().unwrap_or(0.0),
                r["max_ms"].as_f64().unwrap_or(0.0)
            );
            eprintln!("{r}");
        }
    }
    Ok(())
}
