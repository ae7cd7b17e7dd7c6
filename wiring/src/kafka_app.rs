//! A Kafka application in one chain of calls, from Rust: topic in, steps
//! (a user's stateful processor among them), topic out, with state,
//! changelogs, exactly-once and the dead-letter topic set on it — no
//! pipeline file written or edited.
//!
//! The builder fills the same typed settings a pipeline file is read
//! into ([`PipelineFile`]) field by field — nothing is written as text and
//! read back — so both run through one wiring: the same source, decoder,
//! state backend, transactions and restarts.

use crate::{PipelineRunner, RunningPipeline};
use std::path::PathBuf;
use std::time::Duration;
use tidemark::duration::parse_duration;
use tidemark::error::{Error, Result};
use tidemark::functions::WindowLength;
use tidemark::operators::{OutputMode, StateDeclarations, StatefulProcessor};
use tidemark::runtime::Trigger;
use tidemark::watermark::WatermarkScope;
use tidemark_pipeline::{
    DeadLetterKind, DeadLetterSpec, DurationSpec, ExprSpec, Format, InitialStateYaml, KafkaSpec,
    MetricsSpec, PipelineFile, ProcessYaml, ProcessingGuarantee, RegistrySpec, SchemaSpec,
    ServeSpec, SinkKind, SinkSpec, SourceKind, SourceSpec, StartingOffsets, StateSpec, StepSpec,
    TopicList, TriggerSpec, UiSpec, WithColumnSpec,
};

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
    /// The settings as the engine runs them, filled by the calls.
    file: PipelineFile,
    base: PathBuf,
    /// The first mistake made while assembling, reported by `build`.
    mistake: Option<Error>,
    /// Creates the output topic when missing.
    create_output_topic: bool,
    /// The input's columns traced from its type (see [`KafkaApp::stream`]):
    /// the schema is written at `build`, once the event-time column is
    /// known.
    typed_input: Option<Vec<(String, &'static str)>>,
    /// How many code step groups were added (each is registered under a
    /// name of its own).
    code_steps: usize,
}

impl KafkaApp {
    /// An application named `application_id`: its consumer group,
    /// transactional ids, changelog and internal topic prefix, state
    /// directory name (Kafka Streams' `application.id`).
    pub fn new(application_id: &str) -> Self {
        KafkaApp {
            file: PipelineFile::new(
                application_id,
                SourceSpec::new(SourceKind::Kafka),
                SinkSpec::new(SinkKind::Stdout),
            ),
            base: PathBuf::from("."),
            mistake: None,
            create_output_topic: false,
            typed_input: None,
            code_steps: 0,
        }
    }

    /// Keeps the first mistake, reported by `build`.
    fn mistake(&mut self, error: Error) {
        self.mistake.get_or_insert(error);
    }

    /// The settings every Kafka client of the application shares.
    fn kafka(&mut self) -> &mut KafkaSpec {
        self.file.kafka.get_or_insert_with(KafkaSpec::default)
    }

    /// The state settings, made on the first call that sets one (the
    /// directory is checked at `build`).
    fn state(&mut self) -> &mut StateSpec {
        self.file
            .state
            .get_or_insert_with(|| StateSpec::new(String::new()))
    }

    /// The cluster's bootstrap servers (default: `KAFKA_BOOTSTRAP`, else
    /// `127.0.0.1:9092`).
    pub fn bootstrap(mut self, servers: &str) -> Self {
        self.kafka().bootstrap = Some(servers.to_string());
        self
    }

    /// A librdkafka property every client of the application gets
    /// (`security.protocol`, `sasl.*`, `ssl.*`); secrets are masked
    /// wherever the settings are shown.
    pub fn property(mut self, name: &str, value: &str) -> Self {
        self.kafka()
            .properties
            .insert(name.to_string(), value.to_string());
        self
    }

    /// Reads JSON records of `topic` with these `(column, type)` fields
    /// (`string`, `long`, `double`, `boolean`, `timestamp`); from the
    /// earliest offset when the group has none.
    pub fn input(mut self, topic: &str, schema: &[(&str, &str)]) -> Self {
        self.typed_input = None;
        self.file.source.topic = Some(TopicList(vec![topic.to_string()]));
        match SchemaSpec::of_columns(schema.iter().copied()) {
            Ok(schema) => self.file.source.schema = schema,
            Err(e) => self.mistake(e),
        }
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
            Err(reason) => self.mistake(Error::config(
                "source.schema",
                format!(
                    "the columns of {} cannot be traced: {reason}; give them with \
                     `input(topic, schema)` instead",
                    std::any::type_name::<T>()
                ),
            )),
        }
        self.file.source.topic = Some(TopicList(vec![topic.to_string()]));
        self
    }

    /// The columns the input's record key is made of: a grouping by them
    /// runs where the records are, without a repartition topic.
    pub fn keyed_by(mut self, columns: &[&str]) -> Self {
        self.file.source.keyed_by = Some(owned(columns));
        self
    }

    /// The consumer group (default: the application id).
    pub fn consumer_group(mut self, group: &str) -> Self {
        self.file.source.group = Some(group.to_string());
        self
    }

    /// Where a group without committed offsets starts reading (default:
    /// [`StartingOffsets::Earliest`]).
    pub fn starting_offsets(mut self, start: StartingOffsets) -> Self {
        self.file.source.starting_offsets = Some(start);
        self
    }

    /// Spark's `failOnDataLoss` (default `true`): with `false`, a committed
    /// offset the partition no longer holds reads on from the earliest one
    /// with a warning instead of failing the run.
    pub fn fail_on_data_loss(mut self, fail: bool) -> Self {
        self.file.source.fail_on_data_loss = fail;
        self
    }

    /// The event-time column and the watermark's delay: a
    /// [`Duration`] or Spark's text (`"1 minute"`).
    pub fn event_time(mut self, column: &str, watermark_delay: impl WindowLength) -> Self {
        self.file.event_time = Some(column.to_string());
        match parse_duration(&watermark_delay.as_duration_text()) {
            Ok(delay) => self.file.watermark = Some(DurationSpec(delay)),
            Err(e) => self.mistake(Error::config("watermark", reason_of(e))),
        }
        self
    }

    /// One watermark per input partition instead of one per stream.
    pub fn watermark_scope(mut self, scope: WatermarkScope) -> Self {
        self.file.watermark_scope = scope;
        self
    }

    /// After `timeout` without records, an input stops holding the
    /// watermark back.
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.file.idle_timeout = Some(DurationSpec(timeout));
        self
    }

    /// Keeps rows for which `condition` (Spark SQL) is true.
    pub fn filter(mut self, condition: &str) -> Self {
        match ExprSpec::parse(condition) {
            Ok(condition) => self.file.steps.push(StepSpec::Filter(condition)),
            Err(e) => self.mistake(Error::config("steps[].filter", reason_of(e))),
        }
        self
    }

    /// Adds the column `name` computed by `expression` (Spark SQL).
    pub fn with_column(mut self, name: &str, expression: &str) -> Self {
        match ExprSpec::parse(expression) {
            Ok(expr) => self.file.steps.push(StepSpec::WithColumn(WithColumnSpec {
                name: name.to_string(),
                expr,
            })),
            Err(e) => self.mistake(Error::config("steps[].with_column.expr", reason_of(e))),
        }
        self
    }

    /// Runs a user's stateful processor per key of `keys` (see
    /// [`tidemark::operators::processor`]); `build` makes each task's
    /// processor and declares its states.
    pub fn process<P, F>(mut self, name: &str, keys: &[&str], build: F) -> Self
    where
        P: StatefulProcessor,
        F: Fn(&mut StateDeclarations) -> Result<P> + Send + Sync + 'static,
    {
        self.push_process(name, keys, None);
        self.file = self.file.with_processor(name, build);
        self
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
        mut self,
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
        let schema = match SchemaSpec::of_columns(schema.iter().copied()) {
            Ok(schema) => schema,
            Err(e) => {
                self.mistake(Error::config(
                    "steps[].process.initial_state.schema",
                    reason_of(e),
                ));
                SchemaSpec::default()
            }
        };
        let initial = InitialStateYaml {
            topic: TopicList(vec![topic.to_string()]),
            name: None,
            schema,
        };
        self.push_process(name, keys, Some(initial));
        self.file = self
            .file
            .with_processor_and_initial_state::<P, S, _>(name, build);
        self
    }

    /// Adds a `process` step; two processors of one name are a mistake.
    fn push_process(&mut self, name: &str, keys: &[&str], initial: Option<InitialStateYaml>) {
        let taken = self
            .file
            .steps
            .iter()
            .any(|s| matches!(s, StepSpec::Process(p) if p.processor == name));
        if taken {
            self.mistake(Error::config(
                "process",
                format!("two processors are named `{name}`: give each its own name"),
            ));
        }
        self.file.steps.push(StepSpec::Process(ProcessYaml {
            processor: name.to_string(),
            keys: owned(keys),
            initial_state: initial,
        }));
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
        let name = format!("steps-{}", self.code_steps);
        self.code_steps += 1;
        self.file.steps.push(StepSpec::Code(name.clone()));
        self.file = self.file.with_steps(&name, add);
        self
    }

    /// The real-time trigger: each record processed as it arrives, state
    /// and offsets checkpointed every `checkpoint_interval` (update output
    /// mode).
    pub fn real_time(mut self, checkpoint_interval: Duration) -> Self {
        self.file.trigger = TriggerSpec(Trigger::RealTime {
            checkpoint_interval,
        });
        self
    }

    /// Processes what is there now in batches, then stops (Spark's
    /// `Trigger.AvailableNow`).
    pub fn available_now(mut self) -> Self {
        self.file.trigger = TriggerSpec(Trigger::AvailableNow);
        self
    }

    /// A micro-batch every `interval`.
    pub fn trigger_every(mut self, interval: Duration) -> Self {
        self.file.trigger = TriggerSpec(Trigger::MicroBatch { interval });
        self
    }

    /// Caps the records of one batch.
    pub fn max_records_per_batch(mut self, max: usize) -> Self {
        self.file.max_records_per_batch = Some(max);
        self
    }

    /// How long a stage may keep failing with errors worth retrying (a
    /// broker down, a fenced transaction) before the run fails (Kafka
    /// Streams' `task.timeout.ms`; default 5 minutes).
    pub fn task_timeout(mut self, timeout: Duration) -> Self {
        self.file.task_timeout = Some(DurationSpec(timeout));
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
        self.file.sink = SinkSpec::new(SinkKind::Stdout);
        self
    }

    /// Writes rows as JSON to `topic`, keyed by the `key` columns.
    pub fn to_topic(mut self, topic: &str, key: &[&str]) -> Self {
        let mut sink = SinkSpec::new(SinkKind::Kafka);
        sink.topic = Some(topic.to_string());
        sink.key = owned(key);
        self.file.sink = sink;
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
        self.file.dead_letter = Some(DeadLetterSpec {
            kind: DeadLetterKind::Kafka,
            topic: Some(topic.to_string()),
            path: None,
            properties: Default::default(),
        });
        self
    }

    /// Keeps state in RocksDB under `dir`, logged to changelog topics.
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        let dir: PathBuf = dir.into();
        self.state().dir = dir.to_string_lossy().into_owned();
        self
    }

    /// Keeps `replicas` warm copies of each partition's state on other
    /// instances (Kafka Streams' `num.standby.replicas`).
    pub fn standby_replicas(mut self, replicas: usize) -> Self {
        self.state().num_standby_replicas = replicas;
        self
    }

    /// One memory budget for state, in MiB (RocksDB's cache and buffers,
    /// the operators' in-memory share).
    pub fn state_memory_mb(mut self, megabytes: usize) -> Self {
        self.state().memory_mb = megabytes;
        self
    }

    /// The replication factor of the changelog topics (default 1).
    pub fn changelog_replication(mut self, replicas: i32) -> Self {
        self.state().replication = replicas;
        self
    }

    /// Reads the input as Avro in Confluent's wire format, writer schemas
    /// fetched from the schema registry at `registry_url` (replaces the
    /// JSON schema given to [`input`](Self::input): the Avro schema names
    /// the columns).
    pub fn avro_input(mut self, registry_url: &str) -> Self {
        self.file.source.format = Format::Avro;
        self.file.source.schema = SchemaSpec::default();
        self.typed_input = None;
        self.file.schema_registry = Some(RegistrySpec {
            url: registry_url.to_string(),
            properties: Default::default(),
        });
        self
    }

    /// A client property of the schema registry's (`basic.auth.user.info`,
    /// `bearer.auth.token`, `ssl.ca.location`, `request.timeout.ms`);
    /// secrets are masked wherever the settings are shown. Give the
    /// registry with [`avro_input`](Self::avro_input) first.
    pub fn schema_registry_property(mut self, name: &str, value: &str) -> Self {
        match self.file.schema_registry.as_mut() {
            Some(registry) => {
                registry
                    .properties
                    .insert(name.to_string(), value.to_string());
            }
            None => self.mistake(Error::config(
                "schema_registry.properties",
                "a registry property without a registry: call avro_input(registry_url) first",
            )),
        }
        self
    }

    /// Sends the rows dropped as late (behind the watermark) to `topic`
    /// as JSON instead of only counting them.
    pub fn late_data_topic(mut self, topic: &str) -> Self {
        let mut late = SinkSpec::new(SinkKind::Kafka);
        late.topic = Some(topic.to_string());
        self.file.late_data = Some(late);
        self
    }

    /// Writes rows to a Delta Lake table at `path` (a directory, or an
    /// object store's URL with its cargo feature), created from the first
    /// rows' columns when missing; under [`exactly_once`](Self::exactly_once)
    /// each batch's commit is tied to its offsets.
    pub fn to_delta(mut self, path: &str) -> Self {
        let mut sink = SinkSpec::new(SinkKind::Delta);
        sink.path = Some(path.to_string());
        self.file.sink = sink;
        self
    }

    /// Answers interactive queries of the state on `listen` (`host:port`),
    /// each request carrying `Authorization: Bearer <auth_token>` when one
    /// is given.
    pub fn serve(mut self, listen: &str, auth_token: Option<&str>) -> Self {
        self.file.serve = Some(ServeSpec {
            listen: listen.to_string(),
            advertised: None,
            auth_token: auth_token.map(str::to_string),
            tls: None,
        });
        self
    }

    /// Serves the live web page on `listen`, guarded as
    /// [`serve`](Self::serve) is.
    pub fn ui(mut self, listen: &str, auth_token: Option<&str>) -> Self {
        self.file.ui = Some(UiSpec {
            listen: listen.to_string(),
            auth_token: auth_token.map(str::to_string),
            tls: None,
        });
        self
    }

    /// Serves Prometheus metrics (`/metrics`, with `/healthz` and
    /// `/readyz`) on `listen`, guarded as [`serve`](Self::serve) is.
    pub fn prometheus(mut self, listen: &str, auth_token: Option<&str>) -> Self {
        self.file.metrics = Some(MetricsSpec {
            prometheus: listen.to_string(),
            auth_token: auth_token.map(str::to_string),
            tls: None,
        });
        self
    }

    /// Output, state changes and offsets in one Kafka transaction per
    /// batch.
    pub fn exactly_once(mut self) -> Self {
        self.file.processing_guarantee = ProcessingGuarantee::ExactlyOnce;
        self
    }

    /// Spark's output mode (append by default).
    pub fn output_mode(mut self, mode: OutputMode) -> Self {
        self.file.output_mode = mode;
        self
    }

    /// Sets any other of the settings a pipeline file holds, on the typed
    /// model itself (see `docs/pipeline-file.md` for each): the source's
    /// and sink's own client properties, TLS on the HTTP services, the
    /// watermark policy, a files source… Checked with the rest at `build`.
    ///
    /// ```no_run
    /// # use tidemark_connectors::KafkaApp;
    /// let app = KafkaApp::new("orders").configure(|settings| {
    ///     settings.source.static_membership = false;
    ///     settings.multiple_watermark_policy = tidemark::watermark::WatermarkPolicy::Max;
    /// });
    /// ```
    pub fn configure(mut self, set: impl FnOnce(&mut PipelineFile)) -> Self {
        set(&mut self.file);
        self
    }

    /// The address the application's other instances reach this one's
    /// interactive queries on (`host:port`; default: `serve`'s listen
    /// address). Give [`serve`](Self::serve) first.
    pub fn serve_advertised(mut self, address: &str) -> Self {
        match self.file.serve.as_mut() {
            Some(serve) => serve.advertised = Some(address.to_string()),
            None => self.mistake(Error::config(
                "serve.advertised",
                "an advertised address without serve: call serve(listen, token) first",
            )),
        }
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
        if self.file.state.as_ref().is_some_and(|s| s.dir.is_empty()) {
            return Err(Error::config(
                "state.dir",
                "standby_replicas, state_memory_mb and changelog_replication are settings \
                 of durable state: set state_dir too",
            ));
        }
        if let Some(columns) = self.typed_input.take() {
            let event_time = self.file.event_time.as_deref();
            let columns: Vec<(&str, &str)> = columns
                .iter()
                .map(
                    |(name, kind)| match (Some(name.as_str()) == event_time, *kind) {
                        (true, "string") => (name.as_str(), "timestamp"),
                        (_, kind) => (name.as_str(), kind),
                    },
                )
                .collect();
            self.file.source.schema = SchemaSpec::of_columns(columns)?;
        }
        self.file.check_settings()?;
        // Every step is built once now, so that a mistake is reported here.
        self.file.query_builder()?;
        Ok(self.file)
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

/// The names as owned strings.
fn owned(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// A configuration error's reason without its key (the builder names the
/// key it was given for).
fn reason_of(error: Error) -> String {
    match error {
        Error::Config { reason, .. } => reason,
        other => other.to_string(),
    }
}
