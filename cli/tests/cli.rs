//! The `tidemark` binary as a user runs it.

use std::path::Path;
use std::process::Command;

const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/pipelines/tumbling-count"
);

fn tidemark(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(args)
        .output()
        .expect("run tidemark")
}

fn copy_example(to: &Path) {
    std::fs::create_dir_all(to.join("batches")).unwrap();
    std::fs::copy(
        Path::new(EXAMPLE).join("pipeline.yaml"),
        to.join("pipeline.yaml"),
    )
    .unwrap();
    for f in std::fs::read_dir(Path::new(EXAMPLE).join("batches")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, to.join("batches").join(f.file_name().unwrap())).unwrap();
    }
}

#[test]
fn run_replays_the_example_as_spark_would() {
    let dir = tempfile::tempdir().unwrap();
    copy_example(dir.path());
    let file = dir.path().join("pipeline.yaml");
    let out = tidemark(&["run", "--progress", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("out.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Batch 2 runs with watermark 10:58 (11:08 - 10 min) and a late-row
    // threshold of 10:48: the 10:52 row of m2 still counts (its window ends
    // 10:55 > 10:48), then 10:50-10:55 closes. 10:55-11:00 closes in the
    // trailing no-data batch 3 (watermark 11:05).
    let expected = [
        (2, "m1", "2026-01-01T10:50:00Z", 3, 17.0),
        (2, "m2", "2026-01-01T10:50:00Z", 1, 100.0),
        (3, "m2", "2026-01-01T10:55:00Z", 1, 1.5),
    ];
    assert_eq!(rows.len(), expected.len(), "{rows:?}");
    for (row, (batch, id, start, count, total)) in rows.iter().zip(expected) {
        assert_eq!(row["batch_id"], batch, "{row}");
        assert_eq!(row["id"], id, "{row}");
        assert_eq!(row["window_start"], start, "{row}");
        assert_eq!(row["count"], count, "{row}");
        assert_eq!(row["total"], total, "{row}");
        let keys: Vec<&String> = row.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "batch_id",
                "id",
                "window_start",
                "window_end",
                "count",
                "total"
            ]
        );
    }
    let dead =
        std::fs::read_to_string(dir.path().join("tumbling-count.dead-letter.jsonl")).unwrap();
    assert_eq!(dead.lines().count(), 1);
    assert!(
        dead.contains("001.jsonl") && dead.contains("malformed JSON"),
        "{dead}"
    );
    // One progress JSON per batch on stderr with Spark's names.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let progress: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(progress.len(), 4);
    assert_eq!(
        progress[1]["eventTime"]["watermark"],
        "2026-01-01T10:48:00Z"
    );
    assert_eq!(progress[0]["numInputRows"], 4);
}

fn validate_with(from: &str, to: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    copy_example(dir.path());
    let file = dir.path().join("pipeline.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(from), "{from}");
    std::fs::write(&file, text.replacen(from, to, 1)).unwrap();
    let out = tidemark(&["validate", file.to_str().unwrap()]);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn validate_names_line_and_fix() {
    let (code, err) = validate_with(
        "multiple_watermark_policy: min",
        "multiple_watermark_polcy: min",
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(":12: error") && err.contains("unknown field") && err.contains("fix:"),
        "{err}"
    );

    let (code, err) = validate_with("amount: double", "amount: decimal");
    assert_eq!(code, 2);
    assert!(
        err.contains(":8: error") && err.contains("allowed: string, long"),
        "{err}"
    );

    let (code, err) = validate_with("watermark: 10 minutes", "watermark: 10 minuets");
    assert_eq!(code, 2);
    assert!(
        err.contains(":11: error") && err.contains("unknown unit `minuets`"),
        "{err}"
    );

    let (code, err) = validate_with("source:\n  kind: files", "sauce:\n  kind: files");
    assert_eq!(code, 2);
    assert!(err.contains("unknown field `sauce`"), "{err}");

    let (code, err) = validate_with("trigger: available_now", "trigger: {micro_batch: 1 month}");
    assert_eq!(code, 2);
    assert!(err.contains("months and years"), "{err}");

    let ok = tidemark(&["validate", &format!("{EXAMPLE}/pipeline.yaml")]);
    assert!(ok.status.success());
}

#[test]
fn describe_prints_the_operator_graph() {
    let out = tidemark(&["describe", &format!("{EXAMPLE}/pipeline.yaml")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains("EventTimeWatermark [event_time, delay 10 minutes"),
        "{text}"
    );
    assert!(
        text.contains("Filter [amount >= 0]") && text.contains("tumbling 5 minutes"),
        "{text}"
    );
    assert!(
        text.starts_with("Topologies:\n   Sub-topology: 0\n"),
        "{text}"
    );
    assert_eq!(text.matches("Sub-topology:").count(), 1, "{text}");
}

/// Grouping a Kafka input by a column that is not its record key splits
/// the topology at a repartition topic, as Kafka Streams splits it: the
/// description names both sub-topologies, the topic between them, and the
/// window's store with its changelog topic.
#[test]
fn describe_splits_a_regrouped_pipeline_at_its_repartition_topic() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        r#"name: by-region
source:
  kind: kafka
  topic: events
  format: json
  schema: {event_time: long, region: string, amount: double}
event_time: event_time
watermark: 30 seconds
steps:
  - filter: "amount > 0"
  - window_aggregate:
      keys: [region]
      window: {tumbling: 1 minute}
      aggregates: [{fn: count, as: n}]
output_mode: append
sink: {kind: kafka, topic: totals, format: json}
state_dir: state
"#,
    )
    .unwrap();
    let out = tidemark(&["describe", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let subs: Vec<&str> = text.split("   Sub-topology: ").skip(1).collect();
    assert_eq!(subs.len(), 2, "{text}");
    assert!(
        subs[0].starts_with("0\n    Source: (topics: [events])"),
        "{text}"
    );
    assert!(subs[0].contains("Filter [amount > 0]"), "{text}");
    assert!(
        subs[0].contains("Sink: (topic: by-region-op1-repartition) keyed by [region]"),
        "{text}"
    );
    assert!(
        subs[1].starts_with("1\n    Source: (topics: [by-region-op1-repartition])"),
        "{text}"
    );
    assert!(
        subs[1].contains("(stores: [op0 (RocksDB, changelog: by-region-op0-changelog)])"),
        "{text}"
    );
    assert!(subs[1].contains("Sink: Kafka totals"), "{text}");
    assert!(
        text.contains(
            "Watermark: query-wide (Spark's), writers' progress exchanged on topic \
             by-region-watermarks and carried to the readers by the repartition topic's markers"
        ),
        "{text}"
    );
}

/// Beside the topology, `describe` says how the watermark is shared
/// between instances and what the query serves over HTTP.
#[test]
fn describe_names_the_watermark_exchange_and_the_services() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let pipeline = |scope: &str| {
        format!(
            r#"name: totals-app
source: {{kind: kafka, topic: events, format: json,
          schema: {{event_time: long, id: string, amount: double}}}}
event_time: event_time
watermark: 30 seconds
watermark_scope: {scope}
steps:
  - filter: "amount > 0"
sink: {{kind: kafka, topic: totals, format: json}}
state_dir: state
serve: {{listen: "127.0.0.1:7070", advertised: "host-a:7070"}}
ui: {{listen: "127.0.0.1:4040"}}
metrics: {{prometheus: "127.0.0.1:9000"}}
"#
        )
    };
    let describe = |scope: &str| {
        std::fs::write(&file, pipeline(scope)).unwrap();
        let out = tidemark(&["describe", file.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let query = describe("query");
    assert!(
        query.contains("Watermark: query-wide (Spark's), partitions' progress exchanged on topic totals-app-watermarks"),
        "{query}"
    );
    assert!(
        query.contains(
            "Serves:\n  interactive queries on 127.0.0.1:7070 (advertised as host-a:7070)\n  \
             web page on http://127.0.0.1:4040/\n  Prometheus metrics on 127.0.0.1:9000\n"
        ),
        "{query}"
    );
    let partition = describe("partition");
    assert!(
        partition.contains("Watermark: per input partition, not shared"),
        "{partition}"
    );
}

#[test]
fn micro_batch_run_serves_prometheus_metrics_and_stops_on_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    copy_example(dir.path());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = dir.path().join("pipeline.yaml");
    let text = std::fs::read_to_string(&file).unwrap().replace(
        "trigger: available_now",
        "trigger: {micro_batch: 100 milliseconds}",
    ) + &format!("metrics: {{prometheus: \"127.0.0.1:{port}\"}}\n");
    std::fs::write(&file, text).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", file.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut metrics = String::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline && !metrics.contains("tidemark_input_rows_total") {
        std::thread::sleep(std::time::Duration::from_millis(200));
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.write_all(
                b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
            );
            metrics.clear();
            let _ = s.read_to_string(&mut metrics);
        }
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = metrics
        .lines()
        .find(|l| l.starts_with("tidemark_input_rows_total"))
        .unwrap_or_else(|| panic!("no input counter in:\n{metrics}"));
    assert!(line.ends_with(" 10"), "all 10 records counted: {line}");
    assert!(metrics.contains("tidemark_bad_records_total"), "{metrics}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("stopping after the current batch"));
}

#[test]
fn the_join_example_runs_and_describes_both_streams() {
    let example = Path::new(EXAMPLE).with_file_name("ad-clicks");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        example.join("pipeline.yaml"),
        dir.path().join("pipeline.yaml"),
    )
    .unwrap();
    for stream in ["impressions", "clicks"] {
        let to = dir.path().join("batches").join(stream);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(example.join("batches").join(stream)).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, to.join(f.file_name().unwrap())).unwrap();
        }
    }
    let file = dir.path().join("pipeline.yaml");
    let described = tidemark(&["describe", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(
        text.contains("StreamingSymmetricHashJoin LeftOuter"),
        "{text}"
    );
    let out = tidemark(&["run", "--progress", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    // Five clicked impressions, two written with null clicks (a4, a6).
    assert_eq!(rows.lines().count(), 7, "{rows}");
    assert_eq!(rows.matches(r#""clickTime":null"#).count(), 2, "{rows}");
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(progress.contains(r#""streamWatermarks""#), "{progress}");
}

#[test]
fn a_global_table_pipeline_describes_without_a_broker() {
    let file = Path::new(EXAMPLE)
        .join("../../../tests/conformance/global-table-join-orders-customers/pipeline.yaml");
    let described = tidemark(&["describe", file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.status.success(),
        "{}",
        String::from_utf8_lossy(&described.stderr)
    );
    assert!(text.contains("StreamTableJoin Inner"), "{text}");
}
