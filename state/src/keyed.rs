//! Typed keyed state: the named value, list and map states of a stateful
//! processor, their processing-time TTL and the timers of each key, all in
//! one [`StateStore`] so that they share its changelog, restore, standbys
//! and transactions.
//!
//! Layout (one store; every part of a key sorts together, so a key's whole
//! state is one prefix scan and the earliest timer or expiry one seek):
//!
//! | store key | value |
//! |---|---|
//! | `k` len(key) key `s` state `0x00` `v` | a value state's cell |
//! | `k` len(key) key `s` state `0x00` `l` seq | one list element's cell |
//! | `k` len(key) key `s` state `0x00` `n` | the list's next sequence number |
//! | `k` len(key) key `s` state `0x00` `m` map-key | one map entry's cell |
//! | `k` len(key) key `t` domain time | a timer of the key |
//! | `t` domain time key | the same timer, in firing order |
//! | `x` expiry cell-key | a cell's TTL, in expiry order |
//! | `y` time cell-key | a cell's event-time expiry, in expiry order |
//! | `g` name | a value of the whole store (a count, say) |
//!
//! A cell is `0` and the value, or `1`, its expiry (little-endian
//! microseconds) and the value (that first byte is the cell's layout: a
//! higher one, of a newer release, is refused); values are JSON (serde), so a state type
//! that gains a field with a default reads what an older version wrote.
//! Times sort as big-endian integers with the sign bit flipped.

use crate::{StateError, StateStore};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Microseconds since the epoch.
pub type Micros = i64;

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeDomain {
    /// Fires once the watermark reaches the timer's time.
    EventTime,
    /// Fires once a batch's processing time reaches the timer's time.
    ProcessingTime,
}

impl TimeDomain {
    fn tag(self) -> u8 {
        match self {
            TimeDomain::EventTime => b'e',
            TimeDomain::ProcessingTime => b'p',
        }
    }

    fn index(self) -> usize {
        match self {
            TimeDomain::EventTime => 0,
            TimeDomain::ProcessingTime => 1,
        }
    }

    fn of_tag(tag: u8) -> Option<Self> {
        match tag {
            b'e' => Some(TimeDomain::EventTime),
            b'p' => Some(TimeDomain::ProcessingTime),
            _ => None,
        }
    }
}

/// The kind of a declared state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    /// One value per key.
    Value,
    /// An ordered list per key, one store entry per element.
    List,
    /// A map per key, one store entry per map key.
    Map,
}

impl StateKind {
    fn tag(self) -> u8 {
        match self {
            StateKind::Value => b'v',
            StateKind::List => b'l',
            StateKind::Map => b'm',
        }
    }
}

/// Counts of what the keyed state did since they were last taken.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyedStateCounts {
    /// Cells written (a value set, a list element or map entry added).
    pub written: u64,
    /// Cells removed by the processor (cleared, removed, replaced).
    pub removed: u64,
    /// Cells removed because their TTL ran out.
    pub expired: u64,
    /// Timers registered.
    pub timers_registered: u64,
    /// Timers deleted by the processor.
    pub timers_deleted: u64,
}

/// A timer taken out of the store because it is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueTimer {
    /// The timer's clock.
    pub domain: TimeDomain,
    /// Its time, in microseconds.
    pub time: Micros,
    /// The grouping key it belongs to (encoded).
    pub key: Vec<u8>,
}

/// Typed keyed state over a store (see the module documentation).
pub struct KeyedStateStore {
    store: Box<dyn StateStore>,
    /// Processing time: cells whose expiry is at or before it are gone.
    now: Micros,
    counts: KeyedStateCounts,
    /// Per clock (event, processing): no timer is earlier. Timers fire in
    /// time order and are deleted as they fire, so a scan from the
    /// index's start would step over every fired timer's tombstone until
    /// RocksDB compacts them; it starts here instead.
    timer_floor: [Micros; 2],
    /// No TTL entry is earlier (the same, for the TTL index).
    expiry_floor: Micros,
    /// No event-time expiry entry is earlier (the same, for its index).
    event_expiry_floor: Micros,
    /// Timers (their entries under the key) deleted since the due list
    /// was last read, so that firing one needs no read to learn whether a
    /// handler deleted it meanwhile.
    timers_deleted: hashbrown::HashSet<Vec<u8>, foldhash::fast::RandomState>,
}

/// A time as bytes that sort as the times do.
fn sortable(time: Micros) -> [u8; 8] {
    ((time as u64) ^ (1 << 63)).to_be_bytes()
}

fn time_of(bytes: &[u8]) -> Option<Micros> {
    let raw: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(raw) ^ (1 << 63)) as i64)
}

/// The prefix of everything `key` holds.
pub fn key_section(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 16);
    out.push(b'k');
    out.extend((key.len() as u32).to_be_bytes());
    out.extend(key);
    out
}

/// The key section (`k`, the key's length, the key) a store key starts
/// with, if it is one of a key's entries. RocksDB's prefix filters are
/// built on it, so that a scan of one key's section skips the files that
/// hold nothing of that key instead of seeking into each.
pub(crate) fn section_of(store_key: &[u8]) -> Option<&[u8]> {
    let len: [u8; 4] = store_key.get(1..5)?.try_into().ok()?;
    let end = 5usize.checked_add(u32::from_be_bytes(len) as usize)?;
    match store_key.first() {
        Some(b'k') if store_key.len() >= end => Some(&store_key[..end]),
        _ => None,
    }
}

/// The prefix of the cells of state `state` (of `kind`) of `key`.
pub fn cell_prefix(key: &[u8], state: &str, kind: StateKind) -> Vec<u8> {
    let mut out = key_section(key);
    out.push(b's');
    out.extend(state.as_bytes());
    out.push(0);
    out.push(kind.tag());
    out
}

impl KeyedStateStore {
    /// Typed keyed state in `store`.
    pub fn new(store: Box<dyn StateStore>) -> Self {
        KeyedStateStore {
            store,
            now: Micros::MIN,
            counts: KeyedStateCounts::default(),
            timer_floor: [Micros::MIN; 2],
            expiry_floor: Micros::MIN,
            event_expiry_floor: Micros::MIN,
            timers_deleted: Default::default(),
        }
    }

    /// Sets the processing time TTLs count from and expire at.
    pub fn set_processing_time(&mut self, now: Micros) {
        self.now = now;
    }

    /// The store below.
    pub fn store(&self) -> &dyn StateStore {
        self.store.as_ref()
    }

    /// What was done since the last call.
    pub fn take_counts(&mut self) -> KeyedStateCounts {
        std::mem::take(&mut self.counts)
    }

    fn error(&self, reason: String) -> StateError {
        StateError::Backend {
            store: self.store.name().to_string(),
            reason,
        }
    }

    /// Decodes a cell, `None` when its TTL ran out.
    fn decode_cell<T: DeserializeOwned>(
        &self,
        key: &[u8],
        cell: &[u8],
    ) -> Result<Option<T>, StateError> {
        let payload = match cell.first() {
            Some(0) => &cell[1..],
            Some(1) if cell.len() >= 9 => {
                let expiry = i64::from_le_bytes(cell[1..9].try_into().expect("8 bytes"));
                if expiry <= self.now {
                    return Ok(None);
                }
                &cell[9..]
            }
            // The header is the cell's layout: 0 and 1 are this release's;
            // a newer release would mark a new layout with another.
            Some(header) if *header > 1 => {
                return Err(StateError::UnknownLayout {
                    store: self.store.name().to_string(),
                    what: format!("the state cell at {}", String::from_utf8_lossy(key)),
                    found: (*header).into(),
                    supported: 1,
                })
            }
            _ => {
                return Err(self.error(format!(
                    "a state cell of {} bytes has no header",
                    cell.len()
                )))
            }
        };
        serde_json::from_slice(payload).map(Some).map_err(|e| {
            self.error(format!(
                "cannot read the state at {} as the processor's type: {e} (a field added to a state type needs #[serde(default)])",
                String::from_utf8_lossy(key)
            ))
        })
    }

    fn encode_cell<T: Serialize>(
        &self,
        value: &T,
        expiry: Option<Micros>,
    ) -> Result<Vec<u8>, StateError> {
        let mut cell = match expiry {
            None => vec![0],
            Some(e) => {
                let mut c = vec![1];
                c.extend(e.to_le_bytes());
                c
            }
        };
        serde_json::to_writer(&mut cell, value)
            .map_err(|e| self.error(format!("cannot encode a state value: {e}")))?;
        Ok(cell)
    }

    /// The value of the cell at `cell_key`, unless absent or expired.
    pub fn get<T: DeserializeOwned>(&self, cell_key: &[u8]) -> Result<Option<T>, StateError> {
        match self.store.get(cell_key)? {
            Some(cell) => self.decode_cell(cell_key, &cell),
            None => Ok(None),
        }
    }

    /// Writes the cell at `cell_key`; with a TTL it expires that long
    /// after the current processing time.
    pub fn put<T: Serialize>(
        &mut self,
        cell_key: &[u8],
        value: &T,
        ttl: Option<Micros>,
    ) -> Result<(), StateError> {
        let expiry = ttl.map(|ttl| self.now.saturating_add(ttl));
        let cell = self.encode_cell(value, expiry)?;
        if ttl.is_some() {
            self.forget_expiry(cell_key)?;
        }
        self.store.put(cell_key, &cell)?;
        if let Some(expiry) = expiry {
            self.expiry_floor = self.expiry_floor.min(expiry);
            self.store.put(&ttl_key(expiry, cell_key), &[])?;
        }
        self.counts.written += 1;
        Ok(())
    }

    /// Removes the TTL entry of the cell at `cell_key`, if it has one: a
    /// cell written again or removed leaves no stale entry behind.
    fn forget_expiry(&mut self, cell_key: &[u8]) -> Result<(), StateError> {
        if let Some(old) = self.store.get(cell_key)? {
            if let Some(expiry) = cell_expiry(&old) {
                self.store.delete(&ttl_key(expiry, cell_key))?;
            }
        }
        Ok(())
    }

    /// Removes the cell at `cell_key` and its TTL entry.
    pub fn delete(&mut self, cell_key: &[u8]) -> Result<(), StateError> {
        self.forget_expiry(cell_key)?;
        self.store.delete(cell_key)?;
        self.counts.removed += 1;
        Ok(())
    }

    /// The live cells under `prefix`, in key order, with what follows the
    /// prefix in their keys.
    pub fn scan<T: DeserializeOwned>(
        &self,
        prefix: &[u8],
    ) -> Result<Vec<(Vec<u8>, T)>, StateError> {
        let mut out = Vec::new();
        for (key, cell) in self.store.prefix(prefix)? {
            if let Some(value) = self.decode_cell(&key, &cell)? {
                out.push((key[prefix.len()..].to_vec(), value));
            }
        }
        Ok(out)
    }

    /// Removes every entry under `prefix`.
    pub fn delete_prefix(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        for (key, cell) in self.store.prefix(prefix)? {
            self.delete_cell(&key, &cell)?;
        }
        Ok(())
    }

    /// Deletes the state cell stored at `key` as `cell`, with its TTL
    /// index entry.
    fn delete_cell(&mut self, key: &[u8], cell: &[u8]) -> Result<(), StateError> {
        if let Some(expiry) = cell_expiry(cell) {
            self.store.delete(&ttl_key(expiry, key))?;
        }
        self.store.delete(key)?;
        self.counts.removed += 1;
        Ok(())
    }

    /// Appends `value` to the list at `prefix` (a [`cell_prefix`] of
    /// [`StateKind::List`]): one new entry, the others untouched.
    pub fn append<T: Serialize>(
        &mut self,
        prefix: &[u8],
        value: &T,
        ttl: Option<Micros>,
    ) -> Result<(), StateError> {
        let mut next_key = prefix.to_vec();
        next_key.pop();
        next_key.push(b'n');
        let seq = match self.store.get(&next_key)? {
            Some(bytes) => u64::from_le_bytes(
                bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| self.error("a list's sequence number is not 8 bytes".into()))?,
            ),
            None => 0,
        };
        let mut element = prefix.to_vec();
        element.extend(seq.to_be_bytes());
        self.put(&element, value, ttl)?;
        self.store.put(&next_key, &(seq + 1).to_le_bytes())
    }

    /// Removes the list at `prefix`, its sequence number too.
    pub fn clear_list(&mut self, prefix: &[u8]) -> Result<(), StateError> {
        self.delete_prefix(prefix)?;
        let mut next_key = prefix.to_vec();
        next_key.pop();
        next_key.push(b'n');
        self.store.delete(&next_key)
    }

    /// Registers a timer of `key` (registering it again changes nothing).
    pub fn register_timer(
        &mut self,
        key: &[u8],
        domain: TimeDomain,
        time: Micros,
    ) -> Result<(), StateError> {
        let (own, index) = timer_keys(key, domain, time);
        let floor = &mut self.timer_floor[domain.index()];
        *floor = (*floor).min(time);
        // Written without asking first: a timer registered again is the
        // same two empty entries (a read per registration saved).
        self.store.put(&own, &[])?;
        self.store.put(&index, &[])?;
        self.timers_deleted.remove(&own);
        self.counts.timers_registered += 1;
        Ok(())
    }

    /// Takes out a timer of the list [`KeyedStateStore::due_timers`] last
    /// returned (with no [`KeyedStateStore::flush`] since), unless a
    /// handler deleted it since (then `false`). Known without a read:
    /// deletions since that list are remembered.
    pub fn take_timer(
        &mut self,
        key: &[u8],
        domain: TimeDomain,
        time: Micros,
    ) -> Result<bool, StateError> {
        let (own, index) = timer_keys(key, domain, time);
        if self.timers_deleted.contains(&own) {
            return Ok(false);
        }
        self.store.delete(&own)?;
        self.store.delete(&index)?;
        Ok(true)
    }

    /// Empties the set of timers deleted since the due list, giving back
    /// the memory a burst of deletions took.
    fn forget_deleted_timers(&mut self) {
        if self.timers_deleted.capacity() > 4096 {
            self.timers_deleted = Default::default();
        } else {
            self.timers_deleted.clear();
        }
    }

    /// Whether `key` has this timer.
    pub fn has_timer(
        &self,
        key: &[u8],
        domain: TimeDomain,
        time: Micros,
    ) -> Result<bool, StateError> {
        Ok(self.store.get(&timer_keys(key, domain, time).0)?.is_some())
    }

    /// Deletes a timer of `key` (a no-op when there is none).
    pub fn delete_timer(
        &mut self,
        key: &[u8],
        domain: TimeDomain,
        time: Micros,
    ) -> Result<(), StateError> {
        // Deleted without asking first: deleting what is not there
        // changes nothing (a read per deletion saved).
        let (own, index) = timer_keys(key, domain, time);
        self.store.delete(&own)?;
        self.store.delete(&index)?;
        self.timers_deleted.insert(own);
        self.counts.timers_deleted += 1;
        Ok(())
    }

    /// The timers of `key`, by clock then time.
    pub fn timers(&self, key: &[u8]) -> Result<Vec<(TimeDomain, Micros)>, StateError> {
        let mut prefix = key_section(key);
        prefix.push(b't');
        let mut out = Vec::new();
        for (entry, _) in self.store.prefix(&prefix)? {
            let rest = &entry[prefix.len()..];
            let domain = rest.first().copied().and_then(TimeDomain::of_tag);
            match (domain, time_of(&rest[1.min(rest.len())..])) {
                (Some(d), Some(t)) => out.push((d, t)),
                _ => return Err(self.error("a timer entry is malformed".into())),
            }
        }
        Ok(out)
    }

    /// The earliest timer of `domain`, if any.
    pub fn earliest_timer(&self, domain: TimeDomain) -> Result<Option<Micros>, StateError> {
        let mut start = vec![b't', domain.tag()];
        start.extend(sortable(self.timer_floor[domain.index()]));
        let end = [b't', domain.tag() + 1];
        Ok(self
            .store
            .first_in_range(&start, &end)?
            .and_then(|(k, _)| time_of(&k[2..])))
    }

    /// Every timer of `domain` at or before `up_to`, in time order; the
    /// caller deletes each as it fires it (and skips one a handler deleted
    /// meanwhile: [`KeyedStateStore::take_timer`]). Timers registered from
    /// now on at or before `up_to` are found by the next call.
    pub fn due_timers(
        &mut self,
        domain: TimeDomain,
        up_to: Micros,
    ) -> Result<Vec<DueTimer>, StateError> {
        let floor = &mut self.timer_floor[domain.index()];
        let mut start = vec![b't', domain.tag()];
        start.extend(sortable(*floor));
        let mut end = vec![b't', domain.tag()];
        match up_to.checked_add(1) {
            Some(after) => end.extend(sortable(after)),
            None => end = vec![b't', domain.tag() + 1],
        }
        *floor = (*floor).max(up_to.saturating_add(1));
        self.forget_deleted_timers();
        let mut due = Vec::new();
        for (index, _) in self.store.range(&start, &end)? {
            let time =
                time_of(&index[2..]).ok_or_else(|| self.error("a timer is malformed".into()))?;
            due.push(DueTimer {
                domain,
                time,
                key: index[10..].to_vec(),
            });
        }
        Ok(due)
    }

    /// Writes the cell at `cell_key`, which the caller knows is absent (a
    /// read saved), to be removed by [`KeyedStateStore::expire_event_time`]
    /// once the watermark reaches `expiry`; `None`: kept until deleted. A
    /// cell written this way before must first go through
    /// [`KeyedStateStore::delete_until`] with its old expiry (the same
    /// cell written again with the same expiry is the one exception):
    /// otherwise its old entry in the expiry order would remove the new
    /// cell at the old time.
    pub fn insert_until<T: Serialize>(
        &mut self,
        cell_key: &[u8],
        value: &T,
        expiry: Option<Micros>,
    ) -> Result<(), StateError> {
        let cell = self.encode_cell(value, None)?;
        self.store.put(cell_key, &cell)?;
        if let Some(expiry) = expiry {
            self.event_expiry_floor = self.event_expiry_floor.min(expiry);
            self.store.put(&event_expiry_key(expiry, cell_key), &[])?;
        }
        self.counts.written += 1;
        Ok(())
    }

    /// Deletes a cell [`KeyedStateStore::insert_until`] wrote with
    /// `expiry`, and its entry in the expiry order.
    pub fn delete_until(
        &mut self,
        cell_key: &[u8],
        expiry: Option<Micros>,
    ) -> Result<(), StateError> {
        if let Some(expiry) = expiry {
            self.store.delete(&event_expiry_key(expiry, cell_key))?;
        }
        self.store.delete(cell_key)?;
        self.counts.removed += 1;
        Ok(())
    }

    /// Removes every cell whose event-time expiry is at or before
    /// `watermark`; returns the grouping keys they belonged to.
    pub fn expire_event_time(&mut self, watermark: Micros) -> Result<Vec<Vec<u8>>, StateError> {
        let mut start = vec![b'y'];
        start.extend(sortable(self.event_expiry_floor));
        let mut end = vec![b'y'];
        match watermark.checked_add(1) {
            Some(after) => end.extend(sortable(after)),
            None => end = vec![b'z'],
        }
        self.event_expiry_floor = self.event_expiry_floor.max(watermark.saturating_add(1));
        let mut keys = Vec::new();
        for (index, _) in self.store.range(&start, &end)? {
            let cell_key = &index[9.min(index.len())..];
            let key = section_of(cell_key)
                .map(|section| section[5..].to_vec())
                .ok_or_else(|| self.error("an event-time expiry entry is malformed".into()))?;
            self.store.delete(cell_key)?;
            self.store.delete(&index)?;
            self.counts.expired += 1;
            keys.push(key);
        }
        Ok(keys)
    }

    /// Every key's value of the value state `state`, in key order.
    pub fn values_of<T: DeserializeOwned>(
        &self,
        state: &str,
    ) -> Result<Vec<(Vec<u8>, T)>, StateError> {
        let mut out = Vec::new();
        for (entry, cell) in self.store.prefix(b"k")? {
            let Some(section) = section_of(&entry) else {
                continue;
            };
            let key = &section[5..];
            if entry != cell_prefix(key, state, StateKind::Value) {
                continue;
            }
            if let Some(value) = self.decode_cell(&entry, &cell)? {
                out.push((key.to_vec(), value));
            }
        }
        Ok(out)
    }

    /// Deletes a store entry outside this layout (one an operator's
    /// earlier layout left, as it moves onto this one).
    pub fn delete_unkeyed(&mut self, store_key: &[u8]) -> Result<(), StateError> {
        self.store.delete(store_key)
    }

    /// Sets a value of the whole store.
    pub fn put_global(&mut self, name: &str, value: &[u8]) -> Result<(), StateError> {
        self.store.put(&global_key(name), value)
    }

    /// A value of the whole store.
    pub fn global(&self, name: &str) -> Result<Option<Vec<u8>>, StateError> {
        self.store.get(&global_key(name))
    }

    /// Removes every cell whose TTL ran out by the processing time and the
    /// TTL entries that are due; returns how many cells went.
    pub fn expire(&mut self) -> Result<u64, StateError> {
        let mut end = vec![b'x'];
        match self.now.checked_add(1) {
            Some(after) => end.extend(sortable(after)),
            None => end = vec![b'y'],
        }
        let mut start = vec![b'x'];
        start.extend(sortable(self.expiry_floor));
        self.expiry_floor = self.expiry_floor.max(self.now.saturating_add(1));
        let mut expired = 0;
        for (index, _) in self.store.range(&start, &end)? {
            let expiry = time_of(&index[1..])
                .ok_or_else(|| self.error("a TTL entry is malformed".into()))?;
            let cell_key = &index[9..];
            // Each entry is its cell's current expiry (a rewrite or a
            // removal takes the old one out); checked all the same.
            if let Some(cell) = self.store.get(cell_key)? {
                if cell_expiry(&cell) == Some(expiry) {
                    self.store.delete(cell_key)?;
                    expired += 1;
                    self.forget_empty_list(cell_key)?;
                }
            }
            self.store.delete(&index)?;
        }
        self.counts.expired += expired;
        Ok(expired)
    }

    /// Removes a list's sequence number once its last element expired, so
    /// that a key whose list expired leaves nothing behind.
    fn forget_empty_list(&mut self, cell_key: &[u8]) -> Result<(), StateError> {
        // A list element's key: a cell prefix ending in `l`, then 8 bytes.
        let Some(prefix) = cell_key.len().checked_sub(8).map(|at| &cell_key[..at]) else {
            return Ok(());
        };
        if prefix.last() != Some(&b'l') || prefix.get(prefix.len().wrapping_sub(2)) != Some(&0) {
            return Ok(());
        }
        if self.store.prefix(prefix)?.is_empty() {
            let mut next_key = prefix.to_vec();
            next_key.pop();
            next_key.push(b'n');
            self.store.delete(&next_key)?;
        }
        Ok(())
    }

    /// Removes every state and timer of `key`.
    pub fn clear_key(&mut self, key: &[u8]) -> Result<(), StateError> {
        let section = key_section(key);
        // One scan: the key's timers (`t` after the section) take their
        // index entries along.
        for (entry, cell) in self.store.prefix(&section)? {
            let rest = &entry[section.len()..];
            match rest {
                [b't', tag, time @ ..] => {
                    if let (Some(domain), Some(time)) = (TimeDomain::of_tag(*tag), time_of(time)) {
                        self.store.delete(&timer_keys(key, domain, time).1)?;
                        self.counts.timers_deleted += 1;
                    }
                    self.store.delete(&entry)?;
                    self.timers_deleted.insert(entry);
                }
                _ => self.delete_cell(&entry, &cell)?,
            }
        }
        Ok(())
    }

    /// Everything `key` holds, for a read: `(state, kind, entry)` where
    /// the entry is the value, a list element or a map entry's
    /// `(map key, value)`, as JSON; expired cells left out.
    pub fn read_key(
        &self,
        key: &[u8],
    ) -> Result<Vec<(String, StateKind, serde_json::Value)>, StateError> {
        let mut prefix = key_section(key);
        prefix.push(b's');
        let mut out = Vec::new();
        for (entry, cell) in self.store.prefix(&prefix)? {
            let rest = &entry[prefix.len()..];
            let Some(end) = rest.iter().position(|b| *b == 0) else {
                continue;
            };
            let name = String::from_utf8_lossy(&rest[..end]).into_owned();
            let (kind, sub) = match rest.get(end + 1) {
                Some(b'v') => (StateKind::Value, &rest[end + 2..]),
                Some(b'l') => (StateKind::List, &rest[end + 2..]),
                Some(b'm') => (StateKind::Map, &rest[end + 2..]),
                _ => continue,
            };
            let Some(value) = self.decode_cell::<serde_json::Value>(&entry, &cell)? else {
                continue;
            };
            let value = match kind {
                StateKind::Map => serde_json::json!({
                    "key": serde_json::from_slice::<serde_json::Value>(sub)
                        .unwrap_or_else(|_| String::from_utf8_lossy(sub).into()),
                    "value": value,
                }),
                _ => value,
            };
            out.push((name, kind, value));
        }
        Ok(out)
    }

    /// Makes what was written durable (the store's flush).
    pub fn flush(&mut self) -> Result<(), StateError> {
        // No due list outlives a batch.
        self.forget_deleted_timers();
        self.store.flush()
    }

    /// Entries in the store (estimated on disk).
    pub fn approximate_len(&self) -> usize {
        self.store.approximate_len()
    }
}

/// A cell's expiry, if it has a TTL.
fn cell_expiry(cell: &[u8]) -> Option<Micros> {
    match cell {
        [1, expiry @ ..] if expiry.len() >= 8 => {
            Some(i64::from_le_bytes(expiry[..8].try_into().expect("8 bytes")))
        }
        _ => None,
    }
}

/// The entry of a cell in the event-time expiry order.
fn event_expiry_key(expiry: Micros, cell_key: &[u8]) -> Vec<u8> {
    expiry_order_key(b'y', expiry, cell_key)
}

fn global_key(name: &str) -> Vec<u8> {
    let mut key = vec![b'g'];
    key.extend(name.as_bytes());
    key
}

/// The TTL index entry of a cell expiring at `expiry`.
fn ttl_key(expiry: Micros, cell_key: &[u8]) -> Vec<u8> {
    expiry_order_key(b'x', expiry, cell_key)
}

/// A cell's entry in the expiry order `tag`: the tag, the time, the cell.
fn expiry_order_key(tag: u8, expiry: Micros, cell_key: &[u8]) -> Vec<u8> {
    let mut index = Vec::with_capacity(cell_key.len() + 9);
    index.push(tag);
    index.extend(sortable(expiry));
    index.extend(cell_key);
    index
}

/// A timer's entry under its key and its entry in firing order.
fn timer_keys(key: &[u8], domain: TimeDomain, time: Micros) -> (Vec<u8>, Vec<u8>) {
    let mut own = key_section(key);
    own.push(b't');
    own.push(domain.tag());
    own.extend(sortable(time));
    let mut index = Vec::with_capacity(key.len() + 10);
    index.push(b't');
    index.push(domain.tag());
    index.extend(sortable(time));
    index.extend(key);
    (own, index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryStore;

    fn store() -> KeyedStateStore {
        KeyedStateStore::new(Box::new(InMemoryStore::new("p")))
    }

    /// A cell whose header is a newer release's layout is refused as such.
    #[test]
    fn a_cell_of_a_newer_layout_is_refused() {
        let mut s = store();
        let v = cell_prefix(b"a", "count", StateKind::Value);
        s.put(&v, &3u64, None).unwrap();
        let mut cell = s.store().get(&v).unwrap().unwrap();
        cell[0] = 2;
        let mut newer = InMemoryStore::new("p");
        newer.put(&v, &cell).unwrap();
        let e = KeyedStateStore::new(Box::new(newer))
            .get::<u64>(&v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("layout 2") && e.contains("newer release"), "{e}");
        assert!(
            matches!(
                KeyedStateStore::new(Box::new({
                    let mut again = InMemoryStore::new("p");
                    again.put(&v, &cell).unwrap();
                    again
                }))
                .get::<u64>(&v),
                Err(StateError::UnknownLayout { found: 2, .. })
            ),
            "a layout error, not a backend failure"
        );
    }

    #[test]
    fn values_lists_and_maps_live_per_key() {
        let mut s = store();
        let v = cell_prefix(b"a", "count", StateKind::Value);
        s.put(&v, &3u64, None).unwrap();
        assert_eq!(s.get::<u64>(&v).unwrap(), Some(3));
        assert_eq!(
            s.get::<u64>(&cell_prefix(b"b", "count", StateKind::Value))
                .unwrap(),
            None
        );
        let l = cell_prefix(b"a", "seen", StateKind::List);
        for x in ["x", "y", "z"] {
            s.append(&l, &x, None).unwrap();
        }
        let items: Vec<String> = s.scan(&l).unwrap().into_iter().map(|(_, v)| v).collect();
        assert_eq!(items, ["x", "y", "z"]);
        let mut m = cell_prefix(b"a", "by", StateKind::Map);
        m.extend(br#""k1""#);
        s.put(&m, &1.5f64, None).unwrap();
        let read = s.read_key(b"a").unwrap();
        assert_eq!(read.len(), 5, "{read:?}");
        s.clear_key(b"a").unwrap();
        assert!(s.read_key(b"a").unwrap().is_empty());
        assert_eq!(
            s.store().approximate_len(),
            0,
            "a cleared key leaves nothing"
        );
    }

    #[test]
    fn a_ttl_hides_a_cell_once_due_and_expire_removes_it_unless_rewritten() {
        let mut s = store();
        s.set_processing_time(1_000);
        let (a, b) = (
            cell_prefix(b"a", "v", StateKind::Value),
            cell_prefix(b"b", "v", StateKind::Value),
        );
        s.put(&a, &1, Some(100)).unwrap();
        s.put(&b, &2, Some(100)).unwrap();
        s.set_processing_time(1_050);
        s.put(&b, &3, Some(100)).unwrap(); // refreshed: now due at 1_150
        s.set_processing_time(1_100);
        assert_eq!(s.get::<i32>(&a).unwrap(), None, "due at 1_100");
        assert_eq!(s.expire().unwrap(), 1);
        assert_eq!(s.get::<i32>(&b).unwrap(), Some(3));
        s.set_processing_time(1_150);
        assert_eq!(s.expire().unwrap(), 1);
        assert_eq!(s.store().approximate_len(), 0, "no stale TTL entry left");
        // A list whose elements all expired leaves nothing either.
        let l = cell_prefix(b"c", "l", StateKind::List);
        s.append(&l, &1, Some(10)).unwrap();
        s.append(&l, &2, Some(10)).unwrap();
        s.set_processing_time(1_160);
        assert_eq!(s.expire().unwrap(), 2);
        assert_eq!(
            s.store().approximate_len(),
            0,
            "nor a list's sequence number"
        );
    }

    #[test]
    fn timers_fire_in_time_order_once_and_can_be_deleted() {
        let mut s = store();
        s.register_timer(b"a", TimeDomain::EventTime, 30).unwrap();
        s.register_timer(b"b", TimeDomain::EventTime, -5).unwrap();
        s.register_timer(b"a", TimeDomain::EventTime, 10).unwrap();
        s.register_timer(b"a", TimeDomain::ProcessingTime, 10)
            .unwrap();
        s.delete_timer(b"a", TimeDomain::EventTime, 10).unwrap();
        assert_eq!(s.earliest_timer(TimeDomain::EventTime).unwrap(), Some(-5));
        assert_eq!(
            s.timers(b"a").unwrap(),
            [
                (TimeDomain::EventTime, 30),
                (TimeDomain::ProcessingTime, 10)
            ]
        );
        let due = s.due_timers(TimeDomain::EventTime, 30).unwrap();
        let fired: Vec<(Micros, &[u8])> = due.iter().map(|t| (t.time, t.key.as_slice())).collect();
        assert_eq!(fired, [(-5, &b"b"[..]), (30, &b"a"[..])]);
        for t in &due {
            assert!(s.has_timer(&t.key, t.domain, t.time).unwrap());
            s.delete_timer(&t.key, t.domain, t.time).unwrap();
        }
        assert!(s
            .due_timers(TimeDomain::EventTime, i64::MAX)
            .unwrap()
            .is_empty());
        assert_eq!(s.timers(b"a").unwrap(), [(TimeDomain::ProcessingTime, 10)]);
    }

    #[test]
    fn a_due_timer_deleted_or_cleared_after_the_due_list_is_not_taken() {
        let mut s = store();
        for key in [&b"a"[..], b"b", b"c", b"d"] {
            s.register_timer(key, TimeDomain::EventTime, 5).unwrap();
        }
        let due = s.due_timers(TimeDomain::EventTime, 10).unwrap();
        assert_eq!(due.len(), 4);
        // Handlers ran meanwhile: one deleted b's timer, one cleared c,
        // one deleted d's and registered it again.
        s.delete_timer(b"b", TimeDomain::EventTime, 5).unwrap();
        s.clear_key(b"c").unwrap();
        s.delete_timer(b"d", TimeDomain::EventTime, 5).unwrap();
        s.register_timer(b"d", TimeDomain::EventTime, 5).unwrap();
        let taken: Vec<bool> = due
            .iter()
            .map(|t| s.take_timer(&t.key, t.domain, t.time).unwrap())
            .collect();
        assert_eq!(taken, [true, false, false, true]);
        assert!(s.timers(b"a").unwrap().is_empty());
        assert!(s.timers(b"d").unwrap().is_empty(), "taken: it fires now");
        assert_eq!(s.store().approximate_len(), 0, "no entry left behind");
    }

    #[test]
    fn a_type_that_gained_a_defaulted_field_reads_old_state() {
        #[derive(serde::Serialize)]
        struct Old {
            n: u32,
        }
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct New {
            n: u32,
            #[serde(default)]
            total: f64,
        }
        let mut s = store();
        let v = cell_prefix(b"a", "period", StateKind::Value);
        s.put(&v, &Old { n: 2 }, None).unwrap();
        assert_eq!(s.get::<New>(&v).unwrap(), Some(New { n: 2, total: 0.0 }));
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct Incompatible {
            other: String,
        }
        let e = s.get::<Incompatible>(&v).unwrap_err().to_string();
        assert!(e.contains("serde(default)"), "{e}");
    }
}
