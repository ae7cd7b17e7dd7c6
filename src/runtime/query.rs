//! The query: an operator graph per task, and the trigger loop.

use super::builder::QueryBuilder;
use super::task::{
    restore_thread_died, restore_watermark, PendingTask, RestoringTask, SideChain, Task,
    TaskCheckpoint, RESTORE_GRACE,
};
use super::{BatchRequest, DeadLetter, Decoder, Sink, Source, Trigger};
use crate::error::{Error, Result};
use crate::operators::{BatchContext, Operator, OutputMode};
use crate::progress::{QueryProgress, SinkProgress, SourceProgress};
use crate::record::Record;
use crate::row::{Row, Value};
use crate::time::{format_rfc3339, TimestampMicros};
use crate::watermark::WatermarkTracker;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// The id of a query named `name` when none is set: stable across runs
/// (a UUID v5 of the name), as Spark's id survives restarts of a query.
pub fn default_query_id(name: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

/// A built query: run it against a source and a sink.
pub struct Query {
    pub(super) id: String,
    pub(super) run_id: String,
    pub(super) builder: QueryBuilder,
    pub(super) stop: StopHandle,
}

/// Stops a running query from another thread, after the current batch.
#[derive(Debug, Clone, Default)]
pub struct StopHandle(Arc<AtomicBool>);

impl StopHandle {
    /// Asks the query to stop.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst)
    }
    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What a finished run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Batches run (data and no-data).
    pub batches: u64,
    /// Records read.
    pub input_records: u64,
    /// Rows written to the sink.
    pub output_rows: u64,
    /// Records sent to the dead-letter output.
    pub bad_records: u64,
}

/// What a batch did so far: one poll in micro-batch mode, every poll
/// since the last checkpoint in real-time mode.
struct OpenBatch {
    trigger_start: Instant,
    start_offsets: serde_json::Value,
    get_batch_ms: u64,
    add_batch_ms: u64,
    num_input: u64,
    num_output: u64,
    bad_records: u64,
    min_event_time: TimestampMicros,
    max_event_time: TimestampMicros,
    sum_event_time: i128,
    event_times: u64,
    event_time_progress: BTreeMap<String, TimestampMicros>,
    watermark_used: Option<TimestampMicros>,
    /// Joins: each stream's watermark (before the policy combines them).
    stream_watermarks: BTreeMap<String, TimestampMicros>,
    /// Real-time mode: milliseconds from each record's timestamp to its
    /// output handed to the sink.
    latency_ms: Option<hdrhistogram::Histogram<u64>>,
}

impl OpenBatch {
    fn new(start_offsets: serde_json::Value, real_time: bool) -> Self {
        OpenBatch {
            trigger_start: Instant::now(),
            start_offsets,
            get_batch_ms: 0,
            add_batch_ms: 0,
            num_input: 0,
            num_output: 0,
            bad_records: 0,
            min_event_time: i64::MAX,
            max_event_time: i64::MIN,
            sum_event_time: 0,
            event_times: 0,
            event_time_progress: BTreeMap::new(),
            watermark_used: None,
            stream_watermarks: BTreeMap::new(),
            latency_ms: real_time
                .then(|| hdrhistogram::Histogram::new_with_bounds(1, 3_600_000, 3).ok())
                .flatten(),
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
}

/// Real-time mode: how long a poll waits for records before operators are
/// given the time (rolling windows emit what left their ranges).
const REAL_TIME_TICK: Duration = Duration::from_millis(50);

/// Decodes JSON objects with types inferred (the default decoder).
struct InferJsonDecoder;

impl Decoder for InferJsonDecoder {
    fn decode(&mut self, record: &Record) -> Result<Row> {
        crate::decode::JsonDecoder::new(crate::schema::Schema::default()).decode(record)
    }
}

impl Query {
    /// Uses `handle` to stop this query: one handle can stop a query that a
    /// supervisor rebuilds after failures.
    pub fn with_stop_handle(mut self, handle: StopHandle) -> Self {
        self.stop = handle;
        self
    }

    /// A handle that stops this query after its current batch.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The query's stable id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The operator graph, one line per step (for `tidemark describe`).
    pub fn describe(&self) -> Vec<String> {
        let b = &self.builder;
        let mut lines = Vec::new();
        for (index, f) in b.steps.iter().enumerate() {
            for side in b.side_inputs.iter().filter(|s| s.join_at == index) {
                for step in &side.stream.steps {
                    lines.push(format!(
                        "[{}] {}",
                        side.stream.name,
                        step(b.output_mode).describe()
                    ));
                }
            }
            lines.push(f(b.output_mode).describe());
        }
        lines
    }

    /// The operators of a task for `partition`; with a state backend, each
    /// stateful operator gets its store (`op<index>`), restored when the
    /// pending task runs.
    fn pending_task(
        &self,
        partition: i32,
        backend: Option<&mut (dyn super::StateBackend + 'static)>,
    ) -> Result<PendingTask> {
        let b = &self.builder;
        let operators: Vec<Box<dyn Operator>> = b.steps.iter().map(|f| f(b.output_mode)).collect();
        let mut stores = Vec::new();
        let mut cache_bytes = None;
        if let Some(backend) = backend {
            cache_bytes = backend.cache_bytes();
            for (index, op) in operators.iter().enumerate() {
                if op.is_stateful() {
                    stores.push((
                        index,
                        backend.open_deferred(partition, &format!("op{index}"))?,
                    ));
                }
            }
        }
        Ok(PendingTask {
            operators,
            stores,
            cache_bytes,
        })
    }

    /// A task around restored operators.
    fn task_of(&self, operators: Vec<Box<dyn Operator>>) -> Task {
        let b = &self.builder;
        let side_chains = b
            .side_inputs
            .iter()
            .map(|side| SideChain {
                input: side.input,
                join_at: side.join_at,
                operators: side.stream.steps.iter().map(|f| f(b.output_mode)).collect(),
            })
            .collect();
        Task {
            operators,
            side_chains,
            watermark: b.watermark.map(|d| {
                let mut tracker = WatermarkTracker::new(
                    d.as_micros() as i64,
                    b.policy,
                    b.idle_timeout.map(|t| t.as_micros() as i64),
                );
                if !b.side_inputs.is_empty() {
                    tracker.expect_stream(&b.main_stream);
                    for side in b.side_inputs.iter().filter(|s| !s.stream.table) {
                        tracker.expect_stream(&side.stream.name);
                    }
                }
                tracker
            }),
        }
    }

    /// Which input a record of `topic` belongs to: 0 for the main stream,
    /// else the join's second stream reading that topic.
    fn input_of(&self, topic: &str) -> usize {
        self.builder
            .side_inputs
            .iter()
            .find(|s| s.stream.topics.iter().any(|t| t == topic))
            .map_or(0, |s| s.input)
    }

    fn has_table_inputs(&self) -> bool {
        self.builder.side_inputs.iter().any(|s| s.stream.table)
    }

    fn is_table_input(&self, input: usize) -> bool {
        input > 0 && self.builder.side_inputs[input - 1].stream.table
    }

    /// The event-time column, stream name and watermark delay of `input`.
    fn input_time(&self, input: usize) -> (Option<Arc<str>>, Option<Arc<str>>, Option<i64>) {
        let b = &self.builder;
        match input {
            0 if b.side_inputs.iter().all(|s| s.stream.table) => (b.event_time.clone(), None, None),
            0 => (b.event_time.clone(), Some(b.main_stream.clone()), None),
            i if b.side_inputs[i - 1].stream.table => (None, None, None),
            i => {
                let side = &b.side_inputs[i - 1].stream;
                (
                    side.event_time.clone(),
                    Some(side.name.clone()),
                    side.watermark.map(|d| d.as_micros() as i64),
                )
            }
        }
    }

    /// Runs until the source is exhausted (available-now) or
    /// [`StopHandle::stop`] is called.
    pub fn run(mut self, source: &mut dyn Source, sink: &mut dyn Sink) -> Result<RunSummary> {
        let mut decoder = self
            .builder
            .decoder
            .take()
            .unwrap_or_else(|| Box::new(InferJsonDecoder));
        let mut dead_letter = self
            .builder
            .dead_letter
            .take()
            .unwrap_or_else(|| Box::new(super::LogDeadLetter::default()));
        // Checked here, not at build: `describe` builds without connecting.
        if let Some(t) = self.builder.global_tables.iter().find(|t| t.feed.is_none()) {
            return Err(Error::config(
                "table_join.global",
                format!("the global table `{}` has no feed to read it from", t.name),
            ));
        }
        let mut listeners = std::mem::take(&mut self.builder.listeners);
        let mut late_data = self.builder.late_data.take();
        let mut state_backend = self.builder.state_backend.take();
        let collect_late = late_data.is_some();
        let extractor = self.builder.event_time_extractor.clone();
        let mut tasks: BTreeMap<i32, Task> = BTreeMap::new();
        let mut restoring: BTreeMap<i32, RestoringTask> = BTreeMap::new();
        // Watermarks of partitions whose tasks have not started yet.
        let mut saved_checkpoints: BTreeMap<i32, String> = BTreeMap::new();
        let restores_in_background = state_backend.is_some() && self.builder.stateful_steps > 0;
        let mut summary = RunSummary::default();
        let mut batch_id: u64 = 0;
        let mut previous_trigger_start: Option<Instant> = None;
        let available_now = self.builder.trigger == Trigger::AvailableNow;
        let (interval, checkpoint_interval) = match self.builder.trigger {
            Trigger::MicroBatch { interval } => (interval, None),
            Trigger::AvailableNow => (Duration::from_millis(200), None),
            Trigger::RealTime {
                checkpoint_interval,
            } => (REAL_TIME_TICK, Some(checkpoint_interval)),
        };
        let real_time = checkpoint_interval.is_some();
        // The batch replayed for the sink runs even without input rows: its
        // output (a watermark's closed windows) is what the sink holds.
        let mut replaying: Option<u64> = None;
        if let Some((committed, end)) = sink.recovered_batch()? {
            // Batch ids continue where the sink's record ends; the batch the
            // sink holds but the source did not commit runs again with its
            // own id, over exactly its input, and the sink skips it.
            batch_id = committed + 1;
            if source.replay_until(committed, &end)? {
                tracing::info!(
                    batch_id = committed,
                    "replaying a batch the sink already committed"
                );
                batch_id = committed;
                replaying = Some(committed);
            }
        }
        let event_time = self.builder.event_time.clone();
        let mut exhausted = false;
        let mut open_batch: Option<OpenBatch> = None;

        // A stop ends the loop between batches; a real-time batch that is
        // open runs one more poll and checkpoints first.
        while !self.stop.is_stopped() || open_batch.is_some() {
            if open_batch.is_none() {
                if let Some(backend) = state_backend.as_mut() {
                    backend.between_batches()?;
                }
                for table in self.builder.global_tables.iter_mut() {
                    summary.bad_records +=
                        table.catch_up(decoder.as_mut(), dead_letter.as_mut())?;
                }
            }
            let open =
                open_batch.get_or_insert_with(|| OpenBatch::new(source.offsets(), real_time));
            let trigger_start = open.trigger_start;
            let (batch, get_batch_ms) = if exhausted {
                (
                    super::SourceBatch {
                        exhausted: true,
                        ..Default::default()
                    },
                    0,
                )
            } else {
                let request = BatchRequest {
                    deadline: if real_time {
                        Instant::now() + interval
                    } else {
                        trigger_start + interval
                    },
                    max_records: self.builder.max_records_per_batch,
                    available_now,
                    return_early: real_time,
                };
                let t = Instant::now();
                let batch = source.next_batch(&request)?;
                if real_time && batch.records.is_empty() && !batch.exhausted {
                    // A source with nothing may answer at once (files):
                    // wait out the poll rather than spin.
                    if let Some(rest) = request.deadline.checked_duration_since(Instant::now()) {
                        std::thread::sleep(rest);
                    }
                }
                (batch, t.elapsed().as_millis() as u64)
            };
            exhausted |= batch.exhausted;
            for p in &batch.revoked_partitions {
                saved_checkpoints.remove(p);
                // A restore in flight still writes the task's files: let it
                // end before the backend closes them.
                let was_restoring = match restoring.remove(p) {
                    Some(r) => r.wait().map(|_| true)?,
                    None => false,
                };
                if tasks.remove(p).is_some() || was_restoring {
                    tracing::info!(partition = p, "partition revoked; task closed");
                    if let Some(backend) = state_backend.as_mut() {
                        backend.close(*p)?;
                    }
                }
            }
            for (partition, checkpoint) in &batch.restored_checkpoints {
                match tasks.get_mut(partition) {
                    Some(task) => restore_watermark(task, *partition, checkpoint),
                    None => {
                        saved_checkpoints.insert(*partition, checkpoint.clone());
                    }
                }
            }
            // Tasks start when their partition first delivers records. A
            // restore that outlasts the grace period goes on in the
            // background, its partition held back by the source, while the
            // other tasks process this batch.
            // A partition handed back with a checkpoint starts its task at
            // once too, records or not: after a restart its watermark may
            // already have moved, and the no-data batch that evicts (and
            // writes closed windows, outer join rows) must not wait for
            // new input.
            let resumed = batch
                .restored_checkpoints
                .iter()
                .map(|(p, _)| *p)
                .filter(|_| self.builder.stateful_steps > 0);
            let new_partitions: std::collections::BTreeSet<i32> = batch
                .records
                .iter()
                .map(|r| r.position.partition)
                .chain(resumed)
                .filter(|p| !tasks.contains_key(p) && !restoring.contains_key(p))
                .collect();
            for partition in new_partitions {
                if restores_in_background {
                    let pending = self.pending_task(partition, state_backend.as_deref_mut())?;
                    restoring.insert(partition, RestoringTask::start(partition, pending)?);
                } else {
                    let mut task = self.task_of(self.pending_task(partition, None)?.restore()?);
                    if let Some(checkpoint) = saved_checkpoints.remove(&partition) {
                        restore_watermark(&mut task, partition, &checkpoint);
                    }
                    tasks.insert(partition, task);
                }
            }
            let grace_end = Instant::now() + RESTORE_GRACE;
            let restoring_partitions: Vec<i32> = restoring.keys().copied().collect();
            for partition in restoring_partitions {
                let Some(pending) = restoring.get_mut(&partition) else {
                    continue;
                };
                let wait = grace_end.saturating_duration_since(Instant::now());
                let outcome = match pending.done.recv_timeout(wait) {
                    Ok(result) => Some(result),
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        Some(Err(restore_thread_died()))
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) if pending.held => None,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        // A replayed batch must hold exactly its recorded
                        // input: it waits for its restores.
                        let replay_batch = replaying == Some(batch_id);
                        if !replay_batch && source.hold(partition)? {
                            pending.held = true;
                            tracing::info!(
                                partition,
                                "task restoring; its partition waits while the others go on"
                            );
                            None
                        } else {
                            Some(
                                pending
                                    .done
                                    .recv()
                                    .unwrap_or_else(|_| Err(restore_thread_died())),
                            )
                        }
                    }
                };
                let Some(result) = outcome else {
                    continue;
                };
                let held = restoring.remove(&partition).is_some_and(|r| r.held);
                let mut task = self.task_of(result?);
                if let Some(checkpoint) = saved_checkpoints.remove(&partition) {
                    restore_watermark(&mut task, partition, &checkpoint);
                }
                tasks.insert(partition, task);
                if held {
                    tracing::info!(partition, "task restored; its partition resumes");
                    source.release(partition)?;
                }
            }
            metrics::gauge!("tidemark_tasks_restoring").set(restoring.len() as f64);
            // Held records are read again: the input is not done with.
            exhausted &= restoring.is_empty();
            // Spark runs a no-data batch only for stateful operators that
            // evict by watermark: append and update mode, not complete.
            let evicts_by_watermark =
                self.builder.stateful_steps > 0 && self.builder.output_mode != OutputMode::Complete;
            let watermark_pending = evicts_by_watermark
                && tasks.values().any(|t| {
                    t.watermark
                        .as_ref()
                        .is_some_and(|w| w.in_effect() != w.late_threshold())
                });
            let has_records = batch
                .records
                .iter()
                .any(|r| !restoring.contains_key(&r.position.partition));
            let timers_due = !has_records
                && !real_time
                && tasks.values().any(|t| {
                    let contexts = t.contexts(
                        batch_id,
                        self.builder.clock.batch_time(batch_id),
                        collect_late,
                        real_time,
                    );
                    t.operators
                        .iter()
                        .zip(&contexts)
                        .any(|(op, ctx)| op.wants_batch(ctx))
                });
            let replay_due = replaying.take_if(|b| *b == batch_id).is_some();
            if !has_records && !watermark_pending && !timers_due && !real_time && !replay_due {
                if exhausted {
                    break;
                }
                open_batch = None;
                continue;
            }

            // ---- process the batch
            let processing_time = if real_time {
                crate::time::now_micros()
            } else {
                self.builder.clock.batch_time(batch_id)
            };
            let add_batch_start = Instant::now();
            let mut outputs: Vec<Row> = Vec::new();
            let mut bad_records = 0u64;
            let (mut min_et, mut max_et, mut sum_et, mut n_et) = (i64::MAX, i64::MIN, 0i128, 0u64);
            let mut held_records = 0u64;
            let num_input = batch.records.len() as u64;
            let mut contexts: BTreeMap<i32, Vec<BatchContext>> = BTreeMap::new();
            let mut batch_max_event_time: BTreeMap<(Arc<str>, i32), TimestampMicros> =
                BTreeMap::new();
            let joins = !self.builder.side_inputs.is_empty();
            let mut markers = 0u64;
            // A table's updates come first in a batch: its rows look up the
            // table as of the batch's input.
            let tables_first: Vec<&Record> = if self.has_table_inputs() {
                let (tables, rest): (Vec<&Record>, Vec<&Record>) = batch
                    .records
                    .iter()
                    .partition(|r| self.is_table_input(self.input_of(&r.position.topic)));
                tables.into_iter().chain(rest).collect()
            } else {
                batch.records.iter().collect()
            };
            for record in tables_first {
                let partition = record.position.partition;
                let Some(task) = tasks.get_mut(&partition) else {
                    // Its task is restoring: the source delivers the record
                    // again once the partition is released.
                    held_records += 1;
                    continue;
                };
                if self.builder.watermark_from_markers {
                    if let Some(marker) = super::WatermarkMarker::of_record(record) {
                        markers += 1;
                        match marker {
                            Ok(m) => {
                                // A repartitioned join's streams arrive
                                // on their own topics: each origin counts
                                // for its stream, with its delay.
                                let (_, stream, delay) = self.input_time(if joins {
                                    self.input_of(&record.position.topic)
                                } else {
                                    0
                                });
                                if let Some(w) = task.watermark.as_mut() {
                                    for origin in &m.origins {
                                        w.register_stream(
                                            origin,
                                            stream.as_deref(),
                                            delay,
                                            processing_time,
                                        );
                                    }
                                    w.observe_stream(
                                        &m.origin,
                                        stream.as_deref(),
                                        delay,
                                        m.max_event_time,
                                        processing_time,
                                    );
                                }
                            }
                            Err(error) => {
                                bad_records += 1;
                                dead_letter.send(record, &error)?;
                            }
                        }
                        continue;
                    }
                }
                let ctx = contexts.entry(partition).or_insert_with(|| {
                    task.contexts(batch_id, processing_time, collect_late, real_time)
                });
                let input = if joins {
                    self.input_of(&record.position.topic)
                } else {
                    0
                };
                // The main stream's column by reference: no per-record
                // reference counting outside joins.
                let side_event_time;
                let event_time = if input == 0 {
                    &event_time
                } else {
                    side_event_time = self.input_time(input).0;
                    &side_event_time
                };
                if record.value.is_none() && input > 0 && self.is_table_input(input) {
                    let result = match record.key.as_deref() {
                        Some(key) => task.push_tombstone(input, key),
                        None => Err(Error::BadRecord {
                            position: record.position.clone(),
                            field: "<key>".into(),
                            reason: "a table tombstone without a key deletes nothing".into(),
                        }),
                    };
                    if let Err(error) = result {
                        bad_records += 1;
                        dead_letter.send(record, &error)?;
                    }
                    continue;
                }
                let result = decoder.decode(record).and_then(|mut row| {
                    if let Some(column) = event_time {
                        if let Some(extract) = &extractor {
                            if let Some(t) = extract(&row) {
                                row.set(column.clone(), Value::Timestamp(t));
                            }
                        }
                        let t = event_time_of(&row, column).map_err(|reason| Error::BadRecord {
                            position: record.position.clone(),
                            field: column.to_string(),
                            reason,
                        })?;
                        // Normalise RFC 3339 strings and epoch millis so
                        // that every operator sees a timestamp.
                        row.set(column.clone(), Value::Timestamp(t));
                        min_et = min_et.min(t);
                        max_et = max_et.max(t);
                        sum_et += t as i128;
                        n_et += 1;
                        {
                            let slot = batch_max_event_time
                                .entry((record.position.topic.clone(), partition))
                                .or_insert(t);
                            *slot = (*slot).max(t);
                        }
                    }
                    let pushed = if input == 0 {
                        task.push(0, vec![row], ctx, &mut outputs)
                    } else {
                        task.push_input(input, row, ctx, &mut outputs)
                    };
                    pushed.map_err(|e| match e {
                        Error::BadRecord { .. } => e,
                        other => Error::BadRecord {
                            position: record.position.clone(),
                            field: "<step>".into(),
                            reason: other.to_string(),
                        },
                    })
                });
                if let Err(error) = result {
                    bad_records += 1;
                    dead_letter.send(record, &error)?;
                }
            }
            // Markers carry progress, not rows.
            let num_input = num_input - markers - held_records;
            let mut event_time_progress: BTreeMap<String, TimestampMicros> = BTreeMap::new();
            for ((topic, partition), t) in &batch_max_event_time {
                let input = source.watermark_input(topic, *partition);
                if !self.builder.watermark_from_markers {
                    if let Some(w) = tasks
                        .get_mut(partition)
                        .and_then(|task| task.watermark.as_mut())
                    {
                        let (_, stream, delay) =
                            self.input_time(if joins { self.input_of(topic) } else { 0 });
                        w.observe_stream(&input, stream.as_deref(), delay, *t, processing_time);
                    }
                }
                event_time_progress.insert(input, *t);
            }
            let mut late_rows = Vec::new();
            let mut watermark_used: Option<TimestampMicros> = None;
            let mut stream_watermarks: BTreeMap<String, TimestampMicros> = BTreeMap::new();
            for (partition, task) in tasks.iter_mut() {
                let task_contexts = contexts.remove(partition).unwrap_or_else(|| {
                    task.contexts(batch_id, processing_time, collect_late, real_time)
                });
                task.finish_batch(&task_contexts, &mut outputs)?;
                let ctx = task_contexts[0];
                if let Some(w) = task.watermark.as_ref().filter(|_| joins) {
                    for (stream, watermark) in w.stream_watermarks() {
                        let slot = stream_watermarks.entry(stream).or_insert(watermark);
                        *slot = (*slot).min(watermark);
                    }
                }
                if task.watermark.is_some() {
                    watermark_used =
                        Some(watermark_used.map_or(ctx.watermark, |w: i64| w.min(ctx.watermark)));
                }
                for op in task.operators.iter_mut() {
                    late_rows.extend(op.take_late_rows());
                }
                if let Some(w) = task.watermark.as_mut() {
                    w.finish_batch(processing_time);
                }
            }
            sink.write(batch_id, &outputs)?;
            if let Some(late) = late_data.as_mut() {
                late.write(batch_id, &late_rows)?;
            }
            let add_batch_ms = add_batch_start.elapsed().as_millis() as u64;
            if let Some(h) = open.latency_ms.as_mut() {
                let now_ms = crate::time::now_micros() / 1000;
                for record in &batch.records {
                    if let Some(t) = record.timestamp_ms {
                        let _ = h.record((now_ms - t).max(0) as u64);
                    }
                }
            }
            open.get_batch_ms += get_batch_ms;
            open.add_batch_ms += add_batch_ms;
            open.num_input += num_input;
            open.num_output += outputs.len() as u64;
            open.bad_records += bad_records;
            open.min_event_time = open.min_event_time.min(min_et);
            open.max_event_time = open.max_event_time.max(max_et);
            open.sum_event_time += sum_et;
            open.event_times += n_et;
            for (input, t) in event_time_progress {
                let slot = open.event_time_progress.entry(input).or_insert(t);
                *slot = (*slot).max(t);
            }
            if watermark_used.is_some() {
                open.watermark_used = watermark_used;
            }
            if !stream_watermarks.is_empty() {
                open.stream_watermarks = stream_watermarks;
            }
            let checkpoint_due = match checkpoint_interval {
                None => true,
                Some(every) => {
                    trigger_start.elapsed() >= every || self.stop.is_stopped() || exhausted
                }
            };
            if !checkpoint_due {
                continue;
            }
            let Some(open) = open_batch.take() else {
                continue;
            };
            let (num_input, bad_records) = (open.num_input, open.bad_records);
            let mut state_operators = Vec::new();
            for task in tasks.values_mut() {
                for op in task.operators.iter_mut() {
                    if let Some(p) = op.state_progress() {
                        state_operators.push(p);
                    }
                }
            }
            let mut state_operators = merge_state_progress(state_operators);
            if let (Some(backend), Some(first)) =
                (state_backend.as_mut(), state_operators.first_mut())
            {
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

            // ---- commit: sink, dead letters, then source offsets
            let commit_start = Instant::now();
            // State first: its changelog is acknowledged before the offsets
            // that produced it are committed.
            for task in tasks.values_mut() {
                for op in task.operators.iter_mut() {
                    op.checkpoint()?;
                }
            }
            if let Some(backend) = state_backend.as_mut() {
                backend.commit()?;
            }
            tracing::debug!(
                batch_id,
                outputs = open.num_output,
                tasks = tasks.len(),
                "batch committing"
            );
            sink.event_time_progress(&open.event_time_progress);
            sink.source_offsets(&source.offsets());
            sink.commit(batch_id)?;
            crash_point("after_sink_commit", batch_id);
            if let Some(late) = late_data.as_mut() {
                late.commit(batch_id)?;
            }
            dead_letter.flush()?;
            let checkpoints: BTreeMap<i32, String> = tasks
                .iter()
                .filter_map(|(p, t)| {
                    let checkpoint = TaskCheckpoint {
                        batch_id,
                        watermark: t.watermark.clone()?,
                    };
                    Some((*p, serde_json::to_string(&checkpoint).ok()?))
                })
                .collect();
            match source.commit(&checkpoints) {
                Err(Error::BatchAborted(reason)) if source.rewind()? => {
                    // Tasks are rebuilt from their stores' changelogs and
                    // the committed checkpoints, as after a rebalance.
                    tracing::warn!(batch_id, %reason, "batch aborted; replaying from the last commit");
                    metrics::counter!("tidemark_batches_aborted_total").increment(1);
                    tasks.clear();
                    continue;
                }
                other => other?,
            }
            let commit_ms = commit_start.elapsed().as_millis() as u64;

            // ---- progress
            let trigger_ms = trigger_start.elapsed().as_millis() as u64;
            let since_previous = previous_trigger_start
                .map(|p| trigger_start.duration_since(p).as_secs_f64())
                .unwrap_or(0.0);
            previous_trigger_start = Some(trigger_start);
            let input_rate = if since_previous > 0.0 {
                num_input as f64 / since_previous
            } else {
                0.0
            };
            let processed_rate = if trigger_ms > 0 {
                num_input as f64 * 1000.0 / trigger_ms as f64
            } else {
                num_input as f64 * 1000.0
            };
            let mut event_time_stats = BTreeMap::new();
            if open.event_times > 0 {
                event_time_stats.insert("min".into(), format_rfc3339(open.min_event_time));
                event_time_stats.insert("max".into(), format_rfc3339(open.max_event_time));
                event_time_stats.insert(
                    "avg".into(),
                    format_rfc3339((open.sum_event_time / open.event_times as i128) as i64),
                );
            }
            if let Some(w) = open.watermark_used {
                event_time_stats.insert("watermark".into(), format_rfc3339(w));
            }
            let mut source_metrics = BTreeMap::new();
            if let Some(lag) = source.lag() {
                source_metrics.insert("offsetsBehindLatest".into(), lag.to_string());
            }
            let progress = QueryProgress {
                id: self.id.clone(),
                run_id: self.run_id.clone(),
                name: self.builder.name.clone(),
                timestamp: format_rfc3339(crate::time::now_micros() / 1000 * 1000),
                batch_id,
                num_input_rows: num_input,
                input_rows_per_second: input_rate,
                processed_rows_per_second: processed_rate,
                duration_ms: [
                    ("triggerExecution".to_string(), trigger_ms),
                    ("getBatch".to_string(), open.get_batch_ms),
                    ("addBatch".to_string(), open.add_batch_ms),
                    ("commitOffsets".to_string(), commit_ms),
                ]
                .into_iter()
                .collect(),
                event_time: event_time_stats,
                state_operators,
                sources: vec![SourceProgress {
                    description: source.describe(),
                    start_offset: open.start_offsets.clone(),
                    end_offset: source.offsets(),
                    num_input_rows: num_input,
                    input_rows_per_second: input_rate,
                    processed_rows_per_second: processed_rate,
                    num_bad_records: bad_records,
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
            };
            progress.record_metrics();
            tracing::debug!(progress = %progress.json(), "batch done");
            for listener in listeners.iter_mut() {
                listener.on_progress(&progress);
            }
            summary.batches += 1;
            summary.input_records += num_input;
            summary.output_rows += open.num_output;
            summary.bad_records += bad_records;
            batch_id += 1;

            if real_time && exhausted {
                // A bounded input (files, tests) ends after its checkpoint.
                break;
            }
            if !available_now && !real_time {
                if let Some(rest) =
                    (trigger_start + interval).checked_duration_since(Instant::now())
                {
                    // A source returns early only when it has nothing more;
                    // wait out the interval so batches keep their cadence.
                    if batch.records.is_empty() {
                        std::thread::sleep(rest.min(interval));
                    }
                }
            }
        }
        // Every batch so far committed: tasks close in step with their
        // changelogs.
        let mut partitions: Vec<i32> = tasks.keys().copied().collect();
        drop(tasks);
        for (partition, pending) in std::mem::take(&mut restoring) {
            pending.wait()?;
            partitions.push(partition);
        }
        if let Some(backend) = state_backend.as_mut() {
            for partition in partitions {
                backend.close(partition)?;
            }
        }
        Ok(summary)
    }
}

fn event_time_of(row: &Row, column: &str) -> std::result::Result<TimestampMicros, String> {
    match row.get(column) {
        Some(Value::Timestamp(t)) => Ok(*t),
        Some(Value::Long(ms)) => ms
            .checked_mul(1000)
            .ok_or_else(|| "epoch milliseconds out of range".to_string()),
        Some(Value::Str(s)) => crate::time::parse_rfc3339(s).ok_or_else(|| {
            format!("expected an RFC 3339 timestamp or epoch milliseconds, got `{s}`")
        }),
        Some(Value::Null) | None => Err("the event-time column is missing or null".into()),
        Some(other) => Err(format!("expected a timestamp, got {}", other.type_name())),
    }
}

/// Sums the per-task reports of the same operator into one entry, as Spark
/// sums its per-partition state store metrics.
fn merge_state_progress(
    reports: Vec<crate::progress::StateOperatorProgress>,
) -> Vec<crate::progress::StateOperatorProgress> {
    let mut merged: Vec<crate::progress::StateOperatorProgress> = Vec::new();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::AggregateSpec;
    use crate::runtime::testing::{CollectSink, VecSource};
    use crate::window::WindowSpec;

    /// A query counting rows per `k` in `window` over event time `t` with
    /// `delay` as watermark, available-now: what most tests here build.
    fn counting(name: &str, delay: &str, window: WindowSpec) -> QueryBuilder {
        Query::builder(name)
            .event_time("t")
            .watermark(delay)
            .unwrap()
            .window_aggregate(["k"], window, vec![AggregateSpec::count()])
            .trigger(Trigger::AvailableNow)
    }

    #[test]
    fn behind_a_repartition_the_watermark_follows_markers_not_rows() {
        use crate::record::{Record, SourcePosition};
        use crate::runtime::{WatermarkMarker, WATERMARK_MARKER_HEADER};
        let origins = vec!["in/0".to_string(), "in/1".to_string()];
        let at = |offset: i64| SourcePosition::new("in-repartition", 0, offset);
        let row = |offset, t: &str| Record {
            value: Some(format!(r#"{{"k": "a", "t": "2026-01-01T{t}:00Z"}}"#).into_bytes()),
            position: at(offset),
            ..Default::default()
        };
        let marker = |offset, origin: &str, t: &str| Record {
            value: Some(
                WatermarkMarker {
                    origin: origin.into(),
                    max_event_time: crate::time::parse_rfc3339(&format!("2026-01-01T{t}:00Z"))
                        .unwrap(),
                    origins: origins.clone(),
                }
                .encode(),
            ),
            headers: vec![(WATERMARK_MARKER_HEADER.into(), b"1".to_vec())],
            position: at(offset),
            ..Default::default()
        };
        // Input partition 0 runs ahead to 10:10; partition 1's row at 10:00
        // comes a batch later. Rows alone would have made it late.
        let mut source = VecSource::record_batches(vec![
            vec![row(0, "10:10"), marker(1, "in/0", "10:10")],
            vec![row(2, "10:00"), marker(3, "in/1", "10:10")],
        ]);
        let mut sink = CollectSink::default();
        let summary = counting(
            "markers",
            "1 minute",
            WindowSpec::tumbling("1 minute").unwrap(),
        )
        .watermark_from_markers()
        .build()
        .unwrap()
        .run(&mut source, &mut sink)
        .unwrap();
        let starts: Vec<String> = sink
            .rows
            .iter()
            .map(|r| r.get("window_start").unwrap().to_string())
            .collect();
        assert_eq!(starts, vec!["2026-01-01T10:00:00Z"], "{:?}", sink.rows);
        assert_eq!(sink.rows[0].get("count"), Some(&Value::Long(1)));
        assert_eq!(summary.input_records, 2, "markers are not input rows");
    }

    #[test]
    fn real_time_mode_emits_update_rows_per_poll_and_checkpoints_on_the_interval() {
        // Three polls' worth of records; the checkpoint interval is long,
        // so all three land in one batch, reported and committed once.
        let mut source = VecSource::json_batches(vec![
            vec![r#"{"k": "a", "t": "2026-01-01T10:00:00Z"}"#],
            vec![
                r#"{"k": "a", "t": "2026-01-01T10:00:10Z"}"#,
                r#"{"k": "b", "t": "2026-01-01T10:00:20Z"}"#,
            ],
            vec![r#"{"k": "a", "t": "2026-01-01T10:00:30Z"}"#],
        ]);
        let mut sink = CollectSink::default();
        let reports = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = reports.clone();
        let query = counting("rt", "1 minute", WindowSpec::tumbling("1 minute").unwrap())
            .output_mode(OutputMode::Update)
            .trigger(Trigger::RealTime {
                checkpoint_interval: Duration::from_secs(3600),
            })
            .on_progress(move |p: &QueryProgress| seen.lock().unwrap().push(p.clone()))
            .build()
            .unwrap();
        // The input ends after three polls: the batch checkpoints and the
        // query stops.
        let summary = query.run(&mut source, &mut sink).unwrap();
        // Update mode per poll: a=1; then a=2, b=1; then a=3.
        let counts: Vec<(String, i64)> = sink
            .rows
            .iter()
            .map(|r| {
                let Some(Value::Long(n)) = r.get("count") else {
                    panic!("{r:?}")
                };
                (r.get("k").unwrap().to_string(), *n)
            })
            .collect();
        let expected = [("a", 1), ("a", 2), ("b", 1), ("a", 3)]
            .map(|(k, n)| (k.to_string(), n))
            .to_vec();
        assert_eq!(counts, expected);
        assert!(sink.batch_ids.iter().all(|b| *b == 0), "one batch");
        assert_eq!(sink.committed, vec![0], "one checkpoint, at the end");
        assert_eq!(summary.input_records, 4);
        let reports = reports.lock().unwrap();
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].num_input_rows, 4);
        assert_eq!(source.committed(), 4, "every record committed");
    }

    #[derive(serde::Deserialize, serde::Serialize)]
    struct Order {
        id: String,
        amount: f64,
    }

    #[derive(serde::Deserialize, serde::Serialize)]
    struct Cents {
        id: String,
        cents: i64,
    }

    #[test]
    fn typed_steps_map_filter_and_send_mismatches_to_dead_letters() {
        let query = Query::builder("typed")
            .filter_typed(|o: &Order| o.amount > 1.0)
            .map_typed(|o: Order| Cents {
                id: o.id.to_uppercase(),
                cents: (o.amount * 100.0) as i64,
            })
            .flat_map_typed(|c: Cents| vec![c])
            .trigger(Trigger::AvailableNow)
            .build()
            .unwrap();
        let mut source = VecSource::json_batches(vec![vec![
            r#"{"id": "a", "amount": 2.5}"#,
            r#"{"id": "b", "amount": 0.5}"#,
            r#"{"id": "c", "amount": "not a number"}"#,
        ]]);
        let mut sink = CollectSink::default();
        let summary = query.run(&mut source, &mut sink).unwrap();
        assert_eq!(summary.bad_records, 1);
        assert_eq!(sink.rows.len(), 1);
        assert_eq!(
            sink.rows[0].to_json(),
            serde_json::json!({"id": "A", "cents": 250})
        );
        assert_eq!(source.committed(), 3, "offsets commit after the sink");
    }

    #[test]
    fn watermark_is_checkpointed_with_offsets_and_restored() {
        let build = || {
            counting(
                "restore",
                "1 minute",
                WindowSpec::tumbling("1 minute").unwrap(),
            )
            .build()
            .unwrap()
        };
        let mut first =
            VecSource::json_batches(vec![vec![r#"{"t": "2026-01-01T00:10:00Z", "k": "a"}"#]]);
        build()
            .run(&mut first, &mut CollectSink::default())
            .unwrap();
        let saved = first.checkpoints().clone();
        assert!(saved[&0].contains("in_effect"), "{saved:?}");
        // After a restart the old watermark (00:09) holds: a row for the
        // 00:05 window is late at once instead of being counted.
        let mut second = VecSource::json_batches(vec![
            vec![r#"{"t": "2026-01-01T00:05:00Z", "k": "a"}"#],
            vec![r#"{"t": "2026-01-01T00:05:30Z", "k": "a"}"#],
        ])
        .restoring(saved);
        let mut sink = CollectSink::default();
        let dropped = Arc::new(std::sync::Mutex::new(0u64));
        let seen = dropped.clone();
        let query = build();
        let mut query_with_listener = query;
        query_with_listener
            .builder
            .listeners
            .push(Box::new(move |p: &QueryProgress| {
                *seen.lock().unwrap() += p
                    .state_operators
                    .iter()
                    .map(|s| s.num_rows_dropped_by_watermark)
                    .sum::<u64>();
            }));
        query_with_listener.run(&mut second, &mut sink).unwrap();
        assert_eq!(
            *dropped.lock().unwrap(),
            2,
            "both rows late against the restored watermark"
        );
        assert!(sink.rows.is_empty());
    }

    #[test]
    fn update_mode_emits_groups_touched_even_when_they_close_in_the_batch() {
        let query = counting(
            "update",
            "0 seconds",
            WindowSpec::tumbling("1 minute").unwrap(),
        )
        .output_mode(OutputMode::Update)
        .build()
        .unwrap();
        let mut source = VecSource::json_batches(vec![
            vec![
                r#"{"t": "2026-01-01T00:00:30Z", "k": "a"}"#,
                r#"{"t": "2026-01-01T00:05:00Z", "k": "a"}"#,
            ],
            // Watermark 00:05 in effect, late threshold 0: the 00:00 window
            // takes the row, is written, and is evicted in this batch.
            vec![r#"{"t": "2026-01-01T00:00:40Z", "k": "a"}"#],
            // Now late: its window ended at or before the previous watermark.
            vec![r#"{"t": "2026-01-01T00:00:50Z", "k": "a"}"#],
        ]);
        let mut sink = CollectSink::default();
        let summary = query.run(&mut source, &mut sink).unwrap();
        assert_eq!(summary.batches, 3);
        let counts: Vec<(u64, i64)> = sink
            .rows
            .iter()
            .zip(&sink.batch_ids)
            .filter(|(r, _)| {
                r.get("window_start")
                    == Some(&Value::Timestamp(
                        crate::time::parse_rfc3339("2026-01-01T00:00:00Z").unwrap(),
                    ))
            })
            .map(|(r, b)| {
                (
                    *b,
                    if let Some(Value::Long(n)) = r.get("count") {
                        *n
                    } else {
                        -1
                    },
                )
            })
            .collect();
        assert_eq!(counts, vec![(0, 1), (1, 2)], "{:?}", sink.rows);
    }

    #[test]
    fn window_state_survives_a_restart_through_the_state_backend() {
        let build = |backend: Option<crate::runtime::InMemoryStateBackend>| {
            let mut b = counting(
                "durable",
                "1 minute",
                WindowSpec::tumbling("1 minute").unwrap(),
            );
            if let Some(backend) = backend {
                b = b.state_backend(backend);
            }
            b.build().unwrap()
        };
        let first_half = || {
            VecSource::json_batches(vec![vec![
                r#"{"t": "2026-01-01T00:00:10Z", "k": "a"}"#,
                r#"{"t": "2026-01-01T00:00:20Z", "k": "a"}"#,
                r#"{"t": "2026-01-01T00:00:30Z", "k": "b"}"#,
            ]])
        };
        let second_half = |checkpoints| {
            VecSource::json_batches(vec![vec![
                r#"{"t": "2026-01-01T00:00:40Z", "k": "a"}"#,
                r#"{"t": "2026-01-01T00:05:00Z", "k": "a"}"#,
            ]])
            .restoring(checkpoints)
        };
        let counts = |sink: &CollectSink| -> Vec<(String, Value)> {
            sink.rows
                .iter()
                .map(|r| {
                    (
                        r.get("k").unwrap().to_string(),
                        r.get("count").unwrap().clone(),
                    )
                })
                .collect()
        };

        let backend = crate::runtime::InMemoryStateBackend::default();
        let mut source = first_half();
        build(Some(backend.clone()))
            .run(&mut source, &mut CollectSink::default())
            .unwrap();
        let mut sink = CollectSink::default();
        let restored = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = restored.clone();
        counting(
            "durable",
            "1 minute",
            WindowSpec::tumbling("1 minute").unwrap(),
        )
        .state_backend(backend)
        .on_progress(move |p: &crate::progress::QueryProgress| {
            let metrics = &p.state_operators[0].custom_metrics;
            seen.lock()
                .unwrap()
                .push(metrics.get("numRestoredRecords").copied());
        })
        .build()
        .unwrap()
        .run(&mut second_half(source.checkpoints().clone()), &mut sink)
        .unwrap();
        // The first batch reports the keys restored (a and b, plus their
        // expiry index entries), later ones nothing.
        let restored = restored.lock().unwrap().clone();
        assert_eq!(restored.first(), Some(&Some(4)), "{restored:?}");
        assert!(restored[1..].iter().all(Option::is_none), "{restored:?}");
        assert_eq!(
            counts(&sink),
            vec![
                ("a".to_string(), Value::Long(3)),
                ("b".to_string(), Value::Long(1))
            ],
            "the 00:00 windows kept the first run's rows"
        );

        // Without a backend the first run's open windows are lost.
        let mut source = first_half();
        build(None)
            .run(&mut source, &mut CollectSink::default())
            .unwrap();
        let mut sink = CollectSink::default();
        build(None)
            .run(&mut second_half(source.checkpoints().clone()), &mut sink)
            .unwrap();
        assert_eq!(counts(&sink), vec![("a".to_string(), Value::Long(1))]);
    }

    #[test]
    fn a_window_written_before_a_restart_is_not_written_again() {
        let backend = crate::runtime::InMemoryStateBackend::default();
        let build = || {
            counting(
                "once",
                "1 minute",
                WindowSpec::tumbling("1 minute").unwrap(),
            )
            .state_backend(backend.clone())
            .build()
            .unwrap()
        };
        let mut checkpoints = Default::default();
        let mut written = Vec::new();
        for batch in [
            vec![r#"{"t": "2026-01-01T00:00:10Z", "k": "a"}"#],
            vec![r#"{"t": "2026-01-01T00:03:00Z", "k": "a"}"#],
            vec![r#"{"t": "2026-01-01T00:09:00Z", "k": "a"}"#],
        ] {
            let mut source = VecSource::json_batches(vec![batch]).restoring(checkpoints);
            let mut sink = CollectSink::default();
            build().run(&mut source, &mut sink).unwrap();
            checkpoints = source.checkpoints().clone();
            written.extend(
                sink.rows
                    .iter()
                    .map(|r| r.get("window_start").unwrap().to_string()),
            );
        }
        assert_eq!(
            written,
            vec![
                "2026-01-01T00:00:00Z".to_string(),
                "2026-01-01T00:03:00Z".to_string()
            ],
            "each window once, across restarts"
        );
    }

    #[test]
    fn append_needs_a_watermark_and_complete_needs_an_aggregation() {
        let agg = vec![AggregateSpec::count()];
        let err = Query::builder("q")
            .event_time("t")
            .window_aggregate(["k"], WindowSpec::tumbling("1 minute").unwrap(), agg)
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("needs a watermark"), "{err}");
        let err = Query::builder("q")
            .output_mode(OutputMode::Complete)
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("needs an aggregation"), "{err}");
        let err = counting("q", "1 minute", WindowSpec::session("5 minutes").unwrap())
            .output_mode(OutputMode::Update)
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("not supported for session windows"), "{err}");
    }
}
