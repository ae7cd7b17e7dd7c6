//! `tidemark reset` against the real broker (#45 item 6): a pipeline run to
//! its end, then reset, runs again over all of its input, on fresh state
//! (the windows count each row once more, not on top of the old counts);
//! `--dry-run` changes nothing; a running instance makes it refuse; a reset
//! by a file whose chain changed since still deletes the changelogs the
//! committed checkpoints name.

mod common;

use common::*;
use std::process::Output;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

fn pipeline(app: &str, input: &str, output: &str, trigger: &str) -> String {
    format!(
        r#"name: {app}
source:
  kind: kafka
  topic: {input}
  keyed_by: [id]
  schema: {{event_time: timestamp, id: string}}
  properties: {{session.timeout.ms: "6000"}}
event_time: event_time
watermark: 10 seconds
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 hour}}
      aggregates: [{{fn: count, as: n}}]
output_mode: update
trigger: {trigger}
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
"#
    )
}

fn reset(file: &std::path::Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("reset")
        .args(args)
        .arg(file)
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .output()
        .unwrap()
}

/// The last `n` of each id among `records`.
fn last_counts(records: &[(String, i64)]) -> std::collections::BTreeMap<String, i64> {
    records.iter().cloned().collect()
}

/// `(id, n)` of each output record, in order.
fn counts(output: &str) -> Vec<(String, i64)> {
    consume_uncommitted(output, Duration::from_secs(5))
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            (
                v["id"].as_str().unwrap().to_string(),
                v["n"].as_i64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_reset_pipeline_runs_again_over_all_its_input_on_fresh_state() {
    let (input, output, app) = (unique("reset-in"), unique("reset-out"), unique("reset"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let rows: Vec<(String, Vec<u8>)> = ["a", "b", "a"]
        .iter()
        .map(|id| {
            let value = format!(r#"{{"event_time": "2026-01-01T10:00:00Z", "id": "{id}"}}"#);
            (id.to_string(), value.into_bytes())
        })
        .collect();
    produce(&input, &rows);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");

    // A running instance: the reset refuses.
    std::fs::write(
        &file,
        pipeline(&app, &input, &output, "{micro_batch: 200 milliseconds}"),
    )
    .unwrap();
    let expected: std::collections::BTreeMap<String, i64> =
        [("a".to_string(), 2), ("b".to_string(), 1)].into();
    let mut running = start_replica(&file);
    let deadline = Instant::now() + Duration::from_secs(120);
    while last_counts(&counts(&output)) != expected {
        assert!(
            Instant::now() < deadline,
            "the first run never counted its input"
        );
    }
    let refused = reset(&file, &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("active member"), "{stderr}");
    interrupt(&mut running.child);
    let first = counts(&output);
    assert_eq!(last_counts(&first), expected, "{first:?}");
    let state = dir.path().join("state").join(&app);
    assert!(state.exists());

    // A dry run names what it would do and does nothing. A stopped static
    // member stays in the group until its session times out (6 s here).
    // The file now puts a filter before the window, whose store it names
    // `op1`: the run's `op0` changelog is found in its checkpoints.
    let shifted = pipeline(&app, &input, &output, "available_now")
        .replace("steps:\n", "steps:\n  - filter: \"id IS NOT NULL\"\n");
    std::fs::write(&file, shifted).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let planned = loop {
        let planned = reset(&file, &["--dry-run"]);
        if planned.status.success() || Instant::now() > deadline {
            break planned;
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let plan = String::from_utf8_lossy(&planned.stdout);
    assert!(
        planned.status.success(),
        "{}",
        String::from_utf8_lossy(&planned.stderr)
    );
    assert!(
        plan.contains(&format!("offsets of group `{app}` on {input}")),
        "{plan}"
    );
    assert!(
        plan.contains(&format!("delete topic `{app}-op0-changelog`")),
        "{plan}"
    );
    assert!(plan.contains("remove state directory"), "{plan}");
    assert!(
        dir.path().join("state").exists(),
        "a dry run removed the state"
    );

    let done = reset(&file, &[]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(!state.exists());

    // Run again to the end: all of the input, counted from nothing.
    std::fs::write(&file, pipeline(&app, &input, &output, "available_now")).unwrap();
    let run = run_to_end(&file);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let all = counts(&output);
    let again = &all[first.len()..];
    // Without the offsets reset nothing would be read again; without the
    // state reset `a` would count 4.
    assert_eq!(last_counts(again), expected, "{all:?}");
}
