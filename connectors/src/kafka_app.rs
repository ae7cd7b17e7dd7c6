//! A Kafka application in one chain of calls, from Rust: topic in, steps
//! (a user's stateful processor among them), topic out, with state,
//! changelogs, exactly-once and the dead-letter topic set on it — no
//! pipeline file written or edited.
//!
//! The settings land in the same checked model a pipeline file is read
//! into ([`PipelineFile`]), so both run through one wiring: the same
//! source, decoder, state backend, transactions and restarts.

use crate::{PipelineRunner, RunningPipeline};
use serde_json::{json, Map, Value as Json};
use std::path::PathBuf;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::operators::{OutputMode, StateDeclarations, StatefulProcessor};
use tidemark::pipeline::PipelineFile;
use tidemark::watermark::WatermarkScope;

/// Registers a processor on the file once it is built.
type Registration = Box<dyn FnOnce(PipelineFile) -> PipelineFile + Send>;

/// A Kafka application being assembled (see the module documentation).
///
/// ```no_run
/// use tidemark_connectors::KafkaApp;
/// let running = KafkaApp::new("orders-per-user")
///     .bootstrap("127.0.0.1:9092")
///     .input("orders", &[("user", "string"), ("amount", "double")])
///     .filter("amount > 0")
///     .to_topic("big-orders", &["user"])
///     .start()
///     .unwrap();
/// running.stop();
/// ```
pub struct KafkaApp {
    settings: Map<String, Json>,
    steps: Vec<Json>,
    registrations: Vec<Registration>,
    base: PathBuf,
    /// The first mistake made while assembling, reported by `build`.
    mistake: Option<Error>,
    /// Creates the output topic when missing.
    create_output_topic: bool,
    /// The input's columns traced from its type (see [`KafkaApp::stream`]):
    /// the schema is written at `build`, once the event-time column is
    /// known.
    typed_input: Option<Vec<(String, &'static str)>>,
}

impl KafkaApp {
    /// An application named `application_id`: its consumer group,
    /// transactional ids, changelog and internal topic prefix, state
    /// directory name (Kafka Streams' `application.id`).
    pub fn new(application_id: &str) -> Self {
        let mut settings = Map::new();
        settings.insert("name".into(), application_id.into());
        settings.insert("source".into(), json!({"kind": "kafka"}));
        settings.insert("sink".into(), json!({"kind": "stdout"}));
        KafkaApp {
            settings,
            steps: Vec::new(),
            registrations: Vec::new(),
            base: PathBuf::from("."),
            mistake: None,
            create_output_topic: false,
            typed_input: None,
        }
    }

    fn section(&mut self, name: &str) -> &mut Map<String, Json> {
        let entry = self
            .settings
            .entry(name.to_string())
            .or_insert_with(|| json!({}));
        if !entry.is_object() {
            *entry = json!({});
        }
        entry.as_object_mut().expect("an object")
    }

    /// The cluster's bootstrap servers (default: `KAFKA_BOOTSTRAP`, else
    /// `127.0.0.1:9092`).
    pub fn bootstrap(mut self, servers: &str) -> Self {
        self.section("kafka")
            .insert("bootstrap".into(), servers.into());
        self
    }

    /// A librdkafka property every client of the application gets
    /// (`security.protocol`, `sasl.*`, `ssl.*`); secrets are masked
    /// wherever the settings are shown.
    pub fn property(mut self, name: &str, value: &str) -> Self {
        let kafka = self.section("kafka");
        let properties = kafka.entry("properties").or_insert_with(|| json!({}));
        if let Some(map) = properties.as_object_mut() {
            map.insert(name.into(), value.into());
        }
        self
    }

    /// Reads JSON records of `topic` with these `(column, type)` fields
    /// (`string`, `long`, `double`, `boolean`, `timestamp`); from the
    /// earliest offset when the group has none.
    pub fn input(mut self, topic: &str, schema: &[(&str, &str)]) -> Self {
        self.typed_input = None;
        let source = self.section("source");
        source.insert("topic".into(), topic.into());
        source.insert("schema".into(), schema_object(schema));
        self
    }

    /// Reads JSON records of `topic` as the user's type `T`: its fields are
    /// the columns (traced from its `Deserialize` by
    /// [`tidemark::typed_columns`]: strings, numbers, booleans, `Option`s
    /// of them, enums of unit variants; a string field named as the event
    /// time is read as a time, and `chrono::DateTime` fields read their
    /// text). A record whose field holds a value of another type is a dead
    /// letter naming the field; a field missing from a record is null (an
    /// `Option` field reads `None`; a typed step reading any other type
    /// refuses that row as a dead letter).
    ///
    /// ```no_run
    /// # use tidemark_connectors::KafkaApp;
    /// #[derive(serde::Deserialize)]
    /// struct Tx { card: String, ts: String, amount: f64, status: String }
    /// let app = KafkaApp::new("cards").stream::<Tx>("card-transactions");
    /// ```
    pub fn stream<T: serde::de::DeserializeOwned>(mut self, topic: &str) -> Self {
        match tidemark::typed_columns::columns_of::<T>() {
            Ok(columns) => self.typed_input = Some(columns),
            Err(reason) => {
                self.mistake.get_or_insert(Error::config(
                    "source.schema",
                    format!(
                        "the columns of {} cannot be traced: {reason}; give them with \
                         `input(topic, schema)` instead",
                        std::any::type_name::<T>()
                    ),
                ));
            }
        }
        self.section("source").insert("topic".into(), topic.into());
        self
    }

    /// The columns the input's record key is made of: a grouping by them
    /// runs where the records are, without a repartition topic.
    pub fn keyed_by(mut self, columns: &[&str]) -> Self {
        self.section("source")
            .insert("keyed_by".into(), json!(columns));
        self
    }

    /// The event-time column and the watermark's delay (`"1 minute"`).
    pub fn event_time(mut self, column: &str, watermark_delay: &str) -> Self {
        self.settings.insert("event_time".into(), column.into());
        self.settings
            .insert("watermark".into(), watermark_delay.into());
        self
    }

    /// One watermark per input partition instead of one per stream.
    pub fn watermark_scope(mut self, scope: WatermarkScope) -> Self {
        let text = match scope {
            WatermarkScope::Partition => "partition",
            WatermarkScope::Query => "query",
        };
        self.settings.insert("watermark_scope".into(), text.into());
        self
    }

    /// Keeps rows for which `condition` (Spark SQL) is true.
    pub fn filter(mut self, condition: &str) -> Self {
        self.steps.push(json!({ "filter": condition }));
        self
    }

    /// Adds the column `name` computed by `expression` (Spark SQL).
    pub fn with_column(mut self, name: &str, expression: &str) -> Self {
        self.steps
            .push(json!({ "with_column": {"name": name, "expr": expression} }));
        self
    }

    /// Runs a user's stateful processor per key of `keys` (see
    /// [`tidemark::operators::processor`]); `build` makes each task's
    /// processor and declares its states.
    pub fn process<P, F>(self, name: &str, keys: &[&str], build: F) -> Self
    where
        P: StatefulProcessor,
        F: Fn(&mut StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        let owned = name.to_string();
        self.push_process(
            name,
            keys,
            None,
            Box::new(move |file: PipelineFile| file.with_processor(&owned, build)),
        )
    }

    /// [`process`](Self::process) with the processor's state seeded from
    /// `topic` (Spark's `initialState`): its JSON records, of these
    /// `(column, type)` fields (the `keys` columns among them), are read
    /// as `S` and handed to
    /// [`HandleInitialState::handle_initial_state`](tidemark::operators::HandleInitialState)
    /// before the key's rows of their batch. The topic is co-partitioned
    /// with the input (keyed alike, as many partitions), and the input is
    /// keyed by the processor's keys ([`keyed_by`](Self::keyed_by)).
    pub fn process_with_initial_state<P, S, F>(
        self,
        name: &str,
        keys: &[&str],
        build: F,
        topic: &str,
        schema: &[(&str, &str)],
    ) -> Self
    where
        P: tidemark::operators::HandleInitialState<S>,
        S: serde::de::DeserializeOwned + Send + 'static,
        F: Fn(&mut StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        let initial = json!({"topic": topic, "schema": schema_object(schema)});
        let owned = name.to_string();
        self.push_process(
            name,
            keys,
            Some(initial),
            Box::new(move |file: PipelineFile| {
                file.with_processor_and_initial_state::<P, S, _>(&owned, build)
            }),
        )
    }

    /// Adds a `process` step and the registration that builds it; two
    /// processors of one name are a mistake.
    fn push_process(
        mut self,
        name: &str,
        keys: &[&str],
        initial_state: Option<Json>,
        register: Registration,
    ) -> Self {
        let taken = self
            .steps
            .iter()
            .any(|s| s["process"]["processor"].as_str() == Some(name));
        if taken {
            self.mistake.get_or_insert(Error::config(
                "process",
                format!("two processors are named `{name}`: give each its own name"),
            ));
        }
        let mut step = json!({"processor": name, "keys": keys});
        if let Some(initial) = initial_state {
            step["initial_state"] = initial;
        }
        self.steps.push(json!({ "process": step }));
        self.registrations.push(register);
        self
    }

    /// Adds steps written on the query builder — any built-in operator
    /// (`window_aggregate`, `rolling_window`, `drop_duplicates`, joins…),
    /// typed maps, async calls — at this point of the application:
    ///
    /// ```no_run
    /// # use tidemark_connectors::KafkaApp;
    /// use tidemark::prelude::*;
    /// let app = KafkaApp::new("per-user")
    ///     .input("clicks", &[("user", "string"), ("ts", "timestamp")])
    ///     .event_time("ts", "1 minute")
    ///     .steps(|q| Ok(q.window_aggregate(["user"], tumbling("5 minutes")?, vec![count()])))
    ///     .to_topic("clicks-per-user", &["user"]);
    /// ```
    pub fn steps(
        mut self,
        add: impl Fn(tidemark::runtime::QueryBuilder) -> Result<tidemark::runtime::QueryBuilder>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        let name = format!("steps-{}", self.steps.len());
        self.steps.push(json!({ "code": name }));
        self.registrations.push(Box::new(move |file: PipelineFile| {
            file.with_steps(&name, add)
        }));
        self
    }

    /// The real-time trigger: each record processed as it arrives, state
    /// and offsets checkpointed every `checkpoint_interval` (update output
    /// mode).
    pub fn real_time(mut self, checkpoint_interval: Duration) -> Self {
        let text = tidemark::duration::format_duration(checkpoint_interval);
        self.settings
            .insert("trigger".into(), json!({ "real_time": text }));
        self
    }

    /// Processes what is there now in batches, then stops (Spark's
    /// `Trigger.AvailableNow`).
    pub fn available_now(mut self) -> Self {
        self.settings
            .insert("trigger".into(), "available_now".into());
        self
    }

    /// Caps the records of one batch.
    pub fn max_records_per_batch(mut self, max: usize) -> Self {
        self.settings
            .insert("max_records_per_batch".into(), max.into());
        self
    }

    /// Writes rows as JSON to `topic`, each as the user's type `U` writes
    /// itself: its field names, order and formats, a text that looks like
    /// a time left as text (the JSON of a `U` whose fields are columns:
    /// strings, numbers, booleans; a nested value is written as its JSON
    /// text). Keyed by the `key` fields. A row that does not read into `U`
    /// is a dead letter naming the type.
    pub fn to_topic_as<U>(self, topic: &str, key: &[&str]) -> Self
    where
        U: serde::de::DeserializeOwned + serde::Serialize + 'static,
    {
        self.steps(|q| Ok(q.as_type::<U>())).to_topic(topic, key)
    }

    /// Writes rows as JSON lines to standard output (the default).
    pub fn to_stdout(mut self) -> Self {
        self.settings
            .insert("sink".into(), json!({"kind": "stdout"}));
        self
    }

    /// Writes rows as JSON to `topic`, keyed by the `key` columns.
    pub fn to_topic(mut self, topic: &str, key: &[&str]) -> Self {
        let mut sink = json!({"kind": "kafka", "topic": topic});
        if !key.is_empty() {
            sink["key"] = json!(key);
        }
        self.settings.insert("sink".into(), sink);
        self
    }

    /// Creates the output topic at start when it does not exist, with as
    /// many partitions as the input topic (a cluster that creates topics
    /// on first write would give it its default count instead).
    pub fn create_output_topic(mut self) -> Self {
        self.create_output_topic = true;
        self
    }

    /// Sends bad records to `topic` (default `<application id>-dlq`).
    pub fn dead_letter_topic(mut self, topic: &str) -> Self {
        self.settings.insert(
            "dead_letter".into(),
            json!({"kind": "kafka", "topic": topic}),
        );
        self
    }

    /// Keeps state in RocksDB under `dir`, logged to changelog topics.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        let dir: PathBuf = dir.into();
        self.section("state")
            .insert("dir".into(), dir.to_string_lossy().into_owned().into());
        self
    }

    /// Keeps `replicas` warm copies of each partition's state on other
    /// instances (Kafka Streams' `num.standby.replicas`).
    pub fn standby_replicas(mut self, replicas: usize) -> Self {
        self.section("state")
            .insert("num_standby_replicas".into(), replicas.into());
        self
    }

    /// One memory budget for state, in MiB (RocksDB's cache and buffers,
    /// the operators' in-memory share).
    pub fn state_memory_mb(mut self, megabytes: usize) -> Self {
        self.section("state")
            .insert("memory_mb".into(), megabytes.into());
        self
    }

    /// Reads the input as Avro in Confluent's wire format, writer schemas
    /// fetched from the schema registry at `registry_url` (replaces the
    /// JSON schema given to [`input`](Self::input): the Avro schema names
    /// the columns).
    pub fn avro_input(mut self, registry_url: &str) -> Self {
        let source = self.section("source");
        source.insert("format".into(), "avro".into());
        source.remove("schema");
        self.typed_input = None;
        self.settings
            .insert("schema_registry".into(), registry_url.into());
        self
    }

    /// Writes rows to a Delta Lake table at `path` (a directory, or an
    /// object store's URL with its cargo feature), created from the first
    /// rows' columns when missing; under [`exactly_once`](Self::exactly_once)
    /// each batch's commit is tied to its offsets.
    pub fn to_delta(mut self, path: &str) -> Self {
        self.settings
            .insert("sink".into(), json!({"kind": "delta", "path": path}));
        self
    }

    /// Answers interactive queries of the state on `listen` (`host:port`),
    /// each request carrying `Authorization: Bearer <auth_token>` when one
    /// is given.
    pub fn serve(self, listen: &str, auth_token: Option<&str>) -> Self {
        self.service("serve", "listen", listen, auth_token)
    }

    /// Serves the live web page on `listen`, guarded as
    /// [`serve`](Self::serve) is.
    pub fn ui(self, listen: &str, auth_token: Option<&str>) -> Self {
        self.service("ui", "listen", listen, auth_token)
    }

    /// Serves Prometheus metrics (`/metrics`, with `/healthz` and
    /// `/readyz`) on `listen`, guarded as [`serve`](Self::serve) is.
    pub fn prometheus(self, listen: &str, auth_token: Option<&str>) -> Self {
        self.service("metrics", "prometheus", listen, auth_token)
    }

    /// Sets an HTTP service's section: where it listens, and its token.
    fn service(mut self, section: &str, key: &str, listen: &str, token: Option<&str>) -> Self {
        let settings = self.section(section);
        settings.insert(key.into(), listen.into());
        if let Some(token) = token {
            settings.insert("auth_token".into(), token.into());
        }
        self
    }

    /// Output, state changes and offsets in one Kafka transaction per
    /// batch.
    pub fn exactly_once(mut self) -> Self {
        self.settings
            .insert("processing_guarantee".into(), "exactly_once".into());
        self
    }

    /// Spark's output mode (append by default).
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        let text = match mode {
            OutputMode::Append => "append",
            OutputMode::Update => "update",
            OutputMode::Complete => "complete",
        };
        self.settings.insert("output_mode".into(), text.into());
        self
    }

    /// A micro-batch every `interval`.
    pub fn trigger_every(mut self, interval: Duration) -> Self {
        let text = tidemark::duration::format_duration(interval);
        self.settings
            .insert("trigger".into(), json!({ "micro_batch": text }));
        self
    }

    /// Any other setting of the pipeline file's (see
    /// `docs/pipeline-file.md`), by its top-level key: `serve`, `ui`,
    /// `metrics`, `state`, `task_timeout`…
    pub fn setting(mut self, key: &str, value: Json) -> Self {
        if key == "steps" {
            self.mistake.get_or_insert(Error::config(
                "steps",
                "steps are added by the builder's own calls",
            ));
            return self;
        }
        self.settings.insert(key.to_string(), value);
        self
    }

    /// Relative paths (the state directory) resolve against `dir`
    /// (default: the working directory).
    pub fn base_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.base = dir.into();
        self
    }

    /// The checked settings, as the engine runs them.
    pub fn build(mut self) -> Result<PipelineFile> {
        if let Some(mistake) = self.mistake.take() {
            return Err(mistake);
        }
        let state = self.settings.get("state").and_then(Json::as_object);
        if state.is_some_and(|state| !state.contains_key("dir")) {
            return Err(Error::config(
                "state.dir",
                "standby_replicas and state_memory_mb are settings of durable state: \
                 set state_dir too",
            ));
        }
        if let Some(columns) = self.typed_input.take() {
            let event_time = self.settings.get("event_time").and_then(Json::as_str);
            let schema: Map<String, Json> = columns
                .into_iter()
                .map(|(name, kind)| {
                    let kind = if Some(name.as_str()) == event_time && kind == "string" {
                        "timestamp"
                    } else {
                        kind
                    };
                    (name, Json::from(kind))
                })
                .collect();
            self.section("source")
                .insert("schema".into(), Json::Object(schema));
        }
        self.settings
            .insert("steps".into(), Json::Array(std::mem::take(&mut self.steps)));
        let mut file = PipelineFile::from_settings(Json::Object(self.settings))?;
        for register in self.registrations {
            file = register(file);
        }
        // Every step is built once now, so that a mistake is reported here.
        file.query_builder()?;
        Ok(file)
    }

    /// A runner for the application (its progress listener, stop
    /// handle); the output topic is created first when asked for.
    pub fn runner(self) -> Result<PipelineRunner> {
        let base = self.base.clone();
        let create = self.create_output_topic;
        let file = self.build()?;
        if let (true, Some(topic)) = (create, file.sink.topic.clone()) {
            let clients = crate::KafkaClients::of_pipeline(&file)?;
            let input = file
                .source
                .topic
                .as_ref()
                .and_then(|t| t.0.first().cloned());
            let partitions = match input {
                Some(input) => tidemark_kafka::partition_count(&clients.source, &input)?,
                None => 1,
            };
            tidemark_kafka::ensure_topic(&clients.sink, &topic, partitions.max(1))?;
        }
        Ok(PipelineRunner::new(file, base))
    }

    /// Starts the application on its own threads and returns its handle:
    /// stop it, wait for it, ask its state, partitions and lag.
    pub fn start(self) -> Result<RunningPipeline> {
        self.runner()?.start()
    }
}

/// `(column, type)` pairs as the pipeline file's `schema` object.
fn schema_object(schema: &[(&str, &str)]) -> Json {
    Json::Object(
        schema
            .iter()
            .map(|(name, kind)| (name.to_string(), Json::from(*kind)))
            .collect(),
    )
}
