//! The Delta sink, read back by an independent reader (the Python
//! `deltalake` package): each output mode, partitions, schema evolution and
//! its refusal, and the `txn` version that makes replays idempotent.

use std::path::Path;
use tidemark_integration_tests::read_delta;
use tidemark_pipeline::PipelineFile;

/// Runs a pipeline file over `batches` (one JSON-lines file each) in a
/// fresh directory; returns the directory.
fn run(yaml: &str, batches: &[&[&str]]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    run_in(dir.path(), yaml, batches).unwrap();
    dir
}

fn run_in(dir: &Path, yaml: &str, batches: &[&[&str]]) -> tidemark::error::Result<()> {
    // The files source keeps no progress across runs: each run reads only
    // the batches given to it.
    let input = dir.join("batches");
    let _ = std::fs::remove_dir_all(&input);
    std::fs::create_dir_all(&input).unwrap();
    for (i, lines) in batches.iter().enumerate() {
        std::fs::write(input.join(format!("{i:03}.jsonl")), lines.join("\n")).unwrap();
    }
    let file = PipelineFile::parse(yaml).unwrap();
    let connected = tidemark_connectors::connect(&file, dir)?;
    let (query, mut source, mut sink) = connected.wire(file.query_builder()?);
    query.build()?.run(source.as_mut(), sink.as_mut())?;
    Ok(())
}

/// Asserts that the table's history holds an OPTIMIZE commit.
fn assert_optimized(table: &serde_json::Value) {
    let history: Vec<&str> = table["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h.as_str())
        .collect();
    assert!(history.contains(&"OPTIMIZE"), "{history:?}");
}

fn rows_sorted(table: &serde_json::Value) -> Vec<String> {
    let mut rows: Vec<String> = table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.to_string())
        .collect();
    rows.sort();
    rows
}

const WINDOWED: &str = r#"
name: delta-windows
source: {kind: files, path: batches/, schema: {ts: timestamp, id: string, amount: long}}
event_time: ts
watermark: 1 minute
steps:
  - window_aggregate:
      keys: [id]
      window: {tumbling: 1 minute}
      aggregates: [{fn: count, as: n}, {fn: sum, column: amount, as: total}]
output_mode: OUTPUT_MODE
trigger: available_now
sink: {kind: delta, path: table, SINK_EXTRA}
"#;

fn windowed(mode: &str, extra: &str) -> String {
    WINDOWED
        .replace("OUTPUT_MODE", mode)
        .replace("SINK_EXTRA", extra)
}

const BATCH_0: &[&str] = &[
    r#"{"ts": "2026-01-01T10:00:10Z", "id": "a", "amount": 1}"#,
    r#"{"ts": "2026-01-01T10:00:20Z", "id": "a", "amount": 2}"#,
    r#"{"ts": "2026-01-01T10:00:30Z", "id": "b", "amount": 5}"#,
];
const BATCH_1: &[&str] = &[
    r#"{"ts": "2026-01-01T10:00:40Z", "id": "a", "amount": 4}"#,
    r#"{"ts": "2026-01-01T10:02:30Z", "id": "b", "amount": 7}"#,
];

#[test]
fn append_mode_writes_closed_windows_with_types_and_a_txn_per_batch() {
    let dir = run(&windowed("append", ""), &[BATCH_0, BATCH_1]);
    let app = tidemark::runtime::default_query_id("delta-windows");
    let table = read_delta(&dir.path().join("table"), Some(&app));
    // Watermark after batch 1: 10:02:30 - 1 min = 10:01:30, so [10:00, 10:01)
    // closes (a: 3 rows, 7; b: 1 row, 5); [10:02, 10:03) stays open.
    assert_eq!(
        rows_sorted(&table),
        vec![
            r#"{"id":"a","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":3,"total":7}"#,
            r#"{"id":"b","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":1,"total":5}"#,
        ],
        "{table}"
    );
    assert_eq!(table["schema"]["window_start"], "timestamp[us, tz=UTC]");
    assert_eq!(table["schema"]["n"], "int64");
    assert_eq!(table["schema"]["id"], "string");
    // The rows were emitted by the trailing no-data batch (id 2), the only
    // commit after the table's creation.
    assert_eq!(table["txn_version"], 2, "{table}");
    assert_eq!(table["version"], 1, "{table}");
}

#[test]
fn complete_mode_replaces_the_table_in_one_commit_per_batch() {
    let dir = run(&windowed("complete", ""), &[BATCH_0, BATCH_1]);
    let table = read_delta(&dir.path().join("table"), None);
    assert_eq!(
        rows_sorted(&table),
        vec![
            r#"{"id":"a","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":3,"total":7}"#,
            r#"{"id":"b","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":1,"total":5}"#,
            r#"{"id":"b","window_start":"2026-01-01T10:02:00Z","window_end":"2026-01-01T10:03:00Z","n":1,"total":7}"#,
        ],
        "{table}"
    );
    assert_eq!(
        table["files"].as_array().unwrap().len(),
        1,
        "the last overwrite's file only"
    );
    assert_eq!(table["version"], 2, "create, then one commit per batch");
}

#[test]
fn update_mode_changes_appends_every_emitted_row_with_its_batch() {
    let dir = run(&windowed("update", "mode: changes"), &[BATCH_0, BATCH_1]);
    let table = read_delta(&dir.path().join("table"), None);
    assert_eq!(
        rows_sorted(&table),
        vec![
            r#"{"id":"a","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":2,"total":3,"batch_id":0}"#,
            r#"{"id":"a","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":3,"total":7,"batch_id":1}"#,
            r#"{"id":"b","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":1,"total":5,"batch_id":0}"#,
            r#"{"id":"b","window_start":"2026-01-01T10:02:00Z","window_end":"2026-01-01T10:03:00Z","n":1,"total":7,"batch_id":1}"#,
        ],
        "{table}"
    );
}

#[test]
fn update_mode_upsert_keeps_the_latest_row_per_key() {
    let dir = run(&windowed("update", "mode: upsert"), &[BATCH_0, BATCH_1]);
    let table = read_delta(&dir.path().join("table"), None);
    // Keys default to the grouping: id and the window.
    assert_eq!(
        rows_sorted(&table),
        vec![
            r#"{"id":"a","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":3,"total":7}"#,
            r#"{"id":"b","window_start":"2026-01-01T10:00:00Z","window_end":"2026-01-01T10:01:00Z","n":1,"total":5}"#,
            r#"{"id":"b","window_start":"2026-01-01T10:02:00Z","window_end":"2026-01-01T10:03:00Z","n":1,"total":7}"#,
        ],
        "{table}"
    );
}

#[test]
fn partition_columns_lay_out_the_files() {
    let dir = run(
        &windowed("append", "partition_by: [id]"),
        &[BATCH_0, BATCH_1],
    );
    let table = read_delta(&dir.path().join("table"), None);
    assert_eq!(table["partition_columns"], serde_json::json!(["id"]));
    let files: Vec<&str> = table["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(files.iter().any(|f| f.contains("/id=a/")), "{files:?}");
    assert!(files.iter().any(|f| f.contains("/id=b/")), "{files:?}");
    assert_eq!(rows_sorted(&table).len(), 2);
}

const PASSTHROUGH: &str = r#"
name: delta-schema
source: {kind: files, path: batches/}
output_mode: append
trigger: available_now
sink: {kind: delta, path: table, merge_schema: MERGE}
"#;

#[test]
fn new_columns_are_added_with_merge_schema_and_refused_without() {
    let first: &[&str] = &[r#"{"a": "x", "b": 1}"#];
    let wider: &[&str] = &[r#"{"a": "y", "b": 2, "c": 2.5}"#];

    let dir = run(&PASSTHROUGH.replace("MERGE", "true"), &[first, wider]);
    let table = read_delta(&dir.path().join("table"), None);
    assert_eq!(table["schema"]["c"], "double");
    assert_eq!(
        rows_sorted(&table),
        vec![r#"{"a":"x","b":1,"c":null}"#, r#"{"a":"y","b":2,"c":2.5}"#]
    );

    let dir = tempfile::tempdir().unwrap();
    let yaml = PASSTHROUGH.replace("MERGE", "false");
    run_in(dir.path(), &yaml, &[first]).unwrap();
    let err = run_in(dir.path(), &yaml, &[wider])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("`c`") && err.contains("merge_schema"), "{err}");
    let err = run_in(
        dir.path(),
        &yaml,
        &[&[r#"{"a": "z", "b": "not a number"}"#]],
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("column `b`: the table has long, the rows have string"),
        "{err}"
    );
    let table = read_delta(&dir.path().join("table"), None);
    assert_eq!(
        rows_sorted(&table),
        vec![r#"{"a":"x","b":1}"#],
        "nothing written"
    );
}

#[test]
fn small_files_are_compacted_and_the_log_checkpointed_without_losing_rows() {
    use tidemark::row::{Row, Value};
    use tidemark::runtime::Sink;
    use tidemark_connectors::delta::{DeltaSink, DeltaSinkConfig, DeltaWriteMode};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small");
    let mut config = DeltaSinkConfig::new(path.to_str().unwrap(), "app", DeltaWriteMode::Append);
    config.compact_min_files = 5;
    config.checkpoint_every = 3;
    let mut sink = DeltaSink::new(config).unwrap();
    for batch in 0..12u64 {
        let rows: Vec<Row> = (0..10)
            .map(|i| {
                let mut r = Row::new();
                r.set("batch", Value::Long(batch as i64));
                r.set("i", Value::Long(i));
                r
            })
            .collect();
        sink.write(batch, &rows).unwrap();
        sink.commit(batch).unwrap();
    }
    // Append tables compact on a thread beside the commits.
    sink.wait_for_compaction();
    let table = read_delta(&path, Some("app"));
    assert_eq!(table["rows"].as_array().unwrap().len(), 120, "{table}");
    let files = table["files"].as_array().unwrap().len();
    assert!(files < 5, "{files} files after compaction: {table}");
    assert_optimized(&table);
    assert_eq!(table["txn_version"], 11);
    let checkpoints = std::fs::read_dir(path.join("_delta_log"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().contains(".checkpoint."))
        })
        .count();
    assert!(checkpoints >= 1, "a Delta checkpoint was written");
}

/// Another writer's OPTIMIZE between two batches of a running upsert
/// query (#44 item 4) moves every key into one new file: the sink's key
/// index, built once, would point at the files OPTIMIZE removed and leave
/// the old rows beside the new ones. The sink sees the foreign commit,
/// rebuilds its index, and the table keeps one row per key, read back by
/// the Python `deltalake` package.
#[test]
fn a_foreign_optimize_during_an_upsert_query_keeps_one_row_per_key() {
    use tidemark::runtime::Sink;
    use tidemark_connectors::delta::{DeltaSink, DeltaSinkConfig, DeltaWriteMode};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("upserted");
    let mode = DeltaWriteMode::Upsert {
        keys: vec!["id".to_string()],
    };
    let mut sink =
        DeltaSink::new(DeltaSinkConfig::new(path.to_str().unwrap(), "app", mode)).unwrap();
    let mut commit = |batch: u64, rows: &[(&str, i64)]| {
        sink.write(batch, &id_rows(rows)).unwrap();
        sink.commit(batch).unwrap();
    };
    commit(0, &[("a", 1)]);
    commit(1, &[("b", 1)]);
    commit(2, &[("c", 1)]);
    let optimized = tidemark_integration_tests::optimize_delta(&path);
    assert_eq!(
        optimized["metrics"]["numFilesRemoved"], 3,
        "OPTIMIZE compacted the three files: {optimized}"
    );
    commit(3, &[("a", 2), ("b", 2)]);
    commit(4, &[("a", 3)]);
    drop(sink);
    let table = read_delta(&path, Some("app"));
    assert_eq!(
        rows_sorted(&table),
        vec![
            r#"{"id":"a","v":3}"#,
            r#"{"id":"b","v":2}"#,
            r#"{"id":"c","v":1}"#,
        ],
        "{table}"
    );
    assert_eq!(table["txn_version"], 4);
    assert_optimized(&table);
}

/// Rows `(id, v)` for the sink.
fn id_rows(rows: &[(&str, i64)]) -> Vec<tidemark::row::Row> {
    use tidemark::row::{Row, Value};
    rows.iter()
        .map(|(id, v)| {
            let mut r = Row::new();
            r.set("id", Value::Str((*id).into()));
            r.set("v", Value::Long(*v));
            r
        })
        .collect()
}

/// The Parquet files directly under `table`.
fn data_files(table: &Path) -> std::collections::BTreeSet<String> {
    std::fs::read_dir(table)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".parquet"))
        .collect()
}

/// A one-instance writer that crashed between writing a commit's files
/// and committing them (#44 item 10) left files nothing references: the
/// next start removes them, and keeps those of a commit that did land.
#[test]
fn the_files_of_a_commit_that_never_happened_are_removed_at_the_next_start() {
    use tidemark::runtime::Sink;
    use tidemark_connectors::delta::{DeltaSink, DeltaSinkConfig, DeltaWriteMode};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    let config = DeltaSinkConfig::new(path.to_str().unwrap(), "app", DeltaWriteMode::Append);
    let mut sink = DeltaSink::new(config.clone()).unwrap();
    sink.write(0, &id_rows(&[("a", 1)])).unwrap();
    sink.commit(0).unwrap();
    drop(sink);
    let committed = data_files(&path);
    assert_eq!(committed.len(), 1, "{committed:?}");
    assert!(
        !path.join("_tidemark/pending/app.json").exists(),
        "a landed commit's record stays"
    );
    // What a crash before the commit leaves: the files, and their record
    // (with a committed file among them: a commit that did land).
    let live = committed.iter().next().unwrap().clone();
    std::fs::copy(path.join(&live), path.join("part-never-committed.parquet")).unwrap();
    std::fs::create_dir_all(path.join("_tidemark/pending")).unwrap();
    std::fs::write(
        path.join("_tidemark/pending/app.json"),
        serde_json::to_vec(&["part-never-committed.parquet", live.as_str()]).unwrap(),
    )
    .unwrap();
    let sink = DeltaSink::new(config).unwrap();
    drop(sink);
    assert_eq!(
        data_files(&path),
        committed,
        "the unreferenced file is gone, the live one kept"
    );
    assert!(!path.join("_tidemark/pending/app.json").exists());
    let table = read_delta(&path, Some("app"));
    assert_eq!(rows_sorted(&table), vec![r#"{"id":"a","v":1}"#], "{table}");
}

/// A zombie that staged a partition's commit and was fenced before
/// publishing (several instances, task commits; #44 item 10) leaves a
/// staged entry and its files. Once the partition's new owner published
/// that sequence, the next sweep removes both, and the table keeps the
/// owner's rows only (read back by the Python reader).
#[test]
fn a_fenced_zombies_staged_files_are_removed_once_the_owner_published() {
    use std::collections::BTreeMap;
    use tidemark::runtime::Sink;
    use tidemark_connectors::delta::{DeltaSink, DeltaSinkConfig, DeltaWriteMode};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    let mut config = DeltaSinkConfig::new(path.to_str().unwrap(), "q", DeltaWriteMode::Append);
    config.task_commits = true;
    let seqs: BTreeMap<i32, u64> = [(0, 0)].into();
    // The zombie stages partition 0's first commit, then is fenced.
    let mut zombie = DeltaSink::new(config.clone()).unwrap();
    zombie
        .write_tasks(0, &id_rows(&[("zombie", 1)]), &[(0, 1)])
        .unwrap();
    zombie.prepare(0, &seqs).unwrap();
    drop(zombie);
    let zombies_files = data_files(&path);
    assert_eq!(zombies_files.len(), 1);
    // The new owner does the batch again and publishes it.
    let mut owner = DeltaSink::new(config.clone()).unwrap();
    owner
        .write_tasks(0, &id_rows(&[("owner", 1)]), &[(0, 1)])
        .unwrap();
    owner.prepare(0, &seqs).unwrap();
    owner.publish(0).unwrap();
    drop(owner);
    let staged = |p: &Path| {
        std::fs::read_dir(p.join("_tidemark/staged"))
            .unwrap()
            .count()
    };
    assert_eq!(staged(&path), 1, "the zombie's entry is left");
    assert_eq!(data_files(&path).len(), 2);
    // The next start sweeps.
    drop(DeltaSink::new(config).unwrap());
    assert_eq!(staged(&path), 0, "the zombie's entry is removed");
    let left = data_files(&path);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left.is_disjoint(&zombies_files),
        "the zombie's file is removed"
    );
    let table = read_delta(&path, None);
    assert_eq!(
        rows_sorted(&table),
        vec![r#"{"id":"owner","v":1}"#],
        "{table}"
    );
}

const STATELESS: &str = r#"
name: delta-stateless
source: {kind: files, path: batches/, schema: {ts: timestamp, id: string, amount: long, price: double}}
steps:
  - filter: "amount >= 2"
  - with_column: {name: cents, expr: "price * 100"}
output_mode: update
trigger: available_now
sink: {kind: delta, path: table, mode: changes}
"#;

/// Filters and computed columns alone run on the columns to the sink,
/// which writes the columnar batches to the table as they are, with the
/// batch id of each row (update output mode, changes): read back by the Python reader.
#[test]
fn a_stateless_pipeline_writes_its_columns_to_the_table() {
    let first: &[&str] = &[
        r#"{"ts": "2026-01-01T10:00:10Z", "id": "a", "amount": 1, "price": 0.5}"#,
        r#"{"ts": "2026-01-01T10:00:20.250Z", "id": "b\"é", "amount": 2, "price": 1.25}"#,
        r#"{"ts": "2026-01-01T10:00:30Z", "amount": 3}"#,
    ];
    let second: &[&str] =
        &[r#"{"ts": "2026-01-01T10:01:00Z", "id": "c", "amount": 9, "price": 2}"#];
    let dir = run(STATELESS, &[first, second]);
    let table = read_delta(&dir.path().join("table"), None);
    assert_eq!(table["schema"]["cents"], "double", "{table}");
    assert_eq!(table["schema"]["ts"], "timestamp[us, tz=UTC]", "{table}");
    assert_eq!(
        rows_sorted(&table),
        vec![
            r#"{"ts":"2026-01-01T10:00:20.250000Z","id":"b\"é","amount":2,"price":1.25,"cents":125.0,"batch_id":0}"#,
            r#"{"ts":"2026-01-01T10:00:30Z","id":null,"amount":3,"price":null,"cents":null,"batch_id":0}"#,
            r#"{"ts":"2026-01-01T10:01:00Z","id":"c","amount":9,"price":2.0,"cents":200.0,"batch_id":1}"#,
        ],
        "{table}"
    );
}
