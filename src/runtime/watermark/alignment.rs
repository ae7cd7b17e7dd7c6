//! Keeps what the other instances publish to the watermark exchange in step
//! with what this instance has read, in ingestion time.
//!
//! Spark has one driver planning every partition's batch: a row is judged
//! against the event times of rows that arrived before it, whichever
//! partition they are in. Each tidemark instance plans only its own
//! partitions, so after downtime (or a burst) the instance that reads its
//! backlog faster would publish event times far ahead of the rows the
//! slower one has not read yet, and those rows would be dropped as late —
//! rows Spark counts. So each published progress carries how far its
//! partition was read in record timestamps (`read_until_ms`), and an
//! instance counts another partition's progress only once its own
//! partitions are read as far: the watermark its rows meet is made of rows
//! that arrived before them, as in Spark.
//!
//! The same holds inside one instance when a partition is handed over to
//! tasks that are already running (a rebalance after another instance
//! failed): its backlog arrived alongside rows the running tasks read long
//! ago. Such a task is *catching up*: it starts from its partition's
//! checkpoint (the watermark its last owner committed), not from the
//! running tasks' watermark, and counts the other partitions' progress
//! (this instance's too, as published to the exchange) only as far as it
//! has read itself, until a batch reads its backlog to the end. Tasks
//! started together (at start, after a restart) read their partitions in
//! step, batch by batch, as Spark does: they count each other's progress at
//! once; so does a task whose partition has no checkpoint (silent until
//! now: its rows arrive now).
//!
//! The real-time trigger does not plan its polls, so no partition is ever
//! known caught up: there everything published counts at once, as before
//! this alignment.
//!
//! A partition of this instance is *caught up* when the source's plan
//! reads it to its latest offset and a batch (or a poll) then read nothing
//! of it: it holds no row that arrived before the plan asked for the
//! latest offsets, so it counts what was published of rows read before
//! that moment, and a silent partition holds the watermark back by no
//! more than a trigger (as in Spark, it never stops it). Progress of rows
//! that arrived later waits for the next plan: a burst written to every
//! partition at once is counted only once this partition's share of it
//! is read. A task that has not committed a batch yet (just assigned, or
//! after a restart) has read nothing: it counts nothing published until
//! its first batch ends.

use super::exchange::PartitionProgress;
use crate::record::Record;
use crate::runtime::Source;
use crate::time::TimestampMicros;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// How many not-yet-counted reports are kept per partition; past that every
/// other one is dropped, which only counts a partition's progress later
/// (the watermark moves later, no row is dropped for it).
const WAITING_PER_PARTITION: usize = 1024;

/// How far one of this instance's task partitions is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadFrontier {
    /// Up to this record timestamp (ms), with more to read after it.
    ReadUntil(i64),
    /// Nothing left to read at its last batch, of what was appended
    /// before this wall-clock time (ms; `None`: not known, taken as now).
    CaughtUp(Option<i64>),
}

/// The exchange's progress gated by this instance's reading (see the
/// module's documentation), and the largest progress seen per partition.
#[derive(Debug, Default)]
pub(in crate::runtime) struct ExchangeAlignment {
    /// This instance's task partitions that committed a batch.
    own: BTreeMap<i32, ReadFrontier>,
    /// Tasks that joined running ones and have not read their backlog to
    /// its end yet.
    catching_up: BTreeSet<i32>,
    /// Counts everything published at once (the real-time trigger, which
    /// does not plan batches: no partition is ever known caught up).
    ungated: bool,
    /// The open batch's largest record timestamp per task partition.
    batch_reads: BTreeMap<i32, i64>,
    /// The largest record timestamp read per input partition
    /// (`topic/partition`), published with its progress.
    read_until: BTreeMap<String, i64>,
    /// Other instances' reports not counted yet, per input partition, in
    /// the order published.
    waiting: BTreeMap<String, Vec<PartitionProgress>>,
    /// The largest progress known per input partition, counted or not: a
    /// partition's published progress never goes back (the compacted
    /// exchange keeps one record a partition).
    largest: BTreeMap<String, PartitionProgress>,
}

impl ExchangeAlignment {
    /// An alignment that counts everything published at once: for the
    /// real-time trigger, whose polls are not planned.
    pub(in crate::runtime) fn ungated() -> Self {
        ExchangeAlignment {
            ungated: true,
            ..Default::default()
        }
    }

    /// Notes the record timestamps of one poll's `records`; a timestamp
    /// ahead of the wall clock counts as now (a producer's clock ahead
    /// must not make a partition look read far ahead).
    pub(in crate::runtime) fn note_read(&mut self, records: &[Record], source: &dyn Source) {
        let now_ms = crate::time::now_micros() / 1_000;
        // Records come in runs per partition: the maps are touched once a
        // run, not once a record.
        let mut run: Option<(&Arc<str>, i32, i64)> = None;
        for record in records {
            let Some(ms) = record.timestamp_ms.map(|ms| ms.min(now_ms)) else {
                continue;
            };
            let position = &record.position;
            match run.as_mut() {
                Some((topic, partition, newest))
                    if *partition == position.partition && Arc::ptr_eq(topic, &position.topic) =>
                {
                    *newest = (*newest).max(ms);
                }
                _ => {
                    if let Some((topic, partition, newest)) = run.take() {
                        self.note_run(topic, partition, newest, source);
                    }
                    run = Some((&position.topic, position.partition, ms));
                }
            }
        }
        if let Some((topic, partition, newest)) = run {
            self.note_run(topic, partition, newest, source);
        }
    }

    /// Notes a run of records of `topic`'s `partition`, the newest stamped
    /// `ms`.
    fn note_run(&mut self, topic: &str, partition: i32, ms: i64, source: &dyn Source) {
        self.note_task_read(partition, ms);
        let input = source.watermark_input(topic, partition);
        let slot = self.read_until.entry(input).or_insert(ms);
        *slot = (*slot).max(ms);
    }

    /// Notes a record of task partition `partition` stamped `ms`.
    fn note_task_read(&mut self, partition: i32, ms: i64) {
        let slot = self.batch_reads.entry(partition).or_insert(ms);
        *slot = (*slot).max(ms);
    }

    /// After a batch committed: each of `tasks` (this instance's task
    /// partitions) is read up to what the batch read of it, or caught up
    /// when it read nothing and is in `caught_up` (partitions whose plan,
    /// asked at `as_of_ms`, reads them to their latest offset). A task
    /// catching up is in step once its plan reads it to the end.
    pub(in crate::runtime) fn batch_committed(
        &mut self,
        tasks: &[i32],
        caught_up: &BTreeSet<i32>,
        as_of_ms: Option<i64>,
    ) {
        let reads = std::mem::take(&mut self.batch_reads);
        self.own.retain(|p, _| tasks.contains(p));
        self.catching_up
            .retain(|p| tasks.contains(p) && !caught_up.contains(p));
        for partition in tasks {
            let frontier = match (reads.get(partition), self.own.get(partition)) {
                (Some(ms), Some(ReadFrontier::ReadUntil(earlier))) => {
                    ReadFrontier::ReadUntil((*ms).max(*earlier))
                }
                (Some(ms), _) => ReadFrontier::ReadUntil(*ms),
                (None, _) if caught_up.contains(partition) => ReadFrontier::CaughtUp(as_of_ms),
                (None, _) => continue,
            };
            self.own.insert(*partition, frontier);
        }
    }

    /// After a poll that read nothing: each of `tasks` in `caught_up` with
    /// nothing read since its last batch had nothing waiting at `as_of_ms`
    /// (when its plan asked for the latest offsets).
    pub(in crate::runtime) fn nothing_read(
        &mut self,
        tasks: &[i32],
        caught_up: &BTreeSet<i32>,
        as_of_ms: Option<i64>,
    ) {
        for partition in tasks {
            if caught_up.contains(partition) && !self.batch_reads.contains_key(partition) {
                self.own
                    .insert(*partition, ReadFrontier::CaughtUp(as_of_ms));
            }
        }
    }

    /// Forgets the open batch's reads (it aborted and is read again).
    pub(in crate::runtime) fn batch_aborted(&mut self) {
        self.batch_reads.clear();
    }

    /// Notes that the task of `partition` started: it is catching up (see
    /// the module's documentation) when it `joins_running` tasks and was
    /// `handed_over` with a checkpoint (its last owner committed it, here
    /// or on another instance) — not a partition silent until now, whose
    /// rows are in step with the running tasks' — or when it was catching
    /// up already (its task rebuilt after an aborted batch; a revoked
    /// partition is forgotten at the next commit). Returns whether it is.
    pub(in crate::runtime) fn task_started(
        &mut self,
        partition: i32,
        joins_running: bool,
        handed_over: bool,
    ) -> bool {
        self.own.remove(&partition);
        // Still catching up when its task is rebuilt after an aborted
        // batch (every task is, so it joins none running).
        let was_catching_up = self.catching_up.contains(&partition);
        if !self.ungated && (joins_running && handed_over || was_catching_up) {
            self.catching_up.insert(partition);
            true
        } else {
            self.catching_up.remove(&partition);
            false
        }
    }

    /// Whether the task of `partition` is catching up.
    pub(in crate::runtime) fn is_catching_up(&self, partition: i32) -> bool {
        self.catching_up.contains(&partition)
    }

    /// Takes the reports `collected` from the exchange.
    pub(in crate::runtime) fn offer(&mut self, collected: Vec<(String, PartitionProgress)>) {
        for (input, progress) in collected {
            let largest = self.largest.entry(input.clone()).or_insert(progress);
            *largest = largest.max_with(progress);
            let waiting = self.waiting.entry(input).or_default();
            waiting.push(progress);
            if waiting.len() > WAITING_PER_PARTITION {
                thin_out(waiting);
            }
        }
    }

    /// Per input partition, the largest published event time the tasks of
    /// `group` may count: of rows read before every one of them.
    pub(in crate::runtime) fn countable(&self, group: &[i32]) -> BTreeMap<String, TimestampMicros> {
        let Some(frontier) = self.frontier(group) else {
            return BTreeMap::new();
        };
        self.waiting
            .iter()
            .filter_map(|(input, reports)| {
                let t = reports
                    .iter()
                    .filter(|p| read_before(p, frontier))
                    .map(|p| p.max_event_time)
                    .max()?;
                Some((input.clone(), t))
            })
            .collect()
    }

    /// Forgets the reports every one of `tasks` has counted, keeping per
    /// input partition the newest of them (a task started later counts it
    /// once it has read as far).
    pub(in crate::runtime) fn prune(&mut self, tasks: &[i32]) {
        let frontiers: Option<Vec<i64>> = tasks.iter().map(|p| self.frontier(&[*p])).collect();
        let Some(frontier) = frontiers.and_then(|f| f.into_iter().min()) else {
            return;
        };
        for reports in self.waiting.values_mut() {
            let (counted, waiting): (Vec<_>, Vec<_>) =
                reports.drain(..).partition(|p| read_before(p, frontier));
            let newest = counted.into_iter().reduce(PartitionProgress::max_with);
            reports.extend(newest.into_iter().chain(waiting));
        }
    }

    /// How far every task partition here is read: the record timestamp up
    /// to which others' progress may be counted (`i64::MAX` when all are
    /// caught up as of an unknown time); `None` while a task has read
    /// nothing, or none runs.
    fn frontier(&self, tasks: &[i32]) -> Option<i64> {
        if self.ungated {
            return Some(i64::MAX);
        }
        if tasks.is_empty() {
            return None;
        }
        let mut frontier = i64::MAX;
        for partition in tasks {
            match self.own.get(partition)? {
                ReadFrontier::ReadUntil(ms) => frontier = frontier.min(*ms),
                // Rows appended after its plan may still come: progress
                // published after that may be of rows arrived after them.
                ReadFrontier::CaughtUp(Some(ms)) => frontier = frontier.min(*ms),
                ReadFrontier::CaughtUp(None) => {}
            }
        }
        Some(frontier)
    }

    /// This instance's committed `progress` (largest event time per input
    /// partition) to publish: each raised to the largest known for its
    /// partition, with how far it was read.
    pub(in crate::runtime) fn progress_to_publish(
        &mut self,
        progress: &BTreeMap<String, TimestampMicros>,
    ) -> BTreeMap<String, PartitionProgress> {
        let mut published = BTreeMap::new();
        for (input, t) in progress {
            let own = PartitionProgress {
                max_event_time: *t,
                read_until_ms: self.read_until.get(input).copied(),
            };
            let largest = self.largest.entry(input.clone()).or_insert(own);
            *largest = largest.max_with(own);
            published.insert(input.clone(), *largest);
        }
        published
    }
}

/// Whether the rows behind `report` were read before `frontier` (a report
/// of an earlier version, without its read position, counts at once).
fn read_before(report: &PartitionProgress, frontier: i64) -> bool {
    report.read_until_ms.is_none_or(|ms| ms < frontier)
}

/// Drops every other report, keeping the newest: a report dropped only
/// makes its partition's progress count later.
fn thin_out(waiting: &mut Vec<PartitionProgress>) {
    let newest = waiting.len() - 1;
    let mut index = 0;
    waiting.retain(|_| {
        let keep = index % 2 == 1 || index == newest;
        index += 1;
        keep
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(max_event_time: i64, read_until_ms: i64) -> PartitionProgress {
        PartitionProgress {
            max_event_time,
            read_until_ms: Some(read_until_ms),
        }
    }

    fn reads(alignment: &mut ExchangeAlignment, partition: i32, ms: i64) {
        alignment.note_task_read(partition, ms);
    }

    fn committed(alignment: &mut ExchangeAlignment, tasks: &[i32], caught_up: &[i32]) {
        alignment.batch_committed(tasks, &caught_up.iter().copied().collect(), None);
    }

    #[test]
    fn a_task_that_read_nothing_yet_counts_nothing_published() {
        let mut alignment = ExchangeAlignment::default();
        alignment.task_started(1, false, false);
        alignment.offer(vec![("t/0".into(), progress(500, 10))]);
        assert!(alignment.countable(&[1]).is_empty());
        // Its first batch reads up to 11: what was read up to 10 counts.
        reads(&mut alignment, 1, 11);
        committed(&mut alignment, &[1], &[]);
        assert_eq!(
            alignment.countable(&[1]),
            BTreeMap::from([("t/0".to_string(), 500)])
        );
        assert!(
            alignment.countable(&[]).is_empty(),
            "no task, nothing counted"
        );
    }

    #[test]
    fn a_backlog_counts_others_progress_only_as_far_as_it_has_read() {
        let mut alignment = ExchangeAlignment::default();
        reads(&mut alignment, 1, 100);
        committed(&mut alignment, &[1], &[]);
        alignment.offer(vec![
            ("t/0".to_string(), progress(1_000, 90)),
            ("t/0".to_string(), progress(2_000, 150)),
            ("t/0".to_string(), progress(3_000, 300)),
        ]);
        assert_eq!(alignment.countable(&[1])["t/0"], 1_000);
        reads(&mut alignment, 1, 200);
        committed(&mut alignment, &[1], &[]);
        assert_eq!(alignment.countable(&[1])["t/0"], 2_000);
        alignment.prune(&[1]);
        assert_eq!(
            alignment.waiting["t/0"].len(),
            2,
            "the counted reports merged"
        );
        // Caught up: the batch read nothing and its plan was not cut.
        committed(&mut alignment, &[1], &[1]);
        assert_eq!(alignment.countable(&[1])["t/0"], 3_000);
    }

    #[test]
    fn the_slowest_task_partition_sets_the_frontier_and_old_reports_count_at_once() {
        let mut alignment = ExchangeAlignment::default();
        reads(&mut alignment, 1, 100);
        reads(&mut alignment, 2, 50);
        committed(&mut alignment, &[1, 2], &[]);
        let earlier_version = PartitionProgress {
            max_event_time: 7,
            read_until_ms: None,
        };
        alignment.offer(vec![
            ("t/0".to_string(), progress(1_000, 80)),
            ("t/3".to_string(), earlier_version),
        ]);
        assert_eq!(
            alignment.countable(&[1, 2]),
            BTreeMap::from([("t/3".to_string(), 7)])
        );
        assert_eq!(alignment.countable(&[1])["t/0"], 1_000);
    }

    #[test]
    fn a_task_handed_over_to_running_ones_catches_up_until_its_backlog_is_read() {
        let mut alignment = ExchangeAlignment::default();
        assert!(
            !alignment.task_started(0, false, true),
            "started with the others"
        );
        reads(&mut alignment, 0, 100);
        committed(&mut alignment, &[0], &[0]);
        // A partition silent until now (no checkpoint) is in step, as
        // under Spark, whatever its records' timestamps.
        assert!(!alignment.task_started(2, true, false));
        // Handed over with its last owner's checkpoint: a backlog.
        assert!(alignment.task_started(1, true, true));
        assert!(alignment.task_started(3, true, true));
        assert!(alignment.is_catching_up(1) && !alignment.is_catching_up(0));
        reads(&mut alignment, 1, 40);
        committed(&mut alignment, &[0, 1, 2, 3], &[0, 2]);
        assert!(
            alignment.is_catching_up(1),
            "its plan was cut: more backlog"
        );
        committed(&mut alignment, &[0, 1, 2], &[0, 1, 2]);
        assert!(!alignment.is_catching_up(1), "read to the end: in step");
        assert!(!alignment.is_catching_up(3), "revoked");
    }

    #[test]
    fn a_task_rebuilt_after_an_abort_goes_on_catching_up() {
        let mut alignment = ExchangeAlignment::default();
        alignment.task_started(0, false, true);
        assert!(alignment.task_started(1, true, true));
        // The batch aborts: every task is rebuilt, none running.
        alignment.batch_aborted();
        assert!(!alignment.task_started(0, false, true));
        assert!(alignment.task_started(1, false, true), "still catching up");
    }

    #[test]
    fn without_planned_batches_everything_published_counts_at_once() {
        let mut alignment = ExchangeAlignment::ungated();
        assert!(!alignment.task_started(1, true, true));
        alignment.offer(vec![("t/0".to_string(), progress(1_000, 500))]);
        assert_eq!(alignment.countable(&[1])["t/0"], 1_000);
    }

    #[test]
    fn a_poll_with_nothing_waiting_catches_up_only_the_planned_partitions() {
        let mut alignment = ExchangeAlignment::default();
        reads(&mut alignment, 0, 100);
        reads(&mut alignment, 1, 100);
        committed(&mut alignment, &[0, 1], &[]);
        alignment.offer(vec![("t/5".to_string(), progress(1_000, 500))]);
        alignment.nothing_read(&[0, 1], &BTreeSet::from([0]), None);
        assert!(alignment.countable(&[0, 1]).is_empty(), "1 was not planned");
        alignment.nothing_read(&[0, 1], &BTreeSet::from([0, 1]), None);
        assert_eq!(alignment.countable(&[0, 1])["t/5"], 1_000);
    }

    /// An idle instance counts the others' progress only of rows read
    /// before its last plan asked for its partitions' latest offsets: a
    /// burst written to every partition at once (read by another instance
    /// first) waits for this instance's share of it to be planned.
    #[test]
    fn caught_up_counts_only_progress_read_before_the_plan() {
        let mut alignment = ExchangeAlignment::default();
        alignment.nothing_read(&[0], &BTreeSet::from([0]), Some(1_000));
        alignment.offer(vec![
            ("t/1".to_string(), progress(5_000, 900)),
            ("t/1".to_string(), progress(9_000, 1_200)),
        ]);
        assert_eq!(alignment.countable(&[0])["t/1"], 5_000, "the burst waits");
        // The next plan finds the burst in partition 0: read, then caught
        // up again as of a later plan.
        reads(&mut alignment, 0, 1_150);
        alignment.batch_committed(&[0], &BTreeSet::new(), Some(1_100));
        assert_eq!(alignment.countable(&[0])["t/1"], 5_000);
        alignment.batch_committed(&[0], &BTreeSet::from([0]), Some(1_300));
        assert_eq!(alignment.countable(&[0])["t/1"], 9_000);
    }

    #[test]
    fn published_progress_never_goes_back_and_carries_how_far_it_was_read() {
        let mut alignment = ExchangeAlignment::default();
        alignment.offer(vec![("t/0".into(), progress(900, 70))]);
        let record = Record {
            timestamp_ms: Some(40),
            position: crate::record::SourcePosition::new("t", 0, 5),
            ..Default::default()
        };
        alignment.note_read(&[record], &crate::runtime::testing::VecSource::default());
        let published = alignment.progress_to_publish(&BTreeMap::from([("t/0".to_string(), 500)]));
        assert_eq!(published["t/0"], progress(900, 70));
        let published = alignment.progress_to_publish(&BTreeMap::from([("t/1".to_string(), 500)]));
        assert_eq!(
            published["t/1"],
            PartitionProgress {
                max_event_time: 500,
                read_until_ms: None
            }
        );
    }

    #[test]
    fn thinning_keeps_the_newest_report() {
        let mut waiting: Vec<_> = (0..5).map(|i| progress(i, i)).collect();
        thin_out(&mut waiting);
        assert_eq!(
            waiting,
            vec![progress(1, 1), progress(3, 3), progress(4, 4)]
        );
    }
}
