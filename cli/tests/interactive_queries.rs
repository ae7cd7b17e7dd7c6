//! Interactive queries against the real broker: two instances of one
//! pipeline split a four-partition topic; every key, asked on either
//! instance, answers its window's count and sum as the output last wrote
//! them (the instance not holding it asks the one that does, found through
//! the consumer group). Then one instance is killed: its keys are answered
//! `503` with `retryable: true` while it is gone and the group has not
//! moved its partitions, then, from the survivor, with the same values.

mod common;

use common::{free_port, interrupt, start_replica_as, Replica};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark_integration_tests::*;

const KEYS: usize = 16;

fn pipeline(app: &str, input: &str, output: &str, port: u16) -> String {
    format!(
        r#"application_id: {app}
source:
  kind: kafka
  topic: {input}
  group: {app}
  keyed_by: [id]
  format: json
  schema: {{event_time: timestamp, id: string, amount: long}}
  properties: {{session.timeout.ms: "10000"}}
event_time: event_time
watermark: 10 minutes
steps:
  - window_aggregate:
      keys: [id]
      window: {{tumbling: 1 hour}}
      aggregates: [{{fn: count, as: n}}, {{fn: sum, column: amount, as: total}}]
output_mode: update
trigger: {{micro_batch: 200 milliseconds}}
sink: {{kind: kafka, topic: {output}, format: json}}
state_dir: state
serve: {{listen: "127.0.0.1:{port}", advertised: "127.0.0.1:{port}"}}
"#
    )
}

/// Key `k<i>` gets `i + 1` rows of amount `10 * i` inside 10:00–11:00.
fn produce_keys(input: &str) -> BTreeMap<String, (i64, i64)> {
    let mut records = Vec::new();
    let mut expected = BTreeMap::new();
    for i in 0..KEYS {
        let id = format!("k{i}");
        for r in 0..=i {
            let value = format!(
                r#"{{"event_time": "2026-01-01T10:{:02}:00Z", "id": "{id}", "amount": {}}}"#,
                r * 3 % 60,
                10 * i
            );
            records.push((id.clone(), value.into_bytes()));
        }
        expected.insert(id, ((i + 1) as i64, ((i + 1) * 10 * i) as i64));
    }
    produce(input, &records);
    expected
}

/// The last `(n, total)` the output wrote per key, once every key has
/// reached `expected`.
fn output_state(
    output: &str,
    expected: &BTreeMap<String, (i64, i64)>,
) -> BTreeMap<String, (i64, i64)> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut last = BTreeMap::new();
        for record in consume_uncommitted(output, Duration::from_secs(3)) {
            let v: serde_json::Value =
                serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
            let (n, total) = (v["n"].as_i64().unwrap(), v["total"].as_i64().unwrap());
            let entry = last
                .entry(v["id"].as_str().unwrap().to_string())
                .or_insert((0, 0));
            // Update mode writes a window again as it grows.
            if n >= entry.0 {
                *entry = (n, total);
            }
        }
        if &last == expected {
            return last;
        }
        assert!(
            Instant::now() < deadline,
            "the output never reached every key: {last:?}"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `GET http://{address}{path}`: status and JSON body.
fn get(address: &str, path: &str) -> (u16, serde_json::Value) {
    let url = format!("http://{address}{path}");
    let response = match ureq::get(&url).timeout(Duration::from_secs(30)).call() {
        Ok(response) => response,
        Err(ureq::Error::Status(_, response)) => response,
        Err(e) => panic!("{url}: {e}"),
    };
    let status = response.status();
    (status, response.into_json().unwrap())
}

/// The `(n, total)` a key's answer holds, and the instance that served it.
fn key_state(body: &serde_json::Value) -> ((i64, i64), String) {
    let rows = body["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "one open window: {body}");
    let row = &rows[0];
    assert_eq!(row["window_start"], "2026-01-01T10:00:00Z", "{body}");
    (
        (row["n"].as_i64().unwrap(), row["total"].as_i64().unwrap()),
        body["served_by"].as_str().unwrap().to_string(),
    )
}

fn wait_until_serving(address: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while ureq::get(&format!("http://{address}/v1/stores"))
        .call()
        .is_err()
    {
        assert!(Instant::now() < deadline, "{address} never served");
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn every_key_asked_on_either_instance_matches_the_output_and_a_killed_instances_keys_are_retryable_then_move(
) {
    let (input, output, app) = (unique("iq-in"), unique("iq-out"), unique("iq-app"));
    create_topic(&input, 4);
    create_topic(&output, 1);
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports = [free_port(), free_port()];
    let addresses: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut replicas: Vec<Replica> = dirs
        .iter()
        .zip(ports)
        .enumerate()
        .map(|(i, (dir, port))| {
            let file = dir.path().join("pipeline.yaml");
            std::fs::write(&file, pipeline(&app, &input, &output, port)).unwrap();
            start_replica_as(&file, Some(&format!("i{i}")))
        })
        .collect();
    addresses.iter().for_each(|a| wait_until_serving(a));
    let (status, stores) = get(&addresses[0], "/v1/stores");
    assert_eq!(status, 200, "{stores}");
    assert_eq!(stores["stores"][0]["name"], "op0", "{stores}");
    assert_eq!(stores["stores"][0]["kind"], "window_aggregate", "{stores}");
    assert_eq!(
        stores["stores"][0]["key_columns"],
        serde_json::json!(["id"]),
        "{stores}"
    );

    let expected = produce_keys(&input);
    let written = output_state(&output, &expected);

    // Both instances answer every key alike: the holder's state.
    let mut holders = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (key, want) in &written {
        for address in &addresses {
            let (status, body) = loop {
                let (status, body) = get(address, &format!("/v1/stores/op0/keys/{key}"));
                // A rebalance still settling is the one acceptable delay.
                if status != 503 || Instant::now() > deadline {
                    break (status, body);
                }
                assert_eq!(body["retryable"], true, "{body}");
                std::thread::sleep(Duration::from_millis(500));
            };
            assert_eq!(status, 200, "{key} on {address}: {body}");
            let (state, served_by) = key_state(&body);
            assert_eq!(&state, want, "{key} on {address}: {body}");
            holders.insert(key.clone(), served_by);
        }
    }
    let serving: std::collections::BTreeSet<&String> = holders.values().collect();
    assert_eq!(serving.len(), 2, "both instances hold keys: {holders:?}");
    let (status, body) = get(&addresses[1], "/v1/stores/op0/keys/nobody");
    assert_eq!(
        (status, body["found"].clone()),
        (404, serde_json::json!(false)),
        "{body}"
    );
    let (status, body) = get(&addresses[0], "/v1/stores/op9/keys/k1");
    assert_eq!(status, 404, "{body}");

    // Instance 1 dies: its keys are retryable on instance 0 until the
    // group moves its partitions there, then answered from there.
    replicas[1].child.kill().unwrap();
    replicas[1].child.wait().unwrap();
    let lost: Vec<&String> = holders
        .iter()
        .filter(|(_, by)| **by == addresses[1])
        .map(|(k, _)| k)
        .collect();
    let (status, body) = get(&addresses[0], &format!("/v1/stores/op0/keys/{}", lost[0]));
    assert_eq!(status, 503, "a dead holder's key: {body}");
    assert_eq!(body["retryable"], true, "{body}");
    let deadline = Instant::now() + Duration::from_secs(120);
    for key in lost {
        loop {
            let (status, body) = get(&addresses[0], &format!("/v1/stores/op0/keys/{key}"));
            match status {
                200 => {
                    let (state, served_by) = key_state(&body);
                    assert_eq!(state, written[key], "{key} after the move: {body}");
                    assert_eq!(served_by, addresses[0]);
                    break;
                }
                503 => assert_eq!(body["retryable"], true, "{body}"),
                other => panic!("{key} during the move: {other} {body}"),
            }
            assert!(Instant::now() < deadline, "{key} never moved: {body}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    interrupt(&mut replicas[0].child);
}
