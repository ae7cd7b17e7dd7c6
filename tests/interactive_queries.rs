//! Interactive queries from the library: a pipeline on the files source
//! runs on a thread while the test reads its stores by key through
//! [`PipelineRunner::state_reader`] (its `serve:` needs no broker: one
//! process reads the files and holds every key).

use std::time::{Duration, Instant};
use tidemark::prelude::Value;
use tidemark::runtime::{KeyLookup, StopHandle};
use tidemark_connectors::PipelineRunner;
use tidemark_pipeline::PipelineFile;

const PIPELINE: &str = r#"name: iq-files
source: {kind: files, path: in, pattern: "*.jsonl",
         schema: {event_time: timestamp, id: string, amount: long}}
event_time: event_time
watermark: 10 minutes
steps:
  - dedup: {keys: [id, amount]}
  - window_aggregate:
      keys: [id]
      window: {tumbling: 1 hour}
      aggregates: [{fn: count, as: n}, {fn: sum, column: amount, as: total}]
output_mode: update
trigger: {micro_batch: 100 milliseconds}
sink: {kind: jsonl, path: out.jsonl}
serve: {listen: "127.0.0.1:0"}
"#;

fn lines(rows: &[(&str, &str, i64)]) -> String {
    rows.iter()
        .map(|(t, id, amount)| {
            format!(r#"{{"event_time": "2026-01-01T{t}:00Z", "id": "{id}", "amount": {amount}}}"#)
                + "\n"
        })
        .collect()
}

/// Reads `key` in `store` until `check` accepts the answer.
fn read_until(
    reader: &tidemark::runtime::StateReader,
    store: &str,
    key: &[Value],
    check: impl Fn(&KeyLookup) -> bool,
) -> KeyLookup {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = reader.store(store).and_then(|s| s.get(key));
        if let Ok(lookup) = &answer {
            if check(lookup) {
                return lookup.clone();
            }
        }
        assert!(Instant::now() < deadline, "never: {answer:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn window_of(lookup: &KeyLookup) -> Option<(i64, i64)> {
    let KeyLookup::Found { rows, .. } = lookup else {
        return None;
    };
    let row = rows.first()?.to_json();
    Some((row["n"].as_i64()?, row["total"].as_i64()?))
}

#[test]
fn a_running_pipelines_stores_are_read_by_key_and_follow_its_batches() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    std::fs::write(
        dir.path().join("in/1.jsonl"),
        lines(&[
            ("10:01", "a", 5),
            ("10:02", "a", 7),
            ("10:03", "b", 1),
            ("10:04", "a", 5),
        ]),
    )
    .unwrap();
    let stop = StopHandle::default();
    let runner = PipelineRunner::new(PipelineFile::parse(PIPELINE).unwrap(), dir.path())
        .stop_handle(stop.clone());
    let reader = runner.state_reader();
    let running = std::thread::spawn(move || runner.run());

    let stores = read_until(&reader, "op1", &[Value::from("a")], |l| {
        window_of(l).is_some()
    });
    // The duplicate (a, 5) counts once.
    assert_eq!(window_of(&stores), Some((2, 12)));
    let held = reader
        .store("op0")
        .unwrap()
        .get(&[Value::from("a"), Value::Long(5)])
        .unwrap();
    assert!(matches!(held, KeyLookup::Found { .. }), "{held:?}");
    let missing = reader
        .store("op1")
        .unwrap()
        .get(&[Value::from("z")])
        .unwrap();
    assert!(matches!(missing, KeyLookup::NotHere { .. }), "{missing:?}");
    assert!(reader.store("op7").is_err());

    // A later file moves the state on; the reader sees it.
    std::fs::write(dir.path().join("in/2.jsonl"), lines(&[("10:30", "a", 1)])).unwrap();
    let moved = read_until(&reader, "op1", &[Value::from("a")], |l| {
        window_of(l) == Some((3, 13))
    });
    assert_eq!(window_of(&moved), Some((3, 13)));

    stop.stop();
    running.join().unwrap().unwrap();
    let after = reader.stores().unwrap_err();
    assert!(after.is_retryable(), "{after}");
}
