//! The stateful processor API through the test driver: each state kind,
//! TTL expiry, both timer kinds, timer deletion, restore of state and
//! pending timers on a new run, a state type gaining a field, bad input
//! and a failing processor.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tidemark::operators::processor::*;
use tidemark::prelude::*;
use tidemark::runtime::InMemoryStateBackend;
use tidemark::test_driver::PipelineTestDriver;
use tidemark::time::parse_rfc3339;

#[derive(Deserialize)]
struct Event {
    ts: String,
    #[serde(default)]
    amount: f64,
    #[serde(default)]
    action: String,
}

#[derive(Serialize, Debug)]
struct Out {
    user: String,
    what: String,
    n: f64,
}

fn out(user: &str, what: &str, n: f64) -> Out {
    Out {
        user: user.into(),
        what: what.into(),
        n,
    }
}

fn micros(text: &str) -> i64 {
    parse_rfc3339(text).expect("an RFC 3339 time")
}

fn user_of(key: &GroupKey) -> String {
    key.as_str().unwrap_or_default().to_string()
}

/// Keeps a running total (value), every amount (list) and a count per
/// action (map); `action: "clear"` forgets the user.
struct Totals {
    total: ValueState<f64>,
    amounts: ListState<f64>,
    by_action: MapState<String, u64>,
}

impl StatefulProcessor for Totals {
    type Input = Event;
    type Output = Out;
    fn handle_inputs(
        &mut self,
        key: &GroupKey,
        rows: Vec<Event>,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        let user = user_of(key);
        for e in rows {
            if e.action == "clear" {
                ctx.clear_all()?;
                ctx.emit(out(&user, "cleared", 0.0));
                continue;
            }
            let total = self.total.get(ctx)?.unwrap_or(0.0) + e.amount;
            self.total.set(ctx, &total)?;
            self.amounts.append(ctx, &e.amount)?;
            let n = self.by_action.get(ctx, &e.action)?.unwrap_or(0) + 1;
            self.by_action.put(ctx, &e.action, &n)?;
            ctx.emit(out(&user, "total", total));
            ctx.emit(out(&user, "amounts", self.amounts.get(ctx)?.len() as f64));
            ctx.emit(out(&user, &format!("action:{}", e.action), n as f64));
        }
        Ok(())
    }
}

/// Builds a task's [`Totals`], declaring its three states.
fn new_totals(states: &mut StateDeclarations) -> tidemark::Result<Totals> {
    Ok(Totals {
        total: states.value("total")?,
        amounts: states.list("amounts")?,
        by_action: states.map("by_action")?,
    })
}

fn totals(backend: &InMemoryStateBackend) -> tidemark::runtime::QueryBuilder {
    Query::builder("totals")
        .state_backend(backend.clone())
        .process("totals", &["user"], new_totals)
        .unwrap()
        .output_mode(OutputMode::Update)
}

fn rows_of(run: &tidemark::test_driver::TestRun) -> Vec<(String, String, f64)> {
    run.output
        .iter()
        .map(|(_, r)| {
            let text = |c: &str| match r.get(c) {
                Some(Value::Str(s)) => s.to_string(),
                other => panic!("{c}: {other:?}"),
            };
            let n = r.get("n").and_then(Value::as_f64).expect("n");
            (text("user"), text("what"), n)
        })
        .collect()
}

#[test]
fn value_list_and_map_state_carry_across_batches_and_runs_and_clear_all_forgets() {
    let backend = InMemoryStateBackend::default();
    let run = PipelineTestDriver::new(totals(&backend))
        .batch_at("2026-01-01T00:00:00Z")
        .pipe(
            "t",
            r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "amount": 2, "action": "buy"}"#,
        )
        .pipe(
            "t",
            r#"{"user": "b", "ts": "2026-01-01T00:00:00Z", "amount": 5, "action": "buy"}"#,
        )
        .batch_at("2026-01-01T00:01:00Z")
        .pipe(
            "t",
            r#"{"user": "a", "ts": "2026-01-01T00:01:00Z", "amount": 3, "action": "sell"}"#,
        )
        .run()
        .unwrap();
    let rows = rows_of(&run);
    assert!(
        rows.contains(&("a".into(), "total".into(), 5.0)),
        "{rows:?}"
    );
    assert!(
        rows.contains(&("a".into(), "amounts".into(), 2.0)),
        "{rows:?}"
    );
    assert!(
        rows.contains(&("a".into(), "action:sell".into(), 1.0)),
        "{rows:?}"
    );
    assert!(
        rows.contains(&("b".into(), "total".into(), 5.0)),
        "{rows:?}"
    );
    // A new run over the same backend finds the state (a restart).
    let run = PipelineTestDriver::new(totals(&backend))
        .batch_at("2026-01-01T00:02:00Z")
        .pipe(
            "t",
            r#"{"user": "a", "ts": "2026-01-01T00:02:00Z", "amount": 1, "action": "buy"}"#,
        )
        .pipe(
            "t",
            r#"{"user": "b", "ts": "2026-01-01T00:02:00Z", "action": "clear"}"#,
        )
        .pipe(
            "t",
            r#"{"user": "b", "ts": "2026-01-01T00:02:00Z", "amount": 1, "action": "buy"}"#,
        )
        .run()
        .unwrap();
    let rows = rows_of(&run);
    assert_eq!(
        rows,
        [
            ("a".into(), "total".into(), 6.0),
            ("a".into(), "amounts".into(), 3.0),
            ("a".into(), "action:buy".into(), 2.0),
            ("b".into(), "cleared".into(), 0.0),
            ("b".into(), "total".into(), 1.0),
            ("b".into(), "amounts".into(), 1.0),
            ("b".into(), "action:buy".into(), 1.0),
        ]
    );
    let progress = &run.progress[0].state_operators[0];
    assert_eq!(progress.operator_name, "transformWithStateExec");
    assert_eq!(progress.custom_metrics["numRowsHandled"], 3);
}

/// Remembers each user's last amount for one minute of processing time.
struct Remember {
    last: ValueState<f64>,
}

impl StatefulProcessor for Remember {
    type Input = Event;
    type Output = Out;
    fn handle_inputs(
        &mut self,
        key: &GroupKey,
        rows: Vec<Event>,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        for e in rows {
            let before = self.last.get(ctx)?;
            ctx.emit(out(&user_of(key), "before", before.unwrap_or(-1.0)));
            if e.action != "peek" {
                self.last.set(ctx, &e.amount)?;
            }
        }
        Ok(())
    }
}

#[test]
fn a_ttl_expires_state_a_processing_time_span_after_it_was_set() {
    let run = PipelineTestDriver::new(
        Query::builder("ttl")
            .process("remember", &["user"], |s| {
                Ok(Remember {
                    last: s.value_with_ttl("last", Some(Duration::from_secs(60)))?,
                })
            })
            .unwrap()
            .output_mode(OutputMode::Update),
    )
    .batch_at("2026-01-01T00:00:00Z")
    .pipe(
        "t",
        r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "amount": 7}"#,
    )
    .batch_at("2026-01-01T00:00:59Z")
    .pipe(
        "t",
        r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "action": "peek"}"#,
    )
    .batch_at("2026-01-01T00:01:00Z")
    .pipe(
        "t",
        r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "action": "peek"}"#,
    )
    .run()
    .unwrap();
    let before: Vec<f64> = rows_of(&run).into_iter().map(|r| r.2).collect();
    assert_eq!(
        before,
        [-1.0, 7.0, -1.0],
        "set at 00:00, alive at 00:00:59, gone at 00:01"
    );
    let removed =
        run.progress[2].state_operators[0].custom_metrics["numValuesRemovedDueToTTLExpiry"];
    assert_eq!(removed, 1, "the expired value is removed from the store");
}

/// Sets an event-time timer 10 minutes after each row and a
/// processing-time timer 5 minutes after the batch; `action: "cancel"`
/// deletes the user's event-time timers.
struct Alarms;

impl StatefulProcessor for Alarms {
    type Input = Event;
    type Output = Out;
    fn handle_inputs(
        &mut self,
        _key: &GroupKey,
        rows: Vec<Event>,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        for e in rows {
            if e.action == "cancel" {
                for t in ctx.timers()? {
                    if t.domain == TimeDomain::EventTime {
                        ctx.delete_timer(t.domain, t.time)?;
                    }
                }
                continue;
            }
            if e.action == "wall" {
                let at = ctx.processing_time() + 300_000_000;
                ctx.register_processing_time_timer(at)?;
                continue;
            }
            ctx.register_event_time_timer(micros(&e.ts) + 600_000_000)?;
        }
        Ok(())
    }

    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        timer: Timer,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        let what = match timer.domain {
            TimeDomain::EventTime => "event_time_timer",
            TimeDomain::ProcessingTime => "processing_time_timer",
        };
        let midnight = micros("2026-01-01T00:00:00Z");
        ctx.emit(out(
            &user_of(key),
            what,
            ((timer.time - midnight) / 60_000_000) as f64,
        ));
        Ok(())
    }
}

fn alarms(backend: &InMemoryStateBackend) -> tidemark::runtime::QueryBuilder {
    Query::builder("alarms")
        .event_time("ts")
        .watermark("0 seconds")
        .unwrap()
        .state_backend(backend.clone())
        .process("alarms", &["user"], |_| Ok(Alarms))
        .unwrap()
        .output_mode(OutputMode::Update)
}

#[test]
fn event_time_timers_fire_once_the_watermark_reaches_them_and_deleted_ones_never() {
    let backend = InMemoryStateBackend::default();
    let run = PipelineTestDriver::new(alarms(&backend))
        .batch_at("2026-01-01T01:00:00Z")
        .pipe("t", r#"{"user": "a", "ts": "2026-01-01T00:00:00Z"}"#)
        .pipe("t", r#"{"user": "b", "ts": "2026-01-01T00:01:00Z"}"#)
        .batch_at("2026-01-01T01:00:01Z")
        .pipe(
            "t",
            r#"{"user": "b", "ts": "2026-01-01T00:02:00Z", "action": "cancel"}"#,
        )
        .pipe("t", r#"{"user": "c", "ts": "2026-01-01T00:09:59Z"}"#)
        .batch_at("2026-01-01T01:00:02Z")
        .pipe("t", r#"{"user": "c", "ts": "2026-01-01T00:10:00Z"}"#)
        .run()
        .unwrap();
    // Batch 2's watermark is 00:09:59 (batch 1's maximum): a's timer at
    // 00:10 waits; the trailing no-data batch's, 00:10, reaches it.
    let fired: Vec<(u64, String, f64)> = run
        .output
        .iter()
        .map(|(b, r)| {
            let user = r.get("user").map(|v| v.to_string()).unwrap_or_default();
            (
                *b,
                user,
                r.get("n").and_then(Value::as_f64).unwrap_or(f64::NAN),
            )
        })
        .collect();
    assert_eq!(fired, [(3, "a".to_string(), 10.0)], "{fired:?}");
    // c's timers (00:19:59, 00:20) are pending: a new run finds them.
    let run = PipelineTestDriver::new(alarms(&backend))
        .batch_at("2026-01-01T02:00:00Z")
        .pipe(
            "t",
            r#"{"user": "d", "ts": "2026-01-01T00:30:00Z", "action": "cancel"}"#,
        )
        .run()
        .unwrap();
    let users: Vec<String> = run
        .output
        .iter()
        .map(|(_, r)| r.get("user").map(|v| v.to_string()).unwrap_or_default())
        .collect();
    assert_eq!(users, ["c", "c"], "restored timers fire after a restart");
}

#[test]
fn a_processing_time_timer_fires_in_the_first_batch_at_or_after_its_time() {
    let run = PipelineTestDriver::new(alarms(&InMemoryStateBackend::default()))
        .batch_at("2026-01-01T00:00:00Z")
        .pipe(
            "t",
            r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "action": "wall"}"#,
        )
        .batch_at("2026-01-01T00:04:59Z")
        .pipe(
            "t",
            r#"{"user": "b", "ts": "2026-01-01T00:00:00Z", "action": "cancel"}"#,
        )
        .batch_at("2026-01-01T00:05:00Z")
        .pipe(
            "t",
            r#"{"user": "b", "ts": "2026-01-01T00:00:00Z", "action": "cancel"}"#,
        )
        .run()
        .unwrap();
    let fired: Vec<(u64, String)> = run
        .output
        .iter()
        .map(|(b, r)| (*b, r.get("what").map(|v| v.to_string()).unwrap_or_default()))
        .collect();
    assert_eq!(fired, [(2, "processing_time_timer".to_string())]);
}

#[test]
fn the_driver_moves_processing_time_and_event_time_without_rows() {
    // Processing time: a batch fed nothing runs when a timer is due at its
    // time, and only then (Spark's AdvanceManualClock).
    let run = PipelineTestDriver::new(alarms(&InMemoryStateBackend::default()))
        .batch_at("2026-01-01T00:00:00Z")
        .pipe(
            "t",
            r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "action": "wall"}"#,
        )
        .batch_at("2026-01-01T00:04:00Z")
        .batch_at("2026-01-01T00:05:00Z")
        .batch_at("2026-01-01T00:06:00Z")
        .run()
        .unwrap();
    let fired: Vec<(u64, String)> = run
        .output
        .iter()
        .map(|(b, r)| (*b, r.get("what").map(|v| v.to_string()).unwrap_or_default()))
        .collect();
    assert_eq!(fired, [(2, "processing_time_timer".to_string())]);
    // 00:04 runs the no-data batch batch 0's first watermark owes; 00:05
    // the timer's; 00:06 has nothing due and runs no batch.
    assert_eq!(run.progress.len(), 3, "no batch at 00:06");
    assert_eq!(run.progress[2].num_input_rows, 0);
    // Event time: the partition's watermark moves as a row at 00:30 would
    // move it, with no row; the timer at 00:10 fires in the next batch.
    let run = PipelineTestDriver::new(alarms(&InMemoryStateBackend::default()))
        .batch_at("2026-01-01T01:00:00Z")
        .pipe("t", r#"{"user": "a", "ts": "2026-01-01T00:00:00Z"}"#)
        .batch_at("2026-01-01T01:00:01Z")
        .advance_event_time("t", 0, "2026-01-01T00:09:59Z")
        .batch_at("2026-01-01T01:00:02Z")
        .advance_event_time("t", 0, "2026-01-01T00:30:00Z")
        .run()
        .unwrap();
    let fired: Vec<(u64, String, f64)> = run
        .output
        .iter()
        .map(|(b, r)| {
            let what = r.get("what").map(|v| v.to_string()).unwrap_or_default();
            let n = r.get("n").and_then(Value::as_f64).unwrap_or(f64::NAN);
            (*b, what, n)
        })
        .collect();
    assert_eq!(
        fired,
        [(3, "event_time_timer".to_string(), 10.0)],
        "{fired:?}"
    );
    let watermarks: Vec<Option<String>> = run
        .progress
        .iter()
        .map(|p| p.event_time.get("watermark").cloned())
        .collect();
    assert_eq!(
        watermarks.last().cloned().flatten().as_deref(),
        Some("2026-01-01T00:30:00Z"),
        "{watermarks:?}"
    );
}

/// The state as a first version wrote it.
#[derive(Serialize, Deserialize)]
struct SeenV1 {
    count: u64,
}

/// The same state with a field added (with a default).
#[derive(Serialize, Deserialize)]
struct SeenV2 {
    count: u64,
    #[serde(default)]
    total: f64,
}

struct CountV1(ValueState<SeenV1>);
struct CountV2(ValueState<SeenV2>);

impl StatefulProcessor for CountV1 {
    type Input = Event;
    type Output = Out;
    fn handle_inputs(
        &mut self,
        _: &GroupKey,
        rows: Vec<Event>,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        let count = self.0.get(ctx)?.map_or(0, |s| s.count) + rows.len() as u64;
        self.0.set(ctx, &SeenV1 { count })
    }
}

impl StatefulProcessor for CountV2 {
    type Input = Event;
    type Output = Out;
    fn handle_inputs(
        &mut self,
        key: &GroupKey,
        rows: Vec<Event>,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        let mut seen = self.0.get(ctx)?.unwrap_or(SeenV2 {
            count: 0,
            total: 0.0,
        });
        for e in rows {
            seen.count += 1;
            seen.total += e.amount;
        }
        ctx.emit(out(&user_of(key), "count", seen.count as f64));
        ctx.emit(out(&user_of(key), "total", seen.total));
        self.0.set(ctx, &seen)
    }
}

#[test]
fn a_state_type_that_gains_a_defaulted_field_reads_what_the_old_version_wrote() {
    let backend = InMemoryStateBackend::default();
    PipelineTestDriver::new(
        Query::builder("v")
            .state_backend(backend.clone())
            .process("count", &["user"], |s| Ok(CountV1(s.value("seen")?)))
            .unwrap()
            .output_mode(OutputMode::Update),
    )
    .pipe(
        "t",
        r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "amount": 1}"#,
    )
    .pipe(
        "t",
        r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "amount": 1}"#,
    )
    .run()
    .unwrap();
    let run = PipelineTestDriver::new(
        Query::builder("v")
            .state_backend(backend)
            .process("count", &["user"], |s| Ok(CountV2(s.value("seen")?)))
            .unwrap()
            .output_mode(OutputMode::Update),
    )
    .pipe(
        "t",
        r#"{"user": "a", "ts": "2026-01-01T00:00:00Z", "amount": 4}"#,
    )
    .run()
    .unwrap();
    let rows = rows_of(&run);
    assert_eq!(
        rows,
        [
            ("a".into(), "count".into(), 3.0),
            ("a".into(), "total".into(), 4.0)
        ]
    );
}

/// Fails on user `bad`: with an error, or a panic for `panic`.
struct Picky;

impl StatefulProcessor for Picky {
    type Input = Event;
    type Output = Out;
    fn handle_inputs(
        &mut self,
        key: &GroupKey,
        rows: Vec<Event>,
        _: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        match key.as_str() {
            Some("bad") if rows[0].action == "panic" => panic!("cannot score this card"),
            Some("bad") => Err("a rule failed".into()),
            _ => Ok(()),
        }
    }
}

#[test]
fn a_failing_or_panicking_processor_fails_the_batch_naming_the_key_and_bad_input_is_a_dead_letter()
{
    for (action, reason) in [
        ("fail", "a rule failed"),
        ("panic", "panicked: cannot score this card"),
    ] {
        let e = PipelineTestDriver::new(
            Query::builder("p")
                .process("picky", &["user"], |_| Ok(Picky))
                .unwrap()
                .output_mode(OutputMode::Update),
        )
        .pipe("t", r#"{"user": "good", "ts": "2026-01-01T00:00:00Z"}"#)
        .pipe(
            "t",
            &format!(r#"{{"user": "bad", "ts": "2026-01-01T00:00:00Z", "action": "{action}"}}"#),
        )
        .run()
        .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, tidemark::Error::Processor { .. }), "{text}");
        assert!(text.contains("picky") && text.contains("[bad]"), "{text}");
        assert!(text.contains(reason), "{text}");
    }
    let run = PipelineTestDriver::new(
        Query::builder("p")
            .process("picky", &["user"], |_| Ok(Picky))
            .unwrap()
            .output_mode(OutputMode::Update),
    )
    .pipe("t", r#"{"user": "good", "ts": 5}"#)
    .pipe("t", r#"{"ts": "2026-01-01T00:00:00Z"}"#)
    .run()
    .unwrap();
    assert_eq!(run.dead_letters.len(), 2, "{:?}", run.dead_letters);
    assert!(
        run.dead_letters[0].1.contains("t/0@0"),
        "{}",
        run.dead_letters[0].1
    );
    assert!(
        run.dead_letters[1].1.contains("user"),
        "{}",
        run.dead_letters[1].1
    );
}

#[test]
fn declarations_and_output_modes_are_checked_when_the_query_is_built() {
    let twice = Query::builder("d").process("p", &["user"], |s| {
        s.value::<u64>("x")?;
        s.list::<u64>("x")?;
        Ok(Picky)
    });
    assert!(twice
        .err()
        .expect("refused")
        .to_string()
        .contains("declared twice"));
    let complete = Query::builder("d")
        .process("p", &["user"], |_| Ok(Picky))
        .unwrap()
        .output_mode(OutputMode::Complete)
        .build();
    assert!(complete
        .err()
        .expect("refused")
        .to_string()
        .contains("output_mode"));
    let no_keys = Query::builder("d").process("p", &[] as &[&str], |_| Ok(Picky));
    assert!(no_keys
        .err()
        .expect("refused")
        .to_string()
        .contains("process.keys"));
}

#[test]
fn a_pipeline_file_names_a_processor_the_program_registered() {
    let text = r#"
name: files-and-code
source: {kind: kafka, topic: t, schema: {user: string, ts: string, amount: double}}
steps:
  - filter: "amount > 0"
  - process: {processor: totals, keys: [user]}
output_mode: update
sink: {kind: stdout}
"#;
    let file = tidemark_pipeline::PipelineFile::parse(text).unwrap();
    let e = file.query_builder().err().expect("not registered");
    assert!(e.to_string().contains("steps[].process.processor"), "{e}");
    assert!(e.to_string().contains("totals"), "{e}");
    let file = file.with_processor("totals", new_totals);
    let decoder = tidemark::decode::JsonDecoder::new(file.schema());
    let run = PipelineTestDriver::new(file.query_builder().unwrap().decoder(decoder))
        .pipe("t", r#"{"user": "a", "ts": "x", "amount": 2}"#)
        .pipe("t", r#"{"user": "a", "ts": "x", "amount": -1}"#)
        .pipe("t", r#"{"user": "a", "ts": "x", "amount": 3}"#)
        .run()
        .unwrap();
    let totals: Vec<f64> = rows_of(&run)
        .into_iter()
        .filter(|r| r.1 == "total")
        .map(|r| r.2)
        .collect();
    assert_eq!(totals, [2.0, 5.0], "the filter ran before the processor");
}

/// Two event-time timers per key; the first to fire deletes the second.
struct Chain;

impl StatefulProcessor for Chain {
    type Input = Event;
    type Output = Out;
    fn handle_inputs(
        &mut self,
        _: &GroupKey,
        rows: Vec<Event>,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        let at = micros(&rows[0].ts);
        ctx.register_event_time_timer(at + 60_000_000)?;
        ctx.register_event_time_timer(at + 120_000_000)
    }
    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        timer: Timer,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        ctx.delete_timer(TimeDomain::EventTime, timer.time + 60_000_000)?;
        ctx.emit(out(&user_of(key), "fired", key.values().len() as f64));
        Ok(())
    }
}

#[test]
fn a_timer_deleted_by_a_handler_in_the_same_batch_does_not_fire_and_any_key_reads_back() {
    let run = PipelineTestDriver::new(
        Query::builder("chain")
            .event_time("ts")
            .watermark("0 seconds")
            .unwrap()
            .process("chain", &["user"], |_| Ok(Chain))
            .unwrap()
            .output_mode(OutputMode::Update),
    )
    .batch_at("2026-01-01T01:00:00Z")
    .pipe("t", r#"{"user": "a\u0000b", "ts": "2026-01-01T00:00:00Z"}"#)
    .batch_at("2026-01-01T01:00:01Z")
    .pipe("t", r#"{"user": "z", "ts": "2026-01-01T00:05:00Z"}"#)
    .run()
    .unwrap();
    // Both of a\0b's timers (00:01, 00:02) are due in batch 1: the first
    // deletes the second.
    let rows = rows_of(&run);
    assert_eq!(
        rows,
        [("a\u{0}b".to_string(), "fired".to_string(), 1.0)],
        "{rows:?}"
    );
}

/// The total a user starts from (Spark's initial state).
#[derive(Deserialize)]
struct OpeningTotal {
    total: f64,
    /// Sets an event-time timer there, to show timers can be seeded.
    #[serde(default)]
    alarm: Option<String>,
}

impl HandleInitialState<OpeningTotal> for Totals {
    fn handle_initial_state(
        &mut self,
        key: &GroupKey,
        state: OpeningTotal,
        ctx: &mut ProcessorContext<'_, Out>,
    ) -> ProcessorResult {
        self.total.set(ctx, &state.total)?;
        if let Some(at) = state.alarm {
            ctx.register_event_time_timer(micros(&at))?;
        }
        ctx.emit(out(&user_of(key), "seeded", state.total));
        Ok(())
    }
}

fn seeded_totals(keyed: bool) -> tidemark::Result<tidemark::runtime::QueryBuilder> {
    let mut b = Query::builder("seeded")
        .event_time("ts")
        .watermark("0 seconds")?;
    if keyed {
        b = b.keyed_by(&["user"]);
    }
    let opening =
        tidemark::runtime::JoinInput::table("opening").columns(&["user", "total", "alarm"]);
    Ok(b.process_with_initial_state::<_, OpeningTotal, _, _>(
        "totals",
        &["user"],
        new_totals,
        opening,
    )?
    .output_mode(OutputMode::Update))
}

#[test]
fn an_initial_state_seeds_state_and_timers_before_the_keys_rows() {
    let run = PipelineTestDriver::new(seeded_totals(true).unwrap())
        .batch_at("2026-01-01T00:00:00Z")
        .pipe("opening", r#"{"user": "a", "total": 100.0}"#)
        .pipe(
            "opening",
            r#"{"user": "b", "total": 7.0, "alarm": "2026-01-01T00:05:00Z"}"#,
        )
        // Read in the same batch as a's first row: seeded first.
        .pipe(
            "t",
            r#"{"user": "a", "ts": "2026-01-01T00:01:00Z", "amount": 5}"#,
        )
        .pipe("opening", r#"{"user": "c", "total": "lots"}"#)
        .batch_at("2026-01-01T00:00:01Z")
        .pipe(
            "t",
            r#"{"user": "b", "ts": "2026-01-01T00:10:00Z", "amount": 1}"#,
        )
        .run()
        .unwrap();
    let rows = rows_of(&run);
    let wanted = |user: &str, what: &str| {
        rows.iter()
            .filter(|(u, w, _)| u == user && w == what)
            .map(|(_, _, n)| *n)
            .collect::<Vec<f64>>()
    };
    assert_eq!(wanted("a", "seeded"), [100.0]);
    assert_eq!(
        wanted("a", "total"),
        [105.0],
        "seeded before its row: {rows:?}"
    );
    assert_eq!(wanted("b", "seeded"), [7.0]);
    assert_eq!(wanted("b", "total"), [8.0]);
    // b's seeded timer at 00:05 fired once the watermark (00:10) passed it
    // (Totals emits nothing on a timer; the progress counts it).
    let fired: u64 = run
        .progress
        .iter()
        .map(|p| p.state_operators[0].custom_metrics["numExpiredTimers"])
        .sum();
    assert_eq!(fired, 1);
    // An initial row that does not read as the type is a dead letter.
    assert_eq!(run.dead_letters.len(), 1, "{:?}", run.dead_letters);
    assert!(
        run.dead_letters[0].1.contains("initial state"),
        "{}",
        run.dead_letters[0].1
    );
    let seeded: u64 = run
        .progress
        .iter()
        .map(|p| p.state_operators[0].custom_metrics["numInitialStateRows"])
        .sum();
    assert_eq!(seeded, 2);
}

#[test]
fn an_initial_state_is_refused_where_the_processor_is_repartitioned() {
    let e = seeded_totals(false).err().expect("not keyed by user");
    assert!(
        e.to_string().contains("process.initial_state") && e.to_string().contains("keyed_by"),
        "{e}"
    );
}

#[test]
fn a_pipeline_file_seeds_a_processor_registered_with_an_initial_state() {
    let text = r#"
name: seeded-file
source: {kind: kafka, topic: t, keyed_by: [user], schema: {user: string, ts: string, amount: double}}
steps:
  - process:
      processor: totals
      keys: [user]
      initial_state: {topic: opening, schema: {user: string, total: double}}
output_mode: update
sink: {kind: stdout}
"#;
    let file = tidemark_pipeline::PipelineFile::parse(text).unwrap();
    let e = file
        .clone()
        .with_processor("totals", new_totals)
        .query_builder()
        .err()
        .expect("registered without an initial state");
    assert!(
        e.to_string().contains("steps[].process.initial_state"),
        "{e}"
    );
    let file = file.with_processor_and_initial_state::<_, OpeningTotal, _>("totals", new_totals);
    assert_eq!(file.input_topics().unwrap(), ["t", "opening"]);
    let run = file
        .test_driver()
        .unwrap()
        .pipe("opening", r#"{"user": "a", "total": 40}"#)
        .pipe("t", r#"{"user": "a", "ts": "x", "amount": 2}"#)
        .run()
        .unwrap();
    let totals: Vec<f64> = rows_of(&run)
        .into_iter()
        .filter(|r| r.1 == "total")
        .map(|r| r.2)
        .collect();
    assert_eq!(totals, [42.0], "the file's initial state seeded a");
}

#[test]
fn an_initial_state_after_a_stream_join_is_refused() {
    let stream = tidemark::runtime::JoinInput::new("clicks").event_time("ts");
    let b = Query::builder("joined")
        .event_time("ts")
        .watermark("0 seconds")
        .unwrap()
        .keyed_by(&["user"])
        .join(
            stream,
            tidemark::operators::JoinType::Inner,
            &[("user", "user")],
            tidemark::operators::JoinTimeCondition::None,
        );
    let Ok(b) = b else {
        panic!("the join builds");
    };
    let opening = tidemark::runtime::JoinInput::table("opening").columns(&["user", "total"]);
    let e = b
        .process_with_initial_state::<_, OpeningTotal, _, _>(
            "totals",
            &["user"],
            new_totals,
            opening,
        )
        .err()
        .expect("after a stream join");
    assert!(e.to_string().contains("clicks"), "{e}");
}
