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

/// The file in a task directory naming the process that opened it last
/// (a random token): a directory deleted and made again has another (its
/// inode number may well be the same).
const OWNER_FILE: &str = ".owner";

/// Changelog offset (exclusive) each store's local files reflect.
pub(crate) type LocalCheckpoint = std::collections::BTreeMap<String, i64>;

/// Reads and deletes the task's checkpoint file: from now on the local
/// files change, and a crash before the next clean close must not trust
/// them. Missing or unreadable: empty. A file that cannot be removed is an
/// error: it would vouch for files about to change.
pub(crate) fn take_local_checkpoint(file: &std::path::Path) -> Result<LocalCheckpoint> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Ok(LocalCheckpoint::new());
    };
    remove_durably(file).map_err(|e| Error::io(format!("removing {}", file.display()), e))?;
    Ok(parse_local_checkpoint(&text).unwrap_or_else(|reason| {
        tracing::warn!(file = %file.display(), %reason, "unreadable local checkpoint ignored; the local files are restored from the changelog");
        LocalCheckpoint::new()
    }))
}

/// Reads a checkpoint file without deleting it; missing or unreadable:
/// empty.
pub(crate) fn read_local_checkpoint(file: &std::path::Path) -> LocalCheckpoint {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| parse_local_checkpoint(&text).ok())
        .unwrap_or_default()
}

/// The encoding of the checkpoint files this release writes. A file of a
/// newer one is not trusted: the task's local files are rebuilt from the
/// changelog, whose records carry their own version.
const LOCAL_CHECKPOINT_VERSION: u32 = 1;

/// A checkpoint file as written: `{"v": 1, "stores": {"op0": 42}}`.
#[derive(serde::Serialize, serde::Deserialize)]
struct CheckpointFile {
    v: u32,
    stores: LocalCheckpoint,
}

/// The checkpoint in `text`: the versioned file, or the bare map of store
/// offsets written before versions were recorded.
fn parse_local_checkpoint(text: &str) -> std::result::Result<LocalCheckpoint, String> {
    tidemark::encoding::check_json_version(
        || "the local checkpoint".into(),
        text.as_bytes(),
        LOCAL_CHECKPOINT_VERSION,
    )
    .map_err(|e| e.to_string())?;
    serde_json::from_str::<CheckpointFile>(text)
        .map(|file| file.stores)
        .or_else(|_| serde_json::from_str::<LocalCheckpoint>(text))
        .map_err(|e| e.to_string())
}

/// Writes the checkpoint file atomically and durably: a temporary file,
/// synced, renamed over the old one, then the directory synced. Without
/// the syncs a power loss could leave an empty or missing file beside
/// RocksDB files that moved on (its own writes are flushed and synced).
pub(crate) fn write_local_checkpoint(
    file: &std::path::Path,
    checkpoint: &LocalCheckpoint,
) -> Result<()> {
    let text = serde_json::to_string(&CheckpointFile {
        v: LOCAL_CHECKPOINT_VERSION,
        stores: checkpoint.clone(),
    })
    .map_err(|e| Error::Internal(format!("encoding a local checkpoint: {e}")))?;
    let temporary = file.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut out = std::fs::File::create(&temporary)?;
        out.write_all(text.as_bytes())?;
        out.sync_all()?;
        std::fs::rename(&temporary, file)?;
        sync_directory_of(file)
    };
    write().map_err(|e| Error::io(format!("writing {}", file.display()), e))
}

/// Removes the checkpoint file durably (the directory synced after), so
/// that a power loss cannot bring back a file that no longer tells the
/// truth about the local files. Missing is fine.
fn remove_durably(file: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_file(file) {
        Ok(()) => sync_directory_of(file),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Syncs the directory holding `file`: a rename or removal in it is on
/// disk once this returns.
fn sync_directory_of(file: &std::path::Path) -> std::io::Result<()> {
    match file.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
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
    /// Per store: the changelog offset its last restore read up to.
    restored_to: Mutex<LocalCheckpoint>,
    /// The token this process left in the task directory it opened (see
    /// [`OWNER_FILE`]).
    owner_token: Mutex<Option<String>>,
}

/// Written since the last commit (or restoring): no checkpoint may vouch.
const DIRTY: u8 = 0;
/// Nothing written since the last commit: a checkpoint may be written.
const COMMITTED: u8 = 1;
/// The checkpoint file on disk matches the local files.
const VOUCHED: u8 = 2;
/// A batch aborted and the runtime dropped the task's stores: the local
/// files may hold the aborted writes, and no commit vouches for them until
/// the stores reopen and restore.
const ABANDONED: u8 = 3;

impl TaskCheckpointGuard {
    /// A guard for the task whose checkpoint file is `file`.
    pub(crate) fn new(file: PathBuf) -> Self {
        TaskCheckpointGuard {
            file,
            state: AtomicU8::new(DIRTY),
            restoring: AtomicUsize::new(0),
            last_written: Mutex::new(None),
            restored_to: Mutex::new(LocalCheckpoint::new()),
            owner_token: Mutex::new(None),
        }
    }

    /// Called before any write reaches the local files.
    fn before_write(&self, store: &str) -> std::result::Result<(), StateError> {
        if self.state.swap(DIRTY, Ordering::SeqCst) == VOUCHED {
            remove_durably(&self.file).map_err(|e| StateError::Backend {
                store: store.to_string(),
                reason: format!("removing {}: {e}", self.file.display()),
            })?;
        }
        Ok(())
    }

    /// The task's files were opened in `dir` (the checkpoint file's
    /// directory): checkpoints are written there only while it is the
    /// same directory.
    pub(crate) fn bind_directory(&self, dir: &std::path::Path) -> Result<()> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let file = dir.join(OWNER_FILE);
        std::fs::write(&file, &token)
            .map_err(|e| Error::io(format!("writing {}", file.display()), e))?;
        *self.owner_token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token);
        Ok(())
    }

    /// Whether the checkpoint file's directory is still the one this
    /// process opened. Another instance sharing the state directory that
    /// took the partition over (this one not having noticed yet) deleted
    /// it and made its own: a checkpoint from here would vouch for that
    /// instance's files.
    pub(crate) fn directory_is_ours(&self) -> bool {
        let owner = self.owner_token.lock().unwrap_or_else(|p| p.into_inner());
        let current = self
            .file
            .parent()
            .and_then(|dir| std::fs::read_to_string(dir.join(OWNER_FILE)).ok());
        owner.is_some() && *owner == current
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

    /// The store `name` was restored from its changelog up to `end`
    /// (exclusive): its local files reflect the changelog that far.
    pub(crate) fn restored(&self, name: &str, end: i64) {
        self.restored_to
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), end);
    }

    /// The checkpoint the task's local files deserve: for each of
    /// `stores`, how far its last restore read, or past that the end of
    /// what this process itself wrote (`written_end`), whichever is later.
    /// Never the changelog's end as the broker has it: another instance
    /// that took the partition over may have written there since, and a
    /// checkpoint claiming those records would have the next restore skip
    /// them. `None` when a store was never restored here.
    pub(crate) fn positions(
        &self,
        stores: &[String],
        written_end: impl Fn(&str) -> Option<i64>,
    ) -> Option<LocalCheckpoint> {
        let restored = self.restored_to.lock().unwrap_or_else(|p| p.into_inner());
        stores
            .iter()
            .map(|name| {
                let restored = *restored.get(name)?;
                let end = written_end(name).map_or(restored, |w| w.max(restored));
                Some((name.clone(), end))
            })
            .collect()
    }

    /// Whether the local files hold exactly what was committed: nothing
    /// written since the last commit, no restore running, not abandoned.
    pub(crate) fn clean(&self) -> bool {
        self.restoring.load(Ordering::SeqCst) == 0
            && matches!(self.state.load(Ordering::SeqCst), COMMITTED | VOUCHED)
    }

    /// A batch aborted and the task's stores were dropped (see
    /// [`ABANDONED`]): only a restore makes the local files trusted again,
    /// and the checkpoint file a commit left must go now. The stores reopen
    /// empty and restore from the changelog's start: a process killed (or
    /// a query rebuilt after an error) before that restore is on disk would
    /// otherwise find the file at its next start, trust the part-restored
    /// files and replay only the changelog after the offsets the file
    /// names — every key last written before them lost, while the offsets
    /// of the rows that built it stay committed (#43: static members keep
    /// their partitions through an abort, so their tasks took this path).
    pub(crate) fn abandon(&self) -> Result<()> {
        self.state.store(ABANDONED, Ordering::SeqCst);
        self.discard_file()
    }

    /// Removes the checkpoint file, if any: the task's local files are
    /// about to change outside a guarded write (a store dropped to be
    /// restored afresh).
    pub(crate) fn discard_file(&self) -> Result<()> {
        remove_durably(&self.file)
            .map_err(|e| Error::io(format!("removing {}", self.file.display()), e))
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
        self.clean()
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
        if !self.directory_is_ours() {
            return Ok(());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(dir: &tempfile::TempDir) -> TaskCheckpointGuard {
        TaskCheckpointGuard::new(dir.path().join(CHECKPOINT_FILE))
    }

    /// The file this release writes reads back; the bare map an older
    /// release wrote still reads; a newer encoding is not trusted (the
    /// task restores in full from the changelog).
    #[test]
    fn a_local_checkpoint_of_each_encoding_reads_or_is_distrusted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(CHECKPOINT_FILE);
        let offsets = LocalCheckpoint::from([("op0".into(), 42), ("op2".into(), 7)]);
        write_local_checkpoint(&file, &offsets).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with(r#"{"v":1,"#), "{text}");
        assert_eq!(take_local_checkpoint(&file).unwrap(), offsets);
        assert!(!file.exists(), "taken: removed");
        std::fs::write(&file, r#"{"op0":42,"op2":7}"#).unwrap();
        assert_eq!(read_local_checkpoint(&file), offsets, "before versions");
        std::fs::write(&file, r#"{"v":2,"stores":{"op0":42}}"#).unwrap();
        assert!(take_local_checkpoint(&file).unwrap().is_empty(), "newer");
        assert!(parse_local_checkpoint(r#"{"v":2}"#)
            .unwrap_err()
            .contains("version 2"));
    }

    #[test]
    fn positions_are_the_restore_end_or_the_own_writes_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let guard = guard(&dir);
        let stores = ["a".to_string(), "b".to_string()];
        assert_eq!(
            guard.positions(&stores, |_| None),
            None,
            "a store never restored here is vouched for by nothing"
        );
        guard.restored("a", 10);
        guard.restored("b", 7);
        let written = |name: &str| (name == "a").then_some(15);
        assert_eq!(
            guard.positions(&stores, written),
            Some(LocalCheckpoint::from([("a".into(), 15), ("b".into(), 7)]))
        );
        // Own writes from before the restore (an earlier ownership) do not
        // move it back.
        assert_eq!(
            guard.positions(&stores[..1], |_| Some(3)),
            Some(LocalCheckpoint::from([("a".into(), 10)]))
        );
    }

    #[test]
    fn no_checkpoint_lands_in_a_directory_another_process_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let task = dir.path().join("0");
        std::fs::create_dir(&task).unwrap();
        let guard = TaskCheckpointGuard::new(task.join(CHECKPOINT_FILE));
        guard.bind_directory(&task).unwrap();
        guard.batch_committed();
        guard
            .write(&LocalCheckpoint::from([("a".into(), 5)]))
            .unwrap();
        assert!(task.join(CHECKPOINT_FILE).exists());
        // Another instance took the partition over: deleted, made again.
        std::fs::remove_dir_all(&task).unwrap();
        std::fs::create_dir(&task).unwrap();
        TaskCheckpointGuard::new(task.join(CHECKPOINT_FILE))
            .bind_directory(&task)
            .unwrap();
        assert!(!guard.directory_is_ours());
        guard
            .write(&LocalCheckpoint::from([("a".into(), 9)]))
            .unwrap();
        assert!(!task.join(CHECKPOINT_FILE).exists());
    }

    #[test]
    fn an_abandoned_task_is_clean_again_only_after_a_restore_and_a_commit() {
        let dir = tempfile::tempdir().unwrap();
        let guard = guard(&dir);
        guard.restore_started();
        guard.restore_finished();
        guard.batch_committed();
        assert!(guard.clean() && guard.checkpoint_due(Duration::ZERO));
        guard.abandon().unwrap();
        guard.batch_committed();
        assert!(!guard.clean(), "another task's commit vouches for nothing");
        assert!(!guard.checkpoint_due(Duration::ZERO));
        guard.restore_started();
        assert!(!guard.clean());
        guard.restore_finished();
        guard.batch_committed();
        assert!(guard.clean());
    }

    #[test]
    fn an_aborted_batch_removes_the_checkpoint_a_commit_left() {
        let dir = tempfile::tempdir().unwrap();
        let guard = guard(&dir);
        guard.bind_directory(dir.path()).unwrap();
        guard.restored("a", 10);
        guard.restore_started();
        guard.restore_finished();
        guard.batch_committed();
        assert!(guard.checkpoint_due(Duration::ZERO));
        guard
            .write(&LocalCheckpoint::from([("a".into(), 10)]))
            .unwrap();
        assert!(dir.path().join(CHECKPOINT_FILE).exists());
        // The next batch wrote nothing before it aborted: no guarded write
        // removed the file, yet the stores are dropped and restored afresh.
        guard.abandon().unwrap();
        assert!(
            !dir.path().join(CHECKPOINT_FILE).exists(),
            "a checkpoint outlived the abort: a kill during the fresh restore would trust it"
        );
        assert_eq!(
            take_local_checkpoint(&dir.path().join(CHECKPOINT_FILE)).unwrap(),
            LocalCheckpoint::new()
        );
    }
}
