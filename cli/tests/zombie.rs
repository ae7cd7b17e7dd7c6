//! A zombie: one of two `exactly_once` replicas is paused (SIGSTOP) past
//! its session timeout while the producer keeps writing. The other replica
//! takes its partitions and keeps writing meanwhile; when the paused one
//! comes back (SIGCONT), whatever it had open is fenced (its group
//! generation, or its producer epoch once the coordinator aborted its
//! transaction) and never becomes visible, and it rejoins. Every window is
//! written exactly once.

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 4;

fn signal(child: &std::process::Child, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {signal}");
}

#[test]
fn a_replica_paused_past_its_session_timeout_is_fenced_and_the_live_one_keeps_writing() {
    let (input, output, group) = (
        unique("zombie-in"),
        unique("zombie-out"),
        unique("zombie-app"),
    );
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let names = (group.as_str(), input.as_str(), output.as_str());
    let file = write_pipeline(dir.path(), names, "{micro_batch: 200 milliseconds}", 50);
    let mut replicas = [start_replica(&file), start_replica(&file)];
    for chunk in 0..3 {
        produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
        std::thread::sleep(Duration::from_secs(2));
    }

    // The zombie: paused mid-work for twice the session timeout (6 s).
    signal(&replicas[0].child, "-STOP");
    let live_before = replicas[1].batches_with_input.load(Ordering::Relaxed);
    let paused = Instant::now();
    for chunk in 3..6 {
        produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
        std::thread::sleep(Duration::from_secs(4));
    }
    let live_during = replicas[1].batches_with_input.load(Ordering::Relaxed) - live_before;
    eprintln!(
        "zombie paused {:.1} s; the live replica ran {live_during} batches with input meanwhile",
        paused.elapsed().as_secs_f64()
    );
    signal(&replicas[0].child, "-CONT");
    assert!(
        live_during > 0,
        "the live replica stalled while the other was paused"
    );

    for chunk in 6..10 {
        produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
        std::thread::sleep(Duration::from_secs(2));
    }
    let expected = expected_rows(PARTITIONS);
    wait_for_records(&output, expected);
    for r in &mut replicas {
        assert!(
            r.child.try_wait().unwrap().is_none(),
            "a replica exited by itself"
        );
        interrupt(&mut r.child);
    }
    assert_exact_windows(
        &consume_all(&output, expected, Duration::from_secs(10)),
        PARTITIONS,
    );
}
