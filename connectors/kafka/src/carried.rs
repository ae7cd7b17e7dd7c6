//! Records polled past a planned batch's end, kept for the next batch.
//!
//! A partition that reaches its planned end before the others keeps being
//! fetched: librdkafka prefetches ahead of the application. Pausing it
//! there would drop its prefetched records, which the next batch would
//! fetch again (a third of the window pipeline's throughput on a backlog,
//! measured). Keeping them here instead costs nothing more than handing
//! them out would (they are copied out of librdkafka's buffers either
//! way); the source pauses a partition only once this holds a batch's
//! worth of records.

use std::collections::VecDeque;
use std::hash::Hash;
use tidemark::record::Record;

/// A map keyed by topic partition, hashed fast.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Per partition, the records read past the plan, in offset order.
#[derive(Debug)]
pub(crate) struct CarriedRecords<K> {
    by_partition: HashMap<K, VecDeque<Record>>,
    len: usize,
}

impl<K> Default for CarriedRecords<K> {
    fn default() -> Self {
        CarriedRecords {
            by_partition: HashMap::default(),
            len: 0,
        }
    }
}

impl<K: Clone + Eq + Hash> CarriedRecords<K> {
    /// How many records are kept, over all partitions.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether no record is kept.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether records of `partition` are kept: a newer record of it must
    /// then be kept behind them, whatever the plan says, to stay in order.
    pub(crate) fn holds(&self, partition: &K) -> bool {
        // Asked per record polled: no hash lookup while nothing is kept.
        self.len > 0
            && self
                .by_partition
                .get(partition)
                .is_some_and(|queue| !queue.is_empty())
    }

    /// Keeps `record` of `partition`, after those kept before it.
    pub(crate) fn push(&mut self, partition: K, record: Record) {
        self.by_partition
            .entry(partition)
            .or_default()
            .push_back(record);
        self.len += 1;
    }

    /// The offset of the first record kept for `partition`: where it is
    /// read again from once the kept records are dropped.
    pub(crate) fn first_offset(&self, partition: &K) -> Option<i64> {
        self.by_partition
            .get(partition)?
            .front()
            .map(|r| r.position.offset)
    }

    /// Drops what is kept for `partition` (taken away, held or rewound).
    pub(crate) fn forget(&mut self, partition: &K) {
        if let Some(queue) = self.by_partition.remove(partition) {
            self.len -= queue.len();
        }
    }

    /// Drops everything kept.
    pub(crate) fn clear(&mut self) {
        self.by_partition.clear();
        self.len = 0;
    }

    /// Takes, partition by partition and in offset order, the records
    /// `admits` accepts, stopping at a partition's first refused record
    /// (it and those after it stay for a later batch). Returns the records
    /// taken, each with its partition, and the partitions where a record
    /// was refused.
    pub(crate) fn take_admitted(
        &mut self,
        mut admits: impl FnMut(&K, i64) -> bool,
    ) -> (Vec<(K, Record)>, Vec<K>) {
        let mut taken = Vec::new();
        let mut stopped = Vec::new();
        for (partition, queue) in &mut self.by_partition {
            while let Some(record) = queue.front() {
                if !admits(partition, record.position.offset) {
                    stopped.push(partition.clone());
                    break;
                }
                if let Some(record) = queue.pop_front() {
                    taken.push((partition.clone(), record));
                }
            }
        }
        self.len -= taken.len();
        self.by_partition.retain(|_, queue| !queue.is_empty());
        (taken, stopped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark::record::SourcePosition;

    fn record(partition: i32, offset: i64) -> Record {
        Record {
            position: SourcePosition::new(std::sync::Arc::from("t"), partition, offset),
            ..Record::default()
        }
    }

    #[test]
    fn takes_each_partition_in_order_up_to_its_first_refused_record() {
        let mut carried = CarriedRecords::default();
        for offset in 10..15 {
            carried.push(0, record(0, offset));
        }
        for offset in 3..5 {
            carried.push(1, record(1, offset));
        }
        assert_eq!(carried.len(), 7);
        assert!(carried.holds(&0) && carried.holds(&1) && !carried.holds(&2));

        let (taken, stopped) = carried.take_admitted(|p, o| *p == 1 || o < 12);
        let mut offsets: Vec<(i32, i64)> =
            taken.iter().map(|(p, r)| (*p, r.position.offset)).collect();
        offsets.sort_unstable();
        assert_eq!(offsets, [(0, 10), (0, 11), (1, 3), (1, 4)]);
        assert_eq!(stopped, [0]);
        assert_eq!(carried.len(), 3);
        assert_eq!(carried.first_offset(&0), Some(12));
        assert!(!carried.holds(&1));
    }

    #[test]
    fn forgetting_a_partition_drops_only_its_records() {
        let mut carried = CarriedRecords::default();
        carried.push(0, record(0, 1));
        carried.push(0, record(0, 2));
        carried.push(1, record(1, 7));
        carried.forget(&0);
        assert_eq!(carried.len(), 1);
        assert_eq!(carried.first_offset(&0), None);
        assert_eq!(carried.first_offset(&1), Some(7));
        carried.clear();
        assert!(carried.is_empty());
    }
}
