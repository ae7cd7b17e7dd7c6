//! Quickstart: a realistic stream of sensor readings through a windowed
//! pipeline, printed with progress.
//!
//! With no broker configured it starts librdkafka's embedded mock cluster;
//! with `KAFKA_BOOTSTRAP` set it uses that broker.
//!
//!     cargo run --example quickstart

use rdkafka::config::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::time::Duration;
use tidemark::prelude::*;
use tidemark_connectors::kafka::ensure_topic;
use tidemark_connectors::KafkaApp;

/// The input topic's name; each run gets its own (`sensor-readings-<pid>`),
/// so that a rerun on a shared broker reads only its own readings.
const TOPIC_PREFIX: &str = "sensor-readings";
const MACHINES: [&str; 4] = ["drill-1", "drill-2", "loader-1", "truck-7"];

/// The application's id, its own per run (its consumer group, its
/// internal topics).
fn app_id() -> String {
    format!("machine-health-{}", std::process::id())
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    let topic = format!("{TOPIC_PREFIX}-{}", std::process::id());
    let topic = topic.as_str();
    // The mock cluster lives as long as `_mock`.
    let (_mock, bootstrap) = match std::env::var("KAFKA_BOOTSTRAP") {
        Ok(b) => {
            ensure_topic(
                &tidemark_connectors::kafka::KafkaConnection::new(&b),
                topic,
                4,
            )?;
            (None, b)
        }
        Err(_) => {
            let mock = MockCluster::new(1)?;
            mock.create_topic(topic, 4, 1)?;
            // The query-wide watermark's exchange between instances: the
            // mock cluster does not create topics on request.
            mock.create_topic(&format!("{}-watermarks", app_id()), 1, 1)?;
            let b = mock.bootstrap_servers();
            (Some(mock), b)
        }
    };
    println!("broker: {bootstrap}");

    // Ten minutes of readings from four machines, one every 5 seconds each,
    // keyed by machine so each machine's windows live in one task; every
    // 37th reading arrives 4 minutes late, and one record is garbage.
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()?;
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").expect("valid");
    let mut sent = 0;
    for i in 0..120i64 {
        for (m, machine) in MACHINES.iter().enumerate() {
            let late = if (i * 4 + m as i64) % 37 == 0 {
                240_000_000
            } else {
                0
            };
            let t = start + i * 5_000_000 - late;
            let temperature = 60.0 + (m as f64) * 5.0 + ((i % 12) as f64) * 0.5;
            let value = serde_json::json!({
                "event_time": tidemark::time::format_rfc3339(t),
                "machine": machine,
                "temperature": temperature,
                "pressure": 1.0 + (i % 7) as f64 * 0.01,
            })
            .to_string();
            producer
                .send(BaseRecord::to(topic).key(*machine).payload(&value))
                .map_err(|(e, _)| e)?;
            sent += 1;
        }
    }
    producer
        .send(BaseRecord::to(topic).key("drill-1").payload("{not json"))
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(10))?;
    println!(
        "produced {} readings and 1 malformed record to `{topic}`",
        sent
    );

    let summary =
        KafkaApp::new(&format!("machine-health-{}", std::process::id()))
            .bootstrap(&bootstrap)
            .input(
                topic,
                &[
                    ("event_time", "timestamp"),
                    ("machine", "string"),
                    ("temperature", "double"),
                    ("pressure", "double"),
                ],
            )
            // Keyed by machine: each machine's windows live in one task.
            .keyed_by(&["machine"])
            .event_time("event_time", "1 minute")
            .steps(|query| {
                Ok(query.filter("temperature > 0")?.window_aggregate(
                    ["machine"],
                    tumbling("2 minutes")?,
                    vec![
                        count().alias("readings"),
                        avg("temperature").alias("avg_temperature"),
                        max("pressure"),
                    ],
                ))
            })
            .output_mode(OutputMode::Append)
            .available_now()
            .max_records_per_batch(100)
            .to_stdout()
            .runner()?
            .on_progress(|_stage: &str, p: &QueryProgress| {
                let dropped: u64 = p
                    .state_operators
                    .iter()
                    .map(|s| s.num_rows_dropped_by_watermark)
                    .sum();
                eprintln!(
                "progress: batch {} | {} rows in | {} rows out | watermark {} | dropped late {}",
                p.batch_id,
                p.num_input_rows,
                p.sink.num_output_rows,
                p.event_time.get("watermark").map(String::as_str).unwrap_or("-"),
                dropped
            );
            })
            .run()?;
    println!(
        "done: {} batches, {} input records, {} windows emitted, {} bad record(s) sent to the dead-letter output",
        summary.batches, summary.input_records, summary.output_rows, summary.bad_records
    );
    Ok(())
}
