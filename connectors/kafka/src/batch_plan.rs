//! A micro-batch planned by offsets, as Spark's Kafka source plans one: at
//! the batch's start every partition gets the offset it reads up to (the
//! end of its backlog then, or its share of `max_records_per_batch` by
//! backlog), the batch reads every partition up to it, and what lies past
//! waits for the next batch. Partitions then advance together batch by
//! batch, which Spark's query-wide watermark relies on: a batch of one
//! partition's records would move the watermark past the others' unread
//! rows and make them late.

use std::collections::HashSet;
use std::hash::Hash;

/// A map keyed by topic partition, hashed fast.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// One batch's planned end offsets (exclusive) and the partitions that
/// have not reached theirs yet.
#[derive(Debug)]
pub(crate) struct BatchPlan<K> {
    ends: HashMap<K, i64>,
    unreached: HashSet<K, foldhash::fast::RandomState>,
}

impl<K: Clone + Eq + Hash> BatchPlan<K> {
    /// Plans from each partition's next offset (`starts`) and its latest
    /// one, at most about `limit` records over all (see [`rate_limit`]).
    /// `None` when no partition has anything to read.
    pub(crate) fn new(
        limit: usize,
        starts: &HashMap<K, i64>,
        latest: &HashMap<K, i64>,
    ) -> Option<Self> {
        let ends = rate_limit(limit, starts, latest);
        let unreached: HashSet<K, _> = ends
            .iter()
            .filter(|(tp, end)| starts.get(*tp).is_some_and(|start| start < end))
            .map(|(tp, _)| tp.clone())
            .collect();
        (!unreached.is_empty()).then_some(BatchPlan { ends, unreached })
    }

    /// Whether the record at `offset` of `partition` belongs to this batch.
    /// A partition the plan does not know (assigned since) waits for the
    /// next plan.
    pub(crate) fn admits(&self, partition: &K, offset: i64) -> bool {
        self.ends.get(partition).is_some_and(|end| offset < *end)
    }

    /// Notes that `partition` was read up to `next` (exclusive): it has
    /// reached its end when `next` is there.
    pub(crate) fn advance(&mut self, partition: &K, next: i64) {
        if self.ends.get(partition).is_some_and(|end| next >= *end) {
            self.unreached.remove(partition);
        }
    }

    /// Marks `partition` as reached whatever its offset (a record past its
    /// end arrived: the offsets between were compacted away or were
    /// transaction markers).
    pub(crate) fn reached(&mut self, partition: &K) {
        self.unreached.remove(partition);
    }

    /// Forgets a partition taken away from this member.
    pub(crate) fn forget(&mut self, partition: &K) {
        self.ends.remove(partition);
        self.unreached.remove(partition);
    }

    /// The partitions whose planned end falls short of their `latest`
    /// offset: the limit cut their backlog.
    pub(crate) fn cut_short<'a>(
        &'a self,
        latest: &'a HashMap<K, i64>,
    ) -> impl Iterator<Item = &'a K> {
        self.ends
            .iter()
            .filter(|(tp, end)| latest.get(*tp).is_some_and(|l| *end < l))
            .map(|(tp, _)| tp)
    }

    /// Whether every partition reached its planned end.
    pub(crate) fn complete(&self) -> bool {
        self.unreached.is_empty()
    }

    /// The partitions still short of their end, with that end.
    pub(crate) fn unreached(&self) -> impl Iterator<Item = (&K, i64)> {
        self.unreached
            .iter()
            .filter_map(|tp| self.ends.get(tp).map(|end| (tp, *end)))
    }
}

/// Spark's `KafkaMicroBatchStream.rateLimit`: shares `limit` records among
/// the partitions with a backlog (`latest - start > 0`) in proportion to
/// it, rounding a share down — or up when below one, so that a small
/// partition is never starved (several such partitions can then take the
/// batch past `limit`) — and never past `latest`. A partition without a
/// start, or without a backlog, keeps its latest offset.
pub(crate) fn rate_limit<K: Clone + Eq + Hash>(
    limit: usize,
    starts: &HashMap<K, i64>,
    latest: &HashMap<K, i64>,
) -> HashMap<K, i64> {
    let sizes: HashMap<K, i64> = latest
        .iter()
        .filter_map(|(tp, end)| {
            let size = end - starts.get(tp)?;
            (size > 0).then(|| (tp.clone(), size))
        })
        .collect();
    let total = sizes.values().sum::<i64>() as f64;
    if total < 1.0 {
        return latest.clone();
    }
    latest
        .iter()
        .map(|(tp, end)| {
            let planned = match (sizes.get(tp), starts.get(tp)) {
                (Some(size), Some(begin)) => {
                    let prorate = limit as f64 * (*size as f64 / total);
                    let share = if prorate < 1.0 {
                        prorate.ceil()
                    } else {
                        prorate.floor()
                    } as i64;
                    (*end).min(begin.saturating_add(share))
                }
                _ => *end,
            };
            (tp.clone(), planned)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(i32, i64)]) -> HashMap<i32, i64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn the_limit_is_shared_by_backlog_as_spark_shares_it() {
        // Backlogs 300, 100, 0 and 600 (total 1000), limit 100.
        let starts = map(&[(0, 0), (1, 50), (2, 10), (3, 0)]);
        let latest = map(&[(0, 300), (1, 150), (2, 10), (3, 600)]);
        let ends = rate_limit(100, &starts, &latest);
        assert_eq!(ends, map(&[(0, 30), (1, 60), (2, 10), (3, 60)]));
    }

    #[test]
    fn a_share_below_one_rounds_up_and_may_pass_the_limit() {
        // Spark: twenty partitions of three records under a limit of five
        // read one record each.
        let starts: HashMap<i32, i64> = (0..20).map(|p| (p, 0)).collect();
        let latest: HashMap<i32, i64> = (0..20).map(|p| (p, 3)).collect();
        let ends = rate_limit(5, &starts, &latest);
        let plan = BatchPlan::new(5, &starts, &latest).unwrap();
        let mut short: Vec<i32> = plan.cut_short(&latest).copied().collect();
        short.sort();
        assert_eq!(short, (0..20).collect::<Vec<_>>(), "each reads 1 of its 3");
        assert!(ends.values().all(|end| *end == 1), "{ends:?}");
    }

    #[test]
    fn a_small_backlog_is_read_whole_and_never_past_its_end() {
        let starts = map(&[(0, 5), (1, 7)]);
        let latest = map(&[(0, 8), (1, 9)]);
        assert_eq!(rate_limit(1000, &starts, &latest), latest);
        // A partition whose start is unknown keeps its latest offset.
        let ends = rate_limit(1, &map(&[(0, 0)]), &map(&[(0, 10), (1, 4)]));
        assert_eq!(ends, map(&[(0, 1), (1, 4)]));
    }

    #[test]
    fn a_plan_is_complete_once_every_partition_reached_its_end() {
        let starts = map(&[(0, 0), (1, 0), (2, 4)]);
        let latest = map(&[(0, 2), (1, 3), (2, 4)]);
        let mut plan = BatchPlan::new(100, &starts, &latest).expect("a backlog");
        assert!(plan.admits(&0, 1) && !plan.admits(&0, 2));
        assert!(!plan.admits(&2, 4), "no backlog: its next record waits");
        assert!(!plan.admits(&9, 0), "a partition assigned since waits");
        plan.advance(&0, 2);
        assert!(!plan.complete());
        assert_eq!(plan.unreached().collect::<Vec<_>>(), vec![(&1, 3)]);
        plan.reached(&1);
        assert!(plan.complete());
        assert!(BatchPlan::new(100, &latest, &latest).is_none());
    }
}
