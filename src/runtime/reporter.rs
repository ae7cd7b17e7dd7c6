//! Progress: what a batch did, gathered while it runs, and the
//! `StreamingQueryProgress`-shaped report made of it once it commits,
//! handed to the query's listeners and metrics.

use super::routed::{EventTimeStats, RoutedBatch};
use super::task_manager::{Backend, BatchEnd, TaskManager};
use super::{Sink, Source, SourceOffsets};
use crate::progress::{
    ProgressListener, QueryProgress, SinkProgress, SourceProgress, StateOperatorProgress,
};
use crate::record::Record;
use crate::time::{format_rfc3339, TimestampMicros};
use std::collections::BTreeMap;
use std::time::Instant;

/// What a batch did so far: one poll in micro-batch mode, every poll
/// since the last checkpoint in real-time mode.
pub(super) struct OpenBatch {
    pub(super) trigger_start: Instant,
    start_offsets: SourceOffsets,
    get_batch_ms: u64,
    add_batch_ms: u64,
    pub(super) num_input: u64,
    pub(super) num_output: u64,
    pub(super) bad_records: u64,
    event_times: EventTimeStats,
    /// The largest event time per input partition, for the sink's record.
    pub(super) event_time_progress: BTreeMap<String, TimestampMicros>,
    watermark_used: Option<TimestampMicros>,
    /// Joins: each stream's watermark (before the policy combines them).
    stream_watermarks: BTreeMap<String, TimestampMicros>,
    /// Real-time mode: milliseconds from each record's timestamp to its
    /// output handed to the sink.
    latency_ms: Option<hdrhistogram::Histogram<u64>>,
    /// The Kafka timestamps of the records read: the oldest, the newest,
    /// their sum and count (for the end-to-end latency at commit).
    record_times: RecordTimes,
}

/// The Kafka timestamps (milliseconds) of a batch's records, summed up.
#[derive(Debug, Default, Clone, Copy)]
struct RecordTimes {
    oldest: i64,
    newest: i64,
    sum: i128,
    count: u64,
}

impl RecordTimes {
    fn observe(&mut self, t: i64) {
        if self.count == 0 {
            (self.oldest, self.newest) = (t, t);
        } else {
            self.oldest = self.oldest.min(t);
            self.newest = self.newest.max(t);
        }
        self.sum += i128::from(t);
        self.count += 1;
    }

    /// Seconds from the records' timestamps to `now_ms`, as (min, avg,
    /// max): Kafka Streams' `record-e2e-latency-min/avg/max`. A timestamp
    /// ahead of this machine's clock counts as 0.
    fn latency_seconds(&self, now_ms: i64) -> Option<[f64; 3]> {
        if self.count == 0 {
            return None;
        }
        let seconds = |ms: i128| (ms.max(0) as f64) / 1000.0;
        let avg = self.sum / i128::from(self.count);
        let now = i128::from(now_ms);
        Some([
            seconds(now - i128::from(self.newest)),
            seconds(now - avg),
            seconds(now - i128::from(self.oldest)),
        ])
    }
}

/// One poll's share of a batch, added to its [`OpenBatch`].
pub(super) struct PollOutcome<'a> {
    pub(super) get_batch_ms: u64,
    pub(super) add_batch_ms: u64,
    pub(super) routed: &'a RoutedBatch,
    pub(super) end: &'a BatchEnd,
    pub(super) event_time_progress: BTreeMap<String, TimestampMicros>,
}

impl OpenBatch {
    /// A batch starting now from the source's `start_offsets`.
    pub(super) fn new(start_offsets: SourceOffsets, real_time: bool) -> Self {
        OpenBatch {
            trigger_start: Instant::now(),
            start_offsets,
            get_batch_ms: 0,
            add_batch_ms: 0,
            num_input: 0,
            num_output: 0,
            bad_records: 0,
            event_times: EventTimeStats::default(),
            event_time_progress: BTreeMap::new(),
            watermark_used: None,
            stream_watermarks: BTreeMap::new(),
            latency_ms: real_time
                .then(|| hdrhistogram::Histogram::new_with_bounds(1, 3_600_000, 3).ok())
                .flatten(),
            record_times: RecordTimes::default(),
        }
    }

    /// Adds one poll's work.
    pub(super) fn add(&mut self, poll: PollOutcome<'_>) {
        self.get_batch_ms += poll.get_batch_ms;
        self.add_batch_ms += poll.add_batch_ms;
        self.num_input += poll.routed.num_input;
        self.num_output += poll.routed.output().num_rows() as u64;
        self.bad_records += poll.routed.bad_records;
        self.event_times.merge(&poll.routed.event_times);
        for (input, t) in poll.event_time_progress {
            let slot = self.event_time_progress.entry(input).or_insert(t);
            *slot = (*slot).max(t);
        }
        if poll.end.watermark_used.is_some() {
            self.watermark_used = poll.end.watermark_used;
        }
        if !poll.end.stream_watermarks.is_empty() {
            self.stream_watermarks = poll.end.stream_watermarks.clone();
        }
    }

    /// Notes the Kafka timestamps of `records`, whose output was just
    /// handed to the sink (for the end-to-end latency at commit); in
    /// real-time mode, records their latency to now as well.
    pub(super) fn record_latency(&mut self, records: &[Record]) {
        for t in records.iter().filter_map(|r| r.timestamp_ms) {
            self.record_times.observe(t);
        }
        let Some(h) = self.latency_ms.as_mut() else {
            return;
        };
        let now_ms = crate::time::now_micros() / 1000;
        for t in records.iter().filter_map(|r| r.timestamp_ms) {
            let _ = h.record((now_ms - t).max(0) as u64);
        }
    }

    fn latency_summary(&self) -> BTreeMap<String, u64> {
        let Some(h) = self.latency_ms.as_ref().filter(|h| !h.is_empty()) else {
            return BTreeMap::new();
        };
        [
            ("p50", h.value_at_quantile(0.5)),
            ("p99", h.value_at_quantile(0.99)),
            ("p99.9", h.value_at_quantile(0.999)),
            ("max", h.max()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn event_time_stats(&self) -> BTreeMap<String, String> {
        let mut stats = BTreeMap::new();
        let e = &self.event_times;
        if e.count > 0 {
            stats.insert("min".into(), format_rfc3339(e.min));
            stats.insert("max".into(), format_rfc3339(e.max));
            let avg = (e.sum / e.count as i128) as i64;
            stats.insert("avg".into(), format_rfc3339(avg));
        }
        if let Some(w) = self.watermark_used {
            stats.insert("watermark".into(), format_rfc3339(w));
        }
        stats
    }
}

/// The state operators' reports of a batch, one per operator summed over
/// tasks, the backend's restore figures on the first. Read before the
/// commit: committing resets what operators count per batch.
pub(super) fn state_progress(
    tasks: &mut TaskManager,
    backend: &mut Backend,
) -> Vec<StateOperatorProgress> {
    let mut reports = Vec::new();
    for task in tasks.tasks_mut().values_mut() {
        reports.extend(
            task.operators
                .iter_mut()
                .filter_map(|op| op.state_progress()),
        );
    }
    let mut merged = merge_state_progress(reports);
    if let (Some(backend), Some(first)) = (backend.as_mut(), merged.first_mut()) {
        let restore = backend.take_restore_stats();
        if restore != super::RestoreStats::default() {
            first
                .custom_metrics
                .insert("numRestoredRecords".into(), restore.records);
            first
                .custom_metrics
                .insert("restoreDurationMs".into(), restore.millis);
        }
    }
    merged
}

/// Sums the per-task reports of the same operator into one entry, as Spark
/// sums its per-partition state store metrics.
fn merge_state_progress(reports: Vec<StateOperatorProgress>) -> Vec<StateOperatorProgress> {
    let mut merged: Vec<StateOperatorProgress> = Vec::new();
    for r in reports {
        match merged
            .iter_mut()
            .find(|m| m.operator_name == r.operator_name)
        {
            Some(m) => {
                m.num_rows_total += r.num_rows_total;
                m.num_rows_updated += r.num_rows_updated;
                m.num_rows_removed += r.num_rows_removed;
                m.num_rows_dropped_by_watermark += r.num_rows_dropped_by_watermark;
                m.memory_used_bytes += r.memory_used_bytes;
                for (k, v) in r.custom_metrics {
                    *m.custom_metrics.entry(k).or_default() += v;
                }
            }
            None => merged.push(r),
        }
    }
    merged
}

/// Makes each committed batch's progress report and hands it on.
pub(super) struct ProgressReporter {
    pub(super) id: String,
    pub(super) run_id: String,
    pub(super) name: String,
    pub(super) listeners: Vec<Box<dyn ProgressListener>>,
    previous_trigger_start: Option<Instant>,
}

/// What a committed batch is reported with besides its [`OpenBatch`].
pub(super) struct CommittedBatch {
    pub(super) batch_id: u64,
    pub(super) commit_ms: u64,
    pub(super) state_operators: Vec<StateOperatorProgress>,
}

impl ProgressReporter {
    /// A reporter for the query `id`, run `run_id`, named `name`.
    pub(super) fn new(
        id: String,
        run_id: String,
        name: String,
        listeners: Vec<Box<dyn ProgressListener>>,
    ) -> Self {
        ProgressReporter {
            id,
            run_id,
            name,
            listeners,
            previous_trigger_start: None,
        }
    }

    /// Reports `open` as committed: metrics, a debug log line, listeners.
    pub(super) fn report(
        &mut self,
        open: &OpenBatch,
        committed: CommittedBatch,
        source: &dyn Source,
        sink: &dyn Sink,
    ) {
        let progress = self.progress(open, committed, source, sink);
        progress.record_metrics();
        let now_ms = crate::time::now_micros() / 1000;
        if let Some(latency) = open.record_times.latency_seconds(now_ms) {
            for (stat, seconds) in ["min", "avg", "max"].into_iter().zip(latency) {
                let labels = [("query", self.name.clone()), ("stat", stat.to_string())];
                metrics::gauge!("tidemark_end_to_end_latency_seconds", &labels).set(seconds);
            }
        }
        tracing::debug!(progress = %progress.json(), "batch done");
        for listener in self.listeners.iter_mut() {
            listener.on_progress(&progress);
        }
    }

    fn progress(
        &mut self,
        open: &OpenBatch,
        committed: CommittedBatch,
        source: &dyn Source,
        sink: &dyn Sink,
    ) -> QueryProgress {
        let trigger_ms = open.trigger_start.elapsed().as_millis() as u64;
        let since_previous = self
            .previous_trigger_start
            .map(|p| open.trigger_start.duration_since(p).as_secs_f64())
            .unwrap_or(0.0);
        self.previous_trigger_start = Some(open.trigger_start);
        let num_input = open.num_input;
        let input_rate = if since_previous > 0.0 {
            num_input as f64 / since_previous
        } else {
            0.0
        };
        let processed_rate = num_input as f64 * 1000.0 / trigger_ms.max(1) as f64;
        let mut source_metrics = BTreeMap::new();
        if let Some(lag) = source.lag() {
            source_metrics.insert("offsetsBehindLatest".into(), lag.to_string());
        }
        let asked = Instant::now();
        let latest_offset = source.latest_offsets().to_json();
        let latest_offset_ms = asked.elapsed().as_millis() as u64;
        QueryProgress {
            id: self.id.clone(),
            run_id: self.run_id.clone(),
            name: self.name.clone(),
            timestamp: format_rfc3339(crate::time::now_micros() / 1000 * 1000),
            batch_id: committed.batch_id,
            num_input_rows: num_input,
            input_rows_per_second: input_rate,
            processed_rows_per_second: processed_rate,
            batch_duration: trigger_ms,
            duration_ms: [
                ("triggerExecution".to_string(), trigger_ms),
                ("latestOffset".to_string(), latest_offset_ms),
                ("getBatch".to_string(), open.get_batch_ms),
                ("addBatch".to_string(), open.add_batch_ms),
                ("commitOffsets".to_string(), committed.commit_ms),
                ("walCommit".to_string(), 0),
                ("queryPlanning".to_string(), 0),
            ]
            .into_iter()
            .collect(),
            event_time: open.event_time_stats(),
            state_operators: committed.state_operators,
            sources: vec![SourceProgress {
                description: source.describe(),
                start_offset: open.start_offsets.to_json(),
                end_offset: source.offsets().to_json(),
                latest_offset,
                num_input_rows: num_input,
                input_rows_per_second: input_rate,
                processed_rows_per_second: processed_rate,
                num_bad_records: open.bad_records,
                metrics: source_metrics,
            }],
            sink: SinkProgress {
                description: sink.describe(),
                num_output_rows: open.num_output,
            },
            latency_ms: open.latency_summary(),
            stream_watermarks: open
                .stream_watermarks
                .iter()
                .map(|(k, v)| (k.clone(), format_rfc3339(*v)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RecordTimes;

    #[test]
    fn end_to_end_latency_is_min_avg_max_from_the_records_timestamps() {
        let mut times = RecordTimes::default();
        assert_eq!(times.latency_seconds(10_000), None, "no record, no latency");
        for t in [7_000, 9_000, 8_000, 11_000] {
            times.observe(t);
        }
        // The newest (11 s) is ahead of now (10 s): 0, not negative.
        assert_eq!(times.latency_seconds(10_000), Some([0.0, 1.25, 3.0]));
    }
}
