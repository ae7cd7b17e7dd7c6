//! The `source:` section: Kafka (its client settings and schema
//! registry), files, the test source; formats and schemas.

use crate::{DurationSpec, TimestampSpec};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use tidemark::error::{Error, Result};
use tidemark::schema::{FieldType, Schema};
use tidemark::secrets::Properties;

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
            .field("url", &tidemark::secrets::mask_url(&self.url))
            .field("properties", &self.properties)
            .finish()
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

/// `clock: {batch_times: [...]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClockSpec {
    /// RFC 3339 processing time of batch 0, 1, ...
    pub batch_times: Vec<TimestampSpec>,
}

fn default_fail_on_data_loss() -> bool {
    true
}

fn default_static_membership() -> bool {
    true
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
