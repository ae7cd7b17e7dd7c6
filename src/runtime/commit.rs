//! The commit protocol of a batch, in the order the code runs it:
//!
//! 1. operators flush their state into their stores;
//! 2. the state backend commits (changelogs acknowledged), so that no
//!    offset is committed before the state it produced is durable;
//! 3. the sink is told the batch's event-time progress and source offsets,
//!    and commits the batch (a transactional sink commits offsets and
//!    output together here);
//! 4. the late-data output commits, then the dead-letter output flushes;
//! 5. the source commits its offsets with each task's checkpoint (its
//!    watermark). A source that reports the batch aborted (a rebalance
//!    fenced its transaction) rewinds to the last commit, and the tasks
//!    are rebuilt from their stores and checkpoints.

use super::task_manager::{Backend, TaskManager};
use super::{DeadLetter, Sink, Source};
use crate::error::{Error, Result};
use crate::time::TimestampMicros;
use std::collections::BTreeMap;

/// A test hook: `TIDEMARK_CRASH_AFTER_SINK_COMMIT=<batch id>` aborts the
/// process right after the sink committed that batch and before the source
/// offsets are committed, as a `kill -9` at the worst moment would (used by
/// the Delta sink's exactly-once test).
pub(super) fn crash_point(point: &str, batch_id: u64) {
    let variable = format!("TIDEMARK_CRASH_{}", point.to_uppercase());
    if std::env::var(&variable).is_ok_and(|v| v.trim() == batch_id.to_string()) {
        eprintln!("{variable}={batch_id}: aborting");
        std::process::abort();
    }
}

/// How a commit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CommitOutcome {
    /// Every step committed.
    Committed,
    /// The source aborted the batch and rewound: it runs again.
    Aborted,
}

/// Everything a batch commits to.
pub(super) struct CommitTargets<'a> {
    pub(super) source: &'a mut dyn Source,
    pub(super) sink: &'a mut dyn Sink,
    pub(super) late_data: Option<&'a mut Box<dyn Sink>>,
    pub(super) dead_letter: &'a mut dyn DeadLetter,
    pub(super) backend: &'a mut Backend,
}

/// Commits batch `batch_id` of `tasks`, whose largest event time per input
/// partition is `event_time_progress`.
pub(super) fn commit_batch(
    batch_id: u64,
    tasks: &mut TaskManager,
    event_time_progress: &BTreeMap<String, TimestampMicros>,
    targets: CommitTargets<'_>,
) -> Result<CommitOutcome> {
    for task in tasks.tasks_mut().values_mut() {
        for op in task.operators.iter_mut() {
            op.checkpoint()?;
        }
    }
    if let Some(backend) = targets.backend.as_mut() {
        backend.commit()?;
    }
    tracing::debug!(batch_id, tasks = tasks.tasks().len(), "batch committing");
    targets.sink.event_time_progress(event_time_progress);
    targets.sink.source_offsets(&targets.source.offsets());
    targets.sink.commit(batch_id)?;
    crash_point("after_sink_commit", batch_id);
    if let Some(late) = targets.late_data {
        late.commit(batch_id)?;
    }
    targets.dead_letter.flush()?;
    match targets.source.commit(&tasks.checkpoints(batch_id)) {
        Err(Error::BatchAborted(reason)) if targets.source.rewind()? => {
            tracing::warn!(batch_id, %reason, "batch aborted; replaying from the last commit");
            metrics::counter!("tidemark_batches_aborted_total").increment(1);
            tasks.drop_tasks();
            Ok(CommitOutcome::Aborted)
        }
        Err(other) => Err(other),
        Ok(()) => Ok(CommitOutcome::Committed),
    }
}
