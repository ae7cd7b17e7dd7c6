//! State of session windows: per key, its sessions, disjoint and sorted by
//! start.
//!
//! In a store, through the engine's cache of decoded state
//! ([`tidemark_state::StateCache`]): `K` + key → the key's sessions (the
//! fixed windows' layout); beside them one expiry index entry per key,
//! `E` + its first session's end + key (a key's sessions are disjoint, so
//! the first one closes first), and `N`, the number of open sessions. The end of a batch visits only the keys
//! touched in the batch and the keys whose first session may have closed:
//! reading through the store, those its index names; in memory, those an
//! in-memory index of session ends names (complete mode visits every key).

use super::state_codec::{
    decode_key_state, encode_key_state, expired_by, expiry_key, parse_expiry_key, STATE_KEY_PREFIX,
};
use super::{AggregateSpec, OutputMode};
use crate::aggregate::Accumulator;
use crate::error::Result;
use crate::row::{Row, Value};
use crate::time::TimestampMicros;
use crate::window::TimeWindow;
use std::collections::BTreeMap;
use tidemark_state::{StateCache, StateCodec, StateStore, StoreEntries};

/// The store entry counting open sessions.
const SESSION_COUNT: &[u8] = b"N";

struct Session {
    window: TimeWindow,
    accumulators: Vec<Accumulator>,
    updated: bool,
}

/// One key's sessions.
pub(super) struct SessionGroup {
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

/// A key's sessions in the store: the fixed windows' layout.
pub(super) struct SessionGroupCodec {
    aggregates: Vec<AggregateSpec>,
}

impl StateCodec for SessionGroupCodec {
    type Value = SessionGroup;
    fn encode(&self, group: &SessionGroup) -> Result<Vec<u8>> {
        let windows = group
            .sessions
            .iter()
            .map(|s| (s.window, s.accumulators.as_slice()));
        encode_key_state(&group.key_values, windows, &self.aggregates)
    }
    fn decode(&self, bytes: &[u8]) -> Result<SessionGroup> {
        let (key_values, windows) = decode_key_state(bytes, &self.aggregates)?;
        let sessions: Vec<Session> = windows
            .into_iter()
            .map(|(window, accumulators)| Session {
                window,
                accumulators,
                updated: false,
            })
            .collect();
        // As stored, the store's index holds the key under its first end.
        let first_end = sessions.first().map(|s| s.window.end);
        Ok(SessionGroup {
            key_values,
            indexed_end: first_end,
            noted_end: first_end,
            sessions,
            candidate: false,
        })
    }
}

/// Open sessions of one operator in one task.
pub(super) struct SessionState {
    groups: StateCache<SessionGroupCodec>,
    /// Keys to visit at the end of the batch when reading through a store:
    /// those touched, and those whose first session the store says expires.
    candidates: Vec<Vec<u8>>,
    /// Keys changed since the last checkpoint (tracked when persisted):
    /// their index entries may move.
    changed: Vec<Vec<u8>>,
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
    /// No session yet, for aggregates `aggregates` (the store's layout),
    /// held in memory until [`SessionState::open`] says otherwise: an
    /// in-memory index of session ends finds the keys to close.
    pub(super) fn new(aggregates: Vec<AggregateSpec>) -> Self {
        SessionState {
            groups: StateCache::new(SessionGroupCodec { aggregates }),
            candidates: Vec::new(),
            changed: Vec::new(),
            unindexed: Vec::new(),
            ends: Some(BTreeMap::new()),
            open: 0,
        }
    }

    /// Opens the state over `store`: every key into memory, or, with
    /// `max_cached_keys`, read through the store, whose `E` index finds
    /// the keys to close.
    pub(super) fn open(
        &mut self,
        mut store: Box<dyn StateStore>,
        max_cached_keys: Option<usize>,
    ) -> Result<()> {
        self.candidates.clear();
        self.changed.clear();
        self.unindexed.clear();
        self.open = 0;
        if max_cached_keys.is_some() {
            self.ends = None;
            self.open = open_stored(store.as_mut(), &self.groups.codec().aggregates)?;
            return self.groups.open(store, max_cached_keys);
        }
        self.groups.open(store, None)?;
        let mut ends: BTreeMap<TimestampMicros, Vec<Vec<u8>>> = BTreeMap::new();
        for (key, group) in self.groups.iter() {
            self.open += group.sessions.len();
            if let Some(end) = group.noted_end {
                ends.entry(end).or_default().push(key.to_vec());
            }
        }
        self.ends = Some(ends);
        Ok(())
    }

    /// Notes that `key` may have a session ending at `end`.
    fn note_end(&mut self, end: TimestampMicros, key: &[u8]) {
        if let Some(ends) = self.ends.as_mut() {
            ends.entry(end).or_default().push(key.to_vec());
        }
    }

    /// Number of open sessions.
    pub(super) fn len(&self) -> usize {
        self.open
    }

    /// Number of keys in memory.
    pub(super) fn cached_keys(&self) -> usize {
        self.groups.cached_len()
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
    ) -> Result<u64> {
        // Read from the store if need be: a key it alone holds.
        let group = self.groups.get_or_insert_with(key, || SessionGroup {
            key_values: key_values(),
            sessions: Vec::with_capacity(1),
            candidate: false,
            indexed_end: None,
            noted_end: None,
        })?;
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
            return Ok(0);
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
        Ok(merged)
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
    ) -> Result<Settled> {
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
        let mut visit = |key: &[u8], group: &mut SessionGroup| {
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
                if self.groups.update(&key, |group| visit(&key, group))? == Some(true) {
                    changed.push(key);
                }
            }
        } else {
            self.candidates.clear();
            self.groups.update_all(|key, group| {
                let visited = visit(key, group);
                if visited {
                    changed.push(key.to_vec());
                }
                visited
            });
        }
        for key in &changed {
            self.note_first_end(key)?;
        }
        if self.groups.store().is_some() {
            self.changed.extend(changed);
        }
        self.open = self.open.saturating_sub(removed as usize);
        emitted.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        Ok(Settled {
            rows: emitted.into_iter().map(|(_, _, r)| r).collect(),
            updated,
            removed,
        })
    }

    /// Once per changed key and batch, not per row: removes the key if its
    /// last session closed, else notes its first session's end, which may
    /// have grown, closed, or been preceded by a new one.
    fn note_first_end(&mut self, key: &[u8]) -> Result<()> {
        let mut emptied = None;
        let mut noted = None;
        self.groups.update(key, |group| {
            if group.sessions.is_empty() {
                emptied = Some(group.indexed_end);
                return false;
            }
            let first_end = group.sessions.first().map(|s| s.window.end);
            if first_end != group.noted_end {
                group.noted_end = first_end;
                noted = first_end;
            }
            // Not stored: the end noted is memory's own index.
            false
        })?;
        if let Some(indexed_end) = emptied {
            self.groups.remove(key)?;
            if let Some(end) = indexed_end {
                self.unindexed.push((end, key.to_vec()));
            }
        }
        if let Some(end) = noted {
            self.note_end(end, key);
        }
        Ok(())
    }

    /// Hands each of a key's open sessions to `f`: in memory, or read from
    /// the store without caching them.
    pub(super) fn for_key(
        &self,
        key: &[u8],
        mut f: impl FnMut(&[Value], TimeWindow, &[Accumulator]),
    ) -> Result<()> {
        if let Some(group) = self.groups.peek(key)? {
            for session in &group.sessions {
                f(&group.key_values, session.window, &session.accumulators);
            }
        }
        Ok(())
    }

    /// Lists for the end of this batch every key whose first session the
    /// store's index says ends at or before `watermark` (reading through
    /// the store: memory knows only the keys it touched).
    pub(super) fn schedule_expiring(&mut self, watermark: TimestampMicros) -> Result<()> {
        let Some(store) = self.groups.store().filter(|_| self.groups.reads_through()) else {
            return Ok(());
        };
        let expiring: Vec<Vec<u8>> = expired_by(store, watermark)?
            .into_iter()
            .filter_map(|(index_key, _)| parse_expiry_key(&index_key).map(|(_, k)| k.to_vec()))
            .collect();
        // Read at the batch's end, once: loading them here could drop the
        // first before the last is read, and read them all twice.
        self.candidates.extend(expiring);
        Ok(())
    }

    /// Writes the expiry index entries of the keys changed since the last
    /// checkpoint and the session count with the changed keys, in one
    /// batch, and flushes the store; returns the entries written.
    pub(super) fn checkpoint(&mut self) -> Result<usize> {
        let mut entries: StoreEntries = std::mem::take(&mut self.unindexed)
            .into_iter()
            .map(|(end, key)| (expiry_key(end, &key), None))
            .collect();
        let mut keys = std::mem::take(&mut self.changed);
        keys.sort();
        keys.dedup();
        for key in keys {
            // A key removed since has its index entry in `unindexed`.
            self.groups.update(&key, |group| {
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
                // Changed already: it is written back with the others.
                false
            })?;
        }
        if self.groups.store().is_none() {
            return Ok(0);
        }
        let count = (self.open as u64).to_le_bytes().to_vec();
        entries.push((SESSION_COUNT.to_vec(), Some(count)));
        self.groups.checkpoint_with(entries)
    }
}

/// Opens state that stays in the store: returns the session count, first
/// building the expiry index and count if the store was written before
/// they existed (keys only).
fn open_stored(store: &mut dyn StateStore, aggregates: &[AggregateSpec]) -> Result<usize> {
    if let Some(bytes) = store.get(SESSION_COUNT)? {
        let bytes: [u8; 8] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| super::state_codec::corrupt("the session count is not 8 bytes"))?;
        return Ok(u64::from_le_bytes(bytes) as usize);
    }
    let stored = store.prefix(STATE_KEY_PREFIX)?;
    if stored.is_empty() {
        // A new store: nothing to write until the first checkpoint.
        return Ok(0);
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
    Ok(open)
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
