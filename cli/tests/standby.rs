//! Standby replicas. Two instances with `num_standby_replicas: 1`: each
//! keeps a warm copy of the partitions the other owns. One is killed with
//! SIGKILL; the survivor takes its partitions over from its warm copies,
//! replaying only the changelog's tail, and the output is exact. Three
//! instances with `num_standby_replicas: 1` keep exactly one warm copy of
//! each partition, never on its owner.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 4;

/// Starts `count` instances of one query over `partitions` partitions with
/// `num_standby_replicas: 1`, each with its own state directory and
/// instance id (`s<i>`), logging to `stderr.log` there.
fn start_instances(
    count: usize,
    partitions: i32,
) -> (String, String, Vec<tempfile::TempDir>, Vec<Child>) {
    let (input, output, app) = (unique("sb-in"), unique("sb-out"), unique("sb-app"));
    create_topic(&input, partitions);
    create_topic(&output, 1);
    let dirs: Vec<_> = (0..count).map(|_| tempfile::tempdir().unwrap()).collect();
    let names = (app.as_str(), input.as_str(), output.as_str());
    let instances: Vec<Child> = dirs
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
    (input, output, dirs, instances)
}

/// The set logged as `name={1, 4}` in `line`.
fn logged_set(line: &str, name: &str) -> Option<BTreeSet<i32>> {
    let start = line.find(&format!("{name}="))? + name.len() + 2;
    let end = start + line[start..].find('}')?;
    Some(
        line[start..end]
            .split(',')
            .filter_map(|p| p.trim().parse().ok())
            .collect(),
    )
}

/// Each instance's last standby placement among three members: the
/// partitions it keeps warm and those it owned then.
fn placements(dirs: &[tempfile::TempDir]) -> Vec<Option<(BTreeSet<i32>, BTreeSet<i32>)>> {
    dirs.iter()
        .map(|d| {
            let log = std::fs::read_to_string(d.path().join("stderr.log")).unwrap_or_default();
            let line = log
                .lines()
                .rfind(|l| l.contains("standby placement") && l.contains("members=3"))?;
            Some((logged_set(line, "standby")?, logged_set(line, "owned")?))
        })
        .collect()
}

#[test]
fn three_instances_keep_exactly_one_warm_copy_of_each_partition() {
    const SIX: i32 = 6;
    let (input, _output, dirs, mut instances) = start_instances(3, SIX);
    std::thread::sleep(Duration::from_secs(3));
    produce_seconds(&input, SIX, 0, 120);
    let deadline = Instant::now() + Duration::from_secs(120);
    let settled = loop {
        let seen = placements(&dirs);
        let copies = |p: i32| {
            seen.iter()
                .flatten()
                .filter(|(standby, _)| standby.contains(&p))
                .count()
        };
        let settled = seen.iter().all(Option::is_some)
            && (0..SIX).all(|p| copies(p) == 1)
            && seen
                .iter()
                .flatten()
                .all(|(standby, active)| standby.is_disjoint(active));
        if settled || Instant::now() > deadline {
            break (settled, seen);
        }
        // Keep the tasks busy so that every instance owns stores.
        produce_seconds(&input, SIX, 120, 121);
        std::thread::sleep(Duration::from_secs(2));
    };
    for instance in &mut instances {
        interrupt(instance);
    }
    if !settled.0 {
        for d in &dirs {
            let log = std::fs::read_to_string(d.path().join("stderr.log")).unwrap_or_default();
            for line in log.lines().filter(|l| {
                l.contains("standby") || l.contains("assigned") || l.contains("revoked")
            }) {
                eprintln!("{line}");
            }
        }
    }
    assert!(
        settled.0,
        "not one copy per partition, off its owner: {:?}",
        settled.1
    );
}

#[test]
fn a_killed_instances_partitions_resume_from_the_survivors_warm_copies() {
    let (input, output, dirs, mut instances) = start_instances(2, PARTITIONS);
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
