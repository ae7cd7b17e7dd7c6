//! A batch aborted at each step of the commit protocol (a test hook,
//! `TIDEMARK_FAIL_COMMIT=<step>:<batch id>`, fails the step once as a
//! fenced transaction or a rebalance would) is replayed with the same batch
//! id over exactly the input it had, and the output — Kafka read with
//! `read_committed`, a Delta table read back by the Python `deltalake`
//! package — holds every window exactly once.

mod common;

use common::*;
use std::process::Stdio;
use std::time::Duration;
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 4;
const FAILED_BATCH: u64 = 2;
const STEPS: [&str; 3] = [
    "before_sink_commit",
    "after_sink_commit",
    "after_offsets_added",
];

/// Runs `file` to the end with batch [`FAILED_BATCH`] failing at `step`;
/// checks the abort was replayed over exactly the aborted input with the
/// same id; returns the log.
fn run_with_failure(file: &std::path::Path, step: &str) -> String {
    let run = tidemark_run(file, None, Stdio::piped())
        .env("TIDEMARK_FAIL_COMMIT", format!("{step}:{FAILED_BATCH}"))
        .env(
            "RUST_LOG",
            "warn,tidemark_delta=info,tidemark_kafka=info,tidemark_connectors=info",
        )
        .spawn()
        .unwrap();
    let pid = run.id();
    let done = run.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&done.stderr).to_string();
    if let Ok(dir) = std::env::var("TIDEMARK_TEST_LOG_DIR") {
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(
            std::path::Path::new(&dir).join(format!("{step}-{pid}.log")),
            &log,
        );
    }
    assert!(done.status.success(), "{step}: {log}");
    assert!(
        log.contains(&format!("TIDEMARK_FAIL_COMMIT={step}")),
        "{step}: no failure injected: {log}"
    );
    let aborted = log
        .lines()
        .find(|l| l.contains("batch aborted"))
        .unwrap_or_else(|| panic!("{step}: no abort: {log}"));
    assert!(aborted.contains("replay_bounded=true"), "{aborted}");
    let end = aborted
        .split("end_offsets=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("no end offsets in {aborted}"));
    let aborted_end: serde_json::Value = serde_json::from_str(end).unwrap();

    let progress: Vec<serde_json::Value> = log
        .lines()
        .filter(|l| l.starts_with("{\"id\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<u64> = progress
        .iter()
        .map(|p| p["batchId"].as_u64().unwrap())
        .collect();
    let expected_ids: Vec<u64> = (0..ids.len() as u64).collect();
    assert_eq!(
        ids, expected_ids,
        "{step}: one report per batch id, none skipped"
    );
    let replayed = progress
        .iter()
        .find(|p| p["batchId"] == FAILED_BATCH)
        .unwrap();
    assert_eq!(
        replayed["sources"][0]["endOffset"], aborted_end,
        "{step}: the replay ends where the aborted batch did"
    );
    log
}

#[test]
fn a_batch_aborted_at_any_commit_step_is_replayed_exactly_into_kafka() {
    let input = unique("abort-in");
    create_topic(&input, PARTITIONS);
    produce_seconds(&input, PARTITIONS, 0, 600);
    for step in STEPS {
        let (group, output) = (unique("abort-app"), unique("abort-out"));
        create_topic(&output, 1);
        let dir = tempfile::tempdir().unwrap();
        let names = (group.as_str(), input.as_str(), output.as_str());
        let file = write_direct_pipeline(dir.path(), names, "available_now", 200);
        run_with_failure(&file, step);
        assert_exact_windows(
            &consume_all(&output, expected_rows(PARTITIONS), Duration::from_secs(30)),
            PARTITIONS,
        );
    }
}

#[test]
fn a_batch_aborted_at_any_commit_step_is_replayed_exactly_into_delta() {
    let input = unique("abort-delta-in");
    create_topic(&input, PARTITIONS);
    produce_seconds(&input, PARTITIONS, 0, 600);
    for step in STEPS {
        let group = unique("abort-delta-app");
        let dir = tempfile::tempdir().unwrap();
        let names = (group.as_str(), input.as_str(), "unused");
        let file = write_direct_pipeline(dir.path(), names, "available_now", 200);
        use_delta_sink(&file);
        run_with_failure(&file, step);
        let table = read_delta(&dir.path().join("table"), None);
        assert_exact_delta_windows(&table, PARTITIONS, step);
    }
}
