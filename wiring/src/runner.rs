//! Runs a pipeline file to its end: one query, or — when a grouping does not
//! include the record key's columns, or joined topics are not co-partitioned
//! — the stages
//! of its repartitioning joined by repartition topics, as Kafka Streams runs
//! sub-topologies. The CLI's `tidemark run` is this plus a status line, the
//! `metrics.prometheus` endpoint and Ctrl-C; a library user gets the same
//! stages, restarts and stop handling, and serves metrics and signals as
//! the application does.
//!
//! ```no_run
//! use tidemark_pipeline::PipelineFile;
//! use tidemark_connectors::PipelineRunner;
//! let file = PipelineFile::parse(&std::fs::read_to_string("pipeline.yaml").unwrap()).unwrap();
//! let summary = PipelineRunner::new(file, ".")
//!     .on_progress(|stage: &str, p: &tidemark::progress::QueryProgress| {
//!         println!("{stage}: batch {}", p.batch_id)
//!     })
//!     .run()
//!     .unwrap();
//! println!("{} rows out", summary.output_rows);
//! ```

use crate::instance::InstanceIdentity;
use crate::running::{LastProgress, RunHandles};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark::progress::QueryProgress;
use tidemark::runtime::{
    RunStatus, RunSummary, Stage, StageOutput, StageStatus, StateReader, StateService, StopHandle,
    Topology, Trigger,
};
use tidemark_pipeline::PipelineFile;

/// Told of each batch's progress, with the name of the stage that ran it.
type StageProgress = Arc<dyn Fn(&str, &QueryProgress) + Send + Sync>;

/// Runs a pipeline file: its stages, restarts after transient failures,
/// and a stop handle shared by every stage.
pub struct PipelineRunner {
    file: PipelineFile,
    base: PathBuf,
    stop: StopHandle,
    progress: StageProgress,
    /// Interactive queries reach the stage writing the sink through it,
    /// across that stage's restarts.
    state: StateService,
    /// The progress of the stage writing the sink, for the web page.
    history: tidemark_serve::ProgressHistory,
    /// Each stage's last progress report, by stage name.
    last_progress: LastProgress,
    /// Whether the run starts, restores, runs or ended (`/readyz`).
    status: RunStatus,
}

/// How long a stage may keep failing before the run gives up, unless the
/// pipeline says otherwise (`task_timeout`; Kafka Streams'
/// `task.timeout.ms` is 5 minutes too).
pub const DEFAULT_TASK_TIMEOUT: Duration = Duration::from_secs(300);

impl PipelineRunner {
    /// A runner for `file`, whose relative paths (state directory, files
    /// source and sink, schemas) resolve against `base`.
    pub fn new(file: PipelineFile, base: impl Into<PathBuf>) -> Self {
        PipelineRunner {
            file,
            base: base.into(),
            stop: StopHandle::default(),
            progress: Arc::new(|_: &str, _: &QueryProgress| {}),
            state: StateService::default(),
            history: Default::default(),
            last_progress: LastProgress::default(),
            status: RunStatus::new(),
        }
    }

    /// Stops every stage after its current batch when `stop` is stopped.
    /// The runner stops it too when a stage fails for good, so that the
    /// other stages end.
    pub fn stop_handle(mut self, stop: StopHandle) -> Self {
        self.stop = stop;
        self
    }

    /// Calls `listener` after each batch of each stage, with the stage's
    /// name (the pipeline's own name for the stage that writes its sink).
    pub fn on_progress(
        mut self,
        listener: impl Fn(&str, &QueryProgress) + Send + Sync + 'static,
    ) -> Self {
        self.progress = Arc::new(listener);
        self
    }

    /// Reads the state of the stage writing the sink while the pipeline
    /// runs (interactive queries; `serve:` serves the same over HTTP).
    pub fn state_reader(&self) -> StateReader {
        self.state.reader()
    }

    /// The pipeline file it runs.
    pub fn file(&self) -> &PipelineFile {
        &self.file
    }

    /// What the run is doing (starting, restoring, running, stopping,
    /// stopped, failed), shared with the HTTP services' `/readyz`.
    pub fn run_status(&self) -> RunStatus {
        self.status.clone()
    }

    /// Starts the run on a thread of its own and returns its handle: stop
    /// it, wait for it (blocking or from async code), ask its state. See
    /// [`crate::RunningPipeline`].
    pub fn start(self) -> Result<crate::RunningPipeline> {
        let handles = RunHandles {
            stop: self.stopper(),
            status: self.run_status(),
            state: self.state_reader(),
            last_progress: self.last_progress(),
        };
        crate::RunningPipeline::start(handles, move || self.run())
    }

    /// Each stage's last progress report (shared with the handle).
    pub(crate) fn last_progress(&self) -> LastProgress {
        self.last_progress.clone()
    }

    /// The handle stopping every stage of this runner.
    pub(crate) fn stopper(&self) -> StopHandle {
        self.stop.clone()
    }

    /// The stages this pipeline runs in ([`PipelineFile::topology`]).
    /// Joined topics with different partition counts are looked up on the
    /// broker: such a join is repartitioned.
    pub fn topology(&self) -> Result<Topology> {
        self.file
            .topology(!crate::join_needs_repartition(&self.file)?)
    }

    /// Runs until the input ends (`available_now`) or a stop; returns the
    /// summary of the stage that writes the pipeline's sink.
    pub fn run(&self) -> Result<RunSummary> {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run_stages()));
        match result {
            Ok(result) => {
                self.status
                    .ended(result.as_ref().err().map(|e| e.to_string()));
                result
            }
            Err(panic) => {
                // The status ends too: a listener or a waiter is told.
                self.status.ended(Some("a stage panicked".into()));
                std::panic::resume_unwind(panic)
            }
        }
    }

    fn run_stages(&self) -> Result<RunSummary> {
        // Served first: its `/healthz` answers (and `/readyz` says
        // `starting`) while the cluster is checked and waited for.
        let _metrics = crate::serving::start_prometheus(&self.file, &self.base, &self.status)?;
        // One identity for the process, kept across restarts of its stages:
        // every stage's transactional id derives from it.
        let identity = Arc::new(crate::instance_identity(&self.file, &self.base)?);
        tracing::info!(instance = identity.id(), origin = ?identity.origin(), "instance identity");
        // Refused credentials are a configuration error, not a reason to
        // retry: found before anything else talks to the cluster.
        crate::KafkaClients::of_pipeline(&self.file)?.check(&self.file)?;
        let co_partitioned = !crate::join_needs_repartition(&self.file)?;
        let topology = self.file.topology(co_partitioned)?;
        if self.file.source.kind == tidemark_pipeline::SourceKind::Kafka {
            // A broker restarting as this process starts is waited for, as
            // a running stage waits for it, not the end of the run.
            let timeout = self.file.task_timeout.map_or(DEFAULT_TASK_TIMEOUT, |t| t.0);
            retry_transient("start", &self.stop, timeout, &Progress::default(), || {
                crate::ensure_repartition_topics(&self.file, &topology)?;
                crate::check_output_topics(&self.file)
            })?;
        } else {
            crate::check_output_topics(&self.file)?;
        }
        let _server =
            crate::serving::start(&self.file, &self.base, &topology, &self.state, &self.status)?;
        let _ui = crate::serving::start_ui(&self.file, &self.base, &self.history, &self.status)?;
        let names: Vec<String> = topology.stages.iter().map(|s| s.name.clone()).collect();
        // Every stage counts from the start: under available_now the later
        // ones wait for the earlier, and the run is not ready meanwhile.
        for index in 0..names.len() {
            self.status.stage(index);
        }
        run_stages(&names, self.file.trigger.0, &self.stop, |index| {
            self.run_stage(&names[index], index, co_partitioned, &identity)
        })
    }

    /// Runs stage `index` until it ends or a stop. A failed batch is never
    /// half-committed: rebuilding the query resumes from the last commit
    /// (state from the changelog, offsets from the group). Transient
    /// failures — a broker restart, a fenced transaction (this process was
    /// a zombie: it drops its tasks, rejoins the group and carries on under
    /// its own id) — are retried with a capped backoff; configuration
    /// errors are not.
    fn run_stage(
        &self,
        name: &str,
        index: usize,
        co_partitioned: bool,
        identity: &Arc<InstanceIdentity>,
    ) -> Result<RunSummary> {
        let timeout = self.file.task_timeout.map_or(DEFAULT_TASK_TIMEOUT, |t| t.0);
        let committed = Progress::default();
        let status = self.status.stage(index);
        retry_transient(name, &self.stop, timeout, &committed, || {
            // The stage is planned afresh for each run: its operators and
            // connectors are built anew from the file.
            let stage = self
                .file
                .topology(co_partitioned)?
                .stages
                .swap_remove(index);
            let run = self.run_once(stage, identity, committed.clone(), &status);
            if run.is_err() {
                // Until it is rebuilt (after a backoff, or never).
                status.starting();
            }
            run
        })
    }

    fn run_once(
        &self,
        stage: Stage,
        identity: &Arc<InstanceIdentity>,
        committed: Progress,
        status: &StageStatus,
    ) -> Result<RunSummary> {
        let serves_state = stage.output == StageOutput::Sink;
        let connected = crate::connect_stage(&self.file, &stage, &self.base, identity)?;
        let (progress, name) = (self.progress.clone(), stage.name.clone());
        let history = serves_state.then(|| self.history.clone());
        let last_progress = self.last_progress.clone();
        let (query, mut source, mut sink) = connected.wire(stage.query);
        let query = match serves_state {
            true => query.state_service(&self.state),
            false => query,
        };
        let query = query
            .on_progress(move |p: &QueryProgress| {
                committed.batch_committed();
                if let Some(history) = &history {
                    history.record(p);
                }
                last_progress.record(&name, p);
                progress(&name, p)
            })
            .build()?
            .with_stop_handle(self.stop.clone())
            .with_run_status(status.clone());
        query.run(source.as_mut(), sink.as_mut())
    }
}

/// Runs `stages` (writers first, the stage writing the sink last) with
/// `run_stage(index)`; returns the last one's summary. Under
/// `available_now` the writers run to their end first, so that the
/// reader's end offsets include everything they wrote; otherwise all run
/// at once, each on its own thread, and one failing for good (or
/// panicking) stops the others.
pub(crate) fn run_stages(
    stages: &[String],
    trigger: Trigger,
    stop: &StopHandle,
    run_stage: impl Fn(usize) -> Result<RunSummary> + Sync,
) -> Result<RunSummary> {
    let reader = stages.len().saturating_sub(1);
    if trigger == Trigger::AvailableNow {
        for writer in 0..reader {
            run_stage(writer)?;
        }
        return run_stage(reader);
    }
    std::thread::scope(|scope| {
        let run_stage = &run_stage;
        let running: Vec<_> = (0..reader)
            .map(|writer| {
                scope.spawn(move || {
                    // A writer that fails or panics stops the reader, which
                    // would otherwise wait for its rows forever.
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_stage(writer)
                    }));
                    if !matches!(result, Ok(Ok(_))) {
                        stop.stop();
                    }
                    result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
            })
            .collect();
        let result = run_stage(reader);
        if result.is_err() {
            stop.stop();
        }
        for writer in running {
            // A writer's panic is this run's panic, not a batch to retry.
            writer
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
        }
        result
    })
}

/// Calls `run` until it succeeds, fails for good, or `stop` is stopped,
/// backing off between transient failures (500 ms doubling to 32 s; a run
/// that committed a batch, as `progress` counts, starts a new streak). A
/// streak of failures longer
/// than `give_up_after` is the run's failure: the process reports it
/// (`tidemark run` exits non-zero) instead of warning for ever.
pub(crate) fn retry_transient<T>(
    stage: &str,
    stop: &StopHandle,
    give_up_after: Duration,
    progress: &Progress,
    mut run: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut failures = 0u32;
    let mut failing_since: Option<Instant> = None;
    loop {
        let committed_before = progress.committed();
        match run() {
            Ok(summary) => return Ok(summary),
            Err(e) if is_transient(&e) && !stop.is_stopped() => {
                // A run that committed a batch is a fresh start: a failure
                // hours later is not the seventh in a row. One that only
                // lasted is not (a batch failing the same way every few
                // minutes would otherwise restart for ever).
                if progress.committed() != committed_before {
                    failures = 0;
                    failing_since = None;
                }
                // The streak's clock starts at its first failure, not at
                // the start of a run that may have gone well for hours.
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= give_up_after {
                    tracing::error!(stage, error = %e, failing_for_s = since.elapsed().as_secs(), "no progress within task_timeout; giving up");
                    return Err(e);
                }
                failures += 1;
                let backoff = Duration::from_millis(500 * 2u64.pow(failures.min(6)));
                tracing::warn!(stage, error = %e, failures, backoff_ms = backoff.as_millis() as u64, "query failed; restarting from the last commit");
                std::thread::sleep(backoff);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Counts the batches a stage committed, across its rebuilds: what tells
/// [`retry_transient`] that a failed run had made progress.
#[derive(Debug, Default, Clone)]
pub(crate) struct Progress(Arc<AtomicU64>);

impl Progress {
    /// One more batch committed.
    pub(crate) fn batch_committed(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    /// Batches committed so far.
    pub(crate) fn committed(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Whether rebuilding the query may succeed: configuration and expression
/// errors, output the broker refuses for good, a failed internal invariant
/// and stored bytes of a newer encoding will fail the same way again.
/// Corrupt stored bytes ([`Error::Corrupt`]) are retried within the task
/// timeout: a rebuild whose task was left mid-batch restores its store from
/// the changelog, which can mend a corrupt local copy.
pub fn is_transient(error: &Error) -> bool {
    !matches!(
        error,
        Error::Config { .. }
            | Error::Expression { .. }
            | Error::Undeliverable { .. }
            | Error::Internal(_)
            | Error::Processor { .. }
            | Error::UnknownEncoding { .. }
            | Error::State(tidemark::error::StateError::UnknownLayout { .. })
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage that keeps failing with a retryable error fails the run once
    /// the streak outlasts the task timeout; a configuration error at once.
    #[test]
    fn a_failure_streak_longer_than_the_task_timeout_fails_the_run() {
        let stop = StopHandle::default();
        let mut attempts = 0;
        let started = Instant::now();
        let none = Progress::default();
        let e =
            retry_transient::<RunSummary>("s", &stop, Duration::from_millis(1500), &none, || {
                attempts += 1;
                Err(Error::Source("broker down".into()))
            })
            .unwrap_err();
        assert!(matches!(e, Error::Source(_)), "{e}");
        assert!(attempts >= 2, "{attempts}");
        assert!(started.elapsed() >= Duration::from_millis(1500));
        // A failure after a run that committed batches for longer than the
        // timeout is retried, not the end of the run.
        let mut attempts = 0;
        let progress = Progress::default();
        let summary = retry_transient("s", &stop, Duration::from_millis(100), &progress, || {
            attempts += 1;
            if attempts <= 2 {
                std::thread::sleep(Duration::from_millis(300));
                progress.batch_committed();
                return Err(Error::Source("a broker blip".into()));
            }
            Ok(RunSummary::default())
        });
        assert!(summary.is_ok(), "{summary:?}");
        // Runs that last but commit nothing (a batch that fails the same
        // way each time) are one streak, however long each run is.
        let mut attempts = 0;
        retry_transient::<RunSummary>("s", &stop, Duration::from_millis(100), &none, || {
            attempts += 1;
            std::thread::sleep(Duration::from_millis(300));
            Err(Error::Source("the same failure again".into()))
        })
        .unwrap_err();
        assert_eq!(attempts, 2, "the streak began at the first failure");
        let mut attempts = 0;
        retry_transient::<RunSummary>("s", &stop, Duration::from_secs(60), &none, || {
            attempts += 1;
            Err(Error::config("source.topic", "no such topic"))
        })
        .unwrap_err();
        assert_eq!(attempts, 1);
    }
}
