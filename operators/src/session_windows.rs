//! State of session windows: per key, its sessions, disjoint and sorted by
//! start.
//!
//! In a store: `K` + key → the key's sessions (the fixed windows' layout),
//! one expiry index entry per key, `E` + its first session's end + key (a
//! key's sessions are disjoint, so the first one closes first), and `N`,
//! the number of open sessions. The end of a batch visits only the keys
//! touched in the batch and the keys whose first session may have closed:
//! reading through the store, those its index names; in memory, those an
//! in-memory index of session ends names (complete mode visits every key).

use super::state_codec::{
    decode_key_state, encode_key_state, expired_by, expiry_key, parse_expiry_key, state_key,
    STATE_KEY_PREFIX,
};
use super::{AggregateSpec, CacheMap, OutputMode};
use crate::aggregate::Accumulator;
use crate::error::Result;
use crate::row::{Row, Value};
use crate::time::TimestampMicros;
use crate::window::TimeWindow;
use std::collections::BTreeMap;
use tidemark_state::StateStore;

/// The store entry counting open sessions.
const SESSION_COUNT: &[u8] = b"N";

struct Session {
    window: TimeWindow,
    accumulators: Vec<Accumulator>,
    updated: bool,
}

struct SessionGroup {
    key_values: Vec<Value>,
    sessions: Vec<Session>,
    /// Listed among this batch's candidates.
    candidate: bool,
    /// The end under which the store's expiry index holds this key.
    indexed_end: Option<TimestampMicros>,
    /// The end last noted for this key in the in-memory index of ends.
    noted_end: Option<TimestampMicros>,
}

/// Rows a batch end emits, with what they sort by: window start, then key.
type Emitted = Vec<(TimestampMicros, Vec<u8>, Row)>;

/// Open sessions of one operator in one task.
#[derive(Default)]
pub(super) struct SessionState {
    groups: CacheMap<Vec<u8>, SessionGroup>,
    /// Keys to visit at the end of the batch when reading through a store:
    /// those touched, and those whose first session the store says expires.
    candidates: Vec<Vec<u8>>,
    /// Keys changed since the last write (tracked when persisted).
    track_dirty: bool,
    dirty: Vec<Vec<u8>>,
    /// Index entries of keys whose last session closed, to delete.
    unindexed: Vec<(TimestampMicros, Vec<u8>)>,
    /// In memory (not reading through a store): session ends, each with a
    /// key whose first session may end then. Entries go stale as sessions
    /// grow; a stale entry costs one visit that finds nothing to do.
    ends: Option<BTreeMap<TimestampMicros, Vec<Vec<u8>>>>,
    open: usize,
}

/// What one batch end did: rows to emit, sessions updated and removed.
pub(super) struct Settled {
    pub(super) rows: Vec<Row>,
    pub(super) updated: u64,
    pub(super) removed: u64,
}

impl SessionState {
    /// State held in memory: an in-memory index of session ends finds the
    /// keys to close. (Reading through a store, its `E` index does.)
    pub(super) fn in_memory() -> Self {
        SessionState {
            ends: Some(BTreeMap::new()),
            ..SessionState::default()
        }
    }

    /// Notes that `key` may have a session ending at `end`.
    fn note_end(&mut self, end: TimestampMicros, key: &[u8]) {
        if let Some(ends) = self.ends.as_mut() {
            ends.entry(end).or_default().push(key.to_vec());
        }
    }

    /// Starts tracking changed keys, for writes to a store.
    pub(super) fn track_changes(&mut self) {
        self.track_dirty = true;
    }

    /// Whether the key's sessions are in memory.
    pub(super) fn contains(&self, key: &[u8]) -> bool {
        self.groups.contains_key(key)
    }

    /// Number of open sessions.
    pub(super) fn len(&self) -> usize {
        self.open
    }

    /// Number of keys in memory.
    pub(super) fn cached_keys(&self) -> usize {
        self.groups.len()
    }

    /// Adds a row's proto-session `window` to the key's sessions, merging
    /// every session it overlaps or touches: sessions exactly one gap apart
    /// merge, and one event may bridge two sessions. The sessions a window
    /// reaches are contiguous. `fold` adds the row to the accumulators.
    /// Returns the number of sessions merged away.
    pub(super) fn add(
        &mut self,
        key: &[u8],
        key_values: impl FnOnce() -> Vec<Value>,
        window: TimeWindow,
        aggregates: &[AggregateSpec],
        fold: impl FnOnce(&mut [Accumulator]),
    ) -> u64 {
        if !self.groups.contains_key(key) {
            let group = SessionGroup {
                key_values: key_values(),
                sessions: Vec::with_capacity(1),
                candidate: false,
                indexed_end: None,
                noted_end: None,
            };
            self.groups.insert(key.to_vec(), group);
        }
        let group = self.groups.get_mut(key).expect("inserted above");
        if !group.candidate {
            group.candidate = true;
            self.candidates.push(key.to_vec());
        }
        let reaches = |s: &Session| s.window.start <= window.end && window.start <= s.window.end;
        let Some(i) = group.sessions.iter().position(reaches) else {
            let mut accumulators: Vec<Accumulator> =
                aggregates.iter().map(|a| a.function.zero()).collect();
            fold(&mut accumulators);
            let at = group
                .sessions
                .partition_point(|s| s.window.start < window.start);
            let session = Session {
                window,
                accumulators,
                updated: true,
            };
            group.sessions.insert(at, session);
            self.open += 1;
            return 0;
        };
        let session = &mut group.sessions[i];
        session.window.start = session.window.start.min(window.start);
        session.window.end = session.window.end.max(window.end);
        session.updated = true;
        fold(&mut session.accumulators);
        let mut merged = 0;
        while i + 1 < group.sessions.len()
            && group.sessions[i + 1].window.start <= group.sessions[i].window.end
        {
            let next = group.sessions.remove(i + 1);
            let session = &mut group.sessions[i];
            session.window.end = session.window.end.max(next.window.end);
            for ((spec, acc), other) in aggregates
                .iter()
                .zip(&mut session.accumulators)
                .zip(&next.accumulators)
            {
                spec.function.merge(acc, other);
            }
            merged += 1;
        }
        self.open -= merged as usize;
        merged
    }

    /// Ends a batch: hands every session the output mode emits to `row`,
    /// and removes the sessions that end at or before `watermark` (never in
    /// complete mode). Visits the keys touched, those scheduled by
    /// [`Self::schedule_expiring`] and those the in-memory index of ends
    /// names; complete mode visits every key.
    pub(super) fn settle(
        &mut self,
        mode: OutputMode,
        watermark: TimestampMicros,
        mut row: impl FnMut(&[Value], TimeWindow, &[Accumulator]) -> Row,
    ) -> Settled {
        let candidates_only = mode != OutputMode::Complete;
        if let Some(ends) = self.ends.as_mut() {
            if candidates_only {
                let later = ends.split_off(&watermark.saturating_add(1));
                for keys in std::mem::replace(ends, later).into_values() {
                    self.candidates.extend(keys);
                }
            } else {
                // Complete mode visits every key and closes none.
                ends.clear();
            }
        }
        let mut emitted = Emitted::new();
        let (mut updated, mut removed) = (0, 0);
        let mut visit = |key: &Vec<u8>, group: &mut SessionGroup| {
            group.candidate = false;
            let (u, r) = settle_group(key, group, mode, watermark, &mut row, &mut emitted);
            updated += u;
            removed += r;
            u + r > 0
        };
        let mut changed = Vec::new();
        if candidates_only {
            let mut keys = std::mem::take(&mut self.candidates);
            keys.sort();
            keys.dedup();
            for key in keys {
                if let Some(group) = self.groups.get_mut(&key) {
                    if visit(&key, group) {
                        changed.push(key);
                    }
                }
            }
        } else {
            self.candidates.clear();
            for (key, group) in self.groups.iter_mut() {
                if visit(key, group) {
                    changed.push(key.clone());
                }
            }
        }
        for key in &changed {
            self.remove_if_empty(key);
            // Once per changed key and batch, not per row: its first
            // session may have grown, closed, or been preceded by a new one.
            let Some(group) = self.groups.get_mut(key) else {
                continue;
            };
            let first_end = group.sessions.first().map(|s| s.window.end);
            if let Some(end) = first_end.filter(|_| first_end != group.noted_end) {
                group.noted_end = first_end;
                self.note_end(end, key);
            }
        }
        if self.track_dirty {
            self.dirty.extend(changed);
        }
        self.open = self.open.saturating_sub(removed as usize);
        emitted.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Settled {
            rows: emitted.into_iter().map(|(_, _, r)| r).collect(),
            updated,
            removed,
        }
    }

    fn remove_if_empty(&mut self, key: &[u8]) {
        if self.groups.get(key).is_some_and(|g| g.sessions.is_empty()) {
            let group = self.groups.remove(key).expect("present");
            if let Some(end) = group.indexed_end {
                self.unindexed.push((end, key.to_vec()));
            }
        }
    }

    /// Hands each of a key's open sessions, in memory, to `f`.
    pub(super) fn for_key(
        &self,
        key: &[u8],
        mut f: impl FnMut(&[Value], TimeWindow, &[Accumulator]),
    ) {
        if let Some(group) = self.groups.get(key) {
            for session in &group.sessions {
                f(&group.key_values, session.window, &session.accumulators);
            }
        }
    }

    /// Reads a key's sessions from the store into memory, if it has any.
    pub(super) fn load(
        &mut self,
        store: &dyn StateStore,
        key: &[u8],
        aggregates: &[AggregateSpec],
    ) -> Result<()> {
        if let Some(bytes) = store.get(&state_key(key))? {
            let (key_values, windows) = decode_key_state(&bytes, aggregates)?;
            self.insert(key.to_vec(), key_values, windows);
        }
        Ok(())
    }

    fn insert(
        &mut self,
        key: Vec<u8>,
        key_values: Vec<Value>,
        windows: Vec<(TimeWindow, Vec<Accumulator>)>,
    ) {
        let sessions: Vec<Session> = windows
            .into_iter()
            .map(|(window, accumulators)| Session {
                window,
                accumulators,
                updated: false,
            })
            .collect();
        let first_end = sessions.first().map(|s| s.window.end);
        if let Some(end) = first_end {
            self.note_end(end, &key);
        }
        let group = SessionGroup {
            key_values,
            indexed_end: first_end,
            noted_end: first_end,
            sessions,
            candidate: false,
        };
        self.groups.insert(key, group);
    }

    /// Loads, and lists for the end of this batch, every key whose first
    /// session the store's index says ends at or before `watermark`.
    pub(super) fn schedule_expiring(
        &mut self,
        store: &dyn StateStore,
        watermark: TimestampMicros,
        aggregates: &[AggregateSpec],
    ) -> Result<()> {
        for (index_key, _) in expired_by(store, watermark)? {
            let Some((_, key)) = parse_expiry_key(&index_key) else {
                continue;
            };
            if !self.groups.contains_key(key) {
                self.load(store, key, aggregates)?;
            }
            if let Some(group) = self.groups.get_mut(key) {
                if !group.candidate {
                    group.candidate = true;
                    self.candidates.push(key.to_vec());
                }
            }
        }
        Ok(())
    }

    /// Restores every key from the store into memory.
    pub(super) fn load_all(
        &mut self,
        store: &dyn StateStore,
        aggregates: &[AggregateSpec],
    ) -> Result<()> {
        for (key, bytes) in store.prefix(STATE_KEY_PREFIX)? {
            let (key_values, windows) = decode_key_state(&bytes, aggregates)?;
            self.open += windows.len();
            self.insert(key[STATE_KEY_PREFIX.len()..].to_vec(), key_values, windows);
        }
        Ok(())
    }

    /// Opens state that stays in the store: reads the session count, and
    /// builds the expiry index and count if the store was written before
    /// they existed (keys only).
    pub(super) fn open_stored(
        &mut self,
        store: &mut dyn StateStore,
        aggregates: &[AggregateSpec],
    ) -> Result<()> {
        if let Some(bytes) = store.get(SESSION_COUNT)? {
            let bytes: [u8; 8] = bytes
                .as_slice()
                .try_into()
                .map_err(|_| super::state_codec::corrupt("the session count is not 8 bytes"))?;
            self.open = u64::from_le_bytes(bytes) as usize;
            return Ok(());
        }
        let stored = store.prefix(STATE_KEY_PREFIX)?;
        if stored.is_empty() {
            // A new store: nothing to write until the first checkpoint.
            return Ok(());
        }
        let mut open = 0;
        for (key, bytes) in stored {
            let (_, windows) = decode_key_state(&bytes, aggregates)?;
            if let Some((first, _)) = windows.first() {
                store.put(&expiry_key(first.end, &key[STATE_KEY_PREFIX.len()..]), &[])?;
            }
            open += windows.len();
        }
        store.put(SESSION_COUNT, &(open as u64).to_le_bytes())?;
        self.open = open;
        Ok(())
    }

    /// Writes the keys changed since the last call, their index entries
    /// and the session count to `store` as one batch.
    pub(super) fn write_changes(
        &mut self,
        store: &mut dyn StateStore,
        aggregates: &[AggregateSpec],
    ) -> Result<usize> {
        let mut entries: Vec<(Vec<u8>, Option<Vec<u8>>)> = std::mem::take(&mut self.unindexed)
            .into_iter()
            .map(|(end, key)| (expiry_key(end, &key), None))
            .collect();
        let mut keys = std::mem::take(&mut self.dirty);
        keys.sort();
        keys.dedup();
        for key in keys {
            let Some(group) = self.groups.get_mut(&key) else {
                entries.push((state_key(&key), None));
                continue;
            };
            let first_end = group.sessions.first().map(|s| s.window.end);
            if group.indexed_end != first_end {
                if let Some(end) = group.indexed_end {
                    entries.push((expiry_key(end, &key), None));
                }
                if let Some(end) = first_end {
                    entries.push((expiry_key(end, &key), Some(Vec::new())));
                }
                group.indexed_end = first_end;
            }
            let windows = group
                .sessions
                .iter()
                .map(|s| (s.window, s.accumulators.as_slice()));
            let value = encode_key_state(&group.key_values, windows, aggregates)?;
            entries.push((state_key(&key), Some(value)));
        }
        let count = (self.open as u64).to_le_bytes().to_vec();
        entries.push((SESSION_COUNT.to_vec(), Some(count)));
        store.write_batch(&entries)?;
        Ok(entries.len())
    }

    /// After a write, when the store holds everything: keeps at most
    /// `max_keys` keys in memory.
    pub(super) fn shrink_to(&mut self, max_keys: usize) {
        if self.groups.len() > max_keys {
            super::shrink_cache(&mut self.groups, max_keys * 3 / 4, max_keys);
        }
    }
}

/// Ends a batch for one key; returns the sessions updated and removed.
fn settle_group(
    key: &[u8],
    group: &mut SessionGroup,
    mode: OutputMode,
    watermark: TimestampMicros,
    row: &mut impl FnMut(&[Value], TimeWindow, &[Accumulator]) -> Row,
    emitted: &mut Emitted,
) -> (u64, u64) {
    let evict = mode != OutputMode::Complete;
    let mut updated = 0;
    for s in &mut group.sessions {
        let closed = evict && s.window.end <= watermark;
        let emit = match mode {
            OutputMode::Append => closed,
            OutputMode::Update => s.updated,
            OutputMode::Complete => true,
        };
        if emit {
            let r = row(&group.key_values, s.window, &s.accumulators);
            emitted.push((s.window.start, key.to_vec(), r));
        }
        updated += s.updated as u64;
        s.updated = false;
    }
    let before = group.sessions.len();
    if evict {
        group.sessions.retain(|s| s.window.end > watermark);
    }
    (updated, (before - group.sessions.len()) as u64)
}
