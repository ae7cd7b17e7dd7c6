//! The `state:` section: where state lives and how its changelogs are
//! made.

use crate::DurationSpec;
use serde::Deserialize;

/// `state:`: where stateful operators keep their state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    /// The state directory (RocksDB per task under `<dir>/<name>/<partition>`).
    pub dir: String,
    /// Log every change to a compacted Kafka topic and restore from it
    /// (default: true for a Kafka source, false for files).
    #[serde(default)]
    pub changelog: Option<bool>,
    /// Memory for RocksDB's block cache and write buffers, in MiB.
    #[serde(default = "default_state_memory_mb")]
    pub memory_mb: usize,
    /// Replication factor of changelog topics.
    #[serde(default = "default_replication")]
    pub replication: i32,
    /// Standby replicas: with 1 or more, each instance keeps warm copies
    /// of the partitions it does not own, so a moved task replays only the
    /// changelog's tail.
    #[serde(default)]
    pub num_standby_replicas: usize,
    /// How long a restore may go without reading anything new from a
    /// changelog before the task fails (default 5 minutes); a restore of
    /// any size runs as long as it makes progress.
    #[serde(default)]
    pub restore_stall_timeout: Option<DurationSpec>,
}

impl StateSpec {
    /// State under `dir` with every other key at its default (as a file's
    /// `state_dir: <dir>` reads).
    pub fn new(dir: impl Into<String>) -> StateSpec {
        StateSpec {
            dir: dir.into(),
            changelog: None,
            memory_mb: default_state_memory_mb(),
            replication: default_replication(),
            num_standby_replicas: 0,
            restore_stall_timeout: None,
        }
    }
}

fn default_state_memory_mb() -> usize {
    256
}

fn default_replication() -> i32 {
    1
}
