//! Conformance scenarios: each folder of `tests/conformance/` holds a
//! pipeline file, its input batches (one file per micro-batch, replayed with
//! a virtual clock) and the output Spark gives, worked by hand from the
//! seeds' rules (see each scenario's README.md). The runner replays the
//! pipeline through the same path as `tidemark run` and compares, batch by
//! batch, the rows and the progress fields listed in `expected_progress.jsonl`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tidemark::progress::QueryProgress;
use tidemark_pipeline::PipelineFile;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    match std::fs::read_to_string(path) {
        Ok(text) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display()))
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Rows grouped by batch, each batch sorted, so order within a batch (which
/// Spark does not define) does not matter.
fn by_batch(rows: Vec<serde_json::Value>) -> BTreeMap<u64, Vec<String>> {
    let mut out: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for row in rows {
        let batch = row["batch_id"].as_u64().expect("every row has batch_id");
        out.entry(batch).or_default().push(row.to_string());
    }
    for rows in out.values_mut() {
        rows.sort();
    }
    out
}

fn run_scenario(dir: &Path) -> Result<(), String> {
    let work = tempfile::tempdir().unwrap();
    copy_dir(dir, work.path());
    let text = std::fs::read_to_string(work.path().join("pipeline.yaml")).unwrap();
    let file = PipelineFile::parse(&text).map_err(|e| format!("pipeline.yaml: {e}"))?;
    let connected = tidemark_connectors::connect(&file, work.path()).map_err(|e| e.to_string())?;
    let reports = Arc::new(Mutex::new(Vec::<QueryProgress>::new()));
    let seen = reports.clone();
    let (query, mut source, mut sink) =
        connected.wire(file.query_builder().map_err(|e| e.to_string())?);
    let query = query
        .on_progress(move |p: &QueryProgress| seen.lock().unwrap().push(p.clone()))
        .build()
        .map_err(|e| e.to_string())?;
    query
        .run(source.as_mut(), sink.as_mut())
        .map_err(|e| e.to_string())?;
    drop(sink);

    let sink_path = work
        .path()
        .join(file.sink.path.as_deref().unwrap_or("out.jsonl"));
    let actual = by_batch(read_jsonl(&sink_path));
    let expected = by_batch(read_jsonl(&dir.join("expected.jsonl")));
    let mut problems = Vec::new();
    if let (Some(late), true) = (&file.late_data, dir.join("expected_late.jsonl").exists()) {
        let actual_late = by_batch(read_jsonl(
            &work
                .path()
                .join(late.path.as_deref().unwrap_or("late.jsonl")),
        ));
        let expected_late = by_batch(read_jsonl(&dir.join("expected_late.jsonl")));
        if actual_late != expected_late {
            problems.push(format!(
                "late rows differ\n  expected: {expected_late:?}\n  actual:   {actual_late:?}"
            ));
        }
    }
    if actual != expected {
        problems.push(format!(
            "rows differ\n  expected: {}\n  actual:   {}",
            serde_json::to_string_pretty(&expected).unwrap(),
            serde_json::to_string_pretty(&actual).unwrap()
        ));
    }
    let reports = reports.lock().unwrap();
    for want in read_jsonl(&dir.join("expected_progress.jsonl")) {
        let batch = want["batchId"].as_u64().expect("batchId");
        let Some(got) = reports.iter().find(|p| p.batch_id == batch) else {
            problems.push(format!(
                "no progress for batch {batch} (ran {} batches)",
                reports.len()
            ));
            continue;
        };
        let dropped: u64 = got
            .state_operators
            .iter()
            .map(|s| s.num_rows_dropped_by_watermark)
            .sum();
        let state_rows: u64 = got.state_operators.iter().map(|s| s.num_rows_total).sum();
        let duplicates: u64 = got
            .state_operators
            .iter()
            .filter_map(|s| s.custom_metrics.get("numDroppedDuplicateRows"))
            .sum();
        let checks = [
            ("stateRowsTotal", serde_json::json!(state_rows)),
            ("numDroppedDuplicateRows", serde_json::json!(duplicates)),
            ("numInputRows", serde_json::json!(got.num_input_rows)),
            (
                "watermark",
                serde_json::json!(got.event_time.get("watermark")),
            ),
            ("numRowsDroppedByWatermark", serde_json::json!(dropped)),
            ("numOutputRows", serde_json::json!(got.sink.num_output_rows)),
            (
                "streamWatermarks",
                serde_json::to_value(&got.stream_watermarks).unwrap(),
            ),
        ];
        for (field, value) in checks {
            if let Some(w) = want.get(field) {
                if *w != value {
                    problems.push(format!("batch {batch}: {field} expected {w}, got {value}"));
                }
            }
        }
    }
    if let Some(batches) = read_jsonl(&dir.join("expected_progress.jsonl"))
        .iter()
        .map(|w| w["batchId"].as_u64())
        .max()
    {
        let ran = reports.len() as u64;
        if batches.map(|b| b + 1) != Some(ran) {
            problems.push(format!(
                "expected {} batches, ran {ran}",
                batches.map_or(0, |b| b + 1)
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

fn scenarios() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("pipeline.yaml").exists())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_conformance_scenario_matches_spark() {
    let dirs = scenarios();
    assert!(!dirs.is_empty(), "no scenarios found");
    let failures: Vec<String> = dirs
        .iter()
        .filter_map(|d| {
            run_scenario(d)
                .err()
                .map(|e| format!("== {}\n{e}", d.file_name().unwrap().to_string_lossy()))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n{}",
        failures.len(),
        dirs.len(),
        failures.join("\n\n")
    );
}
