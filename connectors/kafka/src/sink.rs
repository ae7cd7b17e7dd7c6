//! The Kafka sink: an idempotent producer; `commit` waits until every record
//! of the batch is acknowledged.

use crate::connection::KafkaConnection;
use arrow_array::RecordBatch;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, ThreadedProducer};
use std::collections::BTreeMap;
use std::time::Duration;
use tidemark::columns::{resolve_all, row_at, Column};
use tidemark::columns_json::JsonRowWriter;
use tidemark::error::{Error, Result};
use tidemark::row::{Row, Value};
use tidemark::runtime::{BatchOutput, OutputPart, Sink, WatermarkMarker, WATERMARK_MARKER_HEADER};
use tidemark::time::TimestampMicros;
use tidemark_avro::AvroEncoder;

use crate::batch_produce::{BatchTopic, EncodedRecords};
use crate::producer::{flush_producer, producer, send_with_backpressure, DeliveryTracker};
use crate::sink_progress::SinkProgress;

/// How the sink encodes row values.
pub enum ValueFormat {
    /// A JSON object of the row's columns.
    Json,
    /// Avro in the Confluent wire format.
    Avro(AvroEncoder),
}

impl ValueFormat {
    /// Appends `row`'s encoded value to `out`.
    fn encode_into(&self, row: &Row, out: &mut Vec<u8>) -> Result<()> {
        match self {
            ValueFormat::Json => serde_json::to_writer(out, row)
                .map_err(|e| Error::sink_failed("encoding a row as JSON", e)),
            ValueFormat::Avro(encoder) => encoder.encode_into(row, out),
        }
    }
}

/// Rows encoded and enqueued per call to librdkafka outside a transaction:
/// enough to share its per-call costs, few enough to stay in cache.
const PRODUCE_CHUNK: usize = 1024;

/// Columns whose values form the record key (empty: no key).
#[derive(Debug, Clone, Default)]
pub struct KeyColumns(pub Vec<String>);

impl KeyColumns {
    fn key(&self, row: &Row) -> Option<String> {
        match self.0.as_slice() {
            [] => None,
            [one] => Some(row.get(one).map(Value::to_string).unwrap_or_default()),
            many => Some(
                serde_json::Value::Array(
                    many.iter()
                        .map(|c| row.get(c).map(Value::to_json).unwrap_or_default())
                        .collect(),
                )
                .to_string(),
            ),
        }
    }
}

/// The key columns of one columnar batch, resolved once: the keys
/// [`KeyColumns::key`] gives for the rows the batch makes.
struct ColumnKeys<'a> {
    /// Each key column; `None` when the batch has none of that name (a
    /// row without the column, whose key part is empty or JSON null).
    columns: Vec<Option<Column<'a>>>,
}

impl<'a> ColumnKeys<'a> {
    fn new(key: &KeyColumns, batch: &'a RecordBatch) -> Result<Self> {
        let columns = key
            .0
            .iter()
            .map(|name| match batch.schema_ref().index_of(name) {
                Ok(at) => Column::of(name, batch.column(at).as_ref()).map(Some),
                Err(_) => Ok(None),
            })
            .collect::<Result<_>>()?;
        Ok(ColumnKeys { columns })
    }

    fn key(&self, i: usize) -> Option<String> {
        match self.columns.as_slice() {
            [] => None,
            [one] => Some(one.map(|c| c.value(i).to_string()).unwrap_or_default()),
            many => Some(
                serde_json::Value::Array(
                    many.iter()
                        .map(|c| c.map(|c| c.value(i).to_json()).unwrap_or_default())
                        .collect(),
                )
                .to_string(),
            ),
        }
    }
}

/// Writes rows to a Kafka topic.
pub struct KafkaSink {
    topic: String,
    /// Enqueues outside a transaction. Declared before the producer, so it
    /// is dropped first, as librdkafka requires.
    batch_topic: BatchTopic,
    producer: ThreadedProducer<DeliveryTracker>,
    tracker: DeliveryTracker,
    key: KeyColumns,
    format: ValueFormat,
    transactions: Option<super::SharedTransactions>,
    markers: Option<MarkerState>,
    /// Set when the sink commits its transaction itself (the source has
    /// none): the batch's progress record goes in it.
    progress: Option<SinkProgress>,
    /// The last batch the progress record holds: a replay of it (or of an
    /// earlier one) writes nothing.
    recovered: Option<u64>,
}

/// Encodes and sends `n` records to `topic`, record `i`'s key and value
/// given by `key_of` and `encode`: one by one inside `transactions`,
/// otherwise enqueued [`PRODUCE_CHUNK`] at a time through `batch_topic`.
fn produce(
    topic: &str,
    transactions: Option<&super::SharedTransactions>,
    batch_topic: &mut BatchTopic,
    n: usize,
    key_of: impl Fn(usize) -> Option<String>,
    encode: impl Fn(usize, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    if let Some(transactions) = transactions {
        let mut value = Vec::with_capacity(256);
        for i in 0..n {
            value.clear();
            encode(i, &mut value)?;
            let key = key_of(i);
            let mut record = BaseRecord::<String, Vec<u8>>::to(topic).payload(&value);
            if let Some(k) = key.as_ref() {
                record = record.key(k);
            }
            transactions.send(record)?;
        }
        return Ok(());
    }
    let mut encoded = EncodedRecords::default();
    for start in (0..n).step_by(PRODUCE_CHUNK) {
        encoded.clear();
        for i in start..n.min(start + PRODUCE_CHUNK) {
            let key = key_of(i);
            encoded.push(key.as_deref().map(str::as_bytes), |out| encode(i, out))?;
        }
        batch_topic.produce(&encoded.records())?;
    }
    Ok(())
}

/// What a repartition sink needs to broadcast watermark markers.
struct MarkerState {
    origins: Vec<String>,
    partitions: i32,
    max_event_time: BTreeMap<String, TimestampMicros>,
    changed: Vec<String>,
}

impl KafkaSink {
    fn write_rows(&mut self, rows: &[Row]) -> Result<()> {
        let (key, format) = (&self.key, &self.format);
        produce(
            &self.topic,
            self.transactions.as_ref(),
            &mut self.batch_topic,
            rows.len(),
            |i| key.key(&rows[i]),
            |i, out| format.encode_into(&rows[i], out),
        )
    }

    /// Writes a columnar batch straight from its columns, the bytes its
    /// rows would give: JSON objects, or Avro datums (a row is made only
    /// for one apache-avro has to write).
    fn write_columns(&mut self, batch: &RecordBatch) -> Result<()> {
        let keys = ColumnKeys::new(&self.key, batch)?;
        let (topic, transactions) = (&self.topic, self.transactions.as_ref());
        let n = batch.num_rows();
        match &self.format {
            ValueFormat::Json => {
                let writer = JsonRowWriter::new(batch)?;
                produce(
                    topic,
                    transactions,
                    &mut self.batch_topic,
                    n,
                    |i| keys.key(i),
                    |i, out| {
                        writer.write_row(i, out);
                        Ok(())
                    },
                )
            }
            ValueFormat::Avro(encoder) => {
                let fields = encoder
                    .field_names()
                    .into_iter()
                    .map(|name| Ok((name, Column::resolve(batch, name)?)))
                    .collect::<Result<Vec<_>>>()?;
                let whole = resolve_all(batch)?;
                let value_at = |i: usize, name: &str| {
                    fields
                        .iter()
                        .find(|(n, _)| *n == name)
                        .map_or(Value::Null, |(_, column)| column.value(i))
                };
                produce(
                    topic,
                    transactions,
                    &mut self.batch_topic,
                    n,
                    |i| keys.key(i),
                    |i, out| {
                        encoder.encode_fields_into(
                            |name| value_at(i, name),
                            || row_at(&whole, i),
                            out,
                        )
                    },
                )
            }
        }
    }

    /// Sends inside `transactions` (exactly-once): records become visible
    /// when the source commits the batch's transaction with its offsets.
    pub fn with_transactions(mut self, transactions: super::SharedTransactions) -> Self {
        self.transactions = Some(transactions);
        self
    }

    /// Commits the batch's transaction itself, with a record of the batch
    /// in it (consumer group `group`'s offset on the output topic), for a
    /// source that cannot commit inside the transaction (files): a batch
    /// replayed after a crash is recognised from it (see
    /// [`Sink::recovered_batch`]). Needs [`KafkaSink::with_transactions`].
    pub fn with_batch_progress(mut self, cluster: &KafkaConnection, group: &str) -> Result<Self> {
        self.progress = Some(SinkProgress::new(cluster, &self.topic, group)?);
        Ok(self)
    }

    /// Makes this the writing side of a repartition topic with `partitions`
    /// partitions: at each commit, every input in `origins` whose progress
    /// grew in the batch ([`Sink::event_time_progress`]: its own, or under
    /// the query scope its stream's as far as its writer counts it) gets a
    /// [`WatermarkMarker`] in every partition.
    pub fn with_watermark_markers(mut self, origins: Vec<String>, partitions: i32) -> Self {
        self.markers = Some(MarkerState {
            origins,
            partitions,
            max_event_time: BTreeMap::new(),
            changed: Vec::new(),
        });
        self
    }

    /// Whether the progress record holds `batch_id` already.
    fn already_out(&self, batch_id: u64) -> bool {
        self.recovered.is_some_and(|r| batch_id <= r)
    }

    fn send(&self, record: BaseRecord<'_, String, Vec<u8>>) -> Result<()> {
        match &self.transactions {
            Some(t) => t.send(record),
            None => send_with_backpressure(&self.producer, record)
                .map_err(|e| Error::sink_failed(format!("producing to `{}`", self.topic), e)),
        }
    }

    fn send_markers(&mut self) -> Result<()> {
        let Some(markers) = self.markers.as_mut() else {
            return Ok(());
        };
        let changed = std::mem::take(&mut markers.changed);
        let mut payloads = Vec::with_capacity(changed.len());
        for origin in changed {
            let marker = WatermarkMarker {
                max_event_time: markers.max_event_time[&origin],
                origin,
                origins: markers.origins.clone(),
            };
            payloads.push(marker.encode());
        }
        let partitions = markers.partitions;
        for payload in &payloads {
            for partition in 0..partitions {
                let headers = OwnedHeaders::new().insert(Header {
                    key: WATERMARK_MARKER_HEADER,
                    value: Some("1"),
                });
                self.send(
                    BaseRecord::to(&self.topic)
                        .partition(partition)
                        .payload(payload)
                        .headers(headers),
                )?;
            }
        }
        Ok(())
    }

    /// A sink to `topic` on `cluster` (with the sink producer's own
    /// properties on it: see [`KafkaConnection::with_overrides`]).
    pub fn new(
        cluster: &KafkaConnection,
        topic: &str,
        key: KeyColumns,
        format: ValueFormat,
    ) -> Result<Self> {
        let (producer, tracker) = producer(cluster, "sink producer")?;
        Ok(KafkaSink {
            topic: topic.to_string(),
            batch_topic: BatchTopic::new(&producer, topic)?,
            producer,
            tracker,
            key,
            format,
            transactions: None,
            markers: None,
            progress: None,
            recovered: None,
        })
    }
}

impl Sink for KafkaSink {
    fn describe(&self) -> String {
        format!("KafkaSink[{}]", self.topic)
    }

    fn write(&mut self, batch_id: u64, rows: &[Row]) -> Result<()> {
        if self.already_out(batch_id) {
            return Ok(());
        }
        self.write_rows(rows)
    }

    fn write_output(&mut self, batch_id: u64, output: &BatchOutput<'_>) -> Result<()> {
        if self.already_out(batch_id) {
            return Ok(());
        }
        if output.columns.is_empty() {
            // One loop over all rows: runs of tasks need no call apiece.
            return self.write_rows(output.rows);
        }
        for part in output.parts() {
            match part {
                OutputPart::Rows { rows, .. } => self.write_rows(rows)?,
                OutputPart::Columns { batch, .. } => self.write_columns(batch)?,
            }
        }
        Ok(())
    }

    fn source_offsets(&mut self, offsets: &tidemark::runtime::SourceOffsets) {
        if let Some(progress) = self.progress.as_mut() {
            progress.set_end(offsets);
        }
    }

    fn recovered_batch(&mut self) -> Result<Option<(u64, tidemark::runtime::SourceOffsets)>> {
        match &self.progress {
            Some(progress) => {
                let last = progress.last_batch()?;
                self.recovered = last.as_ref().map(|(batch_id, _)| *batch_id);
                Ok(last)
            }
            None => Ok(None),
        }
    }

    fn abort(&mut self, _batch_id: u64) {
        if let (Some(t), Some(_)) = (&self.transactions, &self.progress) {
            if let Err(error) = t.abort() {
                tracing::warn!(%error, "aborting the sink's transaction");
            }
        }
    }

    fn event_time_progress(&mut self, max_event_time: &BTreeMap<String, TimestampMicros>) {
        if let Some(markers) = self.markers.as_mut() {
            for (origin, t) in max_event_time {
                let slot = markers.max_event_time.entry(origin.clone()).or_insert(*t);
                *slot = (*slot).max(*t);
                markers.changed.push(origin.clone());
            }
        }
    }

    fn commit(&mut self, batch_id: u64) -> Result<()> {
        if self.already_out(batch_id) {
            tracing::info!(batch_id, topic = %self.topic, "batch already committed to the topic; its replay writes nothing");
            // Whatever the replay sent into the transaction (its dead
            // letters) went out with the first run.
            return self.transactions.as_ref().map_or(Ok(()), |t| t.abort());
        }
        self.send_markers()?;
        match (&self.transactions, &self.progress) {
            (Some(t), Some(progress)) => {
                let (offsets, group) = progress.offsets_for(batch_id)?;
                return t.commit(&offsets, group);
            }
            // The source commits the transaction with its offsets; an
            // empty batch still opens one so that its offsets commit.
            (Some(t), None) => return t.begin(),
            (None, _) => {}
        }
        flush_producer(&self.producer, Duration::from_secs(60)).map_err(|e| {
            Error::sink_failed(format!("batch {batch_id}: flushing `{}`", self.topic), e)
        })?;
        let failures = self.tracker.take_failures();
        if let Some(permanent) = crate::producer::permanent_failure(&failures) {
            return Err(permanent);
        }
        if let Some(first) = failures.first() {
            return Err(Error::Sink(format!(
                "batch {batch_id}: {} record(s) to `{}` not acknowledged: {first}",
                failures.len(),
                self.topic
            )));
        }
        Ok(())
    }
}
