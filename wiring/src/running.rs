//! A pipeline running inside a service: [`PipelineRunner::start`] runs it
//! on a thread of its own and hands back a [`RunningPipeline`] to stop it,
//! wait for it (blocking, or `.await` beside an HTTP server on tokio), and
//! ask what it is doing (Kafka Streams' `KafkaStreams`: `start`, `close`,
//! `state`, a state listener).
//!
//! ```no_run
//! # async fn service() -> Result<(), Box<dyn std::error::Error>> {
//! use tidemark_pipeline::PipelineFile;
//! use tidemark_connectors::PipelineRunner;
//! use std::time::Duration;
//! let file = PipelineFile::parse(&std::fs::read_to_string("pipeline.yaml").unwrap())?;
//! let running = PipelineRunner::new(file, ".").start()?;
//! running.status().on_change(|from, to| println!("{} -> {}", from.name(), to.name()));
//! // ... on SIGTERM:
//! running.stop();
//! let summary = running.join().await?;
//! println!("{} rows out", summary.output_rows);
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::progress::QueryProgress;
use tidemark::runtime::{RunState, RunStatus, RunSummary, StateReader, StopHandle};

/// What a running pipeline's handle reaches into: handed over by the
/// runner that starts the run, so this module needs no runner.
pub(crate) struct RunHandles {
    pub(crate) stop: StopHandle,
    pub(crate) status: RunStatus,
    pub(crate) state: StateReader,
    pub(crate) last_progress: LastProgress,
}

/// Each stage's last progress report, by stage name.
#[derive(Debug, Clone, Default)]
pub(crate) struct LastProgress(
    Arc<std::sync::Mutex<std::collections::BTreeMap<String, QueryProgress>>>,
);

impl LastProgress {
    pub(crate) fn record(&self, stage: &str, progress: &QueryProgress) {
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        last.insert(stage.to_string(), progress.clone());
    }

    /// The reports, by stage name.
    pub(crate) fn reports(&self) -> std::collections::BTreeMap<String, QueryProgress> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A pipeline running on its own thread (see the module documentation).
/// Dropping it asks the run to stop and does not wait.
pub struct RunningPipeline {
    stop: StopHandle,
    last_progress: LastProgress,
    status: RunStatus,
    state: StateReader,
    result: Option<tokio::sync::oneshot::Receiver<Result<RunSummary>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningPipeline {
    /// Runs `run` (a [`crate::PipelineRunner`]'s run) on a thread named
    /// `tidemark-pipeline`; `handles` reach into it.
    pub(crate) fn start(
        handles: RunHandles,
        run: impl FnOnce() -> Result<RunSummary> + Send + 'static,
    ) -> Result<Self> {
        let RunHandles {
            stop,
            status,
            state,
            last_progress,
        } = handles;
        let (send, result) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("tidemark-pipeline".into())
            .spawn(move || {
                // The receiver may be gone (the handle dropped): nothing
                // waits for the result then.
                let _ = send.send(run());
            })
            .map_err(|e| Error::io("starting the pipeline's thread", e))?;
        Ok(RunningPipeline {
            stop,
            last_progress,
            status,
            state,
            result: Some(result),
            thread: Some(thread),
        })
    }

    /// Stops the run on SIGTERM or SIGINT (see [`stop_on_signals`]).
    pub fn stop_on_signals(&self) -> Result<()> {
        stop_on_signals(self.stop.clone(), self.status.clone(), |_| {})
    }

    /// Asks every stage to stop after its current batch (committed, its
    /// stores closed, the Delta lease released); returns at once.
    pub fn stop(&self) {
        self.status.stopping();
        self.stop.stop();
    }

    /// A handle that stops the run (as [`Self::stop`]) from elsewhere: a
    /// signal handler, while [`Self::join`] is awaited.
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// What the run is doing now.
    pub fn state(&self) -> RunState {
        self.status.state()
    }

    /// The run's status: its state, a listener told of each change, a wait
    /// for a state (`status().wait_until(timeout, RunState::is_ready)`).
    pub fn status(&self) -> &RunStatus {
        &self.status
    }

    /// Each stage's last progress report, by stage name (the pipeline's own
    /// name for the stage writing the sink); empty before a first batch.
    pub fn last_progress(&self) -> BTreeMap<String, QueryProgress> {
        self.last_progress.reports()
    }

    /// The input partitions (`topic`, `partition`) the stages read in
    /// their last batches: this instance's assignment, as of those batches.
    pub fn assigned_partitions(&self) -> BTreeSet<(String, i32)> {
        let mut assigned = BTreeSet::new();
        for report in self.last_progress.reports().values() {
            for source in &report.sources {
                let Some(topics) = source.end_offset.as_object() else {
                    continue;
                };
                for (topic, partitions) in topics {
                    let numbers = partitions.as_object().into_iter().flat_map(|p| p.keys());
                    assigned.extend(
                        numbers
                            .filter_map(|n| n.parse().ok())
                            .map(|n| (topic.clone(), n)),
                    );
                }
            }
        }
        assigned
    }

    /// Each partition's lag at the end of its stage's last batch (see
    /// `SourceProgress::partition_lags`): `(topic, partition, records)`.
    pub fn lag(&self) -> Vec<(String, String, i64)> {
        self.last_progress
            .reports()
            .values()
            .flat_map(|report| report.sources.iter().flat_map(|s| s.partition_lags()))
            .collect()
    }

    /// Reads the state of the stage writing the sink (interactive queries).
    pub fn state_reader(&self) -> StateReader {
        self.state.clone()
    }

    /// Blocks until the run ends; its summary, or the error that ended it.
    /// Not for async code (it blocks the thread): use [`Self::join`] there.
    pub fn wait(mut self) -> Result<RunSummary> {
        let result = self.take_result().blocking_recv();
        self.join_thread();
        result.unwrap_or_else(|_| Err(panicked()))
    }

    /// Waits, without blocking a tokio worker, until the run ends.
    pub async fn join(mut self) -> Result<RunSummary> {
        let result = self.take_result().await;
        // The thread sent its result as its last act: joining it is brief.
        self.join_thread();
        result.unwrap_or_else(|_| Err(panicked()))
    }

    /// Stops the run and waits for it for at most `deadline`: its summary,
    /// or an error when it did not end in time (it goes on stopping, on its
    /// own thread; a batch stuck on a broker that is away holds it up to
    /// the Kafka clients' timeouts). It blocks: from async code, call
    /// [`Self::stop`] and await [`Self::join`] under `tokio::time::timeout`.
    pub fn stop_within(self, deadline: Duration) -> Result<RunSummary> {
        self.stop();
        let ended = self.status.wait_until(deadline, RunState::is_finished);
        if !ended.is_finished() {
            return Err(Error::Internal(format!(
                "the pipeline did not stop within {} ms (it was {})",
                deadline.as_millis(),
                ended.name()
            )));
        }
        self.wait()
    }

    fn take_result(&mut self) -> tokio::sync::oneshot::Receiver<Result<RunSummary>> {
        self.result
            .take()
            .expect("the result is taken once, by value")
    }

    fn join_thread(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningPipeline {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}

/// The run's thread ended without a result: it panicked.
fn panicked() -> Error {
    Error::Internal("the pipeline's thread panicked".into())
}

/// Stops a run on SIGTERM (what orchestrators send) or SIGINT (Ctrl-C):
/// `status` reports `stopping` at once (so `/readyz` turns away traffic)
/// and `stop` ends the run after its current batch, committed. Listens on
/// a thread of its own; returns once listening. `on_signal` is told which
/// signal came (`interrupt` or `SIGTERM`) before the run is asked to stop.
pub fn stop_on_signals(
    stop: StopHandle,
    status: RunStatus,
    on_signal: impl FnOnce(&'static str) + Send + 'static,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the signal listener", e))?;
    let mut terminate = {
        let _entered = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| Error::io("listening for SIGTERM", e))?
    };
    std::thread::Builder::new()
        .name("tidemark-signals".into())
        .spawn(move || {
            let signal = runtime.block_on(async {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => "interrupt",
                    _ = terminate.recv() => "SIGTERM",
                }
            });
            tracing::info!(signal, "stopping after the current batch");
            on_signal(signal);
            status.stopping();
            stop.stop();
        })
        .map_err(|e| Error::io("starting the signal listener", e))?;
    Ok(())
}
