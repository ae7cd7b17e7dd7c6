//! Wires a pipeline file to its connectors, and re-exports each connector
//! crate under one roof: Kafka ([`kafka`], with the changelog-backed state
//! and the instance identity), Delta Lake tables ([`delta`]), a directory of
//! batch files, JSON-lines files and stdout ([`files`]), and Avro in the
//! Confluent wire format ([`avro`]).
#![deny(missing_docs)]

pub use tidemark_avro as avro;
pub use tidemark_delta as delta;
pub use tidemark_files as files;
pub use tidemark_kafka as kafka;
pub use tidemark_kafka::{instance, state_backend};
pub use tidemark_pipeline as pipeline;

mod from_pipeline;
mod kafka_app;
mod kafka_clients;
mod reset;
mod runner;
mod running;
mod serving;
mod topology_runner;

pub use from_pipeline::{
    check_output_topics, connect, connect_as, connect_stage, ensure_repartition_topics,
    instance_identity, join_needs_repartition, Connected,
};
pub use kafka_app::KafkaApp;
pub use kafka_clients::KafkaClients;
pub use reset::ResetPlan;
pub use runner::{is_transient, PipelineRunner};
pub use running::{stop_on_signals, RunningPipeline};
pub use serving::start_metrics;
pub use tidemark_kafka::split_memory_budget;
pub use topology_runner::TopologyRunner;
