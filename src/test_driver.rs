//! The way to unit-test a pipeline, as Kafka Streams' `TopologyTestDriver`
//! does: no broker, no files, no wall clock. Feed records batch by batch,
//! each batch at a processing time of your choosing (a virtual clock), run
//! the query as `tidemark run` would, then read what each batch wrote, the
//! rows dropped as late, the dead letters and every progress report.
//!
//! ```
//! use tidemark::test_driver::PipelineTestDriver;
//!
//! let run = PipelineTestDriver::for_pipeline(r#"
//! name: counts
//! source: {kind: kafka, topic: events, schema: {t: timestamp, id: string}}
//! event_time: t
//! watermark: 10 minutes
//! steps:
//!   - window_aggregate: {keys: [id], window: {tumbling: 5 minutes}, aggregates: [{fn: count, as: n}]}
//! output_mode: append
//! sink: {kind: stdout}
//! late_data: {kind: stdout}
//! "#)
//! .unwrap()
//! .batch_at("2026-01-01T11:00:00Z")
//! .pipe("events", r#"{"t": "2026-01-01T10:01:00Z", "id": "a"}"#)
//! .pipe("events", r#"{"t": "2026-01-01T10:20:00Z", "id": "a"}"#)
//! .batch_at("2026-01-01T11:01:00Z")
//! .pipe("events", r#"{"t": "2026-01-01T10:02:00Z", "id": "a"}"#) // judged by batch 0's: none
//! .pipe("events", "not json")                                    // a dead letter
//! .batch_at("2026-01-01T11:02:00Z")
//! .pipe("events", r#"{"t": "2026-01-01T10:03:00Z", "id": "a"}"#) // behind 10:10: late
//! .run()
//! .unwrap();
//! // Batch 0 moved the watermark to 10:10; in batch 1 it closed 10:00-10:05.
//! assert_eq!(run.output_json(), [serde_json::json!(
//!     {"batch_id": 1, "id": "a", "window_start": "2026-01-01T10:00:00Z",
//!      "window_end": "2026-01-01T10:05:00Z", "n": 2})]);
//! assert_eq!(run.late_rows[0].0, 2);
//! assert!(run.dead_letters[0].1.contains("events/0@3"), "{}", run.dead_letters[0].1);
//! assert_eq!(run.progress[2].num_input_rows, 1);
//! ```

use crate::error::{Error, Result};
use crate::pipeline::PipelineFile;
use crate::progress::QueryProgress;
use crate::record::{Record, SourcePosition};
use crate::row::Row;
use crate::runtime::testing::{CollectSink, VecSource};
use crate::runtime::{Clock, DeadLetter, QueryBuilder, RunSummary, Sink, Trigger};
use crate::time::TimestampMicros;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Feeds a query batch by batch on a virtual clock (see the module).
pub struct PipelineTestDriver {
    query: QueryBuilder,
    batches: Vec<Vec<Record>>,
    times: Vec<TimestampMicros>,
    next_offset: BTreeMap<(String, i32), i64>,
}

/// What a [`PipelineTestDriver`] run wrote.
#[derive(Debug, Default)]
pub struct TestRun {
    /// The sink's rows with the batch that wrote each, in write order.
    pub output: Vec<(u64, Row)>,
    /// Rows dropped as late, with their batch.
    pub late_rows: Vec<(u64, Row)>,
    /// Records sent to the dead-letter output, with the error naming the
    /// record (topic/partition/offset), the field and the reason.
    pub dead_letters: Vec<(Record, String)>,
    /// One progress report per batch, as `tidemark run --progress` prints.
    pub progress: Vec<QueryProgress>,
    /// Batches, records and rows counted by the run.
    pub summary: RunSummary,
}

impl TestRun {
    /// The rows batch `batch_id` wrote.
    pub fn output_of(&self, batch_id: u64) -> Vec<&Row> {
        self.output
            .iter()
            .filter(|(b, _)| *b == batch_id)
            .map(|(_, row)| row)
            .collect()
    }

    /// Every output row as JSON with its `batch_id` first, as the JSON-lines
    /// sink writes it.
    pub fn output_json(&self) -> Vec<serde_json::Value> {
        with_batch_ids(&self.output)
    }

    /// Every late row as JSON with its `batch_id` first, as the JSON-lines
    /// late-data sink writes it.
    pub fn late_json(&self) -> Vec<serde_json::Value> {
        with_batch_ids(&self.late_rows)
    }
}

/// `rows` as JSON objects, each with its `batch_id` first.
fn with_batch_ids(rows: &[(u64, Row)]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|(batch_id, row)| {
            let mut object = serde_json::Map::new();
            object.insert("batch_id".into(), (*batch_id).into());
            if let serde_json::Value::Object(columns) = row.to_json() {
                object.extend(columns);
            }
            serde_json::Value::Object(object)
        })
        .collect()
}

impl PipelineTestDriver {
    /// A driver for the query `query` builds (its trigger and clock are the
    /// driver's: available-now over the batches fed, at their times).
    pub fn new(query: QueryBuilder) -> Self {
        PipelineTestDriver {
            query,
            batches: Vec::new(),
            times: Vec::new(),
            next_offset: BTreeMap::new(),
        }
    }

    /// A driver for the pipeline file `text`: its steps, watermarks and
    /// output mode; records decoded by its schemas (a joined or unioned
    /// stream's by its own, by topic). Its source and sink are the
    /// driver's.
    pub fn for_pipeline(text: &str) -> Result<Self> {
        let file =
            PipelineFile::parse(text).map_err(|e| Error::config("pipeline", e.to_string()))?;
        let mut decoder = crate::decode::ByTopicDecoder::new(Box::new(
            crate::decode::JsonDecoder::new(file.schema()),
        ));
        for joined in file.joined_inputs() {
            for topic in &joined.topics.0 {
                let schema = joined.schema.0.clone();
                decoder = decoder.topic(topic, Box::new(crate::decode::JsonDecoder::new(schema)));
            }
        }
        Ok(Self::new(file.query_builder()?.decoder(decoder)))
    }

    /// Opens the next batch, run at processing time `time` (RFC 3339). A
    /// batch fed nothing is left out: the no-data batches a moved
    /// watermark owes run by themselves, as in Spark, at the last time
    /// given.
    pub fn batch_at(mut self, time: &str) -> Self {
        // A bad time in a test is the test's own mistake: said at once.
        let at = crate::time::parse_rfc3339(time)
            .unwrap_or_else(|| panic!("batch_at: `{time}` is not an RFC 3339 time"));
        self.times.push(at);
        self.batches.push(Vec::new());
        self
    }

    /// Adds a record of `topic` (partition 0) whose value is `value` to
    /// the open batch (opening one at the epoch if none is).
    pub fn pipe(self, topic: &str, value: &str) -> Self {
        self.pipe_to(topic, 0, None, value)
    }

    /// Adds a record of `topic` and `partition`, with record key `key`, to
    /// the open batch: each partition is its own task and watermark input.
    pub fn pipe_to(mut self, topic: &str, partition: i32, key: Option<&str>, value: &str) -> Self {
        if self.batches.is_empty() {
            self = self.batch_at("1970-01-01T00:00:00Z");
        }
        let offset = self
            .next_offset
            .entry((topic.to_string(), partition))
            .or_insert(0);
        let record = Record {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            position: SourcePosition::new(topic, partition, *offset),
            ..Default::default()
        };
        *offset += 1;
        if let Some(batch) = self.batches.last_mut() {
            batch.push(record);
        }
        self
    }

    /// Runs the query over every batch fed (and the no-data batches its
    /// watermark then owes, as Spark runs them) and returns what it wrote.
    pub fn run(self) -> Result<TestRun> {
        // Batch ids follow the batches fed with records.
        let (batches, times): (Vec<Vec<Record>>, Vec<TimestampMicros>) = self
            .batches
            .into_iter()
            .zip(self.times)
            .filter(|(records, _)| !records.is_empty())
            .unzip();
        let late = Arc::new(Mutex::new(CollectSink::default()));
        let dead_letters = Arc::new(Mutex::new(Vec::new()));
        let progress = Arc::new(Mutex::new(Vec::new()));
        let seen = progress.clone();
        let query = self
            .query
            .trigger(Trigger::AvailableNow)
            .clock(Clock::Virtual(times))
            .late_data(SharedSink(late.clone()))
            .dead_letter(SharedDeadLetter(dead_letters.clone()))
            .on_progress(move |p: &QueryProgress| {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(p.clone())
            })
            .build()?;
        let mut source = VecSource::record_batches(batches);
        let mut sink = CollectSink::default();
        let summary = query.run(&mut source, &mut sink)?;
        let late = std::mem::take(&mut *late.lock().unwrap_or_else(|e| e.into_inner()));
        let dead_letters =
            std::mem::take(&mut *dead_letters.lock().unwrap_or_else(|e| e.into_inner()));
        let progress = std::mem::take(&mut *progress.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(TestRun {
            output: sink.batch_ids.into_iter().zip(sink.rows).collect(),
            late_rows: late.batch_ids.into_iter().zip(late.rows).collect(),
            dead_letters,
            progress,
            summary,
        })
    }
}

/// A sink the driver reads after the run.
struct SharedSink(Arc<Mutex<CollectSink>>);

impl Sink for SharedSink {
    fn describe(&self) -> String {
        "TestDriverLateRows".into()
    }
    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write(batch_id, rows)
    }
    fn commit(&mut self, batch_id: u64) -> Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .commit(batch_id)
    }
}

/// A dead-letter output the driver reads after the run.
struct SharedDeadLetter(Arc<Mutex<Vec<(Record, String)>>>);

impl DeadLetter for SharedDeadLetter {
    fn send(&mut self, record: &Record, error: &Error) -> Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((record.clone(), error.to_string()));
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}
