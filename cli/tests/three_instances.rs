//! Three `tidemark run` instances in one consumer group under
//! `exactly_once`; one is killed with SIGKILL mid-stream. Its partitions move
//! to the survivors, which restore its state from the changelog, and the
//! output holds every window exactly once. The records are keyed by the
//! grouping column (`keyed_by`), so this is the path without a repartition
//! topic; `kill_and_restart` and `broker_restart` cover the other.

mod common;

use common::*;
use std::process::{Child, Stdio};
use std::time::Duration;
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 6;

#[test]
fn a_killed_instance_hands_its_partitions_and_state_to_the_survivors() {
    let (input, output, group) = (unique("trio-in"), unique("trio-out"), unique("trio-app"));
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    // Each instance keeps its state in its own directory, as on separate
    // machines: a moved partition can only come back through the changelog.
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let names = (group.as_str(), input.as_str(), output.as_str());
    let mut instances: Vec<Child> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let file =
                write_direct_pipeline(d.path(), names, "{micro_batch: 200 milliseconds}", 50);
            tidemark_run(&file, Some(&format!("i{i}")), Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));

    // Half the stream while all three run, then one is killed.
    produce_seconds(&input, PARTITIONS, 0, 300);
    std::thread::sleep(Duration::from_secs(4));
    instances[1].kill().unwrap();
    instances[1].wait().unwrap();
    produce_seconds(&input, PARTITIONS, 300, 600);

    let expected = expected_rows(PARTITIONS);
    wait_for_records(&output, expected);
    for i in [0, 2] {
        interrupt(&mut instances[i]);
    }
    assert_exact_windows(
        &consume_all(&output, expected, Duration::from_secs(10)),
        PARTITIONS,
    );
}
