//! A Kafka application in typed Rust, against the broker (#45 item 1): the
//! input's columns come from the user's type (`KafkaApp::stream`), a
//! record that does not fit them is a dead letter, and the output is each
//! row as the output type writes itself (`to_topic_as`): its renamed
//! fields, and a time-like text left as the text it was.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark_connectors::KafkaApp;
use tidemark_integration_tests::*;

#[derive(Deserialize)]
struct Payment {
    card: String,
    amount: f64,
    note: String,
    status: Status,
}

#[derive(Deserialize, Serialize, PartialEq, Debug)]
#[serde(rename_all = "lowercase")]
enum Status {
    Approved,
    Declined,
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Cents {
    card: String,
    #[serde(rename = "amountCents")]
    amount_cents: i64,
    note: String,
    status: Status,
}

#[test]
fn a_typed_stream_in_and_a_typed_topic_out() {
    let (input, output, app) = (unique("typed-in"), unique("typed-out"), unique("typed"));
    create_topic(&input, 2);
    let good: Vec<(String, Vec<u8>)> = (0..10)
        .map(|i| {
            let value = serde_json::json!({
                "card": format!("c{i}"),
                "amount": 1.25 * f64::from(i),
                // Looks like a time: written back exactly as it came.
                "note": "2026-01-01T00:00:00Z",
                "status": if i % 2 == 0 { "approved" } else { "declined" },
            });
            (format!("c{i}"), value.to_string().into_bytes())
        })
        .collect();
    let bad = vec![(
        "c-bad".to_string(),
        br#"{"card": "c-bad", "amount": "lots", "note": "", "status": "approved"}"#.to_vec(),
    )];
    produce(&input, &bad);
    produce(&input, &good);
    let dir = tempfile::tempdir().unwrap();
    let running = KafkaApp::new(&app)
        .bootstrap(&bootstrap())
        .stream::<Payment>(&input)
        .steps(|q| {
            Ok(q.map_typed(|p: Payment| Cents {
                card: p.card,
                amount_cents: (p.amount * 100.0).round() as i64,
                note: p.note,
                status: p.status,
            }))
        })
        .to_topic_as::<Cents>(&output, &["card"])
        .create_output_topic()
        .state_dir(dir.path().join("state"))
        .exactly_once()
        .trigger_every(Duration::from_millis(200))
        .start()
        .unwrap();
    let out = consume_all(&output, 10, Duration::from_secs(120));
    let dead = consume_all(&format!("{app}-dlq"), 1, Duration::from_secs(60));
    running.stop_within(Duration::from_secs(60)).unwrap();
    let mut written: Vec<(String, String)> = out
        .iter()
        .map(|r| {
            let key = String::from_utf8(r.key.clone().unwrap_or_default()).unwrap();
            let value = String::from_utf8(r.value.clone().unwrap_or_default()).unwrap();
            (key, value)
        })
        .collect();
    written.sort();
    let mut expected: Vec<(String, String)> = (0..10)
        .map(|i| {
            let cents = Cents {
                card: format!("c{i}"),
                amount_cents: 125 * i64::from(i),
                note: "2026-01-01T00:00:00Z".into(),
                status: if i % 2 == 0 {
                    Status::Approved
                } else {
                    Status::Declined
                },
            };
            (cents.card.clone(), serde_json::to_string(&cents).unwrap())
        })
        .collect();
    expected.sort();
    assert_eq!(written, expected, "each row is a Cents' own JSON");
    assert_eq!(dead.len(), 1, "{dead:?}");
    let reason = dead[0]
        .headers
        .values()
        .cloned()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        reason.contains("amount"),
        "the reason names the field: {reason}"
    );
}
