//! The engine's cache of decoded operator state: one map of values by key
//! over a [`StateStore`], so that an operator works on its own types and
//! never hand-rolls a bounded cache, a dirty set, spilling or write-back.
//!
//! Two ways to hold state, chosen when the store is opened:
//! - **Whole in memory** (no bound): every value is decoded once at open;
//!   the store only keeps what changed, written back at each checkpoint.
//! - **Read through the store** (a bound in entries): a value not in memory
//!   is read and decoded on demand. Past its bound in unchanged entries
//!   (and past the changed ones' number), within a batch too, it drops
//!   unchanged entries down to half the bound. What changed stays in
//!   memory until the checkpoint writes it back, in one batch with the
//!   entries the operator keeps beside the values (an expiry index, a
//!   count), never apart: memory holds the bound plus what one batch
//!   changed (at most twice that while the batch reads more keys).
//!
//! Values live under one store key prefix (`K` then the key, the layout
//! tidemark's operators have always used), so that the store's other
//! entries (an expiry index, a count) sit beside them untouched.

use crate::StateStore;
use hashbrown::hash_map::EntryRef;
use smallvec::SmallVec;
use tidemark_types::error::Result;

/// A key as the cache holds it: inline up to 24 bytes, so that a short
/// key is compared in the hash table's slot without a jump.
pub type CacheKey = SmallVec<[u8; 24]>;

/// How one store's values are written and read: the operator's own
/// versioned layout.
pub trait StateCodec: Send {
    /// The decoded value of one key.
    type Value: Send;
    /// The bytes of `value`, layout version first.
    fn encode(&self, value: &Self::Value) -> Result<Vec<u8>>;
    /// Reads what [`StateCodec::encode`] wrote (or an earlier layout); an
    /// unknown layout is an error, never a misread.
    fn decode(&self, bytes: &[u8]) -> Result<Self::Value>;
}

struct Slot<V> {
    value: V,
    /// Changed since the last write-back (its key is in `changed`); never
    /// dropped from memory before it is written.
    dirty: bool,
}

type Slots<V> = hashbrown::HashMap<CacheKey, Slot<V>, foldhash::fast::RandomState>;

/// Decoded values by key over a store (see the module documentation).
pub struct StateCache<C: StateCodec> {
    codec: C,
    store: Option<Box<dyn StateStore>>,
    slots: Slots<C::Value>,
    /// Keys changed (written or removed) since the last write-back; a key
    /// may be listed more than once.
    changed: Vec<CacheKey>,
    /// Entries in memory marked dirty.
    dirty_slots: usize,
    /// Keys removed since the last write-back while reading through the
    /// store, which still holds their old values: a read must not bring
    /// them back.
    removed: hashbrown::HashSet<CacheKey, foldhash::fast::RandomState>,
    /// Reading through the store: at most this many entries kept.
    bound: Option<usize>,
    /// Entries in the state, in memory or not.
    len: u64,
    /// Where the count is stored, if it is: reading through the store it
    /// is the only way to know it without reading every entry.
    count_key: Option<&'static [u8]>,
    store_key: Vec<u8>,
}

/// Puts (`Some`) and deletes (`None`) by store key, as
/// [`StateStore::write_batch`] takes them.
pub type StoreEntries = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// The prefix of a value's store key.
pub const VALUE_PREFIX: &[u8] = b"K";

impl<C: StateCodec> StateCache<C> {
    /// An empty cache with no store: state lives in memory only until
    /// [`StateCache::open`] hands it one.
    pub fn new(codec: C) -> Self {
        StateCache {
            codec,
            store: None,
            slots: Slots::default(),
            changed: Vec::new(),
            dirty_slots: 0,
            removed: Default::default(),
            bound: None,
            len: 0,
            count_key: None,
            store_key: Vec::new(),
        }
    }

    /// [`StateCache::new`], keeping the count of entries in the store at
    /// `count_key` (8 bytes, little-endian), written with the values.
    pub fn counted(codec: C, count_key: &'static [u8]) -> Self {
        StateCache {
            count_key: Some(count_key),
            ..StateCache::new(codec)
        }
    }

    /// Opens the cache over `store`: with `bound`, values are read from the
    /// store when needed and at most about that many stay in memory;
    /// without, every stored value is decoded now. Anything cached before
    /// is dropped.
    pub fn open(&mut self, store: Box<dyn StateStore>, bound: Option<usize>) -> Result<()> {
        self.slots = Slots::default();
        self.changed.clear();
        self.dirty_slots = 0;
        self.removed.clear();
        self.bound = bound.map(|b| b.max(2));
        self.len = 0;
        if let (Some(count_key), Some(_)) = (self.count_key, self.bound) {
            if let Some(bytes) = store.get(count_key)? {
                let bytes: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
                    tidemark_types::error::Error::Corrupt {
                        what: format!("the entry count of state store `{}`", store.name()),
                        reason: "not 8 bytes".into(),
                    }
                })?;
                self.len = u64::from_le_bytes(bytes);
            }
        }
        if self.bound.is_none() {
            for (key, bytes) in store.prefix(VALUE_PREFIX)? {
                let value = self.codec.decode(&bytes)?;
                let key = CacheKey::from_slice(&key[VALUE_PREFIX.len()..]);
                self.slots.insert(
                    key,
                    Slot {
                        value,
                        dirty: false,
                    },
                );
            }
            self.len = self.slots.len() as u64;
        }
        self.store = Some(store);
        Ok(())
    }

    /// The codec.
    pub fn codec(&self) -> &C {
        &self.codec
    }

    /// The store, once opened: for the operator's entries beside the
    /// values (an index, a count).
    pub fn store(&self) -> Option<&dyn StateStore> {
        self.store.as_deref()
    }

    /// The store, to write the operator's own entries beside the values.
    pub fn store_mut(&mut self) -> Option<&mut (dyn StateStore + 'static)> {
        self.store.as_deref_mut()
    }

    /// Hands the store back, dropping everything cached and any change
    /// not written back: the cache is as [`StateCache::new`] made it.
    pub fn take_store(&mut self) -> Option<Box<dyn StateStore>> {
        self.slots = Slots::default();
        self.changed.clear();
        self.dirty_slots = 0;
        self.removed.clear();
        self.len = 0;
        self.store.take()
    }

    /// Whether values not in memory are in the store (a bound was given).
    pub fn reads_through(&self) -> bool {
        self.bound.is_some() && self.store.is_some()
    }

    /// Whether `key`'s value is in memory.
    pub fn is_cached(&self, key: &[u8]) -> bool {
        self.slots.contains_key(key)
    }

    /// Entries in memory: every entry when the state is whole in memory.
    pub fn cached_len(&self) -> usize {
        self.slots.len()
    }

    /// Entries in the state, in memory or in the store (reading through a
    /// store without a count key, only those counted since it opened).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the state has no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the store holds a value for `key` that memory does not:
    /// reading through it, not cached and not removed since.
    fn stored_only(&mut self, key: &[u8]) -> Result<bool> {
        if !self.reads_through() || self.slots.contains_key(key) || self.removed.contains(key) {
            return Ok(false);
        }
        Ok(self.read_stored(key)?.is_some())
    }

    /// `key`'s bytes in the store, through a reused buffer for its store
    /// key.
    fn read_stored(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.store_key.clear();
        push_value_key(&mut self.store_key, key);
        match self.store.as_ref() {
            Some(store) => Ok(store.get(&self.store_key)?),
            None => Ok(None),
        }
    }

    /// Reads `key`'s value from the store into memory when it is neither
    /// cached nor whole in memory; whether the key has a value.
    fn load(&mut self, key: &[u8]) -> Result<bool> {
        if self.slots.contains_key(key) {
            return Ok(true);
        }
        self.load_missing(key)
    }

    /// [`StateCache::load`] of a key known not to be in memory.
    fn load_missing(&mut self, key: &[u8]) -> Result<bool> {
        if !self.reads_through() || self.removed.contains(key) {
            return Ok(false);
        }
        let Some(bytes) = self.read_stored(key)? else {
            return Ok(false);
        };
        let value = self.codec.decode(&bytes)?;
        self.make_room()?;
        self.slots.insert(
            CacheKey::from_slice(key),
            Slot {
                value,
                dirty: false,
            },
        );
        Ok(true)
    }

    /// `key`'s value, read from the store and cached if needed.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<&C::Value>> {
        if !self.reads_through() {
            return Ok(self.slots.get(key).map(|slot| &slot.value));
        }
        if !self.load(key)? {
            return Ok(None);
        }
        Ok(self.slots.get(key).map(|slot| &slot.value))
    }

    /// `key`'s value to change, read from the store and cached if needed;
    /// marked changed, so that the next write-back stores it.
    pub fn get_mut(&mut self, key: &[u8]) -> Result<Option<&mut C::Value>> {
        // Whole in memory, one probe: nothing to load.
        if self.reads_through() && !self.load(key)? {
            return Ok(None);
        }
        let Some(slot) = self.slots.get_mut(key) else {
            return Ok(None);
        };
        if self.store.is_some() {
            mark_changed(slot, key, &mut self.dirty_slots, &mut self.changed);
        }
        Ok(Some(&mut slot.value))
    }

    /// Changes `key`'s value, read from the store and cached if needed,
    /// with `change`, which says whether it changed anything: only then is
    /// it written back (a visit that finds nothing to do writes nothing).
    /// `None` when the key has no value.
    pub fn update(
        &mut self,
        key: &[u8],
        change: impl FnOnce(&mut C::Value) -> bool,
    ) -> Result<Option<bool>> {
        // One probe when cached: the borrow ends with the call.
        if let Some(slot) = self.slots.get_mut(key) {
            let changed = change(&mut slot.value);
            if changed && self.store.is_some() {
                mark_changed(slot, key, &mut self.dirty_slots, &mut self.changed);
            }
            return Ok(Some(changed));
        }
        if !self.load_missing(key)? {
            return Ok(None);
        }
        let slot = self.slots.get_mut(key).expect("loaded");
        let changed = change(&mut slot.value);
        if changed && self.store.is_some() {
            mark_changed(slot, key, &mut self.dirty_slots, &mut self.changed);
        }
        Ok(Some(changed))
    }

    /// [`StateCache::update`] for every entry in memory (the whole state
    /// when it is whole in memory), in no order.
    pub fn update_all(&mut self, mut change: impl FnMut(&[u8], &mut C::Value) -> bool) {
        let persisted = self.store.is_some();
        for (key, slot) in self.slots.iter_mut() {
            if change(key, &mut slot.value) && persisted {
                mark_changed(slot, key, &mut self.dirty_slots, &mut self.changed);
            }
        }
    }

    /// `key`'s value to change, made with `make` when the key has none
    /// (in memory or in the store); marked changed. The key is copied only
    /// when it is new to memory.
    pub fn get_or_insert_with(
        &mut self,
        key: &[u8],
        make: impl FnOnce() -> C::Value,
    ) -> Result<&mut C::Value> {
        // Room for a new entry, so that the bound holds after it.
        if self.reads_through() && !self.slots.contains_key(key) && !self.load_missing(key)? {
            self.make_room()?;
        }
        let slot = match self.slots.entry_ref(key) {
            EntryRef::Occupied(entry) => entry.into_mut(),
            EntryRef::Vacant(entry) => {
                self.len += 1;
                entry.insert_with_key(
                    CacheKey::from_slice(key),
                    Slot {
                        value: make(),
                        dirty: false,
                    },
                )
            }
        };
        if self.store.is_some() {
            mark_changed(slot, key, &mut self.dirty_slots, &mut self.changed);
        }
        Ok(&mut slot.value)
    }

    /// Sets `key`'s value (written back at the next checkpoint).
    pub fn insert(&mut self, key: &[u8], value: C::Value) -> Result<()> {
        if !self.slots.contains_key(key) {
            // New to memory: new to the state unless the store holds it.
            let stored_only = self.stored_only(key)?;
            if self.reads_through() {
                self.make_room()?;
            }
            self.len += u64::from(!stored_only);
        }
        let slot = match self.slots.entry_ref(key) {
            EntryRef::Occupied(entry) => {
                let slot = entry.into_mut();
                slot.value = value;
                slot
            }
            EntryRef::Vacant(entry) => entry.insert_with_key(
                CacheKey::from_slice(key),
                Slot {
                    value,
                    dirty: false,
                },
            ),
        };
        if self.store.is_some() {
            mark_changed(slot, key, &mut self.dirty_slots, &mut self.changed);
        }
        Ok(())
    }

    /// Removes `key`'s value, from the store too at the next write-back;
    /// whether the key had one (reading through the store, an uncached
    /// key costs a read to know).
    pub fn remove(&mut self, key: &[u8]) -> Result<bool> {
        let stored_only = self.stored_only(key)?;
        let slot = self.slots.remove(key);
        if slot.as_ref().is_some_and(|slot| slot.dirty) {
            self.dirty_slots = self.dirty_slots.saturating_sub(1);
        }
        let existed = slot.is_some() || stored_only;
        // A key without a value writes nothing (a tombstone of a key never
        // seen, say); one already removed is listed already.
        if !existed {
            return Ok(false);
        }
        self.len = self.len.saturating_sub(1);
        if self.reads_through() {
            self.removed.insert(CacheKey::from_slice(key));
        }
        if self.store.is_some() {
            self.changed.push(CacheKey::from_slice(key));
        }
        Ok(true)
    }

    /// `key`'s value as it stands, for a reader: from memory, or decoded
    /// from the store without caching it.
    pub fn peek(&self, key: &[u8]) -> Result<Option<PeekedValue<'_, C::Value>>> {
        if let Some(slot) = self.slots.get(key) {
            return Ok(Some(PeekedValue::Cached(&slot.value)));
        }
        let (Some(store), true) = (self.store.as_ref(), self.bound.is_some()) else {
            return Ok(None);
        };
        if self.removed.contains(key) {
            return Ok(None);
        }
        match store.get(&value_store_key(key))? {
            Some(bytes) => Ok(Some(PeekedValue::Stored(self.codec.decode(&bytes)?))),
            None => Ok(None),
        }
    }

    /// Every entry in memory, in no order: the whole state when it is
    /// whole in memory.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &C::Value)> {
        self.slots
            .iter()
            .map(|(k, slot)| (k.as_slice(), &slot.value))
    }

    /// Writes `entries` (the operator's own) and every change since the
    /// last write-back (values encoded, removed keys deleted) to the store
    /// as one batch. Returns how many entries were written.
    fn write_back(&mut self, mut entries: StoreEntries) -> Result<usize> {
        self.removed.clear();
        self.dirty_slots = 0;
        let Some(store) = self.store.as_mut() else {
            self.changed.clear();
            return Ok(0);
        };
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        entries.reserve(changed.len() + 1);
        for key in changed {
            let store_key = value_store_key(&key);
            match self.slots.get_mut(key.as_slice()) {
                Some(slot) => {
                    slot.dirty = false;
                    entries.push((store_key, Some(self.codec.encode(&slot.value)?)));
                }
                None => entries.push((store_key, None)),
            }
        }
        if let (Some(count_key), false) = (self.count_key, entries.is_empty()) {
            // In the same batch as the entries it counts, should the
            // store's write cache flush them early.
            entries.push((count_key.to_vec(), Some(self.len.to_le_bytes().to_vec())));
        }
        store.write_batch(&entries)?;
        Ok(entries.len())
    }

    /// Ends a checkpoint: writes back every change, flushes the store and,
    /// reading through it, keeps at most the bound in memory.
    pub fn checkpoint(&mut self) -> Result<usize> {
        self.checkpoint_with(Vec::new())
    }

    /// [`StateCache::checkpoint`], writing `entries` (the operator's own
    /// beside the values: an expiry index, a count; `None` deletes) in
    /// the same batch as the values, so that a store that writes a batch
    /// atomically never holds one without the other.
    pub fn checkpoint_with(&mut self, entries: StoreEntries) -> Result<usize> {
        let written = self.write_back(entries)?;
        if let Some(store) = self.store.as_mut() {
            store.flush()?;
        }
        if let Some(bound) = self.bound.filter(|_| self.store.is_some()) {
            if self.slots.len() > bound {
                // Three quarters: room for the next batch's new keys
                // without shrinking again at once.
                self.shrink(bound * 3 / 4);
            }
        }
        Ok(written)
    }

    /// Reading through the store with the bound reached in unchanged
    /// entries: keeps half the bound of them, so that one more fits. Not
    /// before they also number the changed ones, which a shrink copies
    /// too: a batch that changes many keys while reading others would
    /// otherwise rebuild its whole map every few reads.
    fn make_room(&mut self) -> Result<()> {
        let Some(bound) = self.bound else {
            return Ok(());
        };
        let clean = self.slots.len() - self.dirty_slots;
        if clean >= bound.max(self.dirty_slots) {
            self.shrink(bound / 2);
        }
        Ok(())
    }

    /// Keeps every changed entry and `keep` unchanged ones, in a new map:
    /// a map emptied by removals keeps its tombstones, and every lookup of
    /// a key not cached probes through them (measured: 4x slower).
    fn shrink(&mut self, keep: usize) {
        let capacity = self.bound.unwrap_or(keep) + self.dirty_slots;
        let mut clean = 0;
        let kept = std::mem::take(&mut self.slots)
            .into_iter()
            .filter(|(_, slot)| {
                clean += usize::from(!slot.dirty);
                slot.dirty || clean <= keep
            });
        let mut slots = Slots::with_capacity_and_hasher(capacity, Default::default());
        slots.extend(kept);
        self.slots = slots;
    }
}

/// The store key of `key`'s value.
fn value_store_key(key: &[u8]) -> Vec<u8> {
    let mut store_key = Vec::with_capacity(VALUE_PREFIX.len() + key.len());
    push_value_key(&mut store_key, key);
    store_key
}

/// Appends the store key of `key`'s value to `out`.
fn push_value_key(out: &mut Vec<u8>, key: &[u8]) {
    out.extend_from_slice(VALUE_PREFIX);
    out.extend_from_slice(key);
}

/// Marks `key`'s slot to write back, once: counted among the dirty slots
/// and listed among the keys changed.
fn mark_changed<V>(
    slot: &mut Slot<V>,
    key: &[u8],
    dirty_slots: &mut usize,
    changed: &mut Vec<CacheKey>,
) {
    if !slot.dirty {
        slot.dirty = true;
        *dirty_slots += 1;
        changed.push(CacheKey::from_slice(key));
    }
}

/// A value read for a reader: borrowed from memory or decoded anew.
pub enum PeekedValue<'a, V> {
    /// In memory.
    Cached(&'a V),
    /// Decoded from the store (not cached).
    Stored(V),
}

impl<V> std::ops::Deref for PeekedValue<'_, V> {
    type Target = V;
    fn deref(&self) -> &V {
        match self {
            PeekedValue::Cached(v) => v,
            PeekedValue::Stored(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryStore;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use tidemark_types::error::{Error, StateError};

    /// Values are `u32`s in four bytes behind a version byte.
    struct U32Codec;

    impl StateCodec for U32Codec {
        type Value = u32;
        fn encode(&self, value: &u32) -> Result<Vec<u8>> {
            let mut out = vec![1];
            out.extend(value.to_le_bytes());
            Ok(out)
        }
        fn decode(&self, bytes: &[u8]) -> Result<u32> {
            match bytes {
                [1, rest @ ..] => Ok(u32::from_le_bytes(
                    rest.try_into()
                        .map_err(|_| Error::Internal("length".into()))?,
                )),
                _ => Err(Error::Internal("layout".into())),
            }
        }
    }

    /// A store the test still reads after handing it to the cache.
    #[derive(Clone)]
    struct Shared(Arc<Mutex<InMemoryStore>>);

    impl StateStore for Shared {
        fn name(&self) -> &str {
            "shared"
        }
        fn get(&self, key: &[u8]) -> std::result::Result<Option<Vec<u8>>, StateError> {
            self.0.lock().unwrap().get(key)
        }
        fn put(&mut self, key: &[u8], value: &[u8]) -> std::result::Result<(), StateError> {
            self.0.lock().unwrap().put(key, value)
        }
        fn delete(&mut self, key: &[u8]) -> std::result::Result<(), StateError> {
            self.0.lock().unwrap().delete(key)
        }
        fn range(
            &self,
            start: &[u8],
            end: &[u8],
        ) -> std::result::Result<crate::Entries, StateError> {
            self.0.lock().unwrap().range(start, end)
        }
        fn prefix(&self, prefix: &[u8]) -> std::result::Result<crate::Entries, StateError> {
            self.0.lock().unwrap().prefix(prefix)
        }
        fn approximate_len(&self) -> usize {
            self.0.lock().unwrap().approximate_len()
        }
    }

    fn stored(store: &Shared) -> BTreeMap<Vec<u8>, u32> {
        store
            .prefix(VALUE_PREFIX)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (k[1..].to_vec(), U32Codec.decode(&v).unwrap()))
            .collect()
    }

    #[test]
    fn writes_back_at_checkpoint_and_restores() {
        let store = Shared(Arc::new(Mutex::new(InMemoryStore::new("t"))));
        let mut cache = StateCache::new(U32Codec);
        cache.open(Box::new(store.clone()), None).unwrap();
        *cache.get_or_insert_with(b"a", || 0).unwrap() += 5;
        cache.insert(b"b", 7).unwrap();
        assert!(
            stored(&store).is_empty(),
            "nothing written before the checkpoint"
        );
        assert_eq!(cache.checkpoint().unwrap(), 2);
        cache.remove(b"b").unwrap();
        assert_eq!(cache.checkpoint().unwrap(), 1);
        assert_eq!(stored(&store), BTreeMap::from([(b"a".to_vec(), 5)]));
        let mut restored = StateCache::new(U32Codec);
        restored.open(Box::new(store.clone()), None).unwrap();
        assert_eq!(restored.get(b"a").unwrap(), Some(&5));
        assert_eq!(restored.get(b"b").unwrap(), None);
    }

    #[test]
    fn the_operators_entries_go_with_the_values_and_a_missing_key_writes_nothing() {
        let store = Shared(Arc::new(Mutex::new(InMemoryStore::new("t"))));
        let mut cache = StateCache::counted(U32Codec, b"N");
        cache.open(Box::new(store.clone()), Some(4)).unwrap();
        cache.insert(b"a", 1).unwrap();
        let index = vec![(b"E1a".to_vec(), Some(Vec::new()))];
        assert_eq!(
            cache.checkpoint_with(index).unwrap(),
            3,
            "index, value, count"
        );
        assert_eq!(store.get(b"E1a").unwrap(), Some(Vec::new()));
        assert_eq!(stored(&store), BTreeMap::from([(b"a".to_vec(), 1)]));
        // A tombstone of a key never seen: nothing to delete, nothing
        // counted.
        assert!(!cache.remove(b"zz").unwrap());
        assert_eq!(cache.checkpoint().unwrap(), 0);
        assert_eq!(cache.len(), 1);
        assert!(cache.remove(b"a").unwrap());
        assert!(!cache.remove(b"a").unwrap(), "removed already");
        assert_eq!(
            cache.get(b"a").unwrap(),
            None,
            "not read back from the store"
        );
        assert_eq!(cache.checkpoint().unwrap(), 2, "the delete and the count");
        assert!(stored(&store).is_empty());
    }

    #[test]
    fn an_unknown_layout_fails_the_open() {
        let mut store = InMemoryStore::new("t");
        store.put(b"Ka", &[9, 0, 0, 0, 0]).unwrap();
        let mut cache = StateCache::new(U32Codec);
        assert!(cache.open(Box::new(store), None).is_err());
    }

    #[derive(Debug, Clone)]
    enum Step {
        Add(u8, u32),
        Set(u8, u32),
        Remove(u8),
        Checkpoint,
        Reopen,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            6 => (0u8..40, 0u32..100).prop_map(|(k, v)| Step::Add(k, v)),
            2 => (0u8..40, 0u32..100).prop_map(|(k, v)| Step::Set(k, v)),
            2 => (0u8..40).prop_map(Step::Remove),
            1 => Just(Step::Checkpoint),
            1 => Just(Step::Reopen),
        ]
    }

    proptest! {
        /// Whole in memory or read through a store with a small bound, the
        /// cache answers as a map would, and what a checkpoint wrote is
        /// what a reopened cache reads.
        #[test]
        fn behaves_as_a_map(steps in proptest::collection::vec(step(), 1..200), bound in proptest::option::of(2usize..8)) {
            let store = Shared(Arc::new(Mutex::new(InMemoryStore::new("t"))));
            let mut cache = StateCache::counted(U32Codec, b"N");
            cache.open(Box::new(store.clone()), bound).unwrap();
            let mut model: BTreeMap<Vec<u8>, u32> = BTreeMap::new();
            let mut checkpointed = model.clone();
            let mut peak_dirty = 0;
            for step in steps {
                match step {
                    Step::Add(k, v) => {
                        *cache.get_or_insert_with(&[k], || 0).unwrap() += v;
                        *model.entry(vec![k]).or_default() += v;
                    }
                    Step::Set(k, v) => {
                        cache.insert(&[k], v).unwrap();
                        model.insert(vec![k], v);
                    }
                    Step::Remove(k) => {
                        cache.remove(&[k]).unwrap();
                        model.remove(&vec![k]);
                    }
                    Step::Checkpoint => {
                        cache.checkpoint().unwrap();
                        peak_dirty = 0;
                        checkpointed = model.clone();
                        prop_assert_eq!(stored(&store), model.clone());
                        let count = store.get(b"N").unwrap().map(|b| u64::from_le_bytes(b.try_into().unwrap()));
                        prop_assert_eq!(count.unwrap_or(0), model.len() as u64);
                    }
                    Step::Reopen => {
                        // A restart: back to the last checkpoint.
                        cache = StateCache::counted(U32Codec, b"N");
                        *store.0.lock().unwrap() = InMemoryStore::new("t");
                        let count = (checkpointed.len() as u64).to_le_bytes();
                        store.clone().put(b"N", &count).unwrap();
                        for (k, v) in &checkpointed {
                            let mut key = VALUE_PREFIX.to_vec();
                            key.extend(k);
                            store.clone().put(&key, &U32Codec.encode(v).unwrap()).unwrap();
                        }
                        cache.open(Box::new(store.clone()), bound).unwrap();
                        model = checkpointed.clone();
                        peak_dirty = 0;
                    }
                }
                if let Some(bound) = bound {
                    // Unchanged entries stay within the bound, or within the
                    // most changed ones since the last write-back.
                    peak_dirty = peak_dirty.max(cache.dirty_slots);
                    let clean = cache.cached_len() - cache.dirty_slots;
                    prop_assert!(clean <= bound.max(peak_dirty), "{clean} unchanged cached");
                    let dirty = cache.slots.values().filter(|slot| slot.dirty).count();
                    prop_assert_eq!(dirty, cache.dirty_slots);
                }
                prop_assert_eq!(cache.len(), model.len() as u64);
                for k in 0..40u8 {
                    let peeked = cache.peek(&[k]).unwrap().map(|v| *v);
                    prop_assert_eq!(peeked, model.get(&vec![k]).copied());
                }
            }
        }
    }
}
