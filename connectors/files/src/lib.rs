//! The files source (one file = one micro-batch), the JSON-lines and stdout
//! sinks, and the file dead-letter output.
#![deny(missing_docs)]

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use tidemark::error::{Error, Result};
use tidemark::record::{Record, SourcePosition};
use tidemark::row::Row;
use tidemark::runtime::{BatchRequest, DeadLetter, Sink, Source, SourceBatch};

/// Reads a directory whose files are each one micro-batch of JSON lines, in
/// name order. A file is read once; files added later are picked up by the
/// next batch (micro-batch trigger).
///
/// ```no_run
/// let source = tidemark_files::FilesSource::new("batches/").unwrap();
/// ```
#[derive(Debug)]
pub struct FilesSource {
    dir: PathBuf,
    /// Several streams (a join): each a sub-directory of `dir`, batch `i`
    /// being the files named alike in each.
    inputs: Vec<String>,
    done: Vec<PathBuf>,
    handed_out: usize,
    committed: usize,
}

impl FilesSource {
    /// A source over `dir`, which must exist.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::config(
                "source.path",
                format!("`{}` is not a directory", dir.display()),
            ));
        }
        Ok(FilesSource {
            dir,
            inputs: Vec::new(),
            done: Vec::new(),
            handed_out: 0,
            committed: 0,
        })
    }

    /// A source of several streams: `dir/<input>/` each; a batch is the
    /// files of one name across them (a stream may lack a file: no rows of
    /// it in that batch). Records carry their stream's name as topic.
    pub fn with_inputs(dir: impl AsRef<Path>, inputs: Vec<String>) -> Result<Self> {
        let mut source = FilesSource::new(dir)?;
        for input in &inputs {
            if !source.dir.join(input).is_dir() {
                return Err(Error::config(
                    "source.path",
                    format!(
                        "`{}` has no sub-directory `{input}` for that stream",
                        source.dir.display()
                    ),
                ));
            }
        }
        source.inputs = inputs;
        Ok(source)
    }

    /// The pending batch names (multi-stream mode): file names in any
    /// stream's directory, not yet read.
    fn pending_names(&self) -> Result<Vec<PathBuf>> {
        let mut names = std::collections::BTreeSet::new();
        for input in &self.inputs {
            let dir = self.dir.join(input);
            for entry in fs::read_dir(&dir)
                .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
            {
                let path = entry
                    .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
                    .path();
                let Some(name) = path.file_name() else {
                    continue;
                };
                if path.is_file() && !name.to_string_lossy().starts_with('.') {
                    names.insert(PathBuf::from(name));
                }
            }
        }
        Ok(names
            .into_iter()
            .filter(|n| !self.done.contains(n))
            .collect())
    }

    fn read_lines(file: &Path, topic: &std::sync::Arc<str>, out: &mut Vec<Record>) -> Result<()> {
        let reader = BufReader::new(
            File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?,
        );
        for (line_no, line) in reader.split(b'\n').enumerate() {
            let line = line.map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            out.push(Record {
                value: Some(line),
                position: SourcePosition::new(topic.clone(), 0, line_no as i64 + 1),
                ..Default::default()
            });
        }
        Ok(())
    }

    fn pending(&self) -> Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("reading {}", self.dir.display()), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .filter(|p| !self.done.contains(p))
            .collect();
        files.sort();
        Ok(files)
    }
}

impl Source for FilesSource {
    fn describe(&self) -> String {
        format!("FileStreamSource[{}]", self.dir.display())
    }

    fn next_batch(&mut self, request: &BatchRequest) -> Result<SourceBatch> {
        if !self.inputs.is_empty() {
            let pending = self.pending_names()?;
            let Some(name) = pending.first().cloned() else {
                return Ok(SourceBatch {
                    exhausted: request.available_now,
                    ..Default::default()
                });
            };
            let mut records = Vec::new();
            for input in &self.inputs {
                let file = self.dir.join(input).join(&name);
                if file.is_file() {
                    Self::read_lines(&file, &std::sync::Arc::from(input.as_str()), &mut records)?;
                }
            }
            self.done.push(name);
            self.handed_out += 1;
            return Ok(SourceBatch {
                records,
                exhausted: request.available_now && pending.len() == 1,
                ..Default::default()
            });
        }
        let pending = self.pending()?;
        let Some(file) = pending.first().cloned() else {
            return Ok(SourceBatch {
                exhausted: request.available_now,
                ..Default::default()
            });
        };
        let name: std::sync::Arc<str> = std::sync::Arc::from(file.display().to_string());
        let mut records = Vec::new();
        Self::read_lines(&file, &name, &mut records)?;
        self.done.push(file);
        self.handed_out += 1;
        Ok(SourceBatch {
            records,
            exhausted: request.available_now && pending.len() == 1,
            revoked_partitions: Vec::new(),
            restored_checkpoints: Vec::new(),
        })
    }

    fn commit(&mut self, _checkpoints: &std::collections::BTreeMap<i32, String>) -> Result<()> {
        // A replayed directory starts from its first file: nothing to keep.
        self.committed = self.handed_out;
        Ok(())
    }

    fn offsets(&self) -> serde_json::Value {
        serde_json::json!({ "logOffset": self.handed_out as i64 - 1 })
    }

    fn watermark_input(&self, topic: &str, _partition: i32) -> String {
        if self.inputs.is_empty() {
            // Every file belongs to one input: the directory.
            self.dir.display().to_string()
        } else {
            format!("{}/{topic}", self.dir.display())
        }
    }
}

/// Formats one output row as `{"batch_id": N, ...columns}`.
pub fn row_with_batch_id(batch_id: u64, row: &Row) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    map.insert("batch_id".into(), batch_id.into());
    if let serde_json::Value::Object(cols) = row.to_json() {
        map.extend(cols);
    }
    serde_json::Value::Object(map)
}

/// Appends one JSON object per row: `batch_id`, then the row's columns.
#[derive(Debug)]
pub struct JsonlSink {
    path: PathBuf,
    out: BufWriter<File>,
}

impl JsonlSink {
    /// A sink appending to `path` (created with its parent directories).
    pub fn new(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        Ok(JsonlSink {
            path,
            out: BufWriter::new(file),
        })
    }
}

impl Sink for JsonlSink {
    fn describe(&self) -> String {
        format!("JsonlSink[{}]", self.path.display())
    }
    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        for row in rows {
            serde_json::to_writer(&mut self.out, &row_with_batch_id(batch_id, row))
                .map_err(|e| Error::Sink(format!("{}: {e}", self.path.display())))?;
            self.out
                .write_all(b"\n")
                .map_err(|e| Error::io(format!("writing {}", self.path.display()), e))?;
        }
        Ok(())
    }
    fn commit(&mut self, _batch_id: u64) -> Result<()> {
        self.out
            .flush()
            .and_then(|_| sync_if_supported(self.out.get_ref()))
            .map_err(|e| Error::io(format!("flushing {}", self.path.display()), e))
    }
}

/// Syncs `file` to disk. A special file such as `/dev/null` cannot be
/// synced (`EINVAL`, which std reports as `InvalidInput`): there is nothing
/// to make durable, so that is not an error. A regular file that cannot be
/// synced still is.
fn sync_if_supported(file: &File) -> std::io::Result<()> {
    match file.sync_data() {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            match file.metadata()?.file_type().is_file() {
                true => Err(e),
                false => Ok(()),
            }
        }
        other => other,
    }
}

/// Prints one JSON object per row to standard output.
#[derive(Debug, Default)]
pub struct StdoutSink;

impl Sink for StdoutSink {
    fn describe(&self) -> String {
        "ConsoleSink".into()
    }
    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        for row in rows {
            // A closed stdout (e.g. `| head`) must not crash the pipeline.
            let _ = writeln!(out, "{}", row_with_batch_id(batch_id, row));
        }
        Ok(())
    }
    fn commit(&mut self, _batch_id: u64) -> Result<()> {
        let _ = std::io::stdout().flush();
        Ok(())
    }
}

/// Appends failed records as JSON lines: position, error and the payload
/// (UTF-8, or base64-free hex when it is not text).
#[derive(Debug)]
pub struct FileDeadLetter {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    /// Records written.
    pub count: u64,
}

impl FileDeadLetter {
    /// A dead-letter file at `path`, created on the first bad record.
    pub fn new(path: impl AsRef<Path>) -> Self {
        FileDeadLetter {
            path: path.as_ref().to_path_buf(),
            out: None,
            count: 0,
        }
    }
}

/// Hex of bytes, for payloads that are not UTF-8.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl DeadLetter for FileDeadLetter {
    fn send(&mut self, record: &Record, error: &Error) -> Result<()> {
        if self.out.is_none() {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| Error::io(format!("opening {}", self.path.display()), e))?;
            self.out = Some(BufWriter::new(file));
        }
        let value = record.value.as_deref().unwrap_or_default();
        let entry = serde_json::json!({
            "topic": record.position.topic.as_ref(),
            "partition": record.position.partition,
            "offset": record.position.offset,
            "error": error.to_string(),
            "value": std::str::from_utf8(value).map(str::to_string).unwrap_or_else(|_| hex(value)),
        });
        tracing::warn!(position = %record.position, %error, "bad record sent to dead-letter file");
        let out = self.out.as_mut().expect("opened above");
        writeln!(out, "{entry}")
            .map_err(|e| Error::io(format!("writing {}", self.path.display()), e))?;
        self.count += 1;
        metrics::counter!("tidemark_dead_letters_total").increment(1);
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        if let Some(out) = self.out.as_mut() {
            out.flush()
                .map_err(|e| Error::io(format!("flushing {}", self.path.display()), e))?;
        }
        Ok(())
    }
}

/// A global table's feed from a directory of JSON-lines files: each call
/// reads the next file in name order (so file *n* lands before batch *n*
/// of a files source), the whole table being the files read so far.
#[derive(Debug)]
pub struct FilesTableFeed {
    dir: PathBuf,
    read: usize,
}

impl FilesTableFeed {
    /// A feed of the files in `dir`, which must exist.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::config(
                "table_join.topic",
                format!("`{}` is not a directory", dir.display()),
            ));
        }
        Ok(FilesTableFeed { dir, read: 0 })
    }
}

impl tidemark::runtime::TableFeed for FilesTableFeed {
    fn describe(&self) -> String {
        format!("GlobalTable[{}]", self.dir.display())
    }

    fn catch_up(&mut self) -> Result<Vec<Record>> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("reading {}", self.dir.display()), e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        let mut records = Vec::new();
        if let Some(file) = files.get(self.read) {
            let topic = std::sync::Arc::from(
                self.dir
                    .file_name()
                    .map(|n| n.to_string_lossy().to_string())
                    .unwrap_or_default(),
            );
            FilesSource::read_lines(file, &topic, &mut records)?;
            self.read += 1;
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark::row::Value;

    #[test]
    fn a_jsonl_sink_commits_to_a_file_and_to_dev_null() {
        let dir = tempfile::tempdir().unwrap();
        let row: Row = [("n", Value::Long(1))].into_iter().collect();
        let path = dir.path().join("out.jsonl");
        let mut sink = JsonlSink::new(&path).unwrap();
        sink.write(0, std::slice::from_ref(&row)).unwrap();
        sink.commit(0).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\"batch_id\":0,\"n\":1}\n"
        );
        // A special file cannot be synced; writing rows away is still a
        // commit (the Nexmark benchmark's blackhole sink).
        let mut null = JsonlSink::new("/dev/null").unwrap();
        null.write(0, &[row]).unwrap();
        null.commit(0).unwrap();
    }
}
