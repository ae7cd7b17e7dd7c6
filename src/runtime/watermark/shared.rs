//! This instance's share of a query-wide watermark (`watermark_scope:
//! query`): the progress it has counted of every input partition — its own
//! committed batches' and, with a watermark exchange, what the other
//! instances published, as far as the alignment lets each task count it
//! (see `alignment`). A task started later, or after every task was
//! dropped, begins from it. The task manager asks it; the trackers
//! themselves stay in the tasks.

use super::alignment::ExchangeAlignment;
use super::exchange::PartitionProgress;
use crate::runtime::inputs::Inputs;
use crate::time::TimestampMicros;
use crate::watermark::{WatermarkScope, WatermarkTracker};
use std::collections::{BTreeMap, BTreeSet};

/// The progress this instance counted per input partition, and the
/// exchange's alignment when the query shares progress with others.
#[derive(Debug, Default)]
pub(in crate::runtime) struct SharedProgress {
    /// The largest event time counted per input partition: this instance's
    /// committed progress and what the watermark exchange let it count of
    /// the others'.
    counted: BTreeMap<String, TimestampMicros>,
    /// With a watermark exchange: what of the others' progress each task
    /// may count, by how far it has read.
    alignment: Option<ExchangeAlignment>,
}

impl SharedProgress {
    /// Counts other instances' progress only as far as each task has read
    /// (a query sharing its progress through a watermark exchange); at
    /// once when the polls are not `planned` (the real-time trigger).
    pub(in crate::runtime) fn align_to_exchange(&mut self, planned: bool) {
        self.alignment = Some(if planned {
            ExchangeAlignment::default()
        } else {
            ExchangeAlignment::ungated()
        });
    }

    /// The exchange's alignment, when the query has an exchange.
    pub(in crate::runtime) fn alignment_mut(&mut self) -> Option<&mut ExchangeAlignment> {
        self.alignment.as_mut()
    }

    /// Whether the task of `partition` joined running ones and has not
    /// read its backlog to its end yet.
    pub(in crate::runtime) fn is_catching_up(&self, partition: i32) -> bool {
        self.alignment
            .as_ref()
            .is_some_and(|a| a.is_catching_up(partition))
    }

    /// A task starts for `partition`; returns whether it catches up (see
    /// `alignment`).
    pub(in crate::runtime) fn task_started(
        &mut self,
        partition: i32,
        joining_running: bool,
        handed_over: bool,
    ) -> bool {
        self.alignment
            .as_mut()
            .is_some_and(|a| a.task_started(partition, joining_running, handed_over))
    }

    /// Starts a new task's query-wide watermark from `known`, the
    /// watermark of a running task in step with it, or else from the
    /// progress counted so far.
    pub(in crate::runtime) fn start(
        &self,
        w: &mut WatermarkTracker,
        known: Option<&WatermarkTracker>,
        inputs: &Inputs,
    ) {
        match known {
            Some(known) => w.restore(known),
            None => observe_progress(w, &self.counted, inputs, crate::time::now_micros()),
        }
    }

    /// After a poll that read nothing: the partitions the source's plan
    /// (asked at `as_of_ms`) found with nothing waiting hold nothing back
    /// of what arrived before it.
    pub(in crate::runtime) fn nothing_read(
        &mut self,
        running: &[i32],
        caught_up: &BTreeSet<i32>,
        as_of_ms: Option<i64>,
    ) {
        if let Some(alignment) = self.alignment.as_mut() {
            alignment.nothing_read(running, caught_up, as_of_ms);
        }
    }

    /// Counts the progress published to the watermark exchange (every
    /// instance's, by input partition) in the query-wide `watermarks` of
    /// the `running` tasks, as far as the alignment lets each; returns
    /// whether a watermark would move (a batch is then due, as Spark's
    /// driver would run one having seen every partition).
    pub(in crate::runtime) fn observe_other_instances<'t>(
        &mut self,
        running: &[i32],
        watermarks: impl Iterator<Item = (i32, &'t mut WatermarkTracker)>,
        inputs: &Inputs,
        processing_time: TimestampMicros,
    ) -> bool {
        let Some(alignment) = self.alignment.as_mut() else {
            return false;
        };
        let in_step: Vec<i32> = running
            .iter()
            .copied()
            .filter(|p| !alignment.is_catching_up(*p))
            .collect();
        let counted = alignment.countable(&in_step);
        merge_max(&mut self.counted, &counted);
        let mut moves = false;
        for (partition, w) in watermarks.filter(|(_, w)| w.scope() == WatermarkScope::Query) {
            if alignment.is_catching_up(partition) {
                let own = alignment.countable(&[partition]);
                observe_progress(w, &own, inputs, processing_time);
            } else {
                observe_progress(w, &counted, inputs, processing_time);
            }
            moves |= w
                .candidate(processing_time)
                .is_some_and(|c| c > w.in_effect());
        }
        alignment.prune(running);
        moves
    }

    /// After a batch committed: notes this instance's committed `progress`
    /// and how far each `running` task read (`caught_up`: the partitions
    /// the source's plan reads to their end); returns the progress to
    /// publish to the exchange.
    pub(in crate::runtime) fn share_committed(
        &mut self,
        running: &[i32],
        progress: &BTreeMap<String, TimestampMicros>,
        caught_up: &BTreeSet<i32>,
        as_of_ms: Option<i64>,
    ) -> BTreeMap<String, PartitionProgress> {
        merge_max(&mut self.counted, progress);
        match self.alignment.as_mut() {
            Some(alignment) => {
                alignment.batch_committed(running, caught_up, as_of_ms);
                alignment.progress_to_publish(progress)
            }
            None => BTreeMap::new(),
        }
    }
}

/// Keeps in `into` the larger time of each input partition of `from`.
fn merge_max(
    into: &mut BTreeMap<String, TimestampMicros>,
    from: &BTreeMap<String, TimestampMicros>,
) {
    for (input, t) in from {
        let slot = into.entry(input.clone()).or_insert(*t);
        *slot = (*slot).max(*t);
    }
}

/// Counts `progress` (`topic/partition` → largest event time) in `w`,
/// each partition under its input's stream and delay.
fn observe_progress(
    w: &mut WatermarkTracker,
    progress: &BTreeMap<String, TimestampMicros>,
    inputs: &Inputs,
    processing_time: TimestampMicros,
) {
    for (name, t) in progress {
        let topic = name
            .rsplit_once('/')
            .map_or(name.as_str(), |(topic, _)| topic);
        let input = inputs.get(inputs.input_of(topic));
        if input.watermarked {
            w.observe_stream(
                name,
                input.stream.as_deref(),
                input.delay,
                *t,
                processing_time,
            );
        }
    }
}
