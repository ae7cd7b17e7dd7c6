//! Spark's query-wide watermark against the per-partition one, on a
//! two-partition topic whose partitions are out of step: partition 0 (key
//! `a`) runs to 10:20 while partition 1 (key `b`) has sent nothing; then
//! `b` sends rows of 10:01 and 10:02. Under `watermark_scope: query` (one
//! watermark over every partition, as Spark computes it) they are behind
//! the 10:15 watermark and dropped as late; under `partition` (Kafka
//! Streams' stream time) partition 1 has its own watermark and counts them.
//! With two instances, one per partition, the instances share their
//! partitions' progress through `<application_id>-watermarks`, so the
//! instance holding partition 1 drops them too. And under the default
//! (`query`), a backlog on several partitions is read as Spark reads it:
//! each batch takes every partition up to its planned offsets, so no
//! partition's rows fall behind another's watermark.
//!
//! The pipelines run `exactly_once`: the tests count every window exactly
//! across stops, restarts and failovers, where at-least-once may write a
//! batch again (an offset commit refused with `IllegalGeneration` while the
//! group moves makes its rows go to the repartition topic twice).

mod common;

use common::{interrupt, start_replica, start_replica_as, wait_for_records, Replica};
use std::time::Duration;
use tidemark_integration_tests::*;

fn pipeline(app: &str, input: &str, output: &str, scope: &str) -> String {
    format!(
        r#"application_id: {app}
source:
  kind: kafka
  topic: {input}
  group: {app}
  keyed_by: [id]
  format: json
  schema: {{event_time: timestamp, id: string}}
event_time: event_time
watermark: 5 minutes
watermark_scope: {scope}
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 5 minutes}}
      aggregates: [{{fn: count, as: n}}]
output_mode: append
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
processing_guarantee: exactly_once
"#
    )
}

fn rows(id: &str, minutes: &[&str]) -> Vec<(String, Vec<u8>)> {
    minutes
        .iter()
        .map(|m| {
            let value = format!(r#"{{"event_time": "2026-01-01T{m}:00Z", "id": "{id}"}}"#);
            (id.to_string(), value.into_bytes())
        })
        .collect()
}

/// Partition 0 (key `a`) runs from 10:00 to 10:20.
fn a_runs_ahead(input: &str) {
    let a: Vec<String> = (0..=20).map(|m| format!("10:{m:02}")).collect();
    let a: Vec<&str> = a.iter().map(String::as_str).collect();
    produce_to(input, Some(0), &rows("a", &a));
}

/// Partition 1 (key `b`) sends 10:01, 10:02 and 10:30; then both
/// partitions move every watermark past them and the 10:30 window.
fn b_lags_then_both_move_on(input: &str) {
    produce_to(input, Some(1), &rows("b", &["10:01", "10:02", "10:30"]));
    std::thread::sleep(Duration::from_secs(2));
    produce_to(input, Some(0), &rows("a", &["10:45"]));
    produce_to(input, Some(1), &rows("b", &["10:45"]));
}

/// The `expected` windows written to `output`, as sorted `(id, window
/// start, count)`, the warm-up keys (`w…`) left out.
fn emitted(output: &str, expected: usize) -> Vec<(String, String, i64)> {
    let mut out: Vec<_> = consume_all(output, expected, Duration::from_secs(10))
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (
                v["id"].as_str().unwrap().to_string(),
                v["window_start"].as_str().unwrap()[11..16].to_string(),
                v["n"].as_i64().unwrap(),
            )
        })
        .filter(|(id, _, _)| !id.starts_with('w'))
        .collect();
    out.sort();
    out
}

/// Runs the scenario under `scope`; returns each emitted `(id, window
/// start, count)`.
fn run(scope: &str) -> Vec<(String, String, i64)> {
    let (input, output, app) = (unique("ws-in"), unique("ws-out"), unique("ws-app"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &input, &output, scope)).unwrap();
    let mut replica = start_replica(&file);
    a_runs_ahead(&input);
    // a's windows up to 10:15 close on partition 0's watermark, 10:15.
    wait_for_records(&output, 3);
    b_lags_then_both_move_on(&input);
    // a: 10:15, 10:20; b: 10:30, and 10:00 only per partition.
    let expected = if scope == "query" { 6 } else { 7 };
    wait_for_records(&output, expected);
    std::thread::sleep(Duration::from_secs(2));
    interrupt(&mut replica.child);
    emitted(&output, expected)
}

fn windows(rows: &[(&str, &str, i64)]) -> Vec<(String, String, i64)> {
    rows.iter()
        .map(|(id, start, n)| (id.to_string(), start.to_string(), *n))
        .collect()
}

#[test]
fn query_scope_drops_a_lagging_partitions_rows_as_spark_does_and_partition_scope_keeps_them() {
    let a = [
        ("a", "10:00", 5),
        ("a", "10:05", 5),
        ("a", "10:10", 5),
        ("a", "10:15", 5),
        ("a", "10:20", 1),
    ];
    let mut query = windows(&a);
    query.push(("b".into(), "10:30".into(), 1));
    assert_eq!(run("query"), query, "Spark: b's 10:01 and 10:02 are late");
    let mut partition = windows(&a);
    partition.extend(windows(&[("b", "10:00", 2), ("b", "10:30", 1)]));
    partition.sort();
    assert_eq!(run("partition"), partition);
}

/// Writes a row of 09:00 to each partition (keys `w0`, `w1`) every two
/// seconds until every replica has run a batch with input read from
/// `input` (behind a repartition, a writer's batch): each then holds a
/// partition of it, whatever order they joined the group in.
fn until_each_holds_a_partition(input: &str, replicas: &[Replica]) {
    let read_input = |replica: &Replica| {
        replica.progress_lines().iter().any(|p| {
            p["numInputRows"].as_u64().unwrap_or(0) > 0
                && p["sources"][0]["description"]
                    .as_str()
                    .is_some_and(|d| d.contains(input))
        })
    };
    // Waits on the event itself (each instance's progress shows rows of
    // `input`), with a deadline sized for a loaded 2-core machine: the
    // second instance's join, the group's rebalance and both stages'
    // restores can take tens of seconds there.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while !replicas.iter().all(read_input) {
        assert!(
            std::time::Instant::now() < deadline,
            "an instance never got input: read {:?}; last progress {:?}",
            replicas.iter().map(read_input).collect::<Vec<_>>(),
            replicas
                .iter()
                .map(|r| r.progress_lines().last().cloned())
                .collect::<Vec<_>>()
        );
        produce_to(input, Some(0), &rows("w0", &["09:00"]));
        produce_to(input, Some(1), &rows("w1", &["09:00"]));
        std::thread::sleep(Duration::from_secs(2));
    }
}

#[test]
fn two_instances_one_partition_each_share_the_query_wide_watermark_through_kafka() {
    let (input, output, app) = (unique("wsx-in"), unique("wsx-out"), unique("wsx-app"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut replicas: Vec<Replica> = dirs
        .iter()
        .enumerate()
        .map(|(i, dir)| {
            let file = dir.path().join("pipeline.yaml");
            std::fs::write(&file, pipeline(&app, &input, &output, "query")).unwrap();
            start_replica_as(&file, Some(&format!("i{i}")))
        })
        .collect();
    until_each_holds_a_partition(&input, &replicas);
    a_runs_ahead(&input);
    // a's first three windows and w0's close on partition 0's watermark,
    // 10:15; w1's closes only when the instance holding partition 1 has
    // read partition 0's progress from the exchange.
    wait_for_records(&output, 5);
    b_lags_then_both_move_on(&input);
    wait_for_records(&output, 8);
    std::thread::sleep(Duration::from_secs(2));
    for replica in &mut replicas {
        interrupt(&mut replica.child);
    }
    let out = emitted(&output, 8);
    let expected = windows(&[
        ("a", "10:00", 5),
        ("a", "10:05", 5),
        ("a", "10:10", 5),
        ("a", "10:15", 5),
        ("a", "10:20", 1),
        ("b", "10:30", 1),
    ]);
    assert_eq!(
        out, expected,
        "Spark: one watermark over both instances' partitions; b's 10:01 and 10:02 are late"
    );
}

/// The rows the window dropped as late over every report of `progress`.
fn rows_dropped_by_watermark(progress: &[serde_json::Value]) -> u64 {
    progress
        .iter()
        .map(|p| {
            p["stateOperators"][0]["numRowsDroppedByWatermark"]
                .as_u64()
                .unwrap_or(0)
        })
        .sum()
}

/// How the instance that went down comes back.
#[derive(Clone, Copy, PartialEq)]
enum Comeback {
    /// Restarted within its session timeout: its partition waits for it.
    Restart,
    /// Never: after its session timeout its partition moves to the other.
    Failover,
}

/// Writes an hour of rows a minute at a time to both partitions (key `a`
/// to 0, `b` to 1, minute `m` stamped `base + m` ms as Kafka's record
/// timestamp: they arrive in step), then a row of 11:30 each.
fn an_hour_on_both_partitions(input: &str) {
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let producer: ThreadedProducer<DefaultProducerContext> = plain().create().unwrap();
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let minutes = (0..60)
        .map(|m| format!("10:{m:02}"))
        .chain(["11:30".to_string()]);
    for (i, minute) in minutes.enumerate() {
        for (partition, id) in [(0, "a"), (1, "b")] {
            let (key, value) = rows(id, &[&minute]).remove(0);
            let record = BaseRecord::to(input)
                .partition(partition)
                .key(&key)
                .payload(&value)
                .timestamp(base + i as i64);
            producer.send(record).map_err(|(e, _)| e).unwrap();
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Two instances' pipeline files (query scope, five records a batch, the
/// session timeout `session_ms`), in directories kept while the returned
/// guards live. `through_repartition`: the input is keyed by a column
/// (`site`) that is not the grouping's, so the window runs behind a
/// repartition topic.
fn pipeline_files(
    app: &str,
    input: &str,
    output: &str,
    session_ms: u64,
    through_repartition: bool,
) -> (Vec<tempfile::TempDir>, Vec<std::path::PathBuf>) {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let files = dirs
        .iter()
        .map(|dir| {
            let file = dir.path().join("pipeline.yaml");
            let source_properties = format!(
                "  properties: {{session.timeout.ms: \"{session_ms}\", heartbeat.interval.ms: \"1000\"}}\n"
            );
            let mut yaml = pipeline(app, input, output, "query")
                .replace("watermark_scope: query\n", "watermark_scope: query\nmax_records_per_batch: 5\n")
                .replace("  format: json\n", &format!("  format: json\n{source_properties}"));
            if through_repartition {
                yaml = yaml
                    .replace("keyed_by: [id]", "keyed_by: [site]")
                    .replace("id: string}", "id: string, site: string}");
            }
            std::fs::write(&file, yaml).unwrap();
            file
        })
        .collect();
    (dirs, files)
}

/// Spark's single driver reads a backlog after downtime as one: a row meets
/// the event times of rows that arrived before it, whichever partition
/// they are in. Two instances (static members, one partition each, five
/// records a batch), the second stopped; both partitions then receive an
/// hour of rows. The running instance reads its partition and publishes
/// 11:30 to the exchange. The stopped one's partition is read later —
/// by itself restarted, or by the other after a failover — and whoever
/// reads it counts the other partition's progress only as far as it has
/// read its own: none of its rows falls behind a watermark made of rows
/// that arrived after them.
///
/// `through_repartition`: the input is keyed by a column (`site`) that is
/// not the grouping's, so the window runs behind a repartition topic. The
/// writer that reads the stopped instance's partition is then the one
/// that counts the other's progress only as far as it has read, and the
/// readers' watermark waits for its markers.
fn backlog_read_after_downtime(comeback: Comeback, through_repartition: bool) {
    let (input, output, app) = (unique("wsd-in"), unique("wsd-out"), unique("wsd-app"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let session_ms = if comeback == Comeback::Restart {
        30_000
    } else {
        6_000
    };
    let (_dirs, files) = pipeline_files(&app, &input, &output, session_ms, through_repartition);
    let start = |i: usize| start_replica_as(&files[i], Some(&format!("d{i}")));
    let mut replicas = vec![start(0), start(1)];
    until_each_holds_a_partition(&input, &replicas);
    interrupt(&mut replicas[1].child);
    an_hour_on_both_partitions(&input);
    if comeback == Comeback::Restart {
        if through_repartition {
            // The readers' watermark waits for the stopped writer: nothing
            // closes. Its partner has read its hour (13 batches) meanwhile.
            std::thread::sleep(Duration::from_secs(10));
        } else {
            // The running instance's watermark, 11:25, closes a's windows
            // and w0's: its progress is in the exchange.
            wait_for_records(&output, 13);
            std::thread::sleep(Duration::from_secs(1));
        }
        replicas[1] = start(1);
    }
    wait_for_records(&output, 26);
    std::thread::sleep(Duration::from_secs(2));
    interrupt(&mut replicas[0].child);
    if comeback == Comeback::Restart {
        interrupt(&mut replicas[1].child);
    }
    let expected: Vec<(String, String, i64)> = ["a", "b"]
        .into_iter()
        .flat_map(|id| {
            (0..60)
                .step_by(5)
                .map(move |m| (id.to_string(), format!("10:{m:02}"), 5))
        })
        .collect();
    assert_eq!(
        emitted(&output, 26),
        expected,
        "every row of both partitions counted"
    );
    let late: u64 = replicas
        .iter()
        .map(|r| rows_dropped_by_watermark(&r.progress_lines()))
        .sum();
    assert_eq!(late, 0, "no row of the backlog late");
}

#[test]
fn an_instance_restarted_after_downtime_reads_its_backlog_without_the_others_progress_dropping_it()
{
    backlog_read_after_downtime(Comeback::Restart, false);
}

#[test]
fn a_partition_failed_over_with_a_backlog_is_read_without_the_running_tasks_watermark_dropping_it()
{
    backlog_read_after_downtime(Comeback::Failover, false);
}

#[test]
fn behind_a_repartition_a_restarted_writers_backlog_holds_the_readers_watermark_until_written() {
    backlog_read_after_downtime(Comeback::Restart, true);
}

#[test]
fn behind_a_repartition_a_failed_over_writers_backlog_holds_the_readers_watermark_until_written() {
    backlog_read_after_downtime(Comeback::Failover, true);
}

/// Partition 0 holds two rows a minute (key `k0`), partitions 1 to 3 one
/// (`k1`..`k3`), minutes 0 to 49, all written before the query starts.
/// Batches of at most 25 records share the limit by backlog, as Spark's
/// `maxOffsetsPerTrigger` does (10 records of partition 0, 5 of each
/// other): every batch moves every partition five minutes on, and the
/// watermark, the largest event time less 3 minutes, never passes a row
/// not read yet. Read a poll at a time instead, a batch would hold
/// partition 0's first 25 rows alone and the others' would all be late.
#[test]
fn the_default_scope_reads_a_backlog_on_several_partitions_batch_by_planned_offsets() {
    let (input, output, app) = (unique("wsb-in"), unique("wsb-out"), unique("wsb-app"));
    create_topic(&input, 4);
    create_topic(&output, 1);
    for partition in 0..4 {
        let per_minute = if partition == 0 { 2 } else { 1 };
        let minutes: Vec<String> = (0..50)
            .flat_map(|m| std::iter::repeat_n(format!("10:{m:02}"), per_minute))
            .collect();
        let minutes: Vec<&str> = minutes.iter().map(String::as_str).collect();
        produce_to(
            &input,
            Some(partition),
            &rows(&format!("k{partition}"), &minutes),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let yaml = pipeline(&app, &input, &output, "query")
        .replace("watermark_scope: query\n", "max_records_per_batch: 25\n")
        .replace("watermark: 5 minutes", "watermark: 3 minutes")
        .replace("tumbling: 5 minutes", "tumbling: 10 minutes");
    std::fs::write(&file, yaml).unwrap();
    let mut replica = start_replica(&file);
    // The watermark ends at 10:46: the windows up to 10:40 close.
    wait_for_records(&output, 16);
    std::thread::sleep(Duration::from_secs(2));
    interrupt(&mut replica.child);
    let mut expected = Vec::new();
    for key in ["k0", "k1", "k2", "k3"] {
        for start in ["10:00", "10:10", "10:20", "10:30"] {
            expected.push((key, start, if key == "k0" { 20 } else { 10 }));
        }
    }
    assert_eq!(
        emitted(&output, 16),
        windows(&expected),
        "every row counted: no partition fell behind the watermark"
    );
    let progress = &replica.progress_lines();
    assert_eq!(rows_dropped_by_watermark(progress), 0, "no row late");
    let sizes: Vec<u64> = progress
        .iter()
        .map(|p| p["numInputRows"].as_u64().unwrap_or(0))
        .filter(|n| *n > 0)
        .collect();
    assert!(
        sizes.iter().all(|n| *n <= 25) && sizes.len() >= 10,
        "batches of at most 25 records: {sizes:?}"
    );
}

/// Behind a repartition the readers' watermark is the smallest of the
/// writers' reports, so a writer whose partition has gone silent must keep
/// reporting the stream's progress it counts from the other instance:
/// partition 1 sends nothing after the warm-up while partition 0 gets an
/// hour, and every one of its windows closes.
#[test]
fn behind_a_repartition_a_writer_with_a_silent_partition_keeps_the_readers_watermark_moving() {
    let (input, output, app) = (unique("wss-in"), unique("wss-out"), unique("wss-app"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let (_dirs, files) = pipeline_files(&app, &input, &output, 30_000, true);
    let mut replicas: Vec<Replica> = (0..2)
        .map(|i| start_replica_as(&files[i], Some(&format!("s{i}"))))
        .collect();
    until_each_holds_a_partition(&input, &replicas);
    a_runs_ahead(&input);
    let more: Vec<String> = (21..60).map(|m| format!("10:{m:02}")).collect();
    let more: Vec<&str> = more.iter().map(String::as_str).collect();
    produce_to(&input, Some(0), &rows("a", &more));
    produce_to(&input, Some(0), &rows("a", &["11:30"]));
    // a's twelve windows, w0's and w1's.
    wait_for_records(&output, 14);
    std::thread::sleep(Duration::from_secs(2));
    for replica in &mut replicas {
        interrupt(&mut replica.child);
    }
    let expected: Vec<(String, String, i64)> = (0..60)
        .step_by(5)
        .map(|m| ("a".to_string(), format!("10:{m:02}"), 5))
        .collect();
    assert_eq!(emitted(&output, 14), expected);
}
