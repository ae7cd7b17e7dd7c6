//! Standby replicas: warm local copies of the stores of partitions this
//! instance does not own, kept by tailing their changelogs, so that a task
//! moving here replays only the changelog's tail.
//!
//! Without a custom partition assignor (librdkafka has no hook for one),
//! no coordinator tells an instance which partitions it is a standby for.
//! Each instance works it out from the group's own description instead,
//! which every member reads alike: the members (by their static
//! `group.instance.id`) and the partitions assigned to each. For each
//! partition the members other than its owner are ranked by a hash of
//! (member, partition), rendezvous hashing, and the first
//! `num_standby_replicas` of them keep a copy: N warm copies per task,
//! spread as Kafka Streams' assignor spreads standbys, and a member
//! joining or leaving moves only the copies it takes or held. Without a
//! static member id (`source.static_membership: false`) the members have
//! no name that outlives a restart, and each instance keeps a copy of
//! every partition it does not own, as before.
//!
//! The copy only ever holds committed changelog
//! records (read `read_committed`), and its `.checkpoint` file records the
//! offset it has applied up to, so the active task that later opens it
//! trusts it exactly as a cleanly closed task's files.

use crate::changelog_topic;
use crate::connection::KafkaConnection;
use crate::group_members::assigned_partitions;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// Which partitions this instance keeps warm; `None`: every partition
    /// it does not own.
    placement: Option<Placement>,
}

/// A group member's name and the partition numbers assigned to it.
type Member = (String, BTreeSet<i32>);

/// How often the group's description is read again for the placement.
const PLACEMENT_REFRESH: Duration = Duration::from_secs(5);

/// Where this instance's warm copies go (see the module documentation).
pub(crate) struct Placement {
    /// Copies per partition.
    copies: usize,
    /// The consumer group whose members keep the copies.
    group: String,
    /// This instance's static member id (`group.instance.id`).
    own: String,
    /// When the group was last read.
    read_at: Option<Instant>,
    /// The partitions this instance keeps warm, from the last stable read
    /// (none before one).
    chosen: Option<BTreeSet<i32>>,
}

impl Placement {
    /// `copies` per partition among `group`'s members, this one being the
    /// static member `own`.
    pub(crate) fn new(copies: usize, group: &str, own: &str) -> Self {
        Placement {
            copies,
            group: group.to_string(),
            own: own.to_string(),
            read_at: None,
            chosen: None,
        }
    }
}

/// A member's name in the placement: its static `group.instance.id`, which
/// the broker puts in front of the member id (`<instance id>-<uuid>`).
fn member_name(member_id: &str) -> &str {
    let Some(split) = member_id.len().checked_sub(37) else {
        return member_id;
    };
    match member_id
        .get(split..)
        .and_then(|tail| tail.strip_prefix('-'))
    {
        Some(uuid) if is_uuid(uuid) => &member_id[..split],
        _ => member_id,
    }
}

/// `8-4-4-4-12` hexadecimal digits.
fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// FNV-1a, 64 bits: a hash every instance computes alike, whatever its
/// Rust version (std's hasher promises no such thing).
fn placement_hash(member: &str, partition: i32) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in member.bytes().chain(partition.to_be_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// The partitions of `0..partitions` that member `own` keeps a copy of.
/// Partition by partition, `copies` of the members other than its owner
/// take one, the least loaded first (partitions owned plus copies taken so
/// far, as Kafka Streams' standby assignor weighs clients), ties broken by
/// [`placement_hash`]: every member computes the same placement from the
/// same description.
pub(crate) fn standby_partitions(
    members: &[Member],
    own: &str,
    partitions: i32,
    copies: usize,
) -> BTreeSet<i32> {
    let mut load: Vec<usize> = members.iter().map(|(_, owned)| owned.len()).collect();
    let mut kept = BTreeSet::new();
    for p in 0..partitions {
        let mut ranked: Vec<(usize, std::cmp::Reverse<u64>, usize)> = members
            .iter()
            .enumerate()
            .filter(|(_, (_, owned))| !owned.contains(&p))
            .map(|(i, (name, _))| (load[i], std::cmp::Reverse(placement_hash(name, p)), i))
            .collect();
        ranked.sort_unstable();
        for &(_, _, i) in ranked.iter().take(copies) {
            load[i] += 1;
            if members[i].0 == own {
                kept.insert(p);
            }
        }
    }
    kept
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
            placement: None,
        })
    }

    /// Keeps only the partitions `placement` gives this instance warm.
    pub(crate) fn with_placement(mut self, placement: Placement) -> Self {
        self.placement = Some(placement);
        self
    }

    /// The partitions to keep warm: those the placement gives this
    /// instance (read again from the group every [`PLACEMENT_REFRESH`]),
    /// or every partition not active here.
    fn wanted(&mut self, partitions: i32, active: &[i32]) -> BTreeSet<i32> {
        let Some(placement) = self.placement.as_mut() else {
            return (0..partitions).filter(|p| !active.contains(p)).collect();
        };
        if placement
            .read_at
            .is_none_or(|at| at.elapsed() >= PLACEMENT_REFRESH)
        {
            placement.read_at = Some(Instant::now());
            match read_members(&self.consumer, &placement.group) {
                Ok(Some(members)) => {
                    if let Some((_, owned)) = members.iter().find(|(m, _)| *m == placement.own) {
                        let chosen = standby_partitions(
                            &members,
                            &placement.own,
                            partitions,
                            placement.copies,
                        );
                        if placement.chosen.as_ref() != Some(&chosen) {
                            tracing::info!(standby = ?chosen, owned = ?owned, members = members.len(), "standby placement");
                            placement.chosen = Some(chosen);
                        }
                    }
                }
                // Rebalancing, or this instance not in the group yet: keep
                // the last placement.
                Ok(_) => {}
                Err(e) => tracing::debug!(error = %e, "the standby placement was not read"),
            }
        }
        placement
            .chosen
            .iter()
            .flatten()
            .copied()
            .filter(|p| !active.contains(p))
            .collect()
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
        let wanted = self.wanted(partitions, active);
        let unwanted: Vec<i32> = self
            .warm
            .keys()
            .copied()
            .filter(|p| !wanted.contains(p))
            .collect();
        let mut changed = !unwanted.is_empty();
        for partition in unwanted {
            // Its files stay, its checkpoint goes: a copy left behind for
            // long could miss deletes the changelog's compaction dropped
            // meanwhile, so a later use restores it from the start.
            self.warm.remove(&partition);
            let _ = std::fs::remove_file(self.checkpoint_file(partition));
        }
        for partition in wanted {
            if self.warm.contains_key(&partition) {
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
                    // A standby holds no batch back: the task that restores
                    // from this changelog meets the same record and stops.
                    crate::changelog::check_record_version(&m)?;
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
                    .map_err(|e| Error::source_failed("an offset list", e))?;
            }
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| Error::source_failed("assigning standby partitions", e))
    }
}

/// The members of `group` by name (see [`member_name`]) with the
/// partition numbers assigned to each, when the group is stable.
fn read_members(consumer: &BaseConsumer, group: &str) -> Result<Option<Vec<Member>>> {
    let list = consumer
        // On the processing thread, between batches: a coordinator slower
        // than this leaves the last placement in force, not the batch.
        .fetch_group_list(Some(group), Duration::from_millis(500))
        .map_err(|e| Error::source_failed(format!("describing group `{group}`"), e))?;
    let Some(described) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok(None);
    };
    if described.state() != "Stable" {
        return Ok(None);
    }
    Ok(Some(
        described
            .members()
            .iter()
            .map(|m| {
                let owned = m
                    .assignment()
                    .map(assigned_partitions)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(|p| p.rsplit_once('/')?.1.parse().ok())
                    .collect();
                (member_name(m.id()).to_string(), owned)
            })
            .collect(),
    ))
}

impl Drop for Standbys {
    fn drop(&mut self) {
        if self.applied > 0 {
            tracing::info!(records = self.applied, "standby records applied");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(owned: &[&[i32]]) -> Vec<Member> {
        owned
            .iter()
            .enumerate()
            .map(|(i, ps)| (format!("query-s{i}"), ps.iter().copied().collect()))
            .collect()
    }

    #[test]
    fn each_partition_gets_the_copies_asked_for_never_on_its_owner() {
        let group = members(&[&[0, 3], &[1, 4], &[2, 5]]);
        for copies in [1, 2, 5] {
            let mut count = [0usize; 6];
            for (name, owned) in &group {
                let chosen = standby_partitions(&group, name, 6, copies);
                assert!(chosen.is_disjoint(owned), "{name} keeps a copy of its own");
                for p in chosen {
                    count[p as usize] += 1;
                }
            }
            // Two members other than the owner: at most two copies.
            assert_eq!(count, [copies.min(2); 6], "copies {copies}");
        }
    }

    #[test]
    fn copies_go_to_the_least_loaded_members() {
        // Six partitions over three members, one copy each: two per member.
        let group = members(&[&[0, 3], &[1, 4], &[2, 5]]);
        for (name, _) in &group {
            assert_eq!(standby_partitions(&group, name, 6, 1).len(), 2, "{name}");
        }
        // A member owning nothing takes copies until it is as loaded as
        // the others.
        let uneven = members(&[&[0, 1, 2], &[3, 4, 5], &[]]);
        let taken = standby_partitions(&uneven, "query-s2", 6, 1);
        assert!(taken.is_superset(&BTreeSet::from([0, 1, 2])), "{taken:?}");
    }

    #[test]
    fn a_static_members_name_is_its_instance_id() {
        assert_eq!(
            member_name("orders-s1-2f1c9a4e-8d4b-4c3e-9a7f-0b1c2d3e4f50"),
            "orders-s1"
        );
        assert_eq!(member_name("rdkafka-short"), "rdkafka-short");
    }
}
