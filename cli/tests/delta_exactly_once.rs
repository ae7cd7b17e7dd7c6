//! A windowed pipeline from Kafka into a Delta table under `exactly_once`,
//! killed (abort) at the worst moment for a Delta sink: after a batch's
//! offsets committed, with its per-partition Delta commit staged but not
//! yet published. The restart finds the staged commit named in each
//! partition's checkpoint and publishes it before anything else; the table,
//! read back by the Python `deltalake` package, holds every window exactly
//! once.

mod common;

use common::*;
use std::process::Stdio;
use tidemark_integration_tests::*;

#[test]
fn a_crash_between_the_offset_commit_and_the_delta_commit_loses_and_duplicates_nothing() {
    let (input, group) = (unique("delta-in"), unique("delta-app"));
    create_topic(&input, 4);
    produce_seconds(&input, 4, 0, 600);
    let dir = tempfile::tempdir().unwrap();
    let file = write_direct_pipeline(dir.path(), (&group, &input, "unused"), "available_now", 200);
    use_delta_sink(&file);

    let crashed = tidemark_run(&file, None, Stdio::piped())
        .env("TIDEMARK_CRASH_AFTER_SOURCE_COMMIT", "3")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&crashed.stderr);
    assert!(!crashed.status.success(), "{log}");
    assert!(
        log.contains("TIDEMARK_CRASH_AFTER_SOURCE_COMMIT=3: aborting"),
        "{log}"
    );
    let before = read_delta(&dir.path().join("table"), None);
    let rows_before = before["rows"].as_array().unwrap().len();

    let done = tidemark_run(&file, None, Stdio::piped())
        .env(
            "RUST_LOG",
            "warn,tidemark=info,tidemark_connectors=info,tidemark_delta=info,tidemark_kafka=info",
        )
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{log}");
    assert!(
        log.contains("publishing a commit staged before a stop"),
        "batch 3's staged rows ({rows_before} rows before the restart): {log}"
    );

    let table = read_delta(&dir.path().join("table"), None);
    assert_exact_delta_windows(&table, 4, "restarted");
}
