//! What the crash and restart tests share: the exactly-once windowed
//! pipeline they run and the event stream they produce.

// Each test binary compiles this module and uses only part of it.
#![allow(dead_code)]

/// Keys per partition (`p<partition>-<0..KEYS>`).
pub const KEYS: i64 = 5;

/// An exactly-once pipeline: 1-minute tumbling counts (and sums) per `id`,
/// 30-second watermark, append mode, RocksDB state with a changelog.
/// Its watermark is per partition: these tests produce events while the
/// query runs, and under Spark's query-wide watermark whether a row is late
/// depends on when its partition's records became visible against the
/// others' (a batch planned before a partition's records landed moves the
/// watermark on without them); see [`use_query_wide_watermark`]. The
/// source does not say it is keyed by `id`, so the aggregation runs behind
/// a repartition topic (see [`write_direct_pipeline`] for the other way).
pub fn windowed_pipeline(
    group: &str,
    input: &str,
    output: &str,
    trigger: &str,
    batch: usize,
) -> String {
    format!(
        r#"name: {group}
source:
  kind: kafka
  topic: {input}
  schema: {{event_time: timestamp, id: string, amount: double}}
  properties: {{session.timeout.ms: "6000", heartbeat.interval.ms: "1000"}}
event_time: event_time
watermark: 30 seconds
watermark_scope: partition
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}, {{fn: sum, column: amount, as: total}}]
output_mode: append
trigger: {trigger}
max_records_per_batch: {batch}
sink: {{kind: kafka, topic: {output}, key: [id]}}
state: {{dir: state, changelog: true, memory_mb: 32}}
processing_guarantee: exactly_once
"#
    )
}

/// Produces, to each of `partitions`, one event a second from 10:00:00 +
/// `from` s to `to` s (exclusive), keys rotating, amount 1.5. The
/// partitions are written in step (second by second, all partitions each
/// second), as a live topic fills: under the query-wide watermark a
/// partition written whole before the next would make the next one's rows
/// late.
pub fn produce_seconds(input: &str, partitions: i32, from: i64, to: i64) {
    produce_seconds_with(
        &tidemark_integration_tests::plain(),
        input,
        partitions,
        from,
        to,
    )
}

/// [`produce_seconds`] with the client configuration `base`.
pub fn produce_seconds_with(
    base: &rdkafka::ClientConfig,
    input: &str,
    partitions: i32,
    from: i64,
    to: i64,
) {
    let all: Vec<i32> = (0..partitions).collect();
    produce_seconds_to(base, input, &all, from, to)
}

/// [`produce_seconds_with`] to the partitions `partitions` only.
pub fn produce_seconds_to(
    base: &rdkafka::ClientConfig,
    input: &str,
    partitions: &[i32],
    from: i64,
    to: i64,
) {
    let start = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
    let records: Vec<_> = (from..to)
        .flat_map(|i| partitions.iter().map(move |p| (i, *p)))
        .map(|(i, p)| {
            let id = format!("p{p}-{}", i % KEYS);
            let t = tidemark::time::format_rfc3339(start + i * 1_000_000);
            let value = format!(r#"{{"event_time": "{t}", "id": "{id}", "amount": 1.5}}"#);
            (Some(p), id, value.into_bytes())
        })
        .collect();
    tidemark_integration_tests::produce_each_with(base, input, &records);
}

/// Switches the pipeline `file` to Spark's query-wide watermark (the
/// default), for a test whose input is all written before the query
/// starts: its batches are then planned over every partition's records
/// and no row is late.
pub fn use_query_wide_watermark(file: &std::path::Path) {
    let text = std::fs::read_to_string(file).unwrap();
    let switched = text.replace("watermark_scope: partition\n", "watermark_scope: query\n");
    assert_ne!(text, switched, "the pipeline names a watermark scope");
    std::fs::write(file, switched).unwrap();
}

/// Checks that `out` holds exactly `partitions` × 9 windows × `KEYS` keys
/// (10 minutes of events with a 30-second watermark close nine 1-minute
/// windows), each once and complete (12 events).
pub fn assert_exact_windows(out: &[tidemark_integration_tests::Consumed], partitions: i32) {
    let mut seen = std::collections::BTreeMap::new();
    for r in out {
        let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let key = (
            v["id"].as_str().unwrap().to_string(),
            v["window_start"].as_str().unwrap().to_string(),
        );
        let n = v["n"].as_i64().unwrap();
        assert!(
            seen.insert(key.clone(), n).is_none(),
            "duplicate window {key:?}"
        );
        assert_eq!((n, v["total"].as_f64().unwrap()), (12, 18.0), "{key:?}");
    }
    assert_eq!(
        seen.len(),
        partitions as usize * 9 * KEYS as usize,
        "{seen:?}"
    );
}

/// The number of output rows [`assert_exact_windows`] expects.
pub fn expected_rows(partitions: i32) -> usize {
    partitions as usize * 9 * KEYS as usize
}

/// Writes [`windowed_pipeline`] to `dir/pipeline.yaml` and returns its path.
pub fn write_pipeline(
    dir: &std::path::Path,
    names: (&str, &str, &str),
    trigger: &str,
    batch: usize,
) -> std::path::PathBuf {
    let (group, input, output) = names;
    let file = dir.join("pipeline.yaml");
    std::fs::write(
        &file,
        windowed_pipeline(group, input, output, trigger, batch),
    )
    .unwrap();
    file
}

/// [`write_pipeline`] with `keyed_by: [id]`: the records' key is the
/// grouping column, so the aggregation runs where the records are, without
/// the repartition topic.
pub fn write_direct_pipeline(
    dir: &std::path::Path,
    names: (&str, &str, &str),
    trigger: &str,
    batch: usize,
) -> std::path::PathBuf {
    let file = write_pipeline(dir, names, trigger, batch);
    let text = std::fs::read_to_string(&file).unwrap();
    let keyed = text.replacen("  kind: kafka\n", "  kind: kafka\n  keyed_by: [id]\n", 1);
    assert_ne!(text, keyed);
    std::fs::write(&file, keyed).unwrap();
    file
}

/// `tidemark run FILE` against the test broker, as instance `instance`
/// when given (`TIDEMARK_INSTANCE_ID`); stdout discarded, stderr as asked.
pub fn tidemark_run(
    file: &std::path::Path,
    instance: Option<&str>,
    stderr: std::process::Stdio,
) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"));
    command
        .args(["run", "--progress", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", tidemark_integration_tests::bootstrap())
        .stdout(std::process::Stdio::null())
        .stderr(stderr);
    if let Some(id) = instance {
        command.env("TIDEMARK_INSTANCE_ID", id);
    }
    command
}

/// Waits up to two minutes until `topic` holds `expected` records.
pub fn wait_for_records(topic: &str, expected: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::time::Instant::now() < deadline
        && tidemark_integration_tests::consume_all(
            topic,
            expected,
            std::time::Duration::from_secs(5),
        )
        .len()
            < expected
    {}
}

/// Runs `tidemark run FILE` to its end (an available-now run) and returns
/// its exit status and stderr. A run still going after five minutes is
/// killed and fails the test with the end of its stderr: a query that
/// never ends its input must fail the test, not hang it.
#[allow(dead_code)]
pub fn run_to_end(file: &std::path::Path) -> std::process::Output {
    use std::io::Read;
    let mut child = tidemark_run(file, None, std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        text
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let text = reader.join().unwrap();
            let tail = String::from_utf8_lossy(&text[text.len().saturating_sub(4000)..]);
            panic!("the run had not ended after 5 minutes; the end of its stderr:\n{tail}");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    std::process::Output {
        status,
        stdout: Vec::new(),
        stderr: reader.join().unwrap(),
    }
}

/// Stops a running instance with Ctrl-C (SIGINT) and waits for it.
pub fn interrupt(child: &mut std::process::Child) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    child.wait().unwrap()
}

/// Runs `tidemark run` until it has reported `batches` progress lines, then
/// kills it with SIGKILL.
pub fn run_and_kill(file: &std::path::Path, batches: usize) {
    use std::io::{BufRead, BufReader};
    let mut child = tidemark_run(file, None, std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut seen = 0;
    let mut log = replica_log(child.id());
    for line in stderr.lines() {
        let line = line.unwrap();
        if let Some(file) = log.as_mut() {
            use std::io::Write;
            let _ = writeln!(file, "{line}");
        }
        if line.starts_with("{\"id\"") {
            seen += 1;
        }
        if seen >= batches || std::time::Instant::now() > deadline {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(seen >= batches, "only {seen} batches before the deadline");
}

/// `tidemark describe FILE`: the operator graph, one line per step.
#[allow(dead_code)]
pub fn tidemark_describe(file: &std::path::Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["describe", file.to_str().unwrap()])
        .env("KAFKA_BOOTSTRAP", tidemark_integration_tests::bootstrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Runs `scripts/kafka.sh <command>` (start, stop, status); whether it
/// succeeded.
pub fn kafka_script(command: &str) -> bool {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka.sh");
    std::process::Command::new("bash")
        .arg(script)
        .arg(command)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// A running `tidemark run` process, the count of its progress reports
/// with input rows, and the count of its log lines saying its producer was
/// fenced.
pub struct Replica {
    /// The process.
    pub child: std::process::Child,
    /// Progress reports with `numInputRows` > 0.
    pub batches_with_input: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Log lines mentioning a fenced producer (echoed as `fenced: ...`);
    /// a static consumer fenced and recreated is not counted.
    pub fenced: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Every progress report, in order.
    pub progress: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl Replica {
    /// The progress reports so far.
    pub fn progress_lines(&self) -> Vec<serde_json::Value> {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// With `TIDEMARK_TEST_LOG_DIR` set, a file there that keeps process
/// `pid`'s stderr (its log and progress lines), for diagnosing a failed
/// soak after the fact.
pub fn replica_log(pid: u32) -> Option<std::fs::File> {
    process_log(&format!("tidemark-{pid}"))
}

/// With `TIDEMARK_TEST_LOG_DIR` set, a file `<name>.log` there for a
/// process's stderr.
pub fn process_log(name: &str) -> Option<std::fs::File> {
    let dir = std::env::var("TIDEMARK_TEST_LOG_DIR").ok()?;
    std::fs::create_dir_all(&dir).ok()?;
    std::fs::File::create(std::path::Path::new(&dir).join(format!("{name}.log"))).ok()
}

/// Starts `tidemark run FILE` (no instance id: it takes a state-directory
/// slot) and counts what its stderr reports.
pub fn start_replica(file: &std::path::Path) -> Replica {
    start_replica_as(file, None)
}

/// [`start_replica`] with instance id `instance` (`TIDEMARK_INSTANCE_ID`).
pub fn start_replica_as(file: &std::path::Path, instance: Option<&str>) -> Replica {
    use std::io::{BufRead, BufReader};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let mut child = tidemark_run(file, instance, std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let batches_with_input = Arc::new(AtomicUsize::new(0));
    let fenced = Arc::new(AtomicUsize::new(0));
    let progress = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (counter, fenced_lines, reports) =
        (batches_with_input.clone(), fenced.clone(), progress.clone());
    let mut log = replica_log(child.id());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(file) = log.as_mut() {
                use std::io::Write;
                let _ = writeln!(file, "{line}");
            }
            let lower = line.to_lowercase();
            // A static consumer fenced as its own predecessor (its session
            // timed out across a broker restart) is recreated by the runner
            // and is no shared id; a fenced producer would be one.
            let static_consumer =
                lower.contains("group.instance.id") || lower.contains("fencedinstanceid");
            if lower.contains("fenced") && !static_consumer {
                eprintln!("fenced: {line}");
                fenced_lines.fetch_add(1, Ordering::Relaxed);
            }
            let Ok(progress) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if progress["numInputRows"].as_u64().unwrap_or(0) > 0 {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            reports
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(progress);
        }
    });
    Replica {
        child,
        batches_with_input,
        fenced,
        progress,
    }
}

/// Checks that the Delta table `table` (as [`tidemark_integration_tests::read_delta`]
/// returns it) holds every window of [`assert_exact_windows`] once and complete;
/// `context` names the run in failures.
pub fn assert_exact_delta_windows(table: &serde_json::Value, partitions: i32, context: &str) {
    let mut seen = std::collections::BTreeMap::new();
    for row in table["rows"].as_array().unwrap() {
        let key = (
            row["id"].as_str().unwrap().to_string(),
            row["window_start"].as_str().unwrap().to_string(),
        );
        assert!(
            seen.insert(key.clone(), row.clone()).is_none(),
            "{context}: duplicate {key:?}"
        );
        assert_eq!(
            (row["n"].as_i64(), row["total"].as_f64()),
            (Some(12), Some(18.0)),
            "{context}: {row}"
        );
    }
    assert_eq!(
        seen.len(),
        expected_rows(partitions),
        "{context}: every window once"
    );
}

/// Whether the broker under test can be restarted (the one `scripts/kafka.sh`
/// manages); fails, saying why, when it cannot and
/// `TIDEMARK_TEST_NO_BROKER_RESTART` does not waive the restart.
pub fn broker_restartable() -> bool {
    let managed = kafka_script("status");
    assert!(
        managed || std::env::var("TIDEMARK_TEST_NO_BROKER_RESTART").is_ok(),
        "this test restarts the broker, which only works with the one scripts/kafka.sh manages; \
         set TIDEMARK_TEST_NO_BROKER_RESTART=1 to run it without the restart against another broker"
    );
    managed
}

/// Points the pipeline file `file` (from [`write_pipeline`]) at a Delta
/// table `table` next to it instead of its Kafka sink.
pub fn use_delta_sink(file: &std::path::Path) {
    let text = std::fs::read_to_string(file).unwrap();
    let delta = text.replace(
        "sink: {kind: kafka, topic: unused, key: [id]}",
        "sink: {kind: delta, path: table}",
    );
    assert_ne!(text, delta, "the pipeline's sink is `unused`");
    std::fs::write(file, delta).unwrap();
}

/// Gives each instance of the pipeline `file` (from [`write_pipeline`]) a
/// state directory of its own, `state-<TIDEMARK_INSTANCE_ID>` (`state-none`
/// for a process without an id), as replicas on separate machines have.
pub fn state_dir_per_instance(file: &std::path::Path) {
    let text = std::fs::read_to_string(file).unwrap();
    let own = text.replace(
        "state: {dir: state,",
        "state: {dir: \"state-${TIDEMARK_INSTANCE_ID:-none}\",",
    );
    assert_ne!(text, own, "the pipeline keeps its state in `state`");
    std::fs::write(file, own).unwrap();
}

/// A port free on 127.0.0.1 now (the OS's pick), for a process's listener.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
