//! Routing a polled batch into its tasks: each record goes to the task of
//! its partition, is decoded, gets its event time, and runs through that
//! task's operators (or its join input's chain). Watermark markers from a
//! repartition stage move watermarks instead; table tombstones go to their
//! join. A record that cannot be decoded or evaluated goes to the dead
//! letter output and the batch goes on.

use super::columnar::{ColumnarRoute, PendingColumns};
use super::inputs::Inputs;
use super::output::mark_task;
use super::plan::EventTimeExtractor;
use super::routed::{in_spark_range, BatchScope, RoutedBatch, MISSING_EVENT_TIME};
use super::task::Task;
use super::{DeadLetter, Decoder, WatermarkMarker};
use crate::error::{Error, Result};
use crate::record::Record;
use crate::row::{Row, Value};
use crate::time::TimestampMicros;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Routes records into tasks; one per run.
pub(super) struct RecordRouter {
    pub(super) inputs: Inputs,
    pub(super) decoder: Box<dyn Decoder>,
    pub(super) dead_letter: Box<dyn DeadLetter>,
    pub(super) extractor: Option<EventTimeExtractor>,
    /// Behind a repartition stage watermarks come from markers, not rows.
    pub(super) watermark_from_markers: bool,
}

impl RecordRouter {
    /// Runs `records` through `tasks`; records of partitions without a task
    /// (restoring) are left for the source to deliver again.
    pub(super) fn route(
        &mut self,
        records: &[Record],
        tasks: &mut BTreeMap<i32, Task>,
        scope: &BatchScope,
    ) -> Result<RoutedBatch> {
        let mut routed = RoutedBatch::default();
        let mut pending = PendingColumns::default();
        for record in self.tables_first(records) {
            let partition = record.position.partition;
            let Some(task) = tasks.get_mut(&partition) else {
                continue;
            };
            if self.watermark_from_markers {
                if let Some(marker) = WatermarkMarker::of_record(record) {
                    pending.flush(partition, task, scope, &mut routed)?;
                    let moved = self.observe_marker(record, marker, task, scope);
                    self.dead_letter_on_error(record, moved, &mut routed)?;
                    continue;
                }
            }
            routed.num_input += 1;
            let route = ColumnarRoute {
                decoder: &*self.decoder,
                inputs: &self.inputs,
            };
            let into_columns = match self.extractor {
                None => route.columns_for(record, task, &mut pending),
                // A custom extractor sets event times on rows: the row route.
                Some(_) => None,
            };
            let taken = match into_columns {
                Some((schema, columns)) => {
                    route.take_into_columns(record, schema, columns, task, scope, &mut routed)
                }
                None => {
                    // Rows after columns: the columns run first, in order.
                    pending.flush(partition, task, scope, &mut routed)?;
                    self.take_record(record, task, scope, &mut routed)
                }
            };
            self.dead_letter_on_error(record, taken, &mut routed)?;
        }
        pending.flush_all(tasks, scope, &mut routed)?;
        Ok(routed)
    }

    /// A table's updates come first in a batch: its rows look up the table
    /// as of the batch's input.
    fn tables_first<'r>(&self, records: &'r [Record]) -> Vec<&'r Record> {
        if !self.inputs.has_tables() {
            return records.iter().collect();
        }
        let is_table = |r: &&Record| {
            self.inputs
                .get(self.inputs.input_of(&r.position.topic))
                .table
        };
        let (tables, rest): (Vec<&Record>, Vec<&Record>) = records.iter().partition(is_table);
        tables.into_iter().chain(rest).collect()
    }

    /// A bad record goes to the dead-letter output; any other error (and
    /// anything the dead-letter output fails with) stops the batch.
    fn dead_letter_on_error(
        &mut self,
        record: &Record,
        result: Result<()>,
        routed: &mut RoutedBatch,
    ) -> Result<()> {
        match result {
            Err(error @ Error::BadRecord { .. }) => {
                routed.bad_records += 1;
                self.dead_letter.send(record, &error)
            }
            // State, disk, registry: not the record's fault. The batch
            // fails, its offsets stay, and it is replayed.
            other => other,
        }
    }

    /// A marker moves the watermark of its stream by its origin's progress.
    fn observe_marker(
        &self,
        record: &Record,
        marker: Result<WatermarkMarker>,
        task: &mut Task,
        scope: &BatchScope,
    ) -> Result<()> {
        // A record that carries the marker header but not a marker is bad
        // data: dead-lettered, not a batch failed for ever. A marker of a
        // newer release's encoding is no bad record: the writer stage runs
        // a newer release, and guessing its progress would be wrong.
        let marker = marker.map_err(|e| match e {
            newer @ Error::UnknownEncoding { .. } => newer,
            e => Error::BadRecord {
                position: record.position.clone(),
                field: "<marker>".into(),
                reason: e.to_string(),
            },
        })?;
        // A repartitioned join's streams arrive on their own topics: each
        // origin counts for its stream, with its delay.
        let input = self
            .inputs
            .get(self.inputs.input_of(&record.position.topic));
        if let Some(w) = task.watermark.as_mut() {
            for origin in &marker.origins {
                if let Some((stream, delay)) = self.inputs.origin_stream(origin, input) {
                    w.register_stream(origin, stream, delay, scope.processing_time);
                }
            }
            let Some((stream, delay)) = self.inputs.origin_stream(&marker.origin, input) else {
                return Ok(());
            };
            w.observe_stream(
                &marker.origin,
                stream,
                delay,
                marker.max_event_time,
                scope.processing_time,
            );
        }
        Ok(())
    }

    /// Decodes one data record and pushes it through its task.
    fn take_record(
        &mut self,
        record: &Record,
        task: &mut Task,
        scope: &BatchScope,
        routed: &mut RoutedBatch,
    ) -> Result<()> {
        let partition = record.position.partition;
        // Made at the task's first record, good or bad: its batch end runs.
        routed
            .contexts
            .entry(partition)
            .or_insert_with(|| scope.contexts(task));
        let input_index = self.inputs.input_of(&record.position.topic);
        let input = self.inputs.get(input_index);
        if record.value.is_none() && input.table {
            return match record.key.as_deref() {
                Some(key) => task
                    .push_tombstone(input_index, key)
                    .map_err(|e| with_position(e, record)),
                None => Err(Error::BadRecord {
                    position: record.position.clone(),
                    field: "<key>".into(),
                    reason: "a table tombstone without a key deletes nothing".into(),
                }),
            };
        }
        let mut row = self.decoder.decode(record)?;
        if let Some(column) = &input.event_time {
            let t = self.event_time(record, &mut row, column)?;
            if input.watermarked {
                routed.observe_event_time(record, t);
            }
        }
        let contexts = routed
            .contexts
            .get_mut(&partition)
            .ok_or_else(|| Error::Internal(format!("no operator contexts for task {partition}")))?;
        let pushed = if input_index == 0 {
            task.push_row(row, contexts, &mut routed.outputs)
        } else {
            task.push_input(input_index, row, contexts, &mut routed.outputs)
        };
        mark_task(&routed.outputs, &mut routed.output_tasks, partition);
        pushed.map_err(|e| with_position(e, record))
    }

    /// The event time of `row`, normalised in place to a timestamp: RFC 3339
    /// strings and epoch millis become timestamps every operator reads.
    fn event_time(
        &self,
        record: &Record,
        row: &mut Row,
        column: &Arc<str>,
    ) -> Result<TimestampMicros> {
        if let Some(extract) = &self.extractor {
            if let Some(t) = extract(row) {
                row.set(column.clone(), Value::Timestamp(t));
            }
        }
        let t = event_time_of(row, column).map_err(|reason| Error::BadRecord {
            position: record.position.clone(),
            field: column.to_string(),
            reason,
        })?;
        row.set(column.clone(), Value::Timestamp(t));
        Ok(t)
    }
}

/// A step's verdict on a row's data, as a bad record naming `record`;
/// any other error (state, disk) is returned as it is: not the record's
/// fault.
fn with_position(error: Error, record: &Record) -> Error {
    match error {
        Error::BadRow { field, reason } => Error::BadRecord {
            position: record.position.clone(),
            field,
            reason,
        },
        Error::Expression { .. } => Error::BadRecord {
            position: record.position.clone(),
            field: "<step>".into(),
            reason: error.to_string(),
        },
        other => other,
    }
}

fn event_time_of(row: &Row, column: &str) -> std::result::Result<TimestampMicros, String> {
    in_spark_range(event_time_value(row, column)?)
}

fn event_time_value(row: &Row, column: &str) -> std::result::Result<TimestampMicros, String> {
    match row.get(column) {
        Some(Value::Timestamp(t)) => Ok(*t),
        Some(Value::Long(ms)) => ms
            .checked_mul(1000)
            .ok_or_else(|| "epoch milliseconds out of range".to_string()),
        Some(Value::Str(s)) => crate::time::parse_rfc3339(s).ok_or_else(|| {
            format!("expected an RFC 3339 timestamp or epoch milliseconds, got `{s}`")
        }),
        Some(Value::Null) | None => Err(MISSING_EVENT_TIME.into()),
        Some(other) => Err(format!("expected a timestamp, got {}", other.type_name())),
    }
}
