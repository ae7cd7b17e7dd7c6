//! The files source's checkpoint: which files each batch read and which
//! batches committed, as Spark's file source keeps them (its offset log
//! with the files of each batch, and the query's commit log).
//!
//! ```text
//! <checkpoint>/offsets/<batch id>   written before the batch's records are handed out:
//!                                   {"batchId": N, "files": [{"path", "size", "modifiedMs"}]}
//! <checkpoint>/commits/<batch id>   written when the batch commits, after the sink:
//!                                   {"batchId": N, "checkpoints": {"0": <task checkpoint>}}
//! <checkpoint>/skipped              `start: latest`: the files there at the first start
//! <checkpoint>/offsets/<id>.compact  every file of the committed batches up to <id>,
//!                                   written every [`COMPACT_EVERY`] commits
//! ```
//!
//! As Spark's `CompactibleFileStreamLog` does, the offsets log is compacted
//! every [`COMPACT_EVERY`] committed batches: the files of every committed
//! batch go into one `<id>.compact` entry (written durably first), then the
//! entries it covers are removed. A directory that saw a million files
//! leaves a handful of entries to read at start, not a million. A crash
//! between the two leaves entries the compact one also covers: read twice,
//! harmlessly.
//!
//! A batch logged in `offsets/` but not in `commits/` stopped between the
//! two: it is read again, over exactly its logged files, with its id (the
//! sink, which committed first, recognises it). Files named in any logged
//! batch are never read again. Every file is written to a temporary name,
//! synced and renamed, so that a crash leaves either the whole entry or
//! none.
//!
//! Every entry carries its encoding version, `"v": 1` ([`LOG_VERSION`]);
//! an entry without one predates versions and reads as version 1, and an
//! entry of a newer version is refused, naming it, rather than misread.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use tidemark::error::{Error, Result};
use tidemark::runtime::TaskCheckpoint;

/// One file a batch read: its name under the source directory, with the
/// size and modification time it had then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LoggedFile {
    /// The path relative to the source directory (`input/name` for a
    /// source of several streams).
    pub(crate) path: String,
    /// Its size in bytes.
    pub(crate) size: u64,
    /// Its modification time, milliseconds since the epoch.
    #[serde(rename = "modifiedMs")]
    pub(crate) modified_ms: i64,
}

/// The files a batch read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BatchFiles {
    #[serde(rename = "batchId")]
    pub(crate) batch_id: u64,
    pub(crate) files: Vec<LoggedFile>,
}

/// A committed batch, with the task checkpoints committed with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BatchCommit {
    #[serde(rename = "batchId")]
    pub(crate) batch_id: u64,
    pub(crate) checkpoints: BTreeMap<i32, TaskCheckpoint>,
}

/// The encoding of the log entries this release writes.
pub(crate) const LOG_VERSION: u32 = 1;

/// An entry as written: its version beside its fields.
#[derive(Serialize)]
struct Versioned<'a, T> {
    v: u32,
    #[serde(flatten)]
    entry: &'a T,
}

/// The `skipped` file as written; before versions it was the bare list.
#[derive(Serialize, Deserialize)]
struct SkippedFiles {
    v: u32,
    files: Vec<String>,
}

/// How many committed batches pass between two compactions of the offsets
/// log (Spark's `spark.sql.streaming.fileSource.log.compactInterval`).
pub(crate) const COMPACT_EVERY: u64 = 10;

/// The name suffix of a compacted offsets entry.
const COMPACT_SUFFIX: &str = ".compact";

/// The checkpoint directory of one files source.
#[derive(Debug)]
pub(crate) struct ProgressLog {
    dir: PathBuf,
    /// Locked while the source lives: a second run on the same checkpoint
    /// would read files twice or record over this one.
    _lock: fs::File,
}

/// What a checkpoint directory held when the source started.
#[derive(Debug, Default)]
pub(crate) struct LoggedProgress {
    /// Every file any logged batch read.
    pub(crate) seen: BTreeSet<String>,
    /// The last committed batch, if any.
    pub(crate) last_commit: Option<BatchCommit>,
    /// Batches logged after the last commit, in order: read again.
    pub(crate) uncommitted: Vec<BatchFiles>,
}

impl ProgressLog {
    /// The log in `dir`, created if missing.
    pub(crate) fn open(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        for sub in ["offsets", "commits"] {
            let path = dir.join(sub);
            fs::create_dir_all(&path)
                .map_err(|e| Error::io(format!("creating {}", path.display()), e))?;
        }
        let lock_path = dir.join("lock");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::io(format!("opening {}", lock_path.display()), e))?;
        if lock.try_lock().is_err() {
            return Err(Error::config(
                "source.checkpoint",
                format!(
                    "`{}` is in use by another run of this query: one process per files checkpoint",
                    dir.display()
                ),
            ));
        }
        Ok(ProgressLog { dir, _lock: lock })
    }

    /// Reads every entry.
    pub(crate) fn read(&self) -> Result<LoggedProgress> {
        let batches: Vec<BatchFiles> = offsets_entries(&self.dir.join("offsets"))?
            .into_iter()
            .map(|(_, path)| read_entry(&path))
            .collect::<Result<_>>()?;
        let last_commit: Option<BatchCommit> = self.entries("commits")?.pop();
        let committed = last_commit.as_ref().map(|c| c.batch_id);
        let mut progress = LoggedProgress {
            last_commit,
            ..Default::default()
        };
        for batch in batches {
            progress
                .seen
                .extend(batch.files.iter().map(|f| f.path.clone()));
            if committed.is_none_or(|c| batch.batch_id > c) {
                progress.uncommitted.push(batch);
            }
        }
        Ok(progress)
    }

    /// Logs the files of batch `batch.batch_id`, before they are read.
    pub(crate) fn log_batch(&self, batch: &BatchFiles) -> Result<()> {
        self.write("offsets", batch.batch_id, batch)
    }

    /// Records the files a first run with `start: latest` skipped.
    pub(crate) fn log_skipped(&self, files: &[String]) -> Result<()> {
        let path = self.dir.join("skipped");
        let text = serde_json::to_vec(&SkippedFiles {
            v: LOG_VERSION,
            files: files.to_vec(),
        })
        .map_err(|e| Error::Internal(format!("encoding the skipped files: {e}")))?;
        write_durably(&self.dir.join(".skipped.tmp"), &path, &text)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// The files a first run skipped, if it recorded any (`None`: no run
    /// recorded skipping).
    pub(crate) fn read_skipped(&self) -> Result<Option<Vec<String>>> {
        let path = self.dir.join("skipped");
        match fs::read_to_string(&path) {
            Ok(text) => {
                check_version(&path, &text)?;
                serde_json::from_str::<SkippedFiles>(&text)
                    .map(|skipped| skipped.files)
                    .or_else(|_| serde_json::from_str::<Vec<String>>(&text))
                    .map(Some)
                    .map_err(|e| {
                        Error::source_failed(format!("{} is unreadable", path.display()), e)
                    })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("reading {}", path.display()), e)),
        }
    }

    /// Logs that batch `commit.batch_id` committed.
    pub(crate) fn log_commit(&self, commit: &BatchCommit) -> Result<()> {
        self.write("commits", commit.batch_id, commit)?;
        self.prune(commit.batch_id)?;
        if (commit.batch_id + 1).is_multiple_of(COMPACT_EVERY) {
            self.compact(commit.batch_id)?;
        }
        Ok(())
    }

    /// Folds the offsets entries of batches up to `committed` (a compact
    /// entry among them) into `offsets/<committed>.compact`, then removes
    /// them.
    fn compact(&self, committed: u64) -> Result<()> {
        let dir = self.dir.join("offsets");
        let covered: Vec<(u64, PathBuf)> = offsets_entries(&dir)?
            .into_iter()
            .filter(|(id, _)| *id <= committed)
            .collect();
        let mut files = Vec::new();
        for (_, path) in &covered {
            files.extend(read_entry::<BatchFiles>(path)?.files);
        }
        let compacted = BatchFiles {
            batch_id: committed,
            files,
        };
        let path = dir.join(format!("{committed}{COMPACT_SUFFIX}"));
        let text = encode_entry(&compacted)?;
        write_durably(&dir.join(format!(".{committed}.compact.tmp")), &path, &text)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
        for (_, old) in covered.into_iter().filter(|(_, old)| *old != path) {
            fs::remove_file(&old)
                .map_err(|e| Error::io(format!("removing {}", old.display()), e))?;
        }
        // An older compact entry a crash left beside its successor.
        for stale in list_dir(&dir)? {
            let name = stale
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let older = name
                .strip_suffix(COMPACT_SUFFIX)
                .and_then(|id| id.parse::<u64>().ok())
                .is_some_and(|id| id < committed);
            if older {
                let _ = fs::remove_file(&stale);
            }
        }
        tracing::debug!(
            batch_id = committed,
            files = compacted.files.len(),
            "files source offsets log compacted"
        );
        Ok(())
    }

    /// The entries of `sub`, in batch order; an entry that cannot be read
    /// is an error naming it (the log is the source's memory: guessing
    /// would read files twice or never).
    fn entries<T: for<'de> Deserialize<'de>>(&self, sub: &str) -> Result<Vec<T>> {
        let dir = self.dir.join(sub);
        let mut ids = BTreeMap::new();
        for path in list_dir(&dir)? {
            let id = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(id) = id {
                ids.insert(id, path);
            }
        }
        ids.into_values().map(|path| read_entry(&path)).collect()
    }

    fn write<T: Serialize>(&self, sub: &str, batch_id: u64, value: &T) -> Result<()> {
        let path = self.dir.join(sub).join(batch_id.to_string());
        let temporary = self.dir.join(sub).join(format!(".{batch_id}.tmp"));
        let text = encode_entry(value)?;
        write_durably(&temporary, &path, &text)
            .map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// Keeps the commit log short: only the last commit is read back. The
    /// offsets log keeps every file read, compacted (see [`Self::compact`]).
    fn prune(&self, committed: u64) -> Result<()> {
        let dir = self.dir.join("commits");
        for entry in
            fs::read_dir(&dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
        {
            let Ok(entry) = entry else { continue };
            let old = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|id| id + 1 < committed);
            if old {
                let _ = fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
}

/// The paths in `dir`.
fn list_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let reading = |e| Error::io(format!("reading {}", dir.display()), e);
    fs::read_dir(dir)
        .map_err(reading)?
        .map(|entry| entry.map(|e| e.path()).map_err(reading))
        .collect()
}

/// The offsets entries in `dir` by batch id: the latest compact entry and
/// the batches after it, with those it covers when a crash left them.
fn offsets_entries(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut plain = BTreeMap::new();
    let mut compact: Option<(u64, PathBuf)> = None;
    for path in list_dir(dir)? {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(id) = name
            .strip_suffix(COMPACT_SUFFIX)
            .and_then(|n| n.parse::<u64>().ok())
        {
            if compact.as_ref().is_none_or(|(latest, _)| id > *latest) {
                compact = Some((id, path));
            }
        } else if let Ok(id) = name.parse::<u64>() {
            plain.insert(id, path);
        }
    }
    let mut entries: Vec<(u64, PathBuf)> = compact.into_iter().collect();
    entries.extend(plain);
    Ok(entries)
}

/// `entry` with its version, as a log file holds it.
fn encode_entry<T: Serialize>(entry: &T) -> Result<Vec<u8>> {
    serde_json::to_vec(&Versioned {
        v: LOG_VERSION,
        entry,
    })
    .map_err(|e| Error::Internal(format!("encoding a files source log entry: {e}")))
}

/// Refuses the entry `text` of `path` when a newer release wrote it.
fn check_version(path: &Path, text: &str) -> Result<()> {
    tidemark::encoding::check_json_version(
        || format!("the files source's checkpoint entry {}", path.display()),
        text.as_bytes(),
        LOG_VERSION,
    )
}

/// One log entry; one that cannot be read is an error naming it.
fn read_entry<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<T> {
    let text = fs::read_to_string(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    check_version(path, &text)?;
    serde_json::from_str(&text).map_err(|e| {
        Error::source_failed(
            format!(
                "the files source's checkpoint entry {} is unreadable",
                path.display()
            ),
            e,
        )
    })
}

/// Writes `bytes` to `temporary`, syncs it and renames it to `path`, then
/// syncs the directory: the entry is whole or absent after a crash.
fn write_durably(temporary: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = fs::File::create(temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    fs::rename(temporary, path)?;
    if let Some(parent) = path.parent() {
        fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> LoggedFile {
        LoggedFile {
            path: path.into(),
            size: 1,
            modified_ms: 2,
        }
    }

    /// A log the release before versions wrote (entries without `"v"`, the
    /// skipped files a bare list) reads; entries this release writes carry
    /// `"v": 1`; an entry of a newer version is refused, naming it.
    #[test]
    fn log_entries_of_each_encoding_read_or_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let log = ProgressLog::open(dir.path()).unwrap();
        let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        put(
            "offsets/0",
            r#"{"batchId":0,"files":[{"path":"a","size":1,"modifiedMs":2}]}"#,
        );
        put(
            "offsets/1",
            r#"{"batchId":1,"files":[{"path":"b","size":1,"modifiedMs":2}]}"#,
        );
        put("commits/0", r#"{"batchId":0,"checkpoints":{"0":"cp0"}}"#);
        put("skipped", r#"["old"]"#);
        let read = log.read().unwrap();
        assert_eq!(read.seen, ["a", "b"].map(String::from).into());
        assert_eq!(read.last_commit.unwrap().checkpoints[&0].as_str(), "cp0");
        assert_eq!(read.uncommitted[0].files, vec![file("b")]);
        assert_eq!(log.read_skipped().unwrap(), Some(vec!["old".to_string()]));

        log.log_commit(&BatchCommit {
            batch_id: 1,
            checkpoints: [(0, TaskCheckpoint::from_stored("cp1"))].into(),
        })
        .unwrap();
        log.log_skipped(&["new".to_string()]).unwrap();
        let text = std::fs::read_to_string(dir.path().join("commits/1")).unwrap();
        assert!(text.starts_with(r#"{"v":1,"batchId":1"#), "{text}");
        assert_eq!(
            log.read().unwrap().last_commit.unwrap().checkpoints[&0].as_str(),
            "cp1"
        );
        assert_eq!(log.read_skipped().unwrap(), Some(vec!["new".to_string()]));

        put("commits/2", r#"{"v":2,"batchId":2,"log":"elsewhere"}"#);
        let e = log.read().unwrap_err();
        assert!(
            matches!(&e, Error::UnknownEncoding { found, .. } if found == "2"),
            "{e}"
        );
        assert!(e.to_string().contains("commits/2"), "{e}");
        put("skipped", r#"{"v":3,"files":[]}"#);
        assert!(log.read_skipped().is_err());
    }

    #[test]
    fn a_logged_batch_without_its_commit_is_uncommitted_and_its_files_seen() {
        let dir = tempfile::tempdir().unwrap();
        let log = ProgressLog::open(dir.path()).unwrap();
        assert!(log.read().unwrap().last_commit.is_none());
        for (id, name) in [(0, "a"), (1, "b"), (2, "c")] {
            log.log_batch(&BatchFiles {
                batch_id: id,
                files: vec![file(name)],
            })
            .unwrap();
        }
        for id in [0, 1] {
            log.log_commit(&BatchCommit {
                batch_id: id,
                checkpoints: [(0, TaskCheckpoint::from_stored(format!("cp{id}")))].into(),
            })
            .unwrap();
        }
        drop(log);
        let read = ProgressLog::open(dir.path()).unwrap().read().unwrap();
        assert_eq!(read.seen, ["a", "b", "c"].map(String::from).into());
        assert_eq!(read.last_commit.unwrap().checkpoints[&0].as_str(), "cp1");
        assert_eq!(read.uncommitted.len(), 1);
        assert_eq!(read.uncommitted[0].files, vec![file("c")]);
    }

    #[test]
    fn the_offsets_log_is_compacted_every_ten_commits_and_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = ProgressLog::open(dir.path()).unwrap();
        for id in 0..25u64 {
            log.log_batch(&BatchFiles {
                batch_id: id,
                files: vec![file(&format!("f{id:02}"))],
            })
            .unwrap();
            // Batch 24 stays uncommitted.
            if id < 24 {
                log.log_commit(&BatchCommit {
                    batch_id: id,
                    checkpoints: BTreeMap::new(),
                })
                .unwrap();
            }
        }
        let mut names: Vec<String> = fs::read_dir(dir.path().join("offsets"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        // Batches 0-19 in one compact entry, 20-24 on their own.
        assert_eq!(
            names,
            ["19.compact", "20", "21", "22", "23", "24"],
            "{names:?}"
        );
        drop(log);
        let read = ProgressLog::open(dir.path()).unwrap().read().unwrap();
        assert_eq!(read.seen.len(), 25);
        assert_eq!(read.last_commit.unwrap().batch_id, 23);
        assert_eq!(read.uncommitted.len(), 1);
        assert_eq!(read.uncommitted[0].files, vec![file("f24")]);
    }

    #[test]
    fn a_second_run_on_one_checkpoint_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let first = ProgressLog::open(dir.path()).unwrap();
        let error = ProgressLog::open(dir.path()).unwrap_err().to_string();
        assert!(error.contains("in use by another run"), "{error}");
        drop(first);
        ProgressLog::open(dir.path()).unwrap();
    }

    #[test]
    fn an_unreadable_entry_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let log = ProgressLog::open(dir.path()).unwrap();
        fs::write(dir.path().join("commits").join("3"), "{not json").unwrap();
        let error = log.read().unwrap_err().to_string();
        assert!(error.contains("commits/3"), "{error}");
    }
}
