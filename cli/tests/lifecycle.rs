//! A run's life as an orchestrator sees it (#45 item 6): `/readyz` answers
//! `503` until the run is ready, then `200`, on the `serve`, `ui` and
//! metrics ports alike, without the token; SIGTERM stops the run after its
//! batch and `tidemark run` exits 0, its output written.

mod common;

use common::{free_port, start_replica};
use std::time::{Duration, Instant};

/// `GET http://127.0.0.1:{port}{path}`: the status and body, or `None`
/// when nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let url = format!("http://127.0.0.1:{port}{path}");
    match ureq::get(&url).timeout(Duration::from_secs(5)).call() {
        Ok(response) => Some((
            response.status(),
            response.into_string().unwrap_or_default(),
        )),
        Err(ureq::Error::Status(code, response)) => {
            Some((code, response.into_string().unwrap_or_default()))
        }
        Err(_) => None,
    }
}

/// `count` records `{"ts", "id": "k<i>"}`, each keyed by its id.
fn records_of_ids(count: usize) -> Vec<(String, Vec<u8>)> {
    (0..count)
        .map(|i| {
            let value = format!(r#"{{"ts": "2026-01-01T10:00:00Z", "id": "k{i}"}}"#);
            (format!("k{i}"), value.into_bytes())
        })
        .collect()
}

#[test]
fn readyz_answers_once_the_run_is_ready_and_sigterm_ends_it_with_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("in")).unwrap();
    std::fs::write(
        dir.path().join("in/000.jsonl"),
        "{\"ts\": \"2026-01-01T10:00:00Z\", \"id\": \"a\"}\n{\"ts\": \"2026-01-01T10:00:30Z\", \"id\": \"a\"}\n",
    )
    .unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let [serve, ui, metrics] = ports;
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            r#"name: lifecycle
source: {{kind: files, path: in, schema: {{ts: timestamp, id: string}}}}
event_time: ts
watermark: 1 minute
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 minute}}
      aggregates: [{{fn: count, as: n}}]
output_mode: update
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: jsonl, path: out.jsonl}}
state_dir: state
serve: {{listen: "127.0.0.1:{serve}", auth_token: "t0ken"}}
ui: {{listen: "127.0.0.1:{ui}", auth_token: "t0ken"}}
metrics: {{prometheus: "127.0.0.1:{metrics}", auth_token: "t0ken"}}
"#
        ),
    )
    .unwrap();
    let mut running = start_replica(&file);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let answer = get(serve, "/readyz");
        if let Some(answer) = &answer {
            if seen.last() != Some(answer) {
                seen.push(answer.clone());
            }
        }
        if matches!(&answer, Some((200, _))) {
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {seen:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Anything before ready was a 503 naming the state.
    for (code, body) in &seen[..seen.len() - 1] {
        assert_eq!(*code, 503, "{body}");
        assert!(body.contains("\"state\""), "{body}");
    }
    assert!(seen.last().unwrap().1.contains("running"), "{seen:?}");
    for port in [ui, metrics] {
        assert_eq!(get(port, "/readyz").map(|a| a.0), Some(200), "port {port}");
    }
    // The token still guards the rest.
    assert_eq!(get(serve, "/v1/stores").map(|a| a.0), Some(401));

    let _ = std::process::Command::new("kill")
        .args(["-TERM", &running.child.id().to_string()])
        .status();
    let exit = running.child.wait().unwrap();
    assert!(exit.success(), "SIGTERM ended the run with {exit}");
    let out = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    assert!(out.contains("\"n\":2"), "{out}");
}

/// In process, against the broker: the handle tells which partitions this
/// instance reads and how far behind each is.
#[test]
fn a_started_kafka_pipeline_reports_its_partitions_and_their_lag() {
    use tidemark::runtime::RunState;
    use tidemark_integration_tests::{create_topic, produce, unique};
    let (input, output, app) = (unique("handle-in"), unique("handle-out"), unique("handle"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    produce(&input, &records_of_ids(10));
    let dir = tempfile::tempdir().unwrap();
    let file = tidemark_pipeline::PipelineFile::parse(&format!(
        r#"name: {app}
kafka: {{bootstrap: "{}"}}
source: {{kind: kafka, topic: {input}, schema: {{ts: timestamp, id: string}}}}
steps:
  - filter: "id <> 'none'"
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
"#,
        tidemark_integration_tests::bootstrap()
    ))
    .unwrap();
    let running = tidemark_connectors::PipelineRunner::new(file, dir.path())
        .start()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let expected: std::collections::BTreeSet<(String, i32)> =
        [(input.clone(), 0), (input.clone(), 1)].into();
    loop {
        let read: i64 = running
            .last_progress()
            .values()
            .map(|p| p.num_input_rows as i64)
            .sum();
        let lag = running.lag();
        let caught_up = lag.len() == 2 && lag.iter().all(|(_, _, behind)| *behind == 0);
        if running.assigned_partitions() == expected && caught_up {
            assert_eq!(running.state(), RunState::Running);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "assigned {:?}, lag {lag:?}, last batch read {read}",
            running.assigned_partitions()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    running.stop_within(Duration::from_secs(60)).unwrap();
}

/// Against the broker: Prometheus shows how old the records a batch read
/// were when it committed (Kafka Streams' `record-e2e-latency`), beside
/// each partition's lag.
#[test]
fn prometheus_shows_end_to_end_latency_and_lag_of_a_kafka_run() {
    use tidemark_integration_tests::{create_topic, produce, unique};
    let (input, output, app) = (unique("e2e-in"), unique("e2e-out"), unique("e2e"));
    create_topic(&input, 2);
    create_topic(&output, 1);
    let metrics = free_port();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(
        &file,
        format!(
            r#"name: {app}
kafka: {{bootstrap: "{}"}}
source: {{kind: kafka, topic: {input}, schema: {{ts: timestamp, id: string}}}}
steps:
  - filter: "id <> 'none'"
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
metrics: {{prometheus: "127.0.0.1:{metrics}"}}
"#,
            tidemark_integration_tests::bootstrap()
        ),
    )
    .unwrap();
    let produced_at = Instant::now();
    produce(&input, &records_of_ids(20));
    let mut running = start_replica(&file);
    let deadline = Instant::now() + Duration::from_secs(120);
    let gauge = |text: &str, stat: &str| -> Option<f64> {
        let line = text.lines().find(|l| {
            l.starts_with("tidemark_end_to_end_latency_seconds")
                && l.contains(&format!("stat=\"{stat}\""))
        })?;
        line.rsplit(' ').next()?.parse().ok()
    };
    let text = loop {
        let text = get(metrics, "/metrics").map(|a| a.1).unwrap_or_default();
        if gauge(&text, "max").is_some() {
            break text;
        }
        assert!(Instant::now() < deadline, "no latency gauge in:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let [min, avg, max] = ["min", "avg", "max"].map(|s| gauge(&text, s).unwrap_or(f64::NAN));
    // The records were produced just before the run started: each is at
    // most as old as the time since, and the three are ordered.
    let bound = produced_at.elapsed().as_secs_f64() + 1.0;
    assert!(
        0.0 <= min && min <= avg && avg <= max && max <= bound,
        "{min} {avg} {max} (≤ {bound})"
    );
    assert!(text.contains("tidemark_consumer_lag{"), "{text}");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &running.child.id().to_string()])
        .status();
    assert!(running.child.wait().unwrap().success());
}
