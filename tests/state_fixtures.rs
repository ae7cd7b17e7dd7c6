//! State written by an earlier release is read by this one: each stateful
//! operator's stores and task checkpoints, saved as fixtures after a first
//! run (`tests/fixtures/state/<scenario>.json`), restore into a second run
//! whose output must equal that of the same second run restored from state
//! this release wrote. Any change to how an operator encodes its state
//! that forgets the older layout fails here.
//!
//! The fixtures hold what the release named in each file (`written_by`)
//! writes; the first ones were written by this harness run over 842f7f8's
//! encoders (`operators/` and `state/` unchanged between 842f7f8 and the
//! commit adding the harness). To add a scenario (or fixtures of a new encoding, kept
//! beside the old ones): `TIDEMARK_WRITE_STATE_FIXTURES=1 cargo test --test
//! state_fixtures`, which writes the missing files instead of checking them.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use tidemark::operators::processor::*;
use tidemark::prelude::*;
use tidemark::runtime::{InMemoryStateBackend, StoresSnapshot};
use tidemark::test_driver::{DriverPosition, PipelineTestDriver, TestRun};

/// A saved store: its partition, its name and its entries (key and value
/// in hex).
type SavedStore = (i32, String, Vec<(String, String)>);

/// One scenario's fixture: where its first run stopped and its stores.
#[derive(Serialize, Deserialize)]
struct Fixture {
    /// The release (commit) whose code wrote it.
    written_by: String,
    position: DriverPosition,
    /// `(partition, store, [(key hex, value hex)])`.
    stores: Vec<SavedStore>,
}

impl Fixture {
    fn of(position: DriverPosition, snapshot: &StoresSnapshot) -> Self {
        Fixture {
            written_by: std::env::var("TIDEMARK_FIXTURE_RELEASE").unwrap_or_default(),
            position,
            stores: snapshot
                .iter()
                .map(|((partition, store), entries)| {
                    let hexed = entries.iter().map(|(k, v)| (hex(k), hex(v))).collect();
                    (*partition, store.clone(), hexed)
                })
                .collect(),
        }
    }

    fn snapshot(&self) -> StoresSnapshot {
        self.stores
            .iter()
            .map(|(partition, store, entries)| {
                let entries = entries.iter().map(|(k, v)| (unhex(k), unhex(v))).collect();
                ((*partition, store.clone()), entries)
            })
            .collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A stateful query and the two runs it is restarted between.
struct Scenario {
    name: &'static str,
    query: fn() -> PipelineTestDriver,
    first: fn(PipelineTestDriver) -> PipelineTestDriver,
    second: fn(PipelineTestDriver) -> PipelineTestDriver,
}

impl Scenario {
    fn fixture_path(&self) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/state")
            .join(format!("{}.json", self.name))
    }

    /// The second run's rows, restored from `backend` at `position`.
    fn second_run(&self, backend: InMemoryStateBackend, position: &DriverPosition) -> TestRun {
        let driver = (self.query)().state_backend(backend).resume_from(position);
        (self.second)(driver)
            .run()
            .unwrap_or_else(|e| panic!("{}: the second run failed: {e}", self.name))
    }

    /// Runs the first part with state this release writes: its position
    /// and stores.
    fn first_run(&self) -> (DriverPosition, InMemoryStateBackend) {
        let backend = InMemoryStateBackend::default();
        let run = (self.first)((self.query)().state_backend(backend.clone()))
            .run()
            .unwrap_or_else(|e| panic!("{}: the first run failed: {e}", self.name));
        (run.stopped_at, backend)
    }

    fn check(&self) {
        let path = self.fixture_path();
        if std::env::var_os("TIDEMARK_WRITE_STATE_FIXTURES").is_some() && !path.exists() {
            let (position, backend) = self.first_run();
            let fixture = Fixture::of(position, &backend.snapshot().unwrap());
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, serde_json::to_string_pretty(&fixture).unwrap()).unwrap();
            return;
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (see the module doc)", path.display()));
        let fixture: Fixture = serde_json::from_str(&text).unwrap();
        assert!(!fixture.stores.is_empty(), "{}: no stores saved", self.name);

        let (position, backend) = self.first_run();
        let expected = rows(&self.second_run(backend, &position));
        let restored = InMemoryStateBackend::from_snapshot(&fixture.snapshot()).unwrap();
        let actual = rows(&self.second_run(restored, &fixture.position));
        assert!(
            !expected.is_empty(),
            "{}: the second run wrote nothing",
            self.name
        );
        assert_eq!(
            actual, expected,
            "{}: state written by {} restores differently",
            self.name, fixture.written_by
        );
        // The stores mattered: with the same checkpoints but empty stores
        // the second run writes otherwise.
        let empty = rows(&self.second_run(InMemoryStateBackend::default(), &fixture.position));
        assert_ne!(
            empty, expected,
            "{}: the second run ignores the stores",
            self.name
        );
    }
}

/// A run's rows with their batch, as text, in write order.
fn rows(run: &TestRun) -> Vec<String> {
    run.output_json().iter().map(|r| r.to_string()).collect()
}

fn pipeline(text: &str) -> PipelineTestDriver {
    tidemark_pipeline::test_driver(text).unwrap()
}

const WINDOWS: &str = r#"
name: fixture-windows
source: {kind: kafka, topic: events, schema: {t: timestamp, k: string, x: long}}
event_time: t
watermark: 10 minutes
steps:
  - window_aggregate:
      keys: [k]
      window: {tumbling: 5 minutes}
      aggregates:
        - {fn: count, as: n}
        - {fn: sum, column: x, as: total}
        - {fn: avg, column: x, as: mean}
        - {fn: stddev, column: x, as: sd}
        - {fn: max_by, column: k, by: x, as: top}
        - {fn: approx_count_distinct, column: x, as: distinct}
        - {fn: approx_percentile, column: x, percentage: 0.5, as: median}
output_mode: append
sink: {kind: stdout}
"#;

const SESSIONS: &str = r#"
name: fixture-sessions
source: {kind: kafka, topic: events, schema: {t: timestamp, k: string, x: long}}
event_time: t
watermark: 10 minutes
steps:
  - window_aggregate:
      keys: [k]
      window: {session: 5 minutes}
      aggregates: [{fn: count, as: n}, {fn: sum, column: x, as: total}]
output_mode: append
sink: {kind: stdout}
"#;

const DEDUP: &str = r#"
name: fixture-dedup
source: {kind: kafka, topic: events, schema: {t: timestamp, k: string, x: long}}
event_time: t
watermark: 10 minutes
steps:
  - dedup: {keys: [k, x], within_watermark: true}
  - dedup: {keys: [k]}
output_mode: append
sink: {kind: stdout}
"#;

const JOIN: &str = r#"
name: fixture-join
source: {kind: kafka, topic: impressions, schema: {adId: string, impressionTime: timestamp}}
event_time: impressionTime
watermark: 10 minutes
steps:
  - join:
      topic: clicks
      type: left_outer
      on: [{left: adId, right: clickAdId}]
      event_time: clickTime
      watermark: 10 minutes
      between: ["0 seconds", "30 minutes"]
      schema: {clickAdId: string, clickTime: timestamp}
output_mode: append
sink: {kind: stdout}
"#;

const TABLE_JOIN: &str = r#"
name: fixture-table-join
source: {kind: kafka, topic: orders, schema: {orderId: string, customerId: string}}
steps:
  - table_join:
      topic: customers
      type: left_outer
      on: [{left: customerId, right: id}]
      schema: {id: string, tier: string}
output_mode: append
sink: {kind: stdout}
"#;

const ROLLING: &str = r#"
name: fixture-rolling
source: {kind: kafka, topic: events, schema: {t: timestamp, k: string, x: long}}
event_time: t
steps:
  - rolling_window:
      partition_by: [k]
      frontier: {delay: 30 seconds, alias: frontier}
      measures:
        - {fn: sum, column: x, range: 5 minutes, as: sum_5m}
        - {fn: max, column: x, range: 5 minutes, as: max_5m}
        - {fn: count, column: x, as: n}
output_mode: update
sink: {kind: stdout}
"#;

fn event(t: &str, k: &str, x: i64) -> String {
    format!(r#"{{"t": "2026-01-01T{t}Z", "k": "{k}", "x": {x}}}"#)
}

/// Events before the restart: windows, sessions and keys left open.
fn events_before(driver: PipelineTestDriver) -> PipelineTestDriver {
    driver
        .batch_at("2026-01-01T10:00:30Z")
        .pipe("events", &event("10:00:10", "a", 3))
        .pipe("events", &event("10:00:20", "b", 5))
        .batch_at("2026-01-01T10:02:00Z")
        .pipe("events", &event("10:01:30", "a", 4))
        .pipe("events", &event("10:01:40", "a", 4))
}

/// Events after it: the same keys again, then time enough to close them.
fn events_after(driver: PipelineTestDriver) -> PipelineTestDriver {
    driver
        .batch_at("2026-01-01T10:04:00Z")
        .pipe("events", &event("10:03:00", "a", 4))
        .pipe("events", &event("10:03:10", "b", 7))
        .pipe("events", &event("10:03:20", "c", 1))
        .batch_at("2026-01-01T10:40:00Z")
        .pipe("events", &event("10:39:00", "d", 2))
}

fn impressions_before(driver: PipelineTestDriver) -> PipelineTestDriver {
    let impression =
        |ad: &str, t: &str| format!(r#"{{"adId": "{ad}", "impressionTime": "2026-01-01T{t}Z"}}"#);
    let click =
        |ad: &str, t: &str| format!(r#"{{"clickAdId": "{ad}", "clickTime": "2026-01-01T{t}Z"}}"#);
    driver
        .batch_at("2026-01-01T10:01:00Z")
        .pipe("impressions", &impression("1", "10:00:00"))
        .pipe("impressions", &impression("2", "10:00:30"))
        .pipe("clicks", &click("3", "10:00:40"))
}

fn impressions_after(driver: PipelineTestDriver) -> PipelineTestDriver {
    let impression =
        |ad: &str, t: &str| format!(r#"{{"adId": "{ad}", "impressionTime": "2026-01-01T{t}Z"}}"#);
    let click =
        |ad: &str, t: &str| format!(r#"{{"clickAdId": "{ad}", "clickTime": "2026-01-01T{t}Z"}}"#);
    driver
        .batch_at("2026-01-01T10:06:00Z")
        .pipe("clicks", &click("1", "10:05:00"))
        .pipe("impressions", &impression("3", "10:00:20"))
        .batch_at("2026-01-01T11:30:00Z")
        .pipe("impressions", &impression("9", "11:29:00"))
        .pipe("clicks", &click("9", "11:29:30"))
}

fn customers_before(driver: PipelineTestDriver) -> PipelineTestDriver {
    driver
        .batch_at("2026-01-01T10:00:00Z")
        .pipe_to(
            "customers",
            0,
            Some("c1"),
            r#"{"id": "c1", "tier": "gold"}"#,
        )
        .pipe_to(
            "customers",
            0,
            Some("c2"),
            r#"{"id": "c2", "tier": "silver"}"#,
        )
        .pipe_to(
            "orders",
            0,
            Some("c1"),
            r#"{"orderId": "o1", "customerId": "c1"}"#,
        )
}

fn customers_after(driver: PipelineTestDriver) -> PipelineTestDriver {
    driver
        .batch_at("2026-01-01T10:01:00Z")
        .pipe_to(
            "orders",
            0,
            Some("c2"),
            r#"{"orderId": "o2", "customerId": "c2"}"#,
        )
        .pipe_to(
            "orders",
            0,
            Some("c1"),
            r#"{"orderId": "o3", "customerId": "c1"}"#,
        )
        .pipe_to(
            "orders",
            0,
            Some("c3"),
            r#"{"orderId": "o4", "customerId": "c3"}"#,
        )
}

#[derive(Deserialize)]
struct Purchase {
    t: String,
    x: i64,
}

#[derive(Serialize)]
struct Summary {
    k: String,
    what: String,
    n: i64,
}

/// Every state kind and an event-time timer: a total (value), the amounts
/// (list) and a count per amount (map); a timer a minute after each
/// purchase reports the total.
struct Totals {
    total: ValueState<i64>,
    amounts: ListState<i64>,
    by_amount: MapState<i64, u64>,
}

impl StatefulProcessor for Totals {
    type Input = Purchase;
    type Output = Summary;
    fn handle_inputs(
        &mut self,
        key: &GroupKey,
        rows: Vec<Purchase>,
        ctx: &mut ProcessorContext<'_, Summary>,
    ) -> ProcessorResult {
        let k = key.as_str().unwrap_or_default().to_string();
        for p in rows {
            let total = self.total.get(ctx)?.unwrap_or(0) + p.x;
            self.total.set(ctx, &total)?;
            self.amounts.append(ctx, &p.x)?;
            let n = self.by_amount.get(ctx, &p.x)?.unwrap_or(0) + 1;
            self.by_amount.put(ctx, &p.x, &n)?;
            let at = tidemark::time::parse_rfc3339(&p.t).unwrap_or_default() + 60_000_000;
            ctx.register_event_time_timer(at)?;
            let amounts = self.amounts.get(ctx)?.len() as i64;
            ctx.emit(Summary {
                k: k.clone(),
                what: "total".into(),
                n: total,
            });
            ctx.emit(Summary {
                k: k.clone(),
                what: "amounts".into(),
                n: amounts,
            });
            ctx.emit(Summary {
                k: k.clone(),
                what: format!("seen {}", p.x),
                n: n as i64,
            });
        }
        Ok(())
    }

    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        _timer: Timer,
        ctx: &mut ProcessorContext<'_, Summary>,
    ) -> ProcessorResult {
        let k = key.as_str().unwrap_or_default().to_string();
        let total = self.total.get(ctx)?.unwrap_or(0);
        ctx.emit(Summary {
            k,
            what: "timer".into(),
            n: total,
        });
        Ok(())
    }
}

fn processor() -> PipelineTestDriver {
    let query = Query::builder("fixture-processor")
        .event_time("t")
        .watermark("10 seconds")
        .unwrap()
        .process("totals", &["k"], |states: &mut StateDeclarations| {
            Ok(Totals {
                total: states.value("total")?,
                amounts: states.list("amounts")?,
                by_amount: states.map("by_amount")?,
            })
        })
        .unwrap()
        .output_mode(OutputMode::Update);
    PipelineTestDriver::new(query)
}

fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "windows",
            query: || pipeline(WINDOWS),
            first: events_before,
            second: events_after,
        },
        Scenario {
            name: "sessions",
            query: || pipeline(SESSIONS),
            first: events_before,
            second: events_after,
        },
        Scenario {
            name: "dedup",
            query: || pipeline(DEDUP),
            first: events_before,
            second: events_after,
        },
        Scenario {
            name: "join",
            query: || pipeline(JOIN),
            first: impressions_before,
            second: impressions_after,
        },
        Scenario {
            name: "table-join",
            query: || pipeline(TABLE_JOIN),
            first: customers_before,
            second: customers_after,
        },
        Scenario {
            name: "rolling",
            query: || pipeline(ROLLING),
            first: events_before,
            second: events_after,
        },
        Scenario {
            name: "processor",
            query: processor,
            first: events_before,
            second: events_after,
        },
    ]
}

#[test]
fn state_written_by_an_earlier_release_restores_as_this_ones_does() {
    let mut failed = Vec::new();
    for scenario in scenarios() {
        let name = scenario.name;
        if let Err(panic) = std::panic::catch_unwind(|| scenario.check()) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{name}: {message}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}
