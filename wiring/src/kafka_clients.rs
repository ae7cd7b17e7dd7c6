//! Which Kafka clients a pipeline file's query creates and how each
//! connects: every one starts from the file's `kafka:` section (bootstrap
//! servers and librdkafka properties); the source's consumer, the sink's
//! producer and the dead-letter producer add their own `properties`.

use crate::kafka::{default_bootstrap, KafkaConnection};
use std::collections::BTreeMap;
use tidemark::error::{Error, Result};
use tidemark::runtime::SecondInputKind;
use tidemark_pipeline::{
    DeadLetterKind, PipelineFile, ProcessingGuarantee, SinkKind, SinkSpec, SourceKind,
};

/// The connections of a pipeline's Kafka clients.
#[derive(Debug, Clone)]
pub struct KafkaClients {
    /// The cluster the query runs against, with `kafka.properties`: its
    /// admin, changelog, restore, standby, table-feed, repartition and
    /// sink-progress clients. The source's for a Kafka source; the sink's
    /// for a files source writing to Kafka (its transactions live there).
    pub cluster: KafkaConnection,
    /// The source's consumer: the cluster with `source.properties`.
    pub source: KafkaConnection,
    /// The sink's producer: its own `bootstrap` (or the cluster's) with
    /// `sink.properties`; `linger.ms: 1` under the real-time trigger.
    pub sink: KafkaConnection,
    /// The dead-letter producer: the cluster with `dead_letter.properties`.
    pub dead_letter: KafkaConnection,
    /// The transactional producer under exactly_once: every record the
    /// query writes goes through it, so it takes the sink's properties.
    pub transactions: KafkaConnection,
}

impl KafkaClients {
    /// The connections `file` describes. Fails when exactly_once would
    /// need one transaction over two clusters.
    pub fn of_pipeline(file: &PipelineFile) -> Result<Self> {
        let kafka = file.kafka.clone().unwrap_or_default();
        let files_into_kafka =
            file.source.kind == SourceKind::Files && file.sink.kind == SinkKind::Kafka;
        let bootstrap = match files_into_kafka {
            true => file.sink.bootstrap.clone(),
            false => file.source.bootstrap.clone(),
        }
        .or(kafka.bootstrap)
        .unwrap_or_else(default_bootstrap);
        let cluster = KafkaConnection {
            bootstrap,
            properties: kafka.properties,
        };
        let sink = sink_connection(&cluster, &file.sink, is_real_time(file));
        let transactional = file.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && (file.source.kind == SourceKind::Kafka || files_into_kafka);
        if transactional && file.sink.kind == SinkKind::Kafka && sink.bootstrap != cluster.bootstrap
        {
            return Err(Error::config(
                "sink.bootstrap",
                format!(
                    "exactly_once commits the output, state and source offsets in one transaction, which lives on one cluster: the sink's `{}` is not the source's `{}` (use at_least_once, or write to the source's cluster)",
                    sink.bootstrap, cluster.bootstrap
                ),
            ));
        }
        let transactions = match file.sink.kind {
            SinkKind::Kafka => sink.clone(),
            _ => cluster.clone(),
        };
        let dead_letter_properties = file
            .dead_letter
            .as_ref()
            .map(|d| d.properties.0.clone())
            .unwrap_or_default();
        Ok(KafkaClients {
            source: cluster.with_overrides(&file.source.properties),
            dead_letter: cluster.with_overrides(&dead_letter_properties),
            sink,
            transactions,
            cluster,
        })
    }

    /// Fails fast when a cluster the query uses refuses its credentials or
    /// TLS settings (see [`KafkaConnection::check`]).
    pub fn check(&self, file: &PipelineFile) -> Result<()> {
        let kafka_sink = file.sink.kind == SinkKind::Kafka;
        if file.source.kind == SourceKind::Kafka || kafka_sink {
            self.cluster.check()?;
        }
        if kafka_sink && self.sink.bootstrap != self.cluster.bootstrap {
            self.sink.check()?;
        }
        Ok(())
    }

    /// The connection of a sink `spec` other than the main one (late data).
    pub fn other_sink(&self, spec: &SinkSpec, file: &PipelineFile) -> KafkaConnection {
        sink_connection(&self.cluster, spec, is_real_time(file))
    }

    /// Each client `file`'s query creates, with the connection it uses
    /// (secrets masked), for `tidemark describe`.
    pub fn describe(&self, file: &PipelineFile) -> Vec<(String, String)> {
        let mut clients = Vec::new();
        let kafka_source = file.source.kind == SourceKind::Kafka;
        let transactional = file.processing_guarantee == ProcessingGuarantee::ExactlyOnce
            && (kafka_source || file.sink.kind == SinkKind::Kafka);
        let mut add = |name: &str, connection: &KafkaConnection| {
            clients.push((name.to_string(), connection.describe()));
        };
        if kafka_source {
            add("source consumer", &self.source);
            add("admin and metadata client", &self.cluster);
        }
        if file.sink.kind == SinkKind::Kafka && !transactional {
            add("sink producer", &self.sink);
        }
        let repartitioned = file.topology(true).is_ok_and(|t| t.is_repartitioned());
        if kafka_source && repartitioned && !transactional {
            add("repartition producer", &self.cluster);
        }
        if transactional {
            add(
                "transactional producer (sink, changelog, dead letters, repartition)",
                &self.transactions,
            );
        }
        if file.source.kind == SourceKind::Files && transactional {
            add("sink progress consumer", &self.cluster);
        }
        let dead_letter_kafka = match &file.dead_letter {
            Some(d) => d.kind == DeadLetterKind::Kafka,
            None => kafka_source,
        };
        if dead_letter_kafka && !transactional {
            add("dead-letter producer", &self.dead_letter);
        }
        if let Some(late) = file
            .late_data
            .as_ref()
            .filter(|l| l.kind == SinkKind::Kafka)
        {
            add("late-data producer", &self.other_sink(late, file));
        }
        let state = file.state_spec();
        let changelog = state
            .as_ref()
            .is_some_and(|s| s.changelog.unwrap_or(kafka_source));
        if changelog {
            add("changelog writer and restore consumer", &self.cluster);
            if state.is_some_and(|s| s.num_standby_replicas > 0) {
                add("standby consumer", &self.cluster);
            }
        }
        let global_tables = file.query_builder().is_ok_and(|q| {
            q.plan()
                .second_inputs()
                .iter()
                .any(|i| i.kind == SecondInputKind::GlobalTable)
        });
        if kafka_source && global_tables {
            add("global table consumers", &self.cluster);
        }
        clients
    }
}

/// A sink's connection: its own bootstrap (or the cluster's), the query's
/// properties and its own on top.
fn sink_connection(cluster: &KafkaConnection, spec: &SinkSpec, real_time: bool) -> KafkaConnection {
    let mut properties: BTreeMap<String, String> = spec.properties.0.clone();
    // Measured on the 2-core test machine at 10k records/s: with 0 every
    // record became its own produce request and the broker fell behind
    // (p99 198 ms); with 1 the p99 was 4.4 ms.
    if real_time && !cluster.properties.contains_key("linger.ms") {
        properties
            .entry("linger.ms".into())
            .or_insert_with(|| "1".into());
    }
    match &spec.bootstrap {
        Some(bootstrap) => cluster.on_cluster(bootstrap),
        None => cluster.clone(),
    }
    .with_overrides(&properties)
}

fn is_real_time(file: &PipelineFile) -> bool {
    matches!(file.trigger.0, tidemark::runtime::Trigger::RealTime { .. })
}
