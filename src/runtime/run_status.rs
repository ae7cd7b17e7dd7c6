//! What a running pipeline is doing, for the service embedding it: a
//! readiness probe (`/readyz`), a handle's `state()`, a listener told of
//! every change (Kafka Streams' `KafkaStreams.State` and its
//! `StateListener`).
//!
//! Each stage of a pipeline (one query, or the stages joined by
//! repartition topics) reports on a [`StageStatus`]; the run's state is the
//! least advanced of its stages', until a stop is asked for or the run
//! ends.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What a run is doing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Building its stages, connecting, joining the consumer group: no
    /// batch has run yet (again, after a restart from a failure worth
    /// retrying).
    Starting,
    /// A task restores its state from its changelog: its partitions'
    /// input is held back until it is done.
    Restoring,
    /// Every stage runs batches on restored state: ready.
    Running,
    /// A stop was asked for: the current batches finish and commit.
    Stopping,
    /// Ended cleanly: a stop, or the end of the input (`available_now`).
    Stopped,
    /// Ended with this error.
    Failed(String),
}

impl RunState {
    /// Whether the run serves: every stage running on restored state
    /// (what `/readyz` answers 200 for).
    pub fn is_ready(&self) -> bool {
        *self == RunState::Running
    }

    /// Whether the run has ended, cleanly or not.
    pub fn is_finished(&self) -> bool {
        matches!(self, RunState::Stopped | RunState::Failed(_))
    }

    /// The state's name, lower case (`starting`, `restoring`, `running`,
    /// `stopping`, `stopped`, `failed`).
    pub fn name(&self) -> &'static str {
        match self {
            RunState::Starting => "starting",
            RunState::Restoring => "restoring",
            RunState::Running => "running",
            RunState::Stopping => "stopping",
            RunState::Stopped => "stopped",
            RunState::Failed(_) => "failed",
        }
    }
}

/// Told of each change of a run's state, with the state before and after.
pub type RunStateListener = Arc<dyn Fn(&RunState, &RunState) + Send + Sync>;

/// The state of one run, shared by its stages, its HTTP services and the
/// application's handle. Clones share it.
#[derive(Clone, Default)]
pub struct RunStatus {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RunStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RunStatus").field(&self.state()).finish()
    }
}

#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    changed: Condvar,
}

#[derive(Default)]
struct Inner {
    /// Each stage's own progress.
    stages: Vec<StagePhase>,
    stopping: bool,
    /// How the run ended, once it has.
    ended: Option<RunState>,
    listeners: Vec<RunStateListener>,
}

/// How far one stage has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum StagePhase {
    Starting,
    Restoring,
    Running,
}

impl Inner {
    fn state(&self) -> RunState {
        if let Some(ended) = &self.ended {
            return ended.clone();
        }
        if self.stopping {
            return RunState::Stopping;
        }
        match self.stages.iter().min() {
            None | Some(StagePhase::Starting) => RunState::Starting,
            Some(StagePhase::Restoring) => RunState::Restoring,
            Some(StagePhase::Running) => RunState::Running,
        }
    }
}

impl RunStatus {
    /// A run starting, with no stage yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The run's state now.
    pub fn state(&self) -> RunState {
        self.lock().state()
    }

    /// Calls `listener` with the old and new state at each change, on the
    /// thread that made it: often the query's own, so it must be short and
    /// never block. Changes made on two threads at once (two stages, a
    /// stop) may reach it out of order; [`RunStatus::state`] is always the
    /// current state.
    pub fn on_change(&self, listener: impl Fn(&RunState, &RunState) + Send + Sync + 'static) {
        self.lock().listeners.push(Arc::new(listener));
    }

    /// Waits until `wanted` holds for the state or `timeout` passes;
    /// returns the state then.
    pub fn wait_until(&self, timeout: Duration, wanted: impl Fn(&RunState) -> bool) -> RunState {
        let deadline = Instant::now() + timeout;
        let mut inner = self.lock();
        loop {
            let state = inner.state();
            let left = deadline.saturating_duration_since(Instant::now());
            if wanted(&state) || left.is_zero() {
                return state;
            }
            inner = self
                .shared
                .changed
                .wait_timeout(inner, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The status stage `index` of the run reports on (stages count from
    /// 0; a stage not reported on yet counts as starting).
    pub fn stage(&self, index: usize) -> StageStatus {
        self.change(|inner| {
            if inner.stages.len() <= index {
                inner.stages.resize(index + 1, StagePhase::Starting);
            }
        });
        StageStatus {
            status: self.clone(),
            index,
        }
    }

    /// A stop was asked for.
    pub fn stopping(&self) {
        self.change(|inner| inner.stopping = true);
    }

    /// The run ended: stopped when `error` is `None`, failed with it
    /// otherwise. Later calls change nothing.
    pub fn ended(&self, error: Option<String>) {
        self.change(|inner| {
            inner.ended.get_or_insert(match error {
                None => RunState::Stopped,
                Some(error) => RunState::Failed(error),
            });
        });
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `edit`, then wakes the waiters and tells the listeners when
    /// the state changed (outside the lock: a listener may read it).
    fn change(&self, edit: impl FnOnce(&mut Inner)) {
        let (before, after, listeners) = {
            let mut inner = self.lock();
            let before = inner.state();
            edit(&mut inner);
            let after = inner.state();
            if before == after {
                return;
            }
            (before, after, inner.listeners.clone())
        };
        self.shared.changed.notify_all();
        tracing::info!(from = before.name(), to = after.name(), "run state");
        for listener in listeners {
            listener(&before, &after);
        }
    }

    fn set_stage(&self, index: usize, phase: StagePhase) {
        // Cheap when nothing changes: the loop reports at every turn.
        {
            let inner = self.lock();
            if inner.stages.get(index) == Some(&phase) {
                return;
            }
        }
        self.change(|inner| {
            if inner.stages.len() <= index {
                inner.stages.resize(index + 1, StagePhase::Starting);
            }
            inner.stages[index] = phase;
        });
    }
}

/// What one stage of a run reports on (see [`RunStatus::stage`]).
#[derive(Debug, Clone)]
pub struct StageStatus {
    status: RunStatus,
    index: usize,
}

impl StageStatus {
    /// The stage is (re)building: no batch yet.
    pub fn starting(&self) {
        self.status.set_stage(self.index, StagePhase::Starting);
    }

    /// One of the stage's tasks restores its state.
    pub fn restoring(&self) {
        self.status.set_stage(self.index, StagePhase::Restoring);
    }

    /// The stage runs batches on restored state.
    pub fn running(&self) {
        self.status.set_stage(self.index, StagePhase::Running);
    }

    /// The stage saw a stop asked for: the run is stopping.
    pub fn stopping(&self) {
        if !self.status.lock().stopping {
            self.status.stopping();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_as_far_as_its_least_advanced_stage_until_it_stops() {
        let status = RunStatus::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        status.on_change(move |_, after| record.lock().unwrap().push(after.name()));
        assert_eq!(status.state(), RunState::Starting);
        let (writer, reader) = (status.stage(0), status.stage(1));
        writer.running();
        assert_eq!(status.state(), RunState::Starting);
        reader.restoring();
        assert_eq!(status.state(), RunState::Restoring);
        reader.running();
        assert!(status.state().is_ready());
        // A restart of one stage takes the run out of ready.
        writer.starting();
        assert_eq!(status.state(), RunState::Starting);
        writer.running();
        status.stopping();
        assert_eq!(status.state(), RunState::Stopping);
        status.ended(Some("broker gone".into()));
        status.ended(None);
        assert_eq!(status.state(), RunState::Failed("broker gone".into()));
        assert!(status.state().is_finished());
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                "restoring",
                "running",
                "starting",
                "running",
                "stopping",
                "failed"
            ]
        );
    }

    #[test]
    fn a_waiter_wakes_at_the_change_it_waits_for() {
        let status = RunStatus::new();
        let stage = status.stage(0);
        let waiter = {
            let status = status.clone();
            std::thread::spawn(move || {
                status.wait_until(Duration::from_secs(30), RunState::is_ready)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        stage.running();
        assert_eq!(waiter.join().unwrap(), RunState::Running);
        assert_eq!(
            status.wait_until(Duration::from_millis(10), RunState::is_finished),
            RunState::Running
        );
    }
}
