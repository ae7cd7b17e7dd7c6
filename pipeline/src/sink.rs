//! The `sink:` and `dead_letter:` sections and the processing guarantee.

use crate::{DurationSpec, Format, SubjectNameStrategySpec};
use serde::Deserialize;
use std::collections::BTreeMap;
use tidemark::secrets::Properties;

/// Which sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// A JSON-lines file: `batch_id`, then the row's columns.
    Jsonl,
    /// A Kafka topic.
    Kafka,
    /// Standard output, one JSON object per line.
    Stdout,
    /// A Delta Lake table (local path or object-store URL).
    Delta,
}

/// How a Delta sink writes update-mode output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeltaMode {
    /// Every emitted row appended, with its `batch_id`.
    #[default]
    Changes,
    /// A latest-value table: one row per key, replaced as it changes.
    Upsert,
}

/// The `sink:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkSpec {
    /// `jsonl`, `kafka` or `stdout`.
    pub kind: SinkKind,
    /// jsonl: the file.
    #[serde(default)]
    pub path: Option<String>,
    /// kafka: the topic.
    #[serde(default)]
    pub topic: Option<String>,
    /// kafka: bootstrap servers (default as the source).
    #[serde(default)]
    pub bootstrap: Option<String>,
    /// kafka: `json` (default) or `avro`.
    #[serde(default)]
    pub format: Format,
    /// kafka: columns whose values form the record key.
    #[serde(default)]
    pub key: Vec<String>,
    /// kafka avro: the schema file and the id to write in the wire header.
    #[serde(default)]
    pub avro_schema: Option<String>,
    /// kafka avro: the schema id written in the Confluent header (without
    /// a `schema_registry`; with one the sink registers its schema and
    /// writes the id the registry gives).
    #[serde(default)]
    pub avro_schema_id: Option<u32>,
    /// kafka avro with a `schema_registry`: the subject the schema is
    /// registered under: `topic` (`<topic>-value`, the default), `record`
    /// or `topic_record`.
    #[serde(default)]
    pub subject_name_strategy: SubjectNameStrategySpec,
    /// librdkafka properties for this client only, over `kafka.properties`.
    #[serde(default)]
    pub properties: Properties,
    /// delta, output mode update: `changes` (default) or `upsert` (keyed
    /// by `key`, default the grouping columns).
    #[serde(default)]
    pub mode: Option<DeltaMode>,
    /// delta: partition columns of a table created by the sink.
    #[serde(default)]
    pub partition_by: Vec<String>,
    /// delta: table properties of a table created by the sink.
    #[serde(default)]
    pub table_properties: BTreeMap<String, String>,
    /// delta: object-store options (credentials, region, endpoint).
    #[serde(default)]
    pub storage_options: Properties,
    /// delta: add new nullable columns instead of refusing them.
    #[serde(default)]
    pub merge_schema: bool,
    /// delta, real-time trigger: commit this often (default 1 second).
    #[serde(default)]
    pub commit_interval: Option<DurationSpec>,
    /// delta: a Delta checkpoint every this many commits (default 10).
    #[serde(default)]
    pub checkpoint_interval: Option<u64>,
    /// delta: compact once this many small files exist (default: never).
    #[serde(default)]
    pub compact_min_files: Option<usize>,
}

impl SinkSpec {
    /// A sink of this kind with every other key at its default (as a
    /// file's `sink: {kind: ...}` reads).
    pub fn new(kind: SinkKind) -> SinkSpec {
        SinkSpec {
            kind,
            path: None,
            topic: None,
            bootstrap: None,
            format: Format::default(),
            key: Vec::new(),
            avro_schema: None,
            avro_schema_id: None,
            subject_name_strategy: SubjectNameStrategySpec::default(),
            properties: Properties::default(),
            mode: None,
            partition_by: Vec::new(),
            table_properties: BTreeMap::new(),
            storage_options: Properties::default(),
            merge_schema: false,
            commit_interval: None,
            checkpoint_interval: None,
            compact_min_files: None,
        }
    }
}

/// Where bad records go.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetterSpec {
    /// `kafka` or `file`.
    pub kind: DeadLetterKind,
    /// kafka: the topic.
    #[serde(default)]
    pub topic: Option<String>,
    /// file: the JSON-lines file.
    #[serde(default)]
    pub path: Option<String>,
    /// kafka: librdkafka properties of the dead-letter producer, over
    /// `kafka.properties` (under exactly_once dead letters go out in the
    /// query's transaction, whose producer these cannot reach).
    #[serde(default)]
    pub properties: Properties,
}

/// Dead-letter output kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeadLetterKind {
    /// A Kafka topic; error and position in headers.
    Kafka,
    /// A JSON-lines file.
    File,
}

/// Delivery guarantee of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessingGuarantee {
    /// Offsets commit after the output is acknowledged: a failure may
    /// repeat a batch's output, never lose it.
    #[default]
    AtLeastOnce,
    /// Output records, changelog records and offsets commit in one Kafka
    /// transaction: read_committed consumers see each batch exactly once.
    ExactlyOnce,
}
