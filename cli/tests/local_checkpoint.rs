//! Local state across restarts. A cleanly stopped run (and a running one,
//! a few seconds after a commit that left nothing written since) leaves a
//! `.checkpoint` file per task recording the changelog offsets its RocksDB
//! files match, and the next run replays only the changelog records after
//! them. A run whose state directory was deleted in between restores
//! everything from the changelog; both give the exact expected windows.

mod common;

use common::*;
use std::process::Stdio;
use std::time::Duration;
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 2;

/// Runs the pipeline to the end of its input; returns its stderr.
fn run_to_end(file: &std::path::Path) -> String {
    let done = tidemark_run(file, None, Stdio::piped())
        .env("RUST_LOG", "tidemark_kafka=info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr).to_string();
    assert!(done.status.success(), "{stderr}");
    stderr
}

/// Runs the pipeline to the end and checks that every task started from
/// its local files and the output holds the exact windows.
fn run_from_local_files_to_end(file: &std::path::Path, output: &str) {
    let log = run_to_end(file);
    assert_eq!(
        log.matches("from_local_checkpoint=").count(),
        PARTITIONS as usize,
        "{log}"
    );
    assert_exact_windows(
        &consume_all(output, expected_rows(PARTITIONS), Duration::from_secs(30)),
        PARTITIONS,
    );
}

fn checkpoint_files(dir: &std::path::Path, app: &str) -> Vec<serde_json::Value> {
    (0..PARTITIONS)
        .filter_map(|p| {
            let file = dir
                .join("state")
                .join(app)
                .join(p.to_string())
                .join(".checkpoint");
            let text = std::fs::read_to_string(file).ok()?;
            let written: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(written["v"], 1, "the encoding version: {written}");
            Some(written["stores"].clone())
        })
        .collect()
}

#[test]
fn a_clean_stop_restores_from_local_files_and_a_lost_directory_from_the_changelog() {
    let input = unique("local-in");
    create_topic(&input, PARTITIONS);
    produce_seconds(&input, PARTITIONS, 0, 300);
    let runs: Vec<(String, String, tempfile::TempDir)> = (0..2)
        .map(|_| {
            let (app, output) = (unique("local-app"), unique("local-out"));
            create_topic(&output, 1);
            (app, output, tempfile::tempdir().unwrap())
        })
        .collect();
    for (app, output, dir) in &runs {
        let file = write_direct_pipeline(dir.path(), (app, &input, output), "available_now", 100);
        run_to_end(&file);
        let checkpoints = checkpoint_files(dir.path(), app);
        assert_eq!(checkpoints.len(), PARTITIONS as usize, "{checkpoints:?}");
        for c in &checkpoints {
            assert!(c["op0"].as_i64().unwrap() > 0, "{c}");
        }
    }
    produce_seconds(&input, PARTITIONS, 300, 600);

    // Kept: the second run starts from its local files.
    let (app, output, dir) = &runs[0];
    let file = dir.path().join("pipeline.yaml");
    run_from_local_files_to_end(&file, output);
    assert_eq!(checkpoint_files(dir.path(), app).len(), PARTITIONS as usize);

    // Lost: the whole state directory goes; the changelog has it all.
    let (_, output, dir) = &runs[1];
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    let log = run_to_end(&dir.path().join("pipeline.yaml"));
    assert_eq!(log.matches("from_local_checkpoint=").count(), 0, "{log}");
    assert!(log.contains("state restored from changelog"), "{log}");
    assert_exact_windows(
        &consume_all(output, expected_rows(PARTITIONS), Duration::from_secs(30)),
        PARTITIONS,
    );
}

/// A running task writes its checkpoint a few seconds after a commit that
/// left nothing written since, and removes it before its next write: a run
/// killed (SIGKILL) while idle restarts from its local files, replaying
/// only the changelog's tail, with the exact windows. Before, only a clean
/// stop left a checkpoint, and every crash or error restart replayed each
/// changelog whole.
#[test]
fn a_killed_run_restarts_from_the_checkpoint_written_after_its_last_commit() {
    let input = unique("local-kill-in");
    create_topic(&input, PARTITIONS);
    produce_seconds(&input, PARTITIONS, 0, 300);
    let (app, output) = (unique("local-kill-app"), unique("local-kill-out"));
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let names = (app.as_str(), input.as_str(), output.as_str());
    let file = write_direct_pipeline(dir.path(), names, "{micro_batch: 200 milliseconds}", 100);
    let mut running = tidemark_run(&file, None, Stdio::null()).spawn().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while checkpoint_files(dir.path(), &app).len() < PARTITIONS as usize {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint written while running"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    running.kill().unwrap(); // SIGKILL: no clean close
    running.wait().unwrap();
    for c in checkpoint_files(dir.path(), &app) {
        assert!(c["op0"].as_i64().unwrap() > 0, "{c}");
    }

    produce_seconds(&input, PARTITIONS, 300, 600);
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("{micro_batch: 200 milliseconds}", "available_now"),
    )
    .unwrap();
    run_from_local_files_to_end(&file, &output);
}
