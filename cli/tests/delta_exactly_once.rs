//! A windowed pipeline from Kafka into a Delta table under `exactly_once`,
//! aborted right after the Delta commit of a batch and before its offsets
//! are committed (the worst moment for a kill -9), then restarted: the
//! table, read back by the Python `deltalake` package, holds every window
//! exactly once. The restart replays the batch over exactly its recorded
//! input and the sink skips it by its `txn` version.

mod common;

use common::*;
use std::process::Stdio;
use tidemark_integration_tests::*;

#[test]
fn abort_between_the_delta_commit_and_the_offset_commit_loses_and_duplicates_nothing() {
    let (input, group) = (unique("delta-in"), unique("delta-app"));
    create_topic(&input, 4);
    produce_seconds(&input, 4, 0, 600);
    let dir = tempfile::tempdir().unwrap();
    let file = write_direct_pipeline(dir.path(), (&group, &input, "unused"), "available_now", 200);
    use_delta_sink(&file);

    let crashed = tidemark_run(&file, None, Stdio::piped())
        .env("TIDEMARK_CRASH_AFTER_SINK_COMMIT", "3")
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&crashed.stderr);
    assert!(!crashed.status.success(), "{log}");
    assert!(
        log.contains("TIDEMARK_CRASH_AFTER_SINK_COMMIT=3: aborting"),
        "{log}"
    );
    let app = tidemark::runtime::default_query_id(&group);
    let before = read_delta(&dir.path().join("table"), Some(&app));
    assert_eq!(
        before["txn_version"], 3,
        "batch 3 is in the table: {before}"
    );

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
        log.contains("replaying a batch the sink already committed"),
        "{log}"
    );
    assert!(
        log.contains("batch already in the Delta table; skipped"),
        "{log}"
    );

    let table = read_delta(&dir.path().join("table"), Some(&app));
    assert_exact_delta_windows(&table, 4, "restarted");
}
