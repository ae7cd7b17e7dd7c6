//! Property tests of windowed aggregation against a brute-force model of
//! Spark's micro-batch rules.

use proptest::prelude::*;
use std::collections::BTreeMap;
use tidemark::prelude::*;
use tidemark::runtime::testing::{CollectSink, VecSource};

/// (key, event time in seconds, amount)
type Event = (u8, i64, i64);

fn run(batches: &[Vec<Event>], window: &WindowSpec, delay_s: i64, mode: OutputMode) -> CollectSink {
    let lines: Vec<Vec<String>> = batches
        .iter()
        .map(|b| {
            b.iter()
                .map(|(k, t, a)| format!(r#"{{"t": {}, "k": "k{k}", "a": {a}}}"#, t * 1000))
                .collect()
        })
        .collect();
    let query = Query::builder("prop")
        .event_time("t")
        .watermark(&format!("{delay_s} seconds"))
        .unwrap()
        .window_aggregate(
            ["k"],
            window.clone(),
            vec![
                AggregateSpec::count(),
                AggregateSpec::new(
                    AggregateFn::built_in("sum").unwrap(),
                    AggregateInput::Column("a".into()),
                ),
            ],
        )
        .output_mode(mode)
        .trigger(Trigger::AvailableNow)
        .build()
        .unwrap();
    let mut sink = CollectSink::default();
    query
        .run(&mut VecSource::json_batches(lines), &mut sink)
        .unwrap();
    sink
}

/// (key, window start µs, window end µs) → (count, sum)
type Groups = BTreeMap<(String, i64, i64), (i64, i64)>;

/// The brute force: every event in every window it belongs to, except
/// (when `judge_late`) windows that ended at or before the previous batch's
/// watermark.
fn model(batches: &[Vec<Event>], window: &WindowSpec, delay_s: i64, judge_late: bool) -> Groups {
    let mut groups = Groups::new();
    let (mut previous, mut in_effect, mut max_t) = (0i64, 0i64, i64::MIN);
    for batch in batches {
        for &(k, t, a) in batch {
            let micros = t * 1_000_000;
            for w in window.assign(micros) {
                if judge_late && w.end <= previous {
                    continue;
                }
                let g = groups.entry((format!("k{k}"), w.start, w.end)).or_default();
                g.0 += 1;
                g.1 += a;
            }
            max_t = max_t.max(micros);
        }
        previous = in_effect;
        if max_t != i64::MIN {
            in_effect = in_effect.max(max_t - delay_s * 1_000_000);
        }
    }
    groups
}

fn latest_per_group(sink: &CollectSink) -> Groups {
    let mut out = Groups::new();
    for row in &sink.rows {
        let key = match (row.get("k"), row.get("window_start"), row.get("window_end")) {
            (Some(Value::Str(k)), Some(Value::Timestamp(s)), Some(Value::Timestamp(e))) => {
                (k.to_string(), *s, *e)
            }
            other => panic!("unexpected row {other:?}"),
        };
        let (Some(Value::Long(n)), Some(Value::Long(sum))) = (row.get("count"), row.get("sum(a)"))
        else {
            panic!("unexpected aggregates in {row:?}")
        };
        out.insert(key, (*n, *sum));
    }
    out
}

fn windows() -> impl Strategy<Value = WindowSpec> {
    prop_oneof![
        Just(WindowSpec::tumbling("1 minute").unwrap()),
        Just(WindowSpec::sliding("1 minute", "20 seconds").unwrap()),
        Just(WindowSpec::sliding("90 seconds", "30 seconds").unwrap()),
    ]
}

fn streams() -> impl Strategy<Value = Vec<Vec<Event>>> {
    prop::collection::vec(
        prop::collection::vec((0u8..3, 0i64..600, -5i64..20), 0..8),
        1..6,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn complete_mode_equals_brute_force(batches in streams(), window in windows(), delay in 0i64..200) {
        let sink = run(&batches, &window, delay, OutputMode::Complete);
        // The last batch's output is the whole result table.
        let last = sink.batch_ids.iter().max().copied();
        let mut final_table = CollectSink::default();
        for (row, b) in sink.rows.iter().zip(&sink.batch_ids) {
            if Some(*b) == last {
                final_table.rows.push(row.clone());
            }
        }
        prop_assert_eq!(latest_per_group(&final_table), model(&batches, &window, delay, false));
    }

    #[test]
    fn update_mode_last_values_equal_brute_force_over_non_late_events(
        batches in streams(), window in windows(), delay in 0i64..200,
    ) {
        let sink = run(&batches, &window, delay, OutputMode::Update);
        prop_assert_eq!(latest_per_group(&sink), model(&batches, &window, delay, true));
    }

    #[test]
    fn append_mode_writes_each_closed_window_once_with_its_final_value(
        batches in streams(), window in windows(), delay in 0i64..200,
    ) {
        let sink = run(&batches, &window, delay, OutputMode::Append);
        let written = latest_per_group(&sink);
        prop_assert_eq!(written.len(), sink.rows.len(), "a window was written twice");
        let expected = model(&batches, &window, delay, true);
        for (group, value) in &written {
            prop_assert_eq!(expected.get(group), Some(value));
        }
    }
}
