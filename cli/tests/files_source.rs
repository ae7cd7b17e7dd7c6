//! The files source as a real source: a checkpoint remembers which files
//! were read, so a rerun on an unchanged directory writes nothing; a crash
//! between the sink's commit and the source's record replays exactly that
//! batch, on the state it first ran on, and the sink (Delta's `txn`, the
//! Kafka sink's progress record under `exactly_once`) skips its output;
//! files landing while a micro-batch query runs are picked up in order, and
//! a file still being written is not read half-way.

mod common;

use common::*;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tidemark_integration_tests::*;

/// Writes 10 minutes of events (one a second, keys `p0-0..4`, amount 1.5)
/// into `dir/in` as files of `per_file` seconds each: the 1-minute windows
/// of [`assert_exact_delta_windows`] span several files.
fn write_event_files(dir: &Path, per_file: i64) {
    let input = dir.join("in");
    std::fs::create_dir_all(&input).unwrap();
    for (n, from) in (0..600).step_by(per_file as usize).enumerate() {
        std::fs::write(
            input.join(format!("{n:03}.jsonl")),
            event_lines(from, from + per_file),
        )
        .unwrap();
    }
}

/// Events of seconds `from..to` after 10:00:00, as JSON lines.
fn event_lines(from: i64, to: i64) -> String {
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    (from..to)
        .map(|i| {
            let t = tidemark::time::format_rfc3339(start + i * 1_000_000);
            format!(
                "{{\"event_time\": \"{t}\", \"id\": \"p0-{}\", \"amount\": 1.5}}\n",
                i % KEYS
            )
        })
        .collect()
}

/// The windowed pipeline of `common` over the files in `in/`, with state
/// (and so the source's checkpoint) under `state/`, writing to `sink`.
fn files_pipeline(dir: &Path, sink: &str, extra: &str) -> std::path::PathBuf {
    let file = dir.join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            r#"name: {name}
source:
  kind: files
  path: in
  schema: {{event_time: timestamp, id: string, amount: double}}
event_time: event_time
watermark: 30 seconds
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}, {{fn: sum, column: amount, as: total}}]
output_mode: append
trigger: available_now
sink: {sink}
state_dir: state
{extra}"#,
            name = unique("files-app")
        ),
    )
    .unwrap();
    file
}

fn run(file: &Path, crash_after_sink_commit: Option<u64>) -> (bool, String) {
    let mut command = tidemark_run(file, None, Stdio::piped());
    command.env("RUST_LOG", "warn,tidemark=info,tidemark_connectors=info");
    if let Some(batch) = crash_after_sink_commit {
        command.env("TIDEMARK_CRASH_AFTER_SINK_COMMIT", batch.to_string());
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_rerun_on_an_unchanged_directory_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_event_files(dir.path(), 40);
    let file = files_pipeline(dir.path(), "{kind: delta, path: table}", "");
    let (ok, log) = run(&file, None);
    assert!(ok, "{log}");
    let first = read_delta(&dir.path().join("table"), None);
    assert_exact_delta_windows(&first, 1, "first run");

    let (ok, log) = run(&file, None);
    assert!(ok, "{log}");
    let second = read_delta(&dir.path().join("table"), None);
    assert_exact_delta_windows(&second, 1, "rerun");
    assert_eq!(
        first["version"], second["version"],
        "the rerun committed nothing: {log}"
    );

    // A file landing between runs is read by the next run, and only it:
    // its events close the next window, on the state the first run left.
    std::fs::write(dir.path().join("in/015.jsonl"), event_lines(600, 660)).unwrap();
    let (ok, log) = run(&file, None);
    assert!(ok, "{log}");
    let third = read_delta(&dir.path().join("table"), None);
    let rows = third["rows"].as_array().unwrap();
    assert_eq!(rows.len(), expected_rows(1) + KEYS as usize, "{log}");
    assert!(rows.iter().all(|r| r["n"] == 12), "{rows:?}");
}

#[test]
fn a_crash_between_the_delta_commit_and_the_files_record_leaves_every_window_once() {
    let dir = tempfile::tempdir().unwrap();
    write_event_files(dir.path(), 40);
    let file = files_pipeline(dir.path(), "{kind: delta, path: table}", "");
    for batch in [4, 9] {
        let (ok, log) = run(&file, Some(batch));
        assert!(!ok, "{log}");
        assert!(
            log.contains(&format!(
                "TIDEMARK_CRASH_AFTER_SINK_COMMIT={batch}: aborting"
            )),
            "{log}"
        );
    }
    let (ok, log) = run(&file, None);
    assert!(ok, "{log}");
    assert!(
        log.contains("replaying a batch the sink already committed"),
        "{log}"
    );
    let table = read_delta(&dir.path().join("table"), None);
    assert_exact_delta_windows(&table, 1, "after two crashes");
}

#[test]
fn a_crash_between_the_kafka_transaction_and_the_files_record_leaves_every_window_once() {
    let dir = tempfile::tempdir().unwrap();
    write_event_files(dir.path(), 40);
    let output = unique("files-out");
    create_topic(&output, 1);
    let sink = format!("{{kind: kafka, topic: {output}, key: [id]}}");
    let file = files_pipeline(dir.path(), &sink, "processing_guarantee: exactly_once\n");
    let (ok, log) = run(&file, Some(6));
    assert!(!ok, "{log}");
    assert!(
        log.contains("TIDEMARK_CRASH_AFTER_SINK_COMMIT=6: aborting"),
        "{log}"
    );
    let (ok, log) = run(&file, None);
    assert!(ok, "{log}");
    assert!(
        log.contains("replaying a batch the sink already committed"),
        "{log}"
    );
    let out = consume_all(&output, expected_rows(1), Duration::from_secs(30));
    assert_exact_windows(&out, 1);
}

/// A stateless micro-batch pipeline copying `in/` to `out.jsonl`, a file
/// per batch, waiting two seconds for a file written in place to settle.
fn landing_pipeline(dir: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("in")).unwrap();
    let file = dir.join("landing.yaml");
    std::fs::write(
        &file,
        r#"name: landing
source: {kind: files, path: in, checkpoint: progress, settle_delay: 2 seconds,
         pattern: "*.jsonl", schema: {event_time: timestamp, id: string, amount: double}}
steps:
  - filter: "amount > 0"
trigger: {micro_batch: 200 milliseconds}
sink: {kind: jsonl, path: out.jsonl}
"#,
    )
    .unwrap();
    file
}

/// The output's rows as (batch id, event second), in file order.
fn landed(dir: &Path) -> Vec<(u64, i64)> {
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    std::fs::read_to_string(dir.join("out.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let t = tidemark::time::parse_rfc3339(v["event_time"].as_str().unwrap()).unwrap();
            (v["batch_id"].as_u64().unwrap(), (t - start) / 1_000_000)
        })
        .collect()
}

fn wait_for_rows(dir: &Path, rows: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while landed(dir).len() < rows && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn files_landing_while_the_query_runs_are_read_in_order_and_never_half_way() {
    let dir = tempfile::tempdir().unwrap();
    let file = landing_pipeline(dir.path());
    let mut child = tidemark_run(&file, None, Stdio::null()).spawn().unwrap();
    let input = dir.path().join("in");

    // The landing pattern: written under a temporary name, renamed into place.
    for n in 0..3 {
        let temporary = input.join(format!(".{n}.jsonl.tmp"));
        std::fs::write(&temporary, event_lines(n * 10, n * 10 + 10)).unwrap();
        std::fs::rename(&temporary, input.join(format!("{n}.jsonl"))).unwrap();
        wait_for_rows(dir.path(), (n as usize + 1) * 10);
    }
    // Written in place, in two halves a second apart: within the settle
    // delay, so the file is left alone until it is whole.
    let in_place = input.join("3.jsonl");
    std::fs::write(&in_place, event_lines(30, 35)).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let mut whole = event_lines(30, 35);
    whole.push_str(&event_lines(35, 40));
    std::fs::write(&in_place, whole).unwrap();
    // Not matching the pattern: never read.
    std::fs::write(input.join("notes.txt"), event_lines(99, 100)).unwrap();
    wait_for_rows(dir.path(), 40);
    std::thread::sleep(Duration::from_secs(3));
    assert!(interrupt(&mut child).success());

    let rows = landed(dir.path());
    let seconds: Vec<i64> = rows.iter().map(|(_, s)| *s).collect();
    assert_eq!(
        seconds,
        (0..40).collect::<Vec<_>>(),
        "every row once, in landing order"
    );
    let batches: std::collections::BTreeSet<u64> = rows.iter().map(|(b, _)| *b).collect();
    assert_eq!(batches.len(), 4, "one batch per file: {rows:?}");
    let per_file: Vec<u64> = rows.chunks(10).map(|c| c[0].0).collect();
    assert!(
        rows.chunks(10).all(|c| c.iter().all(|(b, _)| *b == c[0].0)),
        "a file read in one batch: {rows:?}"
    );
    assert!(per_file.windows(2).all(|w| w[0] < w[1]), "{per_file:?}");

    // A restart goes on from the checkpoint: the next file only.
    let mut child = tidemark_run(&file, None, Stdio::null()).spawn().unwrap();
    std::fs::write(input.join("4.jsonl"), event_lines(40, 50)).unwrap();
    wait_for_rows(dir.path(), 50);
    std::thread::sleep(Duration::from_secs(3));
    assert!(interrupt(&mut child).success());
    let rows = landed(dir.path());
    assert_eq!(rows.len(), 50, "{rows:?}");
    assert!(
        rows[40].0 > per_file[3],
        "batch ids go on after a restart: {rows:?}"
    );
}
