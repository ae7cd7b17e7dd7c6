//! The window aggregation's vectorized path (`on_columns`) against its row
//! path (`on_row`): random batches through both, the same rows out, the
//! same late rows, the same state.

use crate::columns::rows_of;
use crate::row::Value;
use crate::window::WindowSpec;
use crate::{AggregateSpec, BatchContext, Operator, OutputMode, TimeColumn, WindowAggregate};
use arrow_array::TimestampMicrosecondArray;
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use proptest::prelude::*;
use std::sync::Arc;

const MINUTE: i64 = 60_000_000;
const START: i64 = 1_767_225_600_000_000;

/// One input row: minute of event time, key, group, amount (each may be
/// NULL).
type Event = (Option<u8>, Option<u8>, Option<u8>, Option<i16>);

/// `events` as a batch; the event time as microsecond timestamps, or as
/// epoch milliseconds in a long column (`millis`).
fn batch(events: &[Event], millis: bool) -> RecordBatch {
    let time_type = match millis {
        true => DataType::Int64,
        false => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    };
    let schema = Schema::new(vec![
        Field::new("event_time", time_type, true),
        Field::new("id", DataType::Utf8, true),
        Field::new("grp", DataType::Int64, true),
        Field::new("amount", DataType::Float64, true),
    ]);
    let times = events
        .iter()
        .map(|e| e.0.map(|m| START + m as i64 * MINUTE - 7));
    let time: ArrayRef = match millis {
        true => Arc::new(Int64Array::from_iter(times.map(|t| t.map(|t| t / 1000)))),
        false => Arc::new(TimestampMicrosecondArray::from_iter(times).with_timezone("UTC")),
    };
    let ids: StringArray = events
        .iter()
        .map(|e| e.1.map(|k| format!("key-{k}")))
        .collect();
    let groups: Int64Array = events.iter().map(|e| e.2.map(|g| g as i64)).collect();
    let amounts: Float64Array = events.iter().map(|e| e.3.map(|a| a as f64)).collect();
    let columns: Vec<ArrayRef> = vec![time, Arc::new(ids), Arc::new(groups), Arc::new(amounts)];
    RecordBatch::try_new(Arc::new(schema), columns).unwrap()
}

fn aggregation(window: &WindowSpec, mode: OutputMode) -> WindowAggregate {
    WindowAggregate::new(
        vec![Arc::from("id"), Arc::from("grp")],
        TimeColumn::EventTime(Arc::from("event_time")),
        window.clone(),
        vec![
            AggregateSpec::count(),
            AggregateSpec::of("sum", "amount").unwrap(),
            AggregateSpec::of("avg", "amount").unwrap(),
            AggregateSpec::of("min", "id").unwrap(),
            AggregateSpec::by("max_by", "id", "amount").unwrap(),
        ],
        mode,
    )
}

/// Everything the aggregation gives per batch, as text: its rows, its late
/// rows, its state's size.
fn run(
    window: &WindowSpec,
    mode: OutputMode,
    batches: &[RecordBatch],
    columnar: bool,
) -> Vec<String> {
    let mut op = aggregation(window, mode);
    let mut seen = Vec::new();
    let mut watermark = 0;
    for (batch_id, batch) in batches.iter().enumerate() {
        let max_time = rows_of(batch)
            .unwrap()
            .iter()
            .filter_map(|r| match r.get("event_time") {
                Some(Value::Timestamp(t)) => Some(*t),
                Some(Value::Long(ms)) => Some(ms * 1000),
                _ => None,
            })
            .max();
        let next_watermark = max_time.map_or(watermark, |t| watermark.max(t - 5 * MINUTE));
        let ctx = BatchContext {
            batch_id: batch_id as u64,
            processing_time: 0,
            late_threshold: watermark,
            watermark: next_watermark,
            collect_late_rows: true,
            real_time: false,
        };
        let mut out = Vec::new();
        match columnar {
            true => op.on_columns(batch, &ctx, &mut out).unwrap(),
            false => {
                for row in rows_of(batch).unwrap() {
                    op.on_row(row, &ctx, &mut out).unwrap();
                }
            }
        }
        op.on_batch_end(&ctx, &mut out).unwrap();
        seen.extend(out.iter().map(|r| format!("out {}", r.to_json())));
        seen.extend(
            op.take_late_rows()
                .iter()
                .map(|r| format!("late {}", r.to_json())),
        );
        let state = op.state_progress().unwrap();
        seen.push(format!(
            "state {} updated {} removed {} late {}",
            state.num_rows_total,
            state.num_rows_updated,
            state.num_rows_removed,
            state.num_rows_dropped_by_watermark
        ));
        watermark = next_watermark;
    }
    seen
}

fn event() -> impl Strategy<Value = Event> {
    (
        proptest::option::weighted(0.95, 0u8..40),
        proptest::option::weighted(0.9, 0u8..5),
        proptest::option::weighted(0.9, 0u8..2),
        proptest::option::weighted(0.9, -50i16..50),
    )
}

proptest! {
    #[test]
    fn columns_and_rows_give_the_same_windows(
        batches in proptest::collection::vec(proptest::collection::vec(event(), 0..30), 1..6),
        window in 0usize..3,
        mode in 0usize..3,
        millis in proptest::bool::ANY,
    ) {
        let window = [
            WindowSpec::tumbling("5 minutes").unwrap(),
            WindowSpec::sliding("10 minutes", "5 minutes").unwrap(),
            WindowSpec::session("3 minutes").unwrap(),
        ][window]
            .clone();
        let mode = [OutputMode::Append, OutputMode::Update, OutputMode::Complete][mode];
        let batches: Vec<RecordBatch> = batches.iter().map(|b| batch(b, millis)).collect();
        prop_assert_eq!(
            run(&window, mode, &batches, true),
            run(&window, mode, &batches, false)
        );
    }
}
