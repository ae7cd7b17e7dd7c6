//! A task restoring its state never stops the instance's other tasks: on a
//! real broker, partition 1's restore is held at a gate while partition 0
//! keeps producing results; once the gate opens, partition 1 catches up and
//! every count is exact.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tidemark::error::Result;
use tidemark::pipeline::PipelineFile;
use tidemark::progress::QueryProgress;
use tidemark::runtime::{PendingStore, StateBackend, StopHandle};
use tidemark_integration_tests::*;
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

#[test]
fn a_restoring_task_does_not_stop_the_other_partitions() {
    let (input, output, app) = (unique("clicks"), unique("counts"), unique("restoring"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"name: {app}
processing_guarantee: exactly_once
source:
  kind: kafka
  topic: {input}
  schema: {{ts: timestamp, user: string}}
event_time: ts
watermark: 1 hour
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
    );
    let timeout = Duration::from_secs(90);

    // Run 1 counts ten events of `a` (partition 0) and ten of `b`
    // (partition 1) into their changelogs.
    produce_to(&input, Some(0), &events("a", 0..10));
    produce_to(&input, Some(1), &events("b", 0..10));
    let stop = StopHandle::default();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let run = start(&yaml, dir.path(), &stop, None, reports.clone());
    let out = consume_until(&output, timeout, |rows| {
        count_of(rows, "a") == 10 && count_of(rows, "b") == 10
    });
    assert_eq!(latest_counts(&out).len(), 2, "{out:?}");
    stop.stop();
    run.join().unwrap();

    // Run 2 starts without local state: both tasks restore from their
    // changelogs, and partition 1's restore waits at the gate.
    std::fs::remove_dir_all(dir.path().join("state")).unwrap();
    produce_to(&input, Some(0), &events("a", 10..15));
    produce_to(&input, Some(1), &events("b", 10..15));
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let stop = StopHandle::default();
    let reports = Arc::new(Mutex::new(Vec::new()));
    let run = start(
        &yaml,
        dir.path(),
        &stop,
        Some((1, gate.clone())),
        reports.clone(),
    );
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
    {
        let (open, changed) = &*gate;
        *open.lock().unwrap() = true;
        changed.notify_all();
    }
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
