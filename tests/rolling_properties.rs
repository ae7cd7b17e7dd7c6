//! The rolling-window operator against a brute-force model that recomputes
//! every range from all of a key's events at every batch: same rows, same
//! batches, in micro-batch mode.

use proptest::prelude::*;
use std::collections::BTreeMap;
use tidemark::operators::{BatchContext, FrontierSpec, Operator, RollingMeasure, RollingWindow};
use tidemark::row::{Row, Value};
use tidemark::runtime::StateBackend;

const SECOND: i64 = 1_000_000;
const DELAY: i64 = 3 * SECOND;
/// (function, range in seconds; 0 = lifetime)
const MEASURES: &[(&str, i64)] = &[
    ("sum", 20),
    ("count", 7),
    ("min", 20),
    ("max", 7),
    ("avg", 13),
    ("stddev_samp", 13),
    ("count", 0),
    ("sum", 0),
    ("max", 0),
];

fn operator() -> RollingWindow {
    let measures = MEASURES
        .iter()
        .enumerate()
        .map(|(i, (f, range))| {
            let m = RollingMeasure::of(f, "v").unwrap().alias(&format!("m{i}"));
            if *range > 0 {
                m.over(&format!("{range} seconds")).unwrap()
            } else {
                m
            }
        })
        .collect();
    RollingWindow::new(
        &["k"],
        "t",
        FrontierSpec::new("3 seconds", Some("frontier")).unwrap(),
        measures,
    )
    .unwrap()
}

/// The measures of one key at `frontier`, recomputed from scratch.
fn model_values(events: &[(i64, i64)], frontier: i64) -> Vec<Value> {
    MEASURES
        .iter()
        .map(|(f, range)| {
            let low = if *range > 0 {
                frontier - range * SECOND
            } else {
                i64::MIN
            };
            let xs: Vec<i64> = events
                .iter()
                .filter(|(t, _)| *t >= low && *t <= frontier)
                .map(|(_, v)| *v)
                .collect();
            let n = xs.len() as f64;
            let mean = xs.iter().sum::<i64>() as f64 / n;
            match *f {
                "count" => Value::Long(xs.len() as i64),
                _ if xs.is_empty() => Value::Null,
                "sum" => Value::Long(xs.iter().sum()),
                "min" => Value::Long(*xs.iter().min().unwrap()),
                "max" => Value::Long(*xs.iter().max().unwrap()),
                "avg" => Value::Double(mean),
                "stddev_samp" if xs.len() < 2 => Value::Null,
                "stddev_samp" => Value::Double(
                    (xs.iter().map(|x| (*x as f64 - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt(),
                ),
                other => unreachable!("{other}"),
            }
        })
        .collect()
}

fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Double(x), Value::Double(y)) => {
            (x - y).abs() <= 1e-6 * (1.0 + x.abs().max(y.abs()))
        }
        _ => a == b,
    }
}

fn empty_tuple() -> Vec<Value> {
    MEASURES
        .iter()
        .map(|(f, _)| {
            if *f == "count" {
                Value::Long(0)
            } else {
                Value::Null
            }
        })
        .collect()
}

/// One batch: seconds the clock moves, then events as (key, seconds
/// relative to the batch's processing time, value).
type Batch = (u8, Vec<(u8, i8, i8)>);

fn batches() -> impl Strategy<Value = Vec<Batch>> {
    prop::collection::vec(
        (
            0u8..12,
            prop::collection::vec((0u8..3, -40i8..10, -5i8..20), 0..8),
        ),
        1..25,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn rolling_window_matches_brute_force(batches in batches()) {
        check(batches)?;
    }
}

/// A case proptest found: a key whose events all entered before a restart
/// and that then only received an event after the frontier must not write
/// its unchanged values again.
#[test]
fn no_row_after_a_restart_when_only_a_waiting_event_arrives() {
    let mut batches: Vec<Batch> = vec![(0, vec![]); 12];
    batches.extend([
        (0, vec![(2, 1, 1)]),
        (3, vec![(2, 0, 0)]),
        (6, vec![(2, -2, 0)]),
        (9, vec![]),
        (0, vec![(2, 0, 0)]),
    ]);
    check(batches).unwrap();
}

/// Another: a standard deviation over equal values after others left the
/// range, against the same values read back after a restart.
#[test]
fn equal_values_after_removals_match_their_restored_state() {
    let batches: Vec<Batch> = vec![
        (0, vec![]),
        (0, vec![]),
        (0, vec![(2, -2, 18)]),
        (6, vec![]),
        (3, vec![(2, -5, 14)]),
        (0, vec![(2, 0, 3)]),
        (5, vec![(2, -9, 0)]),
        (8, vec![(2, -3, 3)]),
        (0, vec![(2, 0, 0)]),
    ];
    check(batches).unwrap();
}

fn check(batches: Vec<Batch>) -> Result<(), TestCaseError> {
    {
        // State goes through a store and is read back into a new operator
        // every fourth batch, as after a restart.
        let mut backend = tidemark::runtime::InMemoryStateBackend::default();
        let mut op = operator();
        op.open_state(backend.open(0, "op0").unwrap(), None)
            .unwrap();
        let mut events: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
        let mut last: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        let mut processing_time = 1_000_000 * SECOND;
        for (batch_id, (advance, rows)) in batches.into_iter().enumerate() {
            processing_time += advance as i64 * SECOND;
            let ctx = BatchContext {
                batch_id: batch_id as u64,
                processing_time,
                late_threshold: 0,
                watermark: 0,
                collect_late_rows: false,
                real_time: false,
            };
            let mut out = Vec::new();
            for (key, offset, value) in rows {
                let key = format!("k{key}");
                let t = processing_time + offset as i64 * SECOND;
                let mut row = Row::new();
                row.set("k", Value::from(key.as_str()));
                row.set("t", Value::Timestamp(t));
                row.set("v", Value::Long(value as i64));
                op.on_row(row, &ctx, &mut out).unwrap();
                events.entry(key).or_default().push((t, value as i64));
            }
            op.on_batch_end(&ctx, &mut out).unwrap();
            op.checkpoint().unwrap();
            if batch_id % 4 == 3 {
                op = operator();
                op.open_state(backend.open(0, "op0").unwrap(), None)
                    .unwrap();
            }

            let frontier = processing_time - DELAY;
            let mut expected: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for (key, evs) in &events {
                let values = model_values(evs, frontier);
                let previous = last.get(key).cloned().unwrap_or_else(empty_tuple);
                let same = previous.len() == values.len()
                    && previous.iter().zip(&values).all(|(a, b)| close(a, b));
                if !same {
                    expected.insert(key.clone(), values.clone());
                    last.insert(key.clone(), values);
                }
            }
            let mut actual: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for row in &out {
                let key = match row.get("k") {
                    Some(Value::Str(s)) => s.to_string(),
                    other => panic!("{other:?}"),
                };
                prop_assert_eq!(row.get("frontier"), Some(&Value::Timestamp(frontier)));
                let values: Vec<Value> = (0..MEASURES.len())
                    .map(|i| row.get(&format!("m{i}")).cloned().unwrap_or(Value::Null))
                    .collect();
                prop_assert!(
                    actual.insert(key.clone(), values).is_none(),
                    "one row per key per batch: {}",
                    key
                );
            }
            prop_assert_eq!(
                actual.keys().collect::<Vec<_>>(),
                expected.keys().collect::<Vec<_>>(),
                "batch {}: keys that emitted {:?}, model's last {:?}",
                batch_id,
                actual,
                last
            );
            for (key, want) in &expected {
                let got = &actual[key];
                prop_assert!(
                    got.iter().zip(want).all(|(a, b)| close(a, b)),
                    "batch {} key {}: got {:?}, want {:?}",
                    batch_id,
                    key,
                    got,
                    want
                );
            }
        }
    }
    Ok(())
}
