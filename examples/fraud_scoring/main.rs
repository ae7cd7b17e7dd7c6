//! Fraud scoring in real-time mode: card transactions stream in, each card
//! keeps rolling features (1-hour sum and count, 10-minute average,
//! lifetime count), and a card above the threshold is flagged on the alerts
//! topic within milliseconds of the transaction that crossed it.
//!
//! The application is assembled in Rust (`KafkaApp`); `pipeline.yaml` is
//! the same application as a file for `tidemark run`. With no broker
//! configured it starts librdkafka's embedded mock cluster; with
//! `KAFKA_BOOTSTRAP` set it uses that broker.
//!
//!     cargo run --example fraud_scoring

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use std::time::{Duration, Instant};
use tidemark::operators::{FrontierSpec, OutputMode, RollingMeasure};
use tidemark::progress::QueryProgress;
use tidemark::runtime::{QueryBuilder, RunState};
use tidemark_connectors::kafka::ensure_topic;
use tidemark_connectors::KafkaApp;

const FRAUD_CARD: &str = "card-0666";

/// Per card, a rolling 1-hour sum and count, a 10-minute average and a
/// lifetime count, updated as each transaction arrives; cards above the
/// threshold go on.
fn card_features(query: QueryBuilder) -> tidemark::Result<QueryBuilder> {
    let frontier = FrontierSpec {
        alias: "scored_at".into(),
        ..FrontierSpec::default()
    };
    let measures = vec![
        RollingMeasure::of("sum", "amount")?
            .over("1 hour")?
            .alias("sum_1h"),
        RollingMeasure::of("count", "amount")?
            .over("1 hour")?
            .alias("n_1h"),
        RollingMeasure::of("avg", "amount")?
            .over("10 minutes")?
            .alias("avg_10m"),
        RollingMeasure::of("count", "amount")?.alias("n_lifetime"),
    ];
    query
        .rolling_window(&["card"], None, frontier, measures)?
        .filter("sum_1h > 2000 or n_1h > 15")
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter("warn").init();
    // Topics of their own on a shared broker, so that reruns start empty.
    let run = std::process::id();
    let (transactions, alerts) = (
        format!("card-transactions-{run}"),
        format!("fraud-alerts-{run}"),
    );
    let (_mock, bootstrap) = match std::env::var("KAFKA_BOOTSTRAP") {
        Ok(b) => {
            ensure_topic(
                &tidemark_connectors::kafka::KafkaConnection::new(&b),
                &transactions,
                2,
            )?;
            ensure_topic(
                &tidemark_connectors::kafka::KafkaConnection::new(&b),
                &alerts,
                1,
            )?;
            (None, b)
        }
        Err(_) => {
            let mock = MockCluster::new(1)?;
            mock.create_topic(&transactions, 2, 1)?;
            mock.create_topic(&alerts, 1, 1)?;
            // The query-wide watermark's exchange between instances: the
            // mock cluster does not create topics on request.
            mock.create_topic(&format!("fraud-scoring-{run}-watermarks"), 1, 1)?;
            let b = mock.bootstrap_servers();
            (Some(mock), b)
        }
    };
    println!("broker: {bootstrap}");
    // The same application as pipeline.yaml, in Rust.
    let running = KafkaApp::new(&format!("fraud-scoring-{run}"))
        .bootstrap(&bootstrap)
        .input(
            &transactions,
            &[
                ("ts", "long"),
                ("card", "string"),
                ("amount", "double"),
                ("merchant", "string"),
            ],
        )
        // Produced keyed by card: each card's features are kept where its
        // transactions are, without a repartition topic.
        .keyed_by(&["card"])
        // Transactions older than this on arrival are ignored.
        .event_time("ts", "10 seconds")
        .steps(card_features)
        .output_mode(OutputMode::Update)
        // Checkpoint every 5 s; rows leave at once (at-least-once output).
        .real_time(Duration::from_secs(5))
        .to_topic(&alerts, &["card"])
        .runner()?
        .on_progress(|_stage: &str, p: &QueryProgress| {
            eprintln!(
                "checkpoint: batch {} | {} transactions | {} alerts | latency ms {:?}",
                p.batch_id, p.num_input_rows, p.sink.num_output_rows, p.latency_ms
            );
        })
        .start()?;
    // Traffic starts once the application reads (its start-up checks done).
    running
        .status()
        .wait_until(Duration::from_secs(60), RunState::is_ready);

    // Eight seconds of traffic: 1,000 cards making small purchases, and one
    // card that starts buying expensive things fast after two seconds.
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "0")
        .create()?;
    let started = Instant::now();
    let mut sent = 0u64;
    for i in 0..2_400u64 {
        let now_ms = tidemark::time::now_micros() / 1000;
        let (card, amount) = if i >= 600 && i % 60 == 0 {
            (FRAUD_CARD.to_string(), 450.0)
        } else {
            (
                format!("card-{:04}", (i * 7919) % 1000),
                5.0 + (i % 75) as f64,
            )
        };
        let value = serde_json::json!({
            "ts": now_ms, "card": card, "amount": amount, "merchant": format!("m{}", i % 40),
        })
        .to_string();
        producer
            .send(BaseRecord::to(&transactions).key(&card).payload(&value))
            .map_err(|(e, _)| e)?;
        sent += 1;
        std::thread::sleep(Duration::from_micros(3_300));
    }
    producer.flush(Duration::from_secs(10))?;
    println!(
        "sent {sent} transactions in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(1));
    let summary = running.stop_within(Duration::from_secs(60))?;

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", format!("alerts-reader-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[alerts.as_str()])?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut alerts = 0;
    while Instant::now() < deadline && alerts < summary.output_rows {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            alerts += 1;
            println!(
                "alert: {}",
                String::from_utf8_lossy(m.payload().unwrap_or_default())
            );
        }
    }
    println!(
        "done: {} transactions scored, {} alert rows",
        summary.input_records, summary.output_rows
    );
    Ok(())
}
