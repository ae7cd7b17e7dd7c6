//! In-memory sources and sinks for tests: drive a query batch by batch
//! without Kafka, as Kafka Streams' `TopologyTestDriver` does.

use super::{BatchRequest, Sink, Source, SourceBatch, TaskCheckpoint};
use crate::error::Result;
use crate::record::{Record, SourcePosition};
use crate::row::Row;
use std::collections::VecDeque;

/// Hands out predefined batches, one per call; exhausted after the last.
#[derive(Debug, Default)]
pub struct VecSource {
    batches: VecDeque<Vec<Record>>,
    offset: i64,
    committed: i64,
    checkpoints: std::collections::BTreeMap<i32, TaskCheckpoint>,
    restore: Vec<(i32, TaskCheckpoint)>,
    /// Handed out since the last commit: a rewind hands them out again.
    uncommitted: Vec<Vec<Record>>,
    /// How many of the next commits abort the batch, as a fenced
    /// transaction does.
    commits_to_abort: usize,
    /// What [`Source::assigned_inputs`] reports.
    assigned: Vec<(String, i32)>,
}

impl VecSource {
    /// Batches of JSON lines, all on partition 0 of topic `input`.
    pub fn json_batches<S: AsRef<str>>(batches: Vec<Vec<S>>) -> Self {
        let mut offset = 0;
        let batches = batches
            .into_iter()
            .map(|lines| {
                lines
                    .into_iter()
                    .map(|line| {
                        let r = Record {
                            value: Some(line.as_ref().as_bytes().to_vec()),
                            position: SourcePosition::new("input", 0, offset),
                            ..Default::default()
                        };
                        offset += 1;
                        r
                    })
                    .collect()
            })
            .collect();
        VecSource {
            batches,
            ..Default::default()
        }
    }

    /// Batches of ready-made records (headers, keys, positions as given).
    pub fn record_batches(batches: Vec<Vec<Record>>) -> Self {
        VecSource {
            batches: batches.into(),
            ..Default::default()
        }
    }

    /// Hands `checkpoints` (partition, checkpoint) back with the first
    /// batch, as Kafka does after a restart; a partition may come with
    /// several, one per topic.
    pub fn restoring(
        mut self,
        checkpoints: impl IntoIterator<Item = (i32, TaskCheckpoint)>,
    ) -> Self {
        self.restore = checkpoints.into_iter().collect();
        self
    }

    /// Reports `inputs` (`(topic, partition)`) as this member's
    /// assignment, silent partitions too, as Kafka does.
    pub fn assigned<'t>(mut self, inputs: impl IntoIterator<Item = (&'t str, i32)>) -> Self {
        self.assigned = inputs
            .into_iter()
            .map(|(topic, partition)| (topic.to_string(), partition))
            .collect();
        self
    }

    /// Aborts the next `commits` commits (a rebalance fencing the
    /// transaction): the query rewinds and replays the batch.
    pub fn aborting_commits(mut self, commits: usize) -> Self {
        self.commits_to_abort = commits;
        self
    }

    /// The checkpoints stored with the last commit.
    pub fn checkpoints(&self) -> &std::collections::BTreeMap<i32, TaskCheckpoint> {
        &self.checkpoints
    }

    /// The offset committed so far.
    pub fn committed(&self) -> i64 {
        self.committed
    }
}

impl Source for VecSource {
    fn describe(&self) -> String {
        "VecSource".into()
    }
    fn next_batch(&mut self, _: &BatchRequest) -> Result<SourceBatch> {
        let records = self.batches.pop_front().unwrap_or_default();
        self.offset += records.len() as i64;
        self.uncommitted.push(records.clone());
        Ok(SourceBatch {
            records,
            exhausted: self.batches.is_empty(),
            revoked_partitions: Vec::new(),
            restored_checkpoints: std::mem::take(&mut self.restore),
            ..Default::default()
        })
    }
    fn commit(
        &mut self,
        checkpoints: &std::collections::BTreeMap<i32, TaskCheckpoint>,
    ) -> Result<()> {
        if self.commits_to_abort > 0 {
            self.commits_to_abort -= 1;
            return Err(crate::error::Error::BatchAborted(
                "a test aborts this commit".into(),
            ));
        }
        self.checkpoints = checkpoints.clone();
        self.committed = self.offset;
        self.uncommitted.clear();
        Ok(())
    }
    fn rewind(&mut self) -> Result<bool> {
        for records in self.uncommitted.drain(..).rev() {
            self.batches.push_front(records);
        }
        self.offset = self.committed;
        self.restore = self.checkpoints.clone().into_iter().collect();
        Ok(true)
    }
    fn offsets(&self) -> super::SourceOffsets {
        super::SourceOffsets::of_partitions([("input", 0, self.offset)])
    }
    fn assigned_inputs(&self) -> Vec<(String, i32)> {
        self.assigned.clone()
    }
}

/// Collects every row written, with its batch id.
#[derive(Debug, Default)]
pub struct CollectSink {
    /// Rows in write order.
    pub rows: Vec<Row>,
    /// The batch id of each row in `rows`.
    pub batch_ids: Vec<u64>,
    /// Batches committed.
    pub committed: Vec<u64>,
}

impl Sink for CollectSink {
    fn describe(&self) -> String {
        "CollectSink".into()
    }
    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        self.rows.extend_from_slice(rows);
        self.batch_ids
            .extend(std::iter::repeat_n(batch_id, rows.len()));
        Ok(())
    }
    fn commit(&mut self, batch_id: u64) -> Result<()> {
        self.committed.push(batch_id);
        Ok(())
    }
}
