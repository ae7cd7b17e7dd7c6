//! Operators: what a task applies to each row, and at the end of each batch.
//!
//! An operator never talks to Kafka or to a sink: it sees rows, the batch's
//! watermarks and processing time through [`BatchContext`], and emits rows.
//! Nothing here assumes micro-batches beyond `on_batch_end`, which real-time
//! mode will call at each watermark advance instead.
#![deny(missing_docs)]

mod aggregate_spec;
#[cfg(test)]
mod columnar_equivalence;
mod dedup;
mod fixed_windows;
pub mod fuzzing;
mod join;
mod join_store;
pub mod processor;
mod rolling;
mod session_windows;
mod state_codec;
mod stateless;
mod table_join;
#[cfg(test)]
mod test_store;
mod union;
mod window_aggregate;

pub use aggregate_spec::{AggregateInput, AggregateSpec};
pub use dedup::{DedupSpec, Deduplicate};
pub use join::{JoinSpec, JoinTimeCondition, JoinType, StreamJoin};
pub use processor::{
    GroupKey, HandleInitialState, ListState, MapState, ProcessorContext, ProcessorError,
    ProcessorResult, ProcessorStep, StateDeclarations, StatefulProcessor, TimeDomain, Timer,
    ValueState,
};
pub use rolling::{FrontierBasis, FrontierSpec, RollingMeasure, RollingWindow};
pub use stateless::{AsType, Filter, FlatMapTyped, MapRows, Select, WithColumn};
pub use table_join::{record_key as table_record_key, SharedTable, TableJoin, TableJoinSpec};
pub use union::Union;
pub use window_aggregate::{TimeColumn, WindowAggregate};

// The vocabulary, under the names the operators' code uses.
use arrow_array::RecordBatch;
pub(crate) use tidemark_types::row::encode_key_into;
pub(crate) use tidemark_types::{
    aggregate, columns, duration, error, expr, progress, row, time, typed, window,
};

use crate::error::Result;
use crate::progress::StateOperatorProgress;
use crate::row::Row;
use crate::time::TimestampMicros;

/// Runs each row of `batch` through `op.on_row`, in order: the default
/// [`Operator::on_columns`], and the way back for a vectorized operator
/// whose columnar path does not cover a case.
pub(crate) fn each_row<O: Operator + ?Sized>(
    op: &mut O,
    batch: &RecordBatch,
    ctx: &BatchContext,
    out: &mut Vec<Row>,
) -> Result<()> {
    for row in columns::rows_of(batch)? {
        op.on_row(row, ctx, out)?;
    }
    Ok(())
}

/// What an operator knows about the batch being processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchContext {
    /// The batch id, from 0.
    pub batch_id: u64,
    /// The batch's processing time (virtual under a replay clock).
    pub processing_time: TimestampMicros,
    /// Rows whose window ends at or before this are late (Spark: the
    /// watermark in effect in the previous batch).
    pub late_threshold: TimestampMicros,
    /// Windows ending at or before this are emitted and evicted (Spark: the
    /// watermark in effect in this batch).
    pub watermark: TimestampMicros,
    /// Whether late rows are kept for the late-data side output.
    pub collect_late_rows: bool,
    /// Real-time mode: rows are processed as they arrive and operators
    /// that can emit at once (rolling windows) do.
    pub real_time: bool,
}

/// Spark's output modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputMode {
    /// Each result once, when final (needs a watermark with aggregations).
    #[default]
    Append,
    /// Every result that changed in the batch.
    Update,
    /// The whole result table every batch; state is never evicted.
    Complete,
}

impl std::str::FromStr for OutputMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "append" => Ok(OutputMode::Append),
            "update" => Ok(OutputMode::Update),
            "complete" => Ok(OutputMode::Complete),
            other => Err(format!(
                "unknown output mode `{other}`; allowed: append, update, complete"
            )),
        }
    }
}

/// One step of a pipeline.
pub trait Operator: Send {
    /// A short description for `describe` and progress reports.
    fn describe(&self) -> String;

    /// Processes one row, pushing any output to `out`.
    fn on_row(&mut self, row: Row, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()>;

    /// Processes a columnar batch (Apache Arrow) of the chain's own rows,
    /// in order: the same as [`Operator::on_row`] for each of them, which
    /// is what this default does. Operators with a vectorized path read
    /// the columns instead of making a [`Row`] per row.
    fn on_columns(
        &mut self,
        batch: &RecordBatch,
        ctx: &BatchContext,
        out: &mut Vec<Row>,
    ) -> Result<()> {
        each_row(self, batch, ctx, out)
    }

    /// Whether [`Operator::on_columns`] is this operator's fast path (it
    /// reads the columns rather than making rows of them): the router then
    /// decodes its input into columns. Such an operator returns no per-row
    /// error (`BadRow`) from `on_columns`, since no single record could be
    /// named for it: its errors fail the batch.
    fn reads_columns(&self) -> bool {
        false
    }

    /// Whether this step takes a columnar batch and gives one
    /// ([`Operator::map_columns`]), as a filter does: the columnar route
    /// then runs it on the columns, on the way to a step that reads them.
    fn maps_columns(&self) -> bool {
        false
    }

    /// The rows of `batch` this step gives, as columns: what
    /// [`Operator::on_row`] would give for each row, in order. Called only
    /// when [`Operator::maps_columns`]; like `on_columns`, it returns no
    /// per-row error.
    fn map_columns(&mut self, batch: &RecordBatch, _ctx: &BatchContext) -> Result<RecordBatch> {
        Err(crate::error::Error::Internal(format!(
            "{} does not map columns ({} rows given)",
            self.describe(),
            batch.num_rows()
        )))
    }

    /// Processes one row of input `input`: 0 is the chain's own rows, 1
    /// the second stream of a join. Only joins take a second input.
    fn on_input_row(
        &mut self,
        input: usize,
        row: Row,
        ctx: &BatchContext,
        out: &mut Vec<Row>,
    ) -> Result<()> {
        match input {
            0 => self.on_row(row, ctx, out),
            _ => Err(crate::error::Error::config(
                "join",
                format!("{} takes one input", self.describe()),
            )),
        }
    }

    /// A tombstone (a record without a value) of input `input`, by its
    /// record key: a table join deletes that key's row. Only table joins
    /// take tombstones.
    fn on_input_tombstone(&mut self, input: usize, _key: &[u8]) -> Result<()> {
        Err(crate::error::Error::config(
            "join",
            format!("{} takes no tombstones (input {input})", self.describe()),
        ))
    }

    /// The watermark of this operator's output, given its input's (Spark
    /// 3.5's propagation): the next stateful operator judges lateness and
    /// evicts by it. A join may emit rows older than its input watermark.
    fn output_watermark(&self, watermark: TimestampMicros) -> TimestampMicros {
        watermark
    }

    /// Ends a batch: emits what the watermark or output mode releases.
    fn on_batch_end(&mut self, _ctx: &BatchContext, _out: &mut Vec<Row>) -> Result<()> {
        Ok(())
    }

    /// Rows dropped as late since the last call (only collected when
    /// [`BatchContext::collect_late_rows`] is set).
    fn take_late_rows(&mut self) -> Vec<Row> {
        Vec::new()
    }

    /// Whether a batch at `ctx` would emit without new rows (rolling
    /// windows whose events leave their ranges as processing time moves):
    /// the query then runs a batch even when no data arrived, as Spark does
    /// for processing-time timeouts.
    fn wants_batch(&self, _ctx: &BatchContext) -> bool {
        false
    }

    /// Whether this operator keeps state that must survive a restart.
    fn is_stateful(&self) -> bool {
        false
    }

    /// Hands a stateful operator its store when its task starts: the
    /// operator restores from it and keeps it. With `cache_bytes`, at most
    /// about that much state stays in memory between batches and the rest
    /// is read from the store when needed (state larger than memory);
    /// `None` keeps all state in memory.
    fn open_state(
        &mut self,
        _store: Box<dyn tidemark_state::StateStore>,
        _cache_bytes: Option<usize>,
    ) -> Result<()> {
        Ok(())
    }

    /// Writes what changed since the last checkpoint to the store and
    /// flushes it (called after each batch, before offsets commit).
    fn checkpoint(&mut self) -> Result<()> {
        Ok(())
    }

    /// Progress of a stateful operator for this batch; `None` if stateless.
    fn state_progress(&mut self) -> Option<StateOperatorProgress> {
        None
    }

    /// What interactive queries can read of this operator's state: its
    /// kind and key columns; `None` when it keeps none that a key reads.
    fn queryable_state(&self) -> Option<QueryableState> {
        None
    }

    /// The state this task holds for `key` (values of
    /// [`QueryableState::key_columns`], in order), as rows shaped like the
    /// operator's output (a window aggregation's open windows within
    /// `range`, a rolling window's current measures, a table's row, a
    /// held dedup key); empty when the task holds nothing for it. Reads
    /// through the store and changes nothing (not even what is cached).
    fn read_key(&mut self, _key: &[row::Value], _range: &KeyRange) -> Result<Vec<Row>> {
        Ok(Vec::new())
    }
}

/// The state a stateful operator offers to interactive queries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueryableState {
    /// What the state is: `window_aggregate`, `session_window`, `dedup`,
    /// `rolling_window`, `table`, `stream_join`.
    pub kind: &'static str,
    /// The columns a key is made of, in order.
    pub key_columns: Vec<String>,
}

/// Bounds a read of a window aggregation's state: windows that end after
/// `from` and start before `to` (either open-ended).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyRange {
    /// Windows ending at or before this are left out.
    pub from: Option<TimestampMicros>,
    /// Windows starting at or after this are left out.
    pub to: Option<TimestampMicros>,
}

impl KeyRange {
    /// Whether the window `[start, end)` overlaps the range.
    pub fn overlaps(&self, start: TimestampMicros, end: TimestampMicros) -> bool {
        self.from.is_none_or(|from| end > from) && self.to.is_none_or(|to| start < to)
    }
}

/// A bounded cache of keys, hashed with foldhash; hashbrown's map for
/// `entry_ref`, which probes once and copies a key only when it is new.
pub(crate) type CacheMap<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// Shrinks a cache over its bound to `keep` entries, in a new map with room
/// for `capacity`: a map emptied by removals keeps its tombstones, and every
/// lookup of a key not cached probes through them (measured: 4x slower).
pub(crate) fn shrink_cache<K: std::hash::Hash + Eq, V>(
    cache: &mut CacheMap<K, V>,
    keep: usize,
    capacity: usize,
) {
    let kept = std::mem::take(cache).into_iter().take(keep);
    *cache = CacheMap::with_capacity_and_hasher(capacity, Default::default());
    cache.extend(kept);
}
