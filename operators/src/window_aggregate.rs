//! Windowed aggregation with Spark's micro-batch semantics.
//!
//! Per batch: a row is dropped as late for a window whose end is at or before
//! the late threshold (the previous batch's watermark), judged one window at
//! a time; at the end of the batch, append mode emits and evicts every window
//! ending at or before the watermark in effect, update mode emits every group
//! touched in the batch and then evicts, complete mode emits everything and
//! evicts nothing.

use super::aggregate_spec::{AggregateInput, AggregateSpec};
use super::fixed_windows::FixedWindowState;
use super::session_windows::SessionState;
use super::{
    each_row, encode_key_into, BatchContext, KeyRange, Operator, OutputMode, QueryableState,
};
use crate::aggregate::{Accumulator, AggregateFn};
use crate::columns::{resolve_all, row_at, Column};
use crate::error::Result;
use crate::progress::StateOperatorProgress;
use crate::row::{encode_key_part, Row, Value};
use crate::time::TimestampMicros;
use crate::window::{TimeWindow, WindowSpec};
use arrow_array::RecordBatch;
use std::borrow::Cow;
use std::collections::BTreeSet;
use tidemark_state::StateStore;

use std::sync::Arc;

/// Which time assigns rows to windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeColumn {
    /// A timestamp column of the row (event time).
    EventTime(Arc<str>),
    /// The batch's processing time (Spark's `current_timestamp()`).
    ProcessingTime,
    /// The window of an earlier window aggregation, as Spark's
    /// `window(window, ...)` reads it: `window_time(window)`, its end less
    /// one microsecond (the last instant inside it), so that each window
    /// falls in the later window that covers it, not the one after.
    EarlierWindow,
}

/// The column an earlier window aggregation writes its window's end to.
const WINDOW_END: &str = "window_end";

/// Groups rows by key columns and a window, folding aggregates.
pub struct WindowAggregate {
    keys: Vec<Arc<str>>,
    /// The columns it reads, in slot order ([`referenced_columns`]).
    columns: Vec<Arc<str>>,
    input_slots: Vec<InputSlots>,
    time: TimeColumn,
    window: WindowSpec,
    aggregates: Vec<AggregateSpec>,
    mode: OutputMode,
    fixed: FixedWindowState,
    key_buffer: Vec<u8>,
    window_buffer: Vec<TimeWindow>,
    sessions: SessionState,
    late_in_batch: BTreeSet<(TimestampMicros, TimestampMicros, Vec<u8>)>,
    late_input_rows: u64,
    late_rows: Vec<Row>,
    /// At most this many keys stay in memory between batches; the others
    /// are read from the store when a row needs them (not in complete mode).
    max_cached_keys: Option<usize>,
    rows_updated: u64,
    rows_removed: u64,
}

impl WindowAggregate {
    /// A window aggregation over `keys`, windows from `time` by `window`.
    pub fn new(
        keys: Vec<Arc<str>>,
        time: TimeColumn,
        window: WindowSpec,
        aggregates: Vec<AggregateSpec>,
        mode: OutputMode,
    ) -> Self {
        let (columns, input_slots) = referenced_columns(&keys, &time, &aggregates);
        let fixed = FixedWindowState::new(aggregates.clone());
        let sessions = SessionState::new(aggregates.clone());
        WindowAggregate {
            keys,
            columns,
            input_slots,
            time,
            window,
            aggregates,
            mode,
            fixed,
            key_buffer: Vec::new(),
            window_buffer: Vec::new(),
            sessions,
            late_in_batch: BTreeSet::new(),
            late_input_rows: 0,
            late_rows: Vec::new(),
            max_cached_keys: None,
            rows_updated: 0,
            rows_removed: 0,
        }
    }

    fn output_row(
        &self,
        key_values: &[Value],
        window: TimeWindow,
        accumulators: &[Accumulator],
    ) -> Row {
        let mut row = Row::new();
        for (name, value) in self.keys.iter().zip(key_values) {
            row.set(name.clone(), value.clone());
        }
        row.set("window_start", Value::Timestamp(window.start));
        row.set("window_end", Value::Timestamp(window.end));
        for (spec, acc) in self.aggregates.iter().zip(accumulators) {
            row.set(spec.output.clone(), spec.function.finish(acc));
        }
        row
    }

    fn finish_fixed(&mut self, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let placeholder = FixedWindowState::new(Vec::new());
        let mut fixed = std::mem::replace(&mut self.fixed, placeholder);
        let result = self.finish_fixed_in(&mut fixed, ctx, out);
        self.fixed = fixed;
        result
    }

    /// [`WindowAggregate::finish_fixed`] with the state taken out, so that
    /// its callbacks borrow the operator to make rows.
    fn finish_fixed_in(
        &mut self,
        fixed: &mut FixedWindowState,
        ctx: &BatchContext,
        out: &mut Vec<Row>,
    ) -> Result<()> {
        let touched = match self.mode {
            OutputMode::Update => {
                fixed.drain_touched(|k, w, a| out.push(self.output_row(k, w, a)))?
            }
            _ => fixed.drain_touched(|_, _, _| {})?,
        };
        self.rows_updated += touched as u64;
        match self.mode {
            OutputMode::Complete => fixed.for_each(|k, w, a| out.push(self.output_row(k, w, a))),
            OutputMode::Update => {
                self.rows_removed += fixed.evict_until(ctx.watermark, |_, _, _| {})? as u64;
            }
            OutputMode::Append => {
                self.rows_removed += fixed
                    .evict_until(ctx.watermark, |k, w, a| out.push(self.output_row(k, w, a)))?
                    as u64;
            }
        }
        Ok(())
    }

    fn finish_sessions(&mut self, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let placeholder = SessionState::new(Vec::new());
        let mut sessions = std::mem::replace(&mut self.sessions, placeholder);
        let settled = sessions.settle(self.mode, ctx.watermark, |k, w, a| self.output_row(k, w, a));
        self.sessions = sessions;
        let settled = settled?;
        self.rows_updated += settled.updated;
        self.rows_removed += settled.removed;
        out.extend(settled.rows);
        Ok(())
    }

    /// Finds, in the store's expiry index, the windows (sessions) ending
    /// at or before `watermark`, so that eviction sees them.
    fn schedule_stored_expiry(&mut self, watermark: TimestampMicros) -> Result<()> {
        match self.window.is_session() {
            true => self.sessions.schedule_expiring(watermark),
            false => self.fixed.schedule_stored_expiry(watermark),
        }
    }

    /// Folds one input row into its windows. Returns whether it was late
    /// for every window it falls in (the late side output takes it).
    /// `row` is the whole row where there is one: a dynamic session gap
    /// reads it.
    fn fold_input(
        &mut self,
        input: &impl InputRow,
        row: Option<&Row>,
        ctx: &BatchContext,
    ) -> Result<bool> {
        let time_slot = self.keys.len();
        let t = match &self.time {
            TimeColumn::ProcessingTime => ctx.processing_time,
            TimeColumn::EventTime(_) => match input.value(time_slot, &self.columns).as_ref() {
                Value::Timestamp(t) => *t,
                Value::Long(ms) => ms.saturating_mul(1000),
                // Spark's window() yields no window for a NULL time.
                _ => return Ok(false),
            },
            TimeColumn::EarlierWindow => match input.value(time_slot, &self.columns).as_ref() {
                Value::Timestamp(end) => end.saturating_sub(1),
                _ => return Ok(false),
            },
        };
        let mut key_buffer = std::mem::take(&mut self.key_buffer);
        key_buffer.clear();
        for slot in 0..self.keys.len() {
            input.encode_key_part(slot, &self.columns, &mut key_buffer);
        }
        let mut windows = std::mem::take(&mut self.window_buffer);
        windows.clear();
        self.window.assign_into(t, row, &mut windows);
        let (mut any_late, mut accepted) = (false, false);
        for window in windows.iter().copied() {
            if window.end <= ctx.late_threshold && self.drops_late_rows() {
                any_late = true;
                self.late_in_batch
                    .insert((window.end, window.start, key_buffer.clone()));
                continue;
            }
            accepted = true;
            let columns = &self.columns;
            let key_values = || {
                (0..self.keys.len())
                    .map(|slot| input.value(slot, columns).into_owned())
                    .collect()
            };
            let aggregates = &self.aggregates;
            let inputs = &self.input_slots;
            if self.window.is_session() {
                self.rows_removed += self.sessions.add(
                    &key_buffer,
                    key_values,
                    window,
                    aggregates,
                    |accumulators| fold(aggregates, inputs, accumulators, input, columns),
                )?;
                continue;
            }
            let accumulators = self
                .fixed
                .accumulators(&key_buffer, key_values, window, || {
                    aggregates.iter().map(|a| a.function.zero()).collect()
                })?;
            fold(aggregates, inputs, accumulators, input, columns);
        }
        self.key_buffer = key_buffer;
        self.window_buffer = windows;
        if any_late {
            self.late_input_rows += 1;
        }
        // Dropped from every window: the late-data side output gets it.
        Ok(any_late && !accepted)
    }

    /// Whether rows behind the late threshold are dropped. Spark's
    /// tumbling and sliding aggregations keep every row in complete mode
    /// (`StateStoreSaveExec` has no late filter there), but its session
    /// aggregation filters late rows in every output mode
    /// (`SessionWindowStateStoreRestoreExec`).
    fn drops_late_rows(&self) -> bool {
        self.mode != OutputMode::Complete || self.window.is_session()
    }

    fn state_rows(&self) -> usize {
        self.fixed.len() + self.sessions.len()
    }
}

impl Operator for WindowAggregate {
    fn describe(&self) -> String {
        let window = match &self.window {
            WindowSpec::Tumbling { size, .. } => format!("tumbling {}", fmt_micros(*size)),
            WindowSpec::Sliding { size, slide, .. } => {
                format!("sliding {} every {}", fmt_micros(*size), fmt_micros(*slide))
            }
            WindowSpec::Session { gap } => format!("session gap {}", fmt_micros(*gap)),
            WindowSpec::DynamicSession { gap } => format!("session gap from {gap:?}"),
        };
        let window = match &self.time {
            TimeColumn::EarlierWindow => format!("{window} over window_time(window)"),
            _ => window,
        };
        let aggs: Vec<&str> = self.aggregates.iter().map(|a| a.output.as_ref()).collect();
        let keys: Vec<&str> = self.keys.iter().map(|k| k.as_ref()).collect();
        format!(
            "WindowAggregate [keys: {}; window: {window}; aggregates: {}; mode: {:?}]",
            keys.join(", "),
            aggs.join(", "),
            self.mode
        )
    }

    fn on_row(&mut self, row: Row, ctx: &BatchContext, _out: &mut Vec<Row>) -> Result<()> {
        let late = self.fold_input(&row, Some(&row), ctx)?;
        if late && ctx.collect_late_rows {
            self.late_rows.push(row);
        }
        Ok(())
    }

    /// The vectorized path: the columns the aggregation reads are resolved
    /// once per batch and each row is read from them by index, with no
    /// [`Row`] made (but for a late row the side output collects). The
    /// same fold as [`WindowAggregate::on_row`], so the same results. As
    /// for rows, event times are the caller's to check against Spark's
    /// range (the router does it for the rows it decodes).
    fn on_columns(
        &mut self,
        batch: &RecordBatch,
        ctx: &BatchContext,
        out: &mut Vec<Row>,
    ) -> Result<()> {
        // A dynamic session gap is an expression over the whole row.
        if matches!(self.window, WindowSpec::DynamicSession { .. }) {
            return each_row(self, batch, ctx, out);
        }
        let time_slot = self.keys.len();
        let reads_time = self.time != TimeColumn::ProcessingTime;
        let columns = self
            .columns
            .iter()
            .enumerate()
            .map(|(slot, name)| match slot == time_slot && !reads_time {
                true => Ok(Column::Missing),
                false => Column::resolve(batch, name),
            })
            .collect::<Result<Vec<_>>>()?;
        // Whole rows are read only for the late side output; resolved
        // before any row is folded, so that a column with no value type
        // fails the batch before it changed the state, as rows would.
        let whole_rows = match ctx.collect_late_rows {
            true => Some(resolve_all(batch)?),
            false => None,
        };
        for i in 0..batch.num_rows() {
            let row = BatchRow {
                columns: &columns,
                i,
            };
            let late = self.fold_input(&row, None, ctx)?;
            if let (true, Some(all)) = (late, &whole_rows) {
                self.late_rows.push(row_at(all, i));
            }
        }
        Ok(())
    }

    fn reads_columns(&self) -> bool {
        // A dynamic session gap is an expression over the whole row.
        !matches!(self.window, WindowSpec::DynamicSession { .. })
    }

    fn on_batch_end(&mut self, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        if self.max_cached_keys.is_some() && self.mode != OutputMode::Complete {
            self.schedule_stored_expiry(ctx.watermark)?;
        }
        if self.window.is_session() {
            self.finish_sessions(ctx, out)
        } else {
            self.finish_fixed(ctx, out)
        }
    }

    fn is_stateful(&self) -> bool {
        true
    }

    fn open_state(&mut self, store: Box<dyn StateStore>, cache_bytes: Option<usize>) -> Result<()> {
        // Complete mode emits every window every batch: it stays in memory.
        // Otherwise a bounded set of keys is cached and the store answers
        // for the rest.
        let spill = self.mode != OutputMode::Complete;
        self.max_cached_keys = cache_bytes
            .filter(|_| spill)
            .map(|bytes| (bytes / (384 + 64 * self.aggregates.len())).max(16));
        match self.window.is_session() {
            true => self.sessions.open(store, self.max_cached_keys),
            false => self.fixed.open(store, self.max_cached_keys),
        }
    }

    fn checkpoint(&mut self) -> Result<()> {
        let changes = match self.window.is_session() {
            true => self.sessions.checkpoint()?,
            false => self.fixed.checkpoint()?,
        };
        tracing::debug!(
            changes,
            open_windows = self.state_rows(),
            "window state checkpoint"
        );
        Ok(())
    }

    fn take_late_rows(&mut self) -> Vec<Row> {
        std::mem::take(&mut self.late_rows)
    }

    fn queryable_state(&self) -> Option<QueryableState> {
        Some(QueryableState {
            kind: match self.window.is_session() {
                true => "session_window",
                false => "window_aggregate",
            },
            key_columns: self.keys.iter().map(|k| k.to_string()).collect(),
        })
    }

    /// The key's open windows (sessions) as the output writes them: key
    /// columns, `window_start`, `window_end`, the aggregates so far.
    fn read_key(&mut self, key: &[Value], range: &KeyRange) -> Result<Vec<Row>> {
        let mut encoded = Vec::new();
        encode_key_into(key.iter(), &mut encoded);
        let mut rows = Vec::new();
        let mut keep = |values: &[Value], window: TimeWindow, accumulators: &[Accumulator]| {
            if range.overlaps(window.start, window.end) {
                rows.push(self.output_row(values, window, accumulators));
            }
        };
        if !self.window.is_session() {
            if let Some(key_windows) = self.fixed.peek(&encoded)? {
                let (values, windows) = key_windows.windows();
                windows.for_each(|(window, accumulators)| keep(values, window, accumulators));
            }
        } else {
            self.sessions.for_key(&encoded, keep)?;
        }
        Ok(rows)
    }

    fn state_progress(&mut self) -> Option<StateOperatorProgress> {
        let rows = self.state_rows() as u64;
        let per_row = 64 + self.keys.len() * 24 + self.aggregates.len() * 32;
        let progress = StateOperatorProgress {
            operator_name: if self.window.is_session() {
                "sessionWindowStateStoreSaveExec".into()
            } else {
                "stateStoreSave".into()
            },
            num_rows_total: rows,
            num_rows_updated: self.rows_updated,
            num_rows_removed: self.rows_removed,
            num_rows_dropped_by_watermark: self.late_in_batch.len() as u64,
            // With state in the store, memory holds the cached keys only.
            memory_used_bytes: match self.max_cached_keys {
                Some(_) => {
                    (self.fixed.cached_keys() + self.sessions.cached_keys()) as u64 * per_row as u64
                }
                None => rows * per_row as u64,
            },
            custom_metrics: [("numLateInputRows".to_string(), self.late_input_rows)]
                .into_iter()
                .collect(),
        };
        self.late_in_batch.clear();
        self.late_input_rows = 0;
        self.rows_updated = 0;
        self.rows_removed = 0;
        Some(progress)
    }
}

/// Folds one input row into a window's accumulators, each aggregate
/// reading its input slots.
fn fold(
    aggregates: &[AggregateSpec],
    inputs: &[InputSlots],
    accumulators: &mut [Accumulator],
    input: &impl InputRow,
    columns: &[Arc<str>],
) {
    for ((spec, slots), acc) in aggregates.iter().zip(inputs).zip(accumulators.iter_mut()) {
        match *slots {
            InputSlots::Star => spec.function.reduce_at(acc, None, 0),
            InputSlots::Column(slot) => input.reduce_into(&spec.function, acc, slot, columns),
            InputSlots::By { value, ordering } => spec.function.reduce_by(
                acc,
                input.value(value, columns).as_ref(),
                input.value(ordering, columns).as_ref(),
            ),
        }
    }
}

/// Where an aggregate's input columns are among the aggregation's columns
/// ([`WindowAggregate`]'s `columns`).
#[derive(Debug, Clone, Copy)]
enum InputSlots {
    Star,
    Column(usize),
    By { value: usize, ordering: usize },
}

/// The columns an aggregation reads, in slot order: its keys, then its
/// time column (when it reads one), then each aggregate's inputs.
fn referenced_columns(
    keys: &[Arc<str>],
    time: &TimeColumn,
    aggregates: &[AggregateSpec],
) -> (Vec<Arc<str>>, Vec<InputSlots>) {
    let mut columns = keys.to_vec();
    match time {
        TimeColumn::EventTime(c) => columns.push(c.clone()),
        TimeColumn::EarlierWindow => columns.push(Arc::from(WINDOW_END)),
        // Never read: a placeholder keeps the slots after it in place.
        TimeColumn::ProcessingTime => columns.push(Arc::from("")),
    }
    let mut slot_of = |name: &Arc<str>| {
        columns.push(name.clone());
        columns.len() - 1
    };
    let inputs = aggregates
        .iter()
        .map(|a| match &a.input {
            AggregateInput::Star => InputSlots::Star,
            AggregateInput::Column(c) => InputSlots::Column(slot_of(c)),
            AggregateInput::By { value, ordering } => InputSlots::By {
                value: slot_of(value),
                ordering: slot_of(ordering),
            },
        })
        .collect();
    (columns, inputs)
}

/// One input row as the aggregation reads it, by slot (see
/// [`referenced_columns`]): a decoded [`Row`], read by name, or a row of
/// a columnar batch, read by index.
trait InputRow {
    /// The value of column `slot` (named `names[slot]`); NULL when absent.
    fn value<'r>(&'r self, slot: usize, names: &[Arc<str>]) -> Cow<'r, Value>;
    /// Appends column `slot`'s key encoding to `out`.
    fn encode_key_part(&self, slot: usize, names: &[Arc<str>], out: &mut Vec<u8>);
    /// Folds column `slot`'s value into `acc` with `function`.
    fn reduce_into(
        &self,
        function: &AggregateFn,
        acc: &mut Accumulator,
        slot: usize,
        names: &[Arc<str>],
    ) {
        function.reduce(acc, self.value(slot, names).as_ref())
    }
}

static NULL: Value = Value::Null;

impl InputRow for Row {
    fn value<'r>(&'r self, slot: usize, names: &[Arc<str>]) -> Cow<'r, Value> {
        Cow::Borrowed(self.get(&names[slot]).unwrap_or(&NULL))
    }

    fn encode_key_part(&self, slot: usize, names: &[Arc<str>], out: &mut Vec<u8>) {
        encode_key_part(self.get(&names[slot]).unwrap_or(&NULL), out);
    }
}

/// Row `i` of a columnar batch whose columns are resolved in slot order.
struct BatchRow<'c, 'a> {
    columns: &'c [Column<'a>],
    i: usize,
}

impl InputRow for BatchRow<'_, '_> {
    fn value<'r>(&'r self, slot: usize, _: &[Arc<str>]) -> Cow<'r, Value> {
        Cow::Owned(self.columns[slot].value(self.i))
    }

    fn encode_key_part(&self, slot: usize, _: &[Arc<str>], out: &mut Vec<u8>) {
        self.columns[slot].encode_key_part(self.i, out);
    }

    /// Typed: the column's array read straight, no [`Value`] made for the
    /// built-ins that have a typed fold ([`AggregateFn::reduce_at`]).
    fn reduce_into(
        &self,
        function: &AggregateFn,
        acc: &mut Accumulator,
        slot: usize,
        _: &[Arc<str>],
    ) {
        function.reduce_at(acc, Some(&self.columns[slot]), self.i)
    }
}

fn fmt_micros(m: i64) -> String {
    crate::duration::format_duration(std::time::Duration::from_micros(m.max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::parse_rfc3339;

    fn ts(hhmm: &str) -> i64 {
        parse_rfc3339(&format!("2026-01-01T{hhmm}:00Z")).unwrap()
    }

    fn row(t: &str, id: &str) -> Row {
        [
            ("event_time", Value::Timestamp(ts(t))),
            ("id", Value::from(id)),
        ]
        .into_iter()
        .collect()
    }

    fn op(window: WindowSpec, mode: OutputMode) -> WindowAggregate {
        WindowAggregate::new(
            vec![Arc::from("id")],
            TimeColumn::EventTime(Arc::from("event_time")),
            window,
            vec![AggregateSpec::count()],
            mode,
        )
    }

    fn ctx(late: &str, wm: &str) -> BatchContext {
        BatchContext {
            batch_id: 0,
            processing_time: 0,
            late_threshold: if late.is_empty() { 0 } else { ts(late) },
            collect_late_rows: true,
            real_time: false,
            watermark: if wm.is_empty() { 0 } else { ts(wm) },
        }
    }

    /// Six batches over 200 keys, sliding windows, the watermark ten
    /// minutes behind; every row as text, in emission order, and the most
    /// keys held in memory after a checkpoint.
    fn run_batches(mode: OutputMode, cache_bytes: Option<usize>) -> (Vec<String>, usize) {
        let window = WindowSpec::sliding("10 minutes", "5 minutes").unwrap();
        let mut w = op(window, mode);
        w.open_state(
            Box::new(tidemark_state::InMemoryStore::new("t")),
            cache_bytes,
        )
        .unwrap();
        let mut out = Vec::new();
        let mut most_cached = 0;
        let hhmm = |m: i64| format!("{:02}:{:02}", 10 + m / 60, m % 60);
        for batch in 0..6i64 {
            let (late, wm) = (hhmm(batch * 10 + 40), hhmm(batch * 10 + 50));
            let c = ctx(&late, &wm);
            for i in 0..200i64 {
                let minute = 60 + batch * 10 + (i * 7) % 13;
                w.on_row(row(&hhmm(minute), &format!("k{i}")), &c, &mut Vec::new())
                    .unwrap();
            }
            w.on_batch_end(&c, &mut out).unwrap();
            w.checkpoint().unwrap();
            most_cached = most_cached.max(w.fixed.cached_keys());
        }
        (
            out.iter().map(|r| r.to_json().to_string()).collect(),
            most_cached,
        )
    }

    /// Tumbling counts of 300 rows over 7 keys named `{prefix}{k}`, in
    /// three count columns: per emitted row, its key without the prefix and
    /// its counts.
    fn counts_by_key(prefix: &str) -> Vec<(String, Vec<Value>)> {
        let aggregates = ["n", "n2", "n3"].map(|name| AggregateSpec::count().alias(name));
        let mut w = WindowAggregate::new(
            vec![Arc::from("id")],
            TimeColumn::EventTime(Arc::from("event_time")),
            WindowSpec::tumbling("5 minutes").unwrap(),
            aggregates.to_vec(),
            OutputMode::Append,
        );
        for i in 0..300 {
            let t = format!("10:{:02}", i % 12);
            let id = format!("{prefix}{}", i % 7);
            w.on_row(row(&t, &id), &ctx("", ""), &mut Vec::new())
                .unwrap();
        }
        let mut out = Vec::new();
        w.on_batch_end(&ctx("11:00", "11:00"), &mut out).unwrap();
        out.iter()
            .map(|r| {
                let id = r.get("id").unwrap().to_string();
                let counts = ["n", "n2", "n3"].map(|c| r.get(c).unwrap().clone());
                (id.replacen(prefix, "", 1), counts.to_vec())
            })
            .collect()
    }

    /// A key past the 24 bytes kept in the table's slot and aggregates past
    /// the two accumulators kept in the window spill to the heap: the
    /// results are those of short keys.
    #[test]
    fn long_keys_and_many_aggregates_spill_with_the_same_results() {
        let short = counts_by_key("k");
        let long = counts_by_key("a-key-longer-than-twenty-four-bytes-");
        assert_eq!(long, short);
        assert_eq!(short.len(), 7 * 3, "7 keys in 3 windows: {short:?}");
        let total: i64 = short
            .iter()
            .map(|(_, counts)| match &counts[..] {
                [Value::Long(a), Value::Long(b), Value::Long(c)] if a == b && b == c => *a,
                other => panic!("counts differ: {other:?}"),
            })
            .sum();
        assert_eq!(total, 300);
    }

    #[test]
    fn state_read_through_the_store_gives_the_in_memory_results() {
        for mode in [OutputMode::Append, OutputMode::Update] {
            let (in_memory, all) = run_batches(mode, None);
            let (spilled, cached) = run_batches(mode, Some(1));
            assert!(in_memory.len() > 200, "{mode:?}: {}", in_memory.len());
            assert_eq!(spilled, in_memory, "{mode:?}");
            assert!(all >= 200, "{all}");
            assert!(cached <= 16, "{mode:?}: {cached} keys cached");
        }
    }

    /// How a session run treats its store between batches.
    #[derive(Clone, Copy, PartialEq)]
    enum Between {
        /// The same operator goes on.
        Continue,
        /// A new operator opens the same store after every checkpoint.
        Restart,
        /// Like `Restart`, once, after dropping the expiry index and the
        /// count, as a store written before they existed.
        RestartWithoutIndex,
    }

    /// Sessions with a 5-minute gap over 600 keys in eight batches, the
    /// watermark behind the data: every row as text in emission order, the
    /// open sessions after each batch, and the most keys cached.
    fn run_sessions(
        mode: OutputMode,
        cache_bytes: Option<usize>,
        between: Between,
    ) -> (Vec<String>, Vec<u64>, usize) {
        let store = crate::test_store::SharedStore::default();
        let open = |store: &crate::test_store::SharedStore| {
            let mut w = op(WindowSpec::session("5 minutes").unwrap(), mode);
            w.open_state(Box::new(store.clone()), cache_bytes).unwrap();
            w
        };
        let mut w = open(&store);
        let (mut out, mut totals, mut most_cached) = (Vec::new(), Vec::new(), 0);
        let hhmm = |m: i64| format!("{:02}:{:02}", 10 + m / 60, m % 60);
        for batch in 0..8i64 {
            let (late, wm) = (hhmm(batch * 7), hhmm(batch * 7 + 3));
            let c = ctx(&late, &wm);
            for i in 0..300i64 {
                let minute = batch * 7 + 2 + (i * 5 + batch) % 11;
                // 300 of 600 keys: every batch leaves keys untouched,
                // which only the store's expiry index brings back.
                let key = format!("k{}", (i * 7 + batch * 113) % 600);
                w.on_row(row(&hhmm(minute), &key), &c, &mut Vec::new())
                    .unwrap();
            }
            w.on_batch_end(&c, &mut out).unwrap();
            w.checkpoint().unwrap();
            most_cached = most_cached.max(w.sessions.cached_keys());
            totals.push(w.state_progress().unwrap().num_rows_total);
            if between == Between::RestartWithoutIndex && batch == 3 {
                use tidemark_state::StateStore;
                let mut s = store.clone();
                for (key, _) in s.prefix(b"E").unwrap() {
                    s.delete(&key).unwrap();
                }
                s.delete(b"N").unwrap();
            }
            if between != Between::Continue {
                w = open(&store);
            }
        }
        let rows = out.iter().map(|r| r.to_json().to_string()).collect();
        (rows, totals, most_cached)
    }

    #[test]
    fn sessions_read_through_the_store_give_the_in_memory_results() {
        for mode in [OutputMode::Append, OutputMode::Update] {
            let (in_memory, totals, all) = run_sessions(mode, None, Between::Continue);
            assert!(in_memory.len() > 600, "{mode:?}: {}", in_memory.len());
            assert!(all >= 300, "{all}");
            for between in [
                Between::Continue,
                Between::Restart,
                Between::RestartWithoutIndex,
            ] {
                let (spilled, spilled_totals, cached) = run_sessions(mode, Some(1), between);
                assert_eq!(spilled, in_memory, "{mode:?}");
                assert_eq!(spilled_totals, totals, "{mode:?}");
                assert!(cached <= 16, "{cached} keys cached");
            }
            let (restarted, restarted_totals, _) = run_sessions(mode, None, Between::Restart);
            assert_eq!(
                (restarted, restarted_totals),
                (in_memory, totals),
                "{mode:?}"
            );
        }
    }

    #[test]
    fn append_emits_when_watermark_passes_end_and_drops_late() {
        let mut w = op(
            WindowSpec::tumbling("10 minutes").unwrap(),
            OutputMode::Append,
        );
        let mut out = Vec::new();
        let c = ctx("", "");
        w.on_row(row("10:53", "a"), &c, &mut out).unwrap();
        w.on_batch_end(&c, &mut out).unwrap();
        assert!(out.is_empty());
        // Watermark 11:00 in effect: the 10:50-11:00 window closes (end ≤ wm).
        let c = ctx("", "11:00");
        w.on_row(row("10:55", "a"), &c, &mut out).unwrap();
        w.on_batch_end(&c, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].get("count"), Some(&Value::Long(2)));
        assert_eq!(
            out[0].get("window_start"),
            Some(&Value::Timestamp(ts("10:50")))
        );
        let p = w.state_progress().unwrap();
        assert_eq!((p.num_rows_removed, p.num_rows_total), (1, 0));
        // Now late against 11:00.
        out.clear();
        let c = ctx("11:00", "11:00");
        w.on_row(row("10:59", "a"), &c, &mut out).unwrap();
        w.on_batch_end(&c, &mut out).unwrap();
        assert!(out.is_empty());
        assert_eq!(w.state_progress().unwrap().num_rows_dropped_by_watermark, 1);
    }

    #[test]
    fn sessions_merge_at_exactly_one_gap_and_bridge() {
        let mut w = op(
            WindowSpec::session("10 minutes").unwrap(),
            OutputMode::Update,
        );
        let mut out = Vec::new();
        let c = ctx("", "");
        w.on_row(row("10:00", "a"), &c, &mut out).unwrap();
        w.on_row(row("10:30", "a"), &c, &mut out).unwrap();
        w.on_batch_end(&c, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        out.clear();
        // 10:10 is exactly one gap after 10:00, and its session reaches 10:20;
        // 10:20 then bridges to the 10:30 session.
        w.on_row(row("10:10", "a"), &c, &mut out).unwrap();
        w.on_row(row("10:20", "a"), &c, &mut out).unwrap();
        w.on_batch_end(&c, &mut out).unwrap();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].get("count"), Some(&Value::Long(4)));
        assert_eq!(
            out[0].get("window_start"),
            Some(&Value::Timestamp(ts("10:00")))
        );
        assert_eq!(
            out[0].get("window_end"),
            Some(&Value::Timestamp(ts("10:40")))
        );
    }

    #[test]
    fn a_window_of_windows_takes_each_window_at_its_last_instant() {
        // 10-minute counts, then 30-minute sums of them over window_time.
        let mut minutes = op(
            WindowSpec::tumbling("10 minutes").unwrap(),
            OutputMode::Append,
        );
        let mut half_hours = WindowAggregate::new(
            vec![Arc::from("id")],
            TimeColumn::EarlierWindow,
            WindowSpec::tumbling("30 minutes").unwrap(),
            vec![AggregateSpec::new(
                AggregateFn::built_in("sum").unwrap(),
                AggregateInput::Column(Arc::from("count")),
            )],
            OutputMode::Append,
        );
        let c = ctx("", "");
        let mut counts = Vec::new();
        for t in ["10:05", "10:15", "10:25", "10:29", "10:35"] {
            minutes.on_row(row(t, "a"), &c, &mut counts).unwrap();
        }
        let c = ctx("", "10:30");
        minutes.on_batch_end(&c, &mut counts).unwrap();
        assert_eq!(counts.len(), 3, "{counts:?}");
        let mut out = Vec::new();
        for r in counts {
            half_hours.on_row(r, &c, &mut out).unwrap();
        }
        half_hours.on_batch_end(&c, &mut out).unwrap();
        // The 10:20-10:30 window ends at 10:30 but belongs to 10:00-10:30.
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(
            (out[0].get("window_start"), out[0].get("window_end")),
            (
                Some(&Value::Timestamp(ts("10:00"))),
                Some(&Value::Timestamp(ts("10:30")))
            )
        );
        assert_eq!(out[0].get("sum(count)"), Some(&Value::Long(4)));
        assert!(half_hours.describe().contains("over window_time(window)"));
    }
}
