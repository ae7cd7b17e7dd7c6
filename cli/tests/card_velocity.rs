//! `examples/card_velocity.rs` run as a black box against the real broker
//! (#45 item 8): records keep arriving while it is SIGKILLed twice and
//! started again on its state directory; every output row is then there
//! exactly once (read `read_committed`), equal to what a model of the
//! rules computes from the input alone, malformed records are in the
//! dead-letter topic once each, and SIGTERM ends it with exit 0.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tidemark::time::{format_rfc3339, parse_rfc3339};
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 3;
const CARDS: u64 = 40;
const RECORDS: usize = 3_000;
const MINUTE: i64 = 60_000_000;
/// 2026-03-01T00:00:00Z.
const START: i64 = 1_772_323_200_000_000;

/// One generated transaction.
#[derive(Clone)]
struct Transaction {
    card: String,
    partition: i32,
    ts: i64,
    amount: f64,
    declined: bool,
}

/// Transactions in event-time order: four hot cards get most rows (so
/// that declines bunch up into alerts), the others come back rarely (so
/// that cards go idle between rows).
fn transactions() -> Vec<Transaction> {
    let mut seed: u64 = 0x5eed;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut ts = START;
    (0..RECORDS)
        .map(|_| {
            ts += next(21) as i64 * 1_000_000;
            let card = if next(3) == 0 { next(4) } else { next(CARDS) };
            let declined = next(100) < 40;
            let amount = match (declined, next(5)) {
                (false, 0) => 500.0 + next(1_000) as f64,
                _ => 10.0 + next(300) as f64 + 0.25,
            };
            Transaction {
                card: format!("card-{card:02}"),
                partition: (card % PARTITIONS as u64) as i32,
                ts,
                amount,
                declined,
            }
        })
        .collect()
}

fn value_of(t: &Transaction) -> Vec<u8> {
    serde_json::json!({
        "card": t.card,
        "ts": format_rfc3339(t.ts),
        "amount": t.amount,
        "status": if t.declined { "declined" } else { "approved" },
    })
    .to_string()
    .into_bytes()
}

/// What the rules write for `input`, uninterrupted: each row as
/// `(card, canonical value)`.
fn expected(input: &[Transaction]) -> Vec<(String, String)> {
    struct Card {
        latest: i64,
        transactions: u64,
        total: f64,
        declines: Vec<i64>,
    }
    let idle = |card: &str, c: &Card| {
        serde_json::json!({"card": card, "ts": format_rfc3339(c.latest + 30 * MINUTE),
            "rule": "idle", "transactions": c.transactions, "total": c.total})
    };
    let mut cards: BTreeMap<String, Card> = BTreeMap::new();
    let mut out = Vec::new();
    for t in input {
        if let Some(c) = cards.get(&t.card) {
            if t.ts >= c.latest + 30 * MINUTE {
                out.push(idle(&t.card, c));
                cards.remove(&t.card);
            }
        }
        let c = cards.entry(t.card.clone()).or_insert(Card {
            latest: t.ts,
            transactions: 0,
            total: 0.0,
            declines: Vec::new(),
        });
        c.latest = c.latest.max(t.ts);
        c.transactions += 1;
        c.total += t.amount;
        if t.declined {
            c.declines.push(t.ts);
        } else if t.amount >= 500.0 {
            let recent = c
                .declines
                .iter()
                .filter(|d| **d > t.ts - 10 * MINUTE && **d <= t.ts)
                .count();
            if recent >= 3 {
                out.push(
                    serde_json::json!({"card": t.card, "ts": format_rfc3339(t.ts),
                    "rule": "declines_then_large", "declines": recent, "amount": t.amount}),
                );
                c.declines.clear();
            }
        }
    }
    // The watermark ends one minute behind the latest row of the partition
    // that got least far (each partition's own, combined by `min`).
    let watermark = (0..PARTITIONS)
        .filter_map(|p| {
            input
                .iter()
                .filter(|t| t.partition == p)
                .map(|t| t.ts)
                .max()
        })
        .min()
        .unwrap_or(i64::MIN)
        - MINUTE;
    for (card, c) in &cards {
        if c.latest + 30 * MINUTE <= watermark {
            out.push(idle(card, c));
        }
    }
    out.iter()
        .map(|v| (v["card"].as_str().unwrap().to_string(), canonical(v)))
        .collect()
}

/// A row as comparable text: its fields sorted, numbers as floats, `ts`
/// as microseconds (so `500` and `500.0` compare equal).
fn canonical(value: &serde_json::Value) -> String {
    let object = value.as_object().expect("an object");
    let fields: Vec<String> = object
        .iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("ts", serde_json::Value::String(s)) => {
                    parse_rfc3339(s).map_or_else(|| format!("bad time {s}"), |t| t.to_string())
                }
                (_, serde_json::Value::Number(n)) => format!("{:.4}", n.as_f64().unwrap()),
                (_, other) => other.to_string(),
            };
            format!("{k}={v}")
        })
        .collect();
    let mut sorted = fields;
    sorted.sort();
    sorted.join(",")
}

fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap();
    let path = profile.join("examples").join("card_velocity");
    assert!(
        path.exists(),
        "{} was not built (cargo test builds the examples)",
        path.display()
    );
    path
}

fn start(state: &Path, app: &str, input: &str, output: &str, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(example())
        .env("KAFKA_BOOTSTRAP", bootstrap())
        .env("STATE_DIR", state)
        .env("APP_ID", app)
        .env("INPUT_TOPIC", input)
        .env("OUTPUT_TOPIC", output)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

#[test]
fn card_velocity_writes_every_alert_once_through_two_kills_and_stops_on_sigterm() {
    let (input, output, app) = (unique("cards-in"), unique("cards-out"), unique("cards-app"));
    create_topic(&input, PARTITIONS);
    let dir = tempfile::tempdir().unwrap();
    let (state, log) = (dir.path().join("state"), dir.path().join("example.log"));
    let records = transactions();
    let want = expected(&records);
    let idle = want
        .iter()
        .filter(|(_, v)| v.contains("rule=\"idle\""))
        .count();
    assert!(
        want.len() - idle >= 5 && idle >= 20,
        "the input exercises both rules: {} alerts, {idle} idle rows",
        want.len() - idle
    );

    // Records keep coming, a chunk every 300 ms, while the example is
    // killed twice; three malformed ones among them.
    let producer = {
        let (input, records) = (input.clone(), records.clone());
        std::thread::spawn(move || {
            for (i, chunk) in records.chunks(RECORDS / 20).enumerate() {
                let mut batch: Vec<(Option<i32>, String, Vec<u8>)> = chunk
                    .iter()
                    .map(|t| (Some(t.partition), t.card.clone(), value_of(t)))
                    .collect();
                if i % 7 == 3 {
                    let bad = format!(
                        r#"{{"card": "card-00", "ts": "{}", "amount": 1.0, "status": "pending"}}"#,
                        format_rfc3339(START)
                    );
                    batch.push((
                        Some(0),
                        "card-00".into(),
                        if i == 3 {
                            b"not json".to_vec()
                        } else {
                            bad.into_bytes()
                        },
                    ));
                }
                produce_each_with(&plain(), &input, &batch);
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let mut child = start(&state, &app, &input, &output, &log);
    for wait in [2_500, 3_500] {
        std::thread::sleep(Duration::from_millis(wait));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        child = start(&state, &app, &input, &output, &log);
    }
    producer.join().unwrap();

    let out = consume_all(&output, want.len(), Duration::from_secs(120));
    let mut got: Vec<(String, String)> = out
        .iter()
        .map(|r| {
            let key = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).to_string();
            let value: serde_json::Value =
                serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
            let fields: Vec<&str> = value
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            let expected_fields: &[&str] = match value["rule"].as_str() {
                Some("idle") => &["card", "rule", "total", "transactions", "ts"],
                _ => &["amount", "card", "declines", "rule", "ts"],
            };
            let mut sorted = fields.clone();
            sorted.sort();
            assert_eq!(
                sorted, expected_fields,
                "exactly the rule's fields: {value}"
            );
            (key, canonical(&value))
        })
        .collect();
    let mut want = want;
    got.sort();
    want.sort();
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(got.len(), want.len(), "every row once; log:\n{log_text}");
    assert_eq!(got, want, "log:\n{log_text}");
    let dead = consume_all(&format!("{app}-dlq"), 3, Duration::from_secs(30));
    assert_eq!(
        dead.len(),
        3,
        "each malformed record once in the dead-letter topic"
    );

    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "SIGTERM ends it with exit 0: {status:?}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
