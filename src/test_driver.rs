//! The way to unit-test a pipeline, as Kafka Streams' `TopologyTestDriver`
//! does: no broker, no files, no wall clock. Feed records batch by batch,
//! each batch at a processing time of your choosing (a virtual clock), run
//! the query as `tidemark run` would, then read what each batch wrote, the
//! rows dropped as late, the dead letters and every progress report.
//!
//! ```
//! use tidemark::decode::JsonDecoder;
//! use tidemark::prelude::*;
//! use tidemark::test_driver::PipelineTestDriver;
//!
//! let schema = Schema::new([("t", FieldType::Timestamp), ("id", FieldType::String)]);
//! let query = Query::builder("counts")
//!     .decoder(JsonDecoder::new(schema))
//!     .event_time("t")
//!     .watermark("10 minutes").unwrap()
//!     .window_aggregate(["id"], tumbling("5 minutes").unwrap(), vec![count()])
//!     .output_mode(OutputMode::Append);
//! let run = PipelineTestDriver::new(query)
//!     .batch_at("2026-01-01T11:00:00Z")
//!     .pipe("events", r#"{"t": "2026-01-01T10:01:00Z", "id": "a"}"#)
//!     .pipe("events", r#"{"t": "2026-01-01T10:20:00Z", "id": "a"}"#)
//!     .batch_at("2026-01-01T11:01:00Z")
//!     .pipe("events", r#"{"t": "2026-01-01T10:02:00Z", "id": "a"}"#) // judged by batch 0's: none
//!     .pipe("events", "not json")                                    // a dead letter
//!     .batch_at("2026-01-01T11:02:00Z")
//!     .pipe("events", r#"{"t": "2026-01-01T10:03:00Z", "id": "a"}"#) // behind 10:10: late
//!     .run()
//!     .unwrap();
//! // Batch 0 moved the watermark to 10:10; in batch 1 it closed 10:00-10:05.
//! assert_eq!(run.output_json(), [serde_json::json!(
//!     {"batch_id": 1, "id": "a", "window_start": "2026-01-01T10:00:00Z",
//!      "window_end": "2026-01-01T10:05:00Z", "count": 2})]);
//! assert_eq!(run.late_rows[0].0, 2);
//! assert!(run.dead_letters[0].1.contains("events/0@3"), "{}", run.dead_letters[0].1);
//! assert_eq!(run.progress[2].num_input_rows, 1);
//! ```
//!
//! A pipeline file gets its driver from `tidemark_pipeline`
//! (`PipelineFile::test_driver`).

use crate::error::{Error, Result};
use crate::progress::QueryProgress;
use crate::record::{Record, SourcePosition};
use crate::row::Row;
use crate::runtime::testing::CollectSink;
use crate::runtime::{
    BatchRequest, Clock, DeadLetter, ManualClock, QueryBuilder, RunSummary, Sink, Source,
    SourceBatch, TaskCheckpoint, Trigger,
};
use crate::time::TimestampMicros;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Feeds a query batch by batch on a virtual clock (see the module).
pub struct PipelineTestDriver {
    query: QueryBuilder,
    polls: Vec<DriverPoll>,
    next_offset: BTreeMap<(String, i32), i64>,
    /// Handed back with the first batch, as Kafka hands a restarted query
    /// its committed offsets' metadata.
    restored_checkpoints: BTreeMap<i32, TaskCheckpoint>,
}

/// Where a run stopped: the task checkpoints its last commit stored and
/// the next offset of each partition piped. A later driver
/// [resumes](PipelineTestDriver::resume_from) there as a restarted query
/// does (with the same state backend, or one holding a saved copy of its
/// stores).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DriverPosition {
    /// Each partition's task checkpoint, as stored with its offsets.
    pub checkpoints: BTreeMap<i32, TaskCheckpoint>,
    /// `(topic, partition, next offset)` of each partition piped.
    pub next_offsets: Vec<(String, i32, i64)>,
}

/// What one poll of the query's source hands it: a batch's records at its
/// processing time, and event time reached without records.
#[derive(Debug, Clone)]
struct DriverPoll {
    time: TimestampMicros,
    records: Vec<Record>,
    event_time_reached: Vec<(String, i32, TimestampMicros)>,
}

impl DriverPoll {
    /// A poll at `time` with nothing in it yet.
    fn at(time: TimestampMicros) -> Self {
        DriverPoll {
            time,
            records: Vec::new(),
            event_time_reached: Vec::new(),
        }
    }
}

/// What a [`PipelineTestDriver`] run wrote.
#[derive(Debug, Default)]
pub struct TestRun {
    /// The sink's rows with the batch that wrote each, in write order.
    pub output: Vec<(u64, Row)>,
    /// Rows dropped as late, with their batch.
    pub late_rows: Vec<(u64, Row)>,
    /// Records sent to the dead-letter output, with the error naming the
    /// record (topic/partition/offset), the field and the reason.
    pub dead_letters: Vec<(Record, String)>,
    /// One progress report per batch, as `tidemark run --progress` prints.
    pub progress: Vec<QueryProgress>,
    /// Batches, records and rows counted by the run.
    pub summary: RunSummary,
    /// Where the run stopped, for a driver that resumes after it.
    pub stopped_at: DriverPosition,
}

impl TestRun {
    /// The rows batch `batch_id` wrote.
    pub fn output_of(&self, batch_id: u64) -> Vec<&Row> {
        self.output
            .iter()
            .filter(|(b, _)| *b == batch_id)
            .map(|(_, row)| row)
            .collect()
    }

    /// Every output row as JSON with its `batch_id` first, as the JSON-lines
    /// sink writes it.
    pub fn output_json(&self) -> Vec<serde_json::Value> {
        with_batch_ids(&self.output)
    }

    /// Every late row as JSON with its `batch_id` first, as the JSON-lines
    /// late-data sink writes it.
    pub fn late_json(&self) -> Vec<serde_json::Value> {
        with_batch_ids(&self.late_rows)
    }
}

/// `rows` as JSON objects, each with its `batch_id` first.
fn with_batch_ids(rows: &[(u64, Row)]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|(batch_id, row)| {
            let mut object = serde_json::Map::new();
            object.insert("batch_id".into(), (*batch_id).into());
            if let serde_json::Value::Object(columns) = row.to_json() {
                object.extend(columns);
            }
            serde_json::Value::Object(object)
        })
        .collect()
}

impl PipelineTestDriver {
    /// A driver for the query `query` builds (its trigger and clock are the
    /// driver's: available-now over the batches fed, at their times).
    pub fn new(query: QueryBuilder) -> Self {
        PipelineTestDriver {
            query,
            polls: Vec::new(),
            next_offset: BTreeMap::new(),
            restored_checkpoints: BTreeMap::new(),
        }
    }

    /// Keeps the query's state in `backend` (a clone of an
    /// [`InMemoryStateBackend`](crate::runtime::InMemoryStateBackend)
    /// shares its stores): a later driver over the same backend restarts
    /// from it.
    pub fn state_backend(mut self, backend: impl crate::runtime::StateBackend + 'static) -> Self {
        self.query = self.query.state_backend(backend);
        self
    }

    /// Continues where an earlier run stopped (its
    /// [`TestRun::stopped_at`]): records piped next take the offsets after
    /// its, and the first batch hands the query its checkpoints back, as a
    /// restarted query gets them from Kafka.
    pub fn resume_from(mut self, position: &DriverPosition) -> Self {
        self.restored_checkpoints = position.checkpoints.clone();
        for (topic, partition, next) in &position.next_offsets {
            self.next_offset.insert((topic.clone(), *partition), *next);
        }
        self
    }

    /// Opens the next batch, run at processing time `time` (RFC 3339): the
    /// query's clock moves to `time` (Spark's `AdvanceManualClock`). A
    /// batch fed nothing runs only when something is due at that time, as
    /// in Spark: a processing-time timer or TTL expiry, a no-data batch
    /// the watermark owes, or event time reached
    /// ([`advance_event_time`](Self::advance_event_time)). After the last
    /// batch, the no-data batches the watermark still owes run at the last
    /// time given.
    pub fn batch_at(mut self, time: &str) -> Self {
        // A bad time in a test is the test's own mistake: said at once.
        let at = crate::time::parse_rfc3339(time)
            .unwrap_or_else(|| panic!("batch_at: `{time}` is not an RFC 3339 time"));
        self.polls.push(DriverPoll::at(at));
        self
    }

    /// Moves the event time of `topic`'s `partition` to `time` (RFC 3339)
    /// in the open batch, with no row: its watermark moves at the batch's
    /// end as a row of that event time would move it (to `time` minus the
    /// watermark delay), so event-time timers and windows behind it fire
    /// in the next batch, which runs by itself if nothing else comes.
    /// The partition must have had a row already: its task (and its
    /// watermark) exist from its first row on.
    pub fn advance_event_time(mut self, topic: &str, partition: i32, time: &str) -> Self {
        let at = crate::time::parse_rfc3339(time)
            .unwrap_or_else(|| panic!("advance_event_time: `{time}` is not an RFC 3339 time"));
        // A partition without a row has no task and no watermark: moving
        // it would do nothing, which a test should hear about at once.
        if !self
            .next_offset
            .contains_key(&(topic.to_string(), partition))
        {
            panic!("advance_event_time: {topic}/{partition} was piped no row before");
        }
        if let Some(poll) = self.open_poll() {
            poll.event_time_reached
                .push((topic.to_string(), partition, at));
        }
        self
    }

    /// The open batch, opening one at the epoch if none is.
    fn open_poll(&mut self) -> Option<&mut DriverPoll> {
        if self.polls.is_empty() {
            self.polls.push(DriverPoll::at(0));
        }
        self.polls.last_mut()
    }

    /// Adds a record of `topic` (partition 0) whose value is `value` to
    /// the open batch (opening one at the epoch if none is).
    pub fn pipe(self, topic: &str, value: &str) -> Self {
        self.pipe_to(topic, 0, None, value)
    }

    /// Adds a record of `topic` and `partition`, with record key `key`, to
    /// the open batch: each partition is its own task and watermark input.
    pub fn pipe_to(mut self, topic: &str, partition: i32, key: Option<&str>, value: &str) -> Self {
        let offset = self
            .next_offset
            .entry((topic.to_string(), partition))
            .or_insert(0);
        let record = Record {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            position: SourcePosition::new(topic, partition, *offset),
            ..Default::default()
        };
        *offset += 1;
        if let Some(poll) = self.open_poll() {
            poll.records.push(record);
        }
        self
    }

    /// Runs the query over every batch fed (and the no-data batches its
    /// watermark then owes, as Spark runs them) and returns what it wrote.
    pub fn run(self) -> Result<TestRun> {
        let clock = ManualClock::at(self.polls.first().map_or(0, |p| p.time));
        let late = Arc::new(Mutex::new(CollectSink::default()));
        let dead_letters = Arc::new(Mutex::new(Vec::new()));
        let progress = Arc::new(Mutex::new(Vec::new()));
        let seen = progress.clone();
        let query = self
            .query
            .trigger(Trigger::AvailableNow)
            .clock(Clock::Manual(clock.clone()))
            .late_data(SharedSink(late.clone()))
            .dead_letter(SharedDeadLetter(dead_letters.clone()))
            .on_progress(move |p: &QueryProgress| {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(p.clone())
            })
            .build()?;
        let mut source = DriverSource {
            polls: self.polls.into(),
            uncommitted: Vec::new(),
            clock,
            next_offsets: BTreeMap::new(),
            checkpoints: self.restored_checkpoints.clone(),
            restore: self.restored_checkpoints.into_iter().collect(),
        };
        let mut sink = CollectSink::default();
        let summary = query.run(&mut source, &mut sink)?;
        let stopped_at = DriverPosition {
            checkpoints: source.checkpoints,
            next_offsets: (self.next_offset.into_iter())
                .map(|((topic, partition), next)| (topic, partition, next))
                .collect(),
        };
        let late = std::mem::take(&mut *late.lock().unwrap_or_else(|e| e.into_inner()));
        let dead_letters =
            std::mem::take(&mut *dead_letters.lock().unwrap_or_else(|e| e.into_inner()));
        let progress = std::mem::take(&mut *progress.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(TestRun {
            output: sink.batch_ids.into_iter().zip(sink.rows).collect(),
            late_rows: late.batch_ids.into_iter().zip(late.rows).collect(),
            dead_letters,
            progress,
            summary,
            stopped_at,
        })
    }
}

/// Hands the query the driver's polls one by one, moving its clock to each
/// poll's time as it does.
struct DriverSource {
    polls: VecDeque<DriverPoll>,
    /// Handed out since the last commit: a rewind hands them out again.
    uncommitted: Vec<DriverPoll>,
    clock: ManualClock,
    /// The next offset of each partition handed out, for progress reports.
    next_offsets: crate::runtime::PartitionOffsets,
    /// The checkpoints stored with the last commit, handed back after a
    /// rewind as Kafka hands back committed offsets' metadata.
    checkpoints: BTreeMap<i32, TaskCheckpoint>,
    restore: Vec<(i32, TaskCheckpoint)>,
}

impl Source for DriverSource {
    fn describe(&self) -> String {
        "PipelineTestDriver".into()
    }

    fn next_batch(&mut self, _: &BatchRequest) -> Result<SourceBatch> {
        let restored_checkpoints = std::mem::take(&mut self.restore);
        let Some(poll) = self.polls.pop_front() else {
            return Ok(SourceBatch {
                exhausted: true,
                restored_checkpoints,
                ..Default::default()
            });
        };
        self.clock.set(poll.time);
        for record in &poll.records {
            let position = &record.position;
            self.next_offsets
                .entry(position.topic.to_string())
                .or_default()
                .insert(position.partition, position.offset + 1);
        }
        self.uncommitted.push(poll.clone());
        Ok(SourceBatch {
            records: poll.records,
            exhausted: self.polls.is_empty(),
            restored_checkpoints,
            event_time_reached: poll.event_time_reached,
            ..Default::default()
        })
    }

    fn commit(&mut self, checkpoints: &BTreeMap<i32, TaskCheckpoint>) -> Result<()> {
        self.checkpoints = checkpoints.clone();
        self.uncommitted.clear();
        Ok(())
    }

    fn rewind(&mut self) -> Result<bool> {
        for poll in self.uncommitted.drain(..).rev() {
            self.polls.push_front(poll);
        }
        self.restore = self.checkpoints.clone().into_iter().collect();
        Ok(true)
    }

    fn offsets(&self) -> crate::runtime::SourceOffsets {
        crate::runtime::SourceOffsets::Partitions(self.next_offsets.clone())
    }
}

/// A sink the driver reads after the run.
struct SharedSink(Arc<Mutex<CollectSink>>);

impl Sink for SharedSink {
    fn describe(&self) -> String {
        "TestDriverLateRows".into()
    }
    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write(batch_id, rows)
    }
    fn commit(&mut self, batch_id: u64) -> Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .commit(batch_id)
    }
}

/// A dead-letter output the driver reads after the run.
struct SharedDeadLetter(Arc<Mutex<Vec<(Record, String)>>>);

impl DeadLetter for SharedDeadLetter {
    fn send(&mut self, record: &Record, error: &Error) -> Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((record.clone(), error.to_string()));
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}
