//! The files source: a directory whose files land over time, read a few
//! files per batch, each file once — across restarts too when it has a
//! checkpoint directory (see [`crate::progress`]).

use crate::formats::{read_file, FileFormat};
use crate::listing::{ready_units, ReadyRule, Unit};
use crate::progress::{BatchCommit, BatchFiles, LoggedFile, ProgressLog};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::record::Record;
use tidemark::runtime::{
    BatchLog, BatchRequest, Source, SourceBatch, SourceOffsets, TaskCheckpoint,
};
use tidemark::schema::Schema;

/// Where a files source starts when its checkpoint holds nothing yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FilesStart {
    /// Every file in the directory, then those that land later.
    #[default]
    Earliest,
    /// Only files that land after the first start (those there already are
    /// recorded as skipped).
    Latest,
}

/// How a files source reads its directory.
#[derive(Debug, Clone)]
pub struct FilesSourceOptions {
    /// At most this many files (or file names, across streams) per batch
    /// (Spark's `maxFilesPerTrigger`); at least 1.
    pub max_files_per_batch: usize,
    /// Only file names matching this glob (`*.csv.gz`).
    pub pattern: Option<glob::Pattern>,
    /// Where a first run starts.
    pub start: FilesStart,
    /// A file modified more recently than this is left for a later batch
    /// (for writers that write in place instead of renaming into place).
    pub settle_delay: Duration,
    /// How the files are laid out.
    pub format: FileFormat,
    /// The columns and types rows have (CSV columns are read as these).
    pub schema: Schema,
    /// Where the source records which files each batch read and which
    /// batches committed; `None`: a run reads the directory from scratch.
    pub checkpoint: Option<PathBuf>,
    /// Whether a symbolic link in the directory is read as the file it
    /// points to (default `false`: links are left alone, so that a link
    /// cannot make the source read a file outside its directory).
    pub follow_symlinks: bool,
    /// The most bytes one file may hold, decompressed: its records are
    /// held in memory at once (see [`DEFAULT_MAX_FILE_BYTES`]).
    pub max_file_bytes: u64,
}

/// The default cap on one file's decompressed size: 1 GiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1 << 30;

impl Default for FilesSourceOptions {
    fn default() -> Self {
        FilesSourceOptions {
            max_files_per_batch: 1,
            pattern: None,
            start: FilesStart::Earliest,
            settle_delay: Duration::ZERO,
            format: FileFormat::JsonLines,
            schema: Schema::default(),
            checkpoint: None,
            follow_symlinks: false,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }
}

/// Reads a directory of files, in name order, a few per batch (one by
/// default, which makes a directory of batch files a replayable sequence of
/// micro-batches). Files that land later join later batches; with a
/// checkpoint directory each file is read once, ever.
///
/// ```no_run
/// let source = tidemark_files::FilesSource::new("batches/").unwrap();
/// ```
#[derive(Debug)]
pub struct FilesSource {
    dir: PathBuf,
    /// Several streams (a join): each a sub-directory of `dir`, a batch
    /// reading the files named alike in each.
    inputs: Vec<String>,
    options: FilesSourceOptions,
    log: Option<ProgressLog>,
    /// Files handed out, ever (with a checkpoint) or in this run.
    seen: BTreeSet<String>,
    /// Logged batches that did not commit: read again first, as they were.
    replay: Vec<BatchFiles>,
    /// Checkpoints committed with the last batch, handed back on the next
    /// poll after a start or a rewind.
    restore: Option<BTreeMap<i32, TaskCheckpoint>>,
    last_commit: Option<BatchCommit>,
    /// The open batch's id and the files it read so far.
    open: Option<BatchFiles>,
    /// The last batch that read files (Spark's `logOffset`).
    log_offset: i64,
    /// The batch of the last poll: the one a commit is for.
    polled: Option<u64>,
    started: bool,
}

impl FilesSource {
    /// A source over `dir`, which must exist, with default options.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self> {
        Self::with_options(dir, Vec::new(), FilesSourceOptions::default())
    }

    /// A source of several streams: `dir/<input>/` each; a batch is the
    /// files of one name across them (a stream may lack a file: no rows of
    /// it in that batch). Records carry their stream's name as topic.
    pub fn with_inputs(dir: impl AsRef<Path>, inputs: Vec<String>) -> Result<Self> {
        Self::with_options(dir, inputs, FilesSourceOptions::default())
    }

    /// A source over `dir` (and its `inputs` sub-directories, if any) read
    /// as `options` say.
    pub fn with_options(
        dir: impl AsRef<Path>,
        inputs: Vec<String>,
        options: FilesSourceOptions,
    ) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::config(
                "source.path",
                format!("`{}` is not a directory", dir.display()),
            ));
        }
        if let Some(input) = inputs.iter().find(|i| !dir.join(i).is_dir()) {
            return Err(Error::config(
                "source.path",
                format!(
                    "`{}` has no sub-directory `{input}` for that stream",
                    dir.display()
                ),
            ));
        }
        if options.max_files_per_batch == 0 {
            return Err(Error::config(
                "source.max_files_per_batch",
                "must be at least 1",
            ));
        }
        let log = options
            .checkpoint
            .as_ref()
            .map(ProgressLog::open)
            .transpose()?;
        Ok(FilesSource {
            dir,
            inputs,
            options,
            log,
            seen: BTreeSet::new(),
            replay: Vec::new(),
            restore: None,
            last_commit: None,
            open: None,
            log_offset: -1,
            polled: None,
            started: false,
        })
    }

    /// Reads the checkpoint (once, at the first poll or log question).
    fn start(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.started, true) {
            return Ok(());
        }
        let Some(log) = &self.log else {
            return self.skip_existing();
        };
        let progress = log.read()?;
        let skipped = log.read_skipped()?;
        let fresh = progress.seen.is_empty() && progress.last_commit.is_none() && skipped.is_none();
        self.seen = progress.seen;
        self.seen.extend(skipped.unwrap_or_default());
        self.log_offset = progress
            .uncommitted
            .last()
            .map(|b| b.batch_id as i64)
            .or(progress.last_commit.as_ref().map(|c| c.batch_id as i64))
            .unwrap_or(-1);
        self.replay = progress.uncommitted;
        self.restore = progress.last_commit.as_ref().map(|c| c.checkpoints.clone());
        self.last_commit = progress.last_commit;
        if fresh {
            self.skip_existing()?;
        }
        Ok(())
    }

    /// `start: latest` on a first run: the files there now are skipped (and
    /// recorded as such with a checkpoint).
    fn skip_existing(&mut self) -> Result<()> {
        if self.options.start != FilesStart::Latest {
            return Ok(());
        }
        let rule = ReadyRule {
            pattern: self.options.pattern.clone(),
            settle_delay: Duration::ZERO,
            follow_symlinks: self.options.follow_symlinks,
        };
        let skipped: Vec<String> = ready_units(&self.dir, &self.inputs, &rule, &self.seen)?
            .into_iter()
            .flat_map(|u| u.files.into_iter().map(|f| f.path))
            .collect();
        if let Some(log) = &self.log {
            log.log_skipped(&skipped)?;
        }
        self.seen.extend(skipped);
        Ok(())
    }

    /// The files of the next batch: a logged batch to read again, else up
    /// to `max_files_per_batch` ready units; and whether more are ready.
    fn next_files(&mut self) -> Result<(Vec<LoggedFile>, bool)> {
        let rule = ReadyRule {
            pattern: self.options.pattern.clone(),
            settle_delay: self.options.settle_delay,
            follow_symlinks: self.options.follow_symlinks,
        };
        if !self.replay.is_empty() {
            let batch = self.replay.remove(0);
            // Files that landed since still follow the replayed batch.
            let more = !self.replay.is_empty()
                || !ready_units(&self.dir, &self.inputs, &rule, &self.seen)?.is_empty();
            return Ok((batch.files, more));
        }
        let mut units = ready_units(&self.dir, &self.inputs, &rule, &self.seen)?;
        let more = units.len() > self.options.max_files_per_batch;
        units.truncate(self.options.max_files_per_batch);
        Ok((
            units.into_iter().flat_map(|u: Unit| u.files).collect(),
            more,
        ))
    }

    /// Logs `files` as read by batch `batch_id` (adding to what the batch
    /// read in earlier polls, under the real-time trigger).
    fn log_files(&mut self, batch_id: u64, files: &[LoggedFile]) -> Result<()> {
        let open = match self.open.take() {
            Some(open) if open.batch_id == batch_id => open,
            _ => BatchFiles {
                batch_id,
                files: Vec::new(),
            },
        };
        let mut open = open;
        open.files.extend(files.iter().cloned());
        if let Some(log) = &self.log {
            log.log_batch(&open)?;
        }
        self.seen.extend(files.iter().map(|f| f.path.clone()));
        self.log_offset = batch_id as i64;
        self.open = Some(open);
        Ok(())
    }

    /// The records of `files`; each file's records carry its stream's name
    /// (several streams) or its path as topic.
    fn read(&self, files: &[LoggedFile]) -> Result<Vec<Record>> {
        let mut records = Vec::new();
        for file in files {
            let path = self.dir.join(&file.path);
            unchanged_since_logged(&path, file)?;
            let topic: Arc<str> = match self.inputs.is_empty() {
                true => Arc::from(path.display().to_string()),
                false => Arc::from(file.path.split('/').next().unwrap_or_default()),
            };
            read_file(
                &path,
                self.options.format,
                &topic,
                &self.options.schema,
                self.options.max_file_bytes,
                &mut records,
            )?;
            // A writer still busy with the file changed it while it was
            // read: the rows read may be half of it.
            unchanged_since_logged(&path, file)?;
        }
        Ok(records)
    }
}

/// Checks that `path` is still the file `logged` describes (its size and
/// modification time when it was listed). A batch is logged before it is
/// read and replayed from the log: a file rewritten in between would give
/// the replay other rows than the first run, or rows read between two
/// writes. That is an error naming the file, which ends the run: reading
/// on would be a wrong answer, and asking again reads the same changed file.
fn unchanged_since_logged(path: &std::path::Path, logged: &LoggedFile) -> Result<()> {
    let now = crate::listing::size_and_modified(path)?;
    if now == Some((logged.size, logged.modified_ms)) {
        return Ok(());
    }
    let what = match now {
        None => "is gone".to_string(),
        Some((size, modified_ms)) => format!(
            "changed: {} bytes modified at {modified_ms} ms, logged as {} bytes modified at {} ms",
            size, logged.size, logged.modified_ms
        ),
    };
    Err(Error::config(
        "source.path",
        format!(
            "{} {what} since its batch was logged: the files source reads a file once, as it was when it settled (write elsewhere and rename into place, or set `settle_delay`); put the file back as it was, or start over with a new checkpoint",
            path.display()
        ),
    ))
}

impl Source for FilesSource {
    fn describe(&self) -> String {
        format!("FileStreamSource[{}]", self.dir.display())
    }

    fn next_batch(&mut self, request: &BatchRequest) -> Result<SourceBatch> {
        self.start()?;
        self.polled = Some(request.batch_id);
        let restored_checkpoints = self
            .restore
            .take()
            .map(|c| c.into_iter().collect())
            .unwrap_or_default();
        let (files, more) = self.next_files()?;
        if !files.is_empty() {
            self.log_files(request.batch_id, &files)?;
        }
        Ok(SourceBatch {
            records: self.read(&files)?,
            exhausted: request.available_now && !more,
            revoked_partitions: Vec::new(),
            restored_checkpoints,
            ..Default::default()
        })
    }

    fn commit(&mut self, checkpoints: &BTreeMap<i32, TaskCheckpoint>) -> Result<()> {
        // A batch without files (a no-data batch) commits too: its
        // checkpoints carry the watermark it moved.
        self.open = None;
        match self.polled {
            Some(batch_id) => self.commit_batch(batch_id, checkpoints),
            None => Ok(()),
        }
    }

    fn offsets(&self) -> SourceOffsets {
        SourceOffsets::sequence("logOffset", self.log_offset)
    }

    fn watermark_input(&self, topic: &str, _partition: i32) -> String {
        if self.inputs.is_empty() {
            // Every file belongs to one input: the directory.
            self.dir.display().to_string()
        } else {
            format!("{}/{topic}", self.dir.display())
        }
    }

    fn rewind(&mut self) -> Result<bool> {
        // The aborted batch's files are read again, as they were.
        if let Some(open) = self.open.take() {
            self.replay.insert(0, open);
        }
        self.restore = self.last_commit.as_ref().map(|c| c.checkpoints.clone());
        Ok(true)
    }

    fn replay_until(&mut self, batch_id: u64, _end: &SourceOffsets) -> Result<bool> {
        self.start()?;
        // The sink holds `batch_id` and this log does not: that batch runs
        // again over its logged files (none, for a no-data batch).
        Ok(self.log.is_some()
            && self
                .last_commit
                .as_ref()
                .is_none_or(|c| c.batch_id < batch_id))
    }

    fn batch_log(&mut self) -> Result<BatchLog> {
        self.start()?;
        Ok(match (&self.log, &self.last_commit) {
            (None, _) => BatchLog::NotKept,
            (Some(_), None) => BatchLog::Empty,
            (Some(_), Some(c)) => BatchLog::Committed(c.batch_id),
        })
    }
}

impl FilesSource {
    /// Records batch `batch_id`'s commit with `checkpoints` merged over the
    /// last ones.
    fn commit_batch(
        &mut self,
        batch_id: u64,
        checkpoints: &BTreeMap<i32, TaskCheckpoint>,
    ) -> Result<()> {
        let Some(log) = &self.log else {
            return Ok(());
        };
        let mut merged = self
            .last_commit
            .as_ref()
            .map(|c| c.checkpoints.clone())
            .unwrap_or_default();
        merged.extend(checkpoints.iter().map(|(p, c)| (*p, c.clone())));
        let commit = BatchCommit {
            batch_id,
            checkpoints: merged,
        };
        log.log_commit(&commit)?;
        self.last_commit = Some(commit);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn request(batch_id: u64) -> BatchRequest {
        BatchRequest {
            batch_id,
            deadline: Instant::now(),
            max_records: 1000,
            available_now: true,
            return_early: false,
            plan_offsets: false,
        }
    }

    fn source(dir: &Path, checkpoint: &Path, max_files_per_batch: usize) -> FilesSource {
        let options = FilesSourceOptions {
            max_files_per_batch,
            checkpoint: Some(checkpoint.to_path_buf()),
            ..Default::default()
        };
        FilesSource::with_options(dir, Vec::new(), options).unwrap()
    }

    /// The lines a batch read, as their values.
    fn values(batch: &SourceBatch) -> Vec<String> {
        batch
            .records
            .iter()
            .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
            .collect()
    }

    fn land(dir: &Path, name: &str, lines: &[&str]) {
        std::fs::write(dir.join(name), lines.join("\n")).unwrap();
    }

    #[test]
    fn each_file_is_read_once_across_runs_and_an_uncommitted_batch_again_as_it_was() {
        let (dir, checkpoint) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        land(dir.path(), "a", &["1", "2"]);
        land(dir.path(), "b", &["3"]);
        land(dir.path(), "c", &["4"]);
        let mut first = source(dir.path(), checkpoint.path(), 2);
        assert_eq!(first.batch_log().unwrap(), BatchLog::Empty);
        let batch = first.next_batch(&request(0)).unwrap();
        assert_eq!(values(&batch), ["1", "2", "3"]);
        assert!(!batch.exhausted, "`c` is left");
        first
            .commit(&[(0, TaskCheckpoint::from_stored("cp0"))].into())
            .unwrap();
        // Batch 1 reads `c` and stops before its commit.
        assert_eq!(values(&first.next_batch(&request(1)).unwrap()), ["4"]);
        drop(first);

        land(dir.path(), "d", &["5"]);
        let mut second = source(dir.path(), checkpoint.path(), 2);
        assert_eq!(second.batch_log().unwrap(), BatchLog::Committed(0));
        assert!(second.replay_until(1, &SourceOffsets::Unknown).unwrap());
        let replayed = second.next_batch(&request(1)).unwrap();
        assert_eq!(values(&replayed), ["4"], "batch 1 as it was, without `d`");
        assert!(!replayed.exhausted, "`d` follows the replayed batch");
        assert_eq!(
            replayed.restored_checkpoints,
            [(0, TaskCheckpoint::from_stored("cp0"))]
        );
        second.commit(&BTreeMap::new()).unwrap();
        assert_eq!(values(&second.next_batch(&request(2)).unwrap()), ["5"]);
        second.commit(&BTreeMap::new()).unwrap();
        drop(second);

        let mut third = source(dir.path(), checkpoint.path(), 2);
        assert_eq!(third.batch_log().unwrap(), BatchLog::Committed(2));
        assert!(!third.replay_until(2, &SourceOffsets::Unknown).unwrap());
        let nothing = third.next_batch(&request(3)).unwrap();
        assert!(nothing.records.is_empty() && nothing.exhausted);
        assert_eq!(
            nothing.restored_checkpoints,
            [(0, TaskCheckpoint::from_stored("cp0"))],
            "the last checkpoint of each partition is kept"
        );
    }

    /// A file rewritten between its batch's log entry and the replay of
    /// that batch ends the run naming it: the replay would read other rows.
    #[test]
    fn a_logged_file_rewritten_before_its_replay_fails_the_run_naming_it() {
        let (dir, checkpoint) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        land(dir.path(), "a", &["1", "2"]);
        let mut first = source(dir.path(), checkpoint.path(), 1);
        assert_eq!(values(&first.next_batch(&request(0)).unwrap()), ["1", "2"]);
        drop(first); // stopped before its commit
        land(dir.path(), "a", &["1", "2", "3"]);
        let mut second = source(dir.path(), checkpoint.path(), 1);
        assert!(second.replay_until(0, &SourceOffsets::Unknown).unwrap());
        let Err(error) = second.next_batch(&request(0)) else {
            panic!("a changed file read");
        };
        let text = error.to_string();
        assert!(
            matches!(error, Error::Config { .. })
                && text.contains("changed")
                && text.contains("/a"),
            "{text}"
        );
    }

    /// Symbolic links are left alone unless asked for: a link in the
    /// directory cannot make the source read a file elsewhere.
    #[test]
    fn symbolic_links_are_read_only_when_asked_for() {
        let (dir, outside) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        land(outside.path(), "secret", &["s"]);
        land(dir.path(), "a", &["1"]);
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("b")).unwrap();
        let read = |follow_symlinks: bool| {
            let options = FilesSourceOptions {
                max_files_per_batch: 10,
                follow_symlinks,
                ..Default::default()
            };
            let mut source = FilesSource::with_options(dir.path(), Vec::new(), options).unwrap();
            values(&source.next_batch(&request(0)).unwrap())
        };
        assert_eq!(read(false), ["1"]);
        assert_eq!(read(true), ["1", "s"]);
    }

    #[test]
    fn start_latest_skips_the_files_there_at_the_first_start_only() {
        let (dir, checkpoint) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        land(dir.path(), "old", &["1"]);
        let options = || FilesSourceOptions {
            start: FilesStart::Latest,
            checkpoint: Some(checkpoint.path().to_path_buf()),
            ..Default::default()
        };
        let mut first = FilesSource::with_options(dir.path(), Vec::new(), options()).unwrap();
        assert!(first.next_batch(&request(0)).unwrap().records.is_empty());
        drop(first);
        land(dir.path(), "new", &["2"]);
        let mut second = FilesSource::with_options(dir.path(), Vec::new(), options()).unwrap();
        assert_eq!(values(&second.next_batch(&request(0)).unwrap()), ["2"]);
    }

    #[test]
    fn an_aborted_batch_is_read_again_after_a_rewind() {
        let dir = tempfile::tempdir().unwrap();
        land(dir.path(), "a", &["1"]);
        land(dir.path(), "b", &["2"]);
        let mut source = FilesSource::new(dir.path()).unwrap();
        assert_eq!(values(&source.next_batch(&request(0)).unwrap()), ["1"]);
        assert!(source.rewind().unwrap());
        assert_eq!(values(&source.next_batch(&request(0)).unwrap()), ["1"]);
        source.commit(&BTreeMap::new()).unwrap();
        assert_eq!(values(&source.next_batch(&request(1)).unwrap()), ["2"]);
    }
}
