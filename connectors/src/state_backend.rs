//! The production state backend: RocksDB per task, with each store's
//! changes logged to a compacted Kafka changelog topic and restored from it.

use crate::kafka::{
    changelog_topic, ensure_topic_with_config, read_changelog, KafkaChangelogWriter,
};
use std::path::PathBuf;
use tidemark::error::{Error, Result};
use tidemark::runtime::StateBackend;
use tidemark_state::{CachingStore, ChangeLoggingStore, MemoryBudget, StateStore, TaskDb};

/// Where changelogs go.
#[derive(Clone)]
pub struct ChangelogConfig {
    /// Bootstrap servers.
    pub bootstrap: String,
    /// Partitions of each changelog topic (the input's partition count).
    pub partitions: i32,
    /// Replication factor of changelog topics.
    pub replication: i32,
}

/// RocksDB stores under `state_dir/<application_id>/<partition>`, one
/// column family per operator store, optionally change-logged to Kafka.
///
/// With a changelog, a task rebuilds each store from its changelog
/// partition when it starts (after a restart, a rebalance, or a lost local
/// directory), so local disk is a cache of the changelog. Without one, the
/// local RocksDB is the state and survives restarts on the same machine.
pub struct RocksDbStateBackend {
    state_dir: PathBuf,
    application_id: String,
    budget: MemoryBudget,
    cache_bytes: usize,
    changelog: Option<(ChangelogConfig, KafkaChangelogWriter)>,
    tasks: std::collections::HashMap<i32, TaskDb>,
    /// Records restored, for progress and logs.
    pub restored_records: u64,
}

impl RocksDbStateBackend {
    /// A backend; `memory_bytes` bounds RocksDB's block cache and write
    /// buffers together, `cache_bytes` the state each store's operator keeps
    /// in memory (the rest is read from RocksDB when needed), an eighth of
    /// which is the store's write cache.
    pub fn new(
        state_dir: impl Into<PathBuf>,
        application_id: &str,
        memory_bytes: usize,
        cache_bytes: usize,
        changelog: Option<ChangelogConfig>,
    ) -> Result<Self> {
        let changelog = match changelog {
            Some(config) => {
                let writer = KafkaChangelogWriter::new(&config.bootstrap, application_id)?;
                Some((config, writer))
            }
            None => None,
        };
        Ok(RocksDbStateBackend {
            state_dir: state_dir.into(),
            application_id: application_id.to_string(),
            budget: MemoryBudget::new(memory_bytes),
            cache_bytes,
            changelog,
            tasks: Default::default(),
            restored_records: 0,
        })
    }

    /// Appends changelog records inside `transactions` (exactly-once).
    pub fn with_transactions(mut self, transactions: crate::kafka::SharedTransactions) -> Self {
        self.changelog = self
            .changelog
            .take()
            .map(|(config, writer)| (config, writer.with_transactions(transactions)));
        self
    }

    fn task_db(&mut self, partition: i32) -> Result<TaskDb> {
        if let Some(db) = self.tasks.get(&partition) {
            return Ok(db.clone());
        }
        let task = partition.to_string();
        if self.changelog.is_some() {
            // The changelog is the truth: local files are rebuilt from it.
            TaskDb::destroy(&self.state_dir, &self.application_id, &task)?;
        }
        let db = TaskDb::open(&self.state_dir, &self.application_id, &task, &self.budget)?;
        self.tasks.insert(partition, db.clone());
        Ok(db)
    }
}

impl StateBackend for RocksDbStateBackend {
    fn open(&mut self, partition: i32, name: &str) -> Result<Box<dyn StateStore>> {
        let db = self.task_db(partition)?;
        match &self.changelog {
            None => Ok(Box::new(CachingStore::new(
                db.store(name)?,
                self.cache_bytes / 8,
            ))),
            Some((config, writer)) => {
                // Local writes of a batch whose transaction did not commit
                // may linger: rebuild from the changelog alone.
                let local = db.fresh_store(name)?;
                let topic = changelog_topic(&self.application_id, name);
                ensure_topic_with_config(
                    &config.bootstrap,
                    &topic,
                    config.partitions.max(partition + 1),
                    config.replication,
                    &[("cleanup.policy", "compact")],
                )?;
                let mut logged = ChangeLoggingStore::new(local, writer.clone(), partition);
                let started = std::time::Instant::now();
                let (records, end) = read_changelog(
                    &config.bootstrap,
                    &self.application_id,
                    name,
                    partition,
                    None,
                )?;
                let restored = logged.restore(records)?;
                self.restored_records += restored;
                metrics::counter!("tidemark_state_restored_records_total").increment(restored);
                tracing::info!(
                    store = name,
                    partition,
                    records = restored,
                    end_offset = end,
                    rate_per_s = restored as f64 / started.elapsed().as_secs_f64().max(1e-6),
                    "state restored from changelog"
                );
                Ok(Box::new(CachingStore::new(logged, self.cache_bytes / 8)))
            }
        }
    }

    fn cache_bytes(&self) -> Option<usize> {
        Some(self.cache_bytes)
    }

    fn commit(&mut self) -> Result<()> {
        match &self.changelog {
            Some((_, writer)) => writer.flush(),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for RocksDbStateBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RocksDbStateBackend({})", self.state_dir.display())
    }
}

/// The partition count of `topic`.
pub fn partition_count(bootstrap: &str, topic: &str) -> Result<i32> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| Error::Source(format!("metadata client: {e}")))?;
    let metadata = consumer
        .fetch_metadata(Some(topic), std::time::Duration::from_secs(10))
        .map_err(|e| Error::Source(format!("metadata of `{topic}`: {e}")))?;
    Ok(metadata
        .topics()
        .iter()
        .map(|t| t.partitions().len() as i32)
        .max()
        .unwrap_or(1)
        .max(1))
}
