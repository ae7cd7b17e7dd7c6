//! What a batch runs in and what routing it produced: the scope every
//! operator sees, the rows and columns the tasks emitted (with the task of
//! each), the dead-lettered count and the event times read.

use super::output::{BatchOutput, ColumnsOutput};
use super::task::Task;
use crate::operators::BatchContext;
use crate::record::Record;
use crate::row::Row;
use crate::time::TimestampMicros;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What every operator of a batch sees of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct BatchScope {
    pub(super) batch_id: u64,
    /// The batch's processing time (a virtual clock's in tests).
    pub(super) processing_time: TimestampMicros,
    pub(super) collect_late_rows: bool,
    pub(super) real_time: bool,
}

impl BatchScope {
    /// Each operator's view of the batch in `task`.
    pub(super) fn contexts(&self, task: &Task) -> Vec<BatchContext> {
        task.contexts(
            self.batch_id,
            self.processing_time,
            self.collect_late_rows,
            self.real_time,
        )
    }
}

/// Minimum, maximum and mean of the event times a batch read (Spark's
/// `eventTime` progress).
#[derive(Debug, Clone, Copy)]
pub(super) struct EventTimeStats {
    pub(super) min: TimestampMicros,
    pub(super) max: TimestampMicros,
    pub(super) sum: i128,
    pub(super) count: u64,
}

impl Default for EventTimeStats {
    fn default() -> Self {
        EventTimeStats {
            min: i64::MAX,
            max: i64::MIN,
            sum: 0,
            count: 0,
        }
    }
}

impl EventTimeStats {
    fn observe(&mut self, t: TimestampMicros) {
        self.min = self.min.min(t);
        self.max = self.max.max(t);
        self.sum += t as i128;
        self.count += 1;
    }

    /// Adds what `other` saw.
    pub(super) fn merge(&mut self, other: &EventTimeStats) {
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.sum += other.sum;
        self.count += other.count;
    }
}

/// What routing a batch's records did.
#[derive(Default)]
pub(super) struct RoutedBatch {
    /// Rows the operators emitted while taking the records.
    pub(super) outputs: Vec<Row>,
    /// Which task emitted which of `outputs` (see [`mark_task`](super::output::mark_task)).
    pub(super) output_tasks: Vec<(i32, usize)>,
    /// Columnar batches chains gave the sink, placed among `outputs`.
    pub(super) output_columns: Vec<ColumnsOutput>,
    /// Records sent to the dead-letter output.
    pub(super) bad_records: u64,
    /// Data records taken (not markers, not records of restoring tasks).
    pub(super) num_input: u64,
    pub(super) event_times: EventTimeStats,
    /// The largest event time per input partition.
    pub(super) max_event_time: BTreeMap<(Arc<str>, i32), TimestampMicros>,
    /// The operator contexts each task used, kept for its batch end.
    pub(super) contexts: BTreeMap<i32, Vec<BatchContext>>,
}

impl RoutedBatch {
    /// What the batch's tasks emitted, for the sink.
    pub(super) fn output(&self) -> BatchOutput<'_> {
        BatchOutput {
            rows: &self.outputs,
            tasks: &self.output_tasks,
            columns: &self.output_columns,
        }
    }

    /// Counts event time `t` of `record` for the batch's progress and its
    /// partition's watermark.
    pub(super) fn observe_event_time(&mut self, record: &Record, t: TimestampMicros) {
        self.event_times.observe(t);
        let slot = self
            .max_event_time
            .entry((record.position.topic.clone(), record.position.partition))
            .or_insert(t);
        *slot = (*slot).max(t);
    }
}

/// Why an event time is refused when its column is NULL or absent.
pub(super) const MISSING_EVENT_TIME: &str = "the event-time column is missing or null";

/// `t`, if Spark's timestamps can hold it.
pub(super) fn in_spark_range(t: TimestampMicros) -> std::result::Result<TimestampMicros, String> {
    use crate::time::{MAX_TIMESTAMP_MICROS, MIN_TIMESTAMP_MICROS};
    if !(MIN_TIMESTAMP_MICROS..=MAX_TIMESTAMP_MICROS).contains(&t) {
        return Err(format!(
            "event time {t} µs is outside the timestamps Spark supports (0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z)"
        ));
    }
    Ok(t)
}
