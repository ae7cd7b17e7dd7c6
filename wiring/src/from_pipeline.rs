//! Builds the source, sink, decoder and dead-letter output a pipeline file
//! names.

use crate::avro::{
    read_schema_file, AvroDecoder, AvroEncoder, RegistryClient, RegistryConfig, SubjectNameStrategy,
};
use crate::files::{
    FileDeadLetter, FileFormat, FilesSource, FilesSourceOptions, FilesStart, JsonlSink, StdoutSink,
};
use crate::instance::{IdentityOrigin, InstanceIdentity};
use crate::kafka::{
    KafkaConnection, KafkaDeadLetter, KafkaSink, KafkaSource, KafkaSourceConfig, KeyColumns,
    SharedTransactions, ValueFormat,
};
use crate::kafka_clients::KafkaClients;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tidemark::decode::JsonDecoder;
use tidemark::error::{Error, Result};
use tidemark::runtime::{
    DeadLetter, Decoder, QueryBuilder, SecondInput, SecondInputKind, Sink, Source, Stage,
    StageInput, StageOutput, StateBackend, Topology,
};
use tidemark_pipeline::{
    DeadLetterKind, DeltaMode, Format, PipelineFile, ProcessingGuarantee, SinkKind, SinkSpec,
    SourceKind, StartingOffsets, SubjectNameStrategySpec,
};

/// The connected parts of a pipeline.
pub struct Connected {
    /// The feeds of global tables, by table name.
    pub table_feeds: Vec<(String, Box<dyn tidemark::runtime::TableFeed>)>,
    /// The source.
    pub source: Box<dyn Source>,
    /// The sink.
    pub sink: Box<dyn Sink>,
    /// The decoder.
    pub decoder: Box<dyn Decoder>,
    /// Where bad records go.
    pub dead_letter: Box<dyn DeadLetter>,
    /// Where rows dropped as late go, if configured.
    pub late_data: Option<Box<dyn Sink>>,
    /// Durable state, if configured.
    pub state_backend: Option<Box<dyn StateBackend>>,
    /// Shares partitions' progress with the other instances, under
    /// `watermark_scope: query`.
    pub watermark_exchange: Option<crate::kafka::KafkaWatermarkExchange>,
}

impl Connected {
    /// Hands the decoder, dead-letter output and late-data sink to `query`;
    /// returns it with the source and sink to run it on.
    pub fn wire(self, query: QueryBuilder) -> (QueryBuilder, Box<dyn Source>, Box<dyn Sink>) {
        let mut query = query.decoder(self.decoder).dead_letter(self.dead_letter);
        for (name, feed) in self.table_feeds {
            query = query.table_feed(&name, BoxedFeed(feed));
        }
        if let Some(late) = self.late_data {
            query = query.late_data(late);
        }
        if let Some(state) = self.state_backend {
            query = query.state_backend(state);
        }
        if let Some(exchange) = self.watermark_exchange {
            query = query.watermark_exchange(exchange);
        }
        (query, self.source, self.sink)
    }
}

/// A boxed feed as a feed.
struct BoxedFeed(Box<dyn tidemark::runtime::TableFeed>);

impl tidemark::runtime::TableFeed for BoxedFeed {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn catch_up(&mut self) -> Result<Vec<tidemark::record::Record>> {
        self.0.catch_up()
    }
}

/// `path` of the pipeline file, relative to `base` (its directory) unless
/// absolute.
pub(crate) fn resolve(base: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// Connects what `file` describes, run as one stage; relative paths are
/// resolved against `base_dir` (the pipeline file's directory). The
/// instance identity is acquired for this connection (see [`connect_as`]
/// to keep one across reconnections).
pub fn connect(file: &PipelineFile, base_dir: &Path) -> Result<Connected> {
    connect_as(
        file,
        base_dir,
        &Arc::new(instance_identity(file, base_dir)?),
    )
}

/// The identity of this process for `file`'s application:
/// `TIDEMARK_INSTANCE_ID`, its state directory's instance slot, or one made
/// for the process (see [`InstanceIdentity`]). Transactional ids and, when
/// stable, the consumer's static `group.instance.id` derive from it.
pub fn instance_identity(file: &PipelineFile, base_dir: &Path) -> Result<InstanceIdentity> {
    let state_dir = file.state_spec().map(|s| resolve(base_dir, &s.dir));
    InstanceIdentity::acquire(&file.name, state_dir.as_deref())
}

/// [`connect`] as instance `identity`: its transactional ids derive from
/// the identity, so instances of one file never share one. The query's
/// transactions hold the identity (and so its state-directory slot) while
/// they live.
pub fn connect_as(
    file: &PipelineFile,
    base_dir: &Path,
    identity: &Arc<InstanceIdentity>,
) -> Result<Connected> {
    let stage = file.query_builder()?.single_stage();
    connect_stage(file, &stage, base_dir, identity)
}

/// Connects one stage of `file`'s topology ([`PipelineFile::topology`]):
/// what it reads (the file's source, a joined stream's topics or a
/// repartition topic), where it writes (the file's sink or a repartition
/// topic, with watermark markers), its decoders, dead-letter output and,
/// for the stage writing the sink, its late-data sink and state.
pub fn connect_stage(
    file: &PipelineFile,
    stage: &Stage,
    base_dir: &Path,
    identity: &Arc<InstanceIdentity>,
) -> Result<Connected> {
    // A files source has no cluster: its transactions (a Kafka sink's,
    // under exactly-once) run on the sink's.
    let files_into_kafka =
        file.source.kind == SourceKind::Files && file.sink.kind == SinkKind::Kafka;
    let clients = KafkaClients::of_pipeline(file)?;
    clients.check(file)?;
    let transactions = match file.processing_guarantee {
        ProcessingGuarantee::ExactlyOnce
            if file.source.kind == SourceKind::Kafka || files_into_kafka =>
        {
            // Stable per instance: a restarted instance takes its slot's id
            // back, fences the old process and aborts what it left open.
            Some(SharedTransactions::for_instance(
                &clients.transactions,
                &stage.name,
                identity.clone(),
            )?)
        }
        _ => None,
    };
    let source = build_source(
        file,
        stage,
        base_dir,
        &clients,
        transactions.as_ref(),
        identity,
    )?;
    let decoder = build_decoder(file, stage, base_dir)?;
    let table_feeds = build_table_feeds(file, stage, base_dir, &clients.cluster)?;
    let real_time = matches!(file.trigger.0, tidemark::runtime::Trigger::RealTime { .. });
    let writes_sink = stage.output == StageOutput::Sink;
    let sink = match &stage.output {
        StageOutput::Repartition { topic, keys } => repartition_sink(
            &clients.cluster,
            topic,
            keys,
            // A union's writer reads its second stream's topics too.
            &stage_topics(file, stage),
            transactions.as_ref(),
        )?,
        StageOutput::Sink => build_sink(
            &file.sink,
            file,
            base_dir,
            &clients.sink,
            transactions.as_ref(),
            SinkRole {
                real_time,
                // Kafka keeps each partition's checkpoint: a Delta table
                // commits per task, and several instances share it.
                task_commits: file.source.kind == SourceKind::Kafka,
                instance: identity.id().to_string(),
            },
        )?,
    };
    let late_data = match &file.late_data {
        Some(spec) if writes_sink => {
            // In the batch's transaction when it writes to the source's
            // cluster (a transaction spans one cluster).
            let connection = clients.other_sink(spec, file);
            let same_cluster = connection.bootstrap == clients.cluster.bootstrap;
            let transactions = transactions.as_ref().filter(|_| same_cluster);
            Some(build_sink(
                spec,
                file,
                base_dir,
                &connection,
                transactions,
                SinkRole {
                    real_time,
                    task_commits: false,
                    instance: identity.id().to_string(),
                },
            )?)
        }
        _ => None,
    };
    let dead_letter =
        build_dead_letter(file, base_dir, &clients.dead_letter, transactions.as_ref())?;
    let state_backend = match writes_sink {
        true => build_state_backend(
            file,
            stage,
            base_dir,
            &clients.cluster,
            transactions.as_ref(),
            identity,
        )?,
        false => None,
    };
    Ok(Connected {
        table_feeds,
        source,
        sink,
        decoder,
        dead_letter,
        late_data,
        state_backend,
        watermark_exchange: watermark_exchange(file, stage, &clients.cluster)?,
    })
}

/// The topics a stage reads its own rows from (not its joined streams').
fn stage_main_topics(file: &PipelineFile, stage: &Stage) -> Vec<String> {
    match &stage.input {
        StageInput::Source => file.source.topic.clone().map(|t| t.0).unwrap_or_default(),
        StageInput::Joined { topics, .. } => topics.clone(),
        StageInput::Repartition { topic, .. } => vec![topic.clone()],
    }
}

/// The global tables whose joins run in `stage`.
fn stage_global_tables(stage: &Stage) -> Vec<SecondInput> {
    stage
        .query
        .plan()
        .second_inputs()
        .into_iter()
        .filter(|i| i.kind == SecondInputKind::GlobalTable)
        .collect()
}

/// The consumer's `group.instance.id` (static membership, KIP-345) for
/// `stage`, when `enabled` and the instance's identity outlives the process
/// (`TIDEMARK_INSTANCE_ID`, a state directory's slot): a replica restarted
/// on its state directory rejoins as the same member and gets its
/// partitions back at once, where a new dynamic member would wait out the
/// dead one's session timeout and a rebalance. An identity made for the
/// process alone would leave a new static member per restart, each holding
/// partitions until its session timed out: those join as dynamic members.
fn static_member_id(enabled: bool, identity: &InstanceIdentity, stage: &str) -> Option<String> {
    let stable = matches!(
        identity.origin(),
        IdentityOrigin::Environment | IdentityOrigin::StateDirectorySlot(_)
    );
    (enabled && stable).then(|| format!("{stage}-{}", identity.id()))
}

/// The static member id (`group.instance.id`) a stage's consumer joins
/// its group with, by which the standby placement knows this instance.
fn standby_member(
    file: &PipelineFile,
    stage: &Stage,
    identity: &InstanceIdentity,
) -> Option<String> {
    let src = &file.source;
    src.properties
        .0
        .get("group.instance.id")
        .cloned()
        .or_else(|| static_member_id(src.static_membership, identity, &stage.name))
}

/// Every topic a stage reads: its own and its joined streams'.
fn stage_topics(file: &PipelineFile, stage: &Stage) -> Vec<String> {
    let mut topics = stage_main_topics(file, stage);
    topics.extend(
        stage
            .query
            .plan()
            .joined_topics()
            .into_iter()
            .flat_map(|(_, t)| t),
    );
    topics
}

/// The source a stage reads: a directory of batch files, or Kafka topics
/// (joined streams' topics too), in `transactions` under exactly-once.
fn build_source(
    file: &PipelineFile,
    stage: &Stage,
    base_dir: &Path,
    clients: &KafkaClients,
    transactions: Option<&SharedTransactions>,
    identity: &InstanceIdentity,
) -> Result<Box<dyn Source>> {
    let src = &file.source;
    let joined = stage.query.plan().joined_topics();
    if src.kind == SourceKind::Files {
        return files_source(file, stage, base_dir);
    }
    let topics = stage_topics(file, stage);
    let mut properties = src.properties.0.clone();
    if !joined.is_empty() && stage.query.plan().needs_co_partitioned_inputs() {
        check_co_partitioned(&clients.cluster, &topics)?;
        // Partition n of every topic to the same instance: the range
        // assignor splits each topic alike.
        properties
            .entry("partition.assignment.strategy".into())
            .or_insert_with(|| "range".into());
    }
    if let Some(member) = static_member_id(src.static_membership, identity, &stage.name) {
        properties
            .entry("group.instance.id".into())
            .or_insert(member);
    }
    // The stage keeping the served state names its address in its client
    // id: the other instances find it in the group's description.
    if let (Some(serve), StageOutput::Sink) = (&file.serve, &stage.output) {
        let client_id = crate::kafka::serving_client_id(
            properties.get("client.id").map(String::as_str),
            serve.advertised(),
        );
        properties.insert("client.id".into(), client_id);
    }
    let group = src.group.clone().unwrap_or_else(|| file.name.clone());
    let source = KafkaSource::new(stage_source_config(
        KafkaSourceConfig {
            cluster: clients.cluster.clone(),
            topics,
            group,
            earliest: src.starting_offsets != Some(StartingOffsets::Latest),
            properties,
        },
        &stage.input,
    ))?
    .fail_on_data_loss(src.fail_on_data_loss);
    Ok(match transactions {
        Some(t) => Box::new(source.with_transactions(t.clone())),
        None => Box::new(source),
    })
}

/// The consumer group of a stage of `file` reading `input`.
pub(crate) fn stage_group(file: &PipelineFile, input: &StageInput) -> String {
    input_group(file.source.group.as_deref().unwrap_or(&file.name), input)
}

/// The consumer group reading `input`, from the query's own `group`:
/// `<group>-right` for a joined stream's writer, `<group>-repartition` for
/// a repartition topic's reader.
fn input_group(group: &str, input: &StageInput) -> String {
    match input {
        StageInput::Source => group.to_string(),
        StageInput::Joined { .. } => format!("{group}-right"),
        StageInput::Repartition { .. } => format!("{group}-repartition"),
    }
}

/// The files source `file` describes: its directory (a sub-directory per
/// stream with a join), how it reads it and where it records progress.
fn files_source(file: &PipelineFile, stage: &Stage, base_dir: &Path) -> Result<Box<dyn Source>> {
    let src = &file.source;
    let dir = resolve(base_dir, src.path.as_deref().unwrap_or("."));
    let inputs = match stage.query.plan().joined_topics().first() {
        None => Vec::new(),
        Some(_) if src.topic.is_none() => {
            return Err(tidemark::error::Error::config(
                "source.topic",
                "with a join, the files source reads each stream from a sub-directory of `path`: name the main stream's in `source.topic`",
            ))
        }
        Some(_) => file.input_topics()?,
    };
    let checkpoint = file.files_checkpoint().map(|c| resolve(base_dir, &c));
    if checkpoint.is_some()
        && file.state_spec().is_none()
        && stage.query.plan().has_stateful_steps()
    {
        return Err(tidemark::error::Error::config(
            "state_dir",
            "a files source that remembers its progress (`source.checkpoint`) with stateful steps needs `state_dir` too: the state must survive with the progress",
        ));
    }
    let options = FilesSourceOptions {
        max_files_per_batch: src.max_files_per_batch.unwrap_or(1),
        pattern: src
            .pattern
            .as_deref()
            .map(glob::Pattern::new)
            .transpose()
            .map_err(|e| tidemark::error::Error::config("source.pattern", e.to_string()))?,
        start: match src.start {
            Some(StartingOffsets::Latest) => FilesStart::Latest,
            _ => FilesStart::Earliest,
        },
        settle_delay: src.settle_delay.map_or(std::time::Duration::ZERO, |d| d.0),
        follow_symlinks: src.follow_symlinks.unwrap_or(false),
        max_file_bytes: match src.max_file_mb {
            Some(0) => {
                return Err(tidemark::error::Error::config(
                    "source.max_file_mb",
                    "at least 1 (MiB)",
                ))
            }
            Some(mb) => mb.saturating_mul(1 << 20),
            None => tidemark_files::DEFAULT_MAX_FILE_BYTES,
        },
        format: match src.format {
            Format::Csv => FileFormat::Csv,
            Format::Parquet => FileFormat::Parquet,
            Format::Json | Format::Avro => FileFormat::JsonLines,
        },
        schema: file.schema(),
        checkpoint,
    };
    Ok(Box::new(FilesSource::with_options(dir, inputs, options)?))
}

/// The consumer settings of a stage reading `input`, from those of the
/// query's own input: a joined stream's writer reads as `<group>-right`, a
/// reader of a repartition topic as `<group>-repartition` from the
/// earliest offset (everything a writer wrote is its input).
pub(crate) fn stage_source_config(
    mut config: KafkaSourceConfig,
    input: &StageInput,
) -> KafkaSourceConfig {
    config.group = input_group(&config.group, input);
    config.earliest |= matches!(input, StageInput::Repartition { .. });
    config
}

/// A stage's decoder: the source's format and schema for the file's own
/// input, the stream's schema for a joined stream, JSON for a repartition
/// topic (typed by the file's schema when a join reads it, inferred after
/// a grouping's writer, whose steps may have changed the columns); with
/// joins or global tables, one per topic.
fn build_decoder(file: &PipelineFile, stage: &Stage, base_dir: &Path) -> Result<Box<dyn Decoder>> {
    let src = &file.source;
    let second_inputs = stage.query.plan().second_inputs();
    let schema_of = |stream: &str| {
        second_inputs
            .iter()
            .find(|j| j.name == stream)
            .map(|j| j.schema.clone())
            .unwrap_or_default()
    };
    let stage_joins = stage.query.plan().joined_topics();
    let (format, schema) = match &stage.input {
        StageInput::Source => (src.format, file.schema()),
        StageInput::Joined { schema, .. } => (src.format, schema.clone()),
        StageInput::Repartition { .. } if stage_joins.is_empty() => {
            (Format::Json, Default::default())
        }
        StageInput::Repartition { .. } => (Format::Json, file.schema()),
    };
    let decoder: Box<dyn Decoder> = match format {
        // The files source hands CSV and Parquet rows over as JSON objects,
        // and a line it could not read with the reason why.
        Format::Csv | Format::Parquet => {
            return Ok(Box::new(crate::files::FileReadErrors(JsonDecoder::new(
                schema,
            ))));
        }
        Format::Json => Box::new(JsonDecoder::new(schema)),
        Format::Avro => {
            let mut schemas = std::collections::HashMap::new();
            for (id, path) in &src.avro_schemas {
                schemas.insert(*id, read_schema_file(&resolve(base_dir, path))?);
            }
            Box::new(AvroDecoder::new(schemas, registry_client(file, base_dir)?))
        }
    };
    let global_tables = stage_global_tables(stage);
    if format != Format::Json || (stage_joins.is_empty() && global_tables.is_empty()) {
        return Ok(decoder);
    }
    let mut by_topic = tidemark::decode::ByTopicDecoder::new(decoder);
    let topics = stage_joins
        .into_iter()
        .map(|(stream, topics)| (topics, schema_of(&stream)))
        .chain(
            global_tables
                .iter()
                .map(|t| (t.topics.clone(), t.schema.clone())),
        );
    for (list, schema) in topics {
        for topic in &list {
            by_topic = by_topic.topic(topic, Box::new(JsonDecoder::new(schema.clone())));
        }
    }
    Ok(Box::new(by_topic))
}

/// The feeds of the global tables, by table name.
fn build_table_feeds(
    file: &PipelineFile,
    stage: &Stage,
    base_dir: &Path,
    cluster: &KafkaConnection,
) -> Result<Vec<(String, Box<dyn tidemark::runtime::TableFeed>)>> {
    let src = &file.source;
    let global_tables = stage_global_tables(stage);
    let mut table_feeds: Vec<(String, Box<dyn tidemark::runtime::TableFeed>)> = Vec::new();
    for table in &global_tables {
        let [topic] = table.topics.as_slice() else {
            return Err(tidemark::error::Error::config(
                "table_join.topic",
                "a global table reads one topic",
            ));
        };
        let feed: Box<dyn tidemark::runtime::TableFeed> = match src.kind {
            SourceKind::Kafka => Box::new(crate::kafka::KafkaTableFeed::new(cluster, topic)?),
            SourceKind::Files => Box::new(crate::files::FilesTableFeed::new(
                resolve(base_dir, src.path.as_deref().unwrap_or(".")).join(topic),
            )?),
        };
        table_feeds.push((table.name.clone(), feed));
    }
    Ok(table_feeds)
}

/// Where bad records go: the configured output, or by default a
/// `<name>-dlq` topic (Kafka) or `<name>.dead-letter.jsonl` file.
fn build_dead_letter(
    file: &PipelineFile,
    base_dir: &Path,
    connection: &KafkaConnection,
    transactions: Option<&SharedTransactions>,
) -> Result<Box<dyn DeadLetter>> {
    // Under exactly-once, dead letters go out in the batch's transaction.
    let kafka = |topic: &str| -> Result<Box<dyn DeadLetter>> {
        let dead_letter = KafkaDeadLetter::new(connection, topic)?;
        Ok(match transactions {
            Some(t) => Box::new(dead_letter.with_transactions(t.clone())),
            None => Box::new(dead_letter),
        })
    };
    Ok(match (&file.dead_letter, file.source.kind) {
        (Some(d), _) if d.kind == DeadLetterKind::Kafka => {
            kafka(d.topic.as_deref().unwrap_or_default())?
        }
        (Some(d), _) => Box::new(FileDeadLetter::new(resolve(
            base_dir,
            d.path.as_deref().unwrap_or_default(),
        ))),
        (None, SourceKind::Kafka) => kafka(&format!("{}-dlq", file.name))?,
        (None, SourceKind::Files) => Box::new(FileDeadLetter::new(
            base_dir.join(format!("{}.dead-letter.jsonl", file.name)),
        )),
    })
}

/// RocksDB state with its changelog, when the file asks for state.
fn build_state_backend(
    file: &PipelineFile,
    stage: &Stage,
    base_dir: &Path,
    cluster: &KafkaConnection,
    transactions: Option<&SharedTransactions>,
    identity: &InstanceIdentity,
) -> Result<Option<Box<dyn StateBackend>>> {
    let src = &file.source;
    Ok(match &file.state_spec() {
        None => None,
        Some(spec) => {
            let changelog = match spec.changelog.unwrap_or(src.kind == SourceKind::Kafka) {
                false => None,
                true => {
                    let topics = stage_topics(file, stage);
                    let mut partitions = 1;
                    for topic in &topics {
                        partitions = partitions.max(crate::kafka::partition_count(cluster, topic)?);
                    }
                    Some(crate::state_backend::ChangelogConfig {
                        cluster: cluster.clone(),
                        partitions,
                        replication: spec.replication,
                    })
                }
            };
            let partitions = changelog.as_ref().map_or(1, |c| c.partitions);
            let (rocksdb_bytes, operator_bytes) = crate::state_backend::split_memory_budget(
                spec.memory_mb << 20,
                partitions.max(1) as usize,
            );
            let backend = crate::state_backend::RocksDbStateBackend::new(
                resolve(base_dir, &spec.dir),
                &stage.name,
                rocksdb_bytes,
                operator_bytes,
                changelog,
            )?
            .with_standby_replicas(
                spec.num_standby_replicas,
                &stage_group(file, &stage.input),
                standby_member(file, stage, identity).as_deref(),
            )?;
            let backend = match spec.restore_stall_timeout {
                Some(timeout) => backend.with_restore_options(crate::kafka::RestoreOptions {
                    stall_timeout: timeout.0,
                    ..Default::default()
                }),
                None => backend,
            };
            Some(Box::new(match transactions {
                Some(t) => backend.with_transactions(t.clone()),
                None => backend,
            }))
        }
    })
}

/// A join's topics must have as many partitions each: task `n` joins
/// partition `n` of every topic (records keyed by the join key, with the
/// same partitioner).
pub(crate) fn check_co_partitioned(cluster: &KafkaConnection, topics: &[String]) -> Result<()> {
    let mut counts = Vec::new();
    for topic in topics {
        counts.push((
            topic.clone(),
            crate::kafka::partition_count(cluster, topic)?,
        ));
    }
    if counts.windows(2).any(|w| w[0].1 != w[1].1) {
        let listed: Vec<String> = counts
            .iter()
            .map(|(t, n)| format!("`{t}` has {n}"))
            .collect();
        return Err(tidemark::error::Error::config(
            "join.topic",
            format!(
                "the joined topics are not co-partitioned: {}; a join needs the same number of partitions on every topic, keyed by the join key (re-create one of them, or write it through a pipeline into a topic with the right count)",
                listed.join(", ")
            ),
        ));
    }
    Ok(())
}

/// The exchange of partitions' progress a stage reading a Kafka input
/// with a query-wide watermark shares with the other instances: on
/// `<application_id>-watermarks` the stage reading the file's own input
/// (the query, or the repartition writer in front of it); on
/// `<stage>-watermarks` a repartitioned join's second-stream writer, whose
/// partitions are another stream's. A repartition reader needs none: its
/// watermark comes from the writers' markers, which reach every instance.
fn watermark_exchange(
    file: &PipelineFile,
    stage: &Stage,
    cluster: &KafkaConnection,
) -> Result<Option<crate::kafka::KafkaWatermarkExchange>> {
    let query_wide = file.watermark_scope == tidemark::watermark::WatermarkScope::Query;
    if !query_wide || file.source.kind != SourceKind::Kafka || file.watermark.is_none() {
        return Ok(None);
    }
    let topic = match &stage.input {
        StageInput::Source => format!("{}-watermarks", file.name),
        StageInput::Joined { .. } => format!("{}-watermarks", stage.name),
        StageInput::Repartition { .. } => return Ok(None),
    };
    crate::kafka::KafkaWatermarkExchange::new(cluster, &topic).map(Some)
}

/// The input partitions (`topic/partition`) of a Kafka source.
fn input_partitions(cluster: &KafkaConnection, topics: &[String]) -> Result<Vec<String>> {
    let mut origins = Vec::new();
    for topic in topics {
        let count = crate::kafka::partition_count(cluster, topic)?;
        origins.extend((0..count).map(|p| format!("{topic}/{p}")));
    }
    Ok(origins)
}

/// A writing stage's sink: rows keyed by the grouping columns, plus
/// watermark markers for every partition of the stage's `inputs`.
pub(crate) fn repartition_sink(
    cluster: &KafkaConnection,
    topic: &str,
    keys: &[String],
    inputs: &[String],
    transactions: Option<&SharedTransactions>,
) -> Result<Box<dyn Sink>> {
    let origins = input_partitions(cluster, inputs)?;
    let partitions = crate::kafka::partition_count(cluster, topic)?;
    let sink = KafkaSink::new(cluster, topic, KeyColumns(keys.to_vec()), ValueFormat::Json)?
        .with_watermark_markers(origins, partitions);
    Ok(match transactions {
        Some(t) => Box::new(sink.with_transactions(t.clone())),
        None => Box::new(sink),
    })
}

/// Checks before the first batch that `file`'s Kafka outputs can be
/// written (#44): the sink's, the late-data output's and a named
/// dead-letter topic must exist or be created by the broker on first write
/// ([`crate::kafka::check_output_topic`]), else a configuration error names
/// the setting; the default dead-letter topic `<name>-dlq`, tidemark's own
/// choice, is created when missing on a broker that would not create it.
pub fn check_output_topics(file: &PipelineFile) -> Result<()> {
    let clients = KafkaClients::of_pipeline(file)?;
    let kafka_topic = |spec: &tidemark_pipeline::SinkSpec| {
        (spec.kind == SinkKind::Kafka)
            .then(|| spec.topic.clone())
            .flatten()
    };
    if let Some(topic) = kafka_topic(&file.sink) {
        crate::kafka::check_output_topic(&clients.sink, &topic, "sink.topic")?;
    }
    if let Some(topic) = file.late_data.as_ref().and_then(kafka_topic) {
        let spec = file.late_data.as_ref().expect("a late-data topic");
        let connection = clients.other_sink(spec, file);
        crate::kafka::check_output_topic(&connection, &topic, "late_data.topic")?;
    }
    match &file.dead_letter {
        Some(d) if d.kind == DeadLetterKind::Kafka => {
            let topic = d.topic.as_deref().unwrap_or_default();
            crate::kafka::check_output_topic(&clients.dead_letter, topic, "dead_letter.topic")?;
        }
        None if file.source.kind == SourceKind::Kafka => {
            let topic = format!("{}-dlq", file.name);
            if crate::kafka::check_output_topic(&clients.dead_letter, &topic, "dead_letter")
                .is_err()
            {
                crate::kafka::ensure_topic(&clients.dead_letter, &topic, 1)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Creates the repartition topics of `file`'s `topology` if missing and
/// checks its partitioning (see [`prepare_topology`]).
pub fn ensure_repartition_topics(file: &PipelineFile, topology: &Topology) -> Result<()> {
    let clients = KafkaClients::of_pipeline(file)?;
    prepare_topology(&clients.cluster, &file.input_topics()?, topology)
}

/// Readies `topology`, whose input topics are `inputs` on the cluster at
/// `bootstrap`: creates its repartition topics if missing — as many
/// partitions as the widest input topic (a repartitioned join's two topics
/// alike, so that the reader's tasks join partition n of each), or one for
/// a grouping without keys (a global aggregate runs in one task) — and
/// refuses a grouping that its last stage would run on rows not
/// partitioned by its keys, unless that stage reads a single partition.
pub(crate) fn prepare_topology(
    cluster: &KafkaConnection,
    inputs: &[String],
    topology: &Topology,
) -> Result<()> {
    let regrouping = topology.unpartitioned_grouping();
    let distinct = topology.unpartitioned_distinct();
    if !topology.is_repartitioned() && regrouping.is_none() && distinct.is_none() {
        return Ok(());
    }
    let mut widest = 1;
    // A pattern subscription's topics are not known here.
    for topic in inputs.iter().filter(|t| !t.starts_with('^')) {
        widest = widest.max(crate::kafka::partition_count(cluster, topic)?);
    }
    if let Some(stage) = distinct {
        refuse_unpartitioned_distinct(stage, inputs, widest)?;
    }
    for (topic, keyed) in topology.repartition_topics() {
        crate::kafka::ensure_topic(cluster, topic, if keyed { widest } else { 1 })?;
    }
    let last_reads_one_partition = topology
        .repartition_topics()
        .last()
        .map_or(widest == 1, |(_, keyed)| !keyed || widest == 1);
    match regrouping {
        Some((keys, partitioned_by)) if !last_reads_one_partition => {
            Err(tidemark::error::Error::config(
                "steps",
                format!(
                    "grouping by {keys:?} after rows are partitioned by {partitioned_by:?} needs a second repartition, which tidemark does not run yet (the stage before it keeps state): include {partitioned_by:?} in its keys, read a topic with one partition, or run it in a second pipeline that reads this one's output"
                ),
            ))
        }
        _ => Ok(()),
    }
}

/// Refuses `stage`'s `distinct` (see [`Topology::unpartitioned_distinct`])
/// unless it reads one partition: the input topics `inputs` have at most
/// `widest` partitions (a pattern subscription, any number), a repartition
/// topic without keys one.
fn refuse_unpartitioned_distinct(stage: &Stage, inputs: &[String], widest: i32) -> Result<()> {
    let (reads_one, read) = match &stage.input {
        StageInput::Repartition { keys, topic } => (keys.is_empty() || widest == 1, topic.clone()),
        _ => (
            widest == 1 && !inputs.iter().any(|t| t.starts_with('^')),
            inputs.join(", "),
        ),
    };
    if reads_one {
        return Ok(());
    }
    Err(Error::config(
        "steps[].distinct",
        format!(
            "`distinct` keeps one of each row per partition, and `{read}` has more than one partition whose records are not keyed by columns of the row (no `source.keyed_by`, or a step before `distinct` drops or rewrites them): the same row in two partitions would come out twice. Set `source.keyed_by` to the columns the records are keyed by, or use `dedup: {{keys: [..]}}` with the columns that identify a row (it is repartitioned by them)"
        ),
    ))
}

/// Whether `file`'s stream join or union reads Kafka topics that are not
/// co-partitioned (different partition counts): it then runs repartitioned
/// (see [`PipelineFile::topology`]) rather than being refused.
pub fn join_needs_repartition(file: &PipelineFile) -> Result<bool> {
    let streams_beside = file
        .query_builder()?
        .plan()
        .second_inputs()
        .iter()
        .any(|i| {
            matches!(
                i.kind,
                SecondInputKind::StreamJoin { .. } | SecondInputKind::Union
            )
        });
    if file.source.kind != SourceKind::Kafka || !streams_beside {
        return Ok(false);
    }
    let clients = KafkaClients::of_pipeline(file)?;
    let mut counts = std::collections::BTreeSet::new();
    for topic in file.input_topics()? {
        counts.insert(crate::kafka::partition_count(&clients.cluster, &topic)?);
    }
    Ok(counts.len() > 1)
}

/// A Delta sink for `spec`, writing as `file`'s output mode asks.
fn delta_sink(
    spec: &SinkSpec,
    file: &PipelineFile,
    base_dir: &Path,
    role: SinkRole,
) -> Result<crate::delta::DeltaSink> {
    let real_time = role.real_time;
    use crate::delta::{DeltaSink, DeltaSinkConfig, DeltaWriteMode};
    use tidemark::operators::OutputMode;
    let mode = match (file.output_mode, spec.mode.unwrap_or_default()) {
        (OutputMode::Append, _) => DeltaWriteMode::Append,
        (OutputMode::Complete, _) => DeltaWriteMode::Overwrite,
        (OutputMode::Update, DeltaMode::Changes) => DeltaWriteMode::Changes,
        (OutputMode::Update, DeltaMode::Upsert) => DeltaWriteMode::Upsert {
            keys: if spec.key.is_empty() {
                file.query_builder()?.plan().output_keys()
            } else {
                spec.key.clone()
            },
        },
    };
    let path = spec.path.as_deref().unwrap_or_default();
    let location = if path.contains("://") {
        path.to_string()
    } else {
        resolve(base_dir, path).display().to_string()
    };
    let mut config = DeltaSinkConfig::new(
        &location,
        &tidemark::runtime::default_query_id(&file.name),
        mode,
    );
    config.partition_by = spec.partition_by.clone();
    config.table_properties = spec.table_properties.clone();
    config.storage_options = spec.storage_options.clone();
    config.merge_schema = spec.merge_schema;
    config.task_commits = role.task_commits
        && !real_time
        && matches!(
            config.mode,
            DeltaWriteMode::Append | DeltaWriteMode::Changes
        );
    if real_time {
        config.commit_interval = Some(
            spec.commit_interval
                .map_or(std::time::Duration::from_secs(1), |d| d.0),
        );
    }
    if !config.task_commits {
        config.owner = Some(role.instance);
    }
    if let Some(n) = spec.checkpoint_interval {
        config.checkpoint_every = n;
    }
    if let Some(n) = spec.compact_min_files {
        config.compact_min_files = n;
    }
    DeltaSink::new(config)
}

/// A client of the file's schema registry, if it names one.
fn registry_client(file: &PipelineFile, base_dir: &Path) -> Result<Option<RegistryClient>> {
    let mut config = match (&file.schema_registry, &file.source.schema_registry) {
        (Some(spec), _) => RegistryConfig {
            url: spec.url.clone(),
            properties: spec.properties.clone(),
        },
        (None, Some(url)) => RegistryConfig {
            url: url.clone(),
            properties: Default::default(),
        },
        (None, None) => return Ok(None),
    };
    // A CA file is found beside the pipeline file, as every other path.
    if let Some(ca) = config.properties.get_mut("ssl.ca.location") {
        *ca = resolve(base_dir, ca).display().to_string();
    }
    RegistryClient::new(&config).map(Some)
}

fn subject_name_strategy(spec: &SinkSpec) -> SubjectNameStrategy {
    match spec.subject_name_strategy {
        SubjectNameStrategySpec::Topic => SubjectNameStrategy::Topic,
        SubjectNameStrategySpec::Record => SubjectNameStrategy::Record,
        SubjectNameStrategySpec::TopicRecord => SubjectNameStrategy::TopicRecord,
    }
}

/// How a sink is used: under a real-time trigger; whether a Delta table
/// may commit per task (the query's main sink, over a Kafka source).
#[derive(Clone)]
struct SinkRole {
    real_time: bool,
    task_commits: bool,
    /// This instance's id: a table one instance writes is leased to it.
    instance: String,
}

fn build_sink(
    spec: &SinkSpec,
    file: &PipelineFile,
    base_dir: &Path,
    connection: &KafkaConnection,
    transactions: Option<&SharedTransactions>,
    role: SinkRole,
) -> Result<Box<dyn Sink>> {
    Ok(match spec.kind {
        SinkKind::Jsonl => Box::new(JsonlSink::new(resolve(
            base_dir,
            spec.path.as_deref().unwrap_or("out.jsonl"),
        ))?),
        SinkKind::Stdout => Box::new(StdoutSink),
        SinkKind::Delta => Box::new(delta_sink(spec, file, base_dir, role)?),
        SinkKind::Kafka => {
            let format = match spec.format {
                Format::Json => ValueFormat::Json,
                Format::Avro => {
                    let path = spec.avro_schema.as_deref().unwrap_or_default();
                    let schema = read_schema_file(&resolve(base_dir, path))?;
                    let id = match (registry_client(file, base_dir)?, spec.avro_schema_id) {
                        (Some(registry), None) => {
                            let topic = spec.topic.as_deref().unwrap_or_default();
                            let subject = subject_name_strategy(spec).subject(topic, &schema);
                            registry.register(&subject, &schema)?
                        }
                        (_, id) => id.unwrap_or(1),
                    };
                    ValueFormat::Avro(AvroEncoder::new(schema, id)?)
                }
                Format::Csv | Format::Parquet => {
                    return Err(Error::config("sink.format", "a sink writes json or avro"))
                }
            };
            let sink = KafkaSink::new(
                connection,
                spec.topic.as_deref().unwrap_or_default(),
                KeyColumns(spec.key.clone()),
                format,
            )?;
            match transactions {
                // No source transaction to commit in: the sink commits
                // its own, with a record of the batch.
                Some(t) if file.source.kind == SourceKind::Files => Box::new(
                    sink.with_transactions(t.clone())
                        .with_batch_progress(connection, &format!("{}-sink-progress", file.name))?,
                ),
                Some(t) => Box::new(sink.with_transactions(t.clone())),
                None => Box::new(sink),
            }
        }
    })
}
