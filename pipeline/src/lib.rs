//! The pipeline file: a YAML description of a query that the `tidemark` CLI
//! runs without any Rust. See `docs/pipeline-file.md` for every key.
//!
//! Values are checked while the file is read, so an error names the line and
//! column of the offending key together with what is allowed. A file lowers
//! through the same [`QueryBuilder`](tidemark::runtime::QueryBuilder) a
//! Rust program calls ([`PipelineFile::query_builder`]); the connectors it
//! names are wired by `tidemark-connectors`. The core crate knows no YAML and no connector's
//! vocabulary: they live here.
#![deny(missing_docs)]

mod checks;
mod describe;
mod env_vars;
mod errors;
mod lower;
mod serve;
mod sink;
mod source;
mod state;
mod steps;
#[cfg(test)]
mod tests;
mod values;
mod yaml_paths;

pub use errors::PipelineError;
pub use serve::{MetricsSpec, ServeSpec, TlsSpec, UiSpec};
pub use sink::{
    DeadLetterKind, DeadLetterSpec, DeltaMode, ProcessingGuarantee, SinkKind, SinkSpec,
};
pub use source::{
    ClockSpec, Format, KafkaSpec, RegistrySpec, SchemaSpec, SourceKind, SourceSpec,
    StartingOffsets, SubjectNameStrategySpec, TopicList,
};
pub use state::StateSpec;
pub use steps::{
    AggregateName, AggregateYaml, DedupYaml, DistinctYaml, ExprSpec, Fraction, FrontierBasisYaml,
    FrontierYaml, InitialStateYaml, JoinKeyYaml, JoinYaml, ProcessYaml, ProcessorStepBuilder,
    Processors, RollingWindowSpec, SeededStepBuilder, SelectSpec, StepSpec, TableJoinYaml,
    UnionYaml, WindowAggregateSpec, WindowYaml, WithColumnSpec,
};
pub use values::{DurationSpec, TimestampSpec, TriggerSpec};

use crate::errors::{env_var_error, line_of_key, yaml_error};
use serde::Deserialize;
use tidemark::error::{Error, Result};
use tidemark::operators::OutputMode;
use tidemark::schema::Schema;
use tidemark::test_driver::PipelineTestDriver;
use tidemark::watermark::WatermarkPolicy;

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
    pub watermark_scope: tidemark::watermark::WatermarkScope,
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

/// A test driver ([`PipelineTestDriver`], Kafka Streams'
/// `TopologyTestDriver`) for the pipeline file `text`: its steps,
/// watermarks and output mode; records decoded by its schemas (a joined or
/// unioned stream's by its own, by topic). Its source and sink are the
/// driver's.
///
/// ```
/// let run = tidemark_pipeline::test_driver(r#"
/// name: counts
/// source: {kind: kafka, topic: events, schema: {t: timestamp, id: string}}
/// event_time: t
/// watermark: 10 minutes
/// steps:
///   - window_aggregate: {keys: [id], window: {tumbling: 5 minutes}, aggregates: [{fn: count, as: n}]}
/// output_mode: append
/// sink: {kind: stdout}
/// "#)
/// .unwrap()
/// .batch_at("2026-01-01T11:00:00Z")
/// .pipe("events", r#"{"t": "2026-01-01T10:01:00Z", "id": "a"}"#)
/// .pipe("events", r#"{"t": "2026-01-01T10:20:00Z", "id": "a"}"#)
/// .batch_at("2026-01-01T11:01:00Z")
/// .run()
/// .unwrap();
/// // Batch 0 moved the watermark to 10:10; in batch 1 it closed 10:00-10:05.
/// assert_eq!(run.output_json(), [serde_json::json!(
///     {"batch_id": 1, "id": "a", "window_start": "2026-01-01T10:00:00Z",
///      "window_end": "2026-01-01T10:05:00Z", "n": 1})]);
/// ```
pub fn test_driver(text: &str) -> Result<PipelineTestDriver> {
    let file = PipelineFile::parse(text).map_err(|e| Error::config("pipeline", e.to_string()))?;
    file.test_driver()
}

impl PipelineFile {
    /// The pipeline's topology, as `tidemark describe` prints it (Kafka
    /// Streams' `Topology#describe`): its watermark, each stage's
    /// processors and stores (with their changelog topics), split at
    /// repartition topics.
    pub fn describe(&self) -> Result<tidemark::topology::TopologyDescription> {
        describe::describe_pipeline(self)
    }

    /// Reads and checks a pipeline file's text.
    ///
    /// ```
    /// let file = tidemark_pipeline::PipelineFile::parse(r#"
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
            watermark_scope: tidemark::watermark::WatermarkScope::default(),
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

    /// The topics the source reads: its own and those of the inputs its
    /// steps read beside it (joined streams and tables, unions' streams,
    /// initial states; not global tables, which every task reads whole).
    pub fn input_topics(&self) -> Result<Vec<String>> {
        let mut topics = self.source.topic.clone().map(|t| t.0).unwrap_or_default();
        for input in self.query_builder()?.plan().second_inputs() {
            if input.kind != tidemark::runtime::SecondInputKind::GlobalTable {
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
}
