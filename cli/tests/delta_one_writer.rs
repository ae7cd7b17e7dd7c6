//! One writer per Delta table where only one may write (#44 item 4): two
//! instances of one files → Delta query (each its own checkpoint and state
//! directory, as two machines would have) point at one table. The second
//! is refused at its start, naming the table and the instance writing it,
//! instead of counting its own batch ids and skipping every batch the
//! first already committed. An idle first writer keeps renewing its
//! lease. Once the first stops cleanly its lease is released, and the
//! second runs.

mod common;

use common::{interrupt, start_replica};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

fn pipeline(
    dir: &Path,
    name: &str,
    instance: &str,
    table: &Path,
    trigger: &str,
) -> std::path::PathBuf {
    let file = dir.join(format!("{instance}.yaml"));
    std::fs::write(
        &file,
        format!(
            r#"name: {name}
source: {{kind: files, path: in, checkpoint: progress-{instance}, schema: {{id: string, amount: double}}}}
steps:
  - filter: "amount > 0"
trigger: {trigger}
sink: {{kind: delta, path: "{}"}}
state_dir: state-{instance}
"#,
            table.display()
        ),
    )
    .unwrap();
    file
}

#[test]
fn a_second_writer_of_a_one_instance_table_is_refused_until_the_first_stops() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("table");
    std::fs::create_dir_all(dir.path().join("in")).unwrap();
    std::fs::write(
        dir.path().join("in/000.jsonl"),
        "{\"id\": \"a\", \"amount\": 1.5}\n{\"id\": \"b\", \"amount\": 2.5}\n",
    )
    .unwrap();
    let name = tidemark_integration_tests::unique("one-writer");
    let first = pipeline(
        dir.path(),
        &name,
        "a",
        &table,
        "{micro_batch: 200 milliseconds}",
    );
    let mut running = start_replica(&first);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !dir.path().join("table/_tidemark/owner.json").exists() {
        assert!(
            Instant::now() < deadline,
            "the first writer never took the table"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let second = pipeline(dir.path(), &name, "b", &table, "available_now");
    let refused = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", second.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "a second writer ran: {stderr}");
    assert!(
        stderr.contains("sink.path") && stderr.contains("written by another instance"),
        "{stderr}"
    );

    // With no input the first commits nothing, yet it keeps its lease:
    // a thread renews it every 15 s, so a second writer arriving after a
    // quiet minute is still refused.
    let renewed_ms = || -> i64 {
        let lease = std::fs::read(dir.path().join("table/_tidemark/owner.json")).unwrap();
        serde_json::from_slice::<serde_json::Value>(&lease).unwrap()["renewed_ms"]
            .as_i64()
            .unwrap()
    };
    let idle_since = renewed_ms();
    let deadline = Instant::now() + Duration::from_secs(40);
    while renewed_ms() == idle_since {
        assert!(
            Instant::now() < deadline,
            "an idle writer did not renew its lease"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    interrupt(&mut running.child);
    let after = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(["run", second.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        after.status.success(),
        "after the first stopped: {}",
        String::from_utf8_lossy(&after.stderr)
    );
}
