//! A pipeline running inside a service: [`PipelineRunner::start`] runs it
//! on a thread of its own and hands back a [`RunningPipeline`] to stop it,
//! wait for it (blocking, or `.await` beside an HTTP server on tokio), and
//! ask what it is doing (Kafka Streams' `KafkaStreams`: `start`, `close`,
//! `state`, a state listener).
//!
//! ```no_run
//! # async fn service() -> Result<(), Box<dyn std::error::Error>> {
//! use tidemark::pipeline::PipelineFile;
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

use crate::PipelineRunner;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::runtime::{RunState, RunStatus, RunSummary, StateReader, StopHandle};

/// A pipeline running on its own thread (see the module documentation).
/// Dropping it asks the run to stop and does not wait.
pub struct RunningPipeline {
    stop: StopHandle,
    status: RunStatus,
    state: StateReader,
    result: Option<tokio::sync::oneshot::Receiver<Result<RunSummary>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningPipeline {
    /// Runs `runner` on a thread named `tidemark-pipeline`.
    pub(crate) fn start(runner: PipelineRunner) -> Result<Self> {
        let (stop, status, state) = (runner.stopper(), runner.run_status(), runner.state_reader());
        let (send, result) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("tidemark-pipeline".into())
            .spawn(move || {
                // The receiver may be gone (the handle dropped): nothing
                // waits for the result then.
                let _ = send.send(runner.run());
            })
            .map_err(|e| Error::io("starting the pipeline's thread", e))?;
        Ok(RunningPipeline {
            stop,
            status,
            state,
            result: Some(result),
            thread: Some(thread),
        })
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
