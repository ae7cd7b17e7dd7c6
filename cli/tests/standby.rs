//! Standby replicas: two instances with `num_standby_replicas: 1`; each
//! keeps a warm copy of the partitions the other owns. One is killed with
//! SIGKILL; the survivor takes its partitions over from its warm copies,
//! replaying only the changelog's tail, and the output is exact.

mod common;

use common::*;
use std::process::{Child, Stdio};
use std::time::Duration;
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 4;

#[test]
fn a_killed_instances_partitions_resume_from_the_survivors_warm_copies() {
    let (input, output, app) = (unique("sb-in"), unique("sb-out"), unique("sb-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let names = (app.as_str(), input.as_str(), output.as_str());
    let mut instances: Vec<Child> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let file =
                write_direct_pipeline(d.path(), names, "{micro_batch: 200 milliseconds}", 50);
            let text = std::fs::read_to_string(&file).unwrap();
            let with_standby =
                text.replace("memory_mb: 32}", "memory_mb: 32, num_standby_replicas: 1}");
            assert_ne!(text, with_standby);
            std::fs::write(&file, with_standby).unwrap();
            let log = std::fs::File::create(d.path().join("stderr.log")).unwrap();
            tidemark_run(&file, Some(&format!("s{i}")), Stdio::from(log))
                .env("RUST_LOG", "tidemark_kafka=info")
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    produce_seconds(&input, PARTITIONS, 0, 300);
    // Both own partitions and have caught up their standbys.
    std::thread::sleep(Duration::from_secs(6));
    instances[1].kill().unwrap();
    instances[1].wait().unwrap();
    produce_seconds(&input, PARTITIONS, 300, 600);

    let expected = expected_rows(PARTITIONS);
    wait_for_records(&output, expected);
    interrupt(&mut instances[0]);
    assert_exact_windows(
        &consume_all(&output, expected, Duration::from_secs(10)),
        PARTITIONS,
    );
    let log = std::fs::read_to_string(dirs[0].path().join("stderr.log")).unwrap();
    let handed_over = log
        .matches("standby handed over to the active task")
        .count();
    let from_warm = log
        .lines()
        .filter(|l| {
            l.contains("state restored from changelog") && l.contains("from_local_checkpoint=")
        })
        .count();
    for line in log
        .lines()
        .filter(|l| l.contains("state restored") || l.contains("handed over"))
    {
        eprintln!("{line}");
    }
    assert!(handed_over >= 1, "{log}");
    assert!(from_warm >= handed_over, "{log}");
}
