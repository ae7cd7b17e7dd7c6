//! A replica restarted on its state directory takes its partitions back at
//! once (#44 item 14). Two `tidemark run` processes of one file share one
//! state directory with no `TIDEMARK_INSTANCE_ID`: each takes an instance
//! slot, whose stable id makes its consumer a static group member
//! (`group.instance.id`) by default. One is SIGKILLed and started again
//! while input keeps coming: it rejoins as the same member and reads again
//! long before the dead member's session (two minutes here) would have
//! timed out — what a dynamic member, the old default, had to wait for
//! before the group could rebalance. Every window is still written once.

mod common;

use common::*;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 4;
/// Far beyond the wait below: a member that had to outlive the dead one's
/// session could not read in time.
const SESSION_TIMEOUT_MS: u64 = 120_000;

#[test]
fn a_replica_restarted_on_its_state_directory_reads_again_before_the_session_timeout() {
    let (input, output, group) = (
        unique("static-in"),
        unique("static-out"),
        unique("static-app"),
    );
    create_topic(&input, PARTITIONS);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let names = (group.as_str(), input.as_str(), output.as_str());
    let file = write_pipeline(dir.path(), names, "{micro_batch: 200 milliseconds}", 50);
    let text = std::fs::read_to_string(&file).unwrap();
    let long_session = text.replace(
        "session.timeout.ms: \"6000\"",
        &format!("session.timeout.ms: \"{SESSION_TIMEOUT_MS}\""),
    );
    assert_ne!(text, long_session);
    std::fs::write(&file, long_session).unwrap();

    let mut replicas = [start_replica(&file), start_replica(&file)];
    // Both read before the kill: the partitions are shared.
    let mut chunk = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    while replicas
        .iter()
        .any(|r| r.batches_with_input.load(Ordering::Relaxed) == 0)
    {
        assert!(
            Instant::now() < deadline,
            "both replicas never read (a chunk of events a round)"
        );
        produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
        chunk += 1;
        std::thread::sleep(Duration::from_secs(2));
    }

    replicas[1].child.kill().unwrap(); // SIGKILL
    replicas[1].child.wait().unwrap();
    let restarted_at = Instant::now();
    replicas[1] = start_replica(&file);
    let bound = Duration::from_millis(SESSION_TIMEOUT_MS / 3);
    while replicas[1].batches_with_input.load(Ordering::Relaxed) == 0 {
        assert!(
            restarted_at.elapsed() < bound,
            "the restarted replica read nothing for {bound:?}: it waited for a rebalance \
             instead of rejoining as the same static member"
        );
        if chunk < 10 {
            produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
            chunk += 1;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    eprintln!(
        "the restarted replica read again after {:?}",
        restarted_at.elapsed()
    );
    while chunk < 10 {
        produce_seconds(&input, PARTITIONS, chunk * 60, (chunk + 1) * 60);
        chunk += 1;
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
