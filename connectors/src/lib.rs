//! Sources, sinks, decoders and dead-letter outputs for tidemark: Kafka
//! (rdkafka), Delta Lake tables, a directory of batch files, JSON-lines
//! files, stdout, and the Avro format in the Confluent wire format.

pub mod avro;
pub mod delta;
pub mod files;
mod from_pipeline;
pub mod instance;
pub mod kafka;
mod standby;
pub mod state_backend;

pub use from_pipeline::{
    connect, connect_as, ensure_repartition_topic, instance_identity, join_needs_repartition,
    Connected,
};
pub use state_backend::split_memory_budget;
