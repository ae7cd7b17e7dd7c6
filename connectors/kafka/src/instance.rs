//! A process's identity among the instances of one application, as Kafka
//! Streams' process id: the transactional ids of an `exactly_once` query
//! derive from it, so that no two live instances share one (a shared
//! transactional id makes instances fence each other in a loop).
//!
//! Where it comes from, first match wins:
//! 1. `TIDEMARK_INSTANCE_ID`, when set (the operator's choice; two live
//!    processes given the same value fence each other);
//! 2. with a state directory, a slot under `<dir>/.instances/<application>/`:
//!    the process holds an exclusive lock on `<n>.lock` for as long as it
//!    lives (the operating system releases it when the process dies, even by
//!    SIGKILL) and uses the id stored in `<n>.id`, made once at random. A
//!    restarted instance takes the first free slot, usually its own, and so
//!    its predecessor's transactional id: it fences that zombie and aborts
//!    what it left open at once instead of waiting for the transaction
//!    timeout. Processes sharing one state directory take different slots;
//!    on other machines the random ids differ;
//! 3. otherwise an id made at random for this process.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::Write;
use std::path::{Path, PathBuf};
use tidemark::error::{Error, Result};

/// The environment variable that names an instance explicitly.
pub const INSTANCE_ID_VAR: &str = "TIDEMARK_INSTANCE_ID";

/// Slots tried before giving up: more processes than this sharing one state
/// directory is a configuration mistake.
const MAX_SLOTS: usize = 256;

/// This process's identity (see the module documentation). Keep it alive
/// for as long as the process runs the application: dropping it frees the
/// slot.
#[derive(Debug)]
pub struct InstanceIdentity {
    id: String,
    origin: IdentityOrigin,
    /// The locked slot file, held for the identity's lifetime.
    _slot: Option<File>,
    /// The directory of the application's slots, for a slot identity.
    slots: Option<PathBuf>,
}

/// The id of an instance slot no live process holds: a dead instance's.
/// The slot stays locked while this lives, so no process takes it
/// meanwhile.
#[derive(Debug)]
pub struct OrphanedSlot {
    /// The dead instance's id.
    pub id: String,
    _lock: File,
}

/// Where an [`InstanceIdentity`] came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityOrigin {
    /// `TIDEMARK_INSTANCE_ID`.
    Environment,
    /// Slot `n` of the state directory.
    StateDirectorySlot(usize),
    /// Made for this process only.
    Process,
}

impl InstanceIdentity {
    /// The identity of this process for `application_id`, whose state lives
    /// under `state_dir` when it has one.
    pub fn acquire(application_id: &str, state_dir: Option<&Path>) -> Result<Self> {
        if let Some(id) = std::env::var(INSTANCE_ID_VAR)
            .ok()
            .filter(|v| !v.trim().is_empty())
        {
            return Ok(InstanceIdentity {
                id,
                origin: IdentityOrigin::Environment,
                _slot: None,
                slots: None,
            });
        }
        match state_dir {
            Some(dir) => Self::from_slot(&dir.join(".instances").join(application_id)),
            None => Ok(Self::for_process()),
        }
    }

    /// An id made for this process alone, whatever the environment says
    /// (for queries without transactions, which need no stable identity).
    pub fn for_process() -> Self {
        InstanceIdentity {
            id: random_id(),
            origin: IdentityOrigin::Process,
            _slot: None,
            slots: None,
        }
    }

    /// The first slot of `dir` no live process holds.
    fn from_slot(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_error(dir, "creating", e))?;
        for slot in 0..MAX_SLOTS {
            let lock_path = dir.join(format!("{slot}.lock"));
            let lock = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| io_error(&lock_path, "opening", e))?;
            match lock.try_lock() {
                Ok(()) => {
                    let id = stored_id(&dir.join(format!("{slot}.id")))?;
                    return Ok(InstanceIdentity {
                        id,
                        origin: IdentityOrigin::StateDirectorySlot(slot),
                        _slot: Some(lock),
                        slots: Some(dir.to_path_buf()),
                    });
                }
                Err(TryLockError::WouldBlock) => continue,
                Err(TryLockError::Error(e)) => return Err(io_error(&lock_path, "locking", e)),
            }
        }
        Err(Error::config(
            "state.dir",
            format!(
                "{MAX_SLOTS} processes already hold an instance slot in {}: give each process its own state directory or {INSTANCE_ID_VAR}",
                dir.display()
            ),
        ))
    }

    /// The slots of this application that no live process holds but that
    /// have an id: instances that died (a restarted one usually takes its
    /// own slot back, but not when a lower slot is free). Their open
    /// transactions block `read_committed` readers and restores until the
    /// transaction timeout; fencing their ids aborts them at once.
    pub fn orphaned_slots(&self) -> Vec<OrphanedSlot> {
        let Some(dir) = &self.slots else {
            return Vec::new();
        };
        (0..MAX_SLOTS)
            .map_while(|slot| {
                let id_file = dir.join(format!("{slot}.id"));
                id_file.exists().then_some((slot, id_file))
            })
            .filter_map(|(slot, id_file)| {
                let lock = OpenOptions::new()
                    .write(true)
                    .open(dir.join(format!("{slot}.lock")))
                    .ok()?;
                lock.try_lock().ok()?;
                let id = std::fs::read_to_string(id_file).ok()?.trim().to_string();
                (!id.is_empty() && id != self.id).then_some(OrphanedSlot { id, _lock: lock })
            })
            .collect()
    }

    /// The instance id: what transactional ids are made from.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Where the id came from.
    pub fn origin(&self) -> &IdentityOrigin {
        &self.origin
    }

    /// The transactional id of `stage` (a query's or a repartition stage's
    /// name) for this instance.
    pub fn transactional_id(&self, stage: &str) -> String {
        format!("{stage}-{}", self.id)
    }
}

/// The id stored in `path`, written there first if the slot is new (only
/// the slot's lock holder gets here, so there is no race).
fn stored_id(path: &Path) -> Result<String> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let id = text.trim();
        if !id.is_empty() {
            return Ok(id.to_string());
        }
    }
    let id = random_id();
    let mut file = File::create(path).map_err(|e| io_error(path, "creating", e))?;
    file.write_all(id.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| io_error(path, "writing", e))?;
    Ok(id)
}

fn random_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

fn io_error(path: &Path, doing: &str, e: std::io::Error) -> Error {
    Error::source_failed(format!("instance identity: {doing} {}", path.display()), e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_holders_of_one_state_directory_get_distinct_ids_and_a_freed_slot_its_id_back() {
        let dir = tempfile::tempdir().unwrap();
        let slots = dir.path().join("app");
        let first = InstanceIdentity::from_slot(&slots).unwrap();
        let second = InstanceIdentity::from_slot(&slots).unwrap();
        assert_ne!(first.id(), second.id());
        assert_eq!(first.origin(), &IdentityOrigin::StateDirectorySlot(0));
        assert_eq!(second.origin(), &IdentityOrigin::StateDirectorySlot(1));
        let first_id = first.id().to_string();
        drop(first);
        // A restarted process takes the freed slot and its predecessor's id.
        // Its id is an orphan's for the others until a process takes it.
        let orphans = second.orphaned_slots();
        assert_eq!(
            orphans.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
            [first_id.as_str()]
        );
        drop(orphans);
        let restarted = InstanceIdentity::from_slot(&slots).unwrap();
        assert_eq!(restarted.id(), first_id);
        assert!(second.orphaned_slots().is_empty());
        assert_eq!(
            restarted.transactional_id("orders"),
            format!("orders-{first_id}")
        );
    }
}
