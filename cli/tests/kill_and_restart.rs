//! `tidemark run` killed with SIGKILL in the middle of a windowed pipeline
//! under `exactly_once` and Spark's query-wide watermark (its batches
//! planned by offsets), twice, then restarted: the output topic read
//! `read_committed` holds exactly the expected windows, once each.

mod common;

use common::*;
use std::time::Duration;
use tidemark_integration_tests::*;

#[test]
fn sigkill_twice_under_exactly_once_then_the_output_is_exact() {
    let (input, output, group) = (unique("eos-in"), unique("eos-out"), unique("eos-app"));
    create_topic(&input, 4);
    create_topic(&output, 1);
    produce_seconds(&input, 4, 0, 600);
    let dir = tempfile::tempdir().unwrap();
    let names = (group.as_str(), input.as_str(), output.as_str());
    let file = write_pipeline(dir.path(), names, "{micro_batch: 200 milliseconds}", 100);
    // The input is all there before the query starts: Spark's watermark
    // over planned batches loses no row to lateness, kills or not.
    use_query_wide_watermark(&file);
    run_and_kill(&file, 4);
    run_and_kill(&file, 6);
    write_pipeline(dir.path(), names, "available_now", 100);
    use_query_wide_watermark(&file);
    let done = run_to_end(&file);
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
