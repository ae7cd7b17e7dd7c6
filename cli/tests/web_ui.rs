//! The live web page (`ui:`) against the real broker, loaded in headless
//! Chromium: a windowed pipeline gets rows, a late row and a record that
//! is not JSON; the page's charts show the totals the query's progress
//! reports (input rows, late rows, dead letters), its batch table lists
//! the latest batches, and a screenshot is taken.

mod common;

use common::{free_port, interrupt, start_replica};
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

fn pipeline(app: &str, input: &str, output: &str, port: u16) -> String {
    format!(
        r#"application_id: {app}
source:
  kind: kafka
  topic: {input}
  group: {app}
  keyed_by: [id]
  format: json
  schema: {{event_time: timestamp, id: string}}
event_time: event_time
watermark: 5 minutes
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 5 minutes}}
      aggregates: [{{fn: count, as: n}}]
output_mode: append
trigger: {{micro_batch: 300 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
dead_letter: {{kind: kafka, topic: {output}-dead}}
ui: {{listen: "127.0.0.1:{port}"}}
"#
    )
}

fn row(minute: &str) -> (String, Vec<u8>) {
    let value = format!(r#"{{"event_time": "2026-01-01T{minute}:00Z", "id": "a"}}"#);
    ("a".to_string(), value.into_bytes())
}

/// The API's recent progress reports.
fn progress(address: &str) -> Vec<serde_json::Value> {
    match ureq::get(&format!("http://{address}/api/progress")).call() {
        Ok(response) => response.into_json().unwrap(),
        Err(_) => Vec::new(),
    }
}

fn total(reports: &[serde_json::Value], of: impl Fn(&serde_json::Value) -> u64) -> u64 {
    reports.iter().map(of).sum()
}

fn sum_of(list: &serde_json::Value, field: &str) -> u64 {
    list.as_array()
        .map(|l| l.iter().map(|x| x[field].as_u64().unwrap_or(0)).sum())
        .unwrap_or(0)
}

/// The opening tag of the element with `id` in `dom`.
fn tag_of<'a>(dom: &'a str, id: &str) -> &'a str {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page"));
    let start = dom[..at].rfind('<').unwrap();
    let end = at + dom[at..].find('>').unwrap();
    &dom[start..=end]
}

fn attribute(tag: &str, name: &str) -> String {
    let from = tag
        .find(&format!("{name}=\""))
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        + name.len()
        + 2;
    tag[from..from + tag[from..].find('"').unwrap()].to_string()
}

/// Runs headless Chromium on `url` with `args`; its stdout.
fn chromium(url: &str, args: &[&str]) -> String {
    let output = std::process::Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=4000",
        ])
        .args(args)
        .arg(url)
        .output()
        .expect("chromium is not installed: scripts/setup.sh installs it (Debian's `chromium`)");
    assert!(
        output.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn the_web_page_charts_the_running_querys_progress_in_headless_chromium() {
    let (input, output, app) = (unique("ui-in"), unique("ui-out"), unique("ui-app"));
    create_topic(&input, 1);
    create_topic(&output, 1);
    let port = free_port();
    let address = format!("127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&app, &input, &output, port)).unwrap();
    let mut replica = start_replica(&file);

    let minutes: Vec<String> = (0..=20).map(|m| format!("10:{m:02}")).collect();
    produce(&input, &minutes.iter().map(|m| row(m)).collect::<Vec<_>>());
    // The watermark reaches 10:15 before the late row comes.
    let deadline = Instant::now() + Duration::from_secs(90);
    while total(&progress(&address), |p| p["numInputRows"].as_u64().unwrap()) < 21 {
        assert!(Instant::now() < deadline, "the query never read its input");
        std::thread::sleep(Duration::from_millis(300));
    }
    produce(
        &input,
        &[
            row("10:01"),
            ("a".into(), b"not json".to_vec()),
            row("10:30"),
        ],
    );
    let reports = loop {
        let reports = progress(&address);
        let late = total(&reports, |p| {
            sum_of(&p["stateOperators"], "numRowsDroppedByWatermark")
        });
        let dead = total(&reports, |p| sum_of(&p["sources"], "numBadRecords"));
        if late == 1 && dead == 1 {
            break reports;
        }
        assert!(
            Instant::now() < deadline,
            "no late row and dead letter reported: {reports:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let status: serde_json::Value = ureq::get(&format!("http://{address}/api/status"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(status["name"], app.as_str(), "{status}");

    let dom = chromium(&format!("http://{address}/"), &["--dump-dom"]);
    let input_rows = total(&reports, |p| p["numInputRows"].as_u64().unwrap());
    assert_eq!(input_rows, 24);
    for (chart, want) in [
        ("chart-input-rows", input_rows),
        ("chart-late-rows", 1),
        ("chart-dead-letters", 1),
    ] {
        let tag = tag_of(&dom, chart);
        assert_eq!(
            attribute(tag, "data-total"),
            want.to_string(),
            "{chart}: {tag}"
        );
    }
    let watermark = tag_of(&dom, "chart-watermark");
    assert_ne!(
        attribute(watermark, "data-last"),
        "",
        "a watermark is charted: {watermark}"
    );
    assert_ne!(attribute(tag_of(&dom, "charts"), "id"), "");
    assert!(
        dom.contains("<tr data-batch="),
        "the batch table lists batches"
    );
    assert!(
        dom.contains("stateStoreSave"),
        "the operator table lists the aggregation"
    );
    assert!(!attribute(&dom[dom.find("<body").unwrap()..], "data-batches").starts_with('0'));

    // A screenshot (TIDEMARK_UI_SCREENSHOT keeps it, as docs/web-ui.png was).
    let png = dir.path().join("web-ui.png");
    let shot = format!("--screenshot={}", png.display());
    chromium(
        &format!("http://{address}/"),
        &[&shot, "--window-size=1280,1700"],
    );
    let bytes = std::fs::read(&png).expect("chromium wrote the screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
        "{} bytes",
        bytes.len()
    );
    if let Ok(keep) = std::env::var("TIDEMARK_UI_SCREENSHOT") {
        std::fs::copy(&png, keep).unwrap();
    }
    interrupt(&mut replica.child);
}
