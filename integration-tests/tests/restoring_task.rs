//! On a real broker, partition 1's restore is held at a gate. Under
//! per-partition watermarks a task restoring its state never stops the
//! instance's other tasks: partition 0 keeps producing results, and once
//! the gate opens partition 1 catches up and every count is exact. Under
//! Spark's query-wide watermark the batch waits for the restore instead:
//! partition 0 going on would move the watermark past partition 1's rows.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tidemark::error::Result;
use tidemark::progress::QueryProgress;
use tidemark::runtime::{PendingStore, StateBackend, StopHandle};
use tidemark_integration_tests::*;
use tidemark_pipeline::PipelineFile;
use tidemark_state::StateStore;

/// Opened (`true`) by the test; restores wait on it.
type Gate = Arc<(Mutex<bool>, Condvar)>;

/// Delegates to a real backend, but the restore of one partition's stores
/// waits until the test opens the gate.
struct GatedBackend {
    inner: Box<dyn StateBackend>,
    gated_partition: i32,
    gate: Gate,
}

impl StateBackend for GatedBackend {
    fn open(&mut self, partition: i32, name: &str) -> Result<Box<dyn StateStore>> {
        self.open_deferred(partition, name)?()
    }
    fn open_deferred(&mut self, partition: i32, name: &str) -> Result<PendingStore> {
        let restore = self.inner.open_deferred(partition, name)?;
        if partition != self.gated_partition {
            return Ok(restore);
        }
        let gate = self.gate.clone();
        Ok(Box::new(move || {
            let (open, changed) = &*gate;
            let mut is_open = open.lock().unwrap();
            while !*is_open {
                is_open = changed.wait(is_open).unwrap();
            }
            drop(is_open);
            restore()
        }))
    }
    fn commit(&mut self) -> Result<()> {
        self.inner.commit()
    }
    fn cache_bytes(&self) -> Option<usize> {
        self.inner.cache_bytes()
    }
    fn close(&mut self, partition: i32) -> Result<()> {
        self.inner.close(partition)
    }
    fn between_batches(&mut self) -> Result<()> {
        self.inner.between_batches()
    }
    fn take_restore_stats(&mut self) -> tidemark::runtime::RestoreStats {
        self.inner.take_restore_stats()
    }
}

fn event(minute: i64, user: &str) -> (String, Vec<u8>) {
    let t = tidemark::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap() + minute * 60_000_000;
    let value = serde_json::json!({"ts": tidemark::time::format_rfc3339(t), "user": user});
    (user.to_string(), value.to_string().into_bytes())
}

fn events(user: &str, minutes: std::ops::Range<i64>) -> Vec<(String, Vec<u8>)> {
    minutes.map(|m| event(m, user)).collect()
}

/// Runs the pipeline on a thread until `stop` is called; restores of
/// `gated_partition` wait for `gate`.
fn start(
    yaml: &str,
    dir: &Path,
    stop: &StopHandle,
    gate: Option<(i32, Gate)>,
    reports: Arc<Mutex<Vec<QueryProgress>>>,
) -> std::thread::JoinHandle<()> {
    let file = PipelineFile::parse(yaml).unwrap();
    let mut connected = tidemark_connectors::connect(&file, dir).unwrap();
    if let Some((gated_partition, gate)) = gate {
        let inner = connected.state_backend.take().expect("a state backend");
        connected.state_backend = Some(Box::new(GatedBackend {
            inner,
            gated_partition,
            gate,
        }));
    }
    let (query, mut source, mut sink) = connected.wire(file.query_builder().unwrap());
    let query = query
        .on_progress(move |p: &QueryProgress| reports.lock().unwrap().push(p.clone()))
        .build()
        .unwrap()
        .with_stop_handle(stop.clone());
    std::thread::spawn(move || {
        query.run(source.as_mut(), sink.as_mut()).unwrap();
    })
}

/// The largest count written for each user.
fn latest_counts(rows: &[Consumed]) -> std::collections::BTreeMap<String, i64> {
    let mut counts = std::collections::BTreeMap::new();
    for r in rows {
        let row: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        let user = row["user"].as_str().unwrap().to_string();
        let n = row["n"].as_i64().unwrap();
        let slot = counts.entry(user).or_insert(n);
        *slot = (*slot).max(n);
    }
    counts
}

fn count_of(rows: &[Consumed], user: &str) -> i64 {
    latest_counts(rows).get(user).copied().unwrap_or(0)
}

/// An exactly-once pipeline counting each user's events per hour, with
/// state restored from changelogs, under the watermark `scope`.
fn hourly_counts(app: &str, input: &str, output: &str, scope: &str) -> String {
    format!(
        r#"name: {app}
processing_guarantee: exactly_once
source:
  kind: kafka
  topic: {input}
  schema: {{ts: timestamp, user: string}}
event_time: ts
watermark: 1 hour
watermark_scope: {scope}
steps:
  - window_aggregate:
      keys: [user]
      window: {{tumbling: 1 hour}}
      aggregates: [{{fn: count, as: n}}]
output_mode: update
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, key: [user]}}
state: {{dir: state, changelog: true, memory_mb: 64}}
"#
    )
}

/// Runs the pipeline until it has counted ten events of `a` (partition 0)
/// and ten of `b` (partition 1) in the 10:00 window, into the changelogs;
/// returns the output read.
fn count_ten_of_each(yaml: &str, dir: &Path, input: &str, output: &str) -> Vec<Consumed> {
    produce_to(input, Some(0), &events("a", 0..10));
    produce_to(input, Some(1), &events("b", 0..10));
    let stop = StopHandle::default();
    let run = start(yaml, dir, &stop, None, Arc::default());
    let out = consume_until(output, Duration::from_secs(90), |rows| {
        count_of(rows, "a") == 10 && count_of(rows, "b") == 10
    });
    stop.stop();
    run.join().unwrap();
    out
}

/// What a run started by [`start_gated`] hands back: the gate, the stop
/// handle, the progress reports and the run's thread.
type GatedRun = (
    Gate,
    StopHandle,
    Arc<Mutex<Vec<QueryProgress>>>,
    std::thread::JoinHandle<()>,
);

/// Starts the pipeline with partition 1's restore waiting at a closed gate.
fn start_gated(yaml: &str, dir: &Path) -> GatedRun {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let stop = StopHandle::default();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let run = start(yaml, dir, &stop, Some((1, gate.clone())), reports.clone());
    (gate, stop, reports, run)
}

/// Lets the gated restore go on.
fn open_gate(gate: &Gate) {
    let (open, changed) = &**gate;
    *open.lock().unwrap() = true;
    changed.notify_all();
}

#[test]
fn a_restoring_task_does_not_stop_the_other_partitions() {
    let (input, output, app) = (unique("clicks"), unique("counts"), unique("restoring"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let yaml = hourly_counts(&app, &input, &output, "partition");
    let timeout = Duration::from_secs(90);

    // Run 1 counts ten events of `a` and of `b` into their changelogs.
    let out = count_ten_of_each(&yaml, dir.path(), &input, &output);
    assert_eq!(latest_counts(&out).len(), 2, "{out:?}");

    // Run 2 starts without local state: both tasks restore from their
    // changelogs, and partition 1's restore waits at the gate.
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    produce_to(&input, Some(0), &events("a", 10..15));
    produce_to(&input, Some(1), &events("b", 10..15));
    let (gate, stop, reports, run) = start_gated(&yaml, dir.path());
    let out = consume_until(&output, timeout, |rows| count_of(rows, "a") == 15);
    assert_eq!(count_of(&out, "a"), 15, "partition 0 went on: {out:?}");
    // More input for partition 0 is processed too, batch after batch.
    produce_to(&input, Some(0), &events("a", 15..20));
    let out = consume_until(&output, timeout, |rows| count_of(rows, "a") == 20);
    assert_eq!(count_of(&out, "a"), 20, "{out:?}");
    assert_eq!(
        count_of(&out, "b"),
        10,
        "partition 1 waits for its state: {out:?}"
    );

    // The restore ends: partition 1 resumes from its committed offset and
    // adds its five new events to the ten restored.
    open_gate(&gate);
    let out = consume_until(&output, timeout, |rows| count_of(rows, "b") == 15);
    stop.stop();
    run.join().unwrap();
    let counts = latest_counts(&out);
    assert_eq!(counts.get("a"), Some(&20), "{out:?}");
    assert_eq!(counts.get("b"), Some(&15), "{out:?}");
    let restored: u64 = reports
        .lock()
        .unwrap()
        .iter()
        .flat_map(|p| &p.state_operators)
        .filter_map(|s| s.custom_metrics.get("numRestoredRecords"))
        .sum();
    assert!(restored >= 2, "both keys restored, {restored} records");
    for (committed, end) in committed_and_end(&app, &input, 2) {
        assert_eq!(committed, end, "every input record committed");
    }
}

/// The largest count written for `user`'s window starting at `start`.
fn window_count(rows: &[Consumed], user: &str, start: &str) -> i64 {
    rows.iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(r.value.as_deref()?).ok())
        .filter(|row| row["user"] == user && row["window_start"] == start)
        .filter_map(|row| row["n"].as_i64())
        .max()
        .unwrap_or(0)
}

#[test]
fn under_the_query_wide_watermark_the_batch_waits_for_every_restore() {
    let (input, output, app) = (unique("clicks"), unique("counts"), unique("restore-wait"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let yaml = hourly_counts(&app, &input, &output, "query");
    let timeout = Duration::from_secs(90);

    // Run 1 counts ten events of `a` and of `b` into their changelogs.
    count_ten_of_each(&yaml, dir.path(), &input, &output);

    // Run 2 restores both tasks, partition 1's behind the gate. Partition
    // 0's new events are three hours on: had its task gone on without
    // partition 1, the watermark (one for the query, 1 hour behind)
    // would pass the 10:00 window before partition 1's five new events in
    // it were read, and they would be dropped as late.
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    produce_to(&input, Some(0), &events("a", 180..185));
    produce_to(&input, Some(1), &events("b", 10..15));
    let (gate, stop, reports, run) = start_gated(&yaml, dir.path());
    std::thread::sleep(Duration::from_secs(3));
    open_gate(&gate);
    let out = consume_until(&output, timeout, |rows| {
        count_of(rows, "b") == 15 && window_count(rows, "a", "2026-01-01T13:00:00Z") == 5
    });
    stop.stop();
    run.join().unwrap();
    assert_eq!(count_of(&out, "b"), 15, "no row of b late: {out:?}");
    assert_eq!(
        window_count(&out, "a", "2026-01-01T13:00:00Z"),
        5,
        "{out:?}"
    );
    let late: u64 = reports
        .lock()
        .unwrap()
        .iter()
        .flat_map(|p| &p.state_operators)
        .map(|s| s.num_rows_dropped_by_watermark)
        .sum();
    assert_eq!(late, 0, "no row dropped by the watermark");
}
