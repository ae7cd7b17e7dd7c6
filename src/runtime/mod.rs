//! The runtime: sources, sinks, dead letters, clocks, triggers and the one
//! trigger loop that runs a [`Query`].

mod builder;
mod columnar;
mod commit;
pub mod fault_injection;
mod global_tables;
mod inputs;
mod output;
mod plan;
mod query;
mod reporter;
mod resources;
pub mod retry;
mod routed;
mod router;
mod run_status;
mod source_offsets;
pub(crate) mod stages;
mod state_query;
mod task;
mod task_checkpoint;
mod task_manager;
pub mod testing;
mod watermark;

pub use builder::QueryBuilder;
pub use output::{BatchOutput, ColumnsOutput, OutputPart, TaskRuns};
pub use plan::{
    EventTimeExtractor, JoinInput, OperatorFactory, QueryPlan, SecondInput, SecondInputKind,
};
pub use query::{default_query_id, Query, RunSummary, StopHandle};
pub use run_status::{RunState, RunStateListener, RunStatus, StageStatus};
pub use source_offsets::{PartitionOffsets, SourceOffsets};
pub use stages::{Stage, StageInput, StageOutput, Topology};
pub use state_query::{
    KeyLookup, KeyValues, StateQueryError, StateReader, StateService, StoreDescription, StoreHandle,
};
pub use task_checkpoint::TaskCheckpoint;
pub use watermark::{PartitionProgress, WatermarkExchange};
pub use watermark::{WatermarkMarker, WATERMARK_MARKER_HEADER};

use crate::error::{Error, Result};
use crate::record::Record;
use crate::row::Row;
use crate::time::TimestampMicros;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the trigger loop asks a source for.
#[derive(Debug, Clone, Copy)]
pub struct BatchRequest {
    /// The id of the batch this poll belongs to: a source that logs its
    /// batches (the files source) records what it hands out under it.
    pub batch_id: u64,
    /// Return by then, with what has arrived.
    pub deadline: Instant,
    /// At most this many records.
    pub max_records: usize,
    /// Available-now: read up to the end offsets seen when the query started
    /// and then report [`SourceBatch::exhausted`].
    pub available_now: bool,
    /// Real-time mode: return as soon as some records are there and no
    /// more are waiting, instead of filling the batch until the deadline.
    pub return_early: bool,
    /// Plan the batch as Spark does: a source that can fixes each
    /// partition's end offset when the batch starts (its backlog then, cut
    /// to a share of `max_records` by backlog) and reads every partition up
    /// to it, however long that takes; what lies past waits for the next
    /// batch. Set under the query-wide watermark, where a batch holding one
    /// partition's records would move the watermark past the others'.
    pub plan_offsets: bool,
}

/// Records handed to one micro-batch.
#[derive(Debug, Default)]
pub struct SourceBatch {
    /// The records, in source order per partition.
    pub records: Vec<Record>,
    /// Available-now only: nothing more will come.
    pub exhausted: bool,
    /// Partitions taken away from this instance since the last batch; their
    /// tasks are closed.
    pub revoked_partitions: Vec<i32>,
    /// Checkpoints stored with the committed offsets of partitions assigned
    /// since the last batch: their tasks resume from them. A partition may
    /// come with several (one per topic, each written when that topic last
    /// moved); the task merges them, which keeps the newest. Only partitions
    /// still owned when the batch ends: the runtime applies the revocations
    /// first, so one assigned and revoked within the batch must not be here.
    pub restored_checkpoints: Vec<(i32, TaskCheckpoint)>,
    /// Event time an input partition reached with no record to show it,
    /// as `(topic, partition, time)`: its watermark moves as a record of
    /// that event time would move it. Sources of real data leave it empty;
    /// a test driver sets it (Flink's test harnesses send watermarks so).
    pub event_time_reached: Vec<(String, i32, TimestampMicros)>,
}

/// Where records come from: Kafka, a directory of batch files, a vector.
pub trait Source: Send {
    /// A description for progress reports (`KafkaV2[Subscribe[orders]]`).
    fn describe(&self) -> String;
    /// The records of the next batch.
    fn next_batch(&mut self, request: &BatchRequest) -> Result<SourceBatch>;
    /// Marks every record handed out so far as done; called only after the
    /// sink acknowledged the batch's output. `checkpoints` holds each task's
    /// state to store with its offsets (the watermark), by partition; a
    /// source that can keep it (Kafka: commit metadata) hands it back in
    /// [`SourceBatch::restored_checkpoints`] after a restart or rebalance.
    fn commit(&mut self, checkpoints: &BTreeMap<i32, TaskCheckpoint>) -> Result<()>;
    /// Current position, for progress (Spark's `{"topic": {"0": 42}}`).
    fn offsets(&self) -> SourceOffsets;
    /// The watermark input a record's topic and partition belong to: each
    /// input keeps its own maximum event time. Default: `topic/partition`.
    fn watermark_input(&self, topic: &str, partition: i32) -> String {
        format!("{topic}/{partition}")
    }
    /// Abandons the open batch's transaction, when the source commits its
    /// offsets in one (exactly-once): a step of the commit failed before
    /// the source's own commit. Nothing of the batch becomes visible.
    fn abort(&mut self) -> Result<()> {
        Ok(())
    }
    /// Goes back to the last committed position after an aborted batch:
    /// the next batch re-reads from there, held partitions included (they
    /// are released), and hands back every owned partition's checkpoint in
    /// [`SourceBatch::restored_checkpoints`].
    /// Sources that cannot return `false` and the query fails instead.
    fn rewind(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// Stops delivering the records of task partition `partition` (of every
    /// topic) until [`Source::release`], and forgets what was handed out of
    /// it since the last commit: none of it is committed, and after the
    /// release it is read again from the last committed offset. The query
    /// holds a partition whose task is still restoring its state, so that
    /// the other partitions go on. Sources that cannot return `false`, and
    /// the query waits for the restore instead.
    fn hold(&mut self, _partition: i32) -> Result<bool> {
        Ok(false)
    }
    /// Delivers a held partition again, from its last committed offset.
    fn release(&mut self, _partition: i32) -> Result<()> {
        Ok(())
    }
    /// Ends the next batch exactly at `end` (offsets as [`Source::offsets`]
    /// reports them) where the committed position is behind it, reading
    /// nothing from the other partitions: the replay of batch `batch_id`,
    /// whose output the sink already committed. Returns whether that batch
    /// was not committed here (its offsets are behind, or the checkpoints
    /// committed with them name an earlier batch: a batch without input).
    /// Sources that cannot return `false`.
    fn replay_until(&mut self, _batch_id: u64, _end: &SourceOffsets) -> Result<bool> {
        Ok(false)
    }
    /// The task partitions the last planned batch
    /// ([`BatchRequest::plan_offsets`]) reads to their latest offset (its
    /// plan was not cut to `max_records`), those with nothing waiting
    /// included. Sources that do not plan batches know of none.
    fn partitions_caught_up(&self) -> std::collections::BTreeSet<i32> {
        Default::default()
    }
    /// When (wall clock, epoch milliseconds) the last plan asked for the
    /// latest offsets: [`Source::partitions_caught_up`] holds nothing
    /// appended after it. `None`: not known, taken as now.
    fn caught_up_as_of_ms(&self) -> Option<i64> {
        None
    }
    /// The `(topic, partition)`s this member reads now (Kafka: its
    /// assignment), silent ones too; empty when the source does not say.
    fn assigned_inputs(&self) -> Vec<(String, i32)> {
        Vec::new()
    }
    /// Records behind the end of the input, if known (consumer lag).
    fn lag(&self) -> Option<i64> {
        None
    }
    /// How far the input goes, shaped as [`Source::offsets`] (Spark's
    /// `latestOffset`), or unknown when the source does not know.
    fn latest_offsets(&self) -> SourceOffsets {
        SourceOffsets::Unknown
    }
    /// What the source's own batch log says, read when the query starts: a
    /// source that numbers its batches (the files source, as Spark's commit
    /// log does) tells the last one it committed, so that the query goes on
    /// from the next and local state goes back to that batch's version.
    fn batch_log(&mut self) -> Result<BatchLog> {
        Ok(BatchLog::NotKept)
    }
}

/// A source's record of the batches it committed (see
/// [`Source::batch_log`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchLog {
    /// The source keeps no log of batches (Kafka keeps per-partition
    /// checkpoints with its offsets instead).
    NotKept,
    /// A log is kept and holds no committed batch: a first run.
    Empty,
    /// The last batch the source committed.
    Committed(u64),
}

impl BatchLog {
    /// The last committed batch, if any.
    pub fn last_committed(self) -> Option<u64> {
        match self {
            BatchLog::Committed(batch_id) => Some(batch_id),
            _ => None,
        }
    }
}

/// The records of a global table's topic (every partition), read by the
/// query between batches (Kafka Streams' GlobalKTable: every instance reads
/// the whole topic, so the stream need not be co-partitioned with it).
pub trait TableFeed: Send {
    /// A description for logs.
    fn describe(&self) -> String;
    /// The records that arrived since the last call, up to the topic's end
    /// as of now; the first call reads the whole topic (bootstrap).
    fn catch_up(&mut self) -> Result<Vec<Record>>;
}

/// Turns raw records into rows.
pub trait Decoder: Send {
    /// Decodes one record; the error names the record, field and reason.
    fn decode(&mut self, record: &Record) -> Result<Row>;

    /// The typed schema `record` is decoded with when this decoder can
    /// decode it straight into that schema's columns
    /// ([`Decoder::decode_typed`]): the router then takes the columnar
    /// route for a first step that reads columns. `None`, the default,
    /// keeps the row path (as for a record this decoder refuses before
    /// parsing it).
    fn typed_schema(&self, _record: &Record) -> Option<&crate::schema::Schema> {
        None
    }

    /// `record` as one value per column of `schema` (what
    /// [`Decoder::typed_schema`] gave for it): the values
    /// [`Decoder::decode`] gives, or the error it gives. A decoder that
    /// gives a typed schema implements it (and one that wraps another
    /// passes both on); the default fails the query as misconfigured,
    /// naming the record, rather than retry a batch that cannot succeed.
    fn decode_typed<'r>(
        &self,
        record: &'r Record,
        _schema: &crate::schema::Schema,
    ) -> Result<crate::decode::TypedSlots<'r>> {
        Err(Error::config(
            "decoder",
            format!(
                "the decoder of {} gives a typed schema (Decoder::typed_schema) but does not implement Decoder::decode_typed",
                record.position
            ),
        ))
    }
}

/// Where rows go. Output is written during the batch and acknowledged at
/// `commit`, so transactional sinks fit the same shape.
pub trait Sink: Send {
    /// A description for progress reports.
    fn describe(&self) -> String;
    /// Writes the batch's rows.
    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()>;
    /// Makes the batch durable (flush, wait for acknowledgements, commit a
    /// transaction). Source offsets are committed only after this returns.
    fn commit(&mut self, batch_id: u64) -> Result<()>;
    /// Drops what was written of batch `batch_id` and not committed: the
    /// batch aborted and its replay writes it again. A sink whose writes
    /// are already out (at-least-once) or inside the source's transaction
    /// (which the abort discards) has nothing to do.
    fn abort(&mut self, _batch_id: u64) {}
    /// Called at every turn of the query loop, with a batch or without: a
    /// sink holding something on the query's behalf (the Delta sink's
    /// writer lease) keeps it only while the loop shows life, as a Kafka
    /// consumer leaves its group when it stops polling.
    fn alive(&mut self) {}
    /// The largest event time each input (`topic/partition`) delivered in
    /// the batch about to commit; called before [`Sink::commit`]. A
    /// repartition sink forwards it as [`WatermarkMarker`]s.
    fn event_time_progress(&mut self, _max_event_time: &BTreeMap<String, TimestampMicros>) {}
    /// The source's offsets at the end of the batch about to commit
    /// (`Source::offsets`); called before [`Sink::commit`]. A sink that
    /// records its own progress (Delta's `txn`) keeps them with the batch.
    fn source_offsets(&mut self, _offsets: &SourceOffsets) {}
    /// The last batch this sink committed in an earlier run, with the source
    /// offsets recorded at its end: the query numbers its batches after it,
    /// and first replays exactly that batch's input when the source's
    /// committed offsets are behind (a crash between the sink's commit and
    /// the offset commit), so the sink can recognise and skip it. `None`
    /// for sinks that keep no such record.
    fn recovered_batch(&mut self) -> Result<Option<(u64, SourceOffsets)>> {
        Ok(None)
    }
    /// Writes the batch's rows, `tasks` saying which task partition
    /// emitted which: `(partition, end)` runs, each covering the rows from
    /// the previous run's end up to `end`. A sink that commits per task
    /// ([`Sink::prepare`]) keeps them apart; the others write them all.
    fn write_tasks(&mut self, batch_id: u64, rows: &[Row], _tasks: &[(i32, usize)]) -> Result<()> {
        self.write(batch_id, rows)
    }
    /// Writes what the batch's tasks emitted: rows, and the columnar
    /// batches of chains that ran on columns to the sink. This default
    /// makes rows of the columns and calls [`Sink::write_tasks`]; a sink
    /// that encodes columns (Kafka, Delta) writes them as they are.
    fn write_output(&mut self, batch_id: u64, output: &BatchOutput<'_>) -> Result<()> {
        if output.columns.is_empty() {
            return self.write_tasks(batch_id, output.rows, output.tasks);
        }
        let (rows, tasks) = output.to_rows()?;
        self.write_tasks(batch_id, &rows, &tasks)
    }
    /// Stages, before the source commits, the output of every task
    /// partition that has some, as commit `next_seqs[partition]` of that
    /// partition; returns what each staged partition's checkpoint records
    /// (committed with the source's offsets). Only sinks that commit per
    /// task (Delta with several instances) stage anything.
    fn prepare(
        &mut self,
        _batch_id: u64,
        _next_seqs: &BTreeMap<i32, u64>,
    ) -> Result<BTreeMap<i32, SinkCommit>> {
        Ok(BTreeMap::new())
    }
    /// Makes what [`Sink::prepare`] staged visible, after the source
    /// committed. Skips a partition the output already holds that commit
    /// of (a zombie, a task that moved and was rolled forward elsewhere).
    fn publish(&mut self, _batch_id: u64) -> Result<()> {
        Ok(())
    }
    /// A task partition starts with `commit` as its last recorded sink
    /// commit: if the output does not hold it yet (the process stopped
    /// between the source's commit and [`Sink::publish`]), it is published
    /// now, before the task writes anything else.
    fn recover_task(&mut self, _partition: i32, _commit: &SinkCommit) -> Result<()> {
        Ok(())
    }
}

/// A task partition's last sink commit, recorded in its checkpoint with
/// the source offsets: its sequence number (one more with every commit
/// that had output) and the sink's name for what it staged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SinkCommit {
    /// The partition's commit count.
    pub seq: u64,
    /// What the sink staged for it (Delta: the staged commit's file).
    pub staged: String,
}

/// Where records that fail go, with the error, so that nothing is lost.
pub trait DeadLetter: Send {
    /// Sends one failed record with its error.
    fn send(&mut self, record: &Record, error: &Error) -> Result<()>;
    /// Makes the sent records durable; called before source offsets commit.
    fn flush(&mut self) -> Result<()>;
    /// Sends a failed record read between batches (a global table's
    /// catch-up), durably before it returns: no batch (and under
    /// exactly-once no transaction) may follow to carry it.
    fn send_between_batches(&mut self, record: &Record, error: &Error) -> Result<()> {
        self.send(record, error)?;
        self.flush()
    }
}

impl<T: Decoder + ?Sized> Decoder for Box<T> {
    fn decode(&mut self, record: &Record) -> Result<Row> {
        (**self).decode(record)
    }
    fn typed_schema(&self, record: &Record) -> Option<&crate::schema::Schema> {
        (**self).typed_schema(record)
    }
    fn decode_typed<'r>(
        &self,
        record: &'r Record,
        schema: &crate::schema::Schema,
    ) -> Result<crate::decode::TypedSlots<'r>> {
        (**self).decode_typed(record, schema)
    }
}

impl<T: Sink + ?Sized> Sink for Box<T> {
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        (**self).write(batch_id, rows)
    }
    fn commit(&mut self, batch_id: u64) -> Result<()> {
        (**self).commit(batch_id)
    }
    fn event_time_progress(&mut self, max_event_time: &BTreeMap<String, TimestampMicros>) {
        (**self).event_time_progress(max_event_time)
    }
    fn source_offsets(&mut self, offsets: &SourceOffsets) {
        (**self).source_offsets(offsets)
    }
    fn recovered_batch(&mut self) -> Result<Option<(u64, SourceOffsets)>> {
        (**self).recovered_batch()
    }
    fn abort(&mut self, batch_id: u64) {
        (**self).abort(batch_id)
    }
    fn alive(&mut self) {
        (**self).alive()
    }
    fn write_tasks(&mut self, batch_id: u64, rows: &[Row], tasks: &[(i32, usize)]) -> Result<()> {
        (**self).write_tasks(batch_id, rows, tasks)
    }
    fn write_output(&mut self, batch_id: u64, output: &BatchOutput<'_>) -> Result<()> {
        (**self).write_output(batch_id, output)
    }
    fn prepare(
        &mut self,
        batch_id: u64,
        next_seqs: &BTreeMap<i32, u64>,
    ) -> Result<BTreeMap<i32, SinkCommit>> {
        (**self).prepare(batch_id, next_seqs)
    }
    fn publish(&mut self, batch_id: u64) -> Result<()> {
        (**self).publish(batch_id)
    }
    fn recover_task(&mut self, partition: i32, commit: &SinkCommit) -> Result<()> {
        (**self).recover_task(partition, commit)
    }
}

impl<T: DeadLetter + ?Sized> DeadLetter for Box<T> {
    fn send(&mut self, record: &Record, error: &Error) -> Result<()> {
        (**self).send(record, error)
    }
    fn flush(&mut self) -> Result<()> {
        (**self).flush()
    }
    fn send_between_batches(&mut self, record: &Record, error: &Error) -> Result<()> {
        (**self).send_between_batches(record, error)
    }
}

/// A dead-letter output that only logs and counts (for tests and demos).
#[derive(Debug, Default)]
pub struct LogDeadLetter {
    /// How many records were sent.
    pub count: u64,
}

impl DeadLetter for LogDeadLetter {
    fn send(&mut self, record: &Record, error: &Error) -> Result<()> {
        self.count += 1;
        tracing::warn!(position = %record.position, %error, "bad record");
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Opens the stores of stateful operators, one per (task partition,
/// operator), and makes their changes durable at each checkpoint.
pub trait StateBackend: Send {
    /// The store `name` of the task for `partition`, with its state
    /// restored (from local disk or a changelog).
    fn open(&mut self, partition: i32, name: &str) -> Result<Box<dyn tidemark_state::StateStore>>;
    /// Like [`StateBackend::open`], but the restore (the slow part: reading
    /// a changelog) is left to the returned closure, which the query runs on
    /// a thread of its own so that the instance's other tasks keep
    /// processing meanwhile. The default restores here.
    fn open_deferred(&mut self, partition: i32, name: &str) -> Result<PendingStore> {
        let store = self.open(partition, name)?;
        Ok(Box::new(move || Ok(store)))
    }
    /// Called after every store flushed at a checkpoint: waits until the
    /// changes are durable (changelog acknowledgements).
    fn commit(&mut self) -> Result<()> {
        Ok(())
    }
    /// Memory for each stateful operator's in-memory state; `None` keeps
    /// all of it in memory.
    fn cache_bytes(&self) -> Option<usize> {
        None
    }
    /// The task of `partition` stopped right after a commit (its partition
    /// was revoked, or the query ended): its stores match their changelogs,
    /// which a backend may record to restore less next time.
    fn close(&mut self, _partition: i32) -> Result<()> {
        Ok(())
    }
    /// Called after a batch committed (its output, state and offsets are
    /// durable together): backends may record that their local state
    /// matches what was committed.
    fn batch_committed(&mut self) -> Result<()> {
        Ok(())
    }
    /// Called after a batch aborted and every task was dropped (they reopen,
    /// restoring their stores, when the replay reaches them): the local
    /// state may hold the aborted batch's writes, and a backend must not
    /// record it as matching what was committed.
    fn batch_aborted(&mut self) -> Result<()> {
        Ok(())
    }
    /// Called before each trigger, between batches: backends with standby
    /// replicas catch them up here.
    fn between_batches(&mut self) -> Result<()> {
        Ok(())
    }
    /// What restores did since the last call (reported in the batch's
    /// progress as `numRestoredRecords` and `restoreDurationMs`).
    fn take_restore_stats(&mut self) -> RestoreStats {
        RestoreStats::default()
    }
    /// The source keeps a batch log (see [`Source::batch_log`]) whose last
    /// committed batch is `committed`; called before any task opens.
    /// Local state without a changelog goes back to its version of that
    /// batch (Spark's versioned state store: a batch replayed after a crash
    /// runs on the state it first ran on) and keeps a version per batch
    /// from now on; `None`: a first run, nothing kept.
    fn resume_at_version(&mut self, _committed: Option<u64>) -> Result<()> {
        Ok(())
    }
    /// Called right after [`StateBackend::commit`] of batch `batch_id`,
    /// before the sink commits: a backend keeping versions snapshots the
    /// state the batch left.
    fn version(&mut self, _batch_id: u64) -> Result<()> {
        Ok(())
    }
}

/// A store whose state is restored when the closure runs (see
/// [`StateBackend::open_deferred`]).
pub type PendingStore = Box<dyn FnOnce() -> Result<Box<dyn tidemark_state::StateStore>> + Send>;

/// Records replayed into stores when tasks started, and the time it took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreStats {
    /// Records (changelog records, or stored entries) replayed.
    pub records: u64,
    /// Wall time spent restoring, in milliseconds.
    pub millis: u64,
}

impl<T: StateBackend + ?Sized> StateBackend for Box<T> {
    fn open(&mut self, partition: i32, name: &str) -> Result<Box<dyn tidemark_state::StateStore>> {
        (**self).open(partition, name)
    }
    fn open_deferred(&mut self, partition: i32, name: &str) -> Result<PendingStore> {
        (**self).open_deferred(partition, name)
    }
    fn commit(&mut self) -> Result<()> {
        (**self).commit()
    }
    fn cache_bytes(&self) -> Option<usize> {
        (**self).cache_bytes()
    }
    fn close(&mut self, partition: i32) -> Result<()> {
        (**self).close(partition)
    }
    fn batch_committed(&mut self) -> Result<()> {
        (**self).batch_committed()
    }
    fn batch_aborted(&mut self) -> Result<()> {
        (**self).batch_aborted()
    }
    fn between_batches(&mut self) -> Result<()> {
        (**self).between_batches()
    }
    fn take_restore_stats(&mut self) -> RestoreStats {
        (**self).take_restore_stats()
    }
    fn resume_at_version(&mut self, committed: Option<u64>) -> Result<()> {
        (**self).resume_at_version(committed)
    }
    fn version(&mut self, batch_id: u64) -> Result<()> {
        (**self).version(batch_id)
    }
}

/// Keeps each store in memory, shared across runs of queries that use the
/// same backend value: restarts in tests without disk or Kafka.
#[derive(Clone, Default)]
pub struct InMemoryStateBackend {
    stores:
        std::sync::Arc<std::sync::Mutex<BTreeMap<(i32, String), tidemark_state::InMemoryStore>>>,
    restored: RestoreStats,
}

/// Every entry of every store of an [`InMemoryStateBackend`], by partition
/// and store name: what a test saves to restore later, or elsewhere.
pub type StoresSnapshot = BTreeMap<(i32, String), Vec<tidemark_state::Entry>>;

impl InMemoryStateBackend {
    /// A copy of every store's entries as the last flush left them.
    pub fn snapshot(&self) -> Result<StoresSnapshot> {
        let stores = self.stores.lock().unwrap_or_else(|p| p.into_inner());
        let mut snapshot = StoresSnapshot::new();
        for (key, store) in stores.iter() {
            snapshot.insert(key.clone(), tidemark_state::StateStore::prefix(store, &[])?);
        }
        Ok(snapshot)
    }

    /// A backend holding the stores of `snapshot`, as a restarted query
    /// finds them.
    pub fn from_snapshot(snapshot: &StoresSnapshot) -> Result<Self> {
        let backend = InMemoryStateBackend::default();
        let mut stores = backend.stores.lock().unwrap_or_else(|p| p.into_inner());
        for ((partition, name), entries) in snapshot {
            let mut store = tidemark_state::InMemoryStore::new(name);
            for (key, value) in entries {
                tidemark_state::StateStore::put(&mut store, key, value)?;
            }
            stores.insert((*partition, name.clone()), store);
        }
        drop(stores);
        Ok(backend)
    }
}

/// A store of an [`InMemoryStateBackend`]: writes go to the shared map.
struct SharedInMemoryStore {
    key: (i32, String),
    local: tidemark_state::InMemoryStore,
    shared:
        std::sync::Arc<std::sync::Mutex<BTreeMap<(i32, String), tidemark_state::InMemoryStore>>>,
}

impl tidemark_state::StateStore for SharedInMemoryStore {
    fn name(&self) -> &str {
        self.local.name()
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, tidemark_state::StateError> {
        self.local.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), tidemark_state::StateError> {
        self.local.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), tidemark_state::StateError> {
        self.local.delete(key)
    }
    fn range(
        &self,
        start: &[u8],
        end: &[u8],
    ) -> Result<tidemark_state::Entries, tidemark_state::StateError> {
        self.local.range(start, end)
    }
    fn prefix(&self, prefix: &[u8]) -> Result<tidemark_state::Entries, tidemark_state::StateError> {
        self.local.prefix(prefix)
    }
    fn first_in_range(
        &self,
        start: &[u8],
        end: &[u8],
    ) -> Result<Option<tidemark_state::Entry>, tidemark_state::StateError> {
        self.local.first_in_range(start, end)
    }
    fn approximate_len(&self) -> usize {
        self.local.approximate_len()
    }
    fn flush(&mut self) -> Result<(), tidemark_state::StateError> {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        shared.insert(self.key.clone(), self.local.clone());
        Ok(())
    }
}

impl StateBackend for InMemoryStateBackend {
    fn open(&mut self, partition: i32, name: &str) -> Result<Box<dyn tidemark_state::StateStore>> {
        let key = (partition, name.to_string());
        let local = self
            .stores
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned()
            .unwrap_or_else(|| tidemark_state::InMemoryStore::new(name));
        self.restored.records += tidemark_state::StateStore::approximate_len(&local) as u64;
        Ok(Box::new(SharedInMemoryStore {
            key,
            local,
            shared: self.stores.clone(),
        }))
    }
    fn take_restore_stats(&mut self) -> RestoreStats {
        std::mem::take(&mut self.restored)
    }
}

/// When batches run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A batch every `interval` (Spark's `ProcessingTime`); a batch that
    /// overruns starts the next at once.
    MicroBatch {
        /// The trigger interval.
        interval: Duration,
    },
    /// Process what is there now in batches, then stop (Spark's
    /// `Trigger.AvailableNow`), with a trailing no-data batch if the
    /// watermark moved.
    AvailableNow,
    /// Databricks' real-time mode: long-running batches in which each
    /// record is processed as it arrives and its output sent at once;
    /// state, output and offsets are checkpointed at the end of each batch,
    /// `checkpoint_interval` long. Output between checkpoints is
    /// at-least-once (replayed after a failure). Update output mode only.
    RealTime {
        /// The length of a batch: how often progress is checkpointed.
        checkpoint_interval: Duration,
    },
}

impl Default for Trigger {
    fn default() -> Self {
        Trigger::MicroBatch {
            interval: Duration::from_millis(500),
        }
    }
}

/// Processing time per batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Clock {
    /// The wall clock at the start of each batch.
    #[default]
    System,
    /// Batch *i* runs at `times[i]`; batches past the list reuse the last
    /// time. Makes replays deterministic.
    Virtual(Vec<TimestampMicros>),
    /// Whatever time its holder last set (Spark's `ManualClock` in its
    /// stream tests): a test moves time between polls, and a batch with
    /// nothing but due timers runs when it does.
    Manual(ManualClock),
}

/// A processing time set by hand, shared between a test and the query it
/// drives (see [`Clock::Manual`]).
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<std::sync::atomic::AtomicI64>);

impl ManualClock {
    /// A clock reading `time`.
    pub fn at(time: TimestampMicros) -> Self {
        ManualClock(Arc::new(std::sync::atomic::AtomicI64::new(time)))
    }

    /// Moves the clock to `time` (backwards too: the test decides).
    pub fn set(&self, time: TimestampMicros) {
        self.0.store(time, std::sync::atomic::Ordering::SeqCst);
    }

    /// The time last set.
    pub fn now(&self) -> TimestampMicros {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl PartialEq for ManualClock {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ManualClock {}

impl Clock {
    /// The processing time of `batch_id`.
    pub fn batch_time(&self, batch_id: u64) -> TimestampMicros {
        match self {
            Clock::System => crate::time::now_micros(),
            Clock::Virtual(times) => times
                .get(batch_id as usize)
                .or(times.last())
                .copied()
                .unwrap_or(0),
            Clock::Manual(clock) => clock.now(),
        }
    }
}
