//! The commit protocol of a batch, in the order the code runs it:
//!
//! 1. operators flush their state into their stores;
//! 2. the state backend commits (changelogs acknowledged), so that no
//!    offset is committed before the state it produced is durable; local
//!    state under a source with a batch log keeps a version of it;
//! 3. the sink is told the batch's event-time progress and source offsets,
//!    stages per-task output if it commits per task, and commits the batch (a transactional sink commits offsets and
//!    output together here);
//! 4. the late-data output commits, then the dead-letter output flushes;
//! 5. the source commits its offsets with each task's checkpoint (its
//!    watermark, and the sink commit staged for it in step 3 by a sink that
//!    commits per task);
//! 6. such a sink publishes what it staged (a Delta commit): a task that
//!    resumes elsewhere after a crash between 5 and 6 finds its staged
//!    commit in its checkpoint and the sink publishes it then;
//! 7. the state backend is told the batch committed (it may then vouch for
//!    its local files with a checkpoint).
//!
//! A step that reports the batch aborted (a rebalance fenced the
//! transaction, a test hook of [`super::fault_injection`]) abandons the
//! source's transaction and rewinds it to the last commit; the next batch
//! keeps this batch's id and reads exactly this batch's input again (its end
//! offsets bound it), and the tasks are rebuilt from their stores and
//! checkpoints.

use super::task_manager::{Backend, TaskManager};
use super::{DeadLetter, Sink, Source};
use crate::error::{Error, Result};
use crate::time::TimestampMicros;
use std::collections::BTreeMap;

use super::fault_injection::{arm, crash_point, fail_point};

/// How a commit ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CommitOutcome {
    /// Every step committed.
    Committed,
    /// A step reported the batch aborted; the source rewound and the batch
    /// runs again with its id. `replay_bounded`: over exactly the input it
    /// had (the source bounds its next batch at the aborted one's end).
    /// `reason`: why it aborted.
    Aborted {
        replay_bounded: bool,
        reason: String,
    },
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
/// partition is `event_time_progress`. A step that reports the batch
/// aborted (a fenced transaction, a rebalance's `ILLEGAL_GENERATION`)
/// abandons the source's transaction, rewinds the source to the last
/// commit and bounds the replay at this batch's end offsets.
pub(super) fn commit_batch(
    batch_id: u64,
    tasks: &mut TaskManager,
    event_time_progress: &BTreeMap<String, TimestampMicros>,
    mut targets: CommitTargets<'_>,
) -> Result<CommitOutcome> {
    let batch_end = targets.source.offsets();
    match commit_steps(batch_id, tasks, event_time_progress, &mut targets) {
        Ok(()) => {
            if let Some(backend) = targets.backend.as_mut() {
                backend.batch_committed()?;
            }
            Ok(CommitOutcome::Committed)
        }
        Err(Error::BatchAborted(reason)) => {
            targets.source.abort()?;
            targets.sink.abort(batch_id);
            if let Some(late) = targets.late_data.as_mut() {
                late.abort(batch_id);
            }
            if !targets.source.rewind()? {
                return Err(Error::BatchAborted(reason));
            }
            let replay_bounded = targets.source.replay_until(batch_id, &batch_end)?;
            tracing::warn!(batch_id, %reason, end_offsets = %batch_end, replay_bounded, "batch aborted; replaying it from the last commit");
            metrics::counter!("tidemark_batches_aborted_total").increment(1);
            tasks.drop_tasks();
            if let Some(backend) = targets.backend.as_mut() {
                backend.batch_aborted()?;
            }
            Ok(CommitOutcome::Aborted {
                replay_bounded,
                reason,
            })
        }
        Err(other) => Err(other),
    }
}

/// The commit protocol's steps, in order (see the module documentation).
fn commit_steps(
    batch_id: u64,
    tasks: &mut TaskManager,
    event_time_progress: &BTreeMap<String, TimestampMicros>,
    targets: &mut CommitTargets<'_>,
) -> Result<()> {
    for task in tasks.tasks_mut().values_mut() {
        for op in task.operators.iter_mut() {
            op.checkpoint()?;
        }
    }
    if let Some(backend) = targets.backend.as_mut() {
        backend.commit()?;
        backend.version(batch_id)?;
    }
    tracing::debug!(batch_id, tasks = tasks.tasks().len(), "batch committing");
    targets.sink.event_time_progress(event_time_progress);
    targets.sink.source_offsets(&targets.source.offsets());
    fail_point("before_sink_commit", batch_id)?;
    let staged = targets.sink.prepare(batch_id, &tasks.next_sink_seqs())?;
    tasks.record_sink_commits(staged);
    targets.sink.commit(batch_id)?;
    crash_point("after_sink_commit", batch_id);
    fail_point("after_sink_commit", batch_id)?;
    if let Some(late) = targets.late_data.as_mut() {
        late.commit(batch_id)?;
    }
    targets.dead_letter.flush()?;
    arm("after_offsets_added", batch_id);
    targets.source.commit(&tasks.checkpoints(batch_id))?;
    crash_point("after_source_commit", batch_id);
    // The batch is committed: a publish that fails is not an abort (its
    // replay would stage the output again); the query stops and whoever
    // owns the partitions next publishes what is staged.
    targets.sink.publish(batch_id).map_err(|e| match e {
        Error::BatchAborted(reason) => Error::Sink(format!(
            "publishing batch {batch_id} after its offsets committed: {reason}"
        )),
        other => other,
    })
}
