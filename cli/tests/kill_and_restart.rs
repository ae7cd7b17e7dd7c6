//! `tidemark run` killed with SIGKILL in the middle of a windowed pipeline
//! under `exactly_once`, twice, then restarted: the output topic read
//! `read_committed` holds exactly the expected windows, once each.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

/// Runs `tidemark run` until it has reported `batches` progress lines, then
/// kills it with SIGKILL.
fn run_and_kill(file: &std::path::Path, batches: usize) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", "--progress", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut seen = 0;
    for line in stderr.lines() {
        if line.unwrap().starts_with("{\"id\"") {
            seen += 1;
        }
        if seen >= batches || Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(seen >= batches, "only {seen} batches before the deadline");
}

#[test]
fn sigkill_twice_under_exactly_once_then_the_output_is_exact() {
    let (input, output, group) = (unique("eos-in"), unique("eos-out"), unique("eos-app"));
    create_topic(&input, 4);
    create_topic(&output, 1);
    produce_seconds(&input, 4, 0, 600);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        windowed_pipeline(
            &group,
            &input,
            &output,
            "{micro_batch: 200 milliseconds}",
            100,
        ),
    )
    .unwrap();
    run_and_kill(&file, 4);
    run_and_kill(&file, 6);
    std::fs::write(
        &file,
        windowed_pipeline(&group, &input, &output, "available_now", 100),
    )
    .unwrap();
    let done = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .output()
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_exact_windows(
        &consume_all(&output, expected_rows(4), Duration::from_secs(60)),
        4,
    );
}
