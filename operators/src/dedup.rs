//! Deduplication with Spark's rules: `distinct()`, `dropDuplicates(keys)`
//! and `dropDuplicatesWithinWatermark(keys)`.
//!
//! A row whose event time is at or before the late-row watermark (the
//! previous batch's) is dropped as late. Otherwise the first row of a key
//! (in input order, within a batch too) is emitted at once and later rows of
//! that key are dropped. A key's state is evicted at the end of a batch
//! whose watermark in effect has reached its eviction time: the event time
//! itself when the event-time column is part of the key (`distinct`,
//! `dropDuplicates` with it), the first occurrence's event time plus the
//! watermark delay (`dropDuplicatesWithinWatermark`), never otherwise (the
//! state grows without bound; a warning says so).
//!
//! The store is the keyed state layer's (`tidemark_state::KeyedStateStore`,
//! the one user processors use): a key held is a value cell of state
//! `held` (its eviction time) with an entry in the event-time expiry
//! order, which a batch's end scans up to the watermark. With a disk store
//! and a memory bound (`open_state` with `cache_bytes`) the state is read
//! through the store and memory holds a bounded cache of keys known to be
//! held. Otherwise every key is held in memory and the store only keeps it
//! across restarts. A store written by an earlier layout (`K` + key → its
//! eviction time, `E` + time + key, `N`) is rewritten on first open.

use super::state_codec::{parse_expiry_key, STATE_KEY_PREFIX};
use super::{encode_key_into, BatchContext, KeyRange, Operator, QueryableState};
use crate::error::{Error, Result};
use crate::progress::StateOperatorProgress;
use crate::row::{Row, Value};
use crate::time::TimestampMicros;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use tidemark_state::{cell_prefix, KeyedStateStore, StateKind, StateStore};

type HashMap<K, V> = crate::CacheMap<K, V>;

/// Never evicted.
const FOREVER: TimestampMicros = TimestampMicros::MAX;

/// The keyed state holding a key's eviction time.
const HELD: &str = "held";

/// The store's count of keys held, when state is read through the store
/// (counting them there would read every key).
const HELD_KEYS: &str = "held_keys";

/// The count's entry in the layout before the keyed state layer.
const OLD_HELD_KEYS: &[u8] = b"N";

/// Memory a cached key costs, for the bound: the key, its time and the
/// hash map's share.
const CACHED_KEY_BYTES: usize = 96;

/// Which deduplication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DedupSpec {
    /// `distinct()`: every column is the key.
    Distinct,
    /// `dropDuplicates(keys)`.
    Keys(Vec<Arc<str>>),
    /// `dropDuplicatesWithinWatermark(keys)`, with the watermark delay.
    WithinWatermark {
        /// The key columns.
        keys: Vec<Arc<str>>,
        /// The watermark delay, in microseconds.
        delay_micros: i64,
    },
}

/// The deduplication operator (see the module documentation).
pub struct Deduplicate {
    spec: DedupSpec,
    event_time: Option<Arc<str>>,
    /// Key → eviction time: every key held, or, when state is read through
    /// the store, a bounded cache of keys known to be held.
    seen: HashMap<Vec<u8>, TimestampMicros>,
    /// The eviction index of `seen` when it holds every key.
    evictions: BTreeSet<(TimestampMicros, Vec<u8>)>,
    /// Keys added (`Some`) or evicted (`None`) since the last checkpoint,
    /// when `seen` holds every key (else they are written at once).
    changed: BTreeMap<Vec<u8>, Option<TimestampMicros>>,
    store: Option<KeyedStateStore>,
    /// Reading through the store: at most about this many keys cached.
    max_cached_keys: Option<usize>,
    /// Keys held, when reading through the store (else `seen.len()`).
    held_keys: u64,
    key_buffer: Vec<u8>,
    value_buffer: Vec<u8>,
    dropped_by_watermark: u64,
    dropped_duplicates: u64,
    late_rows: Vec<Row>,
    rows_updated: u64,
    rows_removed: u64,
}

impl Deduplicate {
    /// A deduplication over rows whose event time is `event_time` (the
    /// query's event-time column, if any).
    pub fn new(spec: DedupSpec, event_time: Option<Arc<str>>) -> Result<Self> {
        if let DedupSpec::Keys(keys) | DedupSpec::WithinWatermark { keys, .. } = &spec {
            if keys.is_empty() {
                return Err(Error::config("dedup.keys", "needs at least one column"));
            }
        }
        if matches!(spec, DedupSpec::WithinWatermark { .. }) && event_time.is_none() {
            return Err(Error::config(
                "dedup.within_watermark",
                "dropDuplicatesWithinWatermark needs a watermark: set `event_time` and `watermark`",
            ));
        }
        Ok(Deduplicate {
            spec,
            event_time,
            seen: HashMap::default(),
            evictions: BTreeSet::new(),
            changed: BTreeMap::new(),
            store: None,
            max_cached_keys: None,
            held_keys: 0,
            key_buffer: Vec::new(),
            value_buffer: Vec::new(),
            dropped_by_watermark: 0,
            dropped_duplicates: 0,
            late_rows: Vec::new(),
            rows_updated: 0,
            rows_removed: 0,
        })
    }

    /// Whether state is evicted at all (else it grows without bound).
    pub fn evicts(&self) -> bool {
        match &self.spec {
            DedupSpec::WithinWatermark { .. } => true,
            DedupSpec::Distinct => self.event_time.is_some(),
            DedupSpec::Keys(keys) => self
                .event_time
                .as_ref()
                .is_some_and(|t| keys.iter().any(|k| k == t)),
        }
    }

    fn event_time_of(&self, row: &Row) -> Option<TimestampMicros> {
        match row.get(self.event_time.as_deref()?) {
            Some(Value::Timestamp(t)) => Some(*t),
            _ => None,
        }
    }

    fn encode(&mut self, row: &Row) {
        let null = Value::Null;
        match &self.spec {
            DedupSpec::Distinct => {
                // Every column, by name, so that column order does not count.
                let mut columns: Vec<(&str, &Value)> = row.columns().collect();
                columns.sort_by(|a, b| a.0.cmp(b.0));
                self.key_buffer.clear();
                for (name, value) in columns {
                    self.key_buffer.extend_from_slice(name.as_bytes());
                    self.key_buffer.push(0xff);
                    encode_key_into(std::iter::once(value), &mut self.value_buffer);
                    self.key_buffer.extend_from_slice(&self.value_buffer);
                }
            }
            DedupSpec::Keys(keys) | DedupSpec::WithinWatermark { keys, .. } => {
                encode_key_into(
                    keys.iter().map(|k| row.get(k).unwrap_or(&null)),
                    &mut self.key_buffer,
                );
            }
        }
    }

    /// Whether the key in `key_buffer` is held: in the cache, or else (when
    /// reading through the store) in the store, then cached.
    fn is_held(&mut self) -> Result<bool> {
        if self.seen.contains_key(&self.key_buffer) {
            return Ok(true);
        }
        let (Some(_), Some(store)) = (self.max_cached_keys, self.store.as_ref()) else {
            return Ok(false);
        };
        let Some(evict_at) = store.get::<TimestampMicros>(&held_cell(&self.key_buffer))? else {
            return Ok(false);
        };
        self.seen.insert(self.key_buffer.clone(), evict_at);
        self.bound_cache();
        Ok(true)
    }

    /// Holds the key in `key_buffer` until `evict_at`.
    fn hold(&mut self, evict_at: TimestampMicros) -> Result<()> {
        let key = self.key_buffer.clone();
        match (self.max_cached_keys, self.store.as_mut()) {
            (Some(_), Some(store)) => {
                // Not held (just asked): written without another read.
                store.insert_until(&held_cell(&key), &evict_at, expires(evict_at))?;
                self.held_keys += 1;
                // With the keys: a write cache that flushes early writes
                // the count that matches them in the same batch.
                store.put_global(HELD_KEYS, &self.held_keys.to_le_bytes())?;
            }
            _ => {
                if evict_at != FOREVER {
                    self.evictions.insert((evict_at, key.clone()));
                }
                if self.store.is_some() {
                    self.changed.insert(key.clone(), Some(evict_at));
                }
            }
        }
        self.seen.insert(key, evict_at);
        self.bound_cache();
        Ok(())
    }

    /// Reading through the store, the cache holds nothing the store lacks:
    /// past its bound (within a batch too) it shrinks to half.
    fn bound_cache(&mut self) {
        if let Some(max_keys) = self.max_cached_keys.filter(|_| self.store.is_some()) {
            if self.seen.len() > max_keys {
                super::shrink_cache(&mut self.seen, max_keys / 2, max_keys);
            }
        }
    }

    /// Evicts the keys whose time is at or before `watermark`.
    fn evict(&mut self, watermark: TimestampMicros) -> Result<()> {
        if let (Some(_), Some(store)) = (self.max_cached_keys, self.store.as_mut()) {
            for key in store.expire_event_time(watermark)? {
                self.seen.remove(&key);
                self.held_keys = self.held_keys.saturating_sub(1);
                self.rows_removed += 1;
            }
            store.put_global(HELD_KEYS, &self.held_keys.to_le_bytes())?;
            return Ok(());
        }
        while let Some((t, _)) = self.evictions.first() {
            if *t > watermark {
                break;
            }
            let (_, key) = self.evictions.pop_first().expect("first exists");
            self.seen.remove(&key);
            if self.store.is_some() {
                self.changed.insert(key, None);
            }
            self.rows_removed += 1;
        }
        Ok(())
    }

    /// Keys held.
    fn held(&self) -> u64 {
        match self.max_cached_keys {
            Some(_) => self.held_keys,
            None => self.seen.len() as u64,
        }
    }

    /// The eviction time of the held key `key` (encoded as rows' keys
    /// are): from the cache, or else (when reading through the store) from
    /// the store; `None` when it is not held. Reads only: nothing is cached.
    fn held_until(&self, key: &[u8]) -> Result<Option<TimestampMicros>> {
        if let Some(evict_at) = self.seen.get(key) {
            return Ok(Some(*evict_at));
        }
        let (Some(_), Some(store)) = (self.max_cached_keys, self.store.as_ref()) else {
            return Ok(None);
        };
        Ok(store.get::<TimestampMicros>(&held_cell(key))?)
    }

    fn eviction_time(&self, event_time: Option<TimestampMicros>) -> TimestampMicros {
        match (&self.spec, event_time) {
            (DedupSpec::WithinWatermark { delay_micros, .. }, Some(t)) => {
                t.saturating_add(*delay_micros)
            }
            (_, Some(t)) if self.evicts() => t,
            _ => FOREVER,
        }
    }
}

/// The cell holding `key`'s eviction time.
fn held_cell(key: &[u8]) -> Vec<u8> {
    cell_prefix(key, HELD, StateKind::Value)
}

/// When a key held until `evict_at` leaves the store, if ever.
fn expires(evict_at: TimestampMicros) -> Option<TimestampMicros> {
    (evict_at != FOREVER).then_some(evict_at)
}

/// Rewrites a store of the layout before the keyed state layer (`K` + key
/// → eviction time, `E` + time + key, `N` → count) into the keyed layout.
///
/// In two flushes, the new entries first: a flush reaches the changelog in
/// key order (`E`, `K`, `N` before `g`, `k`, `y`), so in one flush a cut
/// (a kill while records are in flight, an aborted transaction) could keep
/// the old entries' tombstones without the new cells. A cut in the second
/// leaves old entries beside complete new ones, and the next open rewrites
/// them again to the same cells. The old entries are read whole, once.
fn upgrade_layout(store: &mut KeyedStateStore) -> Result<()> {
    let old_keys = store.store().prefix(STATE_KEY_PREFIX)?;
    let old_index = store.store().prefix(b"E")?;
    let old_count = store.store().get(OLD_HELD_KEYS)?;
    if old_keys.is_empty() && old_index.is_empty() && old_count.is_none() {
        return Ok(());
    }
    for (entry, value) in &old_keys {
        let evict_at = decode_time(value)?;
        let cell = held_cell(&entry[STATE_KEY_PREFIX.len()..]);
        // Rewritten after a cut: the cell holds this very time already.
        store.insert_until(&cell, &evict_at, expires(evict_at))?;
    }
    // A store kept in memory counted nothing: its keys are the count.
    let count = old_count.unwrap_or_else(|| (old_keys.len() as u64).to_le_bytes().to_vec());
    store.put_global(HELD_KEYS, &count)?;
    store.flush()?;
    for (entry, _) in &old_keys {
        store.delete_unkeyed(entry)?;
    }
    for (entry, _) in &old_index {
        if parse_expiry_key(entry).is_some() {
            store.delete_unkeyed(entry)?;
        }
    }
    store.delete_unkeyed(OLD_HELD_KEYS)?;
    Ok(store.flush()?)
}

/// A key's eviction time as stored: 8 bytes, little-endian.
pub(crate) fn decode_time(bytes: &[u8]) -> Result<TimestampMicros> {
    let bytes: [u8; 8] = bytes.try_into().map_err(|_| Error::Corrupt {
        what: "deduplication state".into(),
        reason: "an 8-byte time expected".into(),
    })?;
    Ok(i64::from_le_bytes(bytes))
}

impl Operator for Deduplicate {
    fn describe(&self) -> String {
        match &self.spec {
            DedupSpec::Distinct => "Deduplicate [all columns]".into(),
            DedupSpec::Keys(keys) => format!("Deduplicate {keys:?}"),
            DedupSpec::WithinWatermark { keys, .. } => {
                format!("DeduplicateWithinWatermark {keys:?}")
            }
        }
    }

    fn on_row(&mut self, row: Row, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let event_time = self.event_time_of(&row);
        if let Some(t) = event_time {
            if ctx.late_threshold > 0 && t <= ctx.late_threshold {
                self.dropped_by_watermark += 1;
                if ctx.collect_late_rows {
                    self.late_rows.push(row);
                }
                return Ok(());
            }
        }
        self.encode(&row);
        if self.is_held()? {
            self.dropped_duplicates += 1;
            return Ok(());
        }
        self.hold(self.eviction_time(event_time))?;
        self.rows_updated += 1;
        out.push(row);
        Ok(())
    }

    fn on_batch_end(&mut self, ctx: &BatchContext, _out: &mut Vec<Row>) -> Result<()> {
        if self.event_time.is_none() || ctx.watermark <= 0 {
            return Ok(());
        }
        self.evict(ctx.watermark)
    }

    fn take_late_rows(&mut self) -> Vec<Row> {
        std::mem::take(&mut self.late_rows)
    }

    fn is_stateful(&self) -> bool {
        true
    }

    fn open_state(&mut self, store: Box<dyn StateStore>, cache_bytes: Option<usize>) -> Result<()> {
        self.seen.clear();
        self.evictions.clear();
        self.changed.clear();
        self.max_cached_keys = cache_bytes.map(|bytes| (bytes / CACHED_KEY_BYTES).max(16));
        let mut store = KeyedStateStore::new(store);
        upgrade_layout(&mut store)?;
        if self.max_cached_keys.is_some() {
            self.held_keys = match store.global(HELD_KEYS)? {
                Some(bytes) => decode_time(&bytes)? as u64,
                None => 0,
            };
            self.store = Some(store);
            return Ok(());
        }
        for (key, evict_at) in store.values_of::<TimestampMicros>(HELD)? {
            if evict_at != FOREVER {
                self.evictions.insert((evict_at, key.clone()));
            }
            self.seen.insert(key, evict_at);
        }
        self.store = Some(store);
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<()> {
        let changed = std::mem::take(&mut self.changed);
        let Some(store) = self.store.as_mut() else {
            return Ok(());
        };
        let Some(max_keys) = self.max_cached_keys else {
            for (key, change) in changed {
                // A key evicted, or evicted and held again since the last
                // checkpoint (the real-time trigger checkpoints less often
                // than batches end): its old time's entry goes first.
                let cell = held_cell(&key);
                if let Some(old) = store.get::<TimestampMicros>(&cell)? {
                    store.delete_until(&cell, expires(old))?;
                }
                if let Some(evict_at) = change {
                    store.insert_until(&cell, &evict_at, expires(evict_at))?;
                }
            }
            return Ok(store.flush()?);
        };
        store.put_global(HELD_KEYS, &self.held_keys.to_le_bytes())?;
        store.flush()?;
        if self.seen.len() > max_keys {
            // Keep half, so that the cache does not shrink every batch.
            super::shrink_cache(&mut self.seen, max_keys / 2, max_keys);
        }
        Ok(())
    }

    /// The key columns of `dropDuplicates` and
    /// `dropDuplicatesWithinWatermark`; `None` for `distinct()`, whose key
    /// is every column of a row, which the operator does not know ahead.
    fn queryable_state(&self) -> Option<QueryableState> {
        match &self.spec {
            DedupSpec::Distinct => None,
            DedupSpec::Keys(keys) | DedupSpec::WithinWatermark { keys, .. } => {
                Some(QueryableState {
                    kind: "dedup",
                    key_columns: keys.iter().map(|k| k.to_string()).collect(),
                })
            }
        }
    }

    /// One row when the key is held (a later row with it is dropped as a
    /// duplicate): the key columns with their values, plus `expires_at`
    /// (a timestamp) when the key is ever evicted: the watermark at which
    /// it is, the first occurrence's event time plus the watermark delay
    /// for `dropDuplicatesWithinWatermark`, the event time itself when it
    /// is part of the key; without `expires_at` the key is held forever.
    /// Empty when the key is not held, and always for `distinct()`. The
    /// range is not used. Reads through the store without caching the key
    /// or changing any state.
    fn read_key(&mut self, key: &[Value], _range: &KeyRange) -> Result<Vec<Row>> {
        let (DedupSpec::Keys(keys) | DedupSpec::WithinWatermark { keys, .. }) = &self.spec else {
            return Ok(Vec::new());
        };
        let mut encoded = Vec::new();
        encode_key_into(key.iter(), &mut encoded);
        let Some(evict_at) = self.held_until(&encoded)? else {
            return Ok(Vec::new());
        };
        let mut row = Row::with_capacity(keys.len() + 1);
        for (column, value) in keys.iter().zip(key) {
            row.set(column.clone(), value.clone());
        }
        if evict_at != FOREVER {
            row.set("expires_at", Value::Timestamp(evict_at));
        }
        Ok(vec![row])
    }

    fn state_progress(&mut self) -> Option<StateOperatorProgress> {
        let mut custom_metrics = BTreeMap::new();
        custom_metrics.insert(
            "numDroppedDuplicateRows".to_string(),
            std::mem::take(&mut self.dropped_duplicates),
        );
        Some(StateOperatorProgress {
            operator_name: match self.spec {
                DedupSpec::WithinWatermark { .. } => "dedupeWithinWatermark".into(),
                _ => "dedupe".into(),
            },
            num_rows_total: self.held(),
            num_rows_updated: std::mem::take(&mut self.rows_updated),
            num_rows_removed: std::mem::take(&mut self.rows_removed),
            num_rows_dropped_by_watermark: std::mem::take(&mut self.dropped_by_watermark),
            memory_used_bytes: (self.seen.len() * 64) as u64,
            custom_metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_store::SharedStore;
    use proptest::prelude::*;

    const SECOND: i64 = 1_000_000;

    /// A batch whose watermark (and late-row threshold) is `watermark`.
    fn ctx(watermark: TimestampMicros) -> BatchContext {
        BatchContext {
            batch_id: 0,
            processing_time: 0,
            late_threshold: watermark,
            watermark,
            collect_late_rows: false,
            real_time: false,
        }
    }

    fn spec(within_watermark: bool) -> DedupSpec {
        let keys = vec![Arc::from("k")];
        if within_watermark {
            DedupSpec::WithinWatermark {
                keys,
                delay_micros: 10 * SECOND,
            }
        } else {
            DedupSpec::Keys(keys)
        }
    }

    /// Runs `batches` of (key, second) rows through a deduplication whose
    /// state is read through a store with `cache_bytes` (`None`: all in
    /// memory), restarted from its store after batch `restart_after`.
    /// Returns each batch's emitted rows and state size.
    fn run(
        within_watermark: bool,
        batches: &[Vec<(u8, i64)>],
        cache_bytes: Option<usize>,
        restart_after: usize,
    ) -> Vec<(Vec<String>, u64)> {
        let store = SharedStore::default();
        let open = || {
            let mut op = Deduplicate::new(spec(within_watermark), Some(Arc::from("t"))).unwrap();
            op.open_state(Box::new(store.clone()), cache_bytes).unwrap();
            op
        };
        let mut op = open();
        let (mut max_time, mut results) = (0, Vec::new());
        for (index, batch) in batches.iter().enumerate() {
            // Spark's watermark: the previous batch's maximum minus 10 s.
            let watermark = (max_time - 10 * SECOND).max(0);
            let ctx = ctx(watermark);
            let mut out = Vec::new();
            for (key, second) in batch {
                let mut row = Row::new();
                row.set("k", Value::from(format!("k{key}").as_str()));
                row.set("t", Value::Timestamp(second * SECOND));
                max_time = max_time.max(second * SECOND);
                op.on_row(row, &ctx, &mut out).unwrap();
            }
            op.on_batch_end(&ctx, &mut out).unwrap();
            op.checkpoint().unwrap();
            let emitted = out.iter().map(|r| format!("{r:?}")).collect();
            let held = op.state_progress().unwrap().num_rows_total;
            results.push((emitted, held));
            if index == restart_after {
                op = open();
            }
        }
        results
    }

    proptest! {
        #[test]
        fn state_read_through_the_store_gives_the_in_memory_results(
            within_watermark: bool,
            batches in prop::collection::vec(
                prop::collection::vec((0u8..40, 1i64..120), 0..30), 1..12),
            restart_after in 0usize..12,
        ) {
            let in_memory = run(within_watermark, &batches, None, usize::MAX);
            // 16 keys cached at most: most lookups go to the store.
            let through_store = run(within_watermark, &batches, Some(1), restart_after);
            prop_assert_eq!(&through_store, &in_memory);
            let restarted_in_memory = run(within_watermark, &batches, None, restart_after);
            prop_assert_eq!(&restarted_in_memory, &in_memory);
        }
    }

    /// Rows `(key, second)` of one batch at watermark 0.
    fn feed(op: &mut Deduplicate, rows: &[(i64, i64)]) -> Vec<Row> {
        let mut out = Vec::new();
        for (key, second) in rows {
            let mut row = Row::new();
            row.set("k", Value::from(format!("k{key}").as_str()));
            row.set("t", Value::Timestamp(second * SECOND));
            op.on_row(row, &ctx(0), &mut out).unwrap();
        }
        op.on_batch_end(&ctx(0), &mut out).unwrap();
        op.checkpoint().unwrap();
        out
    }

    /// Progress without the memory used: which keys a bounded cache keeps
    /// depends on its hasher's random seed.
    fn progress(op: &mut Deduplicate) -> StateOperatorProgress {
        let mut progress = op.state_progress().unwrap();
        progress.memory_used_bytes = 0;
        progress
    }

    #[test]
    fn read_key_finds_held_keys_through_the_store_and_changes_nothing() {
        for within_watermark in [false, true] {
            // All in memory (with a store), and read through the store
            // with 16 keys cached at most.
            for cache_bytes in [None, Some(1)] {
                let case = format!("within {within_watermark}, cache {cache_bytes:?}");
                let (store, twin_store) = (SharedStore::default(), SharedStore::default());
                let open = |store: &SharedStore| {
                    let t = Some(Arc::from("t"));
                    let mut op = Deduplicate::new(spec(within_watermark), t).unwrap();
                    op.open_state(Box::new(store.clone()), cache_bytes).unwrap();
                    op
                };
                // `op` is read, `twin` is not: they must stay alike.
                let (mut op, mut twin) = (open(&store), open(&twin_store));
                let rows: Vec<(i64, i64)> = (0..40).map(|k| (k, 5 + k)).collect();
                assert_eq!(feed(&mut op, &rows), feed(&mut twin, &rows), "{case}");
                let cached: BTreeSet<Vec<u8>> = op.seen.keys().cloned().collect();
                if cache_bytes.is_some() {
                    assert!(cached.len() < 40, "{case}: {} keys cached", cached.len());
                }
                let stored = store.approximate_len();

                let state = op.queryable_state().unwrap();
                assert_eq!(state.kind, "dedup");
                assert_eq!(state.key_columns, vec!["k".to_string()]);
                for k in 0..40 {
                    let key = [Value::from(format!("k{k}").as_str())];
                    let mut expected = Row::new();
                    expected.set("k", key[0].clone());
                    if within_watermark {
                        // The first event time plus the 10 s delay.
                        expected.set("expires_at", Value::Timestamp((15 + k) * SECOND));
                    }
                    let read = op.read_key(&key, &KeyRange::default()).unwrap();
                    assert_eq!(read, vec![expected], "{case}: key k{k}");
                }
                for absent in [Value::from("k40"), Value::Long(3), Value::Null] {
                    let read = op.read_key(&[absent], &KeyRange::default()).unwrap();
                    assert!(read.is_empty(), "{case}: {read:?}");
                }

                // Nothing cached, stored or counted by the reads.
                let now_cached: BTreeSet<Vec<u8>> = op.seen.keys().cloned().collect();
                assert_eq!(now_cached, cached, "{case}");
                assert_eq!(store.approximate_len(), stored, "{case}");
                assert_eq!(progress(&mut op), progress(&mut twin), "{case}");
                // Held keys are still duplicates, and new ones still new.
                let next = [(3, 50), (39, 50), (40, 50), (41, 50)];
                let out = feed(&mut op, &next);
                assert_eq!(out.len(), 2, "{case}");
                assert_eq!(out, feed(&mut twin, &next), "{case}");
                assert_eq!(progress(&mut op), progress(&mut twin), "{case}");
            }
        }
        let mut distinct = Deduplicate::new(DedupSpec::Distinct, None).unwrap();
        assert_eq!(distinct.queryable_state(), None);
        feed(&mut distinct, &[(1, 1)]);
        let key = [Value::from("k1"), Value::Timestamp(SECOND)];
        assert!(distinct
            .read_key(&key, &KeyRange::default())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_store_read_through_holds_its_keys_there_and_caches_a_bounded_few() {
        let store = SharedStore::default();
        let mut op = Deduplicate::new(spec(true), Some(Arc::from("t"))).unwrap();
        op.open_state(Box::new(store.clone()), Some(1)).unwrap();
        let mut out = Vec::new();
        for key in 0..100 {
            let mut row = Row::new();
            row.set("k", Value::Long(key));
            row.set("t", Value::Timestamp(SECOND));
            op.on_row(row, &ctx(0), &mut out).unwrap();
        }
        op.checkpoint().unwrap();
        assert_eq!(out.len(), 100);
        assert!(op.seen.len() <= 16, "{} keys cached", op.seen.len());
        // 100 keys, 100 index entries and the count.
        assert_eq!(store.approximate_len(), 201);
        // Evicted at the watermark past 1 s + 10 s: keys and index go.
        op.on_batch_end(&ctx(11 * SECOND), &mut out).unwrap();
        op.checkpoint().unwrap();
        assert_eq!(store.approximate_len(), 1);
        assert_eq!(op.state_progress().unwrap().num_rows_total, 0);
    }

    /// A store written before the keyed state layer (`K` + key → eviction
    /// time, `E` + time + key, `N`) is rewritten on first open: its keys
    /// are still held, evicted at their times, and nothing of the old
    /// layout is left.
    #[test]
    fn a_store_of_the_earlier_layout_is_rewritten_and_keeps_its_keys() {
        use crate::state_codec::{expiry_key, state_key};
        for cache_bytes in [None, Some(1)] {
            let store = SharedStore::default();
            let mut old = store.clone();
            for (k, evict_at) in [(1i64, 11 * SECOND), (2, 30 * SECOND)] {
                let mut key = Vec::new();
                encode_key_into(std::iter::once(&Value::Long(k)), &mut key);
                old.put(&state_key(&key), &evict_at.to_le_bytes()).unwrap();
                old.put(&expiry_key(evict_at, &key), &[]).unwrap();
            }
            old.put(OLD_HELD_KEYS, &2u64.to_le_bytes()).unwrap();
            let mut op = Deduplicate::new(spec(true), Some(Arc::from("t"))).unwrap();
            op.open_state(Box::new(store.clone()), cache_bytes).unwrap();
            assert!(store.prefix(b"K").unwrap().is_empty(), "{cache_bytes:?}");
            assert!(store.prefix(b"E").unwrap().is_empty());
            assert_eq!(store.get(OLD_HELD_KEYS).unwrap(), None);
            assert_eq!(op.state_progress().unwrap().num_rows_total, 2);
            let row = |k: i64, t: i64| {
                let mut row = Row::new();
                row.set("k", Value::Long(k));
                row.set("t", Value::Timestamp(t * SECOND));
                row
            };
            let mut out = Vec::new();
            for k in [1, 2, 3] {
                op.on_row(row(k, 5), &ctx(0), &mut out).unwrap();
            }
            assert_eq!(out, vec![row(3, 5)], "1 and 2 are still held");
            // The watermark passes 11 s: key 1 goes, key 2 stays.
            op.on_batch_end(&ctx(12 * SECOND), &mut out).unwrap();
            op.checkpoint().unwrap();
            out.clear();
            for k in [1, 2] {
                op.on_row(row(k, 20), &ctx(12 * SECOND), &mut out).unwrap();
            }
            assert_eq!(out, vec![row(1, 20)], "{cache_bytes:?}");
        }
    }

    /// A write that reached the store: a put (`true`) or a delete.
    type Write = (bool, Vec<u8>);

    /// Records the writes that reach it, in order.
    #[derive(Clone, Default)]
    struct RecordingStore {
        inner: SharedStore,
        writes: Arc<std::sync::Mutex<Vec<Write>>>,
    }

    impl StateStore for RecordingStore {
        fn name(&self) -> &str {
            "recording"
        }
        fn get(
            &self,
            key: &[u8],
        ) -> std::result::Result<Option<Vec<u8>>, tidemark_state::StateError> {
            self.inner.get(key)
        }
        fn put(
            &mut self,
            key: &[u8],
            value: &[u8],
        ) -> std::result::Result<(), tidemark_state::StateError> {
            self.writes.lock().unwrap().push((true, key.to_vec()));
            self.inner.put(key, value)
        }
        fn delete(&mut self, key: &[u8]) -> std::result::Result<(), tidemark_state::StateError> {
            self.writes.lock().unwrap().push((false, key.to_vec()));
            self.inner.delete(key)
        }
        fn range(
            &self,
            start: &[u8],
            end: &[u8],
        ) -> std::result::Result<tidemark_state::Entries, tidemark_state::StateError> {
            self.inner.range(start, end)
        }
        fn prefix(
            &self,
            prefix: &[u8],
        ) -> std::result::Result<tidemark_state::Entries, tidemark_state::StateError> {
            self.inner.prefix(prefix)
        }
        fn approximate_len(&self) -> usize {
            self.inner.approximate_len()
        }
    }

    /// The upgrade's new entries reach the store below the write cache
    /// (and so the changelog) before any old entry's deletion: a cut
    /// between them cannot leave a key in neither layout.
    #[test]
    fn the_layout_upgrade_writes_every_new_entry_before_deleting_an_old_one() {
        use crate::state_codec::{expiry_key, state_key};
        let mut recording = RecordingStore::default();
        for k in 0..50i64 {
            let mut key = Vec::new();
            encode_key_into(std::iter::once(&Value::Long(k)), &mut key);
            recording
                .inner
                .put(&state_key(&key), &(k * SECOND).to_le_bytes())
                .unwrap();
            recording
                .inner
                .put(&expiry_key(k * SECOND, &key), &[])
                .unwrap();
        }
        let cached = tidemark_state::CachingStore::new(recording.clone(), 1 << 20);
        let mut op = Deduplicate::new(spec(true), Some(Arc::from("t"))).unwrap();
        op.open_state(Box::new(cached), Some(1)).unwrap();
        let writes = recording.writes.lock().unwrap().clone();
        let first_delete = writes.iter().position(|(put, _)| !put).unwrap();
        let last_put = writes.iter().rposition(|(put, _)| *put).unwrap();
        assert!(last_put < first_delete, "{last_put} >= {first_delete}");
        assert_eq!(writes.iter().filter(|(put, _)| *put).count(), 101);
        assert_eq!(writes.len() - first_delete, 101, "50 K, 50 E and N");
        assert_eq!(op.state_progress().unwrap().num_rows_total, 50);
    }

    /// Kept in memory, a key evicted and held again between two
    /// checkpoints (the real-time trigger's batches) leaves one entry in
    /// the expiry order, at its new time.
    #[test]
    fn a_key_evicted_and_held_again_between_checkpoints_keeps_one_expiry() {
        let store = SharedStore::default();
        let mut op = Deduplicate::new(spec(true), Some(Arc::from("t"))).unwrap();
        op.open_state(Box::new(store.clone()), None).unwrap();
        let row = |t: i64| {
            let mut row = Row::new();
            row.set("k", Value::Long(1));
            row.set("t", Value::Timestamp(t * SECOND));
            row
        };
        let mut out = Vec::new();
        op.on_row(row(1), &ctx(0), &mut out).unwrap();
        op.on_batch_end(&ctx(0), &mut out).unwrap();
        op.checkpoint().unwrap();
        // Evicted at 11 s, held again at 20 s (until 30 s), no checkpoint.
        op.on_batch_end(&ctx(12 * SECOND), &mut out).unwrap();
        op.on_row(row(20), &ctx(12 * SECOND), &mut out).unwrap();
        op.checkpoint().unwrap();
        assert_eq!(out.len(), 2);
        let index = store.prefix(b"y").unwrap();
        assert_eq!(index.len(), 1, "{index:?}");
        let mut reopened = Deduplicate::new(spec(true), Some(Arc::from("t"))).unwrap();
        reopened
            .open_state(Box::new(store.clone()), Some(1))
            .unwrap();
        let mut after = Vec::new();
        reopened
            .on_batch_end(&ctx(29 * SECOND), &mut after)
            .unwrap();
        reopened
            .on_row(row(25), &ctx(29 * SECOND), &mut after)
            .unwrap();
        assert!(after.is_empty(), "still held until 30 s");
    }
}
