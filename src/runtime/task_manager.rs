//! The tasks of a running query, as Kafka Streams' `TaskManager` keeps
//! them: a task per assigned partition, started when its partition first
//! delivers (or comes back with a checkpoint), restored from its stores on
//! a thread of its own, its partition held back by the source while a
//! restore outlasts a short grace period, and closed when the partition is
//! revoked.

use super::plan::QueryPlan;
use super::routed::BatchScope;
use super::task::{
    new_task, pending_task, restore_checkpoint, restore_thread_died, RestoringTask, Task,
    RESTORE_GRACE,
};
use super::task_checkpoint::{CheckpointContents, TaskCheckpoint, CHECKPOINT_VERSION};
use super::watermark::{ExchangeAlignment, SharedProgress};
use super::{PartitionProgress, SinkCommit, Source, SourceBatch, StateBackend};
use crate::error::Result;
use crate::operators::BatchContext;
use crate::record::Record;
use crate::row::Row;
use crate::time::TimestampMicros;
use crate::watermark::WatermarkScope;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Instant;

/// The optional state backend tasks open their stores in.
pub(super) type Backend = Option<Box<dyn StateBackend>>;

/// The tasks of a query and those still restoring.
pub(super) struct TaskManager {
    tasks: BTreeMap<i32, Task>,
    restoring: BTreeMap<i32, RestoringTask>,
    /// Checkpoints of partitions whose tasks have not started yet.
    saved_checkpoints: BTreeMap<i32, Vec<TaskCheckpoint>>,
    /// Sink commits of tasks that resumed, for the sink to check.
    sink_recoveries: Vec<(i32, SinkCommit)>,
    /// Stores restore on threads of their own while the others go on.
    restores_in_background: bool,
    stateful: bool,
    /// With a state backend, each store of a task and what keeps it,
    /// recorded with the checkpoints and checked against those restored;
    /// `None` without one (nothing is restored, nothing is checked).
    stores: Option<BTreeMap<String, String>>,
    /// A repartition writer under the query scope: every assigned
    /// partition has a task (see `new_partitions`).
    starts_every_assigned: bool,
    /// The query-wide progress this instance counted, and the exchange's
    /// alignment (see `watermark::shared`).
    shared: SharedProgress,
    /// Tasks were running when the current assignment's tasks started.
    joining_running: bool,
    /// Partitions the current poll handed back with a checkpoint.
    handed_over: BTreeSet<i32>,
}

/// What the end of a batch gave besides its output rows.
#[derive(Default)]
pub(super) struct BatchEnd {
    /// Rows dropped as late, for the late-data output.
    pub(super) late_rows: Vec<Row>,
    /// The smallest watermark any task used in the batch.
    pub(super) watermark_used: Option<TimestampMicros>,
    /// Joins: each stream's watermark (before the policy combines them).
    pub(super) stream_watermarks: BTreeMap<String, TimestampMicros>,
}

impl TaskManager {
    /// No tasks yet, for a query planned by `plan`.
    pub(super) fn new(plan: &QueryPlan, backend: &Backend) -> Self {
        let stateful = plan.has_stateful_steps();
        TaskManager {
            tasks: BTreeMap::new(),
            restoring: BTreeMap::new(),
            saved_checkpoints: BTreeMap::new(),
            sink_recoveries: Vec::new(),
            restores_in_background: backend.is_some() && stateful,
            stateful,
            // In memory, nothing is restored that a changed chain could
            // misread.
            stores: backend.as_ref().map(|_| plan.store_identities()),
            starts_every_assigned: plan.forwards_stream_maxima,
            shared: SharedProgress::default(),
            joining_running: false,
            handed_over: BTreeSet::new(),
        }
    }

    /// Counts other instances' progress only as far as each task has read
    /// (a query sharing its progress through a watermark exchange); at
    /// once when the polls are not `planned` (the real-time trigger).
    pub(super) fn align_to_exchange(&mut self, planned: bool) {
        self.shared.align_to_exchange(planned);
    }

    /// The exchange's alignment, when the query has an exchange.
    pub(super) fn alignment_mut(&mut self) -> Option<&mut ExchangeAlignment> {
        self.shared.alignment_mut()
    }

    /// After a poll that read nothing: the partitions the source's plan
    /// (asked at `as_of_ms`) found with nothing waiting hold nothing back
    /// of what arrived before it.
    pub(super) fn nothing_read(&mut self, caught_up: &BTreeSet<i32>, as_of_ms: Option<i64>) {
        let running: Vec<i32> = self.tasks.keys().copied().collect();
        self.shared.nothing_read(&running, caught_up, as_of_ms);
    }

    /// The running tasks by partition.
    pub(super) fn tasks(&self) -> &BTreeMap<i32, Task> {
        &self.tasks
    }

    /// The running tasks by partition, to push records into.
    pub(super) fn tasks_mut(&mut self) -> &mut BTreeMap<i32, Task> {
        &mut self.tasks
    }

    /// The first running task holding state for `key` in operator
    /// `index`, with that state (interactive queries).
    pub(super) fn read_key(
        &mut self,
        index: usize,
        key: &[crate::row::Value],
        range: &crate::operators::KeyRange,
    ) -> Result<Option<(i32, Vec<Row>)>> {
        for (partition, task) in self.tasks.iter_mut() {
            let Some(op) = task.operators.get_mut(index) else {
                continue;
            };
            let rows = op.read_key(key, range)?;
            if !rows.is_empty() {
                return Ok(Some((*partition, rows)));
            }
        }
        Ok(None)
    }

    /// The partitions whose tasks run, and those restoring.
    pub(super) fn partitions(&self) -> (Vec<i32>, Vec<i32>) {
        (
            self.tasks.keys().copied().collect(),
            self.restoring.keys().copied().collect(),
        )
    }

    /// Whether any task is restoring.
    pub(super) fn any_restoring(&self) -> bool {
        !self.restoring.is_empty()
    }

    /// Whether the batch has records for a running task.
    pub(super) fn has_records_for_tasks(&self, records: &[Record]) -> bool {
        records
            .iter()
            .any(|r| !self.restoring.contains_key(&r.position.partition))
    }

    /// Follows the source's assignment after a poll: closes the tasks of
    /// revoked partitions, starts tasks for new ones and waits out their
    /// restores for a grace period. A replayed batch (`hold_allowed` false)
    /// must hold exactly its recorded input, so it waits for every restore.
    pub(super) fn follow_assignment(
        &mut self,
        plan: &QueryPlan,
        batch: &SourceBatch,
        backend: &mut Backend,
        source: &mut dyn Source,
        hold_allowed: bool,
    ) -> Result<()> {
        // Before the revocations: an eager rebalance revokes every task
        // and hands the partitions back with the new ones.
        self.joining_running = !self.tasks.is_empty();
        // Handed over: new here with a checkpoint, not a partition an
        // eager rebalance revoked and gave straight back.
        self.handed_over = batch
            .restored_checkpoints
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !self.tasks.contains_key(p))
            .collect();
        self.revoke(&batch.revoked_partitions, backend)?;
        for (partition, checkpoint) in &batch.restored_checkpoints {
            checkpoint.check(*partition, self.stores.as_ref())?;
        }
        for (partition, checkpoint) in &batch.restored_checkpoints {
            match self.tasks.get_mut(partition) {
                Some(task) => {
                    restore_checkpoint(task, *partition, checkpoint);
                    self.note_sink_recovery(*partition);
                }
                None => self
                    .saved_checkpoints
                    .entry(*partition)
                    .or_default()
                    .push(checkpoint.clone()),
            }
        }
        let assigned: Vec<i32> = match self.starts_every_assigned {
            true => source
                .assigned_inputs()
                .into_iter()
                .map(|(_, p)| p)
                .collect(),
            false => Vec::new(),
        };
        let new_partitions = self.new_partitions(batch, &assigned);
        self.start(plan, new_partitions, backend)?;
        self.await_restores(plan, source, hold_allowed)?;
        metrics::gauge!("tidemark_tasks_restoring").set(self.restoring.len() as f64);
        Ok(())
    }

    fn revoke(&mut self, partitions: &[i32], backend: &mut Backend) -> Result<()> {
        for p in partitions {
            self.saved_checkpoints.remove(p);
            // A restore in flight still writes the task's files: let it end
            // before the backend closes them.
            let was_restoring = match self.restoring.remove(p) {
                Some(r) => r.wait().map(|_| true)?,
                None => false,
            };
            if self.tasks.remove(p).is_some() || was_restoring {
                tracing::info!(partition = p, "partition revoked; task closed");
            }
            // Also when no task runs: a batch that aborted dropped the
            // tasks but not their local files, which the next owner of the
            // partition on this machine opens (and which must not stay
            // checkpointed from here).
            if let Some(backend) = backend.as_mut() {
                backend.close(*p)?;
            }
        }
        Ok(())
    }

    /// Partitions that need a task: tasks start when their partition first
    /// delivers records. A partition handed back with a checkpoint starts
    /// its task at once too, records or not: after a restart its watermark
    /// may already have moved, and the no-data batch that evicts (and
    /// writes closed windows, outer join rows) must not wait for new input.
    /// A repartition writer under the query scope starts every `assigned`
    /// partition's: each reports its stream's progress, silent or not (see
    /// `markers`), and one handed over with a backlog is known as such only
    /// at its assignment (it catches up, see `watermark::alignment`).
    fn new_partitions(&self, batch: &SourceBatch, assigned: &[i32]) -> BTreeSet<i32> {
        let resumed = batch
            .restored_checkpoints
            .iter()
            .map(|(p, _)| *p)
            .filter(|_| self.stateful);
        batch
            .records
            .iter()
            .map(|r| r.position.partition)
            .chain(resumed)
            .chain(assigned.iter().copied())
            .filter(|p| !self.tasks.contains_key(p) && !self.restoring.contains_key(p))
            .collect()
    }

    fn start(
        &mut self,
        plan: &QueryPlan,
        partitions: BTreeSet<i32>,
        backend: &mut Backend,
    ) -> Result<()> {
        for partition in partitions {
            if self.restores_in_background {
                let pending = pending_task(plan, partition, backend.as_deref_mut())?;
                self.restoring
                    .insert(partition, RestoringTask::start(partition, pending)?);
            } else {
                let operators = pending_task(plan, partition, None)?.restore()?;
                self.add_task(plan, partition, operators);
            }
        }
        Ok(())
    }

    fn add_task(
        &mut self,
        plan: &QueryPlan,
        partition: i32,
        operators: Vec<Box<dyn crate::operators::Operator>>,
    ) {
        let mut task = new_task(plan, operators);
        let handed_over = self.handed_over.contains(&partition);
        let catching_up = self
            .shared
            .task_started(partition, self.joining_running, handed_over);
        // Under the query-wide scope a new task starts from what the
        // instance's other tasks know of every partition; one catching up
        // from its checkpoint alone, and so does a repartition reader's:
        // its partition's markers follow its rows, and a backlog handed
        // over must meet them in that order, not the running tasks' newer
        // ones.
        let from_others = !catching_up && !plan.watermark_from_markers;
        if let Some(w) = task
            .watermark
            .as_mut()
            .filter(|w| w.scope() == WatermarkScope::Query && from_others)
        {
            let known = self
                .tasks
                .iter()
                .filter(|(p, _)| !self.shared.is_catching_up(**p))
                .find_map(|(_, t)| t.watermark.as_ref());
            self.shared
                .start(w, known, &super::inputs::Inputs::of(plan));
        }
        for checkpoint in self
            .saved_checkpoints
            .remove(&partition)
            .unwrap_or_default()
        {
            restore_checkpoint(&mut task, partition, &checkpoint);
        }
        self.tasks.insert(partition, task);
        self.note_sink_recovery(partition);
    }

    /// Waits for restores up to the grace period; a restore that outlasts
    /// it goes on in the background, its partition held back by the source,
    /// while the other tasks process the batch.
    fn await_restores(
        &mut self,
        plan: &QueryPlan,
        source: &mut dyn Source,
        hold_allowed: bool,
    ) -> Result<()> {
        let grace_end = Instant::now() + RESTORE_GRACE;
        let partitions: Vec<i32> = self.restoring.keys().copied().collect();
        for partition in partitions {
            let Some(pending) = self.restoring.get_mut(&partition) else {
                continue;
            };
            let wait = grace_end.saturating_duration_since(Instant::now());
            let outcome = match pending.done.recv_timeout(wait) {
                Ok(result) => Some(result),
                Err(RecvTimeoutError::Disconnected) => Some(Err(restore_thread_died())),
                Err(RecvTimeoutError::Timeout) if pending.held => None,
                Err(RecvTimeoutError::Timeout) => {
                    if hold_allowed && source.hold(partition)? {
                        pending.held = true;
                        tracing::info!(
                            partition,
                            "task restoring; its partition waits while the others go on"
                        );
                        None
                    } else {
                        Some(
                            pending
                                .done
                                .recv()
                                .unwrap_or_else(|_| Err(restore_thread_died())),
                        )
                    }
                }
            };
            let Some(result) = outcome else {
                continue;
            };
            let held = self.restoring.remove(&partition).is_some_and(|r| r.held);
            self.add_task(plan, partition, result?);
            if held {
                tracing::info!(partition, "task restored; its partition resumes");
                source.release(partition)?;
            }
        }
        Ok(())
    }

    /// A task resumed with a recorded sink commit: the sink checks it is
    /// published before the task writes more.
    fn note_sink_recovery(&mut self, partition: i32) {
        if let Some(commit) = self
            .tasks
            .get(&partition)
            .and_then(|t| t.sink_commit.clone())
        {
            self.sink_recoveries.push((partition, commit));
        }
    }

    /// The sink commits of tasks that resumed since the last call.
    pub(super) fn take_sink_recoveries(&mut self) -> Vec<(i32, SinkCommit)> {
        std::mem::take(&mut self.sink_recoveries)
    }

    /// Each task's next sink commit number.
    pub(super) fn next_sink_seqs(&self) -> BTreeMap<i32, u64> {
        self.tasks
            .iter()
            .map(|(p, t)| (*p, t.sink_commit.as_ref().map_or(1, |c| c.seq + 1)))
            .collect()
    }

    /// Records what the sink staged for each task this batch: it goes
    /// into their checkpoints.
    pub(super) fn record_sink_commits(&mut self, commits: BTreeMap<i32, SinkCommit>) {
        for (partition, commit) in commits {
            if let Some(task) = self.tasks.get_mut(&partition) {
                task.sink_commit = Some(commit);
            }
        }
    }

    /// Whether a task's watermark moved since its last batch: stateful
    /// operators that evict by watermark then need a (no-data) batch.
    pub(super) fn watermark_pending(&self) -> bool {
        self.tasks.values().any(|t| {
            t.watermark
                .as_ref()
                .is_some_and(|w| w.in_effect() != w.late_threshold())
        })
    }

    /// Whether an operator wants a batch without input (its timers are due).
    pub(super) fn timers_due(&self, scope: &BatchScope) -> bool {
        self.tasks.values().any(|t| {
            let contexts = scope.contexts(t);
            t.operators
                .iter()
                .zip(&contexts)
                .any(|(op, ctx)| op.wants_batch(ctx))
        })
    }

    /// Moves each task's watermark by the largest event time its partitions
    /// delivered (unless markers carry the progress); returns that progress
    /// per input partition, named as the source names it.
    pub(super) fn observe_event_times(
        &mut self,
        max_event_time: &BTreeMap<(Arc<str>, i32), TimestampMicros>,
        inputs: &super::inputs::Inputs,
        source: &dyn Source,
        from_markers: bool,
        processing_time: TimestampMicros,
    ) -> BTreeMap<String, TimestampMicros> {
        let mut progress = BTreeMap::new();
        for ((topic, partition), t) in max_event_time {
            let name = source.watermark_input(topic, *partition);
            let input = inputs.get(inputs.input_of(topic));
            // Spark's query-wide watermark: every task sees every
            // partition's progress; per partition, only its own task.
            let shared = &self.shared;
            let query_wide = |p: i32, task: &Task| {
                task.watermark
                    .as_ref()
                    .is_some_and(|w| w.scope() == WatermarkScope::Query)
                    && !shared.is_catching_up(p)
            };
            let trackers = self
                .tasks
                .iter_mut()
                .filter(|(p, task)| *p == partition || query_wide(**p, task))
                .filter_map(|(_, task)| task.watermark.as_mut())
                .filter(|_| !from_markers);
            for w in trackers {
                w.observe_stream(
                    &name,
                    input.stream.as_deref(),
                    input.delay,
                    *t,
                    processing_time,
                );
            }
            progress.insert(name, *t);
        }
        progress
    }

    /// Counts the progress published to the watermark exchange (every
    /// instance's, by input partition) in every task's query-wide
    /// watermark, as far as the alignment lets each (see
    /// `watermark::alignment`); returns whether a watermark would move (a
    /// batch is then due, as Spark's driver would run one having seen
    /// every partition).
    pub(super) fn observe_other_instances(
        &mut self,
        inputs: &super::inputs::Inputs,
        processing_time: TimestampMicros,
    ) -> bool {
        let running: Vec<i32> = self.tasks.keys().copied().collect();
        let watermarks = self
            .tasks
            .iter_mut()
            .filter_map(|(p, task)| Some((*p, task.watermark.as_mut()?)));
        self.shared
            .observe_other_instances(&running, watermarks, inputs, processing_time)
    }

    /// After a batch committed: notes this instance's committed `progress`
    /// (a task started later, or after every task was dropped, starts from
    /// it) and how far each task read (`caught_up`: the partitions the
    /// source's plan reads to their end); returns the progress to publish
    /// to the exchange.
    pub(super) fn share_committed_progress(
        &mut self,
        progress: &BTreeMap<String, TimestampMicros>,
        caught_up: &BTreeSet<i32>,
        as_of_ms: Option<i64>,
    ) -> BTreeMap<String, PartitionProgress> {
        let running: Vec<i32> = self.tasks.keys().copied().collect();
        self.shared
            .share_committed(&running, progress, caught_up, as_of_ms)
    }

    /// Ends the batch in every task: operators emit what the batch closed
    /// (into `out`), late rows are collected, watermarks advance for the
    /// next batch. `contexts` holds what tasks that took records used.
    pub(super) fn finish_batch(
        &mut self,
        mut contexts: BTreeMap<i32, Vec<BatchContext>>,
        scope: &BatchScope,
        joins: bool,
        out: &mut Vec<Row>,
        out_tasks: &mut Vec<(i32, usize)>,
    ) -> Result<BatchEnd> {
        let mut end = BatchEnd::default();
        for (partition, task) in self.tasks.iter_mut() {
            let task_contexts = contexts
                .remove(partition)
                .unwrap_or_else(|| scope.contexts(task));
            task.finish_batch(&task_contexts, out)?;
            super::output::mark_task(out, out_tasks, *partition);
            let used = task_contexts[0].watermark;
            if let Some(w) = task.watermark.as_ref().filter(|_| joins) {
                for (stream, watermark) in w.stream_watermarks() {
                    let slot = end.stream_watermarks.entry(stream).or_insert(watermark);
                    *slot = (*slot).min(watermark);
                }
            }
            if task.watermark.is_some() {
                end.watermark_used = Some(end.watermark_used.map_or(used, |w| w.min(used)));
            }
            for op in task.operators.iter_mut() {
                end.late_rows.extend(op.take_late_rows());
            }
            if let Some(w) = task.watermark.as_mut() {
                w.finish_batch(scope.processing_time);
            }
        }
        Ok(end)
    }

    /// Each task's checkpoint for `batch_id`: its watermark and last sink
    /// commit, kept with the source offsets.
    pub(super) fn checkpoints(&self, batch_id: u64) -> BTreeMap<i32, TaskCheckpoint> {
        self.tasks
            .iter()
            .filter(|(_, t)| {
                let keeps_stores = self.stores.as_ref().is_some_and(|s| !s.is_empty());
                t.watermark.is_some() || t.sink_commit.is_some() || keeps_stores
            })
            .filter_map(|(p, t)| {
                let stores = self.stores.clone().unwrap_or_default();
                Some((*p, task_checkpoint(batch_id, t, stores)?))
            })
            .collect()
    }

    /// Drops every running task after an aborted batch: they are rebuilt
    /// from their stores' changelogs and the committed checkpoints, as
    /// after a rebalance.
    pub(super) fn drop_tasks(&mut self) {
        self.tasks.clear();
        // The rewound source holds nothing back any more (the replay needs
        // every partition): a restore still running is waited for, as a
        // replay's are, so that its partition's records are not skipped.
        for restoring in self.restoring.values_mut() {
            restoring.held = false;
        }
    }

    /// Closes every task once every batch so far committed: tasks close in
    /// step with their changelogs.
    pub(super) fn close(mut self, backend: &mut Backend) -> Result<()> {
        let mut partitions: Vec<i32> = self.tasks.keys().copied().collect();
        self.tasks.clear();
        for (partition, pending) in std::mem::take(&mut self.restoring) {
            pending.wait()?;
            partitions.push(partition);
        }
        if let Some(backend) = backend.as_mut() {
            for partition in partitions {
                backend.close(partition)?;
            }
        }
        Ok(())
    }
}

/// `task`'s checkpoint for `batch_id`, with the stores the plan keeps.
fn task_checkpoint(
    batch_id: u64,
    task: &Task,
    stores: BTreeMap<String, String>,
) -> Option<TaskCheckpoint> {
    TaskCheckpoint::encode(CheckpointContents {
        version: CHECKPOINT_VERSION,
        batch_id,
        watermark: task.watermark.clone(),
        sink: task.sink_commit.clone(),
        stores,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Query;

    /// A repartition reader's watermark holds every upstream partition: with
    /// 500 of them the checkpoint still fits Kafka's 4 KiB, and keeps the
    /// watermarks (in effect and previous) and the sink commit.
    #[test]
    fn a_checkpoint_of_any_number_of_inputs_fits_the_offset_metadata_limit() {
        let builder = Query::builder("wide")
            .event_time("t")
            .watermark("1 minute")
            .unwrap()
            .watermark_scope(WatermarkScope::Partition);
        let mut task = new_task(builder.plan(), Vec::new());
        task.sink_commit = Some(SinkCommit {
            seq: 7,
            staged: "p3-s7".into(),
        });
        let w = task.watermark.as_mut().unwrap();
        for origin in 0..500 {
            w.observe(&format!("upstream/{origin}"), 3_600_000_000 + origin, 0);
        }
        w.finish_batch(0);
        let (in_effect, previous) = (w.in_effect(), w.late_threshold());
        assert_eq!(in_effect, 3_540_000_000, "the slowest input, less a minute");
        let checkpoint = task_checkpoint(12, &task, BTreeMap::new()).unwrap();
        let bytes = checkpoint.as_str().len();
        assert!(bytes <= 4096, "{bytes} bytes");

        let mut restored = new_task(builder.plan(), Vec::new());
        restore_checkpoint(&mut restored, 0, &checkpoint);
        let w = restored.watermark.as_ref().unwrap();
        assert_eq!((w.in_effect(), w.late_threshold()), (in_effect, previous));
        assert_eq!(restored.sink_commit, task.sink_commit);

        // A narrow one keeps its inputs.
        let mut narrow = new_task(builder.plan(), Vec::new());
        let w = narrow.watermark.as_mut().unwrap();
        w.observe("in/0", 3_600_000_000, 0);
        let checkpoint = task_checkpoint(1, &narrow, BTreeMap::new()).unwrap();
        assert!(checkpoint.as_str().contains("3600000000"), "{checkpoint:?}");
    }
}
