//! The broker restarts in the middle of an exactly-once windowed run; the
//! running `tidemark` recovers by itself and the output is exact. Needs the
//! broker that `scripts/kafka.sh` manages (it restarts it): against any
//! other it fails, saying so.

mod common;

use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 2;

#[test]
fn a_broker_restart_mid_run_is_survived_with_exact_results() {
    // A test that cannot run fails and says why, rather than passing.
    assert!(
        kafka_script("status"),
        "cannot run: this test restarts the broker, and the broker at {} is not the one scripts/kafka.sh manages (start it with `bash scripts/kafka.sh start`, or leave this test out with `--skip a_broker_restart_mid_run`)",
        bootstrap()
    );
    let (input, output, group) = (
        unique("restart-in"),
        unique("restart-out"),
        unique("restart-app"),
    );
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let names = (group.as_str(), input.as_str(), output.as_str());
    let file = write_pipeline(dir.path(), names, "{micro_batch: 200 milliseconds}", 50);
    // Its log kept for diagnosing a failure after the fact.
    let stderr = process_log("broker_restart").map_or_else(Stdio::null, Stdio::from);
    let mut app = tidemark_run(&file, None, stderr).spawn().unwrap();
    produce_seconds(&input, PARTITIONS, 0, 300);
    std::thread::sleep(Duration::from_secs(3));
    assert!(kafka_script("stop"), "stopping the broker");
    std::thread::sleep(Duration::from_secs(3));
    assert!(kafka_script("start"), "starting the broker again");
    produce_seconds(&input, PARTITIONS, 300, 600);

    let expected = expected_rows(PARTITIONS);
    let deadline = Instant::now() + Duration::from_secs(150);
    while Instant::now() < deadline
        && consume_all(&output, expected, Duration::from_secs(10)).len() < expected
    {}
    let status = interrupt(&mut app);
    assert_exact_windows(
        &consume_all(&output, expected, Duration::from_secs(10)),
        PARTITIONS,
    );
    assert!(
        status.success(),
        "the app kept running and stopped cleanly on Ctrl-C: {status:?}"
    );
}
