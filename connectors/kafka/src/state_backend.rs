//! The production state backend: RocksDB per task, with each store's
//! changes logged to a compacted Kafka changelog topic and restored from it.

use crate::connection::KafkaConnection;
use crate::local_checkpoint::{
    take_local_checkpoint, write_local_checkpoint, GuardedStore, LocalCheckpoint,
    TaskCheckpointGuard, CHECKPOINT_FILE,
};
use crate::state_versions::StateVersions;
use crate::{
    changelog_topic, ensure_topic_with_config, restore_changelog, KafkaChangelogWriter,
    RestoreOptions,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::runtime::{PendingStore, StateBackend};
use tidemark_state::{CachingStore, ChangeLoggingStore, MemoryBudget, StateStore, TaskDb};

/// Where changelogs go.
#[derive(Clone)]
pub struct ChangelogConfig {
    /// The cluster changelogs live on, with the query's client properties.
    pub cluster: KafkaConnection,
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
    /// Per task: the stores opened, and the changelog offsets its local
    /// checkpoint file vouched for when the task started.
    opened: std::collections::HashMap<i32, Vec<String>>,
    local_checkpoints: std::collections::HashMap<i32, LocalCheckpoint>,
    standbys: Option<crate::standby::Standbys>,
    /// Records restored and time taken since the last progress report
    /// (restores run on the query's restore threads).
    restore_stats: std::sync::Arc<std::sync::Mutex<tidemark::runtime::RestoreStats>>,
    restore_options: RestoreOptions,
    /// Per task with a changelog: whether its local files may be vouched
    /// for by a checkpoint file, and how far they reach.
    guards: std::collections::HashMap<i32, Arc<TaskCheckpointGuard>>,
    /// Without a changelog, under a source that logs its batches: a
    /// version of each task's state per batch.
    versions: Option<StateVersions>,
}

/// How soon after the last one a running task writes its local checkpoint
/// again (only when nothing was written since a commit).
const LOCAL_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);

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
                let writer = KafkaChangelogWriter::new(&config.cluster, application_id)?;
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
            opened: Default::default(),
            local_checkpoints: Default::default(),
            standbys: None,
            restore_stats: Default::default(),
            restore_options: RestoreOptions::default(),
            guards: Default::default(),
            versions: None,
        })
    }

    /// How restores read changelogs (chunk bounds, when to give up).
    pub fn with_restore_options(mut self, options: RestoreOptions) -> Self {
        self.restore_options = options;
        self
    }

    /// Appends changelog records inside `transactions` (exactly-once).
    pub fn with_transactions(mut self, transactions: crate::SharedTransactions) -> Self {
        self.changelog = self
            .changelog
            .take()
            .map(|(config, writer)| (config, writer.with_transactions(transactions)));
        self
    }

    /// Keeps `replicas` warm copies of each partition across the members
    /// of consumer group `group` (see the `standby` module), this instance
    /// being the static member `member` (`group.instance.id`); without one,
    /// a copy of every partition this instance does not own. Needs a
    /// changelog.
    pub fn with_standby_replicas(
        mut self,
        replicas: usize,
        group: &str,
        member: Option<&str>,
    ) -> Result<Self> {
        if replicas > 0 {
            if let Some((config, _)) = &self.changelog {
                let standbys = crate::standby::Standbys::new(
                    &config.cluster,
                    self.state_dir.clone(),
                    &self.application_id,
                )?;
                self.standbys = Some(match member {
                    Some(member) => standbys
                        .with_placement(crate::standby::Placement::new(replicas, group, member)),
                    None => {
                        tracing::warn!(
                            "without a static member id (source.static_membership: false) the instances cannot agree on where standby copies go: each keeps a copy of every partition it does not own"
                        );
                        standbys
                    }
                });
            }
        }
        Ok(self)
    }

    fn task_db(&mut self, partition: i32) -> Result<TaskDb> {
        if let Some(db) = self.tasks.get(&partition) {
            return Ok(db.clone());
        }
        if let Some(standbys) = self.standbys.as_mut() {
            standbys.release(partition)?;
        }
        let task = partition.to_string();
        let checkpoint_file = self
            .state_dir
            .join(&self.application_id)
            .join(&task)
            .join(CHECKPOINT_FILE);
        let checkpoint = if self.changelog.is_some() {
            self.guards.insert(
                partition,
                Arc::new(TaskCheckpointGuard::new(checkpoint_file.clone())),
            );
            take_local_checkpoint(&checkpoint_file)?
        } else {
            LocalCheckpoint::new()
        };
        if self.changelog.is_some() && checkpoint.is_empty() {
            // No clean close vouches for the local files: rebuild them
            // from the changelog, the truth.
            TaskDb::destroy(&self.state_dir, &self.application_id, &task)?;
        }
        let db = match TaskDb::open(&self.state_dir, &self.application_id, &task, &self.budget) {
            Ok(db) => db,
            Err(e) if self.changelog.is_some() => {
                tracing::warn!(partition, error = %e, "local state unreadable; restoring from the changelog");
                TaskDb::destroy(&self.state_dir, &self.application_id, &task)?;
                self.local_checkpoints
                    .insert(partition, LocalCheckpoint::new());
                let db = TaskDb::open(&self.state_dir, &self.application_id, &task, &self.budget)?;
                self.bind_directory(partition, &db)?;
                self.tasks.insert(partition, db.clone());
                return Ok(db);
            }
            Err(e) => return Err(e.into()),
        };
        self.local_checkpoints.insert(partition, checkpoint);
        self.bind_directory(partition, &db)?;
        self.tasks.insert(partition, db.clone());
        Ok(db)
    }

    /// Marks the task's directory as opened by this process (see
    /// [`TaskCheckpointGuard::directory_is_ours`]).
    fn bind_directory(&self, partition: i32, db: &TaskDb) -> Result<()> {
        match self.guards.get(&partition) {
            Some(guard) => guard.bind_directory(db.path()),
            None => Ok(()),
        }
    }
}

impl StateBackend for RocksDbStateBackend {
    fn open(&mut self, partition: i32, name: &str) -> Result<Box<dyn StateStore>> {
        self.open_deferred(partition, name)?()
    }

    fn open_deferred(&mut self, partition: i32, name: &str) -> Result<PendingStore> {
        let db = self.task_db(partition)?;
        let write_cache = self.cache_bytes / 8;
        match &self.changelog {
            None => {
                let store: Box<dyn StateStore> =
                    Box::new(CachingStore::new(db.store(name)?, write_cache));
                Ok(Box::new(move || Ok(store)))
            }
            Some((config, writer)) => {
                // Local files are kept only when the task's last run
                // closed cleanly after a commit and recorded the changelog
                // offset they match; then only what came later is replayed.
                // Otherwise local writes of a batch whose transaction did
                // not commit may linger: rebuild from the changelog alone.
                // Taken, not read: a store reopened in this process (after
                // an aborted batch) may hold uncommitted writes.
                let from = self
                    .local_checkpoints
                    .get_mut(&partition)
                    .and_then(|c| c.remove(name));
                let guard = self.guards.get(&partition).cloned().ok_or_else(|| {
                    Error::Internal(format!("task {partition}: no checkpoint guard"))
                })?;
                let local = match from {
                    Some(_) => db.store(name)?,
                    None => {
                        // Dropped outside the guard's writes: no checkpoint
                        // file may vouch for the task from here on.
                        guard.discard_file()?;
                        db.fresh_store(name)?
                    }
                };
                let local = GuardedStore::new(local, guard.clone());
                self.opened
                    .entry(partition)
                    .or_default()
                    .push(name.to_string());
                if let Some(standbys) = self.standbys.as_mut() {
                    standbys.know_store(name);
                }
                let topic = changelog_topic(&self.application_id, name);
                ensure_topic_with_config(
                    &config.cluster,
                    &topic,
                    config.partitions.max(partition + 1),
                    config.replication,
                    &[("cleanup.policy", "compact")],
                )?;
                // How far this process's own records reach is what a
                // checkpoint may claim beyond the restore.
                writer.track(&topic);
                let mut logged = ChangeLoggingStore::new(local, writer.clone(), partition);
                let (cluster, application_id, name) = (
                    config.cluster.clone(),
                    self.application_id.clone(),
                    name.to_string(),
                );
                let stats = self.restore_stats.clone();
                let restore_options = self.restore_options;
                let restoring = RestoreInProgress::new(guard);
                Ok(Box::new(move || {
                    let started = std::time::Instant::now();
                    let (restored, end) = restore_changelog(
                        &cluster,
                        &application_id,
                        &name,
                        partition,
                        from,
                        restore_options,
                        &mut |chunk| Ok(logged.restore_chunk(chunk)?),
                    )?;
                    // Restored without the write-ahead log: on disk before
                    // any checkpoint may vouch for it.
                    logged.flush()?;
                    restoring.0.restored(&name, end);
                    drop(restoring);
                    {
                        let mut stats = stats.lock().unwrap_or_else(|p| p.into_inner());
                        stats.records += restored;
                        stats.millis += started.elapsed().as_millis() as u64;
                    }
                    metrics::counter!("tidemark_state_restored_records_total").increment(restored);
                    tracing::info!(
                        store = name,
                        partition,
                        from_local_checkpoint = from,
                        records = restored,
                        end_offset = end,
                        rate_per_s = restored as f64 / started.elapsed().as_secs_f64().max(1e-6),
                        "state restored from changelog"
                    );
                    let store: Box<dyn StateStore> =
                        Box::new(CachingStore::new(logged, write_cache));
                    Ok(store)
                }))
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

    fn resume_at_version(&mut self, committed: Option<u64>) -> Result<()> {
        // A changelog is the truth a task restores from; versions are for
        // state that lives on local disk alone.
        if self.changelog.is_some() {
            return Ok(());
        }
        let versions = StateVersions::new(self.state_dir.join(&self.application_id));
        versions.roll_back(committed)?;
        self.versions = Some(versions);
        Ok(())
    }

    fn version(&mut self, batch_id: u64) -> Result<()> {
        let Some(versions) = &self.versions else {
            return Ok(());
        };
        for (partition, db) in &self.tasks {
            versions.snapshot(*partition, db, batch_id)?;
        }
        Ok(())
    }

    fn take_restore_stats(&mut self) -> tidemark::runtime::RestoreStats {
        std::mem::take(&mut *self.restore_stats.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn batch_committed(&mut self) -> Result<()> {
        for guard in self.guards.values() {
            guard.batch_committed();
        }
        Ok(())
    }

    fn batch_aborted(&mut self) -> Result<()> {
        for guard in self.guards.values() {
            guard.abandon()?;
        }
        Ok(())
    }

    fn between_batches(&mut self) -> Result<()> {
        self.write_due_checkpoints();
        let (Some(standbys), Some((config, _))) = (self.standbys.as_mut(), &self.changelog) else {
            return Ok(());
        };
        let active: Vec<i32> = self.tasks.keys().copied().collect();
        standbys.sync(
            config.partitions,
            &active,
            &self.budget,
            std::time::Duration::from_millis(50),
        )
    }

    fn close(&mut self, partition: i32) -> Result<()> {
        let db = self.tasks.remove(&partition);
        let stores = self.opened.remove(&partition).unwrap_or_default();
        let guard = self.guards.remove(&partition);
        self.local_checkpoints.remove(&partition);
        let (Some(db), Some(guard)) = (db, guard) else {
            return Ok(());
        };
        // Closed right after a commit, the local stores equal their
        // changelogs up to where this process restored and wrote them:
        // record where, so the next start replays only what comes after.
        // After an aborted batch they may not: no checkpoint, the next
        // start restores in full.
        let checkpoint = match guard.clean() && guard.directory_is_ours() {
            true => self.own_positions(partition, &guard, &stores),
            false => None,
        };
        let file = db.path().join(CHECKPOINT_FILE);
        drop(db);
        let Some(checkpoint) = checkpoint else {
            // Nor one left from before: the next start restores in full.
            guard.discard_file()?;
            tracing::info!(partition, "local state closed without a checkpoint");
            return Ok(());
        };
        write_local_checkpoint(&file, &checkpoint)?;
        tracing::info!(
            partition,
            stores = checkpoint.len(),
            "local state checkpointed"
        );
        Ok(())
    }
}

impl RocksDbStateBackend {
    /// Writes the local checkpoint of every task that committed and wrote
    /// nothing since, at most every [`LOCAL_CHECKPOINT_INTERVAL`]: a
    /// restart after an error or a crash then replays only the changelog's
    /// tail. A checkpoint is an optimisation: failing to write one is
    /// logged, not an error.
    fn write_due_checkpoints(&mut self) {
        for (partition, guard) in &self.guards {
            if !guard.checkpoint_due(LOCAL_CHECKPOINT_INTERVAL) {
                continue;
            }
            let stores = self.opened.get(partition).map_or(&[][..], Vec::as_slice);
            let Some(checkpoint) = self.own_positions(*partition, guard, stores) else {
                continue;
            };
            if let Err(e) = guard.write(&checkpoint) {
                tracing::warn!(partition, error = %e, "local checkpoint not written");
            }
        }
    }

    /// How far the local files of `partition`'s `stores` reflect their
    /// changelogs, from this process's own restores and writes (see
    /// [`TaskCheckpointGuard::positions`]); `None` without a changelog or
    /// when a store was not restored here.
    fn own_positions(
        &self,
        partition: i32,
        guard: &TaskCheckpointGuard,
        stores: &[String],
    ) -> Option<LocalCheckpoint> {
        let (_, writer) = self.changelog.as_ref()?;
        guard.positions(stores, |name| {
            writer.written_end(&changelog_topic(&self.application_id, name), partition)
        })
    }
}

/// Held by a store's restore while it runs (dropped when it ends, fails or
/// never runs): its task's checkpoint waits for it.
struct RestoreInProgress(Arc<TaskCheckpointGuard>);

impl RestoreInProgress {
    fn new(guard: Arc<TaskCheckpointGuard>) -> Self {
        guard.restore_started();
        RestoreInProgress(guard)
    }
}

impl Drop for RestoreInProgress {
    fn drop(&mut self) {
        self.0.restore_finished();
    }
}

impl std::fmt::Debug for RocksDbStateBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RocksDbStateBackend({})", self.state_dir.display())
    }
}

/// Splits one state memory budget of `total_bytes` for `tasks` tasks:
/// returns RocksDB's share (block cache and write buffers, for all tasks)
/// and each task's operator share (cached keys). A quarter each; the other
/// half is left for what neither share counts, measured with 10M keys
/// (`bench/src/bin/state.rs`): RocksDB's pinned index and filter
/// partitions, memtables and iterators, the operators' per-key overhead
/// beyond their estimate, a batch's rows and write batches, and allocator
/// slack after keys are dropped. Each share costs about 1.2-1.35 times its
/// size in resident memory.
///
/// ```
/// let (rocksdb, per_task) = tidemark_kafka::split_memory_budget(512 << 20, 4);
/// assert_eq!(rocksdb, 128 << 20);
/// assert_eq!(per_task, 32 << 20);
/// ```
pub fn split_memory_budget(total_bytes: usize, tasks: usize) -> (usize, usize) {
    let share = total_bytes / 4;
    (share, (share / tasks.max(1)).max(1 << 20))
}
