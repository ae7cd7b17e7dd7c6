//! The README's two commands and the examples, run as a new user runs them.
//!
//! * The README's commands are pinned here: changing them without changing
//!   this test (and `.ci/run`, which runs both) fails.
//! * The `quickstart` and `fraud_scoring` examples, built by `cargo test`
//!   like every example, run on librdkafka's embedded mock cluster and on
//!   the real broker of `KAFKA_BOOTSTRAP`; their output is checked against
//!   what their input must give. (`tidemark run` of every pipeline under
//!   `examples/pipelines/` is checked in `cli/tests/examples.rs`.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The README's first command: the quickstart on the embedded default.
const QUICKSTART_COMMAND: &str = "scripts/quickstart.sh";
/// The README's second command: every check.
const TEST_COMMAND: &str = "scripts/test.sh";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The command lines of the README's "Two commands" block.
fn readme_commands() -> Vec<String> {
    let readme = read("README.md");
    let section = readme
        .split("## Two commands")
        .nth(1)
        .expect("the README has a `## Two commands` section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the section has a code block");
    block
        .lines()
        .skip(1) // the fence's language tag
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

#[test]
fn the_readme_commands_are_the_ones_ci_and_these_tests_run() {
    assert_eq!(
        readme_commands(),
        [QUICKSTART_COMMAND, TEST_COMMAND],
        "the README's commands changed: change this test, .ci/run and what they run with them"
    );
    let ci = read(".ci/run");
    for command in [QUICKSTART_COMMAND, TEST_COMMAND] {
        assert!(ci.contains(command), ".ci/run must run `{command}`");
    }
    let quickstart = read(QUICKSTART_COMMAND);
    assert!(
        quickstart.contains("scripts/setup.sh")
            && quickstart.contains("cargo build --workspace --examples")
            && quickstart.contains("/debug/examples/quickstart"),
        "{QUICKSTART_COMMAND} installs what building needs, builds as the tests do, then runs the quickstart example"
    );
    assert!(
        read(TEST_COMMAND).contains("scripts/setup.sh"),
        "{TEST_COMMAND} installs what it needs first"
    );
    // Both build into one target directory, so the second starts warm.
    for script in [QUICKSTART_COMMAND, TEST_COMMAND] {
        assert!(
            read(script).contains("CARGO_TARGET_DIR:-$HOME/.cache/tidemark-target"),
            "{script} builds into the shared target directory"
        );
    }
}

/// An example's binary, built by `cargo test` next to the test binaries.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(Path::parent).unwrap();
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} was not built (cargo test builds the examples)",
        path.display()
    );
    path
}

/// Runs example `name` on the mock cluster (`broker` None) or a broker;
/// returns its standard output.
fn run_example(name: &str, broker: Option<&str>) -> String {
    let mut command = Command::new(example(name));
    match broker {
        Some(b) => command.env("KAFKA_BOOTSTRAP", b),
        None => command.env_remove("KAFKA_BOOTSTRAP"),
    };
    let out = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{name} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn real_broker() -> String {
    std::env::var("KAFKA_BOOTSTRAP").expect(
        "KAFKA_BOOTSTRAP is not set: this test runs the example against a real broker \
         (scripts/test.sh starts one and sets it)",
    )
}

/// The quickstart's readings, as its generator makes them: (machine, event
/// time in seconds after 10:00).
fn quickstart_readings() -> Vec<(usize, i64)> {
    let mut readings = Vec::new();
    for i in 0..120i64 {
        for m in 0..4usize {
            let late = if (i * 4 + m as i64) % 37 == 0 { 240 } else { 0 };
            readings.push((m, i * 5 - late));
        }
    }
    readings
}

/// Checks the quickstart's output against its input: every reading is in
/// exactly one emitted window or was dropped as late, except those whose
/// window the final watermark leaves open; every on-time window is there.
fn check_quickstart(stdout: &str) {
    let readings = quickstart_readings();
    assert!(
        stdout.contains(&format!(
            "produced {} readings and 1 malformed record",
            readings.len()
        )),
        "{stdout}"
    );
    let machines = ["drill-1", "drill-2", "loader-1", "truck-7"];
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    let mut windows: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let window_start =
            tidemark::time::parse_rfc3339(row["window_start"].as_str().unwrap()).unwrap();
        let key = (
            row["machine"].as_str().unwrap().to_string(),
            (window_start - start) / 1_000_000,
        );
        let readings = row["readings"].as_i64().unwrap();
        assert!(
            windows.insert(key.clone(), readings).is_none(),
            "window {key:?} written twice"
        );
    }
    // 2-minute windows, 1-minute watermark: the last watermark is the
    // latest reading minus a minute; windows ending after it stay open.
    let final_watermark = readings.iter().map(|r| r.1).max().unwrap() - 60;
    let closed = |t: i64| t.div_euclid(120) * 120 + 120 <= final_watermark;
    let in_closed_windows = readings.iter().filter(|r| closed(r.1)).count() as i64;
    let done = stdout
        .lines()
        .find(|l| l.starts_with("done:"))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}"));
    let numbers: Vec<i64> = done
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let [_batches, input, emitted, bad] = numbers[..] else {
        panic!("unexpected summary: {done}");
    };
    assert_eq!(input, readings.len() as i64 + 1, "{done}");
    assert_eq!(bad, 1, "the malformed record, dead-lettered: {done}");
    assert_eq!(emitted, windows.len() as i64, "{done}");
    let counted: i64 = windows.values().sum();
    assert!(
        counted <= in_closed_windows && counted >= in_closed_windows - 13,
        "{counted} readings in windows; {in_closed_windows} in closed windows, of which at most the 13 late ones may be dropped"
    );
    // Every window up to the final watermark is there. One without a late
    // reading in or out is complete (24 readings, one every 5 s); one that
    // lost a reading to lateness has its on-time ones, plus the late
    // readings that fell in it if they were not dropped.
    let mut on_time: BTreeMap<(usize, i64), i64> = BTreeMap::new();
    let mut late_in: BTreeMap<(usize, i64), i64> = BTreeMap::new();
    for (k, &(m, t)) in readings.iter().enumerate() {
        let window = t.div_euclid(120) * 120;
        let counts = if k % 37 == 0 {
            &mut late_in
        } else {
            &mut on_time
        };
        *counts.entry((m, window)).or_default() += 1;
    }
    for (m, machine) in machines.iter().enumerate() {
        for w in (0..=final_watermark - 120).step_by(120) {
            let got = windows.get(&(machine.to_string(), w)).copied();
            let expected = on_time.get(&(m, w)).copied().unwrap_or(0);
            let late = late_in.get(&(m, w)).copied().unwrap_or(0);
            let got = got.unwrap_or_else(|| panic!("{machine} window +{w}s missing"));
            assert!(
                (expected..=expected + late).contains(&got),
                "{machine} window +{w}s: {got} readings, {expected} on time and {late} late"
            );
        }
    }
}

#[test]
fn the_quickstart_runs_on_the_embedded_mock_cluster() {
    check_quickstart(&run_example("quickstart", None));
}

#[test]
fn the_quickstart_runs_on_the_real_broker() {
    check_quickstart(&run_example("quickstart", Some(&real_broker())));
}

/// Checks fraud_scoring's output: every transaction scored, alerts only
/// for the card that buys fast, each above the threshold.
fn check_fraud_scoring(stdout: &str) {
    assert!(
        stdout.contains("done: 2400 transactions scored"),
        "{stdout}"
    );
    let alerts: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("alert: "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(!alerts.is_empty(), "the fast buyer is flagged:\n{stdout}");
    for alert in &alerts {
        assert_eq!(alert["card"], "card-0666", "{alert}");
        assert!(
            alert["sum_1h"].as_f64().unwrap() > 2000.0 || alert["n_1h"].as_i64().unwrap() > 15,
            "{alert}"
        );
    }
    // The card makes 33 purchases: 30 of 450 from the 600th transaction on
    // and 3 small ones (69, 19, 44). It crosses 2,000 at its fifth large
    // one; that and each later purchase (26 large, 2 small) update its row:
    // at most 28 alerts, the last with all 33 counted.
    assert!(alerts.len() <= 28, "{} alerts", alerts.len());
    let last = alerts
        .iter()
        .map(|a| a["n_lifetime"].as_i64().unwrap())
        .max();
    assert_eq!(last, Some(33), "the last purchase is scored");
}

#[test]
fn fraud_scoring_runs_on_the_embedded_mock_cluster() {
    check_fraud_scoring(&run_example("fraud_scoring", None));
}

#[test]
fn fraud_scoring_runs_on_the_real_broker() {
    check_fraud_scoring(&run_example("fraud_scoring", Some(&real_broker())));
}
