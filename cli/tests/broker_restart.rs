//! The broker restarts in the middle of an exactly-once windowed run; the
//! running `tidemark` recovers by itself and the output is exact. Needs the
//! broker that `scripts/kafka.sh` manages (it restarts it): against any
//! other it fails, saying so.
//!
//! The run is a static member (`TIDEMARK_INSTANCE_ID`) behind the
//! repartition topic under the query-wide watermark (planned batches), and
//! the broker stays down for
//! `TIDEMARK_TEST_BROKER_DOWN_S` seconds (default 60): every retry loop
//! waits between tries, so the whole run logs fewer than
//! [`LOG_LINE_BOUND`] lines besides its progress reports (before retries
//! backed off, a broker restart wrote millions in seconds).

mod common;

use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 2;

/// The most log lines (progress reports aside) the run may write.
const LOG_LINE_BOUND: usize = 1000;

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
    // Spark's query-wide watermark: batches are planned by offsets, the
    // retry loop that flooded the log while the broker was away.
    use_query_wide_watermark(&file);
    let down = Duration::from_secs(
        std::env::var("TIDEMARK_TEST_BROKER_DOWN_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    // Its log counted, and kept for diagnosing a failure after the fact.
    let log_path = dir.path().join("tidemark.log");
    let stderr = Stdio::from(std::fs::File::create(&log_path).unwrap());
    let mut app = tidemark_run(&file, Some("restart-0"), stderr)
        .spawn()
        .unwrap();
    produce_seconds(&input, PARTITIONS, 0, 300);
    std::thread::sleep(Duration::from_secs(3));
    assert!(kafka_script("stop"), "stopping the broker");
    std::thread::sleep(down);
    assert!(kafka_script("start"), "starting the broker again");
    assert!(
        app.try_wait().unwrap().is_none(),
        "the app exited while the broker was down:\n{}",
        log_tail(&log_path)
    );
    produce_seconds(&input, PARTITIONS, 300, 600);

    let expected = expected_rows(PARTITIONS);
    let deadline = Instant::now() + Duration::from_secs(150);
    while Instant::now() < deadline
        && consume_all(&output, expected, Duration::from_secs(10)).len() < expected
    {}
    let status = interrupt(&mut app);
    let log = std::fs::read_to_string(&log_path).unwrap();
    if let Some(mut kept) = process_log("broker_restart") {
        use std::io::Write;
        let _ = kept.write_all(log.as_bytes());
    }
    assert_exact_windows(
        &consume_all(&output, expected, Duration::from_secs(10)),
        PARTITIONS,
    );
    assert!(
        status.success(),
        "the app kept running and stopped cleanly on Ctrl-C: {status:?}\n{}",
        log_tail(&log_path)
    );
    let lines: Vec<&str> = log
        .lines()
        .filter(|line| serde_json::from_str::<serde_json::Value>(line).is_err())
        .collect();
    assert!(
        lines.len() < LOG_LINE_BOUND,
        "{} log lines over a {} s broker restart (bound {LOG_LINE_BOUND}); the most repeated:\n{}",
        lines.len(),
        down.as_secs(),
        most_repeated(&lines)
    );
}

/// The last lines of the log at `path`.
fn log_tail(path: &std::path::Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The messages of `lines` that repeat most, with their counts (a line's
/// message: its first words after the target, timestamps aside).
fn most_repeated(lines: &[&str]) -> String {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for line in lines {
        let text = line.split_once(": ").map_or(*line, |(_, rest)| rest);
        let message: Vec<&str> = text.split_whitespace().take(6).collect();
        *counts.entry(message.join(" ")).or_default() += 1;
    }
    let mut sorted: Vec<_> = counts.into_iter().collect();
    sorted.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    sorted
        .iter()
        .take(10)
        .map(|(message, n)| format!("{n:>8} {message}"))
        .collect::<Vec<_>>()
        .join("\n")
}
