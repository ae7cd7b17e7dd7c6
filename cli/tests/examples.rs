//! Every pipeline under `examples/pipelines/` runs with `tidemark run` as
//! its header says, and writes what its `expected.jsonl` holds (rows
//! compared batch by batch, in any order within a batch). A new example
//! without an `expected.jsonl` fails here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn examples() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pipelines");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("pipeline.yaml").exists())
        .collect();
    dirs.sort();
    dirs
}

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

/// Lines grouped by their `batch_id`, sorted within a batch.
fn by_batch(text: &str) -> Vec<(u64, Vec<String>)> {
    let mut rows: Vec<(u64, String)> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["batch_id"].as_u64().expect("batch_id"), v.to_string())
        })
        .collect();
    rows.sort();
    let mut out: Vec<(u64, Vec<String>)> = Vec::new();
    for (batch, row) in rows {
        match out.last_mut() {
            Some((b, rows)) if *b == batch => rows.push(row),
            _ => out.push((batch, vec![row])),
        }
    }
    out
}

#[test]
fn every_example_pipeline_writes_its_expected_output() {
    let dirs = examples();
    assert!(dirs.len() >= 2, "examples found: {dirs:?}");
    for example in dirs {
        let name = example.file_name().unwrap().to_string_lossy().to_string();
        let expected = std::fs::read_to_string(example.join("expected.jsonl"))
            .unwrap_or_else(|_| panic!("examples/pipelines/{name} has no expected.jsonl"));
        let work = tempfile::tempdir().unwrap();
        copy_dir(&example, work.path());
        let file = work.path().join("pipeline.yaml");
        let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
            .args(["run", file.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let actual = std::fs::read_to_string(work.path().join("out.jsonl")).unwrap();
        assert_eq!(by_batch(&actual), by_batch(&expected), "{name}");
    }
}
