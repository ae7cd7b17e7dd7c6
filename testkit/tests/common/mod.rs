//! What the container tests share: Docker commands, the readings they
//! produce and the windows tumbling-count must write for them.
#![allow(dead_code)] // each test binary uses its own part

use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

/// The input: two ids' readings in the window [10:00, 10:05), one of them
/// filtered out (`amount >= 0`), m2's in [10:05, 10:10), and a reading at
/// 10:25 that moves the watermark (10 minutes behind) to 10:15, past both
/// windows' ends; its own window stays open.
pub const READINGS: &str = r#"{"event_time":"2026-01-01T10:00:05Z","id":"m1","amount":2.5}
{"event_time":"2026-01-01T10:01:00Z","id":"m2","amount":10.0}
{"event_time":"2026-01-01T10:03:30Z","id":"m1","amount":4.0}
{"event_time":"2026-01-01T10:04:59Z","id":"m1","amount":-1.0}
{"event_time":"2026-01-01T10:07:00Z","id":"m2","amount":1.0}
{"event_time":"2026-01-01T10:25:00Z","id":"m3","amount":7.0}
"#;

/// The windows closed by [`READINGS`]: (id, window start, count, total).
pub const EXPECTED_WINDOWS: [(&str, &str, u64, f64); 3] = [
    ("m1", "2026-01-01T10:00:00", 2, 6.5),
    ("m2", "2026-01-01T10:00:00", 1, 10.0),
    ("m2", "2026-01-01T10:05:00", 1, 1.0),
];

/// The tidemark image the tests run: `TIDEMARK_IMAGE`, else scripts/images.sh's.
pub fn tidemark_image() -> String {
    std::env::var("TIDEMARK_IMAGE").unwrap_or_else(|_| "tidemark/tidemark:latest".into())
}

/// The repository's `examples/pipelines`, mounted into tidemark containers.
pub fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/pipelines")
        .canonicalize()
        .expect("examples/pipelines exists")
}

/// Runs a program and hands back what it printed; a failure to start it fails the test.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {program} {args:?}: {e}"));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

/// `docker ARGS`, which must succeed; its stdout.
pub fn docker(args: &[&str]) -> String {
    let out = run("docker", args, None);
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The ids of the containers, running or not, that `docker ps -a` lists
/// for a filter.
pub fn containers(filter: &str) -> Vec<String> {
    docker(&["ps", "-a", "-q", "--no-trunc", "--filter", filter])
        .lines()
        .map(str::to_string)
        .collect()
}

/// Produces `lines` to `topic` through the image's `kafka-tool`, run by
/// `exec` (`docker exec -i ID` or `docker-compose exec -T kafka`).
pub fn produce(exec: &[&str], topic: &str, lines: &str) {
    let mut args = exec[1..].to_vec();
    args.extend(["kafka-tool", "produce", topic]);
    let out = run(exec[0], &args, Some(lines));
    assert!(
        out.status.success(),
        "producing to {topic}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The first `count` values of `topic` (read committed), waiting at most
/// `ms` milliseconds; fewer when no more came.
pub fn consume(exec: &[&str], topic: &str, count: usize, ms: u64) -> Vec<String> {
    let (count, ms) = (count.to_string(), ms.to_string());
    let mut args = exec[1..].to_vec();
    args.extend(["kafka-tool", "consume", topic, &count, &ms]);
    let out = run(exec[0], &args, None);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.starts_with('{'))
        .map(str::to_string)
        .collect()
}

/// `rows` are exactly [`EXPECTED_WINDOWS`], in any order; `context` says
/// what to look at when they are not.
pub fn assert_windows(rows: &[String], context: &str) {
    let mut actual: Vec<(String, String, u64, f64)> = rows
        .iter()
        .map(|row| {
            let value: serde_json::Value = serde_json::from_str(row)
                .unwrap_or_else(|e| panic!("an output row that is not JSON ({e}): {row}"));
            let start = value["window_start"].as_str().unwrap_or_default();
            (
                value["id"].as_str().unwrap_or_default().to_string(),
                start.get(..19).unwrap_or(start).to_string(),
                value["count"].as_u64().unwrap_or(u64::MAX),
                value["total"].as_f64().unwrap_or(f64::NAN),
            )
        })
        .collect();
    actual.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let expected: Vec<(String, String, u64, f64)> = EXPECTED_WINDOWS
        .iter()
        .map(|(id, start, count, total)| (id.to_string(), start.to_string(), *count, *total))
        .collect();
    assert_eq!(actual, expected, "rows: {rows:?}\n{context}");
}

/// Two ports nothing listens on now, held together so that they differ.
pub fn free_ports() -> [String; 2] {
    let first = TcpListener::bind("127.0.0.1:0").unwrap();
    let second = TcpListener::bind("127.0.0.1:0").unwrap();
    [&first, &second].map(|listener| listener.local_addr().unwrap().port().to_string())
}
