//! The files source (files landing in a directory, read a few per batch,
//! each once), the JSON-lines and stdout sinks, and the file dead-letter
//! output.
#![deny(missing_docs)]

mod formats;
mod listing;
mod progress;
mod source;

pub use formats::FileFormat;

/// The fuzz targets' entry (`fuzz/`): reads `bytes` as a file named `name`
/// (its extension says the compression) in `format`, as the source reads
/// one, through a file in the temporary directory; returns the records
/// read. An error is the right answer to bytes that are not such a file.
pub fn read_bytes_for_fuzzing(
    format: FileFormat,
    name: &str,
    bytes: &[u8],
) -> tidemark::error::Result<usize> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("tidemark-fuzz-{}-{n}-{name}", std::process::id()));
    std::fs::write(&path, bytes)
        .map_err(|e| tidemark::error::Error::io(format!("writing {}", path.display()), e))?;
    let topic = std::sync::Arc::from("fuzz");
    let mut out = Vec::new();
    let read = formats::read_file(
        &path,
        format,
        &topic,
        &tidemark::schema::Schema::default(),
        64 << 20,
        &mut out,
    );
    let _ = std::fs::remove_file(&path);
    read.map(|()| out.len())
}
pub use source::{FilesSource, FilesSourceOptions, FilesStart, DEFAULT_MAX_FILE_BYTES};

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use tidemark::error::{Error, Result};
use tidemark::record::Record;
use tidemark::row::Row;
use tidemark::runtime::{DeadLetter, Sink};

/// Decodes the files source's records with `D`, refusing first a record
/// its reader could not read (a malformed CSV line): a bad record naming
/// the file and line, with the reader's reason.
#[derive(Debug)]
pub struct FileReadErrors<D>(pub D);

impl<D: tidemark::runtime::Decoder> tidemark::runtime::Decoder for FileReadErrors<D> {
    fn decode(&mut self, record: &Record) -> Result<Row> {
        match Self::read_error(record) {
            Some(reason) => Err(Error::BadRecord {
                position: record.position.clone(),
                field: "<line>".into(),
                reason: String::from_utf8_lossy(reason).into_owned(),
            }),
            None => self.0.decode(record),
        }
    }

    fn typed_schema(&self, record: &Record) -> Option<&tidemark::schema::Schema> {
        // A line that could not be read takes the row path to its error.
        match Self::read_error(record) {
            Some(_) => None,
            None => self.0.typed_schema(record),
        }
    }

    fn decode_typed<'r>(
        &self,
        record: &'r Record,
        schema: &tidemark::schema::Schema,
    ) -> Result<tidemark::decode::TypedSlots<'r>> {
        self.0.decode_typed(record, schema)
    }
}

impl<D> FileReadErrors<D> {
    /// The reason a line could not be read, when the source marked it so.
    fn read_error(record: &Record) -> Option<&[u8]> {
        record
            .headers
            .iter()
            .find(|(name, _)| name == formats::READ_ERROR_HEADER)
            .map(|(_, reason)| reason.as_slice())
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
                .map_err(|e| Error::sink_failed(format!("{}", self.path.display()), e))?;
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
            formats::read_file(
                file,
                FileFormat::JsonLines,
                &topic,
                &tidemark::schema::Schema::default(),
                source::DEFAULT_MAX_FILE_BYTES,
                &mut records,
            )?;
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
