//! Kafka: a consumer-group source, a producer sink, a dead-letter topic and
//! topic administration, on rdkafka; with the state that lives beside it:
//! RocksDB stores backed by changelog topics, standby replicas, and the
//! instance identity transactional ids derive from.
#![deny(missing_docs)]

mod batch_plan;
mod batch_produce;
mod carried;
mod changelog;
mod connection;
mod dead_letter;
mod exactly_once;
mod group_members;
mod producer;
pub mod reset;
mod sink;
mod sink_progress;
mod source;
mod table_feed;
pub mod test_broker;
mod watermark_exchange;

pub mod instance;
mod local_checkpoint;
mod standby;
pub mod state_backend;
mod state_versions;
pub use state_backend::split_memory_budget;

pub use changelog::{
    changelog_topic, read_changelog, restore_changelog, KafkaChangelogWriter, RestoreOptions,
};
pub use connection::{default_bootstrap, KafkaConnection};
pub use dead_letter::KafkaDeadLetter;
pub use exactly_once::SharedTransactions;
pub use group_members::{serving_client_id, GroupMember, GroupMembers};
pub use producer::send_with_backpressure;
pub use sink::{KafkaSink, KeyColumns, ValueFormat};
pub use source::{KafkaSource, KafkaSourceConfig};
pub use table_feed::KafkaTableFeed;
pub use watermark_exchange::KafkaWatermarkExchange;

mod admin;
pub use admin::{
    broker_creates_topics, check_output_topic, ensure_topic, ensure_topic_with_config,
    output_topic_verdict, partition_count,
};

/// `fetch.queue.backoff.ms` for every consumer of this crate. librdkafka's
/// default (1000 ms) stops fetching a partition for a full second whenever
/// its prefetch queue passed the threshold, even when the application
/// drains it in milliseconds: a consumer that keeps up spent more than half
/// of its time idle (Nexmark through Kafka: 14 s of wall time for 5 s of
/// CPU). A user's `properties` may still set it.
pub(crate) const FETCH_QUEUE_BACKOFF_MS: &str = "10";
