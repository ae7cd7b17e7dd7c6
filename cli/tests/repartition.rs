//! A grouping on a field that is not the record key, over a 4-partition
//! topic, with two `tidemark run` instances: every key's rows are spread
//! over all partitions, so without the repartition topic each task would
//! emit its own partial count for the same key and window.

mod common;

use common::*;
use std::process::Stdio;
use std::time::Duration;
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 4;
const REGIONS: [&str; 3] = ["north", "south", "west"];

/// The grouping behind the repartition topic, its watermark per partition:
/// the backlog is written a partition at a time, so in arrival order each
/// partition's rows come after the previous partition's last, and under
/// the query-wide watermark an instance reading a later partition counts
/// the earlier ones' progress as that of rows that arrived before its own
/// (see docs/pipeline-file.md#watermark-scope, "Several instances reading
/// a backlog"): its rows behind it would be late, where Spark, planning
/// one batch over every partition, counts them.
fn pipeline(app: &str, input: &str, output: &str, trigger: &str) -> String {
    format!(
        r#"application_id: {app}
source:
  kind: kafka
  topic: {input}
  group: {app}
  format: json
  schema: {{event_time: long, region: string, amount: double}}
  properties: {{session.timeout.ms: "6000", heartbeat.interval.ms: "1000"}}
event_time: event_time
watermark: 30 seconds
watermark_scope: partition
steps:
  - filter: "amount > 0"
  - window_aggregate:
      keys: [region]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}, {{fn: sum, column: amount, as: total}}]
output_mode: append
trigger: {trigger}
max_records_per_batch: 200
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
processing_guarantee: exactly_once
"#
    )
}

/// One event a second per partition for 10 minutes from 10:00, regions
/// rotating, event time in epoch milliseconds, keyed by a sequence number
/// that says nothing about the region.
fn produce_events(input: &str) {
    let start_ms = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap() / 1000;
    for p in 0..PARTITIONS {
        let records: Vec<_> = (0..600i64)
            .map(|i| {
                let region = REGIONS[(i as usize + p as usize) % REGIONS.len()];
                let t = start_ms + i * 1000;
                (
                    format!("seq-{p}-{i}"),
                    format!(r#"{{"event_time": {t}, "region": "{region}", "amount": 0.5}}"#)
                        .into_bytes(),
                )
            })
            .collect();
        produce_to(input, Some(p), &records);
    }
}

/// Each of 3 regions × 9 closed windows once, with all 4 × 20 events.
fn assert_one_row_per_region_and_window(out: &[Consumed]) {
    let mut seen = std::collections::BTreeMap::new();
    for r in out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let key = (
            v["region"].as_str().unwrap().to_string(),
            v["window_start"].as_str().unwrap().to_string(),
        );
        let n = v["n"].as_i64().unwrap();
        assert!(seen.insert(key.clone(), n).is_none(), "duplicate {key:?}");
        assert_eq!((n, v["total"].as_f64().unwrap()), (80, 40.0), "{key:?}");
    }
    assert_eq!(seen.len(), REGIONS.len() * 9, "{seen:?}");
}

#[test]
fn two_instances_group_by_a_non_key_field_through_the_repartition_topic() {
    let (input, output, app) = (unique("rp-in"), unique("rp-out"), unique("rp-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    produce_events(&input);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut instances: Vec<_> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let file = d.path().join("pipeline.yaml");
            let text = pipeline(&app, &input, &output, "{micro_batch: 200 milliseconds}");
            std::fs::write(&file, text).unwrap();
            start_replica_as(&file, Some(&format!("i{i}")))
        })
        .collect();
    let expected = REGIONS.len() * 9;
    wait_for_records(&output, expected);
    for instance in &mut instances {
        interrupt(&mut instance.child);
    }
    assert_one_row_per_region_and_window(&consume_all(&output, expected, Duration::from_secs(10)));
    // The rows really went through the internal topic, keyed by region.
    let internal = consume_all(
        &format!("{app}-op1-repartition"),
        PARTITIONS as usize * 600,
        Duration::from_secs(10),
    );
    let rows: Vec<_> = internal.iter().filter(|r| r.key.is_some()).collect();
    assert_eq!(rows.len(), PARTITIONS as usize * 600);
    let mut partition_of = std::collections::BTreeMap::new();
    for r in rows {
        let region = String::from_utf8(r.key.clone().unwrap()).unwrap();
        assert_eq!(
            *partition_of.entry(region.clone()).or_insert(r.partition),
            r.partition,
            "{region} in two partitions"
        );
    }
}

#[test]
fn available_now_runs_the_writer_to_the_end_then_the_reader() {
    let (input, output, app) = (unique("rpa-in"), unique("rpa-out"), unique("rpa-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    produce_events(&input);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &input, &output, "available_now")).unwrap();
    let done = run_to_end(&file);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_one_row_per_region_and_window(&consume_all(
        &output,
        REGIONS.len() * 9,
        Duration::from_secs(10),
    ));
}

#[test]
fn the_library_runs_a_repartitioned_pipeline_file_in_process_as_the_cli_does() {
    let (input, output, app) = (unique("rpl-in"), unique("rpl-out"), unique("rpl-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    produce_events(&input);
    let dir = tempfile::tempdir().unwrap();
    let text = pipeline(&app, &input, &output, "available_now").replace(
        "state_dir: state",
        &format!("state_dir: {}", dir.path().join("state").display()),
    );
    let file = tidemark_pipeline::PipelineFile::parse(&text).unwrap();
    let sink_stage = file.name.clone();
    let stages_seen = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
    let seen = stages_seen.clone();
    let runner = tidemark_connectors::PipelineRunner::new(file, dir.path()).on_progress(
        move |stage: &str, p: &tidemark::progress::QueryProgress| {
            *seen
                .lock()
                .unwrap()
                .entry(stage.to_string())
                .or_insert(0u64) += p.num_input_rows;
        },
    );
    let topology = runner.topology().unwrap();
    assert!(topology.is_repartitioned(), "a repartitioned pipeline");
    assert_eq!(
        topology.stages[0].output,
        tidemark::runtime::StageOutput::Repartition {
            topic: format!("{}-op1-repartition", sink_stage),
            keys: vec!["region".to_string()]
        }
    );
    let summary = runner.run().unwrap();
    assert_one_row_per_region_and_window(&consume_all(
        &output,
        REGIONS.len() * 9,
        Duration::from_secs(10),
    ));
    assert_eq!(summary.output_rows, REGIONS.len() as u64 * 9);
    // Both stages ran in this process and read every event: the writer from
    // the input topic, the reader (the pipeline's own name) from the
    // repartition topic.
    let seen = stages_seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[&sink_stage], PARTITIONS as u64 * 600, "{seen:?}");
    assert!(
        seen.iter().all(|(_, n)| *n == PARTITIONS as u64 * 600),
        "{seen:?}"
    );
}

/// The same query built in Rust, keyed by nothing it groups on: the
/// library splits it at a repartition topic and runs both stages, as it
/// does for a pipeline file.
#[test]
fn a_rust_built_query_grouping_off_the_record_key_is_repartitioned_by_the_library() {
    use tidemark::prelude::*;
    use tidemark::schema::{FieldType, Schema};
    use tidemark_connectors::kafka::{KafkaSink, KafkaSourceConfig, KeyColumns, ValueFormat};
    let (input, output, app) = (unique("rpb-in"), unique("rpb-out"), unique("rpb-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    produce_events(&input);
    let name = app.clone();
    let query = move || {
        Ok(Query::builder(&name)
            .decoder(tidemark::decode::JsonDecoder::new(Schema::new([
                ("event_time", FieldType::Long),
                ("region", FieldType::String),
                ("amount", FieldType::Double),
            ])))
            .event_time("event_time")
            .watermark("30 seconds")?
            .keyed_by(&["seq"])
            .filter("amount > 0")?
            .window_aggregate(
                ["region"],
                WindowSpec::tumbling("1 minute")?,
                vec![
                    AggregateSpec::count().alias("n"),
                    AggregateSpec::of("sum", "amount")?.alias("total"),
                ],
            )
            .output_mode(OutputMode::Append)
            .trigger(Trigger::AvailableNow)
            .max_records_per_batch(200))
    };
    let source = KafkaSourceConfig {
        cluster: tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        topics: vec![input.clone()],
        group: app.clone(),
        earliest: true,
        properties: Default::default(),
    };
    let sink_topic = output.clone();
    let runner = tidemark_connectors::TopologyRunner::new(query, source, move || {
        let sink = KafkaSink::new(
            &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
            &sink_topic,
            KeyColumns(Vec::new()),
            ValueFormat::Json,
        )?;
        Ok(Box::new(sink) as Box<dyn tidemark::runtime::Sink>)
    });
    assert_eq!(
        runner.stage_names().unwrap(),
        [format!("{app}-repartition-writer"), app.clone()]
    );
    let summary = runner.run().unwrap();
    assert_eq!(summary.output_rows, REGIONS.len() as u64 * 9);
    assert_one_row_per_region_and_window(&consume_all(
        &output,
        REGIONS.len() * 9,
        Duration::from_secs(10),
    ));
    // The rows went through the internal topic the library created.
    let internal = consume_all(
        &format!("{app}-op1-repartition"),
        PARTITIONS as usize * 600,
        Duration::from_secs(10),
    );
    assert_eq!(
        internal.iter().filter(|r| r.key.is_some()).count(),
        PARTITIONS as usize * 600
    );
}

/// The pipeline with a second, chained aggregation (Spark 3.4+'s
/// `window(window, ...)`): 5-minute windows of the 1-minute windows.
fn chained_pipeline(app: &str, input: &str, output: &str, second_keys: &str) -> String {
    pipeline(app, input, output, "available_now").replace(
        "output_mode: append",
        &format!(
            r#"  - window_aggregate:
      keys: {second_keys}
      time: window
      window: {{tumbling: 5 minutes}}
      aggregates: [{{fn: sum, column: n, as: n}}, {{fn: count, as: windows}}]
output_mode: append"#
        ),
    )
}

/// After the repartition by region, a second aggregation by region runs
/// where its rows are; one without keys would need a second repartition
/// and is refused with both key lists rather than summed per partition.
#[test]
fn a_chained_aggregation_runs_behind_the_repartition_or_is_refused() {
    let (input, output, app) = (unique("rpc-in"), unique("rpc-out"), unique("rpc-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    produce_events(&input);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, chained_pipeline(&app, &input, &output, "[region]")).unwrap();
    let done = run_to_end(&file);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    // The watermark ends at 10:09:29: the 1-minute windows up to 10:09
    // closed, and of the 5-minute windows only 10:00-10:05, holding the
    // five 1-minute windows that end by 10:05, each of 4 × 20 events.
    let out = consume_all(&output, REGIONS.len(), Duration::from_secs(10));
    let mut regions = std::collections::BTreeSet::new();
    for r in &out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(
            (
                v["window_start"].as_str().unwrap(),
                v["window_end"].as_str().unwrap(),
                v["n"].as_i64().unwrap(),
                v["windows"].as_i64().unwrap()
            ),
            ("2026-01-01T10:00:00Z", "2026-01-01T10:05:00Z", 400, 5),
            "{v}"
        );
        assert!(regions.insert(v["region"].as_str().unwrap().to_string()));
    }
    assert_eq!(regions.len(), REGIONS.len(), "{out:?}");

    let app = unique("rpc-app");
    std::fs::write(&file, chained_pipeline(&app, &input, &output, "[]")).unwrap();
    let refused = run_to_end(&file);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("steps") && stderr.contains("second repartition"),
        "{stderr}"
    );
}

/// Kafka keeps at most 4 KiB of metadata with a committed offset, and a
/// repartition reader's watermark holds every upstream partition: with 128
/// input partitions its checkpoint keeps only the watermarks. Two runs
/// (the second resumes from the first's checkpoints) write every window
/// once.
#[test]
fn a_repartition_reader_of_128_input_partitions_checkpoints_and_resumes() {
    const WIDE: i32 = 128;
    let (input, output, app) = (unique("rpw-in"), unique("rpw-out"), unique("rpw-app"));
    create_topic(&input, WIDE);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = write_pipeline(dir.path(), (&app, &input, &output), "available_now", 20_000);
    for (from, to) in [(0, 300), (300, 600)] {
        produce_seconds(&input, WIDE, from, to);
        let mut run = tidemark_run(&file, None, Stdio::piped()).spawn().unwrap();
        let mut stderr = run.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut log = String::new();
            std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
            log
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        let status = loop {
            if let Some(status) = run.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                run.kill().unwrap();
                panic!("seconds {from}..{to}: the run did not finish in 5 minutes");
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let log = reader.join().unwrap();
        assert!(status.success(), "seconds {from}..{to}: {log}");
        assert!(!log.contains("metadata"), "seconds {from}..{to}: {log}");
    }
    assert_exact_windows(
        &consume_all(&output, expected_rows(WIDE), Duration::from_secs(60)),
        WIDE,
    );
}
