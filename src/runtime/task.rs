//! Tasks: the operator chain of one partition, its side chains and
//! watermark, and the restore of its state.

use super::plan::QueryPlan;
use super::task_checkpoint::TaskCheckpoint;
use super::{SinkCommit, StateBackend};
use crate::error::{Error, Result};
use crate::operators::{BatchContext, Operator};
use crate::row::Row;
use crate::time::TimestampMicros;
use crate::watermark::{WatermarkScope, WatermarkTracker};
use arrow_array::RecordBatch;
use std::time::Duration;

/// The operators of a task for `partition`; with a state backend, each
/// stateful operator gets its store (`op<index>`), restored when the
/// pending task runs.
pub(super) fn pending_task(
    plan: &QueryPlan,
    partition: i32,
    backend: Option<&mut (dyn StateBackend + 'static)>,
) -> Result<PendingTask> {
    let operators: Vec<Box<dyn Operator>> = plan
        .steps
        .iter()
        .map(|step| (step.build)(plan.output_mode))
        .collect();
    let mut stores = Vec::new();
    let mut cache_bytes = None;
    if let Some(backend) = backend {
        cache_bytes = backend.cache_bytes();
        for (index, op) in operators.iter().enumerate() {
            if op.is_stateful() {
                stores.push((
                    index,
                    backend.open_deferred(partition, &format!("op{index}"))?,
                ));
            }
        }
    }
    Ok(PendingTask {
        operators,
        stores,
        cache_bytes,
    })
}

/// A task around restored operators: their side chains and watermark.
pub(super) fn new_task(plan: &QueryPlan, operators: Vec<Box<dyn Operator>>) -> Task {
    let side_chains = plan
        .side_inputs
        .iter()
        .map(|side| SideChain {
            input: side.input,
            join_at: side.join_at,
            operators: side
                .stream
                .steps
                .iter()
                .map(|f| f(plan.output_mode))
                .collect(),
        })
        .collect();
    Task {
        operators,
        side_chains,
        scratch: Default::default(),
        sink_commit: None,
        watermark: plan.watermark.map(|d| {
            let mut tracker = WatermarkTracker::new(
                tidemark_types::duration::micros(d),
                plan.policy,
                plan.idle_timeout.map(tidemark_types::duration::micros),
            )
            .with_scope(plan.scope);
            if plan.watermark_from_markers && plan.scope == WatermarkScope::Query {
                // The writers' markers carry their streams' maxima as far
                // as each writer may count them (`forwards_stream_maxima`).
                tracker = tracker.with_aligned_inputs();
            }
            let streams = plan
                .side_inputs
                .iter()
                .filter(|s| !s.stream.table && (!s.is_union() || s.stream.watermark.is_some()));
            // Tables take no part in the watermark: with tables alone the
            // main stream's events count as no named stream's (see
            // `Inputs::of`), so no stream is waited for.
            let joins_streams = plan.side_inputs.iter().any(|s| !s.stream.table);
            if joins_streams || !plan.marker_streams.is_empty() {
                tracker.expect_stream(&plan.main_stream);
                for side in streams {
                    tracker.expect_stream(&side.stream.name);
                }
                for marked in plan.marker_streams.iter().filter(|m| m.delay.is_some()) {
                    tracker.expect_stream(&marked.stream);
                }
            }
            tracker
        }),
    }
}

/// One task: the operator chain and watermark of one partition (or group of
/// co-partitioned partitions).
pub(super) struct Task {
    pub(super) operators: Vec<Box<dyn Operator>>,
    /// The steps of each join's second stream before the join.
    pub(super) side_chains: Vec<SideChain>,
    pub(super) watermark: Option<WatermarkTracker>,
    /// The last sink commit of this partition's output (a sink that
    /// commits per task), restored from and kept in its checkpoint.
    pub(super) sink_commit: Option<SinkCommit>,
    /// Two row buffers [`Task::push_row`] reuses.
    pub(super) scratch: (Vec<Row>, Vec<Row>),
}

/// Where a chain that takes the columnar route stops running on columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ColumnRoute {
    /// At this step, which reads the columns ([`Operator::reads_columns`]:
    /// a window aggregation); the rows it emits go on as rows.
    Reader(usize),
    /// Nowhere: every step maps columns to columns, and the sink is given
    /// the columns.
    ToSink,
}

/// Whether and how far the chain takes the columnar route: its leading
/// steps that map columns to columns ([`Operator::maps_columns`]: filter,
/// select, with_column), then a step that reads columns or the end of the
/// chain.
fn column_route(operators: &[Box<dyn Operator>]) -> Option<ColumnRoute> {
    let at = operators.iter().take_while(|op| op.maps_columns()).count();
    match operators.get(at) {
        None => Some(ColumnRoute::ToSink),
        Some(op) => op.reads_columns().then_some(ColumnRoute::Reader(at)),
    }
}

/// The second stream of a join, in a task: its own steps, then the join.
pub(super) struct SideChain {
    /// The input index its records are routed by (1, 2, ...).
    pub(super) input: usize,
    /// Where in the main chain its join is.
    pub(super) join_at: usize,
    pub(super) operators: Vec<Box<dyn Operator>>,
}

impl Task {
    /// Pushes `rows` into the chain at operator `from`; `contexts` holds
    /// each operator's view of the batch.
    pub(super) fn push(
        &mut self,
        from: usize,
        rows: Vec<Row>,
        contexts: &[BatchContext],
        out: &mut Vec<Row>,
    ) -> Result<()> {
        let mut current = rows;
        for (op, ctx) in self.operators[from..].iter_mut().zip(&contexts[from..]) {
            let mut next = Vec::with_capacity(current.len());
            for row in current {
                op.on_row(row, ctx, &mut next)?;
            }
            current = next;
        }
        out.extend(current);
        Ok(())
    }

    /// Pushes one row of the main input through the whole chain: the
    /// per-record path, through two buffers the task keeps, so that a row
    /// costs no allocation on its way.
    pub(super) fn push_row(
        &mut self,
        row: Row,
        contexts: &[BatchContext],
        out: &mut Vec<Row>,
    ) -> Result<()> {
        let (mut current, mut next) = std::mem::take(&mut self.scratch);
        current.clear();
        current.push(row);
        for (op, ctx) in self.operators.iter_mut().zip(contexts) {
            next.clear();
            for row in current.drain(..) {
                op.on_row(row, ctx, &mut next)?;
            }
            std::mem::swap(&mut current, &mut next);
        }
        out.append(&mut current);
        self.scratch = (current, next);
        Ok(())
    }

    /// Pushes a columnar batch of the main input into the chain: the
    /// leading steps that map columns (filter, select, with_column) run on
    /// the columns, then the next step reads them and the rows it emits go
    /// on as rows into `out`, or, when the chain has no other step, the
    /// columns are returned for the sink.
    pub(super) fn push_columns(
        &mut self,
        batch: &RecordBatch,
        contexts: &[BatchContext],
        out: &mut Vec<Row>,
    ) -> Result<Option<RecordBatch>> {
        let Some(route) = column_route(&self.operators) else {
            return Err(Error::Internal(
                "columns routed to a task without a step that reads them".into(),
            ));
        };
        let mappers = match route {
            ColumnRoute::Reader(at) => at,
            ColumnRoute::ToSink => self.operators.len(),
        };
        let mut mapped: Option<RecordBatch> = None;
        for (op, ctx) in self.operators[..mappers].iter_mut().zip(contexts) {
            let input = mapped.as_ref().unwrap_or(batch);
            mapped = Some(op.map_columns(input, ctx)?);
        }
        let mapped = mapped.unwrap_or_else(|| batch.clone());
        if route == ColumnRoute::ToSink {
            return Ok(Some(mapped));
        }
        let (Some(op), Some(ctx)) = (self.operators.get_mut(mappers), contexts.get(mappers)) else {
            return Err(Error::Internal(
                "columns routed to a task without a step that reads them".into(),
            ));
        };
        let mut emitted = Vec::new();
        op.on_columns(&mapped, ctx, &mut emitted)?;
        if !emitted.is_empty() {
            self.push(mappers + 1, emitted, contexts, out)?;
        }
        Ok(None)
    }

    /// Whether the chain takes the columnar route (see [`column_route`]).
    pub(super) fn reads_columns(&self) -> bool {
        column_route(&self.operators).is_some()
    }

    /// Pushes one row of input `input` (a join's second stream) through
    /// its steps and into its join.
    pub(super) fn push_input(
        &mut self,
        input: usize,
        row: Row,
        contexts: &[BatchContext],
        out: &mut Vec<Row>,
    ) -> Result<()> {
        let Some(chain) = self.side_chains.iter_mut().find(|c| c.input == input) else {
            return Err(Error::Internal(format!("no join takes input {input}")));
        };
        let join_at = chain.join_at;
        let ctx = &contexts[join_at];
        let mut current = vec![row];
        for op in chain.operators.iter_mut() {
            let mut next = Vec::with_capacity(current.len());
            for row in current {
                op.on_row(row, ctx, &mut next)?;
            }
            current = next;
        }
        let mut joined = Vec::new();
        for row in current {
            self.operators[join_at].on_input_row(input, row, ctx, &mut joined)?;
        }
        if !joined.is_empty() {
            self.push(join_at + 1, joined, contexts, out)?;
        }
        Ok(())
    }

    /// Hands a tombstone of input `input` to its join.
    pub(super) fn push_tombstone(&mut self, input: usize, key: &[u8]) -> Result<()> {
        let Some(chain) = self.side_chains.iter().find(|c| c.input == input) else {
            return Err(Error::Internal(format!("no join takes input {input}")));
        };
        self.operators[chain.join_at].on_input_tombstone(input, key)
    }

    pub(super) fn finish_batch(
        &mut self,
        contexts: &[BatchContext],
        out: &mut Vec<Row>,
    ) -> Result<()> {
        for i in 0..self.operators.len() {
            let mut emitted = Vec::new();
            self.operators[i].on_batch_end(&contexts[i], &mut emitted)?;
            if !emitted.is_empty() {
                self.push(i + 1, emitted, contexts, out)?;
            }
        }
        Ok(())
    }

    /// Each operator's view of the batch: the first sees the query's
    /// watermarks, each later one the watermark its predecessor passes on
    /// (Spark 3.5's propagation: after a join, rows may be older than the
    /// input watermark, and the next stateful operator must wait for them).
    pub(super) fn contexts(
        &self,
        batch_id: u64,
        processing_time: TimestampMicros,
        collect_late_rows: bool,
        real_time: bool,
    ) -> Vec<BatchContext> {
        let (late_threshold, watermark) = match &self.watermark {
            Some(w) => (w.late_threshold(), w.in_effect()),
            None => (0, 0),
        };
        let mut ctx = BatchContext {
            batch_id,
            processing_time,
            late_threshold,
            watermark,
            collect_late_rows,
            real_time,
        };
        let mut out = Vec::with_capacity(self.operators.len() + 1);
        for op in &self.operators {
            out.push(ctx);
            // 0 is "no watermark yet" and stays so.
            if ctx.watermark > 0 {
                ctx.watermark = op.output_watermark(ctx.watermark).max(0);
            }
            if ctx.late_threshold > 0 {
                ctx.late_threshold = op.output_watermark(ctx.late_threshold).max(0);
            }
        }
        out.push(ctx);
        out
    }
}

/// A task's operators before their stores are restored.
pub(super) struct PendingTask {
    pub(super) operators: Vec<Box<dyn Operator>>,
    /// Operator index and its store, restored when run.
    pub(super) stores: Vec<(usize, super::PendingStore)>,
    pub(super) cache_bytes: Option<usize>,
}

impl PendingTask {
    /// Restores every store and hands it to its operator.
    pub(super) fn restore(mut self) -> Result<Vec<Box<dyn Operator>>> {
        for (index, pending) in self.stores {
            let store = pending()?;
            self.operators[index].open_state(store, self.cache_bytes)?;
        }
        Ok(self.operators)
    }
}

/// A task restoring its stores on a thread of its own.
pub(super) struct RestoringTask {
    pub(super) done: std::sync::mpsc::Receiver<Result<Vec<Box<dyn Operator>>>>,
    /// Whether the source holds the partition back meanwhile.
    pub(super) held: bool,
}

impl RestoringTask {
    /// Starts restoring `pending` on a new thread.
    pub(super) fn start(partition: i32, pending: PendingTask) -> Result<Self> {
        let (sender, done) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("tidemark-restore-{partition}"))
            .spawn(move || {
                // The receiver is gone only when the query already ended.
                let _ = sender.send(pending.restore());
            })
            .map_err(|e| Error::io("starting a restore thread", e))?;
        Ok(RestoringTask { done, held: false })
    }

    /// Waits for the restore to end.
    pub(super) fn wait(self) -> Result<Vec<Box<dyn Operator>>> {
        self.done
            .recv()
            .unwrap_or_else(|_| Err(restore_thread_died()))
    }
}

pub(super) fn restore_thread_died() -> Error {
    Error::Source("a restore thread ended without a result".into())
}

/// How long a new task's restore may take before its partition is held
/// back and the batch goes on without it: restores this short cost no
/// re-fetch.
pub(super) const RESTORE_GRACE: Duration = Duration::from_millis(100);

/// Restores a task's watermark and last sink commit from a checkpoint its
/// source kept. Several checkpoints of one partition merge: both only
/// move forward, so the merge is the newest.
pub(super) fn restore_checkpoint(task: &mut Task, partition: i32, checkpoint: &TaskCheckpoint) {
    let saved = checkpoint.contents();
    let saved = match saved {
        Ok(saved) => saved,
        Err(e) => {
            tracing::warn!(partition, error = %e, "unreadable checkpoint ignored");
            return;
        }
    };
    if let (Some(w), Some(saved)) = (task.watermark.as_mut(), saved.watermark) {
        w.restore(&saved);
        tracing::info!(partition, watermark = w.in_effect(), "watermark restored");
    }
    if let Some(saved) = saved.sink {
        if task.sink_commit.as_ref().is_none_or(|c| c.seq < saved.seq) {
            task.sink_commit = Some(saved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{column_route, ColumnRoute};
    use crate::operators::{
        AggregateSpec, Filter, MapRows, Operator, OutputMode, Select, TimeColumn, WindowAggregate,
        WithColumn,
    };
    use crate::window::WindowSpec;
    use std::sync::Arc;

    fn window() -> Box<dyn Operator> {
        Box::new(WindowAggregate::new(
            vec![Arc::from("id")],
            TimeColumn::EventTime(Arc::from("t")),
            WindowSpec::tumbling("1 minute").unwrap(),
            vec![AggregateSpec::count()],
            OutputMode::Update,
        ))
    }

    fn filter() -> Box<dyn Operator> {
        Box::new(Filter::new("n > 1").unwrap())
    }

    #[test]
    fn the_columnar_route_reaches_past_steps_that_map_columns_only() {
        let select: Box<dyn Operator> = Box::new(Select::new([("n", "m"), ("t", "t")]));
        let computed: Box<dyn Operator> = Box::new(WithColumn::new("k", "m * 2").unwrap());
        assert_eq!(column_route(&[window()]), Some(ColumnRoute::Reader(0)));
        assert_eq!(
            column_route(&[filter(), select, computed, window()]),
            Some(ColumnRoute::Reader(3))
        );
        // A step that takes rows only closes the route.
        let map: Box<dyn Operator> = Box::new(MapRows::new("map", |row| Ok(vec![row])));
        assert_eq!(column_route(&[filter(), map, window()]), None);
        let map: Box<dyn Operator> = Box::new(MapRows::new("map", |row| Ok(vec![row])));
        assert_eq!(column_route(&[filter(), map]), None);
        // Steps that map columns only take them all the way to the sink.
        assert_eq!(column_route(&[filter()]), Some(ColumnRoute::ToSink));
        assert_eq!(column_route(&[]), Some(ColumnRoute::ToSink));
    }
}
