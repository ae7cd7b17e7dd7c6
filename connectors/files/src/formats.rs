//! Reading one file of the files source into records: JSON lines, CSV and
//! Parquet, plain or compressed (`.gz`, `.zst`).
//!
//! CSV and Parquet rows become one JSON object each, so that the pipeline's
//! JSON decoder types them by its schema exactly as it types JSON input: one
//! decoder, one set of conversion rules and error messages for every format.

use arrow_array::{Array, RecordBatch, StringArray};
use arrow_json::writer::{
    Encoder, EncoderFactory, EncoderOptions, LineDelimited, NullableEncoder, WriterBuilder,
};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema as ArrowSchema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tidemark::error::{Error, Result};
use tidemark::record::{Record, SourcePosition};
use tidemark::schema::{FieldType, Schema};

/// The header of a record made of a line that could not be read (a CSV line
/// Arrow refuses): its value says why, naming the column when known. The
/// record's value is the raw line.
pub(crate) const READ_ERROR_HEADER: &str = "tidemark.error";

/// How a file's content is laid out.
///
/// Public (the crate re-exports it): the files source's options name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// One JSON object per line.
    JsonLines,
    /// Comma-separated values with a header row naming the columns.
    Csv,
    /// Apache Parquet.
    Parquet,
}

/// Reads `file` (decompressing it first when its name ends in `.gz` or
/// `.zst`) in `format` and appends one record per line (JSON lines) or row
/// (CSV, Parquet) to `out`, in file order.
///
/// A record's position is `topic`, partition 0, and the 1-based physical
/// line in the decompressed file (JSON lines, CSV: the header is line 1) or
/// the 1-based row (Parquet). Blank lines are skipped. CSV and Parquet rows
/// become JSON objects; `schema` (the pipeline's, possibly empty) types the
/// CSV columns. A CSV line Arrow cannot parse becomes a record holding the
/// raw line and a [`READ_ERROR_HEADER`]; an unreadable file is an error
/// naming it.
///
/// A file holding more than `max_bytes` once decompressed (a compression
/// bomb, a file far larger than the batches this query was sized for) is a
/// configuration error naming `source.max_file_mb` and the file: its
/// records would be held in memory at once.
pub(crate) fn read_file(
    file: &Path,
    format: FileFormat,
    topic: &Arc<str>,
    schema: &Schema,
    max_bytes: u64,
    out: &mut Vec<Record>,
) -> Result<()> {
    let input = Input { file, max_bytes };
    match format {
        FileFormat::JsonLines => read_json_lines(&input, topic, out),
        FileFormat::Csv => read_csv(&input, topic, schema, out),
        FileFormat::Parquet => read_parquet(&input, topic, out),
    }
}

/// The file being read, and the most bytes it may hold decompressed.
struct Input<'a> {
    file: &'a Path,
    max_bytes: u64,
}

/// Marks the read error of a file past its size cap.
#[derive(Debug)]
struct PastSizeCap;

impl std::fmt::Display for PastSizeCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("past source.max_file_mb")
    }
}

impl std::error::Error for PastSizeCap {}

/// A reader that fails with [`PastSizeCap`] once more than its cap was
/// read from it.
struct CappedReader<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buf)?;
        self.left = match self.left.checked_sub(read as u64) {
            Some(left) => left,
            None => return Err(std::io::Error::other(PastSizeCap)),
        };
        Ok(read)
    }
}

/// The configuration error of a file past `max_bytes`.
fn past_size_cap(file: &Path, max_bytes: u64) -> Error {
    Error::config(
        "source.max_file_mb",
        format!(
            "{} holds more than {max_bytes} bytes (decompressed): its records would all be held in memory at once; split it, or raise `source.max_file_mb`",
            file.display()
        ),
    )
}

/// A record of the files source.
fn record(topic: &Arc<str>, number: i64, value: Vec<u8>) -> Record {
    Record {
        value: Some(value),
        position: SourcePosition::new(topic.clone(), 0, number),
        ..Default::default()
    }
}

/// Whether a line holds nothing but whitespace (skipped in every format).
fn is_blank(line: &[u8]) -> bool {
    line.iter().all(|b| b.is_ascii_whitespace())
}

/// An I/O error while reading `input`, naming it (a file past its size
/// cap: the configuration error saying so).
fn input_error(input: &Input, e: std::io::Error) -> Error {
    if e.get_ref().is_some_and(|inner| inner.is::<PastSizeCap>()) {
        return past_size_cap(input.file, input.max_bytes);
    }
    read_error(input.file, e)
}

/// An I/O error while reading `file`, naming it.
fn read_error(file: &Path, e: std::io::Error) -> Error {
    Error::io(format!("reading {}", file.display()), e)
}

// ---------------------------------------------------------------------------
// Compression

/// How a file is compressed, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// By the last extension (`x.csv.gz` is gzip), as producers name them.
    fn of(file: &Path) -> Self {
        match file.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("gz") => Compression::Gzip,
            Some(e) if e.eq_ignore_ascii_case("zst") => Compression::Zstd,
            _ => Compression::None,
        }
    }
}

/// The file's content, decompressed as it is read. A truncated or corrupt
/// compressed file fails on read, as an I/O error.
/// Reading more than the input's cap fails with [`PastSizeCap`].
fn open(input: &Input) -> Result<Box<dyn Read>> {
    let file = input.file;
    let opening = |e| Error::io(format!("opening {}", file.display()), e);
    let opened = File::open(file).map_err(opening)?;
    let decompressed: Box<dyn Read> = match Compression::of(file) {
        Compression::None => Box::new(opened),
        // Multi-member: `cat a.gz b.gz` is a valid gzip file of both.
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(opened)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(opened).map_err(opening)?),
    };
    Ok(Box::new(CappedReader {
        inner: decompressed,
        left: input.max_bytes,
    }))
}

// ---------------------------------------------------------------------------
// JSON lines

/// One record per non-blank line, its bytes as they are (a `\r` included).
fn read_json_lines(input: &Input, topic: &Arc<str>, out: &mut Vec<Record>) -> Result<()> {
    let reader = BufReader::new(open(input)?);
    for (line_no, line) in reader.split(b'\n').enumerate() {
        let line = line.map_err(|e| input_error(input, e))?;
        if is_blank(&line) {
            continue;
        }
        out.push(record(topic, line_no as i64 + 1, line));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Rows to JSON

/// How a naive (zone-less) timestamp is written: as UTC with a `Z`, since
/// the JSON decoder wants RFC 3339 with a zone (Arrow's default has none).
/// Zoned timestamps keep Arrow's default, RFC 3339 with their offset.
const NAIVE_TIMESTAMP_FORMAT: &str = "%Y-%m-%dT%H:%M:%S%.fZ";

/// One JSON object per row of `batch`, nulls left out (the decoder reads a
/// missing field as NULL). `encoders` overrides how some columns are
/// written.
fn json_rows(
    batch: &RecordBatch,
    encoders: Option<&Arc<dyn EncoderFactory>>,
) -> std::result::Result<Vec<Vec<u8>>, ArrowError> {
    let mut builder = WriterBuilder::new()
        .with_explicit_nulls(false)
        .with_timestamp_format(NAIVE_TIMESTAMP_FORMAT.to_string());
    if let Some(encoders) = encoders {
        builder = builder.with_encoder_factory(encoders.clone());
    }
    let mut writer = builder.build::<_, LineDelimited>(Vec::new());
    writer.write(batch)?;
    writer.finish()?;
    // JSON escapes newlines inside strings: each line is one row.
    Ok(writer
        .into_inner()
        .split(|b| *b == b'\n')
        .filter(|row| !row.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// Writes the text of CSV columns the schema calls `timestamp` as a JSON
/// number when it is an integer, else as a string: the decoder reads a
/// number as epoch milliseconds and a string as RFC 3339, as for JSON input
/// (a CSV cell has no type to tell them apart).
#[derive(Debug)]
struct TimestampText {
    columns: Vec<String>,
}

impl TimestampText {
    /// The encoders for `schema`'s timestamp columns, if it has any.
    fn for_schema(schema: &Schema) -> Option<Arc<dyn EncoderFactory>> {
        let columns: Vec<String> = schema
            .fields()
            .filter(|(_, ty)| *ty == FieldType::Timestamp)
            .map(|(name, _)| name.to_string())
            .collect();
        match columns.is_empty() {
            true => None,
            false => Some(Arc::new(TimestampText { columns })),
        }
    }
}

impl EncoderFactory for TimestampText {
    fn make_default_encoder<'a>(
        &self,
        field: &'a FieldRef,
        array: &'a dyn Array,
        _options: &'a EncoderOptions,
    ) -> std::result::Result<Option<NullableEncoder<'a>>, ArrowError> {
        if !self.columns.iter().any(|c| c == field.name()) {
            return Ok(None);
        }
        let Some(text) = array.as_any().downcast_ref::<StringArray>() else {
            return Ok(None);
        };
        let encoder = Box::new(TimestampTextEncoder(text));
        Ok(Some(NullableEncoder::new(encoder, text.nulls().cloned())))
    }
}

/// See [`TimestampText`].
struct TimestampTextEncoder<'a>(&'a StringArray);

impl Encoder for TimestampTextEncoder<'_> {
    fn encode(&mut self, idx: usize, out: &mut Vec<u8>) {
        let text = self.0.value(idx);
        match text.trim().parse::<i64>() {
            // Re-printed: `+5` or `007` parse but are not JSON numbers.
            Ok(millis) => out.extend_from_slice(millis.to_string().as_bytes()),
            // Writing to a Vec cannot fail.
            Err(_) => {
                let _ = serde_json::to_writer(&mut *out, text);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// CSV

/// Rows per Arrow read of a CSV file: enough to spread Arrow's per-read
/// cost, few enough that re-reading a failed chunk line by line is cheap.
const CSV_CHUNK_ROWS: usize = 1024;

/// One CSV row as it stands in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CsvLine {
    /// The 1-based physical line it starts on.
    number: i64,
    /// Its bytes, without the line terminator; several physical lines when
    /// a quoted field holds a newline.
    bytes: Vec<u8>,
}

/// Where a CSV parser stands within a row, to know whether a newline ends
/// the row or belongs to a quoted field (as Arrow's parser, csv-core, reads
/// it: a quote opens a quoted field only at a field's start, `""` inside one
/// is a quote).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quoting {
    FieldStart,
    Unquoted,
    Quoted,
    QuoteInQuoted,
}

impl Quoting {
    /// The state after `byte`.
    fn next(self, byte: u8) -> Self {
        match (self, byte) {
            (Quoting::Quoted, b'"') => Quoting::QuoteInQuoted,
            (Quoting::Quoted, _) => Quoting::Quoted,
            (Quoting::FieldStart | Quoting::QuoteInQuoted, b'"') => Quoting::Quoted,
            (_, b',') => Quoting::FieldStart,
            _ => Quoting::Unquoted,
        }
    }
}

/// The rows of a CSV text (header first) as they are read, blank lines left
/// out: the file is never held whole. A quote never closed makes the rest of
/// the file one row, as for Arrow.
struct CsvLines<R> {
    reader: R,
    /// The physical lines read so far.
    lines_read: i64,
}

impl<R: BufRead> CsvLines<R> {
    fn new(reader: R) -> Self {
        CsvLines {
            reader,
            lines_read: 0,
        }
    }

    /// The next row, or `None` at the end of the text.
    fn next_line(&mut self) -> std::io::Result<Option<CsvLine>> {
        let mut open: Option<CsvLine> = None;
        let mut quoting = Quoting::FieldStart;
        let mut line = Vec::new();
        loop {
            line.clear();
            if self.reader.read_until(b'\n', &mut line)? == 0 {
                // Only a row whose last line ended in a newline is still
                // open here: that newline is inside its quoted field.
                if let Some(row) = &mut open {
                    row.bytes.push(b'\n');
                }
                return Ok(open);
            }
            self.lines_read += 1;
            let ended = line.last() == Some(&b'\n');
            if ended {
                line.pop();
            }
            let row = match &mut open {
                Some(row) => {
                    row.bytes.push(b'\n');
                    row
                }
                None if is_blank(&line) => continue,
                None => open.insert(CsvLine {
                    number: self.lines_read,
                    bytes: Vec::new(),
                }),
            };
            row.bytes.extend_from_slice(&line);
            quoting = line.iter().fold(quoting, |q, b| q.next(*b));
            if quoting != Quoting::Quoted {
                if row.bytes.last() == Some(&b'\r') {
                    row.bytes.pop();
                }
                return Ok(open);
            }
            if !ended {
                return Ok(open);
            }
        }
    }
}

/// The rows of a [`CsvLines`] joined back into a text for Arrow's schema
/// inference, read as they are needed.
struct CsvText<R> {
    lines: CsvLines<R>,
    /// The current row and its `\n`, and how much of it was handed out.
    pending: Vec<u8>,
    handed: usize,
}

impl<R: BufRead> Read for CsvText<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.handed == self.pending.len() {
            let Some(line) = self.lines.next_line()? else {
                return Ok(0);
            };
            self.pending = line.bytes;
            self.pending.push(b'\n');
            self.handed = 0;
        }
        let rest = &self.pending[self.handed..];
        let count = rest.len().min(buf.len());
        buf[..count].copy_from_slice(&rest[..count]);
        self.handed += count;
        Ok(count)
    }
}

/// Reads a CSV file with a header row: one JSON-object record per row, a
/// [`READ_ERROR_HEADER`] record per line Arrow refuses. The file is read as
/// a stream, [`CSV_CHUNK_ROWS`] rows at a time; without a pipeline schema
/// it is read twice, first to infer the column types.
fn read_csv(input: &Input, topic: &Arc<str>, schema: &Schema, out: &mut Vec<Record>) -> Result<()> {
    let mut lines = CsvLines::new(BufReader::new(open(input)?));
    let reading = |e| input_error(input, e);
    let Some(header) = lines.next_line().map_err(reading)? else {
        return Ok(());
    };
    let columns = match schema.is_empty() {
        true => inferred_csv_schema(input, &header)?,
        false => typed_csv_schema(input.file, &header, schema)?,
    };
    let reader = CsvRows {
        schema: columns,
        encoders: TimestampText::for_schema(schema),
        topic,
    };
    let mut chunk = Vec::with_capacity(CSV_CHUNK_ROWS);
    while let Some(line) = lines.next_line().map_err(reading)? {
        chunk.push(line);
        if chunk.len() == CSV_CHUNK_ROWS {
            reader.read_chunk(&chunk, out);
            chunk.clear();
        }
    }
    if !chunk.is_empty() {
        reader.read_chunk(&chunk, out);
    }
    Ok(())
}

/// The Arrow schema to read a CSV file's rows with: the header's columns,
/// typed by the pipeline's schema.
fn typed_csv_schema(file: &Path, header: &CsvLine, schema: &Schema) -> Result<SchemaRef> {
    let fields: Vec<Field> = csv_header(file, header)?
        .into_iter()
        .map(|name| {
            let ty = arrow_type(schema.field_type(&name));
            Field::new(name, ty, true)
        })
        .collect();
    Ok(Arc::new(ArrowSchema::new(fields)))
}

/// The Arrow type a column of the pipeline's type is read as. Timestamps
/// stay text for the JSON decoder to parse as it parses JSON input; columns
/// the pipeline does not name are text (its decoder drops them).
fn arrow_type(ty: Option<FieldType>) -> DataType {
    match ty {
        Some(FieldType::Long) => DataType::Int64,
        Some(FieldType::Double) => DataType::Float64,
        Some(FieldType::Boolean) => DataType::Boolean,
        Some(FieldType::String | FieldType::Timestamp) | None => DataType::Utf8,
    }
}

/// The column names of a CSV header row.
fn csv_header(file: &Path, header: &CsvLine) -> Result<Vec<String>> {
    let (schema, _) = arrow_csv::reader::Format::default()
        .with_header(true)
        .infer_schema(header.bytes.as_slice(), Some(0))
        .map_err(|e| {
            Error::source_failed(
                format!(
                    "{}: line {}: cannot read the CSV header",
                    file.display(),
                    header.number
                ),
                e,
            )
        })?;
    Ok(schema.fields().iter().map(|f| f.name().clone()).collect())
}

/// Column types inferred from the whole file, read as a stream of its own.
/// Only numbers and booleans are kept: Arrow would rewrite dates and
/// timestamps it recognizes, and the decoder of an empty schema keeps text
/// as it is. Rows with too few or too many fields do not stop the inference
/// (they are refused one by one later); if it fails anyway (bad UTF-8),
/// every column is text. A file that cannot be read fails the second read,
/// which names it.
fn inferred_csv_schema(input: &Input, header: &CsvLine) -> Result<SchemaRef> {
    let text = CsvText {
        lines: CsvLines::new(BufReader::new(open(input)?)),
        pending: Vec::new(),
        handed: 0,
    };
    let inferred = arrow_csv::reader::Format::default()
        .with_header(true)
        .with_truncated_rows(true)
        .infer_schema(text, None);
    let fields: Vec<Field> = match inferred {
        Ok((schema, _)) => schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), kept_inferred_type(f.data_type()), true))
            .collect(),
        Err(_) => csv_header(input.file, header)?
            .into_iter()
            .map(|name| Field::new(name, DataType::Utf8, true))
            .collect(),
    };
    Ok(Arc::new(ArrowSchema::new(fields)))
}

/// An inferred type, or text for those not kept (see
/// [`inferred_csv_schema`]).
fn kept_inferred_type(ty: &DataType) -> DataType {
    match ty {
        DataType::Int64 | DataType::Float64 | DataType::Boolean => ty.clone(),
        _ => DataType::Utf8,
    }
}

/// CSV lines joined back into a text for Arrow.
fn csv_text(lines: &[CsvLine]) -> Vec<u8> {
    let mut text = Vec::new();
    for line in lines {
        text.extend_from_slice(&line.bytes);
        text.push(b'\n');
    }
    text
}

/// Reads the rows of one CSV file.
struct CsvRows<'t> {
    /// The columns and their types.
    schema: SchemaRef,
    /// How timestamp columns are written (see [`TimestampText`]).
    encoders: Option<Arc<dyn EncoderFactory>>,
    topic: &'t Arc<str>,
}

impl CsvRows<'_> {
    /// Reads a chunk in one go; when Arrow refuses it, line by line, so that
    /// only the bad lines are lost.
    fn read_chunk(&self, chunk: &[CsvLine], out: &mut Vec<Record>) {
        match self.to_json(chunk) {
            Ok(rows) if rows.len() == chunk.len() => {
                for (line, row) in chunk.iter().zip(rows) {
                    out.push(record(self.topic, line.number, row));
                }
            }
            _ => out.extend(chunk.iter().map(|line| self.read_line(line))),
        }
    }

    /// One line's record: its row, or the raw line and why it is refused.
    fn read_line(&self, line: &CsvLine) -> Record {
        let reason = match self
            .to_json(std::slice::from_ref(line))
            .map(<[Vec<u8>; 1]>::try_from)
        {
            Ok(Ok([row])) => return record(self.topic, line.number, row),
            // A lone `\r` ends a row for Arrow: never silently split a line.
            Ok(Err(rows)) => format!("the line holds {} CSV rows, not one", rows.len()),
            Err(e) => csv_error_reason(&e, &self.schema),
        };
        let mut bad = record(self.topic, line.number, line.bytes.clone());
        bad.headers
            .push((READ_ERROR_HEADER.to_string(), reason.into_bytes()));
        bad
    }

    /// The lines' rows as JSON objects, or why Arrow refuses one of them.
    fn to_json(&self, lines: &[CsvLine]) -> std::result::Result<Vec<Vec<u8>>, ArrowError> {
        let text = csv_text(lines);
        let reader = arrow_csv::ReaderBuilder::new(self.schema.clone())
            .with_header(false)
            .with_batch_size(lines.len().max(1))
            .build(text.as_slice())?;
        let mut rows = Vec::with_capacity(lines.len());
        for batch in reader {
            rows.extend(json_rows(&batch?, self.encoders.as_ref())?);
        }
        Ok(rows)
    }
}

/// Arrow's reason for refusing a line, the column named rather than
/// numbered, without the line number (of the one-line re-read, not of the
/// file) and the row data (the record's value is the line).
fn csv_error_reason(e: &ArrowError, schema: &ArrowSchema) -> String {
    let text = match e {
        ArrowError::ParseError(m) | ArrowError::CsvError(m) => m.clone(),
        other => other.to_string(),
    };
    let text = match text.find(". Row data:") {
        Some(cut) => text[..cut].to_string(),
        None => text,
    };
    let text = without_number_after(&without_number_after(&text, " at line "), " for line ");
    name_column(&text, schema)
}

/// `text` without the first `pattern` followed by digits, and the digits.
fn without_number_after(text: &str, pattern: &str) -> String {
    let Some(at) = text.find(pattern) else {
        return text.to_string();
    };
    let rest = &text[at + pattern.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    match digits {
        0 => text.to_string(),
        _ => format!("{}{}", &text[..at], &rest[digits..]),
    }
}

/// `text` with `column <index>` replaced by the column's name.
fn name_column(text: &str, schema: &ArrowSchema) -> String {
    const PATTERN: &str = "column ";
    let Some(at) = text.find(PATTERN) else {
        return text.to_string();
    };
    let rest = &text[at + PATTERN.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let field = rest[..digits]
        .parse::<usize>()
        .ok()
        .and_then(|index| schema.fields().get(index));
    match field {
        Some(field) => format!(
            "{}column `{}`{}",
            &text[..at],
            field.name(),
            &rest[digits..]
        ),
        None => text.to_string(),
    }
}

// ---------------------------------------------------------------------------
// Parquet

/// One JSON-object record per row, numbered from 1.
fn read_parquet(input: &Input, topic: &Arc<str>, out: &mut Vec<Record>) -> Result<()> {
    let file = input.file;
    let unreadable = |e: Box<dyn std::error::Error + Send + Sync>| {
        Error::source_failed(format!("{}: cannot read it as Parquet", file.display()), e)
    };
    // Kept until the rows are read: dropping it removes the copy.
    let (opened, _copy) = open_parquet(input)?;
    let mut rows = Vec::new();
    // The parquet crate panics on some corrupt files (an embedded Arrow
    // schema with a 4-bit integer, found by fuzzing): such a file is
    // unreadable, not a reason to stop the process. Nothing shared is
    // touched inside, so unwinding out of it leaves no broken state.
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let builder =
            ParquetRecordBatchReaderBuilder::try_new(opened).map_err(|e| unreadable(e.into()))?;
        // Compressed inside the file: the footer's uncompressed sizes are
        // refused before anything is decoded (dictionaries are counted as
        // the rows are read, below).
        let uncompressed: i64 = builder
            .metadata()
            .row_groups()
            .iter()
            .map(|group| group.total_byte_size())
            .sum();
        if u64::try_from(uncompressed).map_or(true, |size| size > input.max_bytes) {
            return Err(past_size_cap(file, input.max_bytes));
        }
        let reader = builder.build().map_err(|e| unreadable(e.into()))?;
        // Parquet compresses and dictionary-encodes inside the file: the
        // rows as they are held, not the file's size, are what the cap
        // bounds.
        let mut held: u64 = 0;
        for batch in reader {
            let batch = batch.map_err(|e| unreadable(e.into()))?;
            let batch_rows = json_rows(&batch, None).map_err(|e| unreadable(e.into()))?;
            held += batch_rows.iter().map(|row| row.len() as u64).sum::<u64>();
            if held > input.max_bytes {
                return Err(past_size_cap(file, input.max_bytes));
            }
            rows.extend(batch_rows);
        }
        Ok::<_, Error>(())
    }));
    match read {
        Ok(read) => read?,
        Err(panic) => {
            let reason = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("the Parquet reader panicked");
            return Err(unreadable(reason.into()));
        }
    }
    for (number, row) in (1..).zip(rows) {
        out.push(record(topic, number, row));
    }
    Ok(())
}

/// The Parquet file to read, and the decompressed copy to remove after when
/// it is compressed: Parquet's reader needs random access, which a
/// decompressing stream cannot give (reading from memory would take the
/// `bytes` crate, not a dependency).
fn open_parquet(input: &Input) -> Result<(File, Option<TempCopy>)> {
    let file = input.file;
    if Compression::of(file) == Compression::None {
        let opened =
            File::open(file).map_err(|e| Error::io(format!("opening {}", file.display()), e))?;
        let size = opened
            .metadata()
            .map_err(|e| Error::io(format!("reading {}", file.display()), e))?
            .len();
        if size > input.max_bytes {
            return Err(past_size_cap(file, input.max_bytes));
        }
        return Ok((opened, None));
    }
    let copy = TempCopy::new();
    let writing = |e| Error::io(format!("writing {}", copy.path.display()), e);
    let mut target = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&copy.path)
        .map_err(writing)?;
    std::io::copy(&mut open(input)?, &mut target).map_err(|e| input_error(input, e))?;
    Ok((target, Some(copy)))
}

/// A file in the temporary directory, removed when dropped.
#[derive(Debug)]
struct TempCopy {
    path: PathBuf,
}

impl TempCopy {
    /// A path no other reader (thread or process) uses.
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!(
            "tidemark-{}-{}-{nanos}.parquet",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        TempCopy {
            path: std::env::temp_dir().join(name),
        }
    }
}

impl Drop for TempCopy {
    fn drop(&mut self) {
        // Best effort: a leftover copy in the temporary directory is harmless.
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, TimestampMicrosecondArray};
    use std::io::Write;
    use tidemark::decode::JsonDecoder;
    use tidemark::row::{Row, Value};
    use tidemark::runtime::Decoder;

    fn topic() -> Arc<str> {
        Arc::from("in")
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), Default::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        zstd::encode_all(data, 0).unwrap()
    }

    fn read(file: &Path, format: FileFormat, schema: &Schema) -> Result<Vec<Record>> {
        let mut out = Vec::new();
        read_file(file, format, &topic(), schema, u64::MAX, &mut out)?;
        Ok(out)
    }

    /// (line, value) of each record, values as text.
    fn lines(records: &[Record]) -> Vec<(i64, String)> {
        records
            .iter()
            .map(|r| {
                let value = String::from_utf8_lossy(r.value.as_deref().unwrap()).to_string();
                (r.position.offset, value)
            })
            .collect()
    }

    fn decode(schema: &Schema, records: &[Record]) -> Vec<Row> {
        let mut decoder = JsonDecoder::new(schema.clone());
        records.iter().map(|r| decoder.decode(r).unwrap()).collect()
    }

    fn str(s: &str) -> Value {
        Value::Str(Arc::from(s))
    }

    fn micros(rfc3339: &str) -> i64 {
        tidemark::time::parse_rfc3339(rfc3339).unwrap()
    }

    #[test]
    fn a_small_parquet_file_of_many_equal_rows_is_capped_by_its_rows() {
        // 4096 rows of one 1 KiB string: dictionary-encoded to a few KiB on
        // disk, 4 MiB once read.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("repeated.parquet");
        let schema = Arc::new(ArrowSchema::new(vec![Field::new(
            "s",
            DataType::Utf8,
            true,
        )]));
        let value = "x".repeat(1024);
        let column = StringArray::from(vec![value.as_str(); 4096]);
        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(column)]).unwrap();
        let file = File::create(&path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < 1 << 20);
        let read_with_cap = |cap: u64| {
            let mut out = Vec::new();
            read_file(
                &path,
                FileFormat::Parquet,
                &topic(),
                &Schema::default(),
                cap,
                &mut out,
            )
            .map(|()| out.len())
        };
        let error = read_with_cap(1 << 20).unwrap_err().to_string();
        assert!(error.contains("source.max_file_mb"), "{error}");
        assert_eq!(read_with_cap(8 << 20).unwrap(), 4096);
    }

    #[test]
    fn a_streamed_csv_file_reads_alike_in_chunks_with_and_without_a_schema() {
        // More rows than one chunk, a quoted newline across a chunk's end,
        // a bad line in the second chunk.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("many.csv");
        let mut text = String::from("id,name\n");
        for id in 1..=CSV_CHUNK_ROWS + 10 {
            match id {
                _ if id == CSV_CHUNK_ROWS => text.push_str(&format!("{id},\"a\nb\"\n")),
                _ if id == CSV_CHUNK_ROWS + 5 => text.push_str("x,y,z\n"),
                _ => text.push_str(&format!("{id},n{id}\n")),
            }
        }
        std::fs::write(&path, &text).unwrap();
        let typed = Schema::new([("id", FieldType::Long), ("name", FieldType::String)]);
        for schema in [Schema::default(), typed] {
            let records = read(&path, FileFormat::Csv, &schema).unwrap();
            assert_eq!(records.len(), CSV_CHUNK_ROWS + 10);
            let bad: Vec<i64> = records
                .iter()
                .filter(|r| !r.headers.is_empty())
                .map(|r| r.position.offset)
                .collect();
            // The header is line 1 and the quoted row spans two lines.
            assert_eq!(bad, vec![CSV_CHUNK_ROWS as i64 + 7]);
            let quoted = &records[CSV_CHUNK_ROWS - 1];
            assert_eq!(quoted.position.offset, CSV_CHUNK_ROWS as i64 + 1);
            let value = String::from_utf8_lossy(quoted.value.as_deref().unwrap()).to_string();
            assert!(value.contains("a\\nb"), "{value}");
            let last = String::from_utf8_lossy(records.last().unwrap().value.as_deref().unwrap())
                .to_string();
            assert!(last.contains(&format!("{}", CSV_CHUNK_ROWS + 10)), "{last}");
        }
    }

    #[test]
    fn a_file_past_its_size_cap_is_a_configuration_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        // 4 MiB of one line, compressed to a few KiB: a small bomb.
        let mut data = b"{\"a\":\"".to_vec();
        data.extend(std::iter::repeat_n(b'x', 4 << 20));
        data.extend_from_slice(b"\"}\n");
        for (name, bytes, format) in [
            ("big.jsonl", data.clone(), FileFormat::JsonLines),
            ("big.jsonl.gz", gzip(&data), FileFormat::JsonLines),
            ("big.csv.zst", zstd(&data), FileFormat::Csv),
            ("big.parquet", data.clone(), FileFormat::Parquet),
            ("big.parquet.gz", gzip(&data), FileFormat::Parquet),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let mut out = Vec::new();
            let error = read_file(
                &path,
                format,
                &topic(),
                &Schema::default(),
                1 << 20,
                &mut out,
            )
            .unwrap_err()
            .to_string();
            assert!(
                error.contains("source.max_file_mb") && error.contains(name),
                "{name}: {error}"
            );
            // Under the cap the same file reads (or fails as what it is).
            let read = read_file(
                &path,
                format,
                &topic(),
                &Schema::default(),
                8 << 20,
                &mut out,
            );
            if let (FileFormat::JsonLines, Err(e)) = (format, read) {
                panic!("{name}: {e}");
            }
        }
    }

    #[test]
    fn json_lines_read_alike_plain_gzip_and_zstd() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"{\"a\":1}\n\n   \n{\"a\":2}\r\n{\"a\":3}";
        let expected = vec![
            (1, "{\"a\":1}".to_string()),
            (4, "{\"a\":2}\r".to_string()),
            (5, "{\"a\":3}".to_string()),
        ];
        for (name, bytes) in [
            ("a.jsonl", data.to_vec()),
            ("a.jsonl.gz", gzip(data)),
            ("a.jsonl.zst", zstd(data)),
        ] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let records = read(&path, FileFormat::JsonLines, &Schema::default()).unwrap();
            assert_eq!(lines(&records), expected, "{name}");
            assert!(records.iter().all(|r| r.position.topic.as_ref() == "in"));
        }
    }

    #[test]
    fn truncated_compressed_files_are_errors_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..2000)
            .flat_map(|i| format!("{{\"n\":{i}}}\n").into_bytes())
            .collect();
        for (name, bytes) in [("t.jsonl.gz", gzip(&data)), ("t.jsonl.zst", zstd(&data))] {
            let path = dir.path().join(name);
            std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
            for format in [FileFormat::JsonLines, FileFormat::Csv, FileFormat::Parquet] {
                let err = read(&path, format, &Schema::default()).unwrap_err();
                assert!(err.to_string().contains(name), "{name} {format:?}: {err}");
            }
        }
        let missing = dir.path().join("missing.jsonl");
        let err = read(&missing, FileFormat::JsonLines, &Schema::default()).unwrap_err();
        assert!(err.to_string().contains("missing.jsonl"), "{err}");
    }

    #[test]
    fn csv_rows_decode_by_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        std::fs::write(
            &path,
            "id,amount,ok,ts,n,note\r\n\
             a,1,true,2026-01-01T10:00:00Z,7,x\r\n\
             \n\
             b,2.5,false,1767261600000,,\"two\nlines, \"\"quoted\"\"\"\n\
             c,,,,,\n",
        )
        .unwrap();
        let schema = Schema::new([
            ("id", FieldType::String),
            ("amount", FieldType::Double),
            ("ok", FieldType::Boolean),
            ("ts", FieldType::Timestamp),
            ("n", FieldType::Long),
            ("note", FieldType::String),
        ]);
        let records = read(&path, FileFormat::Csv, &schema).unwrap();
        let numbers: Vec<i64> = records.iter().map(|r| r.position.offset).collect();
        assert_eq!(numbers, vec![2, 4, 6]);
        assert!(records.iter().all(|r| r.headers.is_empty()));
        let rows = decode(&schema, &records);
        let first = &rows[0];
        assert_eq!(first.get("id"), Some(&str("a")));
        assert_eq!(first.get("amount"), Some(&Value::Double(1.0)));
        assert_eq!(first.get("ok"), Some(&Value::Bool(true)));
        let ts = micros("2026-01-01T10:00:00Z");
        assert_eq!(first.get("ts"), Some(&Value::Timestamp(ts)));
        assert_eq!(first.get("n"), Some(&Value::Long(7)));
        let second = &rows[1];
        assert_eq!(second.get("amount"), Some(&Value::Double(2.5)));
        assert_eq!(second.get("ok"), Some(&Value::Bool(false)));
        // Epoch milliseconds, as for a JSON number.
        assert_eq!(second.get("ts"), Some(&Value::Timestamp(ts)));
        assert_eq!(second.get("n"), Some(&Value::Null));
        assert_eq!(second.get("note"), Some(&str("two\nlines, \"quoted\"")));
        assert!(["amount", "ok", "ts", "n", "note"]
            .iter()
            .all(|c| rows[2].get(c) == Some(&Value::Null)));
    }

    #[test]
    fn csv_without_a_schema_infers_numbers_and_keeps_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        std::fs::write(&path, "n,x,when\n1,1.5,2026-01-01\n2,abc,2026-01-02\n").unwrap();
        let records = read(&path, FileFormat::Csv, &Schema::default()).unwrap();
        let rows = decode(&Schema::default(), &records);
        assert_eq!(rows[0].get("n"), Some(&Value::Long(1)));
        assert_eq!(rows[0].get("x"), Some(&str("1.5")));
        assert_eq!(rows[1].get("when"), Some(&str("2026-01-02")));
    }

    #[test]
    fn bad_csv_lines_become_error_records_between_the_good_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        std::fs::write(&path, "n,s\n1,a\nabc,b\n3,c,extra\n4,d\n").unwrap();
        let schema = Schema::new([("n", FieldType::Long), ("s", FieldType::String)]);
        let records = read(&path, FileFormat::Csv, &schema).unwrap();
        let numbers: Vec<i64> = records.iter().map(|r| r.position.offset).collect();
        assert_eq!(numbers, vec![2, 3, 4, 5]);
        let reason = |r: &Record| {
            let (name, value) = &r.headers[0];
            assert_eq!(name, READ_ERROR_HEADER);
            String::from_utf8(value.clone()).unwrap()
        };
        let bad_value = reason(&records[1]);
        assert!(
            bad_value.contains("column `n`") && bad_value.contains("abc"),
            "{bad_value}"
        );
        assert!(!bad_value.contains("line"), "{bad_value}");
        assert_eq!(records[1].value.as_deref(), Some(&b"abc,b"[..]));
        let bad_count = reason(&records[2]);
        assert!(bad_count.contains("number of fields"), "{bad_count}");
        assert_eq!(records[2].value.as_deref(), Some(&b"3,c,extra"[..]));
        let good = [records[0].clone(), records[3].clone()];
        assert!(good.iter().all(|r| r.headers.is_empty()));
        let rows = decode(&schema, &good);
        assert_eq!(rows[0].get("n"), Some(&Value::Long(1)));
        assert_eq!(rows[1].get("s"), Some(&str("d")));
    }

    /// Collects what the engine dead-letters.
    struct Collected(Arc<std::sync::Mutex<Vec<String>>>);

    impl tidemark::runtime::DeadLetter for Collected {
        fn send(&mut self, record: &Record, error: &tidemark::Error) -> Result<()> {
            let mut sent = self.0.lock().unwrap_or_else(|e| e.into_inner());
            sent.push(format!("{} {error}", record.position.offset));
            Ok(())
        }
        fn flush(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_window_over_csv_counts_the_good_lines_and_dead_letters_the_bad_ones() {
        use tidemark::operators::AggregateSpec;
        use tidemark::runtime::testing::{CollectSink, VecSource};
        use tidemark::runtime::{Query, Trigger};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        let lines = "t,s\n2026-01-01T10:00:01Z,a\nsoon,b\n2026-01-01T10:00:02Z,a,extra\n\
                     2026-01-01T10:00:03Z,a\n2026-01-01T10:00:04Z,b\n";
        std::fs::write(&path, lines).unwrap();
        let schema = Schema::new([("t", FieldType::Timestamp), ("s", FieldType::String)]);
        let records = read(&path, FileFormat::Csv, &schema).unwrap();
        let dead = Arc::new(std::sync::Mutex::new(Vec::new()));
        // The window reads columns: lines read take the columnar route,
        // lines the reader refused the row route to their error.
        let query = Query::builder("csv-window")
            .event_time("t")
            .window_aggregate(
                ["s"],
                tidemark::window::WindowSpec::tumbling("1 minute").unwrap(),
                vec![AggregateSpec::count()],
            )
            .output_mode(tidemark::operators::OutputMode::Update)
            .decoder(crate::FileReadErrors(JsonDecoder::new(schema)))
            .dead_letter(Collected(dead.clone()))
            .trigger(Trigger::AvailableNow)
            .build()
            .unwrap();
        let mut sink = CollectSink::default();
        query
            .run(&mut VecSource::record_batches(vec![records]), &mut sink)
            .unwrap();
        let counts: Vec<(String, Option<&Value>)> = sink
            .rows
            .iter()
            .map(|r| (r.get("s").unwrap().to_string(), r.get("count")))
            .collect();
        let (one, two) = (Value::Long(1), Value::Long(2));
        assert_eq!(
            counts,
            vec![("a".into(), Some(&two)), ("b".into(), Some(&one))]
        );
        let dead = dead.lock().unwrap();
        assert_eq!(dead.len(), 2, "{dead:?}");
        // A bad field found decoding into columns; a line the reader refused.
        assert!(
            dead[0].starts_with("3 ")
                && dead[0].contains("field `t`")
                && dead[0].contains("`soon`"),
            "{dead:?}"
        );
        assert!(
            dead[1].starts_with("4 ")
                && dead[1].contains("field `<line>`")
                && dead[1].contains("number of fields"),
            "{dead:?}"
        );
    }

    #[test]
    fn compressed_csv_reads_like_plain() {
        let dir = tempfile::tempdir().unwrap();
        let data = b"n,s\n1,a\n\n2,b\n";
        let schema = Schema::new([("n", FieldType::Long), ("s", FieldType::String)]);
        let plain = dir.path().join("a.csv");
        std::fs::write(&plain, data).unwrap();
        let expected = lines(&read(&plain, FileFormat::Csv, &schema).unwrap());
        assert_eq!(expected.len(), 2);
        for (name, bytes) in [("a.csv.gz", gzip(data)), ("a.csv.zst", zstd(data))] {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).unwrap();
            let records = read(&path, FileFormat::Csv, &schema).unwrap();
            assert_eq!(lines(&records), expected, "{name}");
        }
    }

    #[test]
    fn csv_lines_follow_quoted_newlines() {
        let data = b"a,b\n\n1,\"x\ny\"\n2,y\"z\n  \n3,\"\"\"\"\n";
        let mut lines = CsvLines::new(&data[..]);
        let mut found: Vec<(i64, Vec<u8>)> = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            found.push((line.number, line.bytes));
        }
        let found: Vec<(i64, &[u8])> = found.iter().map(|(n, b)| (*n, b.as_slice())).collect();
        let expected: Vec<(i64, &[u8])> = vec![
            (1, b"a,b"),
            (3, b"1,\"x\ny\""),
            (5, b"2,y\"z"),
            (7, b"3,\"\"\"\""),
        ];
        assert_eq!(found, expected);
    }

    fn parquet_file(path: &Path) {
        let schema = Arc::new(ArrowSchema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, None),
                true,
            ),
            Field::new(
                "ts_utc",
                DataType::Timestamp(arrow_schema::TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
        ]));
        let ts = micros("2026-01-01T10:00:00.123456Z");
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None, Some(3)])),
                Arc::new(StringArray::from(vec![Some("a"), Some("b"), None])),
                Arc::new(TimestampMicrosecondArray::from(vec![
                    Some(ts),
                    None,
                    Some(0),
                ])),
                Arc::new(
                    TimestampMicrosecondArray::from(vec![Some(ts), Some(ts + 1), None])
                        .with_timezone("UTC"),
                ),
            ],
        )
        .unwrap();
        let file = File::create(path).unwrap();
        let mut writer = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
        writer.write(&batch).unwrap();
        writer.close().unwrap();
    }

    #[test]
    fn parquet_rows_decode_to_the_written_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.parquet");
        parquet_file(&path);
        let schema = Schema::new([
            ("id", FieldType::Long),
            ("name", FieldType::String),
            ("ts", FieldType::Timestamp),
            ("ts_utc", FieldType::Timestamp),
        ]);
        let records = read(&path, FileFormat::Parquet, &schema).unwrap();
        let numbers: Vec<i64> = records.iter().map(|r| r.position.offset).collect();
        assert_eq!(numbers, vec![1, 2, 3]);
        let rows = decode(&schema, &records);
        let ts = micros("2026-01-01T10:00:00.123456Z");
        let column = |name: &str| -> Vec<Value> {
            rows.iter().map(|r| r.get(name).unwrap().clone()).collect()
        };
        assert_eq!(
            column("id"),
            vec![Value::Long(1), Value::Null, Value::Long(3)]
        );
        assert_eq!(column("name"), vec![str("a"), str("b"), Value::Null]);
        assert_eq!(
            column("ts"),
            vec![Value::Timestamp(ts), Value::Null, Value::Timestamp(0)]
        );
        assert_eq!(
            column("ts_utc"),
            vec![Value::Timestamp(ts), Value::Timestamp(ts + 1), Value::Null]
        );
        // Compressed as a whole, it reads the same.
        let zst = dir.path().join("a.parquet.zst");
        std::fs::write(&zst, zstd(&std::fs::read(&path).unwrap())).unwrap();
        let again = read(&zst, FileFormat::Parquet, &schema).unwrap();
        assert_eq!(lines(&again), lines(&records));
    }

    /// The reader's own error travels as the error's source: a caller
    /// (or a log that prints the chain) sees Parquet's error as Parquet's.
    #[test]
    fn a_corrupt_parquet_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.parquet");
        parquet_file(&path);
        let bytes = std::fs::read(&path).unwrap();
        for broken in [
            &bytes[..bytes.len() / 2],
            &b"not parquet at all"[..],
            &[][..],
        ] {
            std::fs::write(&path, broken).unwrap();
            let err = read(&path, FileFormat::Parquet, &Schema::default()).unwrap_err();
            assert!(err.to_string().contains("bad.parquet"), "{err}");
            let source = std::error::Error::source(&err).expect("the reader's error is kept");
            assert!(source.is::<parquet::errors::ParquetError>(), "{source:?}");
        }
    }
}
