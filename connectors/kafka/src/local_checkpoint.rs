//! The checkpoint file a task leaves next to its RocksDB files: the
//! changelog offset each store's local files reflect, so that a restart
//! restores only what came after (and a standby resumes from it). Written at
//! a clean close, and while running a few seconds after a commit that left
//! nothing written since; removed before the next write (see
//! [`TaskCheckpointGuard`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark_state::{Entries, Entry, RestoreEntries, StateError, StateStore};

/// The file a cleanly closed task leaves next to its RocksDB files.
pub(crate) const CHECKPOINT_FILE: &str = ".checkpoint";

/// Changelog offset (exclusive) each store's local files reflect.
pub(crate) type LocalCheckpoint = std::collections::BTreeMap<String, i64>;

/// Reads and deletes the task's checkpoint file: from now on the local
/// files change, and a crash before the next clean close must not trust
/// them. Missing or unreadable: empty.
pub(crate) fn take_local_checkpoint(file: &std::path::Path) -> LocalCheckpoint {
    let Ok(text) = std::fs::read_to_string(file) else {
        return LocalCheckpoint::new();
    };
    let _ = std::fs::remove_file(file);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        tracing::warn!(file = %file.display(), error = %e, "unreadable local checkpoint ignored");
        LocalCheckpoint::new()
    })
}

/// Reads a checkpoint file without deleting it; missing or unreadable:
/// empty.
pub(crate) fn read_local_checkpoint(file: &std::path::Path) -> LocalCheckpoint {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

/// Writes the checkpoint file atomically (temporary file, then rename).
pub(crate) fn write_local_checkpoint(
    file: &std::path::Path,
    checkpoint: &LocalCheckpoint,
) -> Result<()> {
    let text = serde_json::to_string(checkpoint).map_err(|e| Error::Source(e.to_string()))?;
    let temporary = file.with_extension("tmp");
    std::fs::write(&temporary, text)
        .and_then(|_| std::fs::rename(&temporary, file))
        .map_err(|e| Error::io(format!("writing {}", file.display()), e))
}

/// Where a task's local files stand against its changelogs, so that a
/// checkpoint file is written only when it tells the truth and removed
/// before it stops doing so.
///
/// A checkpoint written after a commit lets a restart (after an error, a
/// crash, a kill) replay only the changelog's tail instead of all of it.
/// It is true only while the local files hold nothing the changelog does
/// not: the first write after it removes the file, before the write lands.
pub(crate) struct TaskCheckpointGuard {
    file: PathBuf,
    state: AtomicU8,
    /// Restores of the task's stores still running (on restore threads).
    restoring: AtomicUsize,
    last_written: Mutex<Option<Instant>>,
}

/// Written since the last commit (or restoring): no checkpoint may vouch.
const DIRTY: u8 = 0;
/// Nothing written since the last commit: a checkpoint may be written.
const COMMITTED: u8 = 1;
/// The checkpoint file on disk matches the local files.
const VOUCHED: u8 = 2;

impl TaskCheckpointGuard {
    /// A guard for the task whose checkpoint file is `file`.
    pub(crate) fn new(file: PathBuf) -> Self {
        TaskCheckpointGuard {
            file,
            state: AtomicU8::new(DIRTY),
            restoring: AtomicUsize::new(0),
            last_written: Mutex::new(None),
        }
    }

    /// Called before any write reaches the local files.
    fn before_write(&self, store: &str) -> std::result::Result<(), StateError> {
        if self.state.swap(DIRTY, Ordering::SeqCst) == VOUCHED {
            match std::fs::remove_file(&self.file) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StateError::Backend {
                        store: store.to_string(),
                        reason: format!("removing {}: {e}", self.file.display()),
                    })
                }
            }
        }
        Ok(())
    }

    /// A store of the task starts restoring.
    pub(crate) fn restore_started(&self) {
        self.restoring.fetch_add(1, Ordering::SeqCst);
    }

    /// A store of the task finished restoring (or failed to): a commit must
    /// follow before a checkpoint may vouch for it.
    pub(crate) fn restore_finished(&self) {
        self.state.store(DIRTY, Ordering::SeqCst);
        self.restoring.fetch_sub(1, Ordering::SeqCst);
    }

    /// The batch that wrote last committed.
    pub(crate) fn batch_committed(&self) {
        let _ = self
            .state
            .compare_exchange(DIRTY, COMMITTED, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether a checkpoint is worth writing now: nothing written since a
    /// commit, no restore running, none written for `interval`.
    pub(crate) fn checkpoint_due(&self, interval: Duration) -> bool {
        self.restoring.load(Ordering::SeqCst) == 0
            && self.state.load(Ordering::SeqCst) == COMMITTED
            && self
                .last_written
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_none_or(|at| at.elapsed() >= interval)
    }

    /// Writes `checkpoint` as the task's checkpoint file, if nothing was
    /// written since [`TaskCheckpointGuard::checkpoint_due`] said so.
    pub(crate) fn write(&self, checkpoint: &LocalCheckpoint) -> Result<()> {
        write_local_checkpoint(&self.file, checkpoint)?;
        *self.last_written.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        if self
            .state
            .compare_exchange(COMMITTED, VOUCHED, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // A write came in between: the file must not stay.
            let _ = std::fs::remove_file(&self.file);
        }
        Ok(())
    }
}

/// A task's local store whose writes go through its [`TaskCheckpointGuard`].
pub(crate) struct GuardedStore<S> {
    inner: S,
    guard: Arc<TaskCheckpointGuard>,
}

impl<S> GuardedStore<S> {
    /// `inner`, guarded by `guard`.
    pub(crate) fn new(inner: S, guard: Arc<TaskCheckpointGuard>) -> Self {
        GuardedStore { inner, guard }
    }
}

impl<S: StateStore> StateStore for GuardedStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn get(&self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, StateError> {
        self.inner.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> std::result::Result<(), StateError> {
        self.guard.before_write(self.inner.name())?;
        self.inner.put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> std::result::Result<(), StateError> {
        self.guard.before_write(self.inner.name())?;
        self.inner.delete(key)
    }
    fn range(&self, start: &[u8], end: &[u8]) -> std::result::Result<Entries, StateError> {
        self.inner.range(start, end)
    }
    fn prefix(&self, prefix: &[u8]) -> std::result::Result<Entries, StateError> {
        self.inner.prefix(prefix)
    }
    fn first_in_range(
        &self,
        start: &[u8],
        end: &[u8],
    ) -> std::result::Result<Option<Entry>, StateError> {
        self.inner.first_in_range(start, end)
    }
    fn approximate_len(&self) -> usize {
        self.inner.approximate_len()
    }
    fn write_batch(
        &mut self,
        entries: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> std::result::Result<(), StateError> {
        if !entries.is_empty() {
            self.guard.before_write(self.inner.name())?;
        }
        self.inner.write_batch(entries)
    }
    fn restore_batch(
        &mut self,
        entries: &mut RestoreEntries<'_>,
    ) -> std::result::Result<(), StateError> {
        self.guard.before_write(self.inner.name())?;
        self.inner.restore_batch(entries)
    }
    fn flush(&mut self) -> std::result::Result<(), StateError> {
        self.inner.flush()
    }
}
