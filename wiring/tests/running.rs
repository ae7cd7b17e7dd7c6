//! A pipeline run inside a service (#45 item 6): `start` hands back a
//! handle that reports the run's state as it moves, stops it cleanly within
//! a deadline, and is awaited from tokio; a run that fails reports why.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::runtime::RunState;
use tidemark_connectors::PipelineRunner;
use tidemark_pipeline::PipelineFile;

/// A files → JSON lines pipeline in `dir`, its input one file of `rows`
/// rows for key `a`; `source_extra` is added to the source's settings.
fn pipeline(dir: &Path, rows: usize, source_extra: &str) -> PipelineFile {
    std::fs::create_dir_all(dir.join("in")).unwrap();
    let lines: String = (0..rows)
        .map(|i| {
            format!(
                "{{\"ts\": \"2026-01-01T10:00:{:02}Z\", \"id\": \"a\"}}\n",
                i % 60
            )
        })
        .collect();
    std::fs::write(dir.join("in/000.jsonl"), lines).unwrap();
    PipelineFile::parse(&format!(
        r#"name: running
source: {{kind: files, path: in, schema: {{ts: timestamp, id: string}}{source_extra}}}
event_time: ts
watermark: 1 minute
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}]
output_mode: update
trigger: {{micro_batch: 100 milliseconds}}
sink: {{kind: jsonl, path: out.jsonl}}
state_dir: state
"#
    ))
    .unwrap()
}

#[test]
fn a_started_pipeline_becomes_ready_then_stops_within_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let running = PipelineRunner::new(pipeline(dir.path(), 3, ""), dir.path())
        .start()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    running
        .status()
        .on_change(move |_, to| record.lock().unwrap().push(to.clone()));
    let state = running
        .status()
        .wait_until(Duration::from_secs(60), RunState::is_ready);
    assert_eq!(state, RunState::Running);
    // Its first batch is written while it runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(dir.path().join("out.jsonl"))
        .is_ok_and(|out| out.contains("\"n\":3"))
    {
        assert!(std::time::Instant::now() < deadline, "no output");
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = running.status().clone();
    let summary = running.stop_within(Duration::from_secs(30)).unwrap();
    assert_eq!(summary.input_records, 3);
    assert_eq!(status.state(), RunState::Stopped);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen.last(),
        Some(&RunState::Stopped),
        "the listener saw the end: {seen:?}"
    );
    assert!(seen.contains(&RunState::Stopping), "{seen:?}");
}

#[test]
fn a_run_is_awaited_from_tokio_and_a_failed_run_says_why() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // A file past `source.max_file_mb` fails the run for good.
    let dir = tempfile::tempdir().unwrap();
    let file = pipeline(dir.path(), 40_000, ", max_file_mb: 1");
    let running = PipelineRunner::new(file, dir.path()).start().unwrap();
    let status = running.status().clone();
    let error = runtime.block_on(running.join()).unwrap_err().to_string();
    assert!(error.contains("source.max_file_mb"), "{error}");
    match status.state() {
        RunState::Failed(reason) => assert!(reason.contains("source.max_file_mb"), "{reason}"),
        other => panic!("not failed: {other:?}"),
    }

    // A clean run awaited the same way.
    let dir = tempfile::tempdir().unwrap();
    let running = PipelineRunner::new(pipeline(dir.path(), 2, ""), dir.path())
        .start()
        .unwrap();
    running
        .status()
        .wait_until(Duration::from_secs(60), RunState::is_ready);
    running.stop();
    let summary = runtime.block_on(running.join()).unwrap();
    assert_eq!(summary.input_records, 2);
}
