//! A user's stateful processor run in process against the real broker
//! (#45 item 3): behind the repartition topic (grouped by a column other
//! than the record key) under exactly_once, read through interactive
//! queries while it runs, and under the real-time trigger.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tidemark::operators::processor::*;
use tidemark::operators::KeyRange;
use tidemark::operators::OutputMode;
use tidemark::row::Value;
use tidemark::runtime::{KeyLookup, KeyValues, RunState};
use tidemark_connectors::KafkaApp;
use tidemark_integration_tests::*;

const PARTITIONS: i32 = 3;
const USERS: usize = 5;
const RECORDS: usize = 300;

#[derive(Deserialize)]
struct Click {
    #[allow(dead_code)]
    id: String,
}

#[derive(Serialize)]
struct Count {
    user: String,
    n: u64,
}

/// Counts each user's clicks; emits the running count per click.
struct Counter {
    count: ValueState<u64>,
}

impl StatefulProcessor for Counter {
    type Input = Click;
    type Output = Count;
    fn handle_inputs(
        &mut self,
        key: &GroupKey,
        rows: Vec<Click>,
        ctx: &mut ProcessorContext<'_, Count>,
    ) -> ProcessorResult {
        let mut n = self.count.get(ctx)?.unwrap_or(0);
        for _ in rows {
            n += 1;
            ctx.emit(Count {
                user: key.as_str().unwrap_or_default().into(),
                n,
            });
        }
        self.count.set(ctx, &n)
    }
}

/// Clicks keyed by their own id, users spread over every partition.
fn produce_clicks(topic: &str) -> BTreeMap<String, u64> {
    let mut per_user = BTreeMap::new();
    let records: Vec<(Option<i32>, String, Vec<u8>)> = (0..RECORDS)
        .map(|i| {
            let user = format!("u{}", (i * 7) % USERS);
            *per_user.entry(user.clone()).or_insert(0) += 1;
            let id = format!("click-{i}");
            let value = serde_json::json!({"id": id, "user": user}).to_string();
            (
                Some((i % PARTITIONS as usize) as i32),
                id,
                value.into_bytes(),
            )
        })
        .collect();
    produce_each_with(&plain(), topic, &records);
    per_user
}

/// Every user's counts arrived once each, 1 to its number of clicks.
fn assert_counts(output: &str, per_user: &BTreeMap<String, u64>) {
    let out = consume_all(output, RECORDS, Duration::from_secs(120));
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for record in &out {
        let value: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        let user = value["user"].as_str().unwrap().to_string();
        assert_eq!(
            record.key.as_deref(),
            Some(user.as_bytes()),
            "keyed by user"
        );
        seen.entry(user)
            .or_default()
            .push(value["n"].as_u64().unwrap());
    }
    for (user, clicks) in per_user {
        let mut counts = seen.remove(user).unwrap_or_default();
        counts.sort();
        assert_eq!(counts, (1..=*clicks).collect::<Vec<_>>(), "{user}");
    }
    assert!(seen.is_empty(), "no other users: {seen:?}");
}

fn counter(states: &mut StateDeclarations) -> tidemark::Result<Counter> {
    Ok(Counter {
        count: states.value("count")?,
    })
}

#[test]
fn a_processor_grouped_off_the_record_key_runs_behind_the_repartition_topic_and_is_queryable() {
    let (input, output, app) = (unique("proc-in"), unique("proc-out"), unique("proc-app"));
    create_topic(&input, PARTITIONS);
    let dir = tempfile::tempdir().unwrap();
    let running = KafkaApp::new(&app)
        .bootstrap(&bootstrap())
        .input(&input, &[("id", "string"), ("user", "string")])
        .keyed_by(&["id"])
        .process("counter", &["user"], counter)
        .output_mode(OutputMode::Update)
        .to_topic(&output, &["user"])
        .create_output_topic()
        .state_dir(dir.path().join("state"))
        .exactly_once()
        .trigger_every(Duration::from_millis(200))
        .start()
        .unwrap();
    let per_user = produce_clicks(&input);
    assert_counts(&output, &per_user);

    // The counts are state an interactive query reads.
    let reader = running.state_reader();
    let deadline = Instant::now() + Duration::from_secs(60);
    let rows = loop {
        let store = reader
            .stores()
            .ok()
            .and_then(|s| s.into_iter().find(|d| d.kind == "processor"));
        if let Some(store) = store {
            let key = KeyValues::Typed(vec![Value::Str("u1".into())]);
            if let Ok(KeyLookup::Found { rows, .. }) =
                reader.get(&store.name, key, KeyRange::default())
            {
                break rows;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the processor's state was never read"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].get("state"), Some(&Value::Str("count".into())));
    assert_eq!(
        rows[0].get("value"),
        Some(&Value::Str(per_user["u1"].to_string().into()))
    );
    running.stop_within(Duration::from_secs(60)).unwrap();
}

#[test]
fn a_processor_runs_under_the_real_time_trigger() {
    let (input, output, app) = (
        unique("rt-proc-in"),
        unique("rt-proc-out"),
        unique("rt-proc-app"),
    );
    create_topic(&input, PARTITIONS);
    let dir = tempfile::tempdir().unwrap();
    let running = KafkaApp::new(&app)
        .bootstrap(&bootstrap())
        .input(&input, &[("id", "string"), ("user", "string")])
        .keyed_by(&["user"])
        .process("counter", &["user"], counter)
        .output_mode(OutputMode::Update)
        .to_topic(&output, &["user"])
        .create_output_topic()
        .state_dir(dir.path().join("state"))
        .real_time(Duration::from_secs(2))
        .start()
        .unwrap();
    assert_eq!(
        running
            .status()
            .wait_until(Duration::from_secs(60), RunState::is_ready),
        RunState::Running
    );
    // Keyed by user here: each user's clicks in one partition.
    let mut per_user = BTreeMap::new();
    let records: Vec<(Option<i32>, String, Vec<u8>)> = (0..RECORDS)
        .map(|i| {
            let user = format!("u{}", (i * 7) % USERS);
            *per_user.entry(user.clone()).or_insert(0u64) += 1;
            let value = serde_json::json!({"id": format!("click-{i}"), "user": user}).to_string();
            (None, user, value.into_bytes())
        })
        .collect();
    produce_each_with(&plain(), &input, &records);
    assert_counts(&output, &per_user);
    running.stop_within(Duration::from_secs(60)).unwrap();
}

/// A user's count to start from (Spark's initial state).
#[derive(Deserialize)]
struct StartingCount {
    n: u64,
}

impl HandleInitialState<StartingCount> for Counter {
    fn handle_initial_state(
        &mut self,
        _key: &GroupKey,
        state: StartingCount,
        ctx: &mut ProcessorContext<'_, Count>,
    ) -> ProcessorResult {
        self.count.set(ctx, &state.n)
    }
}

/// Against the broker, exactly once: counts keyed by user start from the
/// counts an initial-state topic (co-partitioned, keyed by user) holds.
#[test]
fn a_processor_seeded_from_an_initial_state_topic_counts_on_from_it() {
    let (input, seeds, output, app) = (
        unique("seeded-in"),
        unique("seeded-state"),
        unique("seeded-out"),
        unique("seeded-app"),
    );
    create_topic(&input, PARTITIONS);
    create_topic(&seeds, PARTITIONS);
    let starting: BTreeMap<String, u64> = (0..USERS)
        .map(|u| (format!("u{u}"), 1000 * (u as u64 + 1)))
        .collect();
    let seed_records: Vec<(String, Vec<u8>)> = starting
        .iter()
        .map(|(user, n)| {
            let value = serde_json::json!({"user": user, "n": n}).to_string();
            (user.clone(), value.into_bytes())
        })
        .collect();
    produce(&seeds, &seed_records);
    // Clicks keyed by user, as the initial state is: co-partitioned.
    let mut per_user: BTreeMap<String, u64> = BTreeMap::new();
    let clicks: Vec<(String, Vec<u8>)> = (0..RECORDS)
        .map(|i| {
            let user = format!("u{}", (i * 7) % USERS);
            *per_user.entry(user.clone()).or_insert(0) += 1;
            let value = serde_json::json!({"id": format!("click-{i}"), "user": user});
            (user, value.to_string().into_bytes())
        })
        .collect();
    produce(&input, &clicks);
    let dir = tempfile::tempdir().unwrap();
    let running = KafkaApp::new(&app)
        .bootstrap(&bootstrap())
        .input(&input, &[("id", "string"), ("user", "string")])
        .keyed_by(&["user"])
        .process_with_initial_state::<_, StartingCount, _>(
            "counter",
            &["user"],
            counter,
            &seeds,
            &[("user", "string"), ("n", "long")],
        )
        .output_mode(OutputMode::Update)
        .to_topic(&output, &["user"])
        .create_output_topic()
        .state_dir(dir.path().join("state"))
        .exactly_once()
        .trigger_every(Duration::from_millis(200))
        .start()
        .unwrap();
    let out = consume_all(&output, RECORDS, Duration::from_secs(120));
    running.stop_within(Duration::from_secs(60)).unwrap();
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for record in &out {
        let value: serde_json::Value =
            serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        let user = value["user"].as_str().unwrap().to_string();
        seen.entry(user)
            .or_default()
            .push(value["n"].as_u64().unwrap());
    }
    for (user, clicks) in &per_user {
        let mut counts = seen.remove(user).unwrap_or_default();
        counts.sort();
        let from = starting[user];
        assert_eq!(
            counts,
            (from + 1..=from + clicks).collect::<Vec<_>>(),
            "{user} counts on from its initial {from}"
        );
    }
    assert!(seen.is_empty(), "no other users: {seen:?}");
}
