//! The pipeline file: a YAML description of a query that the `tidemark` CLI
//! runs without any Rust. See `docs/pipeline-file.md` for every key.
//!
//! Values are checked while the file is read, so an error names the line and
//! column of the offending key together with what is allowed.

mod describe;

use crate::aggregate::AggregateFn;
use crate::duration::parse_duration;
use crate::error::{Error, Result};
use crate::operators::{AggregateInput, AggregateSpec, OutputMode};
use crate::runtime::{Clock, QueryBuilder, Topology, Trigger};
use crate::schema::{FieldType, Schema};
use crate::secrets::Properties;
use crate::watermark::WatermarkPolicy;
use crate::window::WindowSpec;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A whole pipeline file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineFile {
    /// The query's name, also spelled `application_id` as in Kafka
    /// Streams: consumer group default, changelog and repartition topic
    /// prefix, transactional id prefix, state directory.
    #[serde(alias = "application_id")]
    pub name: String,
    /// How every Kafka client of the query connects — the source's
    /// consumer, the transactional producer, changelog, standby, restore,
    /// dead-letter, table-feed, repartition and admin clients: bootstrap
    /// servers and librdkafka properties (security, timeouts).
    /// `source.properties`, `sink.properties` and `dead_letter.properties`
    /// add to it for their own client only.
    #[serde(default)]
    pub kafka: Option<KafkaSpec>,
    /// A Confluent-compatible schema registry (a URL, or `{url,
    /// properties}`): the Avro source fetches writer schemas from it by
    /// id; an Avro Kafka sink registers its schema there and writes the id
    /// it gets back.
    #[serde(default)]
    pub schema_registry: Option<RegistrySpec>,
    /// Where records come from.
    pub source: SourceSpec,
    /// Optional virtual processing time per batch.
    #[serde(default)]
    pub clock: Option<ClockSpec>,
    /// The event-time column.
    #[serde(default)]
    pub event_time: Option<String>,
    /// The watermark delay.
    #[serde(default)]
    pub watermark: Option<DurationSpec>,
    /// `min` (default) or `max`.
    #[serde(default)]
    pub multiple_watermark_policy: WatermarkPolicy,
    /// `query` (default, Spark's: one per stream over all its partitions)
    /// or `partition` (each input partition its own watermark).
    #[serde(default)]
    pub watermark_scope: crate::watermark::WatermarkScope,
    /// After this long without records, an input stops holding the
    /// watermark back.
    #[serde(default)]
    pub idle_timeout: Option<DurationSpec>,
    /// Steps in order.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// `append` (default), `update` or `complete`.
    #[serde(default)]
    pub output_mode: OutputMode,
    /// `available_now` or `{micro_batch: <duration>}`.
    #[serde(default)]
    pub trigger: TriggerSpec,
    /// Where rows go.
    pub sink: SinkSpec,
    /// Where bad records go (default: a Kafka topic `<name>-dlq` for a Kafka
    /// source, a file `<name>.dead-letter.jsonl` for the files source).
    #[serde(default)]
    pub dead_letter: Option<DeadLetterSpec>,
    /// Where rows dropped as late go (a sink: jsonl, kafka or stdout);
    /// default: dropped and counted only.
    #[serde(default)]
    pub late_data: Option<SinkSpec>,
    /// `at_least_once` (default) or `exactly_once` (Kafka source and sink:
    /// output, state changes and offsets in one transaction per batch).
    #[serde(default)]
    pub processing_guarantee: ProcessingGuarantee,
    /// Durable state: `{dir: state/, changelog: true, memory_mb: 256}`.
    #[serde(default)]
    pub state: Option<StateSpec>,
    /// Shorthand for `state: {dir: <state_dir>}` with the other keys at
    /// their defaults.
    #[serde(default)]
    pub state_dir: Option<String>,
    /// Caps the records of one batch.
    #[serde(default)]
    pub max_records_per_batch: Option<usize>,
    /// How long a stage may keep failing with errors worth retrying (a
    /// broker down, a fenced transaction) before the run gives up and
    /// fails (Kafka Streams' `task.timeout.ms`); default 5 minutes.
    #[serde(default)]
    pub task_timeout: Option<DurationSpec>,
    /// `{prometheus: "127.0.0.1:9000"}` serves metrics over HTTP.
    #[serde(default)]
    pub metrics: Option<MetricsSpec>,
    /// `{listen: "127.0.0.1:7070", advertised: "host-a:7070"}` serves
    /// interactive queries over the state the query keeps.
    #[serde(default)]
    pub serve: Option<ServeSpec>,
    /// `{listen: "127.0.0.1:4040"}` serves a live web page of the query's
    /// progress (Spark UI's Structured Streaming tab).
    #[serde(default)]
    pub ui: Option<UiSpec>,
    /// The stateful processors `process` steps name, registered by the
    /// program (never read from the file).
    #[serde(skip)]
    pub processors: Processors,
}

/// A duration written as a Spark interval string; checked on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationSpec(pub Duration);

impl DurationSpec {
    /// The duration as a string the parser accepts.
    pub fn to_spark_string(self) -> String {
        crate::duration::format_duration(self.0)
    }
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(DurationSpec)
            .map_err(|e| de::Error::custom(strip_config_prefix(&e)))
    }
}

fn strip_config_prefix(e: &Error) -> String {
    match e {
        Error::Config { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// Data format of a source or sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// One JSON object per record (or line).
    #[default]
    Json,
    /// Avro in the Confluent wire format.
    Avro,
    /// files source: comma-separated values with a header row, read with
    /// Arrow's CSV reader (columns typed by `schema`).
    Csv,
    /// files source: Parquet files, read with Arrow's Parquet reader.
    Parquet,
}

/// `schema: {column: type, ...}` in order; types are checked on read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchemaSpec(pub Schema);

impl SchemaSpec {
    /// The schema of these `(column, type)` pairs, in order; a type that
    /// is not one of [`FieldType::NAMES`] is an error naming its column.
    pub fn of_columns<'a>(
        columns: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<SchemaSpec> {
        let fields = columns
            .into_iter()
            .map(|(name, ty)| {
                ty.parse::<FieldType>()
                    .map(|ty| (name.to_string(), ty))
                    .map_err(|e| Error::config("source.schema", format!("column `{name}`: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SchemaSpec(Schema::new(fields)))
    }
}

impl<'de> Deserialize<'de> for SchemaSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct SchemaVisitor;
        impl<'de> Visitor<'de> for SchemaVisitor {
            type Value = SchemaSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a map of column name to type ({})", FieldType::NAMES)
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<SchemaSpec, A::Error> {
                let mut fields = Vec::new();
                while let Some((name, ty)) = map.next_entry::<String, String>()? {
                    let ty: FieldType = ty
                        .parse()
                        .map_err(|e: String| de::Error::custom(format!("column `{name}`: {e}")))?;
                    fields.push((name, ty));
                }
                Ok(SchemaSpec(Schema::new(fields)))
            }
        }
        d.deserialize_map(SchemaVisitor)
    }
}

/// Which source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// A directory files land in, read a few per micro-batch, each once.
    Files,
    /// A Kafka consumer group.
    Kafka,
}

/// The `kafka:` section: one client configuration for the whole query.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSpec {
    /// Bootstrap servers of the cluster the query reads (default:
    /// `KAFKA_BOOTSTRAP`, else `127.0.0.1:9092`; `source.bootstrap` wins).
    #[serde(default)]
    pub bootstrap: Option<String>,
    /// librdkafka properties every client gets (`security.protocol`,
    /// `sasl.*`, `ssl.*`...); secret values are masked wherever shown.
    #[serde(default)]
    pub properties: Properties,
}

/// The `schema_registry:` section: a URL, or a URL with client properties
/// (`basic.auth.user.info`, `bearer.auth.token`, `ssl.ca.location`,
/// `request.timeout.ms`).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistrySpec {
    /// The registry's base URL.
    pub url: String,
    /// Client properties; secret values are masked wherever shown.
    pub properties: Properties,
}

impl fmt::Debug for RegistrySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrySpec")
            .field("url", &crate::secrets::mask_url(&self.url))
            .field("properties", &self.properties)
            .finish()
    }
}

impl<'de> Deserialize<'de> for RegistrySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            url: String,
            #[serde(default)]
            properties: Properties,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Url(String),
            Full(Full),
        }
        Ok(
            match Either::deserialize(deserializer).map_err(|_| {
                de::Error::custom("expected a URL or {url: <URL>, properties: {...}}")
            })? {
                Either::Url(url) => RegistrySpec {
                    url,
                    properties: Properties::default(),
                },
                Either::Full(full) => RegistrySpec {
                    url: full.url,
                    properties: full.properties,
                },
            },
        )
    }
}

/// How an Avro Kafka sink names the subject it registers its schema under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectNameStrategySpec {
    /// `<topic>-value` (Confluent's default, TopicNameStrategy).
    #[default]
    Topic,
    /// The record's full name (RecordNameStrategy).
    Record,
    /// `<topic>-<record full name>` (TopicRecordNameStrategy).
    TopicRecord,
}

/// The `source:` section.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// `files` or `kafka`.
    pub kind: SourceKind,
    /// files: the directory.
    #[serde(default)]
    pub path: Option<String>,
    /// kafka: bootstrap servers (default: `KAFKA_BOOTSTRAP`, else
    /// `127.0.0.1:9092`).
    #[serde(default)]
    pub bootstrap: Option<String>,
    /// kafka: the topic, or a list of co-partitioned topics.
    #[serde(default)]
    pub topic: Option<TopicList>,
    /// kafka: the consumer group (default: the pipeline's name).
    #[serde(default)]
    pub group: Option<String>,
    /// kafka: `earliest` (default) or `latest` when the group has no offset.
    #[serde(default)]
    pub starting_offsets: Option<StartingOffsets>,
    /// kafka: Spark's `failOnDataLoss`. A committed offset the partition
    /// no longer holds (records deleted by retention or by hand, a topic
    /// made again) fails the run naming it (default `true`); `false` reads
    /// on from the earliest offset with a warning, counting the records
    /// skipped (`tidemark_source_records_lost_total`).
    #[serde(default = "default_fail_on_data_loss")]
    pub fail_on_data_loss: bool,
    /// kafka: static group membership (KIP-345, Kafka Streams'
    /// `group.instance.id`). With a stable instance identity — a state
    /// directory's instance slot or `TIDEMARK_INSTANCE_ID` — the consumer
    /// joins as a static member (default `true`): a replica restarted within
    /// `session.timeout.ms` gets its partitions back without a rebalance.
    /// `false` joins as a dynamic member, which leaves the group at once on
    /// a clean stop; a `group.instance.id` in `properties` wins over both.
    #[serde(default = "default_static_membership")]
    pub static_membership: bool,
    /// `json` (default) or `avro`.
    #[serde(default)]
    pub format: Format,
    /// Column types; empty keeps every JSON field with its inferred type.
    #[serde(default)]
    pub schema: SchemaSpec,
    /// avro: a Confluent schema registry URL (or the top-level
    /// `schema_registry`, which also takes credentials).
    #[serde(default)]
    pub schema_registry: Option<String>,
    /// avro: local `.avsc` files by schema id (`{1: schemas/order.avsc}`).
    #[serde(default)]
    pub avro_schemas: BTreeMap<u32, String>,
    /// librdkafka properties for this client only, over `kafka.properties`.
    #[serde(default)]
    pub properties: Properties,
    /// kafka: the columns the record key is made of. A grouping on exactly
    /// these columns runs where the records are (Kafka Streams'
    /// `groupByKey`); any other grouping first goes through a repartition
    /// topic (`groupBy`).
    #[serde(default)]
    pub keyed_by: Option<Vec<String>>,
    /// files: the directory where the source records which files each
    /// batch read and which batches committed (default, with `state_dir`:
    /// `<state_dir>/<name>/files-source`). Without one, every run reads the
    /// whole directory again.
    #[serde(default)]
    pub checkpoint: Option<String>,
    /// files: at most this many files per batch (Spark's
    /// `maxFilesPerTrigger`; default 1, a file per micro-batch).
    #[serde(default)]
    pub max_files_per_batch: Option<usize>,
    /// files: only file names matching this glob (`*.csv.gz`).
    #[serde(default)]
    pub pattern: Option<String>,
    /// files: `earliest` (default: the files there and those that land
    /// later) or `latest` (only those that land after the first start).
    #[serde(default)]
    pub start: Option<StartingOffsets>,
    /// files: a file modified more recently than this is left for a later
    /// batch (for writers that write in place; default 0: names tell, a
    /// temporary name such as `.x`, `_x`, `x.tmp` or `x.part` is never read).
    #[serde(default)]
    pub settle_delay: Option<DurationSpec>,
    /// files: read a symbolic link in the directory as the file it points
    /// to (default `false`: links are left alone, so that none can make the
    /// source read a file outside its directory).
    #[serde(default)]
    pub follow_symlinks: Option<bool>,
    /// files: the most one file may hold once decompressed, in MiB
    /// (default 1024); a larger file ends the run with an error naming it
    /// and this key, as its records would be held in memory at once.
    #[serde(default)]
    pub max_file_mb: Option<u64>,
}

impl SourceSpec {
    /// A source of this kind with every other key at its default (as a
    /// file's `source: {kind: ...}` reads).
    pub fn new(kind: SourceKind) -> SourceSpec {
        SourceSpec {
            kind,
            path: None,
            bootstrap: None,
            topic: None,
            group: None,
            starting_offsets: None,
            fail_on_data_loss: default_fail_on_data_loss(),
            static_membership: default_static_membership(),
            format: Format::default(),
            schema: SchemaSpec::default(),
            schema_registry: None,
            avro_schemas: BTreeMap::new(),
            properties: Properties::default(),
            keyed_by: None,
            checkpoint: None,
            max_files_per_batch: None,
            pattern: None,
            start: None,
            settle_delay: None,
            follow_symlinks: None,
            max_file_mb: None,
        }
    }
}

/// Where a new consumer group starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartingOffsets {
    /// From the beginning.
    Earliest,
    /// Only new records.
    Latest,
}

/// One topic or several.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicList(pub Vec<String>);

impl<'de> Deserialize<'de> for TopicList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopicList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a topic name or a list of topic names")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<TopicList, E> {
                Ok(TopicList(vec![v.to_string()]))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<TopicList, A::Error> {
                let mut out = Vec::new();
                while let Some(t) = seq.next_element::<String>()? {
                    out.push(t);
                }
                Ok(TopicList(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `clock: {batch_times: [...]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockSpec {
    /// RFC 3339 processing time of batch 0, 1, ...
    pub batch_times: Vec<TimestampSpec>,
}

/// An RFC 3339 timestamp, checked on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampSpec(pub i64);

impl<'de> Deserialize<'de> for TimestampSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        crate::time::parse_rfc3339(&text)
            .map(TimestampSpec)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "`{text}` is not an RFC 3339 timestamp (e.g. 2026-01-01T10:00:00Z)"
                ))
            })
    }
}

/// An expression, checked on read.
#[derive(Debug, Clone, PartialEq)]
pub struct ExprSpec(pub String);

impl ExprSpec {
    /// `text` once it parses as a Spark SQL expression.
    pub fn parse(text: &str) -> Result<ExprSpec> {
        crate::expr::Expr::parse(text)?;
        Ok(ExprSpec(text.to_string()))
    }
}

impl<'de> Deserialize<'de> for ExprSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        ExprSpec::parse(&text).map_err(|e| de::Error::custom(e.to_string()))
    }
}

/// One step.
#[derive(Debug, Clone)]
pub enum StepSpec {
    /// `filter: "amount >= 0 and id != 'x'"`.
    Filter(ExprSpec),
    /// `select: [a, b]` or `select: {a: a, total: amount}` (output: source).
    Select(SelectSpec),
    /// `with_column: {name: cents, expr: "amount * 100"}`.
    WithColumn(WithColumnSpec),
    /// Windowed aggregation.
    WindowAggregate(WindowAggregateSpec),
    /// Rolling window: per-key aggregates over a look-back range ending at
    /// a moving frontier.
    RollingWindow(RollingWindowSpec),
    /// `dedup: {keys: [guid], within_watermark: true}`.
    Dedup(DedupYaml),
    /// `distinct: {}`.
    Distinct(DistinctYaml),
    /// A stream-stream join with a second stream.
    Join(Box<JoinYaml>),
    /// A stream–table join with a compacted topic (Kafka Streams' KTable).
    TableJoin(TableJoinYaml),
    /// Spark's `union` (by name) with a second stream.
    Union(Box<UnionYaml>),
    /// `process: {processor: card_velocity, keys: [card]}`: a stateful
    /// processor the program registered under that name
    /// ([`PipelineFile::with_processor`]).
    Process(ProcessYaml),
    /// `code: features`: steps the program wrote on the query builder and
    /// registered under that name ([`PipelineFile::with_steps`]).
    Code(String),
}

impl StepSpec {
    /// Whether the step reads a co-partitioned input beside the source: a
    /// stream join, a table join (not a global one), a union, or a
    /// processor's initial state.
    fn reads_a_second_input(&self) -> bool {
        match self {
            StepSpec::Join(_) | StepSpec::Union(_) => true,
            StepSpec::TableJoin(t) => !t.global,
            StepSpec::Process(p) => p.initial_state.is_some(),
            _ => false,
        }
    }
}

const STEP_NAMES: &str =
    "filter, select, with_column, window_aggregate, rolling_window, dedup, distinct, join, table_join, union, process, code";

/// `join: {topic, type, on, event_time, watermark, between | bounds | window, ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinYaml {
    /// The second stream's topic(s), co-partitioned with the source's (for
    /// the files source: the sub-directory of `source.path`).
    pub topic: TopicList,
    /// The stream's name in progress reports and in renamed columns
    /// (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// `inner` (default), `left_outer`, `right_outer`, `full_outer` or
    /// `left_semi`.
    #[serde(default = "default_join_type", rename = "type")]
    pub join_type: crate::operators::JoinType,
    /// Key columns: a name present on both sides, or `{left: a, right: b}`.
    pub on: Vec<JoinKeyYaml>,
    /// The second stream's event-time column.
    pub event_time: String,
    /// The second stream's own watermark delay.
    #[serde(default)]
    pub watermark: Option<DurationSpec>,
    /// `[lower, upper]`: `right.event_time BETWEEN left.event_time + lower
    /// AND left.event_time + upper`, inclusive.
    #[serde(default)]
    pub between: Option<[String; 2]>,
    /// Instead of `between`, ends that may be strict: `[">= 0 seconds",
    /// "< 1 hour"]` is `right.event_time >= left.event_time AND
    /// right.event_time < left.event_time + 1 hour`.
    #[serde(default)]
    pub bounds: Option<[String; 2]>,
    /// Instead of `between`: both rows in the same tumbling window.
    #[serde(default)]
    pub window: Option<DurationSpec>,
    /// The second stream's column types (empty: inferred).
    #[serde(default)]
    pub schema: SchemaSpec,
    /// Stateless steps (filter, select, with_column) on the second stream
    /// before the join.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// The columns the second stream's record key is made of. When this or
    /// `source.keyed_by` is set and differs from its side of `on`, both
    /// streams go through repartition topics keyed by the join key.
    #[serde(default)]
    pub keyed_by: Option<Vec<String>>,
}

impl JoinYaml {
    /// The time condition from `between`, `bounds` or `window` (at most one).
    fn time_condition(&self) -> Result<crate::operators::JoinTimeCondition> {
        use crate::operators::JoinTimeCondition;
        match (&self.between, &self.bounds, self.window) {
            (Some([lower, upper]), None, None) => JoinTimeCondition::between(lower, upper),
            (None, Some([lower, upper]), None) => JoinTimeCondition::bounds(lower, upper),
            (None, None, Some(w)) => Ok(JoinTimeCondition::Window {
                size_micros: tidemark_types::duration::micros(w.0),
            }),
            (None, None, None) => Ok(JoinTimeCondition::None),
            _ => Err(Error::config(
                "join.between",
                "set one of `between`, `bounds` or `window`, not several",
            )),
        }
    }
}

/// `union: {topic, name, event_time, watermark, schema, steps, keyed_by}`:
/// Spark's `union` of the rows so far with a second stream, columns matched
/// by name (`unionByName`, missing ones null), each stream with its own
/// watermark, combined by `multiple_watermark_policy`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnionYaml {
    /// The second stream's topic(s) (for the files source: the
    /// sub-directory of `source.path`).
    pub topic: TopicList,
    /// The stream's name in progress reports (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// The second stream's event-time column (default: the main stream's).
    #[serde(default)]
    pub event_time: Option<String>,
    /// The second stream's own watermark delay; without one the stream
    /// takes no part in the query's watermark (as in Spark).
    #[serde(default)]
    pub watermark: Option<DurationSpec>,
    /// The second stream's column types (empty: inferred).
    #[serde(default)]
    pub schema: SchemaSpec,
    /// Stateless steps (filter, select, with_column) on the second stream
    /// before the union.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
    /// The columns the second stream's record key is made of: a later
    /// grouping on them (and on `source.keyed_by`) needs no repartition.
    #[serde(default)]
    pub keyed_by: Option<Vec<String>>,
}

impl UnionYaml {
    /// The stream's name.
    pub fn stream_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "union".into())
    }
}

/// `table_join: {topic, type, on, schema}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableJoinYaml {
    /// The table's compacted topic, co-partitioned with the source (for
    /// the files source: the sub-directory of `source.path`).
    pub topic: TopicList,
    /// The table's name in renamed columns (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// `inner` (default: rows without a table row are dropped) or
    /// `left_outer` (kept with nulls).
    #[serde(default = "default_join_type", rename = "type")]
    pub join_type: crate::operators::JoinType,
    /// Key columns: a name present on both sides, or `{left: a, right: b}`.
    pub on: Vec<JoinKeyYaml>,
    /// The table's column types (empty: inferred).
    #[serde(default)]
    pub schema: SchemaSpec,
    /// `true`: a global table (Kafka Streams' GlobalKTable): every instance
    /// reads every partition of the topic, so it need not be co-partitioned
    /// with the source nor share its key.
    #[serde(default)]
    pub global: bool,
}

impl TableJoinYaml {
    /// The table's name.
    pub fn table_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "table".into())
    }
}

fn default_fail_on_data_loss() -> bool {
    true
}

fn default_static_membership() -> bool {
    true
}

fn default_join_type() -> crate::operators::JoinType {
    crate::operators::JoinType::Inner
}

/// One join key: `adId`, or `{left: impressionAdId, right: clickAdId}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinKeyYaml {
    /// The left (main stream) column.
    pub left: String,
    /// The right (joined stream) column.
    pub right: String,
}

impl<'de> Deserialize<'de> for JoinKeyYaml {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Same(String),
            Pair { left: String, right: String },
        }
        match Raw::deserialize(d).map_err(|_| {
            de::Error::custom("a join key is a column name or `{left: <column>, right: <column>}`")
        })? {
            Raw::Same(c) => Ok(JoinKeyYaml {
                left: c.clone(),
                right: c,
            }),
            Raw::Pair { left, right } => Ok(JoinKeyYaml { left, right }),
        }
    }
}

impl JoinYaml {
    /// The stream's name.
    pub fn stream_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "right".into())
    }
}

/// `dedup: {keys, within_watermark}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupYaml {
    /// The columns identifying a duplicate.
    pub keys: Vec<String>,
    /// Spark's `dropDuplicatesWithinWatermark` (needs a watermark) instead
    /// of `dropDuplicates`.
    #[serde(default)]
    pub within_watermark: bool,
}

/// `process: {processor, keys, initial_state}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessYaml {
    /// The name the program registered the processor under.
    pub processor: String,
    /// The grouping columns: each key's rows go to one processor call.
    pub keys: Vec<String>,
    /// A topic seeding the processor's state (Spark's `initialState`).
    #[serde(default)]
    pub initial_state: Option<InitialStateYaml>,
}

/// `initial_state: {topic, name, schema}`: a topic co-partitioned with the
/// source, its records read as the processor's initial-state type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitialStateYaml {
    /// The topic (a list: several co-partitioned topics).
    pub topic: TopicList,
    /// Its name in progress reports (default: its first topic).
    #[serde(default)]
    pub name: Option<String>,
    /// Its columns and their types.
    #[serde(default)]
    pub schema: SchemaSpec,
}

impl InitialStateYaml {
    /// The input's name: `name`, else the first topic.
    pub fn input_name(&self) -> String {
        self.name
            .clone()
            .or_else(|| self.topic.0.first().cloned())
            .unwrap_or_else(|| "initial_state".into())
    }
}

/// Adds a registered processor's step (or code steps) to a builder.
pub type ProcessorStepBuilder =
    Arc<dyn Fn(QueryBuilder, &[String]) -> Result<QueryBuilder> + Send + Sync>;

/// Adds a registered processor's step seeded from an initial-state input.
pub type SeededStepBuilder = Arc<
    dyn Fn(QueryBuilder, &[String], crate::runtime::JoinInput) -> Result<QueryBuilder>
        + Send
        + Sync,
>;

/// The stateful processors and code steps a program offers its pipeline
/// files, by name (code cannot be written in a file: the file names it).
#[derive(Clone, Default)]
pub struct Processors {
    processors: BTreeMap<String, ProcessorStepBuilder>,
    /// Those that also take an initial state.
    seeded: BTreeMap<String, SeededStepBuilder>,
    code_steps: BTreeMap<String, ProcessorStepBuilder>,
}

impl fmt::Debug for Processors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.processors.keys()).finish()
    }
}

/// `distinct: {}` (no settings).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistinctYaml {}

impl<'de> Deserialize<'de> for StepSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StepSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a step: a map with one key, one of {STEP_NAMES}")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<StepSpec, A::Error> {
                let key: String = map
                    .next_key()?
                    .ok_or_else(|| de::Error::custom(format!("empty step; steps: {STEP_NAMES}")))?;
                let step = match key.as_str() {
                    "filter" => StepSpec::Filter(map.next_value()?),
                    "select" => StepSpec::Select(map.next_value()?),
                    "with_column" => StepSpec::WithColumn(map.next_value()?),
                    "window_aggregate" => StepSpec::WindowAggregate(map.next_value()?),
                    "rolling_window" => StepSpec::RollingWindow(map.next_value()?),
                    "dedup" => StepSpec::Dedup(map.next_value()?),
                    "distinct" => StepSpec::Distinct(map.next_value()?),
                    "join" => StepSpec::Join(map.next_value()?),
                    "table_join" => StepSpec::TableJoin(map.next_value()?),
                    "union" => StepSpec::Union(map.next_value()?),
                    "process" => StepSpec::Process(map.next_value()?),
                    "code" => StepSpec::Code(map.next_value()?),
                    other => {
                        return Err(de::Error::custom(format!(
                            "unknown step `{other}`; steps: {STEP_NAMES}"
                        )))
                    }
                };
                if let Some(extra) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!(
                        "a step has exactly one key; write `{extra}` as a separate `- {extra}: ...` item"
                    )));
                }
                Ok(step)
            }
        }
        d.deserialize_map(V)
    }
}

/// `select` as a list of columns, or a map of output name to source column.
#[derive(Debug, Clone, PartialEq)]
pub struct SelectSpec(pub Vec<(String, String)>);

impl<'de> Deserialize<'de> for SelectSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SelectSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of columns, or a map of output name to source column")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<SelectSpec, A::Error> {
                let mut out = Vec::new();
                while let Some(c) = seq.next_element::<String>()? {
                    out.push((c.clone(), c));
                }
                Ok(SelectSpec(out))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<SelectSpec, A::Error> {
                let mut out = Vec::new();
                while let Some((target, source)) = map.next_entry::<String, String>()? {
                    out.push((source, target));
                }
                Ok(SelectSpec(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `with_column: {name, expr}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WithColumnSpec {
    /// The new column.
    pub name: String,
    /// Its expression.
    pub expr: ExprSpec,
}

/// `window_aggregate: {keys, window, aggregates}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowAggregateSpec {
    /// Grouping columns besides the window.
    #[serde(default)]
    pub keys: Vec<String>,
    /// The window.
    pub window: WindowYaml,
    /// What places rows in windows: absent (or the `event_time` column)
    /// for the event time, `window` for the window an earlier window
    /// aggregation emitted (Spark's `window(window, ...)`, chained).
    #[serde(default)]
    pub time: Option<String>,
    /// The aggregates.
    pub aggregates: Vec<AggregateYaml>,
}

/// `rolling_window: {partition_by, order_by, frontier, measures}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollingWindowSpec {
    /// Grouping columns.
    pub partition_by: Vec<String>,
    /// The timestamp column ordering events (default: `event_time`).
    #[serde(default)]
    pub order_by: Option<String>,
    /// The frontier (default: processing time, no delay, `__frontier`).
    #[serde(default)]
    pub frontier: Option<FrontierYaml>,
    /// The measures: aggregates with a `range` (bounded) or without
    /// (lifetime).
    pub measures: Vec<AggregateYaml>,
}

/// `frontier: {delay: 5 seconds, alias: window_time, basis: processing_time}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontierYaml {
    /// How far the frontier stays behind its basis.
    #[serde(default)]
    pub delay: Option<DurationSpec>,
    /// The output column (default `__frontier`).
    #[serde(default)]
    pub alias: Option<String>,
    /// `processing_time` (default, as Databricks) or `event_time` (the
    /// watermark: deterministic, replayable).
    #[serde(default)]
    pub basis: FrontierBasisYaml,
}

/// What the frontier follows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrontierBasisYaml {
    /// Processing time.
    #[default]
    ProcessingTime,
    /// The watermark.
    EventTime,
}

/// `{tumbling: d}`, `{sliding: d, slide: d}` or `{session: d}`, with an
/// optional `start_offset`.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowYaml(pub WindowSpec);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WindowFields {
    tumbling: Option<DurationSpec>,
    sliding: Option<DurationSpec>,
    slide: Option<DurationSpec>,
    session: Option<DurationSpec>,
    session_gap: Option<ExprSpec>,
    start_offset: Option<DurationSpec>,
}

impl<'de> Deserialize<'de> for WindowYaml {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let w = WindowFields::deserialize(d)?;
        let s = |d: DurationSpec| d.to_spark_string();
        let spec = match (w.tumbling, w.sliding, w.slide, w.session) {
            (None, None, None, None) if w.session_gap.is_some() => {
                WindowSpec::dynamic_session(&w.session_gap.as_ref().expect("checked").0)
            }
            _ if w.session_gap.is_some() => {
                return Err(de::Error::custom("`session_gap` (a per-row gap) stands alone in `window`"))
            }
            (Some(size), None, None, None) => WindowSpec::tumbling(&s(size)),
            (None, Some(size), Some(slide), None) => WindowSpec::sliding(&s(size), &s(slide)),
            (None, Some(_), None, None) => {
                return Err(de::Error::custom("a sliding window needs `slide`, e.g. {sliding: 6 hours, slide: 1 hour}"))
            }
            (None, None, None, Some(gap)) => WindowSpec::session(&s(gap)),
            _ => {
                return Err(de::Error::custom(
                    "write exactly one of {tumbling: <size>}, {sliding: <size>, slide: <slide>}, {session: <gap>}, {session_gap: <expression>}",
                ))
            }
        }
        .and_then(|spec| match w.start_offset {
            Some(o) => spec.with_offset(&s(o)),
            None => Ok(spec),
        })
        .map_err(|e| de::Error::custom(strip_config_prefix(&e)))?;
        Ok(WindowYaml(spec))
    }
}

/// `{fn: sum, column: amount, as: total}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregateYaml {
    /// The function (checked on read).
    #[serde(rename = "fn")]
    pub function: AggregateName,
    /// Its input column; omitted for `count` = `count(*)`.
    #[serde(default)]
    pub column: Option<String>,
    /// max_by / min_by: the column that decides which row's `column` is
    /// kept.
    #[serde(default)]
    pub by: Option<String>,
    /// The output name (default as Spark: `sum(amount)`).
    #[serde(default, rename = "as")]
    pub alias: Option<String>,
    /// approx_count_distinct: relative standard deviation (default 0.05).
    #[serde(default)]
    pub rsd: Option<Fraction>,
    /// approx_percentile: the percentage in [0, 1] (default 0.5).
    #[serde(default)]
    pub percentage: Option<Fraction>,
    /// approx_percentile: accuracy (default 10000).
    #[serde(default)]
    pub accuracy: Option<u32>,
    /// rolling_window only: the look-back range of a bounded measure;
    /// none is a lifetime measure.
    #[serde(default)]
    pub range: Option<DurationSpec>,
}

impl AggregateYaml {
    /// The aggregate this entry describes.
    pub fn spec(&self) -> Result<AggregateSpec> {
        let f = match self.function.0.as_str() {
            "approx_count_distinct" => {
                AggregateFn::approx_count_distinct(self.rsd.map_or(0.05, |r| r.0))
            }
            "approx_percentile" | "percentile_approx" => AggregateFn::approx_percentile(
                self.percentage.map_or(0.5, |p| p.0),
                self.accuracy.unwrap_or(10_000),
            ),
            name => AggregateFn::built_in(name)?,
        };
        let input = match (&self.column, &self.by) {
            (Some(c), Some(by)) if f.takes_ordering() => AggregateInput::By {
                value: c.as_str().into(),
                ordering: by.as_str().into(),
            },
            (_, None) if f.takes_ordering() => {
                return Err(Error::config(
                    "aggregates.by",
                    format!(
                    "`{}` needs `column` (the value kept) and `by` (the column ordering the rows)",
                    self.function.0
                ),
                ))
            }
            (_, Some(_)) if !f.takes_ordering() => {
                return Err(Error::config(
                    "aggregates.by",
                    format!(
                        "`{}` takes no `by`; `by` is for max_by and min_by",
                        self.function.0
                    ),
                ))
            }
            (Some(c), _) => AggregateInput::Column(c.as_str().into()),
            (None, _) if self.function.0 == "count" => AggregateInput::Star,
            (None, _) => {
                return Err(Error::config(
                    "aggregates.column",
                    format!("`{}` needs `column`", self.function.0),
                ))
            }
        };
        let spec = AggregateSpec::new(f, input);
        Ok(match &self.alias {
            Some(n) => spec.alias(n),
            None => spec,
        })
    }
}

/// A number in [0, 1], checked on read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fraction(pub f64);

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if (0.0..=1.0).contains(&v) {
            Ok(Fraction(v))
        } else {
            Err(de::Error::custom(format!("{v} is not between 0 and 1")))
        }
    }
}

/// A built-in aggregate's name, checked on read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregateName(pub String);

impl<'de> Deserialize<'de> for AggregateName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        AggregateFn::built_in(&name).map_err(|e| de::Error::custom(strip_config_prefix(&e)))?;
        Ok(AggregateName(name))
    }
}

/// `available_now` or `{micro_batch: 1 second}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TriggerSpec(pub Trigger);

impl<'de> Deserialize<'de> for TriggerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        const ALLOWED: &str =
            "allowed: available_now, {micro_batch: <interval>}, {real_time: <checkpoint interval>}";
        impl<'de> Visitor<'de> for V {
            type Value = TriggerSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a trigger; {ALLOWED}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<TriggerSpec, E> {
                match v {
                    "available_now" => Ok(TriggerSpec(Trigger::AvailableNow)),
                    other => Err(E::custom(format!("unknown trigger `{other}`; {ALLOWED}"))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<TriggerSpec, A::Error> {
                let key: String = map
                    .next_key()?
                    .ok_or_else(|| de::Error::custom(format!("empty trigger; {ALLOWED}")))?;
                match key.as_str() {
                    "micro_batch" => {
                        let d: DurationSpec = map.next_value()?;
                        Ok(TriggerSpec(Trigger::MicroBatch { interval: d.0 }))
                    }
                    "real_time" => {
                        let d: DurationSpec = map.next_value()?;
                        Ok(TriggerSpec(Trigger::RealTime {
                            checkpoint_interval: d.0,
                        }))
                    }
                    other => Err(de::Error::custom(format!(
                        "unknown trigger `{other}`; {ALLOWED}"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

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

/// `state:`: where stateful operators keep their state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    /// The state directory (RocksDB per task under `<dir>/<name>/<partition>`).
    pub dir: String,
    /// Log every change to a compacted Kafka topic and restore from it
    /// (default: true for a Kafka source, false for files).
    #[serde(default)]
    pub changelog: Option<bool>,
    /// Memory for RocksDB's block cache and write buffers, in MiB.
    #[serde(default = "default_state_memory_mb")]
    pub memory_mb: usize,
    /// Replication factor of changelog topics.
    #[serde(default = "default_replication")]
    pub replication: i32,
    /// Standby replicas: with 1 or more, each instance keeps warm copies
    /// of the partitions it does not own, so a moved task replays only the
    /// changelog's tail.
    #[serde(default)]
    pub num_standby_replicas: usize,
    /// How long a restore may go without reading anything new from a
    /// changelog before the task fails (default 5 minutes); a restore of
    /// any size runs as long as it makes progress.
    #[serde(default)]
    pub restore_stall_timeout: Option<DurationSpec>,
}

impl StateSpec {
    /// State under `dir` with every other key at its default (as a file's
    /// `state_dir: <dir>` reads).
    pub fn new(dir: impl Into<String>) -> StateSpec {
        StateSpec {
            dir: dir.into(),
            changelog: None,
            memory_mb: default_state_memory_mb(),
            replication: default_replication(),
            num_standby_replicas: 0,
            restore_stall_timeout: None,
        }
    }
}

fn default_state_memory_mb() -> usize {
    256
}

fn default_replication() -> i32 {
    1
}

/// `metrics: {prometheus: "127.0.0.1:9000"}`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSpec {
    /// Address of the Prometheus scrape endpoint (`/metrics`).
    pub prometheus: String,
    /// When set, a scrape must carry `Authorization: Bearer <token>`
    /// (Prometheus' `authorization` setting). Masked wherever shown.
    #[serde(default)]
    pub auth_token: Option<String>,
    /// TLS on the endpoint.
    #[serde(default)]
    pub tls: Option<TlsSpec>,
}

impl fmt::Debug for MetricsSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsSpec")
            .field("prometheus", &self.prometheus)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// `tls: {cert: server.pem, key: server.key, ca: ca.pem}` on an HTTP
/// service: its socket speaks TLS only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// The certificate chain served (PEM).
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
    /// The CA certificates (PEM) a peer's certificate must chain to when
    /// an instance forwards a read to another: required by `serve.tls`,
    /// unused by `ui` and `metrics`.
    #[serde(default)]
    pub ca: Option<String>,
}

/// `serve:`: interactive queries over HTTP.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeSpec {
    /// The address to listen on (`host:port`; port 0 picks a free one).
    pub listen: String,
    /// The address the other instances reach this one on (`host:port`),
    /// found by them through the consumer group; default: `listen`.
    #[serde(default)]
    pub advertised: Option<String>,
    /// When set (write `${VAR}` to keep it out of the file), every request
    /// but the health probes must carry `Authorization: Bearer <token>`;
    /// the instances of one query share it. Masked wherever shown.
    #[serde(default)]
    pub auth_token: Option<String>,
    /// TLS on the socket; reads forwarded to the other instances go over
    /// `https` (the instances of one query share the setting).
    #[serde(default)]
    pub tls: Option<TlsSpec>,
}

impl fmt::Debug for ServeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeSpec")
            .field("listen", &self.listen)
            .field("advertised", &self.advertised)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl ServeSpec {
    /// The address other instances reach this one on.
    pub fn advertised(&self) -> &str {
        self.advertised.as_deref().unwrap_or(&self.listen)
    }
}

/// `ui:`: the live web page.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UiSpec {
    /// The address to listen on (`host:port`).
    pub listen: String,
    /// When set, the page and its API ask for `Authorization: Bearer
    /// <token>` (for a page reached through a proxy that adds it). Masked
    /// wherever shown.
    #[serde(default)]
    pub auth_token: Option<String>,
    /// TLS on the socket.
    #[serde(default)]
    pub tls: Option<TlsSpec>,
}

impl fmt::Debug for UiSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UiSpec")
            .field("listen", &self.listen)
            .field("auth_token", &self.auth_token.as_ref().map(|_| "***"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// A pipeline-file error with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column {c}: {}", self.message),
            (Some(l), None) => write!(f, "line {l}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PipelineError {}

/// A YAML error at `path`, placed at the key's line when serde_yaml lost it.
fn yaml_error(text: &str, path: String, inner: serde_yaml::Error) -> PipelineError {
    let (_, message) = split_yaml_message(&inner.to_string());
    // serde_yaml loses the place of errors raised while checking a value
    // (it reports 1:1); the path finds the key's line instead.
    let by_path = (path != ".")
        .then(|| crate::yaml_paths::position_of(text, &path))
        .flatten();
    let by_serde = inner
        .location()
        .filter(|l| (l.line(), l.column()) != (1, 1))
        .map(|l| (l.line(), l.column()));
    let place = match (by_path, by_serde) {
        (Some(p), Some(s)) => Some(if s.0 >= p.0 { s } else { p }),
        (p, s) => p.or(s),
    };
    PipelineError {
        line: place.map(|p| p.0),
        column: place.map(|p| p.1),
        message: if path == "." {
            message
        } else {
            format!("`{path}`: {message}")
        },
    }
}

/// A failed `${VAR}` substitution, naming the variable and the value's key
/// (never a value: it may be a secret).
fn env_var_error(text: &str, path: &str, error: crate::env_vars::EnvVarError) -> PipelineError {
    let message = match error {
        crate::env_vars::EnvVarError::Unset(name) => format!(
            "`{path}`: environment variable `{name}` is not set (set it, or give a default: `${{{name}:-value}}`)"
        ),
        crate::env_vars::EnvVarError::Unclosed => {
            format!("`{path}`: `${{` without its closing `}}` (write `$${{` for a literal `${{`)")
        }
    };
    let place = crate::yaml_paths::position_of(text, path);
    PipelineError {
        line: place.map(|p| p.0),
        column: place.map(|p| p.1),
        message,
    }
}

fn line_of_key(text: &str, key: &str) -> Option<usize> {
    let needle = format!("{key}:");
    text.lines()
        .position(|l| l.trim_start().trim_start_matches("- ").starts_with(&needle))
        .map(|i| i + 1)
}

impl PipelineFile {
    /// Reads and checks a pipeline file's text.
    ///
    /// ```
    /// let file = tidemark::pipeline::PipelineFile::parse(r#"
    /// name: demo
    /// source: {kind: files, path: batches/}
    /// sink: {kind: stdout}
    /// watermark: 10 fortnights
    /// "#).unwrap_err();
    /// assert_eq!(file.line, Some(5));
    /// assert!(file.message.contains("unknown unit"));
    /// ```
    pub fn parse(text: &str) -> std::result::Result<PipelineFile, PipelineError> {
        Self::parse_with_env(text, &|name| std::env::var(name).ok())
    }

    /// [`PipelineFile::parse`] with `${VAR}` / `${VAR:-default}` in string
    /// values taken from `lookup` instead of the process environment.
    pub fn parse_with_env(
        text: &str,
        lookup: &impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<PipelineFile, PipelineError> {
        let parsed = if text.contains("${") {
            let mut yaml: serde_yaml::Value =
                serde_yaml::from_str(text).map_err(|e| yaml_error(text, ".".to_string(), e))?;
            crate::env_vars::substitute_in_yaml(&mut yaml, "", lookup)
                .map_err(|(path, e)| env_var_error(text, &path, e))?;
            serde_path_to_error::deserialize(yaml)
        } else {
            serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text))
        };
        let file: PipelineFile = parsed.map_err(|e| {
            let path = e.path().to_string();
            yaml_error(text, path, e.into_inner())
        })?;
        file.check().map_err(|(key, message)| PipelineError {
            line: line_of_key(text, key.rsplit('.').next().unwrap_or(&key)),
            column: None,
            message: format!("`{key}`: {message}"),
        })?;
        Ok(file)
    }

    /// A pipeline named `name` from `source` to `sink`, every other
    /// setting at its default: what a program's builder starts from and
    /// sets, field by field, before [`check_settings`](Self::check_settings).
    pub fn new(name: &str, source: SourceSpec, sink: SinkSpec) -> PipelineFile {
        PipelineFile {
            name: name.to_string(),
            kafka: None,
            schema_registry: None,
            source,
            clock: None,
            event_time: None,
            watermark: None,
            multiple_watermark_policy: WatermarkPolicy::default(),
            watermark_scope: crate::watermark::WatermarkScope::default(),
            idle_timeout: None,
            steps: Vec::new(),
            output_mode: OutputMode::default(),
            trigger: TriggerSpec::default(),
            sink,
            dead_letter: None,
            late_data: None,
            processing_guarantee: ProcessingGuarantee::default(),
            state: None,
            state_dir: None,
            max_records_per_batch: None,
            task_timeout: None,
            metrics: None,
            serve: None,
            ui: None,
            processors: Processors::default(),
        }
    }

    /// Checks the settings together as a file's are checked on read (a
    /// Kafka source names its topic, exactly-once has a sink that can
    /// take part, the event time is a column of the schema...); an error
    /// names the key.
    pub fn check_settings(&self) -> Result<()> {
        self.check()
            .map_err(|(key, message)| Error::config(key, message))
    }

    fn check(&self) -> std::result::Result<(), (String, String)> {
        let err = |k: &str, m: &str| Err((k.to_string(), m.to_string()));
        match self.source.kind {
            SourceKind::Files if self.source.path.is_none() => {
                return err("source.path", "the files source needs `path: <directory>`")
            }
            SourceKind::Kafka if self.source.topic.is_none() => {
                return err("source.topic", "the kafka source needs `topic: <name>`")
            }
            _ => {}
        }
        if self.source.format == Format::Avro
            && self.source.schema_registry.is_none()
            && self.schema_registry.is_none()
            && self.source.avro_schemas.is_empty()
        {
            return err(
                "source.format",
                "avro needs a `schema_registry` (top level: a URL or {url, properties}) or `source.avro_schemas: {<id>: <file.avsc>}`",
            );
        }
        match self.sink.kind {
            SinkKind::Jsonl if self.sink.path.is_none() => {
                return err("sink.path", "the jsonl sink needs `path: <file>`")
            }
            SinkKind::Kafka if self.sink.topic.is_none() => {
                return err("sink.topic", "the kafka sink needs `topic: <name>`")
            }
            SinkKind::Kafka
                if self.sink.format == Format::Avro && self.sink.avro_schema.is_none() =>
            {
                return err(
                    "sink.format",
                    "the avro format needs `avro_schema: <file.avsc>`",
                )
            }
            _ => {}
        }
        if let Some(late) = &self.late_data {
            match late.kind {
                SinkKind::Jsonl if late.path.is_none() => {
                    return err("late_data.path", "needs `path: <file>`")
                }
                SinkKind::Kafka if late.topic.is_none() => {
                    return err("late_data.topic", "needs `topic: <name>`")
                }
                _ => {}
            }
        }
        self.check_files_source()?;
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && !matches!(self.sink.kind, SinkKind::Kafka | SinkKind::Delta)
        {
            return err(
                "processing_guarantee",
                "exactly_once needs a kafka or delta sink (allowed otherwise: at_least_once)",
            );
        }
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && self.source.kind == SourceKind::Files
            && self.files_checkpoint().is_none()
        {
            return err(
                "processing_guarantee",
                "exactly_once over a files source needs it to remember its progress: set `state_dir` or `source.checkpoint`",
            );
        }
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && self
                .dead_letter
                .as_ref()
                .is_some_and(|d| d.kind == DeadLetterKind::Kafka && !d.properties.is_empty())
        {
            return err(
                "dead_letter.properties",
                "under exactly_once dead letters go out in the query's transaction, whose producer takes `kafka.properties` and `sink.properties`: move these there",
            );
        }
        if self.schema_registry.is_some() && self.source.schema_registry.is_some() {
            return err(
                "source.schema_registry",
                "give the registry once, as the top-level `schema_registry` (it serves the source and the sink)",
            );
        }
        if self.schema_registry.is_some()
            && self.sink.format == Format::Avro
            && self.sink.avro_schema_id.is_some()
        {
            return err(
                "sink.avro_schema_id",
                "with a `schema_registry` the sink registers `avro_schema` under its subject and writes the id the registry gives: leave `avro_schema_id` out",
            );
        }
        if self.sink.kind == SinkKind::Delta && self.sink.path.is_none() {
            return err(
                "sink.path",
                "the delta sink needs `path: <directory or s3://, gs://, abfss:// URL>`",
            );
        }
        if self.sink.kind != SinkKind::Delta && self.sink.mode.is_some() {
            return err(
                "sink.mode",
                "`mode` (changes | upsert) belongs to the delta sink",
            );
        }
        if self.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && matches!(self.trigger.0, Trigger::RealTime { .. })
        {
            return err(
                "processing_guarantee",
                "the real_time trigger sends output as records arrive, before its checkpoint: its output is at-least-once (as in Databricks); set `processing_guarantee: at_least_once` or use {micro_batch: <interval>}",
            );
        }
        if self.watermark.is_some() && self.event_time.is_none() {
            return err("watermark", "a watermark needs `event_time: <column>`");
        }
        if let (Some(col), false) = (&self.event_time, self.source.schema.0.is_empty()) {
            match self.source.schema.0.field_type(col) {
                None => return err("event_time", &format!("column `{col}` is not in `source.schema`")),
                Some(FieldType::Timestamp) | Some(FieldType::Long) => {}
                Some(other) => {
                    return err(
                        "event_time",
                        &format!("column `{col}` is {other}; the event time must be a timestamp or long (epoch ms)"),
                    )
                }
            }
        }
        if self.state.is_some() && self.state_dir.is_some() {
            return err(
                "state_dir",
                "give either `state_dir: <dir>` or `state: {dir: <dir>, ...}`, not both",
            );
        }
        if let Some(d) = &self.dead_letter {
            match d.kind {
                DeadLetterKind::Kafka if d.topic.is_none() => {
                    return err("dead_letter.topic", "needs `topic`")
                }
                DeadLetterKind::File if d.path.is_none() => {
                    return err("dead_letter.path", "needs `path`")
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The stages this pipeline runs in (see [`QueryBuilder::into_topology`]):
    /// a Kafka source whose first grouping is not on the record key
    /// (`source.keyed_by`), or whose stream join's topics are keyed by
    /// other columns or not `co_partitioned`, is split at repartition
    /// topics; any other runs as one stage.
    pub fn topology(&self, co_partitioned: bool) -> Result<Topology> {
        let mut query = self.query_builder()?;
        if self.source.kind != SourceKind::Kafka {
            return Ok(Topology {
                stages: vec![query.single_stage()],
            });
        }
        if let Some(keys) = &self.source.keyed_by {
            query = query.keyed_by(keys);
        }
        if !co_partitioned {
            query = query.repartition_joins();
        }
        let join_keys = query.plan().stream_join_keys();
        let topology = query.into_topology();
        if let (true, Some(keys)) = (topology.is_repartitioned(), join_keys) {
            // The join's reader reads rows keyed by the left join keys, not
            // by `source.keyed_by`: its groupings must hold on those.
            self.query_builder()?
                .keyed_by(&keys)
                .plan()
                .check_join_partitioning(true)?;
        }
        Ok(topology)
    }

    /// The topics the source reads: its own and those of the inputs its
    /// steps read beside it (joined streams and tables, unions' streams,
    /// initial states; not global tables, which every task reads whole).
    pub fn input_topics(&self) -> Result<Vec<String>> {
        let mut topics = self.source.topic.clone().map(|t| t.0).unwrap_or_default();
        for input in self.query_builder()?.plan().second_inputs() {
            if input.kind != crate::runtime::SecondInputKind::GlobalTable {
                topics.extend(input.topics);
            }
        }
        Ok(topics)
    }

    /// Where the files source records its progress: `source.checkpoint`,
    /// else `<state_dir>/<name>/files-source` (relative to the file's
    /// directory, as every path).
    pub fn files_checkpoint(&self) -> Option<String> {
        if self.source.kind != SourceKind::Files {
            return None;
        }
        self.source.checkpoint.clone().or_else(|| {
            self.state_spec()
                .map(|s| format!("{}/{}/files-source", s.dir.trim_end_matches('/'), self.name))
        })
    }

    /// The files source's own keys: only with `kind: files`, and valid.
    fn check_files_source(&self) -> std::result::Result<(), (String, String)> {
        let src = &self.source;
        let err = |k: &str, m: &str| Err((k.to_string(), m.to_string()));
        let files_keys = [
            ("source.checkpoint", src.checkpoint.is_some()),
            (
                "source.max_files_per_batch",
                src.max_files_per_batch.is_some(),
            ),
            ("source.pattern", src.pattern.is_some()),
            ("source.start", src.start.is_some()),
            ("source.settle_delay", src.settle_delay.is_some()),
            ("source.follow_symlinks", src.follow_symlinks.is_some()),
            ("source.max_file_mb", src.max_file_mb.is_some()),
        ];
        if src.kind != SourceKind::Files {
            if let Some((key, _)) = files_keys.iter().find(|(_, set)| *set) {
                return err(key, "belongs to the files source (`kind: files`)");
            }
            if matches!(src.format, Format::Csv | Format::Parquet) {
                return err("source.format", "csv and parquet are formats of the files source; a kafka source reads json or avro");
            }
        }
        if matches!(self.sink.format, Format::Csv | Format::Parquet) {
            return err("sink.format", "a sink writes json or avro");
        }
        if src.max_files_per_batch == Some(0) {
            return err("source.max_files_per_batch", "must be at least 1");
        }
        if let Some(Err(e)) = src.pattern.as_deref().map(glob::Pattern::new) {
            return err("source.pattern", &format!("not a glob pattern: {e}"));
        }
        if src.kind == SourceKind::Files && src.format == Format::Avro {
            return err(
                "source.format",
                "the files source reads json (lines), csv or parquet",
            );
        }
        let changelog = self.state_spec().and_then(|s| s.changelog).unwrap_or(false);
        if self.files_checkpoint().is_some() && changelog {
            return err("state.changelog", "a files source keeps its state on local disk, versioned with its checkpoint: leave `changelog` unset or false");
        }
        if let Some(state) = self.state_spec().filter(|s| s.num_standby_replicas > 0) {
            // Standbys are copies fed by the changelog (the default with a
            // Kafka source): without one there is nothing to copy.
            let has_changelog = state.changelog.unwrap_or(src.kind == SourceKind::Kafka);
            if !has_changelog {
                return err(
                    "state.num_standby_replicas",
                    "standby replicas are kept warm from the state's changelog topics: with a Kafka source leave `state.changelog` unset or true, or set `num_standby_replicas: 0`",
                );
            }
        }
        Ok(())
    }

    /// The state settings from `state:` or `state_dir:`, if any.
    pub fn state_spec(&self) -> Option<StateSpec> {
        self.state
            .clone()
            .or_else(|| self.state_dir.as_ref().map(StateSpec::new))
    }

    /// The source's schema (empty: infer).
    pub fn schema(&self) -> Schema {
        self.source.schema.0.clone()
    }

    /// A `window_aggregate` step added to `b`: over the event time, or with
    /// `time: window` over an earlier window aggregation's windows.
    fn window_aggregate_step(
        &self,
        b: QueryBuilder,
        w: &WindowAggregateSpec,
    ) -> Result<QueryBuilder> {
        let aggregates = w
            .aggregates
            .iter()
            .map(|a| {
                if a.range.is_some() {
                    return Err(Error::config(
                        "aggregates.range",
                        "`range` belongs to rolling_window measures; window_aggregate takes its window from `window`",
                    ));
                }
                a.spec()
            })
            .collect::<Result<Vec<_>>>()?;
        match w.time.as_deref() {
            Some("window") => {
                b.window_aggregate_of_windows(&w.keys, w.window.0.clone(), aggregates)
            }
            Some(t) if Some(t) != self.event_time.as_deref() => {
                Err(Error::config(
                    "window_aggregate.time",
                    format!(
                        "`{t}` is not a time this step can window: use `window` (an earlier window aggregation's window) or leave it out (the event time{})",
                        self.event_time
                            .as_deref()
                            .map(|c| format!(", `{c}`"))
                            .unwrap_or_default()
                    ),
                ))
            }
            _ => Ok(b.window_aggregate(&w.keys, w.window.0.clone(), aggregates)),
        }
    }

    /// Registers the stateful processor `name` for the file's `process`
    /// steps that name it: `build` makes each task's processor and
    /// declares its states (see [`QueryBuilder::process`]). It replaces a
    /// processor registered before under the same name.
    pub fn with_processor<P, F>(mut self, name: &str, build: F) -> Self
    where
        P: crate::operators::StatefulProcessor,
        F: Fn(&mut crate::operators::StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        let build = Arc::new(build);
        let step_name = name.to_string();
        let add: ProcessorStepBuilder = Arc::new(move |b: QueryBuilder, keys: &[String]| {
            let build = build.clone();
            b.process(&step_name, keys, move |d| build(d))
        });
        self.processors.processors.insert(name.to_string(), add);
        self
    }

    /// [`PipelineFile::with_processor`] for a processor that also takes an
    /// initial state of type `S`: a file's step names its topic with
    /// `process: {processor, keys, initial_state: {topic, schema}}`
    /// (see [`QueryBuilder::process_with_initial_state`]).
    pub fn with_processor_and_initial_state<P, S, F>(self, name: &str, build: F) -> Self
    where
        P: crate::operators::HandleInitialState<S>,
        S: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(&mut crate::operators::StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        let build = Arc::new(build);
        let seeded_build = build.clone();
        let step_name = name.to_string();
        let seeded: SeededStepBuilder = Arc::new(
            move |b: QueryBuilder, keys: &[String], initial: crate::runtime::JoinInput| {
                let build = seeded_build.clone();
                b.process_with_initial_state::<P, S, _, _>(
                    &step_name,
                    keys,
                    move |d| build(d),
                    initial,
                )
            },
        );
        let mut file = self.with_processor(name, move |d| build(d));
        file.processors.seeded.insert(name.to_string(), seeded);
        file
    }

    /// Registers steps written in Rust on the query builder — any built-in
    /// operator, typed maps, async calls — for the file's `code: <name>`
    /// steps: `add` appends them where the file names them. It replaces
    /// steps registered before under the same name.
    pub fn with_steps(
        mut self,
        name: &str,
        add: impl Fn(QueryBuilder) -> Result<QueryBuilder> + Send + Sync + 'static,
    ) -> Self {
        let add: ProcessorStepBuilder = Arc::new(move |b: QueryBuilder, _: &[String]| add(b));
        self.processors.code_steps.insert(name.to_string(), add);
        self
    }

    /// Adds a `process` or `code` step: what the program registered under
    /// the name the file gives.
    fn add_registered_step(&self, b: QueryBuilder, step: &StepSpec) -> Result<QueryBuilder> {
        Ok(match step {
            StepSpec::Process(ProcessYaml {
                processor,
                keys,
                initial_state: Some(initial),
            }) => match self.processors.seeded.get(processor) {
                _ if self.source.kind != SourceKind::Kafka => {
                    return Err(Error::config(
                        "steps[].process.initial_state",
                        "an initial state is a Kafka topic read beside a Kafka source",
                    ))
                }
                _ if initial.topic.0.iter().any(|t| {
                    self.source.topic.as_ref().is_some_and(|s| s.0.contains(t))
                }) =>
                {
                    return Err(Error::config(
                        "steps[].process.initial_state.topic",
                        "the initial state's topic is the source's own: give it a topic of its own",
                    ))
                }
                Some(add) => {
                    let input = crate::runtime::JoinInput::table(&initial.input_name())
                        .topics(&initial.topic.0)
                        .schema(initial.schema.0.clone());
                    add(b, keys, input)?
                }
                None => {
                    return Err(Error::config(
                        "steps[].process.initial_state",
                        format!(
                            "the processor `{processor}` takes no initial state: a program \
                             registers one that does with \
                             PipelineFile::with_processor_and_initial_state"
                        ),
                    ))
                }
            },
            StepSpec::Process(p) => match self.processors.processors.get(&p.processor) {
                Some(add) => add(b, &p.keys)?,
                None => {
                    return Err(Error::config(
                        "steps[].process.processor",
                        format!(
                            "no processor `{}` is registered; registered: {:?} (a program registers one with PipelineFile::with_processor)",
                            p.processor, self.processors
                        ),
                    ))
                }
            },
            StepSpec::Code(name) => match self.processors.code_steps.get(name) {
                Some(add) => add(b, &[])?,
                None => {
                    return Err(Error::config(
                        "steps[].code",
                        format!(
                            "no steps `{name}` are registered (a program registers them with PipelineFile::with_steps)"
                        ),
                    ))
                }
            },
            _ => b,
        })
    }

    /// Builds the query from the file's settings and steps. Source, sink,
    /// decoder and dead-letter output are the connectors' part.
    pub fn query_builder(&self) -> Result<QueryBuilder> {
        let mut b = crate::runtime::Query::builder(&self.name)
            .watermark_policy(self.multiple_watermark_policy)
            .watermark_scope(self.watermark_scope)
            .output_mode(self.output_mode)
            .trigger(self.trigger.0);
        if let (SourceKind::Kafka, Some(keys)) = (self.source.kind, &self.source.keyed_by) {
            // Known before the steps: a processor seeded from an initial
            // state checks that it runs where the records are.
            b = b.keyed_by(keys);
        }
        if let Some(c) = &self.event_time {
            b = b.event_time(c);
        }
        if let Some(w) = self.watermark {
            b = b.watermark(&w.to_spark_string())?;
        }
        if let Some(t) = self.idle_timeout {
            b = b.idle_timeout(t.0);
        }
        if let Some(clock) = &self.clock {
            b = b.clock(Clock::Virtual(
                clock.batch_times.iter().map(|t| t.0).collect(),
            ));
        }
        if let Some(m) = self.max_records_per_batch {
            b = b.max_records_per_batch(m);
        }
        if self.steps.iter().any(StepSpec::reads_a_second_input) {
            // The main stream's name in progress reports and in the
            // checkpointed watermark (a join or union written in code
            // calls it `main`, as it always has: a stored watermark keeps
            // the name its partitions were checkpointed under).
            let main = match &self.source.topic {
                Some(t) => t.0.join(","),
                None => "main".to_string(),
            };
            b = b
                .main_stream(&main)
                .main_columns(&self.schema().fields().map(|(n, _)| n).collect::<Vec<_>>());
        }
        for step in &self.steps {
            b = match step {
                StepSpec::TableJoin(t) => {
                    let name = t.table_name();
                    let table = crate::runtime::JoinInput::table(&name)
                        .topics(&t.topic.0)
                        .schema(t.schema.0.clone());
                    let keep_unmatched = match t.join_type {
                        crate::operators::JoinType::Inner => false,
                        crate::operators::JoinType::LeftOuter => true,
                        other => {
                            return Err(Error::config(
                                "table_join.type",
                                format!(
                                    "a stream–table join is `inner` or `left_outer` (as in Kafka Streams), not {other:?}"
                                ),
                            ))
                        }
                    };
                    let on: Vec<(&str, &str)> =
                        t.on.iter()
                            .map(|k| (k.left.as_str(), k.right.as_str()))
                            .collect();
                    if t.global {
                        b.join_global_table(table, keep_unmatched, &on)?
                    } else {
                        b.join_table(table, keep_unmatched, &on)?
                    }
                }
                StepSpec::Join(j) => {
                    let mut input = crate::runtime::JoinInput::new(&j.stream_name())
                        .topics(&j.topic.0)
                        .event_time(&j.event_time)
                        .schema(j.schema.0.clone());
                    if let Some(w) = j.watermark {
                        input = input.watermark(&w.to_spark_string())?;
                    }
                    if let Some(keys) = &j.keyed_by {
                        input = input.keyed_by(keys);
                    }
                    input = with_stream_steps(input, &j.steps, "join")?;
                    let time = j.time_condition()?;
                    let on: Vec<(&str, &str)> =
                        j.on.iter()
                            .map(|k| (k.left.as_str(), k.right.as_str()))
                            .collect();
                    b.join(input, j.join_type, &on, time)?
                }
                StepSpec::Union(u) => {
                    let main = self.source.topic.clone().map(|t| t.0).unwrap_or_default();
                    b.union(union_input(u, &main)?)?
                }
                StepSpec::Filter(e) => b.filter(&e.0)?,
                StepSpec::Select(s) => b.select(&s.0),
                StepSpec::WithColumn(w) => b.with_column(&w.name, &w.expr.0)?,
                StepSpec::WindowAggregate(w) => self.window_aggregate_step(b, w)?,
                StepSpec::Dedup(d) if d.within_watermark => {
                    b.drop_duplicates_within_watermark(&d.keys)?
                }
                StepSpec::Dedup(d) => b.drop_duplicates(&d.keys)?,
                StepSpec::Distinct(_) => b.distinct()?,
                StepSpec::Process(_) | StepSpec::Code(_) => self.add_registered_step(b, step)?,
                StepSpec::RollingWindow(r) => {
                    let measures = r
                        .measures
                        .iter()
                        .map(|a| {
                            let m = crate::operators::RollingMeasure::new(a.spec()?);
                            match a.range {
                                Some(d) => m.over(&d.to_spark_string()),
                                None => Ok(m),
                            }
                        })
                        .collect::<Result<Vec<_>>>()?;
                    let mut frontier = crate::operators::FrontierSpec::default();
                    if let Some(f) = &r.frontier {
                        if let Some(d) = f.delay {
                            frontier.delay_micros = tidemark_types::duration::micros(d.0);
                        }
                        if let Some(a) = &f.alias {
                            frontier.alias = a.as_str().into();
                        }
                        if f.basis == FrontierBasisYaml::EventTime {
                            frontier = frontier.on_event_time();
                        }
                    }
                    b.rolling_window(&r.partition_by, r.order_by.as_deref(), frontier, measures)?
                }
            };
        }
        b.plan()
            .check_join_partitioning(self.source.kind == SourceKind::Kafka)?;
        Ok(b)
    }
}

/// A union's second stream as the builder takes it.
fn union_input(u: &UnionYaml, main_topics: &[String]) -> Result<crate::runtime::JoinInput> {
    if let Some(topic) = u.topic.0.iter().find(|t| main_topics.contains(t)) {
        return Err(Error::config(
            "union.topic",
            format!("`{topic}` is the source's own topic: a union reads a second stream (records are routed by topic, so a topic cannot feed both)"),
        ));
    }
    let mut input = crate::runtime::JoinInput::new(&u.stream_name())
        .topics(&u.topic.0)
        .schema(u.schema.0.clone());
    if let Some(column) = &u.event_time {
        input = input.event_time(column);
    }
    if let Some(w) = u.watermark {
        input = input.watermark(&w.to_spark_string())?;
    }
    if let Some(keys) = &u.keyed_by {
        input = input.keyed_by(keys);
    }
    with_stream_steps(input, &u.steps, "union")
}

/// `input` with the stateless `steps` that a `join`'s or `union`'s
/// (`step`) second stream runs before it.
fn with_stream_steps(
    mut input: crate::runtime::JoinInput,
    steps: &[StepSpec],
    step: &str,
) -> Result<crate::runtime::JoinInput> {
    for spec in steps {
        input = match spec {
            StepSpec::Filter(e) => input.filter(&e.0)?,
            StepSpec::Select(s) => input.select(&s.0),
            StepSpec::WithColumn(w) => input.with_column(&w.name, &w.expr.0)?,
            _ => {
                return Err(Error::config(
                    format!("{step}.steps"),
                    format!("only filter, select and with_column run on the {step}'s second stream before the {step}"),
                ))
            }
        };
    }
    Ok(input)
}

/// Splits serde_yaml's `path: message at line L column C` into its parts.
fn split_yaml_message(raw: &str) -> (Option<String>, String) {
    let without_place = match raw.rfind(" at line ") {
        Some(i) => &raw[..i],
        None => raw,
    };
    match without_place.split_once(": ") {
        Some((path, message))
            if !path.contains(' ') && !path.is_empty() && !path.starts_with('`') =>
        {
            (Some(path.to_string()), message.to_string())
        }
        _ => (None, without_place.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::{StageInput, StageOutput};

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// A pipeline file with any of its lines dropped, doubled or cut
        /// short parses or is refused with an error, never a panic (#15).
        #[test]
        fn no_mangled_pipeline_file_panics_the_parser(
            edits in proptest::collection::vec((0usize..40, 0u8..3, 0usize..30), 0..6)
        ) {
            let mut lines: Vec<String> = GOOD.lines().map(str::to_string).collect();
            for (at, edit, cut) in edits {
                if lines.is_empty() {
                    break;
                }
                let at = at % lines.len();
                match edit {
                    0 => {
                        lines.remove(at);
                    }
                    1 => lines.insert(at, lines[at].clone()),
                    _ => {
                        let line = &lines[at];
                        let end = line.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(line.len());
                        lines[at] = line[..end].to_string();
                    }
                }
            }
            if let Ok(file) = PipelineFile::parse(&lines.join("\n")) {
                let _ = file.query_builder();
            }
        }

        /// Any text at all parses or is refused, never a panic.
        #[test]
        fn no_text_panics_the_pipeline_parser(text in "\\PC{0,200}") {
            let _ = PipelineFile::parse(&text);
        }
    }

    const GOOD: &str = r#"name: tumbling-count
source:
  kind: files
  path: batches/
  format: json
  schema: {event_time: timestamp, id: string, amount: double}
clock: {batch_times: ["2026-01-01T10:00:00Z", "2026-01-01T10:01:00Z"]}
event_time: event_time
watermark: 10 minutes
multiple_watermark_policy: min
steps:
  - filter: "amount >= 0"
  - window_aggregate:
      keys: [id]
      window: {tumbling: 5 minutes}
      aggregates:
        - {fn: count, as: count}
        - {fn: sum, column: amount, as: total}
output_mode: append
trigger: available_now
sink: {kind: jsonl, path: out.jsonl}
"#;

    const JOIN: &str = r#"name: ad-clicks
source: {kind: files, path: batches/, topic: impressions}
event_time: impressionTime
watermark: 1 hour
steps:
  - join:
      topic: clicks
      type: left_outer
      on: [{left: impressionAdId, right: clickAdId}]
      event_time: clickTime
      watermark: 2 hours
      between: ["0 seconds", "1 hour"]
sink: {kind: jsonl, path: out.jsonl}
"#;

    #[test]
    fn a_join_step_reads_and_its_mistakes_name_the_line_and_the_choices() {
        let file = PipelineFile::parse(JOIN).unwrap();
        assert_eq!(file.input_topics().unwrap(), vec!["impressions", "clicks"]);
        let described = file.query_builder().unwrap().build().unwrap().describe();
        assert!(described[0].contains("LeftOuter"), "{described:?}");

        let e = PipelineFile::parse(&JOIN.replace("type: left_outer", "type: cross")).unwrap_err();
        assert_eq!(e.line, Some(8), "{e}");
        assert!(
            e.message.contains("left_outer") && e.message.contains("left_semi"),
            "{e}"
        );

        let e = PipelineFile::parse(&JOIN.replace(
            r#"between: ["0 seconds", "1 hour"]"#,
            r#"between: ["0 seconds", "1 hour"]
      window: 10 minutes"#,
        ))
        .unwrap()
        .query_builder()
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("one of `between`, `bounds` or `window`"), "{e}");

        let strict = PipelineFile::parse(&JOIN.replace(
            r#"between: ["0 seconds", "1 hour"]"#,
            r#"bounds: ["> 0 seconds", "< 1 hour"]"#,
        ))
        .unwrap();
        let described = strict.query_builder().unwrap().build().unwrap().describe();
        assert!(
            described[0]
                .contains("clickTime > impressionTime + 0s AND clickTime < impressionTime + 3600s"),
            "{described:?}"
        );
        let e = PipelineFile::parse(&JOIN.replace(
            r#"between: ["0 seconds", "1 hour"]"#,
            r#"bounds: ["0 seconds", "< 1 hour"]"#,
        ))
        .unwrap()
        .query_builder()
        .err()
        .unwrap()
        .to_string();
        assert!(
            e.contains("join.bounds") && e.contains("`>` or `>=`"),
            "{e}"
        );

        let e = PipelineFile::parse(&JOIN.replace("      watermark: 2 hours\n", ""))
            .unwrap()
            .query_builder()
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("both streams"), "{e}");
    }

    const UNION: &str = r#"
name: sales
source: {kind: kafka, topic: sales-us, format: json, schema: {event_time: timestamp, id: string, amount: double}}
event_time: event_time
watermark: 10 minutes
steps:
  - union:
      topic: sales-eu
      name: eu
      watermark: 1 hour
      schema: {event_time: timestamp, id: string, vat: double}
      steps: [{filter: "vat >= 0"}]
  - window_aggregate: {keys: [id], window: {tumbling: 5 minutes}, aggregates: [{fn: count, as: n}]}
output_mode: update
sink: {kind: stdout}
"#;

    #[test]
    fn a_union_step_reads_and_what_it_cannot_do_is_named() {
        let file = PipelineFile::parse(UNION).unwrap();
        assert_eq!(file.input_topics().unwrap(), ["sales-us", "sales-eu"]);
        let described = file.query_builder().unwrap().build().unwrap().describe();
        assert_eq!(
            described[..2],
            ["[eu] Filter [vat >= 0]", "Union [eu] by name"]
        );
        // Update mode is allowed after a union (it is no join); the record
        // keys are unknown, so the grouping is repartitioned.
        assert!(file.topology(true).unwrap().is_repartitioned());

        let e = PipelineFile::parse(&UNION.replace(
            r#"steps: [{filter: "vat >= 0"}]"#,
            "steps: [{dedup: {keys: [id]}}]",
        ))
        .unwrap()
        .query_builder()
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("union.steps"), "{e}");
        let e = PipelineFile::parse(&UNION.replace(
            "watermark: 10 minutes
",
            "",
        ))
        .unwrap()
        .query_builder()
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("`watermark`") && e.contains("eu"), "{e}");
        let e = PipelineFile::parse(&UNION.replace(
            "      name: eu
",
            "      nmae: eu
",
        ))
        .unwrap_err();
        assert!(e.message.contains("nmae"), "{e}");

        let refused = |from: &str, to: &str| {
            let text = UNION.replace(from, to);
            assert_ne!(text, UNION, "`{from}` not found");
            PipelineFile::parse(&text)
                .unwrap()
                .query_builder()
                .err()
                .unwrap()
                .to_string()
        };
        let e = refused("topic: sales-eu", "topic: sales-us");
        assert!(e.contains("union.topic") && e.contains("sales-us"), "{e}");
        let e = refused("name: eu\n", "name: eu\n      event_time: ts\n");
        assert!(e.contains("union.event_time") && e.contains("`ts`"), "{e}");
        let e = refused(
            "steps:\n  - union:",
            "steps:\n  - dedup: {keys: [id]}\n  - union:",
        );
        assert!(e.contains("after a stateful step"), "{e}");
        // A join with a union, in either order, is refused as that
        // combination, not with advice that leads to the other refusal.
        let table_join =
            "  - table_join: {topic: rates, on: [id], schema: {id: string, rate: double}}\n";
        for (from, to) in [
            (
                "steps:\n  - union:",
                format!("steps:\n{table_join}  - union:"),
            ),
            (
                "  - window_aggregate:",
                format!("{table_join}  - window_aggregate:"),
            ),
        ] {
            let e = refused(from, &to);
            assert!(e.contains("a union and a join"), "{e}");
        }
    }

    #[test]
    fn a_join_keyed_otherwise_splits_into_two_writers_and_a_reader() {
        let text = JOIN
            .replace(
                "source: {kind: files, path: batches/, topic: impressions}",
                "source: {kind: kafka, topic: impressions, keyed_by: [impressionId], group: g}",
            )
            .replace(
                "      watermark: 2 hours\n",
                "      watermark: 2 hours\n      keyed_by: [clickId]\n",
            );
        let file = PipelineFile::parse(&text).unwrap();
        let mut stages = file.topology(true).unwrap().stages;
        assert_eq!(stages.len(), 3);
        let reader = stages.pop().unwrap();
        let (left, right) = (&stages[0], &stages[1]);
        assert_eq!(left.name, "ad-clicks-left-repartition-writer");
        assert_eq!(left.input, StageInput::Source);
        assert_eq!(
            left.output,
            StageOutput::Repartition {
                topic: "ad-clicks-left-repartition".into(),
                keys: vec!["impressionAdId".into()]
            }
        );
        assert_eq!(
            right.input,
            StageInput::Joined {
                stream: "clicks".into(),
                topics: vec!["clicks".into()],
                schema: file.query_builder().unwrap().plan().second_inputs()[0]
                    .schema
                    .clone(),
            }
        );
        assert_eq!(
            right.output,
            StageOutput::Repartition {
                topic: "ad-clicks-right-repartition".into(),
                keys: vec!["clickAdId".into()]
            }
        );
        assert!(right.query.plan().joined_topics().is_empty());
        assert_eq!(reader.name, "ad-clicks");
        assert_eq!(reader.output, StageOutput::Sink);
        assert_eq!(
            reader.input,
            StageInput::Repartition {
                topic: "ad-clicks-left-repartition".into(),
                keys: vec!["impressionAdId".into()]
            }
        );
        assert_eq!(
            reader.query.plan().joined_topics(),
            vec![(
                "clicks".to_string(),
                vec!["ad-clicks-right-repartition".to_string()]
            )]
        );
        let described = reader.query.build().unwrap().describe();
        assert!(described[0].contains("clicks."), "{described:?}");
        // Keyed by the join keys and co-partitioned: one stage. Not
        // co-partitioned (the broker says so): repartitioned all the same.
        let keyed = JOIN.replace(
            "source: {kind: files, path: batches/, topic: impressions}",
            "source: {kind: kafka, topic: impressions, keyed_by: [impressionAdId]}",
        );
        let file = PipelineFile::parse(&keyed).unwrap();
        assert_eq!(file.topology(true).unwrap().stages.len(), 1);
        assert_eq!(file.topology(false).unwrap().stages.len(), 3);
        // After a repartitioned join the rows are keyed by the join keys,
        // not by the source's record key: grouping by the record key alone
        // would spread its groups over tasks.
        let grouped = text.replace("sink:", "  - dedup: {keys: [impressionId]}\nsink:");
        let e = PipelineFile::parse(&grouped)
            .unwrap()
            .topology(true)
            .err()
            .expect("a grouping off the join keys after a repartitioned join");
        assert!(e.to_string().contains("join keys"), "{e}");
        let by_join_key = grouped.replace(
            "keys: [impressionId]",
            "keys: [impressionAdId, impressionId]",
        );
        assert!(PipelineFile::parse(&by_join_key)
            .unwrap()
            .topology(true)
            .is_ok());
    }

    #[test]
    fn max_by_needs_by_and_only_max_by_and_min_by_take_it() {
        let aggregate = |entry: &str| {
            serde_yaml::from_str::<AggregateYaml>(entry)
                .unwrap()
                .spec()
                .map(|s| s.output.to_string())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            aggregate("{fn: max_by, column: auction, by: price}").unwrap(),
            "max_by(auction, price)"
        );
        let e = aggregate("{fn: max_by, column: auction}").unwrap_err();
        assert!(e.contains("`by`") && e.contains("aggregates.by"), "{e}");
        let e = aggregate("{fn: sum, column: price, by: auction}").unwrap_err();
        assert!(e.contains("max_by and min_by"), "{e}");
    }

    #[test]
    fn reads_the_documented_example() {
        let file = PipelineFile::parse(GOOD).unwrap();
        assert_eq!(file.steps.len(), 2);
        assert_eq!(file.trigger.0, Trigger::AvailableNow);
        let query = file.query_builder().unwrap().build().unwrap();
        assert_eq!(query.describe().len(), 2);
    }

    fn error_for(from: &str, to: &str) -> PipelineError {
        let text = GOOD.replace(from, to);
        assert_ne!(text, GOOD, "replacement `{from}` not found");
        PipelineError::clone(&PipelineFile::parse(&text).unwrap_err())
    }

    #[test]
    fn environment_variables_fill_string_values_and_an_unset_one_is_named() {
        let text = "name: demo\nsource:\n  kind: kafka\n  topic: t\n  properties: {sasl.password: \"${PW}\", client.id: \"${ID:-app}\"}\nsink: {kind: stdout}\n";
        let env = |name: &str| (name == "PW").then(|| "s3cr\"et: #x".to_string());
        let file = PipelineFile::parse_with_env(text, &env).unwrap();
        assert_eq!(file.source.properties["sasl.password"], "s3cr\"et: #x");
        assert_eq!(file.source.properties["client.id"], "app");
        let error = PipelineFile::parse_with_env(text, &|_| None).unwrap_err();
        assert_eq!(error.line, Some(5), "{error}");
        assert!(error.message.contains("`PW` is not set"), "{error}");
    }

    #[test]
    fn errors_name_line_and_fix() {
        let e = error_for("watermark: 10 minutes", "watermark: 10 fortnights");
        assert_eq!(e.line, Some(9), "{e}");
        assert!(e.message.contains("unknown unit"), "{e}");

        let e = error_for(
            "multiple_watermark_policy: min",
            "multiple_watermark_polcy: min",
        );
        assert_eq!(e.line, Some(10), "{e}");
        assert!(e.message.contains("unknown field"), "{e}");

        let e = error_for("amount: double", "amount: decimal");
        assert_eq!(e.line, Some(6), "{e}");
        assert!(e.message.contains("allowed: string"), "{e}");

        let e = error_for("{fn: count, as: count}", "{fn: median, as: count}");
        assert_eq!(e.line, Some(17), "{e}");

        let e = error_for(
            "{tumbling: 5 minutes}",
            "{sliding: 5 minutes, slide: 10 minutes}",
        );
        assert_eq!(e.line, Some(15), "{e}");
        assert!(e.message.contains("slide"), "{e}");

        let e = error_for("\"amount >= 0\"", "\"amount >= \"");
        assert_eq!(e.line, Some(12), "{e}");

        let e = error_for("watermark: 10 minutes", "watermark: 1 month");
        assert!(e.message.contains("months and years"), "{e}");
    }

    const ROLLING: &str = r#"
name: fraud
source: {kind: kafka, topic: payments, schema: {ts: timestamp, card: string, amount: double}}
event_time: ts
steps:
  - rolling_window:
      partition_by: [card]
      frontier: {delay: 0 seconds, alias: frontier}
      measures: [{fn: sum, column: amount, range: 10 minutes, as: sum_10m}, {fn: count, column: amount, as: n}]
output_mode: update
trigger: {real_time: 5 minutes}
sink: {kind: kafka, topic: alerts}
"#;

    #[test]
    fn rolling_windows_and_the_real_time_trigger_read_and_check() {
        let file = PipelineFile::parse(ROLLING).unwrap();
        assert_eq!(
            file.trigger.0,
            Trigger::RealTime {
                checkpoint_interval: std::time::Duration::from_secs(300)
            }
        );
        let query = file.query_builder().unwrap().build().unwrap();
        assert!(
            query.describe()[0].contains("sum_10m over 10 minutes"),
            "{:?}",
            query.describe()
        );

        let append = ROLLING.replace("output_mode: update", "output_mode: append");
        let err = PipelineFile::parse(&append)
            .unwrap()
            .query_builder()
            .unwrap()
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("only update output mode"), "{err}");

        let exactly_once = ROLLING.replace(
            "name: fraud",
            "name: fraud\nprocessing_guarantee: exactly_once",
        );
        let err = PipelineFile::parse(&exactly_once).unwrap_err().to_string();
        assert!(err.contains("at-least-once"), "{err}");

        let event_time_without_watermark =
            ROLLING.replace("alias: frontier}", "alias: frontier, basis: event_time}");
        let err = PipelineFile::parse(&event_time_without_watermark)
            .unwrap()
            .query_builder()
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("follows the watermark"), "{err}");

        let range_in_window_aggregate = GOOD.replace(
            "{fn: count, as: count}",
            "{fn: count, as: count, range: 1 minute}",
        );
        let err = PipelineFile::parse(&range_in_window_aggregate)
            .unwrap()
            .query_builder()
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("rolling_window measures"), "{err}");

        for (time, ok) in [("event_time", true), ("window", false), ("amount", false)] {
            let file = GOOD.replace(
                "window: {tumbling: 5 minutes}",
                &format!("window: {{tumbling: 5 minutes}}\n      time: {time}"),
            );
            let built = PipelineFile::parse(&file).unwrap().query_builder();
            match (built, ok) {
                (Ok(_), true) => {}
                (Err(e), false) => assert!(
                    e.to_string().contains("window_aggregate.time"),
                    "{time}: {e}"
                ),
                (Ok(_), false) => panic!("time: {time} accepted"),
                (Err(e), true) => panic!("time: {time} refused: {e}"),
            }
        }
    }

    #[test]
    fn a_grouping_off_the_record_key_splits_at_the_repartition_topic() {
        let text = r#"
application_id: orders
source: {kind: kafka, topic: in, group: g, schema: {event_time: timestamp, region: string}}
event_time: event_time
watermark: 1 minute
steps:
  - filter: "region is not null"
  - window_aggregate: {keys: [region], window: {tumbling: 1 minute}, aggregates: [{fn: count}]}
sink: {kind: kafka, topic: out}
state_dir: state
processing_guarantee: exactly_once
"#;
        let file = PipelineFile::parse(text).unwrap();
        assert_eq!(file.name, "orders");
        assert_eq!(file.state_spec().unwrap().dir, "state");
        let mut stages = file.topology(true).unwrap().stages;
        assert_eq!(stages.len(), 2);
        let reader = stages.pop().unwrap();
        let writer = stages.pop().unwrap();
        assert_eq!(writer.name, "orders-repartition-writer");
        assert_eq!(writer.input, StageInput::Source);
        assert_eq!(writer.query.build().unwrap().describe().len(), 1);
        assert_eq!(reader.name, "orders");
        assert_eq!(reader.output, StageOutput::Sink);
        assert_eq!(
            reader.input,
            StageInput::Repartition {
                topic: "orders-op1-repartition".into(),
                keys: vec!["region".into()]
            }
        );
        let described = reader.query.build().unwrap().describe();
        assert_eq!(described.len(), 1, "{described:?}");
        let split_keys = |text: &str| {
            let stages = PipelineFile::parse(text)
                .unwrap()
                .topology(true)
                .unwrap()
                .stages;
            match &stages[0].output {
                StageOutput::Repartition { keys, .. } => Some(keys.clone()),
                StageOutput::Sink => None,
            }
        };
        assert_eq!(split_keys(text), Some(vec!["region".to_string()]));

        let keyed = text.replace("group: g,", "group: g, keyed_by: [region],");
        assert_eq!(split_keys(&keyed), None);
        // Grouping by the record key and more: each group is still in one
        // partition. By part of a composite key: it is not.
        let wider = keyed.replace("keys: [region]", "keys: [region, event_time]");
        assert_eq!(split_keys(&wider), None);
        // A step that rewrites the key column before the grouping: the rows
        // are no longer partitioned by what the grouping reads.
        let rewritten = keyed.replace(
            "  - filter: \"region is not null\"",
            "  - with_column: {name: region, expr: \"'all'\"}",
        );
        assert!(split_keys(&rewritten).is_some());
        let renamed = keyed
            .replace(
                "schema: {event_time: timestamp, region: string}",
                "schema: {event_time: timestamp, region: string, shop: string}",
            )
            .replace(
                "  - filter: \"region is not null\"",
                "  - select: {event_time: event_time, area: region, region: shop}",
            );
        assert_eq!(
            split_keys(&renamed),
            Some(vec!["region".to_string()]),
            "region now holds the shop"
        );
        let carried = renamed.replace("keys: [region]", "keys: [area]");
        assert_eq!(split_keys(&carried), None);
        let narrower = text.replace("group: g,", "group: g, keyed_by: [region, shop],");
        assert_eq!(split_keys(&narrower), Some(vec!["region".to_string()]));
        // The files source has one partition: never split.
        let files = text
            .replace(
                "{kind: kafka, topic: in, group: g,",
                "{kind: files, path: in,",
            )
            .replace("exactly_once", "at_least_once");
        assert_eq!(split_keys(&files), None);
        let both = format!("{text}state: {{dir: s}}\n");
        assert!(PipelineFile::parse(&both)
            .unwrap_err()
            .message
            .contains("state_dir"));
    }

    #[test]
    fn a_grouping_after_a_join_must_include_the_join_keys() {
        let text = r#"
name: q8
source: {kind: kafka, topic: persons, schema: {id: long, name: string, dateTime: timestamp}}
event_time: dateTime
watermark: 4 seconds
steps:
  - join:
      topic: auctions
      on: [{left: id, right: seller}]
      event_time: dateTime
      watermark: 4 seconds
      window: 10 seconds
      schema: {seller: long, dateTime: timestamp}
  - dedup: {keys: [id, window_start]}
sink: {kind: kafka, topic: out}
"#;
        let file = PipelineFile::parse(text).unwrap();
        file.query_builder().unwrap();
        let off_key = text.replace("keys: [id, window_start]", "keys: [name, window_start]");
        let err = PipelineFile::parse(&off_key)
            .unwrap()
            .query_builder()
            .err()
            .expect("a grouping off the join keys")
            .to_string();
        assert!(err.contains("`source.keyed_by`), [\"id\"]"), "{err}");
        let rewritten = text.replace(
            "  - dedup:",
            "  - with_column: {name: id, expr: \"id % 10\"}\n  - dedup:",
        );
        assert!(PipelineFile::parse(&rewritten)
            .unwrap()
            .query_builder()
            .is_err());
        // A right outer join's unmatched auctions have a null `id`: only
        // their `seller` keeps them in one partition.
        let outer = text.replace("on: [{left: id", "type: right_outer\n      on: [{left: id");
        let check = |t: &str| PipelineFile::parse(t).unwrap().query_builder().map(|_| ());
        assert!(check(&outer).is_err());
        assert!(check(&outer.replace(
            "keys: [id, window_start]",
            "keys: [id, seller, window_start]"
        ))
        .is_ok());
        let same_name = outer
            .replace("{left: id, right: seller}", "id")
            .replace("{seller: long,", "{id: long,");
        assert!(
            check(&same_name).is_ok(),
            "a key named alike is filled from the right"
        );
    }

    #[test]
    fn missing_source_is_reported() {
        let text: String = GOOD
            .lines()
            .filter(|l| !l.starts_with("source") && !l.starts_with("  "))
            .collect::<Vec<_>>()
            .join("\n");
        let e = PipelineFile::parse(&text).unwrap_err();
        assert!(e.message.contains("missing field `source`"), "{e}");
    }

    /// The file's one client configuration and the registry's credentials
    /// parse, and no secret survives `Debug` (which logs and errors use).
    #[test]
    fn kafka_and_registry_sections_parse_and_debug_masks_their_secrets() {
        let text = "name: sec\nkafka:\n  bootstrap: b:9093\n  properties: {security.protocol: SASL_SSL, sasl.password: \"${PW}\"}\nschema_registry: {url: \"https://r:8081\", properties: {basic.auth.user.info: \"u:${PW}\"}}\nsource: {kind: kafka, topic: t, format: avro}\nsink: {kind: stdout}\ndead_letter: {kind: kafka, topic: d, properties: {ssl.key.password: \"${PW}\"}}\n";
        let lookup = |name: &str| (name == "PW").then(|| "hunter2-secret".to_string());
        let file = PipelineFile::parse_with_env(text, &lookup).unwrap();
        let kafka = file.kafka.as_ref().unwrap();
        assert_eq!(kafka.bootstrap.as_deref(), Some("b:9093"));
        assert_eq!(kafka.properties["sasl.password"], "hunter2-secret");
        let registry = file.schema_registry.as_ref().unwrap();
        assert_eq!(
            registry.properties["basic.auth.user.info"],
            "u:hunter2-secret"
        );
        let shown = format!("{file:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("SASL_SSL"), "{shown}");
        let url_only = "name: r\nschema_registry: http://r:8081\nsource: {kind: kafka, topic: t}\nsink: {kind: stdout}\n";
        let file = PipelineFile::parse(url_only).unwrap();
        assert_eq!(file.schema_registry.unwrap().url, "http://r:8081");
    }

    /// The HTTP services' tokens never show in `Debug` either.
    #[test]
    fn serve_ui_and_metrics_tokens_are_masked() {
        let text = "name: t\nsource: {kind: kafka, topic: t}\nsink: {kind: stdout}\nserve: {listen: \"127.0.0.1:1\", auth_token: \"${TOKEN}\"}\nui: {listen: \"127.0.0.1:2\", auth_token: \"${TOKEN}\"}\nmetrics: {prometheus: \"127.0.0.1:3\", auth_token: \"${TOKEN}\", tls: {cert: c.pem, key: k.pem}}\n";
        let lookup = |name: &str| (name == "TOKEN").then(|| "hunter2-token".to_string());
        let file = PipelineFile::parse_with_env(text, &lookup).unwrap();
        assert_eq!(
            file.serve.as_ref().unwrap().auth_token.as_deref(),
            Some("hunter2-token")
        );
        assert_eq!(
            file.metrics.as_ref().unwrap().auth_token.as_deref(),
            Some("hunter2-token")
        );
        let shown = format!("{file:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }

    /// Standby replicas are fed by the changelog: asked for without one,
    /// the file is refused naming the setting.
    #[test]
    fn standbys_without_a_changelog_are_refused() {
        let text = |changelog: &str| {
            format!("name: s\nsource: {{kind: kafka, topic: t}}\nsink: {{kind: stdout}}\nstate: {{dir: st, num_standby_replicas: 1{changelog}}}\n")
        };
        let e = PipelineFile::parse(&text(", changelog: false")).unwrap_err();
        assert!(e.message.contains("state.num_standby_replicas"), "{e}");
        PipelineFile::parse(&text("")).unwrap();
    }
}
