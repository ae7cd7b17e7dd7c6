//! Standby replicas: warm local copies of the stores of partitions this
//! instance does not own, kept by tailing their changelogs, so that a task
//! moving here replays only the changelog's tail.
//!
//! Without a custom partition assignor (the consumer group assigns with
//! cooperative-sticky), an instance cannot be told which partitions it is a
//! standby for: with standbys on, each instance keeps a copy of every
//! partition it does not own. The copy only ever holds committed changelog
//! records (read `read_committed`), and its `.checkpoint` file records the
//! offset it has applied up to, so the active task that later opens it
//! trusts it exactly as a cleanly closed task's files.

use crate::changelog_topic;
use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark::runtime::retry::{RepeatedWarning, WARNING_INTERVAL};
use tidemark_state::{MemoryBudget, StateStore, TaskDb};

/// A key's new value, `None` for a tombstone.
type KeyUpdate = (Vec<u8>, Option<Vec<u8>>);

/// The warm copies of one instance.
pub(crate) struct Standbys {
    consumer: BaseConsumer,
    state_dir: PathBuf,
    application_id: String,
    /// Changelog topic → store name.
    stores: BTreeMap<String, String>,
    /// Warm partitions: their database and next offset per store.
    warm: HashMap<i32, (TaskDb, BTreeMap<String, i64>)>,
    /// Records applied, for logs and tests.
    applied: u64,
    /// The consumer's errors while the cluster is unreachable, logged once
    /// per interval.
    error_warning: RepeatedWarning,
}

impl Standbys {
    pub(crate) fn new(
        cluster: &KafkaConnection,
        state_dir: PathBuf,
        application_id: &str,
    ) -> Result<Self> {
        let mut config = cluster.client_config(&[
            ("fetch.wait.max.ms", "50"),
            ("fetch.queue.backoff.ms", crate::FETCH_QUEUE_BACKOFF_MS),
        ]);
        config
            .set("group.id", format!("{application_id}-standby"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest");
        let consumer: BaseConsumer = cluster.create_plain(&config, "standby consumer")?;
        Ok(Standbys {
            consumer,
            state_dir,
            application_id: application_id.to_string(),
            stores: BTreeMap::new(),
            warm: HashMap::new(),
            applied: 0,
            error_warning: RepeatedWarning::new(WARNING_INTERVAL),
        })
    }

    /// Learns a store name (from the first task that opens it).
    pub(crate) fn know_store(&mut self, name: &str) {
        self.stores.insert(
            changelog_topic(&self.application_id, name),
            name.to_string(),
        );
    }

    fn checkpoint_file(&self, partition: i32) -> PathBuf {
        self.state_dir
            .join(&self.application_id)
            .join(partition.to_string())
            .join(crate::local_checkpoint::CHECKPOINT_FILE)
    }

    /// Stops keeping `partition` warm (it becomes active here): its files
    /// are closed and its checkpoint file says how far they go.
    pub(crate) fn release(&mut self, partition: i32) -> Result<()> {
        if let Some((db, offsets)) = self.warm.remove(&partition) {
            drop(db);
            crate::local_checkpoint::write_local_checkpoint(
                &self.checkpoint_file(partition),
                &offsets,
            )?;
            self.reassign()?;
            tracing::info!(
                partition,
                ?offsets,
                "standby handed over to the active task"
            );
        }
        Ok(())
    }

    /// Keeps every partition in `0..partitions` not in `active` warm, and
    /// applies what their changelogs received, for at most `budget` time.
    pub(crate) fn sync(
        &mut self,
        partitions: i32,
        active: &[i32],
        memory: &MemoryBudget,
        budget: Duration,
    ) -> Result<()> {
        if self.stores.is_empty() {
            return Ok(());
        }
        let mut changed = false;
        for partition in 0..partitions {
            if active.contains(&partition) || self.warm.contains_key(&partition) {
                continue;
            }
            let task = partition.to_string();
            let saved =
                crate::local_checkpoint::read_local_checkpoint(&self.checkpoint_file(partition));
            let trusted = self.stores.values().all(|s| saved.contains_key(s));
            if !trusted {
                TaskDb::destroy(&self.state_dir, &self.application_id, &task)?;
            }
            let db = TaskDb::open(&self.state_dir, &self.application_id, &task, memory)?;
            let offsets = self
                .stores
                .values()
                .map(|s| (s.clone(), if trusted { saved[s] } else { 0 }))
                .collect();
            self.warm.insert(partition, (db, offsets));
            changed = true;
        }
        if changed {
            self.reassign()?;
        }
        if self.warm.is_empty() {
            return Ok(());
        }
        let deadline = Instant::now() + budget;
        let mut batches: BTreeMap<(i32, String), Vec<KeyUpdate>> = BTreeMap::new();
        while Instant::now() < deadline {
            match self.consumer.poll(Duration::from_millis(10)) {
                Some(Ok(m)) => {
                    let Some(store) = self.stores.get(m.topic()) else {
                        continue;
                    };
                    let Some((_, offsets)) = self.warm.get_mut(&m.partition()) else {
                        continue;
                    };
                    offsets.insert(store.clone(), m.offset() + 1);
                    batches
                        .entry((m.partition(), store.clone()))
                        .or_default()
                        .push((
                            m.key().unwrap_or_default().to_vec(),
                            m.payload().map(<[u8]>::to_vec),
                        ));
                }
                Some(Err(e)) => {
                    if let Some(times) = self.error_warning.occurred() {
                        tracing::warn!(error = %e, times, "standby consumer error");
                    }
                    // The broker is likely down: try again next trigger.
                    break;
                }
                None => break,
            }
        }
        let mut touched = Vec::new();
        for ((partition, store), entries) in batches {
            if let Some((db, _)) = self.warm.get(&partition) {
                db.store(&store)?.write_batch(&entries)?;
                self.applied += entries.len() as u64;
                touched.push(partition);
            }
        }
        touched.dedup();
        for partition in touched {
            if let Some((_, offsets)) = self.warm.get(&partition) {
                crate::local_checkpoint::write_local_checkpoint(
                    &self.checkpoint_file(partition),
                    offsets,
                )?;
            }
        }
        metrics::gauge!("tidemark_standby_partitions").set(self.warm.len() as f64);
        Ok(())
    }

    fn reassign(&mut self) -> Result<()> {
        let mut tpl = TopicPartitionList::new();
        for (partition, (_, offsets)) in &self.warm {
            for (topic, store) in &self.stores {
                let next = offsets.get(store).copied().unwrap_or(0);
                tpl.add_partition_offset(topic, *partition, Offset::Offset(next))
                    .map_err(|e| Error::Source(e.to_string()))?;
            }
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| Error::Source(format!("assigning standby partitions: {e}")))
    }
}

impl Drop for Standbys {
    fn drop(&mut self) {
        if self.applied > 0 {
            tracing::info!(records = self.applied, "standby records applied");
        }
    }
}
