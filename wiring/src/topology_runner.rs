//! Runs a query built in Rust over Kafka topics, in as many stages as its
//! topology needs: a grouping that is not on the record key (or a join of
//! inputs keyed otherwise) is repartitioned through internal topics, as
//! Kafka Streams does for a `KStream#groupBy`, without the application
//! creating them or starting the stages.
//!
//! ```no_run
//! use tidemark::prelude::*;
//! use tidemark_connectors::kafka::{
//!     KafkaConnection, KafkaSink, KafkaSourceConfig, KeyColumns, ValueFormat,
//! };
//! use tidemark_connectors::TopologyRunner;
//!
//! let query = || {
//!     Ok(Query::builder("per-region")
//!         .event_time("ts")
//!         .watermark("1 minute")?
//!         .keyed_by(&["user"]) // how the producer keyed `events`
//!         .window_aggregate(["region"], WindowSpec::tumbling("1 minute")?, vec![AggregateSpec::count()])
//!         .output_mode(OutputMode::Update))
//! };
//! // Every client the runner creates (consumers, repartition producers,
//! // admin) connects with these settings.
//! let cluster = KafkaConnection::new("broker-1:9093")
//!     .property("security.protocol", "SASL_SSL")
//!     .property("sasl.mechanism", "SCRAM-SHA-512")
//!     .property("sasl.username", "app")
//!     .property("sasl.password", std::env::var("KAFKA_PASSWORD").unwrap_or_default());
//! let input = KafkaSourceConfig {
//!     cluster: cluster.clone(),
//!     topics: vec!["events".into()],
//!     group: "per-region".into(),
//!     earliest: true,
//!     properties: Default::default(),
//! };
//! let summary = TopologyRunner::new(query, input, move || {
//!     let sink = KafkaSink::new(&cluster, "counts", KeyColumns(vec!["region".into()]),
//!                               ValueFormat::Json)?;
//!     Ok(Box::new(sink) as Box<dyn tidemark::runtime::Sink>)
//! })
//! .run()
//! .unwrap();
//! println!("{} rows out", summary.output_rows);
//! ```

use crate::from_pipeline::{check_co_partitioned, repartition_sink, stage_source_config};
use crate::kafka::{KafkaSource, KafkaSourceConfig};
use crate::runner::{retry_transient, run_stages, Progress};
use std::sync::Arc;
use std::time::Duration;
use tidemark::error::Result;
use tidemark::runtime::{
    QueryBuilder, RunSummary, Sink, Stage, StageInput, StageOutput, StopHandle,
};

/// Builds the query afresh for each run of each stage.
type QueryFactory = Arc<dyn Fn() -> Result<QueryBuilder> + Send + Sync>;
/// Builds the query's sink afresh for each run of the stage writing it.
type SinkFactory = Arc<dyn Fn() -> Result<Box<dyn Sink>> + Send + Sync>;

/// Runs a [`QueryBuilder`] query reading Kafka topics: its stages
/// ([`QueryBuilder::into_topology`]), their repartition topics (created
/// with as many partitions as the widest input topic), restarts after
/// transient failures and one stop handle. At-least-once; the query's
/// decoder and dead-letter output (set on the builder) serve the stage
/// reading its own input (a repartitioned join's second stream is read
/// with the default JSON decoder), its state backend and progress
/// listeners the stage writing the sink.
pub struct TopologyRunner {
    query: QueryFactory,
    input: KafkaSourceConfig,
    sink: SinkFactory,
    stop: StopHandle,
    task_timeout: Duration,
}

impl TopologyRunner {
    /// A runner for the query `query` builds, reading `input`, writing
    /// what `sink` builds. Both are called again when a stage restarts.
    pub fn new(
        query: impl Fn() -> Result<QueryBuilder> + Send + Sync + 'static,
        input: KafkaSourceConfig,
        sink: impl Fn() -> Result<Box<dyn Sink>> + Send + Sync + 'static,
    ) -> Self {
        TopologyRunner {
            query: Arc::new(query),
            input,
            sink: Arc::new(sink),
            stop: StopHandle::default(),
            task_timeout: crate::runner::DEFAULT_TASK_TIMEOUT,
        }
    }

    /// How long a stage may keep failing with errors worth retrying before
    /// the run fails (default 5 minutes, as Kafka Streams' `task.timeout.ms`).
    pub fn task_timeout(mut self, timeout: Duration) -> Self {
        self.task_timeout = timeout;
        self
    }

    /// Stops every stage after its current batch when `stop` is stopped.
    pub fn stop_handle(mut self, stop: StopHandle) -> Self {
        self.stop = stop;
        self
    }

    /// The names of the stages the query runs in, writers first.
    pub fn stage_names(&self) -> Result<Vec<String>> {
        Ok((self.query)()?
            .into_topology()
            .stages
            .into_iter()
            .map(|s| s.name)
            .collect())
    }

    /// Runs until the input ends (`available_now`) or a stop; returns the
    /// summary of the stage writing the sink.
    pub fn run(&self) -> Result<RunSummary> {
        // Its topics are Kafka's: a grouping after a join must hold where
        // the join's partitions are.
        (self.query)()?.plan().check_join_partitioning(true)?;
        let topology = (self.query)()?.into_topology();
        let trigger = topology.trigger();
        let mut inputs = self.input.topics.clone();
        inputs.extend(
            (self.query)()?
                .plan()
                .joined_topics()
                .into_iter()
                .flat_map(|(_, t)| t),
        );
        // A broker restarting as this starts is waited for, not the end.
        retry_transient(
            "start",
            &self.stop,
            self.task_timeout,
            &Progress::default(),
            || crate::from_pipeline::prepare_topology(&self.input.cluster, &inputs, &topology),
        )?;
        let names: Vec<String> = topology.stages.iter().map(|s| s.name.clone()).collect();
        run_stages(&names, trigger, &self.stop, |index| {
            let committed = Progress::default();
            retry_transient(
                &names[index],
                &self.stop,
                self.task_timeout,
                &committed,
                || {
                    let stage = (self.query)()?.into_topology().stages.swap_remove(index);
                    self.run_once(stage, committed.clone())
                },
            )
        })
    }

    fn run_once(&self, stage: Stage, committed: Progress) -> Result<RunSummary> {
        let mut config = self.input.clone();
        match &stage.input {
            StageInput::Source => {}
            StageInput::Joined { topics, .. } => config.topics = topics.clone(),
            StageInput::Repartition { topic, .. } => config.topics = vec![topic.clone()],
        }
        let joined = stage.query.plan().joined_topics();
        config
            .topics
            .extend(joined.into_iter().flat_map(|(_, t)| t));
        let own_topics = config.topics.clone();
        if stage.query.plan().needs_co_partitioned_inputs() {
            check_co_partitioned(&config.cluster, &config.topics)?;
            // Partition n of every topic to the same instance.
            config
                .properties
                .entry("partition.assignment.strategy".into())
                .or_insert_with(|| "range".into());
        }
        let mut source = KafkaSource::new(stage_source_config(config, &stage.input))?;
        let mut sink = match &stage.output {
            StageOutput::Sink => (self.sink)()?,
            StageOutput::Repartition { topic, keys } => {
                repartition_sink(&self.input.cluster, topic, keys, &own_topics, None)?
            }
        };
        let mut builder = stage
            .query
            .on_progress(move |_: &tidemark::progress::QueryProgress| committed.batch_committed());
        if builder.plan().forwards_stream_maxima() {
            // A writer under the query scope counts the other instances'
            // progress, shared on a topic of its own.
            let topic = format!("{}-watermarks", stage.name);
            let exchange = crate::kafka::KafkaWatermarkExchange::new(&self.input.cluster, &topic)?;
            builder = builder.watermark_exchange(exchange);
        }
        let query = builder.build()?.with_stop_handle(self.stop.clone());
        query.run(&mut source, sink.as_mut())
    }
}
