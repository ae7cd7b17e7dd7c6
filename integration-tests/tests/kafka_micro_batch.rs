//! The micro-batch trigger on a real broker, and Avro schemas fetched from a
//! schema registry over HTTP.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark::prelude::*;
use tidemark::progress::QueryProgress;
use tidemark::runtime::TaskCheckpoint;
use tidemark_connectors::kafka::{
    KafkaSink, KafkaSource, KafkaSourceConfig, KeyColumns, ValueFormat,
};
use tidemark_integration_tests::*;

fn source(topic: &str, group: &str) -> KafkaSource {
    source_with(topic, group, &[])
}

/// [`source`] with the consumer `properties`.
fn source_with(topic: &str, group: &str, properties: &[(&str, &str)]) -> KafkaSource {
    KafkaSource::new(KafkaSourceConfig {
        cluster: tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        topics: vec![topic.to_string()],
        group: group.to_string(),
        earliest: true,
        properties: properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    })
    .unwrap()
}

#[test]
fn micro_batches_pick_up_records_produced_while_running_and_stop_cleanly() {
    let (input, output) = (unique("mb-in"), unique("mb-out"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let reports = Arc::new(Mutex::new(Vec::<QueryProgress>::new()));
    let seen = reports.clone();
    let query = Query::builder("micro-batch")
        .filter("n % 2 = 0")
        .unwrap()
        .trigger(Trigger::MicroBatch {
            interval: Duration::from_millis(200),
        })
        .on_progress(move |p: &QueryProgress| seen.lock().unwrap().push(p.clone()))
        .build()
        .unwrap();
    let stop = query.stop_handle();
    let (topic_in, topic_out) = (input.clone(), output.clone());
    let runner = std::thread::spawn(move || {
        let mut sink = KafkaSink::new(
            &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
            &topic_out,
            KeyColumns::default(),
            ValueFormat::Json,
        )
        .unwrap();
        query
            .run(&mut source(&topic_in, &unique("mb-app")), &mut sink)
            .unwrap()
    });
    // Three waves while the query runs.
    for wave in 0..3 {
        let records: Vec<_> = (0..100)
            .map(|i| {
                (
                    format!("k{i}"),
                    format!(r#"{{"n": {}}}"#, wave * 100 + i).into_bytes(),
                )
            })
            .collect();
        produce(&input, &records);
        std::thread::sleep(Duration::from_millis(500));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while reports
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.num_input_rows)
        .sum::<u64>()
        < 300
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.stop();
    let summary = runner.join().unwrap();
    assert_eq!(summary.input_records, 300);
    assert_eq!(summary.output_rows, 150);
    assert!(
        summary.batches >= 2,
        "records arrived in waves, so in several batches: {summary:?}"
    );
    assert_eq!(
        consume_all(&output, 150, Duration::from_secs(30)).len(),
        150
    );
}

/// Serves `GET /schemas/ids/{id}` like a Confluent schema registry, counting
/// requests.
fn registry(schema: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let log = requests.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).unwrap_or(0) <= 2 {
                    break;
                }
            }
            log.lock().unwrap().push(path.clone());
            let (status, body) = if path == "/schemas/ids/3" {
                (
                    "200 OK",
                    serde_json::json!({ "schema": schema }).to_string(),
                )
            } else {
                (
                    "404 Not Found",
                    r#"{"error_code":40403,"message":"Schema not found"}"#.to_string(),
                )
            };
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, requests)
}

#[test]
fn avro_schemas_come_from_the_registry_and_unknown_ids_are_dead_letters() {
    const SCHEMA: &str = r#"{"type":"record","name":"Reading","fields":[{"name":"sensor","type":"string"},{"name":"value","type":"double"}]}"#;
    let (url, requests) = registry(SCHEMA);
    let encoder = tidemark_connectors::avro::AvroEncoder::new(
        apache_avro::Schema::parse_str(SCHEMA).unwrap(),
        3,
    )
    .unwrap();
    let (input, output, dlq) = (unique("reg-in"), unique("reg-out"), unique("reg-dlq"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    create_topic(&dlq, 1);
    let mut records: Vec<_> = (0..10)
        .map(|i| {
            let row: Row = [
                ("sensor", Value::from("s1")),
                ("value", Value::Double(i as f64)),
            ]
            .into_iter()
            .collect();
            ("s1".to_string(), encoder.encode(&row).unwrap())
        })
        .collect();
    let mut unknown = records[0].1.clone();
    unknown[1..5].copy_from_slice(&4u32.to_be_bytes());
    records.push(("s1".into(), unknown));
    produce(&input, &records);
    let query = Query::builder("registry")
        .decoder(tidemark_connectors::avro::AvroDecoder::new(
            Default::default(),
            Some(
                tidemark_connectors::avro::RegistryClient::new(
                    &tidemark_connectors::avro::RegistryConfig {
                        url,
                        properties: Default::default(),
                    },
                )
                .unwrap(),
            ),
        ))
        .dead_letter(
            tidemark_connectors::kafka::KafkaDeadLetter::new(
                &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
                &dlq,
            )
            .unwrap(),
        )
        .trigger(Trigger::AvailableNow)
        .build()
        .unwrap();
    let mut sink = KafkaSink::new(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &output,
        KeyColumns(vec!["sensor".into()]),
        ValueFormat::Json,
    )
    .unwrap();
    let summary = query
        .run(&mut source(&input, &unique("reg-app")), &mut sink)
        .unwrap();
    assert_eq!((summary.output_rows, summary.bad_records), (10, 1));
    // Schema 3 fetched once and cached; schema 4 asked for and refused.
    assert_eq!(
        requests
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == "/schemas/ids/3")
            .count(),
        1
    );
    let dead = consume_all(&dlq, 1, Duration::from_secs(30));
    assert!(
        dead[0].headers["tidemark.error"].contains("unknown schema id 4"),
        "{:?}",
        dead[0].headers
    );
    let out = consume_all(&output, 10, Duration::from_secs(30));
    let v: serde_json::Value = serde_json::from_slice(out[9].value.as_deref().unwrap()).unwrap();
    assert_eq!(v, serde_json::json!({"sensor": "s1", "value": 9.0}));
}

/// A topic that does not exist is a configuration error, reported once its
/// metadata has had time to appear, not a consumer error logged forever.
#[test]
fn a_topic_that_does_not_exist_fails_the_query_with_its_name() {
    let missing = unique("never-created");
    let query = Query::builder("missing")
        .trigger(Trigger::MicroBatch {
            interval: Duration::from_millis(200),
        })
        .build()
        .unwrap();
    let stop = query.stop_handle();
    let watchdog = std::thread::spawn(move || {
        // The test fails rather than hangs if the error never comes.
        std::thread::sleep(Duration::from_secs(90));
        stop.stop();
    });
    let started = Instant::now();
    let mut sink = tidemark::runtime::testing::CollectSink::default();
    let result = query.run(&mut source(&missing, &unique("missing-app")), &mut sink);
    let e = result.expect_err("a missing topic must fail the query");
    assert!(
        matches!(e, tidemark::error::Error::Config { .. }),
        "{e} after {:?}",
        started.elapsed()
    );
    assert!(e.to_string().contains(&missing), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    assert!(!tidemark_connectors::is_transient(&e));
    drop(watchdog);
}

/// Available-now on a topic that does not exist fails the same way,
/// rather than ending as if the topic were empty.
#[test]
fn available_now_on_a_topic_that_does_not_exist_fails_too() {
    let missing = unique("never-created-an");
    let query = Query::builder("missing-an")
        .trigger(Trigger::AvailableNow)
        .build()
        .unwrap();
    let mut sink = tidemark::runtime::testing::CollectSink::default();
    let e = query
        .run(&mut source(&missing, &unique("missing-an-app")), &mut sink)
        .expect_err("a missing topic must fail the query");
    assert!(matches!(e, tidemark::error::Error::Config { .. }), "{e}");
    assert!(e.to_string().contains(&missing), "{e}");
}

/// Under exactly-once the dead-letter output is part of the batch's
/// transaction: a batch whose transaction fails leaves its dead letter
/// invisible to `read_committed` readers (it is written again when the
/// batch is replayed), where a dead-letter producer of its own would have
/// published it at once.
#[test]
fn exactly_once_dead_letters_commit_or_abort_with_the_batch() {
    use rdkafka::producer::{BaseProducer, Producer};
    use tidemark_connectors::kafka::{KafkaDeadLetter, SharedTransactions};
    let (input, output, dlq) = (unique("eo-dl-in"), unique("eo-dl-out"), unique("eo-dl-dlq"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    create_topic(&dlq, 1);
    produce(
        &input,
        &[
            ("k".into(), b"not json".to_vec()),
            ("k".into(), br#"{"k": "fence"}"#.to_vec()),
        ],
    );
    let transactional_id = unique("eo-dl-tx");
    let transactions = SharedTransactions::new(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &transactional_id,
    )
    .unwrap();
    let fencing_id = transactional_id.clone();
    let dead_letters = dlq.clone();
    let query = Query::builder("eo-dead-letters")
        .dead_letter(
            KafkaDeadLetter::new(
                &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
                &dlq,
            )
            .unwrap()
            .with_transactions(transactions.clone()),
        )
        // After the bad record was dead-lettered, a newer producer with the
        // same transactional id fences this one: the batch cannot commit.
        .step(move || {
            let fencing_id = fencing_id.clone();
            let dead_letters = dead_letters.clone();
            Box::new(tidemark::operators::MapRows::new("Fence", move |row| {
                // The dead letter must have reached the broker (uncommitted)
                // before the fence: produced a moment earlier, it may still
                // sit in the producer's queue on a loaded machine, and a
                // fenced producer never sends it.
                let deadline = std::time::Instant::now() + Duration::from_secs(30);
                while consume_uncommitted(&dead_letters, Duration::from_millis(500)).is_empty()
                    && std::time::Instant::now() < deadline
                {}
                let newer: BaseProducer = rdkafka::ClientConfig::new()
                    .set("bootstrap.servers", bootstrap())
                    .set("transactional.id", &fencing_id)
                    .create()
                    .unwrap();
                newer.init_transactions(Duration::from_secs(30)).unwrap();
                Ok(vec![row])
            }))
        })
        .trigger(Trigger::AvailableNow)
        .build()
        .unwrap();
    let mut source = source(&input, &unique("eo-dl-app")).with_transactions(transactions.clone());
    let mut sink = KafkaSink::new(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &output,
        KeyColumns(Vec::new()),
        ValueFormat::Json,
    )
    .unwrap()
    .with_transactions(transactions);
    let e = query.run(&mut source, &mut sink).unwrap_err();
    assert!(!e.is_bad_data(), "{e}");
    // Written, then aborted: only a read_uncommitted reader sees it.
    assert_eq!(
        consume_uncommitted(&dlq, Duration::from_secs(5)).len(),
        1,
        "the dead letter was written in the transaction"
    );
    assert!(
        consume_all(&dlq, 1, Duration::from_secs(5)).is_empty(),
        "an aborted batch's dead letter is not committed"
    );
    assert!(consume_all(&output, 1, Duration::from_secs(2)).is_empty());
}

/// The request of a plain micro-batch lasting `wait`.
fn batch_request(batch_id: u64, wait: Duration) -> tidemark::runtime::BatchRequest {
    tidemark::runtime::BatchRequest {
        batch_id,
        deadline: Instant::now() + wait,
        max_records: 10_000,
        available_now: false,
        return_early: false,
        plan_offsets: false,
    }
}

/// Reads batches from `source` until `wanted` records came (or a minute
/// passed); returns how many came.
fn read_records(source: &mut KafkaSource, wanted: usize) -> usize {
    use tidemark::runtime::Source;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut read = 0;
    while read < wanted && Instant::now() < deadline {
        read += source
            .next_batch(&batch_request(0, Duration::from_secs(1)))
            .unwrap()
            .records
            .len();
    }
    read
}

/// A batch aborted and rewound hands every owned partition's checkpoint
/// back, as after an assignment. When a rebalance takes one of them away
/// before that batch ends, its checkpoint must not come back with it: the
/// runtime applies the revocation first and would start a task for a
/// partition it no longer owns, whose state then goes stale and is reused
/// if the partition comes back (a zombie test's duplicate window).
#[test]
fn a_partition_revoked_after_a_rewind_does_not_hand_back_its_checkpoint() {
    use tidemark::runtime::Source;
    let (topic, group) = (unique("rewind-revoke"), unique("rewind-revoke-app"));
    create_topic(&topic, 2);
    for partition in 0..2 {
        let records: Vec<_> = (0..10)
            .map(|i| (format!("k{i}"), format!(r#"{{"n": {i}}}"#).into_bytes()))
            .collect();
        produce_to(&topic, Some(partition), &records);
    }
    let mut first = source(&topic, &group);
    assert_eq!(
        read_records(&mut first, 20),
        20,
        "the first member read both partitions"
    );
    let checkpoints: std::collections::BTreeMap<i32, TaskCheckpoint> = (0..2)
        .map(|p| (p, TaskCheckpoint::from_stored(format!("checkpoint-{p}"))))
        .collect();
    first.commit(&checkpoints).unwrap();
    assert!(first.rewind().unwrap());

    // A second member joins while the first one's next batch runs: the
    // cooperative rebalance moves one partition to it within that batch.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let second = {
        let (stop, topic, group) = (stop.clone(), topic.clone(), group.clone());
        std::thread::spawn(move || {
            let mut second = source(&topic, &group);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                second
                    .next_batch(&batch_request(0, Duration::from_millis(200)))
                    .unwrap();
            }
        })
    };
    let batch = first
        .next_batch(&batch_request(1, Duration::from_secs(25)))
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    second.join().unwrap();
    assert_eq!(
        batch.revoked_partitions.len(),
        1,
        "the rebalance ended within the batch: {batch:?}"
    );
    let handed_back: Vec<i32> = batch.restored_checkpoints.iter().map(|(p, _)| *p).collect();
    let kept = 1 - batch.revoked_partitions[0];
    assert_eq!(
        handed_back,
        vec![kept],
        "only the partition still owned comes back with its checkpoint"
    );
}

/// A zombie's batch that moved no offset but wrote (a no-data batch
/// closing windows) must be fenced like any other: its partitions went to
/// another member while it was not polling. Before, such a commit sent no
/// offsets, so nothing checked the group generation and the zombie's
/// output (and state changes) committed next to the new owner's.
#[test]
fn a_zombie_batch_that_moved_no_offset_is_fenced_by_the_group_generation() {
    use rdkafka::producer::BaseRecord;
    use tidemark::runtime::Source;
    use tidemark_connectors::kafka::SharedTransactions;
    let (topic, output, group) = (
        unique("zombie-nodata-in"),
        unique("zombie-nodata-out"),
        unique("zombie-nodata-app"),
    );
    create_topic(&topic, 2);
    create_topic(&output, 1);
    for partition in 0..2 {
        produce_to(&topic, Some(partition), &[("k".into(), b"{}".to_vec())]);
    }
    let cluster = tidemark_connectors::kafka::KafkaConnection::new(bootstrap());
    let transactions = SharedTransactions::new(&cluster, &unique("zombie-nodata-tx")).unwrap();
    // Left out of the group after 6 s without a poll (the least session).
    let member = |transactions: Option<&SharedTransactions>| {
        let properties = [
            ("session.timeout.ms", "6000"),
            ("max.poll.interval.ms", "6000"),
        ];
        let source = source_with(&topic, &group, &properties);
        match transactions {
            Some(t) => source.with_transactions(t.clone()),
            None => source,
        }
    };
    let mut zombie = member(Some(&transactions));
    assert_eq!(
        read_records(&mut zombie, 2),
        2,
        "the first member read both partitions"
    );
    zombie.commit(&Default::default()).unwrap();

    // Another member takes both partitions while the first stops polling.
    // It owns them once it reads a new record from each.
    let mut live = member(None);
    for partition in 0..2 {
        produce_to(&topic, Some(partition), &[("k".into(), b"{}".to_vec())]);
    }
    assert_eq!(
        read_records(&mut live, 2),
        2,
        "the second member took both partitions"
    );
    // The zombie, not knowing, writes and commits without a new offset.
    transactions
        .send(BaseRecord::to(&output).key("k").payload("from the zombie"))
        .unwrap();
    let committed = zombie.commit(&Default::default());
    assert!(committed.is_err(), "the zombie's batch committed");
    assert!(
        consume_all(&output, 1, Duration::from_secs(5)).is_empty(),
        "the zombie's output is not visible"
    );
}

/// The sink enqueues a batch's records in chunks through librdkafka's batch
/// call; a producer queue far smaller than the batch fills at every chunk.
/// Every record still arrives once, each key's in the order written, keyed
/// and partitioned as one by one.
#[test]
fn a_batch_larger_than_the_producer_queue_arrives_whole_and_in_order() {
    use tidemark::row::{Row, Value};
    use tidemark::runtime::Sink;
    let output = unique("chunked-out");
    create_topic(&output, 3);
    let small_queue = [("queue.buffering.max.messages".to_string(), "50".to_string())];
    let cluster = tidemark_connectors::kafka::KafkaConnection::new(bootstrap())
        .with_overrides(&small_queue.into_iter().collect());
    let mut sink = KafkaSink::new(
        &cluster,
        &output,
        KeyColumns(vec!["sensor".into()]),
        ValueFormat::Json,
    )
    .unwrap();
    let rows: Vec<Row> = (0..5000i64)
        .map(|n| {
            let mut row = Row::new();
            row.set("sensor", Value::from(format!("s{}", n % 7).as_str()));
            row.set("n", Value::from(n));
            row
        })
        .collect();
    sink.write(0, &rows).unwrap();
    sink.commit(0).unwrap();
    let out = consume_all(&output, rows.len(), Duration::from_secs(60));
    assert_eq!(out.len(), rows.len());
    let mut last_per_key = std::collections::BTreeMap::<String, (i32, i64)>::new();
    for record in &out {
        let key = String::from_utf8(record.key.clone().unwrap()).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        assert_eq!(value["sensor"], serde_json::json!(key));
        let n = value["n"].as_i64().unwrap();
        if let Some((partition, last)) = last_per_key.insert(key.clone(), (record.partition, n)) {
            assert_eq!(partition, record.partition, "key {key} in two partitions");
            assert!(n > last, "key {key}: {n} after {last}");
        }
    }
    assert_eq!(last_per_key.len(), 7);
}

/// A chain of filters, projections and computed columns gives the sink its
/// columns: the sink writes JSON or Avro straight from them. Keyed by one
/// column and by three (one missing), with NULL keys, escapes, a NaN and
/// timestamps, the records are those the same rows written as rows give:
/// the same keys, values and partitions, in the same order.
#[test]
fn rows_written_from_columns_arrive_as_the_same_rows_written_as_rows() {
    use tidemark::columns::{array_of, rows_of};
    use tidemark::row::Value;
    use tidemark::runtime::{BatchOutput, ColumnsOutput, Sink};
    let n = 600i64;
    let sensors: Vec<Value> = (0..n)
        .map(|i| match i % 9 {
            0 => Value::Null,
            k => Value::from(format!("s{k} \"é\"\n").as_str()),
        })
        .collect();
    let numbers: Vec<Value> = (0..n).map(|i| Value::from(i * 7 - 300)).collect();
    let doubles: Vec<Value> = (0..n)
        .map(|i| match i % 11 {
            0 => Value::Double(f64::NAN),
            k => Value::Double(k as f64 / 3.0),
        })
        .collect();
    let times: Vec<Value> = (0..n)
        .map(|i| Value::Timestamp(1_767_261_600_123_456 + i * 1_000_001))
        .collect();
    let batch = arrow_array::RecordBatch::try_from_iter([
        ("sensor", array_of(&sensors).unwrap()),
        ("n", array_of(&numbers).unwrap()),
        ("d", array_of(&doubles).unwrap()),
        ("t", array_of(&times).unwrap()),
    ])
    .unwrap();
    let rows = rows_of(&batch).unwrap();
    let avro = || {
        let schema = apache_avro::Schema::parse_str(
            r#"{"type":"record","name":"R","fields":[
                {"name":"sensor","type":["null","string"]},
                {"name":"n","type":"long"},
                {"name":"d","type":"double"},
                {"name":"t","type":{"type":"long","logicalType":"timestamp-micros"}},
                {"name":"missing","type":["null","long"]}]}"#,
        )
        .unwrap();
        ValueFormat::Avro(tidemark_connectors::avro::AvroEncoder::new(schema, 3).unwrap())
    };
    let cases = [
        (vec!["sensor"], false),
        (vec!["sensor", "n", "missing"], false),
        (vec!["sensor"], true),
    ];
    for (key, as_avro) in cases {
        let key = KeyColumns(key.into_iter().map(String::from).collect());
        let mut written = Vec::new();
        for as_columns in [false, true] {
            let output = unique("from-columns");
            create_topic(&output, 3);
            let cluster = tidemark_connectors::kafka::KafkaConnection::new(bootstrap());
            let format = match as_avro {
                true => avro(),
                false => ValueFormat::Json,
            };
            let mut sink = KafkaSink::new(&cluster, &output, key.clone(), format).unwrap();
            match as_columns {
                false => sink.write(0, &rows).unwrap(),
                true => {
                    let columns = [ColumnsOutput {
                        before_row: 0,
                        partition: 0,
                        batch: batch.clone(),
                    }];
                    let output = BatchOutput {
                        rows: &[],
                        tasks: &[],
                        columns: &columns,
                    };
                    sink.write_output(0, &output).unwrap();
                }
            }
            sink.commit(0).unwrap();
            let mut out = consume_all(&output, rows.len(), Duration::from_secs(60));
            // Partitions are read one after another or interleaved: the
            // order that counts is within each.
            out.sort_by_key(|r| r.partition);
            written.push(
                out.into_iter()
                    .map(|r| (r.partition, r.key, r.value))
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(written[0].len(), rows.len());
        assert_eq!(written[1], written[0], "key {key:?}, Avro {as_avro}");
    }
}
