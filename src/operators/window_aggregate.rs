//! Windowed aggregation with Spark's micro-batch semantics.
//!
//! Per batch: a row is dropped as late for a window whose end is at or before
//! the late threshold (the previous batch's watermark), judged one window at
//! a time; at the end of the batch, append mode emits and evicts every window
//! ending at or before the watermark in effect, update mode emits every group
//! touched in the batch and then evicts, complete mode emits everything and
//! evicts nothing.

use super::{encode_key, BatchContext, Operator, OutputMode};
use crate::aggregate::{Accumulator, AggregateFn};
use crate::error::Result;
use crate::progress::StateOperatorProgress;
use crate::row::{Row, Value};
use crate::time::TimestampMicros;
use crate::window::{TimeWindow, WindowSpec};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

/// Which time assigns rows to windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeColumn {
    /// A timestamp column of the row (event time).
    EventTime(Arc<str>),
    /// The batch's processing time (Spark's `current_timestamp()`).
    ProcessingTime,
}

/// What an aggregate reads from each row.
#[derive(Debug, Clone, PartialEq)]
pub enum AggregateInput {
    /// Every row (`count(*)`).
    Star,
    /// One column.
    Column(Arc<str>),
}

/// One aggregate of a window aggregation: function, input and output name.
#[derive(Debug, Clone)]
pub struct AggregateSpec {
    /// The function.
    pub function: AggregateFn,
    /// Its input.
    pub input: AggregateInput,
    /// The output column name.
    pub output: Arc<str>,
}

impl AggregateSpec {
    /// An aggregate with Spark's default output name (`sum(amount)`,
    /// `count` for `count(*)`), renamed with [`AggregateSpec::alias`].
    pub fn new(function: AggregateFn, input: AggregateInput) -> Self {
        let output = match &input {
            AggregateInput::Star => function.name().to_string(),
            AggregateInput::Column(c) => format!("{}({c})", function.name()),
        };
        AggregateSpec {
            function,
            input,
            output: Arc::from(output),
        }
    }

    /// Renames the output column.
    pub fn alias(mut self, name: &str) -> Self {
        self.output = Arc::from(name);
        self
    }
}

struct GroupState {
    key_values: Vec<Value>,
    accumulators: Vec<Accumulator>,
}

struct Session {
    window: TimeWindow,
    accumulators: Vec<Accumulator>,
    updated: bool,
}

struct SessionGroup {
    key_values: Vec<Value>,
    sessions: Vec<Session>,
}

/// Groups rows by key columns and a window, folding aggregates.
pub struct WindowAggregate {
    keys: Vec<Arc<str>>,
    time: TimeColumn,
    window: WindowSpec,
    aggregates: Vec<AggregateSpec>,
    mode: OutputMode,
    /// Fixed windows by (end, start, key): eviction is a range scan.
    fixed: BTreeMap<(TimestampMicros, TimestampMicros, Vec<u8>), GroupState>,
    touched: BTreeSet<(TimestampMicros, TimestampMicros, Vec<u8>)>,
    sessions: HashMap<Vec<u8>, SessionGroup>,
    late_in_batch: BTreeSet<(TimestampMicros, TimestampMicros, Vec<u8>)>,
    late_input_rows: u64,
    late_rows: Vec<Row>,
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
        WindowAggregate {
            keys,
            time,
            window,
            aggregates,
            mode,
            fixed: BTreeMap::new(),
            touched: BTreeSet::new(),
            sessions: HashMap::new(),
            late_in_batch: BTreeSet::new(),
            late_input_rows: 0,
            late_rows: Vec::new(),
            rows_updated: 0,
            rows_removed: 0,
        }
    }

    fn fold(&self, accumulators: &mut [Accumulator], row: &Row) {
        for (spec, acc) in self.aggregates.iter().zip(accumulators.iter_mut()) {
            match &spec.input {
                AggregateInput::Star => spec.function.reduce(acc, &Value::Bool(true)),
                AggregateInput::Column(c) => spec
                    .function
                    .reduce(acc, row.get(c).unwrap_or(&Value::Null)),
            }
        }
    }

    fn zeros(&self) -> Vec<Accumulator> {
        self.aggregates.iter().map(|a| a.function.zero()).collect()
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

    fn add_to_session(
        &mut self,
        key: Vec<u8>,
        key_values: Vec<Value>,
        window: TimeWindow,
        row: &Row,
    ) {
        let mut accumulators = self.zeros();
        self.fold(&mut accumulators, row);
        let group = self.sessions.entry(key).or_insert_with(|| SessionGroup {
            key_values,
            sessions: Vec::new(),
        });
        // Merge every session that overlaps or touches the new one: sessions
        // exactly one gap apart merge, and one event may bridge two sessions.
        let mut merged = Session {
            window,
            accumulators,
            updated: true,
        };
        let mut kept = Vec::with_capacity(group.sessions.len() + 1);
        let mut merged_away = 0;
        for s in group.sessions.drain(..) {
            if s.window.start <= merged.window.end && merged.window.start <= s.window.end {
                merged.window.start = merged.window.start.min(s.window.start);
                merged.window.end = merged.window.end.max(s.window.end);
                for ((spec, acc), other) in self
                    .aggregates
                    .iter()
                    .zip(&mut merged.accumulators)
                    .zip(&s.accumulators)
                {
                    spec.function.merge(acc, other);
                }
                merged_away += 1;
            } else {
                kept.push(s);
            }
        }
        self.rows_removed += merged_away.max(1) - 1;
        kept.push(merged);
        kept.sort_by_key(|s| s.window.start);
        group.sessions = kept;
    }

    fn finish_fixed(&mut self, ctx: &BatchContext, out: &mut Vec<Row>) {
        self.rows_updated += self.touched.len() as u64;
        match self.mode {
            OutputMode::Complete => {
                for state in self.fixed.iter() {
                    let ((end, start, _), g) = state;
                    out.push(self.output_row(
                        &g.key_values,
                        TimeWindow {
                            start: *start,
                            end: *end,
                        },
                        &g.accumulators,
                    ));
                }
            }
            OutputMode::Update => {
                for k in &self.touched {
                    if let Some(g) = self.fixed.get(k) {
                        out.push(self.output_row(
                            &g.key_values,
                            TimeWindow {
                                start: k.1,
                                end: k.0,
                            },
                            &g.accumulators,
                        ));
                    }
                }
            }
            OutputMode::Append => {}
        }
        self.touched.clear();
        if self.mode == OutputMode::Complete {
            return;
        }
        let keep = self
            .fixed
            .split_off(&(ctx.watermark + 1, i64::MIN, Vec::new()));
        let expired = std::mem::replace(&mut self.fixed, keep);
        self.rows_removed += expired.len() as u64;
        if self.mode == OutputMode::Append {
            for ((end, start, _), g) in expired {
                out.push(self.output_row(
                    &g.key_values,
                    TimeWindow { start, end },
                    &g.accumulators,
                ));
            }
        }
    }

    fn finish_sessions(&mut self, ctx: &BatchContext, out: &mut Vec<Row>) {
        let mut emitted = Vec::new();
        let mut removed = 0u64;
        let mut updated = 0u64;
        let evict = self.mode != OutputMode::Complete;
        self.sessions.retain(|_, group| {
            for s in &mut group.sessions {
                let closed = evict && s.window.end <= ctx.watermark;
                if s.updated {
                    updated += 1;
                }
                let emit = match self.mode {
                    OutputMode::Append => closed,
                    OutputMode::Update => s.updated,
                    OutputMode::Complete => true,
                };
                if emit {
                    emitted.push((
                        group.key_values.clone(),
                        s.window,
                        std::mem::take(&mut s.accumulators),
                        closed,
                    ));
                }
                s.updated = false;
            }
            let before = group.sessions.len();
            group
                .sessions
                .retain(|s| !(evict && s.window.end <= ctx.watermark));
            removed += (before - group.sessions.len()) as u64;
            !group.sessions.is_empty()
        });
        self.rows_updated += updated;
        self.rows_removed += removed;
        emitted.sort_by_key(|a| (a.1.start, encode_key(&a.0)));
        for (key_values, window, accumulators, closed) in emitted {
            out.push(self.output_row(&key_values, window, &accumulators));
            if !closed {
                // Still open: the accumulators were moved out to build the
                // row; put them back.
                let key = encode_key(&key_values);
                if let Some(s) = self
                    .sessions
                    .get_mut(&key)
                    .and_then(|g| g.sessions.iter_mut().find(|s| s.window == window))
                {
                    s.accumulators = accumulators;
                }
            }
        }
    }

    fn state_rows(&self) -> usize {
        self.fixed.len()
            + self
                .sessions
                .values()
                .map(|g| g.sessions.len())
                .sum::<usize>()
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
        let t = match &self.time {
            TimeColumn::ProcessingTime => ctx.processing_time,
            TimeColumn::EventTime(c) => match row.get(c) {
                Some(Value::Timestamp(t)) => *t,
                Some(Value::Long(ms)) => ms.saturating_mul(1000),
                // Spark's window() yields no window for a NULL time.
                _ => return Ok(()),
            },
        };
        let key_values: Vec<Value> = self
            .keys
            .iter()
            .map(|k| row.get(k).cloned().unwrap_or(Value::Null))
            .collect();
        let key = encode_key(&key_values);
        let mut any_late = false;
        let windows = self.window.assign_row(t, &row);
        let mut accepted = false;
        for window in windows.iter().copied() {
            if window.end <= ctx.late_threshold && self.mode != OutputMode::Complete {
                any_late = true;
                self.late_in_batch
                    .insert((window.end, window.start, key.clone()));
                continue;
            }
            accepted = true;
            if self.window.is_session() {
                self.add_to_session(key.clone(), key_values.clone(), window, &row);
                continue;
            }
            let slot = (window.end, window.start, key.clone());
            if !self.fixed.contains_key(&slot) {
                let zeros = self.zeros();
                self.fixed.insert(
                    slot.clone(),
                    GroupState {
                        key_values: key_values.clone(),
                        accumulators: zeros,
                    },
                );
            }
            let mut accumulators = std::mem::take(
                &mut self
                    .fixed
                    .get_mut(&slot)
                    .expect("inserted above")
                    .accumulators,
            );
            self.fold(&mut accumulators, &row);
            self.fixed
                .get_mut(&slot)
                .expect("inserted above")
                .accumulators = accumulators;
            self.touched.insert(slot);
        }
        if any_late {
            self.late_input_rows += 1;
            // Dropped from every window: the late-data side output gets it.
            if !accepted && ctx.collect_late_rows {
                self.late_rows.push(row);
            }
        }
        Ok(())
    }

    fn on_batch_end(&mut self, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        if self.window.is_session() {
            self.finish_sessions(ctx, out);
        } else {
            self.finish_fixed(ctx, out);
        }
        Ok(())
    }

    fn take_late_rows(&mut self) -> Vec<Row> {
        std::mem::take(&mut self.late_rows)
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
            memory_used_bytes: rows * per_row as u64,
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
            vec![AggregateSpec::new(
                AggregateFn::built_in("count").unwrap(),
                AggregateInput::Star,
            )],
            mode,
        )
    }

    fn ctx(late: &str, wm: &str) -> BatchContext {
        BatchContext {
            batch_id: 0,
            processing_time: 0,
            late_threshold: if late.is_empty() { 0 } else { ts(late) },
            collect_late_rows: true,
            watermark: if wm.is_empty() { 0 } else { ts(wm) },
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
}
