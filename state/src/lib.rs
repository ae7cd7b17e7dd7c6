//! State stores for tidemark operators.
//!
//! A [`StateStore`] is an ordered key-value store with prefix and range
//! scans, so that an operator finds all windows of one key, or every entry
//! that expires at a watermark, with one scan. Stores stack as in Kafka
//! Streams: [`CachingStore`] (hot keys in memory between checkpoints) over
//! [`ChangeLoggingStore`] (the latest value per key to a changelog) over
//! [`RocksDbStore`] (one RocksDB per task, a column family per store), with
//! [`InMemoryStore`] for unit tests and small state. Operators keep their
//! decoded state in a [`StateCache`] over their store: the one cache,
//! dirty set, spill and write-back the engine owns.
#![deny(missing_docs)]

mod cache;
mod caching;
mod changelog;
mod keyed;
mod rocks;

pub use cache::{CacheKey, PeekedValue, StateCache, StateCodec, StoreEntries, VALUE_PREFIX};
pub use caching::CachingStore;
pub use changelog::{
    ChangeLoggingStore, ChangelogChunk, ChangelogRecord, ChangelogWriter, VecChangelog,
};
pub use keyed::{
    cell_prefix, key_section, DueTimer, KeyedStateCounts, KeyedStateStore, Micros, StateKind,
    TimeDomain,
};
pub use rocks::{MemoryBudget, RocksDbStore, TaskDb};

use std::collections::BTreeMap;
use std::ops::Bound;

/// Errors of a state store (defined with tidemark's other errors, so that
/// the types crate needs no store).
pub use tidemark_types::error::StateError;

/// One key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Key-value pairs in key order, as scans return them.
pub type Entries = Vec<Entry>;

/// Changes replayed by a restore: `(key, value)`, no value for a tombstone.
pub type RestoreEntries<'a> = dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a;

/// An ordered byte-key store.
pub trait StateStore: Send {
    /// The store's name (used for its changelog topic).
    fn name(&self) -> &str;
    /// The value of `key`.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;
    /// Sets `key` to `value`.
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError>;
    /// Removes `key`.
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError>;
    /// Entries with `start <= key < end`, in key order.
    fn range(&self, start: &[u8], end: &[u8]) -> Result<Entries, StateError>;
    /// Entries whose key starts with `prefix`, in key order.
    fn prefix(&self, prefix: &[u8]) -> Result<Entries, StateError>;
    /// The first entry with `start <= key < end`: what `range` would
    /// return first, without reading the rest (an index's earliest time).
    fn first_in_range(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>, StateError> {
        Ok(self.range(start, end)?.into_iter().next())
    }
    /// Number of entries (estimated for disk stores).
    fn approximate_len(&self) -> usize;
    /// Applies puts (`Some`) and deletes (`None`) together; disk stores
    /// write them as one atomic batch.
    fn write_batch(&mut self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StateError> {
        for (key, value) in entries {
            match value {
                Some(v) => self.put(key, v)?,
                None => self.delete(key)?,
            }
        }
        Ok(())
    }
    /// Writes a chunk of a restore: as [`StateStore::write_batch`], but a
    /// store may skip its own crash journal (RocksDB's write-ahead log),
    /// since a restore cut short is redone from its changelog anyway; the
    /// restore ends with [`StateStore::flush`].
    fn restore_batch(&mut self, entries: &mut RestoreEntries<'_>) -> Result<(), StateError> {
        let owned: Vec<(Vec<u8>, Option<Vec<u8>>)> = entries
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect();
        self.write_batch(&owned)
    }
    /// Makes everything written durable (a flush of dirty caches and
    /// memtables); called at each checkpoint.
    fn flush(&mut self) -> Result<(), StateError> {
        Ok(())
    }
}

/// A boxed store is a store: layers stack over whatever store a backend
/// hands out.
impl StateStore for Box<dyn StateStore> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        (**self).get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        (**self).put(key, value)
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        (**self).delete(key)
    }
    fn range(&self, start: &[u8], end: &[u8]) -> Result<Entries, StateError> {
        (**self).range(start, end)
    }
    fn prefix(&self, prefix: &[u8]) -> Result<Entries, StateError> {
        (**self).prefix(prefix)
    }
    fn first_in_range(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>, StateError> {
        (**self).first_in_range(start, end)
    }
    fn approximate_len(&self) -> usize {
        (**self).approximate_len()
    }
    fn write_batch(&mut self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StateError> {
        (**self).write_batch(entries)
    }
    fn restore_batch(&mut self, entries: &mut RestoreEntries<'_>) -> Result<(), StateError> {
        (**self).restore_batch(entries)
    }
    fn flush(&mut self) -> Result<(), StateError> {
        (**self).flush()
    }
}

/// A `BTreeMap` store.
///
/// ```
/// use tidemark_state::{InMemoryStore, StateStore};
/// let mut s = InMemoryStore::new("counts");
/// s.put(b"a/1", b"x").unwrap();
/// s.put(b"a/2", b"y").unwrap();
/// s.put(b"b/1", b"z").unwrap();
/// assert_eq!(s.prefix(b"a/").unwrap().len(), 2);
/// ```
#[derive(Debug, Default, Clone)]
pub struct InMemoryStore {
    name: String,
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl InMemoryStore {
    /// An empty store.
    pub fn new(name: &str) -> Self {
        InMemoryStore {
            name: name.to_string(),
            entries: BTreeMap::new(),
        }
    }
}

impl StateStore for InMemoryStore {
    fn name(&self) -> &str {
        &self.name
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.entries.get(key).cloned())
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.entries.insert(key.to_vec(), value.to_vec());
        Ok(())
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.entries.remove(key);
        Ok(())
    }
    fn range(&self, start: &[u8], end: &[u8]) -> Result<Entries, StateError> {
        Ok(self
            .entries
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn prefix(&self, prefix: &[u8]) -> Result<Entries, StateError> {
        Ok(self
            .entries
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
    fn first_in_range(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>, StateError> {
        Ok(self
            .entries
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
            .next()
            .map(|(k, v)| (k.clone(), v.clone())))
    }
    fn approximate_len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_is_half_open() {
        let mut s = InMemoryStore::new("t");
        for k in [b"a", b"b", b"c"] {
            s.put(k, b"v").unwrap();
        }
        let keys: Vec<Vec<u8>> = s
            .range(b"a", b"c")
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, vec![b"a".to_vec(), b"b".to_vec()]);
        s.delete(b"a").unwrap();
        assert_eq!(s.get(b"a").unwrap(), None);
        assert_eq!(s.approximate_len(), 2);
    }
}
