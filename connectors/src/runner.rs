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
//! use tidemark::pipeline::PipelineFile;
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
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark::pipeline::{PipelineFile, RepartitionStages};
use tidemark::progress::QueryProgress;
use tidemark::runtime::{RunSummary, StopHandle, Trigger};

/// Told of each batch's progress, with the name of the stage that ran it.
type StageProgress = Arc<dyn Fn(&str, &QueryProgress) + Send + Sync>;

/// Runs a pipeline file: its stages, restarts after transient failures,
/// and a stop handle shared by every stage.
pub struct PipelineRunner {
    file: PipelineFile,
    base: PathBuf,
    stop: StopHandle,
    progress: StageProgress,
}

/// How long a run must last for its failure to start a new streak of
/// backoffs.
const FAILURE_STREAK_RESET: Duration = Duration::from_secs(60);

impl PipelineRunner {
    /// A runner for `file`, whose relative paths (state directory, files
    /// source and sink, schemas) resolve against `base`.
    pub fn new(file: PipelineFile, base: impl Into<PathBuf>) -> Self {
        PipelineRunner {
            file,
            base: base.into(),
            stop: StopHandle::default(),
            progress: Arc::new(|_: &str, _: &QueryProgress| {}),
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

    /// The stages this pipeline runs as, if it is repartitioned. Joined
    /// topics with different partition counts are looked up on the broker.
    pub fn repartition_stages(&self) -> Result<Option<RepartitionStages>> {
        Ok(match self.file.repartition_stages() {
            Some(stages) => Some(stages),
            None if crate::join_needs_repartition(&self.file)? => {
                self.file.join_repartition_stages()
            }
            None => None,
        })
    }

    /// Runs until the input ends (`available_now`) or a stop; returns the
    /// summary of the stage that writes the pipeline's sink.
    pub fn run(&self) -> Result<RunSummary> {
        // One identity for the process, kept across restarts of its stages:
        // every stage's transactional id derives from it.
        let identity = Arc::new(crate::instance_identity(&self.file, &self.base)?);
        tracing::info!(instance = identity.id(), origin = ?identity.origin(), "instance identity");
        let Some(stages) = self.repartition_stages()? else {
            return self.run_stage(&self.file, &identity);
        };
        crate::ensure_repartition_topic(&self.file, &stages)?;
        let writers: Vec<&PipelineFile> = std::iter::once(&stages.writer)
            .chain(stages.side_writer.as_ref().map(|(_, w)| w))
            .collect();
        if self.file.trigger.0 == Trigger::AvailableNow {
            // The reader's end offsets must include everything the writers
            // wrote: run the writers to the end first.
            for writer in writers {
                self.run_stage(writer, &identity)?;
            }
            return self.run_stage(&stages.reader, &identity);
        }
        std::thread::scope(|scope| {
            let running: Vec<_> = writers
                .into_iter()
                .map(|writer| {
                    let identity = &identity;
                    scope.spawn(move || {
                        // A writer that fails or panics stops the reader,
                        // which would otherwise wait for its rows forever.
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            self.run_stage(writer, identity)
                        }));
                        if !matches!(result, Ok(Ok(_))) {
                            self.stop.stop();
                        }
                        result.unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                    })
                })
                .collect();
            let reader = self.run_stage(&stages.reader, &identity);
            if reader.is_err() {
                self.stop.stop();
            }
            for writer in running {
                // A writer's panic is this run's panic, not a batch to retry.
                writer
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))?;
            }
            reader
        })
    }

    /// Runs one stage until it ends or a stop. A failed batch is never
    /// half-committed: rebuilding the query resumes from the last commit
    /// (state from the changelog, offsets from the group). Transient
    /// failures — a broker restart, a fenced transaction (this process was
    /// a zombie: it drops its tasks, rejoins the group and carries on under
    /// its own id) — are retried with a capped backoff; configuration
    /// errors are not.
    fn run_stage(
        &self,
        stage: &PipelineFile,
        identity: &Arc<InstanceIdentity>,
    ) -> Result<RunSummary> {
        let mut failures = 0u32;
        loop {
            let started = Instant::now();
            match self.run_once(stage, identity) {
                Ok(summary) => return Ok(summary),
                Err(e) if is_transient(&e) && !self.stop.is_stopped() => {
                    // A run that lasted is a fresh start: a failure hours
                    // later is not the seventh in a row.
                    if started.elapsed() > FAILURE_STREAK_RESET {
                        failures = 0;
                    }
                    failures += 1;
                    let backoff = Duration::from_millis(500 * 2u64.pow(failures.min(6)));
                    tracing::warn!(stage = %stage.name, error = %e, failures, backoff_ms = backoff.as_millis() as u64, "query failed; restarting from the last commit");
                    std::thread::sleep(backoff);
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn run_once(
        &self,
        stage: &PipelineFile,
        identity: &Arc<InstanceIdentity>,
    ) -> Result<RunSummary> {
        let connected = crate::connect_as(stage, &self.base, identity)?;
        let (progress, name) = (self.progress.clone(), stage.name.clone());
        let (query, mut source, mut sink) = connected.wire(stage.query_builder()?);
        let query = query
            .on_progress(move |p: &QueryProgress| progress(&name, p))
            .build()?
            .with_stop_handle(self.stop.clone());
        query.run(source.as_mut(), sink.as_mut())
    }
}

/// Whether rebuilding the query may succeed: configuration and expression
/// errors will fail the same way again.
pub fn is_transient(error: &Error) -> bool {
    !matches!(error, Error::Config { .. } | Error::Expression { .. })
}
