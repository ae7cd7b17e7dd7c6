//! Versions of local state without a changelog, one per batch, for a
//! source that logs its batches (the files source): Spark's versioned
//! state store. A batch that is replayed after a crash — its output
//! committed by the sink, its input not yet by the source — must run on
//! the state it first ran on, not on the state it left; so after each
//! batch's state is written, the task's database is snapshotted (a RocksDB
//! checkpoint: hard links, cheap), and a start puts back the snapshot of
//! the source's last committed batch.
//!
//! ```text
//! <state_dir>/<application>/<task>                    the live database
//! <state_dir>/<application>/versions/<task>/<batch>   its state after <batch>
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use tidemark::error::{Error, Result};
use tidemark_state::TaskDb;

/// The versions of one application's tasks.
#[derive(Debug)]
pub(crate) struct StateVersions {
    /// `<state_dir>/<application>`: the live task databases.
    live: PathBuf,
}

impl StateVersions {
    /// The versions kept next to the live databases in `live`.
    pub(crate) fn new(live: PathBuf) -> Self {
        StateVersions { live }
    }

    fn root(&self) -> PathBuf {
        self.live.join("versions")
    }

    /// Puts every task's state back to its version after `committed`
    /// (empty when it has none: the task had no state then, or this is a
    /// first run) and forgets later versions. Runs before any task opens.
    pub(crate) fn roll_back(&self, committed: Option<u64>) -> Result<()> {
        for task in numbered_entries(&self.live)? {
            remove_dir(&self.live.join(task.to_string()))?;
        }
        for task in numbered_entries(&self.root())? {
            let versions = self.root().join(task.to_string());
            for batch in numbered_entries(&versions)? {
                if committed.is_none_or(|c| batch > c) {
                    remove_dir(&versions.join(batch.to_string()))?;
                }
            }
            if let Some(c) = committed {
                let version = versions.join(c.to_string());
                if version.is_dir() {
                    copy_version(&version, &self.live.join(task.to_string()))?;
                    tracing::info!(
                        task,
                        batch_id = c,
                        "local state put back to its version after the last committed batch"
                    );
                }
            }
        }
        Ok(())
    }

    /// Snapshots `db`, the state of `task` after batch `batch_id`, and
    /// forgets its versions older than the one before (the source has
    /// committed at least that one: the commit protocol runs a batch's
    /// source commit before the next batch).
    pub(crate) fn snapshot(&self, task: i32, db: &TaskDb, batch_id: u64) -> Result<()> {
        let versions = self.root().join(task.to_string());
        fs::create_dir_all(&versions)
            .map_err(|e| Error::io(format!("creating {}", versions.display()), e))?;
        let version = versions.join(batch_id.to_string());
        // A batch that aborted and ran again snapshots again.
        remove_dir(&version)?;
        db.checkpoint_to(&version)?;
        for batch in numbered_entries(&versions)? {
            if batch + 1 < batch_id {
                remove_dir(&versions.join(batch.to_string()))?;
            }
        }
        Ok(())
    }
}

/// The entries of `dir` named by a number (none when `dir` is missing).
fn numbered_entries(dir: &Path) -> Result<Vec<u64>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(format!("reading {}", dir.display()), e)),
    };
    let mut numbers: Vec<u64> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    numbers.sort_unstable();
    Ok(numbers)
}

fn remove_dir(dir: &Path) -> Result<()> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::io(format!("removing {}", dir.display()), e))
        }
        _ => Ok(()),
    }
}

/// Copies a checkpoint into place as a live database: its table files are
/// immutable and hard-linked, the rest (manifest, options, logs) copied,
/// since the live database goes on writing them.
fn copy_version(version: &Path, live: &Path) -> Result<()> {
    fs::create_dir_all(live).map_err(|e| Error::io(format!("creating {}", live.display()), e))?;
    let entries = fs::read_dir(version)
        .map_err(|e| Error::io(format!("reading {}", version.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", version.display()), e))?;
        let (from, to) = (entry.path(), live.join(entry.file_name()));
        let linked =
            from.extension().is_some_and(|x| x == "sst") && fs::hard_link(&from, &to).is_ok();
        if !linked {
            fs::copy(&from, &to)
                .map_err(|e| Error::io(format!("copying {}", from.display()), e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_state::{MemoryBudget, StateStore};

    fn value(state_dir: &Path, key: &[u8]) -> Option<Vec<u8>> {
        let db = TaskDb::open(state_dir, "app", "0", &MemoryBudget::new(8 << 20)).unwrap();
        db.store("s").unwrap().get(key).unwrap()
    }

    fn put(state_dir: &Path, key: &[u8], v: &[u8], snapshot: Option<u64>) {
        let db = TaskDb::open(state_dir, "app", "0", &MemoryBudget::new(8 << 20)).unwrap();
        let mut store = db.store("s").unwrap();
        store.put(key, v).unwrap();
        store.flush().unwrap();
        if let Some(batch_id) = snapshot {
            StateVersions::new(state_dir.join("app"))
                .snapshot(0, &db, batch_id)
                .unwrap();
        }
    }

    #[test]
    fn a_start_puts_back_the_state_of_the_last_committed_batch() {
        let dir = tempfile::tempdir().unwrap();
        put(dir.path(), b"k", b"after 0", Some(0));
        put(dir.path(), b"k", b"after 1", Some(1));
        put(dir.path(), b"k", b"half of 2", None);
        let versions = StateVersions::new(dir.path().join("app"));
        // The source committed batch 0 only: batch 1 replays on its state.
        versions.roll_back(Some(0)).unwrap();
        assert_eq!(value(dir.path(), b"k").as_deref(), Some(&b"after 0"[..]));
        // Batch 1 is gone for good; rolling back again changes nothing.
        versions.roll_back(Some(0)).unwrap();
        assert_eq!(value(dir.path(), b"k").as_deref(), Some(&b"after 0"[..]));
        // Nothing committed: no state.
        versions.roll_back(None).unwrap();
        assert_eq!(value(dir.path(), b"k"), None);
    }

    #[test]
    fn old_versions_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        for batch in 0..5 {
            put(dir.path(), b"k", &[batch as u8], Some(batch));
        }
        let kept = numbered_entries(&dir.path().join("app/versions/0")).unwrap();
        assert_eq!(kept, [3, 4]);
    }
}
