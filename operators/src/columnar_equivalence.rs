//! The window aggregation's vectorized path (`on_columns`) against its row
//! path (`on_row`): random batches through both, the same rows out, the
//! same late rows, the same state. The batches vary what the columnar
//! path reads differently: the event time as a timestamp, as epoch
//! milliseconds or not read (processing time), a 32-bit key column, an
//! aggregate's input column missing, late rows collected or not.

use crate::columns::rows_of;
use crate::row::Value;
use crate::window::WindowSpec;
use crate::{AggregateSpec, BatchContext, Operator, OutputMode, TimeColumn, WindowAggregate};
use arrow_array::TimestampMicrosecondArray;
use arrow_array::{ArrayRef, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use proptest::prelude::*;
use std::sync::Arc;

const MINUTE: i64 = 60_000_000;
const START: i64 = 1_767_225_600_000_000;

/// One input row: minute of event time, key, group, amount (each may be
/// NULL).
type Event = (Option<u8>, Option<u8>, Option<u8>, Option<i16>);

/// How a batch is shaped.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// The event time as epoch milliseconds in a long column, not as
    /// microsecond timestamps.
    millis: bool,
    /// `grp` as a 32-bit integer column.
    narrow_group: bool,
    /// No `amount` column at all.
    without_amount: bool,
}

/// `events` as a batch of `shape`.
fn batch(events: &[Event], shape: Shape) -> RecordBatch {
    let time_type = match shape.millis {
        true => DataType::Int64,
        false => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
    };
    let group_type = match shape.narrow_group {
        true => DataType::Int32,
        false => DataType::Int64,
    };
    let mut fields = vec![
        Field::new("event_time", time_type, true),
        Field::new("id", DataType::Utf8, true),
        Field::new("grp", group_type, true),
        Field::new("amount", DataType::Float64, true),
    ];
    let times = events
        .iter()
        .map(|e| e.0.map(|m| START + m as i64 * MINUTE - 7));
    let time: ArrayRef = match shape.millis {
        true => Arc::new(Int64Array::from_iter(times.map(|t| t.map(|t| t / 1000)))),
        false => Arc::new(TimestampMicrosecondArray::from_iter(times).with_timezone("UTC")),
    };
    let ids: StringArray = events
        .iter()
        .map(|e| e.1.map(|k| format!("key-{k}")))
        .collect();
    let groups: ArrayRef = match shape.narrow_group {
        true => Arc::new(Int32Array::from_iter(
            events.iter().map(|e| e.2.map(i32::from)),
        )),
        false => Arc::new(Int64Array::from_iter(
            events.iter().map(|e| e.2.map(i64::from)),
        )),
    };
    // Sevenths: sums whose rounding depends on the order of addition, so
    // that a fold in another order shows.
    let amounts: Float64Array = events
        .iter()
        .map(|e| e.3.map(|a| f64::from(a) / 7.0))
        .collect();
    let mut columns: Vec<ArrayRef> = vec![time, Arc::new(ids), groups, Arc::new(amounts)];
    if shape.without_amount {
        fields.pop();
        columns.pop();
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

fn aggregation(window: &WindowSpec, mode: OutputMode, time: &TimeColumn) -> WindowAggregate {
    WindowAggregate::new(
        vec![Arc::from("id"), Arc::from("grp")],
        time.clone(),
        window.clone(),
        vec![
            AggregateSpec::count(),
            AggregateSpec::of("sum", "amount").unwrap(),
            AggregateSpec::of("avg", "amount").unwrap(),
            AggregateSpec::of("min", "id").unwrap(),
            AggregateSpec::by("max_by", "id", "amount").unwrap(),
            // The typed column folds over doubles, integers, timestamps
            // (or epoch milliseconds), NULLs and a string column `sum`
            // ignores, and the value-by-value one.
            AggregateSpec::of("count", "amount").unwrap(),
            AggregateSpec::of("sum", "grp").unwrap(),
            AggregateSpec::of("avg", "grp").unwrap(),
            AggregateSpec::of("stddev", "amount").unwrap(),
            AggregateSpec::of("sum", "id").unwrap(),
            AggregateSpec::of("max", "amount").unwrap(),
            AggregateSpec::of("min", "grp").unwrap(),
            AggregateSpec::of("max", "event_time").unwrap(),
        ],
        mode,
    )
}

/// How a batch reaches the aggregation.
#[derive(Debug, Clone, Copy)]
enum Columnar {
    /// Row by row.
    No,
    /// One `on_columns` call.
    Whole,
    /// Two calls in one batch: windows a batch touches twice.
    InTwo,
}

/// Everything the aggregation gives per batch, as text: its rows, its late
/// rows, its state's size.
fn run(
    (window, mode, time): (&WindowSpec, OutputMode, &TimeColumn),
    batches: &[RecordBatch],
    collect_late_rows: bool,
    columnar: Columnar,
) -> Vec<String> {
    let mut op = aggregation(window, mode, time);
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
            processing_time: START + batch_id as i64 * 3 * MINUTE,
            late_threshold: watermark,
            watermark: next_watermark,
            collect_late_rows,
            real_time: false,
        };
        let mut out = Vec::new();
        match columnar {
            Columnar::Whole => op.on_columns(batch, &ctx, &mut out).unwrap(),
            Columnar::InTwo => {
                let half = batch.num_rows() / 2;
                op.on_columns(&batch.slice(0, half), &ctx, &mut out)
                    .unwrap();
                let rest = batch.slice(half, batch.num_rows() - half);
                op.on_columns(&rest, &ctx, &mut out).unwrap();
            }
            Columnar::No => {
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
        processing_time in proptest::bool::weighted(0.2),
        shape in (proptest::bool::ANY, proptest::bool::ANY, proptest::bool::weighted(0.2))
            .prop_map(|(millis, narrow_group, without_amount)| Shape { millis, narrow_group, without_amount }),
        collect_late_rows in proptest::bool::weighted(0.8),
        in_two in proptest::bool::weighted(0.3),
    ) {
        let window = [
            WindowSpec::tumbling("5 minutes").unwrap(),
            WindowSpec::sliding("10 minutes", "5 minutes").unwrap(),
            WindowSpec::session("3 minutes").unwrap(),
        ][window]
            .clone();
        let mode = [OutputMode::Append, OutputMode::Update, OutputMode::Complete][mode];
        let time = match processing_time {
            true => TimeColumn::ProcessingTime,
            false => TimeColumn::EventTime(Arc::from("event_time")),
        };
        let batches: Vec<RecordBatch> = batches.iter().map(|b| batch(b, shape)).collect();
        let spec = (&window, mode, &time);
        let columnar = match in_two {
            true => Columnar::InTwo,
            false => Columnar::Whole,
        };
        prop_assert_eq!(
            run(spec, &batches, collect_late_rows, columnar),
            run(spec, &batches, collect_late_rows, Columnar::No)
        );
    }
}

/// A batch with a column no value type reads (a date) fails before any of
/// its rows changed the state when late rows are collected, as a batch of
/// rows fails when its rows are made.
#[test]
fn a_column_with_no_value_type_fails_the_batch_before_any_fold() {
    let events: Vec<Event> = vec![(Some(1), Some(1), Some(0), Some(5)); 3];
    let good = batch(
        &events,
        Shape {
            millis: false,
            narrow_group: false,
            without_amount: false,
        },
    );
    let mut fields: Vec<Field> = good
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new("day", DataType::Date32, true));
    let mut columns = good.columns().to_vec();
    columns.push(Arc::new(arrow_array::Date32Array::from(vec![1, 2, 3])));
    let bad = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    let window = WindowSpec::tumbling("5 minutes").unwrap();
    let time = TimeColumn::EventTime(Arc::from("event_time"));
    let mut op = aggregation(&window, OutputMode::Update, &time);
    let ctx = BatchContext {
        batch_id: 0,
        processing_time: 0,
        late_threshold: 0,
        watermark: 0,
        collect_late_rows: true,
        real_time: false,
    };
    let err = op.on_columns(&bad, &ctx, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("day"), "{err}");
    assert_eq!(op.state_progress().unwrap().num_rows_total, 0);
}
