//! The query and its trigger loop: poll, follow the assignment, route the
//! batch through the tasks, write the sink, commit, report — batch after
//! batch, as Kafka Streams' `StreamThread` runs its loop.

use super::commit::{commit_batch, CommitOutcome, CommitTargets};
use super::inputs::Inputs;
use super::plan::QueryPlan;
use super::reporter::{state_progress, CommittedBatch, OpenBatch, PollOutcome, ProgressReporter};
use super::resources::QueryResources;
use super::retry::Backoff;
use super::routed::BatchScope;
use super::router::RecordRouter;
use super::state_query::{store_description, StateHolder};
use super::task_manager::{Backend, TaskManager};
use super::{BatchLog, BatchRequest, Decoder, Sink, Source, SourceBatch, Trigger};
use super::{StateQueryError, StateReader, StateService, StoreDescription, StoreHandle};
use crate::error::{Error, Result};
use crate::operators::KeyRange;
use crate::operators::OutputMode;
use crate::record::Record;
use crate::row::Row;
use crate::time::TimestampMicros;
use crate::topology::NodeDescription;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The id of a query named `name` when none is set: stable across runs
/// (a UUID v5 of the name), as Spark's id survives restarts of a query.
pub fn default_query_id(name: &str) -> String {
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

/// A built query: run it against a source and a sink.
pub struct Query {
    pub(super) id: String,
    pub(super) run_id: String,
    /// What it is.
    pub(super) plan: QueryPlan,
    /// What it runs with (taken by the loop when it runs).
    pub(super) resources: QueryResources,
    pub(super) stop: StopHandle,
    /// Interactive queries' requests reach the loop through it.
    pub(super) state: StateService,
    /// Where the loop reports whether it restores or runs.
    pub(super) status: Option<super::StageStatus>,
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

    /// Reports on `status` whether the query starts, restores its tasks'
    /// state or runs (a pipeline's [`super::RunStatus`], for readiness).
    pub fn with_run_status(mut self, status: super::StageStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// A handle that stops this query after its current batch.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Reads this query's state while it runs, from any thread
    /// (interactive queries): clone it before [`Query::run`].
    pub fn stores(&self) -> StateReader {
        self.state.reader()
    }

    /// The store `name` (`op<index>`, as [`Query::processors`] lists it),
    /// to read by key while the query runs:
    /// `query.store("op1")?.get(&[Value::from("a")])`.
    pub fn store(&self, name: &str) -> std::result::Result<StoreHandle, StateQueryError> {
        let stores = describe_stores(&self.plan);
        match stores.iter().find(|s| s.name == name) {
            Some(description) => Ok(StoreHandle::new(self.stores(), description.clone())),
            None => Err(StateQueryError::UnknownStore {
                name: name.to_string(),
                known: stores.into_iter().map(|s| s.name).collect(),
            }),
        }
    }

    /// The query's stable id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// What the query is: its steps, inputs and settings.
    pub fn plan(&self) -> &QueryPlan {
        &self.plan
    }

    /// The operator graph, one line per step.
    pub fn describe(&self) -> Vec<String> {
        self.processors().into_iter().map(|p| p.name).collect()
    }

    /// The processors rows go through, in order, with the store each
    /// stateful one keeps per task (`op<index>`, the name its changelog
    /// topic is made from): a join's second stream's steps come before
    /// the join, named `[stream] step`.
    pub fn processors(&self) -> Vec<NodeDescription> {
        let b = &self.plan;
        let mut nodes = Vec::new();
        for (index, f) in b.steps.iter().enumerate() {
            for side in b.side_inputs.iter().filter(|s| s.join_at == index) {
                for step in &side.stream.steps {
                    let name = format!("[{}] {}", side.stream.name, step(b.output_mode).describe());
                    nodes.push(NodeDescription {
                        name,
                        stores: Vec::new(),
                    });
                }
            }
            let op = (f.build)(b.output_mode);
            nodes.push(NodeDescription {
                name: op.describe(),
                stores: op
                    .is_stateful()
                    .then(|| format!("op{index}"))
                    .into_iter()
                    .collect(),
            });
        }
        nodes
    }

    /// Runs until the source is exhausted (available-now) or
    /// [`StopHandle::stop`] is called.
    pub fn run(self, source: &mut dyn Source, sink: &mut dyn Sink) -> Result<RunSummary> {
        // Checked here, not at build: `describe` builds without connecting.
        let without_feed = self.plan.global_tables.iter().find(|t| {
            !self
                .resources
                .table_feeds
                .iter()
                .any(|(name, _)| *name == *t.name)
        });
        if let Some(t) = without_feed {
            return Err(Error::config(
                "table_join.global",
                format!("the global table `{}` has no feed to read it from", t.name),
            ));
        }
        TriggerLoop::new(self, source, sink).run()
    }
}

/// How often batches run and checkpoint, from the trigger.
#[derive(Debug, Clone, Copy)]
struct Cadence {
    /// Micro-batch: the trigger interval; real-time: one poll's wait.
    interval: Duration,
    /// Real-time mode: how often a checkpoint closes the open batch.
    checkpoint_interval: Option<Duration>,
    available_now: bool,
}

impl Cadence {
    fn of(trigger: Trigger) -> Self {
        let (interval, checkpoint_interval) = match trigger {
            Trigger::MicroBatch { interval } => (interval, None),
            Trigger::AvailableNow => (Duration::from_millis(200), None),
            Trigger::RealTime {
                checkpoint_interval,
            } => (REAL_TIME_TICK, Some(checkpoint_interval)),
        };
        Cadence {
            interval,
            checkpoint_interval,
            available_now: trigger == Trigger::AvailableNow,
        }
    }

    fn real_time(&self) -> bool {
        self.checkpoint_interval.is_some()
    }
}

/// Whether the loop goes on after a step.
enum Flow {
    Continue,
    Finished,
}

/// One run of a query against its source and sink.
///
/// Fields drop in order: tasks (and their stores) before the backend that
/// opened them, then the outputs, as the loop's locals used to.
struct TriggerLoop<'a> {
    tasks: TaskManager,
    backend: Backend,
    late_data: Option<Box<dyn Sink>>,
    reporter: ProgressReporter,
    router: RecordRouter,
    /// The plan: steps, inputs, trigger.
    plan: QueryPlan,
    /// Where each global table reads its topic from.
    table_feeds: Vec<(String, Box<dyn super::TableFeed>)>,
    stop: StopHandle,
    source: &'a mut dyn Source,
    sink: &'a mut dyn Sink,
    cadence: Cadence,
    summary: RunSummary,
    batch_id: u64,
    /// The batch the sink committed but the source did not: it runs again
    /// over exactly its recorded input, even without input rows (its
    /// output, a watermark's closed windows, is what the sink holds).
    replaying: Option<u64>,
    exhausted: bool,
    open_batch: Option<OpenBatch>,
    /// Shares committed partitions' progress with the other instances.
    watermark_exchange: Option<Box<dyn super::WatermarkExchange>>,
    /// Another instance's progress would move a watermark: a batch is due.
    others_moved_watermark: bool,
    /// A repartition writer under the query scope: what its markers last
    /// carried (a batch is due when that would change, records or not).
    last_forwarded: BTreeMap<String, TimestampMicros>,
    /// Interactive queries' requests, answered between polls.
    state: StateService,
    stores: Vec<StoreDescription>,
    /// Waits before replaying an aborted batch, longer after each abort in
    /// a row: a broker restarting aborts every try at once.
    abort_backoff: Backoff,
    /// Told whether the loop restores or runs.
    status: Option<super::StageStatus>,
}

/// The wait before the first replay of an aborted batch, and its cap.
const ABORT_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// How often a wait between batches tells the sinks the loop is alive.
const LIFE_SIGN_EVERY: Duration = Duration::from_secs(30);

/// Aborts of one batch in a row after which the query is rebuilt instead
/// of replaying the batch in place once more.
const MAX_ABORTS_IN_A_ROW: u32 = 5;

impl<'a> TriggerLoop<'a> {
    fn new(query: Query, source: &'a mut dyn Source, sink: &'a mut dyn Sink) -> Self {
        let Query {
            id,
            run_id,
            plan,
            mut resources,
            stop,
            state,
            status,
        } = query;
        if let Some(status) = &status {
            status.starting();
        }
        let router = RecordRouter {
            inputs: Inputs::of(&plan),
            decoder: resources
                .decoder
                .take()
                .unwrap_or_else(|| Box::new(InferJsonDecoder)),
            dead_letter: resources
                .dead_letter
                .take()
                .unwrap_or_else(|| Box::new(super::LogDeadLetter::default())),
            extractor: plan.event_time_extractor.clone(),
            watermark_from_markers: plan.watermark_from_markers,
        };
        let backend = resources.state_backend.take();
        let watermark_exchange = resources.watermark_exchange.take();
        let listeners = std::mem::take(&mut resources.listeners);
        let mut tasks = TaskManager::new(&plan, &backend);
        let cadence = Cadence::of(plan.trigger);
        if watermark_exchange.is_some() {
            tasks.align_to_exchange(!cadence.real_time());
        }
        TriggerLoop {
            tasks,
            reporter: ProgressReporter::new(id, run_id, plan.name.clone(), listeners),
            cadence,
            late_data: resources.late_data.take(),
            backend,
            router,
            stop,
            source,
            sink,
            summary: RunSummary::default(),
            batch_id: 0,
            replaying: None,
            exhausted: false,
            open_batch: None,
            watermark_exchange,
            others_moved_watermark: false,
            last_forwarded: BTreeMap::new(),
            state,
            stores: describe_stores(&plan),
            plan,
            table_feeds: std::mem::take(&mut resources.table_feeds),
            abort_backoff: ABORT_BACKOFF,
            status,
        }
    }

    fn run(mut self) -> Result<RunSummary> {
        let state = self.state.clone();
        state.set_running(true);
        let result = self.run_batches();
        let result = result.and_then(|()| {
            self.tasks.close(&mut self.backend)?;
            Ok(self.summary)
        });
        state.set_running(false);
        result
    }

    fn run_batches(&mut self) -> Result<()> {
        self.recover()?;
        // A stop ends the loop between batches; a real-time batch that is
        // open runs one more poll and checkpoints first.
        while !self.stop.is_stopped() || self.open_batch.is_some() {
            if let Flow::Finished = self.step()? {
                break;
            }
        }
        if let (Some(status), true) = (&self.status, self.stop.is_stopped()) {
            // Closing the tasks may take a while: not ready meanwhile.
            status.stopping();
        }
        Ok(())
    }

    /// Batch ids continue where the source's batch log or the sink's
    /// record ends (local state goes back to the source's last committed
    /// batch); the batch the sink holds but the source did not commit runs
    /// again with its own id, over exactly its input, and the sink skips it.
    fn recover(&mut self) -> Result<()> {
        let log = self.source.batch_log()?;
        if log != BatchLog::NotKept {
            if let Some(backend) = self.backend.as_mut() {
                backend.resume_at_version(log.last_committed())?;
            }
        }
        if let Some(committed) = log.last_committed() {
            self.batch_id = committed + 1;
        }
        if let Some((committed, end)) = self.sink.recovered_batch()? {
            self.batch_id = self.batch_id.max(committed + 1);
            if self.source.replay_until(committed, &end)? {
                tracing::info!(
                    batch_id = committed,
                    "replaying a batch the sink already committed"
                );
                self.batch_id = committed;
                self.replaying = Some(committed);
            }
        }
        Ok(())
    }

    /// One poll: its records run through the tasks; the batch commits when
    /// its checkpoint is due (every poll in micro-batch mode).
    fn step(&mut self) -> Result<Flow> {
        self.show_life();
        if let (Some(status), true) = (&self.status, self.stop.is_stopped()) {
            status.stopping();
        }
        self.answer_state_requests(None);
        if self.open_batch.is_none() {
            self.between_batches()?;
        }
        let (batch, get_batch_ms) = self.poll()?;
        self.exhausted |= batch.exhausted;
        if batch.records.is_empty() && self.watermark_exchange.is_some() {
            let as_of_ms = self.source.caught_up_as_of_ms();
            self.tasks
                .nothing_read(&self.source.partitions_caught_up(), as_of_ms);
        }
        // Under Spark's query-wide watermark a partition held back while its
        // task restores would find the watermark moved past its rows by the
        // others' (Spark loads every task's state before its batch runs):
        // the batch waits for every restore instead.
        let hold_allowed = self.replaying != Some(self.batch_id) && !self.query_wide_watermark();
        self.tasks.follow_assignment(
            &self.plan,
            &batch,
            &mut self.backend,
            &mut *self.source,
            hold_allowed,
        )?;
        for (partition, commit) in self.tasks.take_sink_recoveries() {
            self.sink.recover_task(partition, &commit)?;
        }
        // Held records are read again: the input is not done with.
        let restoring = self.tasks.any_restoring();
        self.exhausted &= !restoring;
        match (&self.status, restoring) {
            (Some(status), true) => status.restoring(),
            (Some(status), false) => status.running(),
            (None, _) => {}
        }
        if !self.batch_due(&batch) {
            if self.exhausted {
                return Ok(Flow::Finished);
            }
            self.open_batch = None;
            return Ok(Flow::Continue);
        }
        self.process(&batch, get_batch_ms)?;
        if !self.checkpoint_due() {
            return Ok(Flow::Continue);
        }
        let Some(open) = self.open_batch.take() else {
            return Ok(Flow::Continue);
        };
        if matches!(self.commit(&open)?, CommitOutcome::Aborted { .. }) {
            // The source rewound: what it had handed out is to be read
            // again, so reaching its end earlier no longer ends the query.
            self.exhausted = false;
            return Ok(Flow::Continue);
        }
        if self.cadence.real_time() && self.exhausted {
            // A bounded input (files, tests) ends after its checkpoint.
            return Ok(Flow::Finished);
        }
        self.pace(&batch, open.trigger_start);
        Ok(Flow::Continue)
    }

    /// Before a batch opens: the state backend's housekeeping, and global
    /// tables catch up with their feeds.
    fn between_batches(&mut self) -> Result<()> {
        if let Some(backend) = self.backend.as_mut() {
            backend.between_batches()?;
        }
        if let Some(exchange) = self.watermark_exchange.as_mut() {
            let collected = exchange.collect()?;
            if let Some(alignment) = self.tasks.alignment_mut() {
                alignment.offer(collected);
            }
            let processing_time = self.plan.clock.batch_time(self.batch_id);
            self.others_moved_watermark |= self
                .tasks
                .observe_other_instances(&self.router.inputs, processing_time);
        }
        for table in &self.plan.global_tables {
            let Some((_, feed)) = self.table_feeds.iter_mut().find(|(n, _)| *n == *table.name)
            else {
                continue; // Refused before the loop started (see `Query::run`).
            };
            self.summary.bad_records += super::global_tables::catch_up(
                table,
                feed.as_mut(),
                self.router.decoder.as_mut(),
                self.router.dead_letter.as_mut(),
            )?;
        }
        Ok(())
    }

    /// Whether the query keeps Spark's one watermark over every partition
    /// (an event-time query under [`WatermarkScope::Query`]): batches are
    /// then planned by offsets and no partition is left behind.
    ///
    /// [`WatermarkScope::Query`]: crate::watermark::WatermarkScope::Query
    fn query_wide_watermark(&self) -> bool {
        (self.plan.watermark.is_some() || self.plan.event_time.is_some())
            && self.plan.scope == crate::watermark::WatermarkScope::Query
    }

    /// Polls the source for the open batch (opening one if needed); returns
    /// the records and how long the poll took.
    fn poll(&mut self) -> Result<(SourceBatch, u64)> {
        let real_time = self.cadence.real_time();
        let open = self
            .open_batch
            .get_or_insert_with(|| OpenBatch::new(self.source.offsets(), real_time));
        if self.exhausted {
            let batch = SourceBatch {
                exhausted: true,
                ..Default::default()
            };
            return Ok((batch, 0));
        }
        let request = BatchRequest {
            batch_id: self.batch_id,
            deadline: if real_time {
                Instant::now() + self.cadence.interval
            } else {
                open.trigger_start + self.cadence.interval
            },
            max_records: self.plan.max_records_per_batch,
            available_now: self.cadence.available_now,
            return_early: real_time,
            // A repartition writer plans too: the reader's watermark comes
            // from what it wrote.
            plan_offsets: !real_time && self.query_wide_watermark(),
        };
        let started = Instant::now();
        let batch = self.source.next_batch(&request)?;
        if real_time && batch.records.is_empty() && !batch.exhausted {
            // A source with nothing may answer at once (files): wait out
            // the poll rather than spin.
            if let Some(rest) = request.deadline.checked_duration_since(Instant::now()) {
                std::thread::sleep(rest);
            }
        }
        Ok((batch, started.elapsed().as_millis() as u64))
    }

    /// The scope of the current batch at `processing_time`.
    fn scope(&self, processing_time: i64) -> BatchScope {
        BatchScope {
            batch_id: self.batch_id,
            processing_time,
            collect_late_rows: self.late_data.is_some(),
            real_time: self.cadence.real_time(),
        }
    }

    /// Whether this poll makes a batch: records, a watermark that moved
    /// (Spark's no-data batch, only for stateful operators that evict by
    /// watermark: append and update mode, not complete), due timers, a
    /// replay, or real-time mode (every poll).
    fn batch_due(&mut self, batch: &SourceBatch) -> bool {
        let real_time = self.cadence.real_time();
        let evicts_by_watermark =
            self.plan.has_stateful_steps() && self.plan.output_mode != OutputMode::Complete;
        let others_moved = std::mem::take(&mut self.others_moved_watermark);
        let watermark_pending =
            evicts_by_watermark && (self.tasks.watermark_pending() || others_moved);
        let has_records = self.tasks.has_records_for_tasks(&batch.records);
        let timers_due = !has_records && !real_time && {
            let scope = self.scope(self.plan.clock.batch_time(self.batch_id));
            self.tasks.timers_due(&scope)
        };
        let batch_id = self.batch_id;
        let replay_due = self.replaying.take_if(|b| *b == batch_id).is_some();
        // A writer whose own partitions are silent still tells the readers
        // how far the stream went: they wait for its report.
        let forward_due = !has_records
            && self
                .forwarded_stream_maxima()
                .is_some_and(|f| f != self.last_forwarded);
        let event_time_reached = !batch.event_time_reached.is_empty();
        has_records
            || watermark_pending
            || timers_due
            || real_time
            || replay_due
            || forward_due
            || event_time_reached
    }

    /// What a repartition writer under the query scope forwards in its
    /// markers now (see `markers`); `None` for any other query.
    fn forwarded_stream_maxima(&self) -> Option<BTreeMap<String, TimestampMicros>> {
        self.plan.forwards_stream_maxima.then(|| {
            super::watermark::forwarded_stream_maxima(
                self.tasks.tasks(),
                &self.source.assigned_inputs(),
                &self.router.inputs,
                &*self.source,
            )
        })
    }

    /// Runs one poll's records through the tasks, ends the batch in every
    /// task and writes the output to the sink (and late rows to theirs).
    fn process(&mut self, batch: &SourceBatch, get_batch_ms: u64) -> Result<()> {
        let processing_time = if self.cadence.real_time() {
            crate::time::now_micros()
        } else {
            self.plan.clock.batch_time(self.batch_id)
        };
        let scope = self.scope(processing_time);
        let started = Instant::now();
        let mut routed = self
            .router
            .route(&batch.records, self.tasks.tasks_mut(), &scope)?;
        if let Some(alignment) = self.tasks.alignment_mut() {
            alignment.note_read(&batch.records, &*self.source);
        }
        for (topic, partition, t) in &batch.event_time_reached {
            // As the router counts a record's event time: only an input
            // that takes part in the watermark.
            let input = self.router.inputs.get(self.router.inputs.input_of(topic));
            if !input.watermarked {
                continue;
            }
            let slot = routed
                .max_event_time
                .entry((Arc::from(topic.as_str()), *partition))
                .or_insert(*t);
            *slot = (*slot).max(*t);
        }
        let event_time_progress = self.tasks.observe_event_times(
            &routed.max_event_time,
            &self.router.inputs,
            &*self.source,
            self.plan.watermark_from_markers,
            processing_time,
        );
        let contexts = std::mem::take(&mut routed.contexts);
        let joins = self.router.inputs.joins();
        let end = self.tasks.finish_batch(
            contexts,
            &scope,
            joins,
            &mut routed.outputs,
            &mut routed.output_tasks,
        )?;
        self.sink.write_output(self.batch_id, &routed.output())?;
        if let Some(late) = self.late_data.as_mut() {
            late.write(self.batch_id, &end.late_rows)?;
        }
        let add_batch_ms = started.elapsed().as_millis() as u64;
        let Some(open) = self.open_batch.as_mut() else {
            return Err(Error::Internal("a batch ran without being opened".into()));
        };
        open.record_latency(&batch.records);
        open.add(PollOutcome {
            get_batch_ms,
            add_batch_ms,
            routed: &routed,
            end: &end,
            event_time_progress,
        });
        Ok(())
    }

    /// Micro-batch mode checkpoints every batch; real-time mode on its
    /// interval, and before it stops or ends.
    fn checkpoint_due(&self) -> bool {
        let Some(every) = self.cadence.checkpoint_interval else {
            return true;
        };
        let opened = self
            .open_batch
            .as_ref()
            .map_or(Instant::now(), |o| o.trigger_start);
        opened.elapsed() >= every || self.stop.is_stopped() || self.exhausted
    }

    /// Commits the open batch (see [`super::commit`]) and reports it.
    fn commit(&mut self, open: &OpenBatch) -> Result<CommitOutcome> {
        let state_operators = state_progress(&mut self.tasks, &mut self.backend);
        let started = Instant::now();
        // What the markers carry: the stream's maxima under the query
        // scope (see `markers`), else each partition's own progress.
        let forwarded = self.forwarded_stream_maxima();
        let targets = CommitTargets {
            source: &mut *self.source,
            sink: &mut *self.sink,
            late_data: self.late_data.as_mut(),
            dead_letter: self.router.dead_letter.as_mut(),
            backend: &mut self.backend,
        };
        let event_time_progress = &open.event_time_progress;
        let marked = forwarded.as_ref().unwrap_or(event_time_progress);
        let outcome = commit_batch(self.batch_id, &mut self.tasks, marked, targets)?;
        if let CommitOutcome::Aborted {
            replay_bounded,
            reason,
        } = &outcome
        {
            self.after_abort(*replay_bounded, reason)?;
            return Ok(outcome);
        }
        self.abort_backoff.succeeded();
        if let Some(forwarded) = forwarded {
            self.last_forwarded = forwarded;
        }
        if let Some(exchange) = self.watermark_exchange.as_mut() {
            let caught_up = self.source.partitions_caught_up();
            let as_of_ms = self.source.caught_up_as_of_ms();
            let known =
                self.tasks
                    .share_committed_progress(event_time_progress, &caught_up, as_of_ms);
            // Advisory: another instance's watermark waits for it, nothing
            // is lost if it fails.
            if let Err(e) = exchange.publish(&known) {
                tracing::warn!(error = %e, "publishing event-time progress to the other instances failed");
            }
        }
        let committed = CommittedBatch {
            batch_id: self.batch_id,
            commit_ms: started.elapsed().as_millis() as u64,
            state_operators,
        };
        self.reporter
            .report(open, committed, &*self.source, &*self.sink);
        self.summary.batches += 1;
        self.summary.input_records += open.num_input;
        self.summary.output_rows += open.num_output;
        self.summary.bad_records += open.bad_records;
        self.batch_id += 1;
        Ok(outcome)
    }

    /// After an abort: the replay runs over exactly the aborted input when
    /// `replay_bounded`, after a wait that grows with each abort in a row;
    /// the [`MAX_ABORTS_IN_A_ROW`]th ends the run with an error instead, for
    /// the runner to rebuild the query (see there).
    fn after_abort(&mut self, replay_bounded: bool, reason: &str) -> Result<()> {
        if let Some(alignment) = self.tasks.alignment_mut() {
            alignment.batch_aborted();
        }
        if replay_bounded {
            // The replay must hold the whole of the aborted input: no
            // partition is held back while its task restores.
            self.replaying = Some(self.batch_id);
        }
        let wait = self.abort_backoff.failed();
        let aborts = self.abort_backoff.failures();
        if aborts >= MAX_ABORTS_IN_A_ROW {
            // What aborts every replay in place (a consumer that lost its
            // membership for good, a producer in a state no abort clears)
            // is not mended by one more: the stage is rebuilt with new
            // clients, and a cause that outlasts that too ends the run at
            // `task_timeout`.
            return Err(Error::Sink(format!(
                "batch {} aborted {aborts} times in a row; the query is rebuilt from the last commit. The last reason: {reason}",
                self.batch_id
            )));
        }
        tracing::debug!(
            batch_id = self.batch_id,
            wait_ms = wait.as_millis() as u64,
            aborts_in_a_row = aborts,
            "waiting before the replay"
        );
        let replay_at = Instant::now() + wait;
        while let Some(rest) = replay_at.checked_duration_since(Instant::now()) {
            if rest.is_zero() || self.stop.is_stopped() {
                break;
            }
            self.answer_state_requests(Some(rest));
        }
        Ok(())
    }

    /// A source returns early only when it has nothing more: wait out the
    /// micro-batch interval so batches keep their cadence.
    /// The wait answers interactive queries as they come.
    fn pace(&mut self, batch: &SourceBatch, trigger_start: Instant) {
        if self.cadence.available_now || self.cadence.real_time() || !batch.records.is_empty() {
            return;
        }
        let interval = self.cadence.interval;
        let deadline = trigger_start + interval;
        while let Some(rest) = deadline.checked_duration_since(Instant::now()) {
            if rest.is_zero() {
                break;
            }
            // A long trigger interval still shows life (the Delta lease).
            self.answer_state_requests(Some(rest.min(LIFE_SIGN_EVERY)));
            self.show_life();
        }
    }

    /// Tells the sinks the loop turns (see [`Sink::alive`]).
    fn show_life(&mut self) {
        self.sink.alive();
        if let Some(late) = self.late_data.as_mut() {
            late.alive();
        }
    }

    /// Answers the interactive queries waiting (with `wait`, waits that
    /// long for one): between polls, state reflects whole batches.
    fn answer_state_requests(&mut self, wait: Option<Duration>) {
        let mut holder = TaskStates {
            tasks: &mut self.tasks,
            stores: &self.stores,
        };
        self.state.answer_requests(&mut holder, wait);
    }
}

/// The stores of `plan`'s stateful operators that keys can read.
fn describe_stores(plan: &QueryPlan) -> Vec<StoreDescription> {
    plan.steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| {
            let op = (step.build)(plan.output_mode);
            let state = op.queryable_state()?;
            Some(store_description(index, op.describe(), state))
        })
        .collect()
}

/// The loop's tasks, as interactive queries read them.
struct TaskStates<'a> {
    tasks: &'a mut TaskManager,
    stores: &'a [StoreDescription],
}

impl StateHolder for TaskStates<'_> {
    fn describe_stores(&self) -> Vec<StoreDescription> {
        self.stores.to_vec()
    }

    fn read_tasks(
        &mut self,
        index: usize,
        key: &[crate::row::Value],
        range: &KeyRange,
    ) -> Result<Option<(i32, Vec<Row>)>> {
        self.tasks.read_key(index, key, range)
    }

    fn partitions(&self) -> (Vec<i32>, Vec<i32>) {
        self.tasks.partitions()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::AggregateSpec;
    use crate::progress::QueryProgress;
    use crate::row::Value;
    use crate::runtime::testing::{CollectSink, VecSource};
    use crate::runtime::{QueryBuilder, TaskCheckpoint};
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

    /// Records what each commit hands the sink as event-time progress
    /// (what a repartition sink turns into markers).
    #[derive(Default)]
    struct ProgressSink(Arc<std::sync::Mutex<Vec<BTreeMap<String, TimestampMicros>>>>);

    impl Sink for ProgressSink {
        fn describe(&self) -> String {
            "progress".into()
        }
        fn write(&mut self, _batch_id: u64, _rows: &[Row]) -> Result<()> {
            Ok(())
        }
        fn commit(&mut self, _batch_id: u64) -> Result<()> {
            Ok(())
        }
        fn event_time_progress(&mut self, progress: &BTreeMap<String, TimestampMicros>) {
            self.0.lock().unwrap().push(progress.clone());
        }
    }

    /// A repartition writer under the query scope hands its markers, for
    /// each partition it is assigned (silent ones too, not one it is not),
    /// the stream's largest event time (the reader takes the smallest
    /// report); other writers, each partition's own.
    #[test]
    fn a_query_scope_writer_forwards_its_streams_maximum_for_each_assigned_partition() {
        use crate::record::{Record, SourcePosition};
        let row = |partition, offset, t: &str| Record {
            value: Some(format!(r#"{{"k": "a", "t": "2026-01-01T{t}:00Z"}}"#).into_bytes()),
            position: SourcePosition::new("in", partition, offset),
            ..Default::default()
        };
        let at = |t: &str| crate::time::parse_rfc3339(&format!("2026-01-01T{t}:00Z")).unwrap();
        let run = |forwards: bool, assigned: &[i32]| {
            let mut source = VecSource::record_batches(vec![
                vec![row(0, 0, "10:10"), row(1, 0, "10:00")],
                vec![row(1, 1, "10:20")],
            ])
            .assigned(assigned.iter().map(|p| ("in", *p)));
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut sink = ProgressSink(seen.clone());
            let mut writer = Query::builder("writer")
                .event_time("t")
                .watermark("1 minute")
                .unwrap()
                .trigger(Trigger::AvailableNow);
            writer.plan.forwards_stream_maxima = forwards;
            writer.build().unwrap().run(&mut source, &mut sink).unwrap();
            let seen = seen.lock().unwrap().clone();
            seen
        };
        let both = |p0: &str, p1: &str| {
            BTreeMap::from([("in/0".to_string(), at(p0)), ("in/1".to_string(), at(p1))])
        };
        let assigned = |t: &str| {
            let all = [0, 1, 2].map(|p| (format!("in/{p}"), at(t)));
            BTreeMap::from(all)
        };
        let forwarded = run(true, &[0, 1, 2]);
        assert_eq!(forwarded[0], assigned("10:10"), "silent in/2 reports too");
        assert_eq!(forwarded[1], assigned("10:20"));
        let mut not_1 = assigned("10:20");
        not_1.remove("in/1");
        assert_eq!(run(true, &[0, 2])[1], not_1, "in/1 is another's to report");
        let own = run(false, &[0, 1, 2]);
        assert_eq!(own[0], both("10:10", "10:00"));
        assert_eq!(own[1], BTreeMap::from([("in/1".to_string(), at("10:20"))]));
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

    /// Epoch milliseconds near `i64::MAX` would overflow the window
    /// arithmetic: such a record is a bad record, and the rest go on.
    #[test]
    fn an_event_time_outside_sparks_range_is_a_bad_record_not_a_panic() {
        let query = counting(
            "extreme",
            "1 minute",
            WindowSpec::tumbling("1 minute").unwrap(),
        )
        .output_mode(OutputMode::Update)
        .build()
        .unwrap();
        let mut source = VecSource::json_batches(vec![vec![
            r#"{"t": 9223372036854775, "k": "far"}"#,
            r#"{"t": -9223372036854775, "k": "early"}"#,
            r#"{"t": "2026-01-01T00:10:00Z", "k": "a"}"#,
        ]]);
        let mut sink = CollectSink::default();
        let summary = query.run(&mut source, &mut sink).unwrap();
        assert_eq!(summary.bad_records, 2);
        assert_eq!(sink.rows.len(), 1);
        assert_eq!(sink.rows[0].get("k"), Some(&Value::Str("a".into())));
        assert_eq!(source.committed(), 3);
    }

    /// A step failing on a row's data sends that record to the dead-letter
    /// output and goes on; a step failing on its infrastructure (here a
    /// disk error) fails the batch: nothing is dead-lettered, no offset is
    /// committed, and the batch is replayed by whoever restarts the query.
    #[test]
    fn bad_data_is_dead_lettered_but_an_infrastructure_error_holds_the_batch() {
        use crate::operators::MapRows;
        let query = || {
            Query::builder("infra")
                .step(|| {
                    Box::new(MapRows::new("Check", |row: Row| match row.get("k") {
                        Some(Value::Str(k)) if &**k == "bad" => {
                            Err(Error::bad_row("k", "`bad` is not a key"))
                        }
                        Some(Value::Str(k)) if &**k == "disk" => Err(Error::io(
                            "writing state",
                            std::io::Error::other("no space left on device"),
                        )),
                        _ => Ok(vec![row]),
                    }))
                })
                .trigger(Trigger::AvailableNow)
                .build()
                .unwrap()
        };
        let mut source = VecSource::json_batches(vec![vec![
            r#"{"k": "a"}"#,
            r#"{"k": "bad"}"#,
            r#"{"k": "b"}"#,
        ]]);
        let mut sink = CollectSink::default();
        let summary = query().run(&mut source, &mut sink).unwrap();
        assert_eq!((summary.bad_records, sink.rows.len()), (1, 2));
        assert_eq!(source.committed(), 3);

        let mut source = VecSource::json_batches(vec![vec![
            r#"{"k": "a"}"#,
            r#"{"k": "disk"}"#,
            r#"{"k": "b"}"#,
        ]]);
        let mut sink = CollectSink::default();
        let e = query().run(&mut source, &mut sink).unwrap_err();
        assert!(matches!(e, Error::Io { .. }), "{e}");
        assert!(!e.is_bad_data());
        assert_eq!(source.committed(), 0, "the batch is not committed");
        assert!(sink.rows.is_empty(), "{:?}", sink.rows);
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
        assert!(saved[&0].as_str().contains("in_effect"), "{saved:?}");
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
            .resources
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

    /// A kill between the batch that moved the watermark and the no-data
    /// batch after it: the partition's topics hold checkpoints of different
    /// batches (a topic that delivered nothing lately keeps an older one).
    /// Whichever comes first, the task resumes from the newest and the
    /// no-data batch runs.
    #[test]
    fn a_restart_runs_the_no_data_batch_its_newest_checkpoint_owes() {
        use super::super::task_checkpoint::CheckpointContents;
        use crate::watermark::{WatermarkPolicy, WatermarkTracker};
        let minute = 60_000_000;
        let stale = WatermarkTracker::new(minute, WatermarkPolicy::Min, None);
        let mut owing = stale.clone();
        owing.observe(
            "input/0",
            crate::time::parse_rfc3339("2026-01-01T00:10:00Z").unwrap(),
            0,
        );
        assert!(owing.finish_batch(0), "the watermark moved");
        let encode = |batch_id, watermark: &WatermarkTracker| {
            let checkpoint = CheckpointContents {
                version: super::super::task_checkpoint::CHECKPOINT_VERSION,
                batch_id,
                watermark: Some(watermark.clone()),
                sink: None,
                stores: Default::default(),
            };
            TaskCheckpoint::encode(checkpoint).unwrap()
        };
        let (stale, owing) = (encode(2, &stale), encode(4, &owing));
        for checkpoints in [
            vec![(0, stale.clone()), (0, owing.clone())],
            vec![(0, owing.clone()), (0, stale.clone())],
        ] {
            let mut source =
                VecSource::json_batches(Vec::<Vec<&str>>::new()).restoring(checkpoints);
            let watermarks = Arc::new(std::sync::Mutex::new(Vec::new()));
            let seen = watermarks.clone();
            let mut query = counting(
                "owed",
                "1 minute",
                WindowSpec::tumbling("1 minute").unwrap(),
            )
            .build()
            .unwrap();
            query
                .resources
                .listeners
                .push(Box::new(move |p: &QueryProgress| {
                    seen.lock()
                        .unwrap()
                        .push(p.event_time.get("watermark").cloned());
                }));
            let summary = query.run(&mut source, &mut CollectSink::default()).unwrap();
            assert_eq!(summary.batches, 1, "the owed no-data batch");
            let watermarks = watermarks.lock().unwrap();
            assert_eq!(
                watermarks.as_slice(),
                [Some("2026-01-01T00:09:00Z".to_string())]
            );
        }
    }

    #[test]
    fn an_aborted_last_batch_is_read_again_before_available_now_ends() {
        let query = counting(
            "abort",
            "1 minute",
            WindowSpec::tumbling("1 minute").unwrap(),
        )
        .build()
        .unwrap();
        let mut source = VecSource::json_batches(vec![vec![
            r#"{"t": "2026-01-01T00:10:00Z", "k": "a"}"#,
            r#"{"t": "2026-01-01T00:12:00Z", "k": "a"}"#,
        ]])
        .aborting_commits(1);
        let mut sink = CollectSink::default();
        query.run(&mut source, &mut sink).unwrap();
        assert_eq!(source.committed(), 2, "the replayed batch committed");
        // Batch 0 twice (aborted, then replayed), then the no-data batch
        // whose watermark (00:11) closes the 00:10 window.
        assert_eq!(sink.committed, vec![0, 0, 1]);
        assert_eq!(sink.batch_ids, vec![1]);
        assert_eq!(sink.rows[0].get("count"), Some(&Value::Long(1)));
    }

    /// A batch aborted in place five times in a row ends the run (for the
    /// runner to rebuild it with new clients, up to `task_timeout`) rather
    /// than replay it for ever; four aborts are replayed through.
    #[test]
    fn a_batch_aborted_five_times_in_a_row_ends_the_run_instead_of_replaying_for_ever() {
        let events =
            || VecSource::json_batches(vec![vec![r#"{"t": "2026-01-01T00:10:00Z", "k": "a"}"#]]);
        let query = || {
            counting(
                "aborts",
                "1 minute",
                WindowSpec::tumbling("1 minute").unwrap(),
            )
            .build()
            .unwrap()
        };
        let mut source = events().aborting_commits(4);
        query()
            .run(&mut source, &mut CollectSink::default())
            .unwrap();
        assert_eq!(source.committed(), 1, "the fifth try committed");
        let mut source = events().aborting_commits(MAX_ABORTS_IN_A_ROW as usize);
        let error = query()
            .run(&mut source, &mut CollectSink::default())
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("batch 0 aborted 5 times in a row")
                && error.contains("a test aborts this commit"),
            "{error}"
        );
        assert_eq!(source.committed(), 0);
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

    /// A step put before a stateful one renames its store: restoring
    /// `op0`'s window counts into a deduplication would misread them, and
    /// a filter before the window would leave them behind, so the restart
    /// is refused, naming the store; the same chain restarts, a stateful
    /// step added or removed after the others is accepted, and without a
    /// state backend nothing is checked.
    #[test]
    fn a_store_restored_into_another_step_is_refused_naming_it() {
        let rows = || {
            VecSource::json_batches(vec![vec![
                r#"{"t": "2026-01-01T00:00:10Z", "k": "a"}"#,
                r#"{"t": "2026-01-01T00:00:20Z", "k": "b"}"#,
            ]])
        };
        let backend = crate::runtime::InMemoryStateBackend::default();
        let counted = || {
            counting(
                "chain",
                "1 minute",
                WindowSpec::tumbling("1 minute").unwrap(),
            )
        };
        let mut first = rows();
        counted()
            .state_backend(backend.clone())
            .build()
            .unwrap()
            .run(&mut first, &mut CollectSink::default())
            .unwrap();
        let checkpoints = first.checkpoints().clone();
        assert!(
            checkpoints[&0]
                .as_str()
                .contains("window aggregation by [k]"),
            "{checkpoints:?}"
        );

        let moved = Query::builder("chain")
            .event_time("t")
            .watermark("1 minute")
            .unwrap()
            .drop_duplicates_within_watermark(&["k"])
            .unwrap()
            .window_aggregate(
                ["k"],
                WindowSpec::tumbling("1 minute").unwrap(),
                vec![AggregateSpec::count()],
            )
            .trigger(Trigger::AvailableNow)
            .state_backend(backend.clone())
            .build()
            .unwrap();
        let e = moved
            .run(
                &mut rows().restoring(checkpoints.clone()),
                &mut CollectSink::default(),
            )
            .unwrap_err();
        assert!(matches!(e, Error::Config { .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("`op0`") && e.contains("partition 0"), "{e}");
        assert!(
            e.contains("window aggregation by [k]") && e.contains("deduplication by [k]"),
            "{e}"
        );

        // A filter put before the window renames its store `op1`: `op0`
        // would be left behind and `op1` start empty.
        let shifted = Query::builder("chain")
            .event_time("t")
            .watermark("1 minute")
            .unwrap()
            .filter("k != 'z'")
            .unwrap()
            .window_aggregate(
                ["k"],
                WindowSpec::tumbling("1 minute").unwrap(),
                vec![AggregateSpec::count()],
            )
            .trigger(Trigger::AvailableNow)
            .state_backend(backend.clone())
            .build()
            .unwrap();
        let e = shifted
            .run(
                &mut rows().restoring(checkpoints.clone()),
                &mut CollectSink::default(),
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`op0`") && e.contains("has no step any more, while `op1`"),
            "{e}"
        );
        // Without a state backend nothing is restored: nothing to refuse.
        counting(
            "chain",
            "1 minute",
            WindowSpec::tumbling("1 minute").unwrap(),
        )
        .filter("k != 'z'")
        .unwrap()
        .build()
        .unwrap()
        .run(
            &mut rows().restoring(checkpoints.clone()),
            &mut CollectSink::default(),
        )
        .unwrap();
        // The last (here the only) stateful step removed leaves its state.
        Query::builder("chain")
            .event_time("t")
            .trigger(Trigger::AvailableNow)
            .state_backend(backend.clone())
            .build()
            .unwrap()
            .run(
                &mut rows().restoring(checkpoints.clone()),
                &mut CollectSink::default(),
            )
            .unwrap();

        let mut again = rows().restoring(checkpoints.clone());
        counted()
            .state_backend(backend.clone())
            .build()
            .unwrap()
            .run(&mut again, &mut CollectSink::default())
            .unwrap();
        let added = counted()
            .drop_duplicates(&["k", "window_start"])
            .unwrap()
            .state_backend(backend)
            .build()
            .unwrap();
        added
            .run(
                &mut rows().restoring(again.checkpoints().clone()),
                &mut CollectSink::default(),
            )
            .unwrap();
    }

    /// A custom step whose operator keeps state gets a store as a built-in
    /// stateful step does, even as the chain's only one: its state outlives
    /// the run, and its checkpoint names it.
    #[test]
    fn a_custom_stateful_step_keeps_its_state_across_a_restart() {
        use crate::operators::{DedupSpec, Deduplicate};
        let backend = crate::runtime::InMemoryStateBackend::default();
        let query = || {
            Query::builder("custom")
                .step(|| {
                    let spec = DedupSpec::Keys(vec!["k".into()]);
                    Box::new(Deduplicate::new(spec, None).expect("a valid spec"))
                })
                .trigger(Trigger::AvailableNow)
                .state_backend(backend.clone())
                .build()
                .unwrap()
        };
        let mut first = VecSource::json_batches(vec![vec![r#"{"k": "a"}"#]]);
        let mut sink = CollectSink::default();
        query().run(&mut first, &mut sink).unwrap();
        assert_eq!(sink.rows.len(), 1);
        let checkpoints = first.checkpoints().clone();
        assert!(
            checkpoints[&0]
                .as_str()
                .contains(r#""op0":"custom stateful step""#),
            "{checkpoints:?}"
        );
        let mut second = VecSource::json_batches(vec![vec![r#"{"k": "a"}"#, r#"{"k": "b"}"#]])
            .restoring(checkpoints);
        let mut sink = CollectSink::default();
        query().run(&mut second, &mut sink).unwrap();
        let keys: Vec<_> = sink.rows.iter().map(|r| r.get("k").cloned()).collect();
        assert_eq!(keys, [Some(Value::Str("b".into()))], "`a` was seen before");
    }

    /// A checkpoint of an encoding this release does not know (a newer
    /// release's) stops the restart instead of being misread or ignored.
    #[test]
    fn a_checkpoint_of_a_newer_encoding_is_refused() {
        // Not even today's fields: read as today's, it would be dropped.
        let newer = TaskCheckpoint::from_stored(r#"{"v": 99, "batch": {"id": 3}}"#);
        let e = counting(
            "newer",
            "1 minute",
            WindowSpec::tumbling("1 minute").unwrap(),
        )
        .build()
        .unwrap()
        .run(
            &mut VecSource::json_batches(vec![vec![r#"{"t": "2026-01-01T00:00:10Z", "k": "a"}"#]])
                .restoring([(0, newer)]),
            &mut CollectSink::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("partition 0") && e.contains("version 99"), "{e}");
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

    /// Nexmark q7's shape: per 10-second window, the bid with the highest
    /// price (max_by), in a tumbling and a session window.
    #[test]
    fn max_by_keeps_the_columns_of_the_row_with_the_largest_ordering() {
        use crate::operators::{AggregateSpec, OutputMode};
        use crate::row::Value;
        use crate::runtime::testing::{CollectSink, VecSource};
        use crate::runtime::{Query, Trigger};
        use crate::window::WindowSpec;
        for window in [
            WindowSpec::tumbling("10 seconds"),
            WindowSpec::session("5 seconds"),
        ] {
            let query = Query::builder("q7")
                .event_time("t")
                .watermark("0 seconds")
                .unwrap()
                .window_aggregate(
                    Vec::<&str>::new(),
                    window.unwrap(),
                    vec![
                        AggregateSpec::of("max", "price").unwrap(),
                        AggregateSpec::by("max_by", "auction", "price").unwrap(),
                        AggregateSpec::by("min_by", "auction", "price")
                            .unwrap()
                            .alias("cheapest"),
                    ],
                )
                .output_mode(OutputMode::Append)
                .trigger(Trigger::AvailableNow)
                .build()
                .unwrap();
            let bid = |s: u32, auction: &str, price: i64| {
                format!(
                    r#"{{"t": "2026-01-01T10:00:{s:02}Z", "auction": "{auction}", "price": {price}}}"#
                )
            };
            let first = [
                bid(1, "a", 5),
                bid(2, "b", 9),
                bid(3, "c", 9),
                bid(4, "d", 2),
            ];
            let second = [bid(31, "e", 1)];
            let mut source = VecSource::json_batches(vec![
                first.iter().map(String::as_str).collect(),
                second.iter().map(String::as_str).collect(),
            ]);
            let mut sink = CollectSink::default();
            query.run(&mut source, &mut sink).unwrap();
            let row = &sink.rows[0];
            assert_eq!(row.get("max(price)"), Some(&Value::Long(9)));
            // Of two bids at the highest price, the first one seen.
            assert_eq!(
                row.get("max_by(auction, price)"),
                Some(&Value::Str("b".into()))
            );
            assert_eq!(row.get("cheapest"), Some(&Value::Str("d".into())));
        }
        assert!(AggregateSpec::of("max_by", "auction").is_err());
        assert!(AggregateSpec::by("max", "auction", "price").is_err());
    }
}
