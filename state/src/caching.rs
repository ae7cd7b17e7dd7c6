//! The write cache: repeated updates to a hot key between checkpoints touch
//! memory only; a flush writes the latest value per key downstream in one
//! batch. Bounded in bytes: past the bound it flushes early.

use crate::{Entries, Entry, StateError, StateStore};
use std::collections::BTreeMap;

/// Caches writes in front of another store.
///
/// ```
/// use tidemark_state::{CachingStore, InMemoryStore, StateStore};
/// let mut store = CachingStore::new(InMemoryStore::new("counts"), 1 << 20);
/// for n in 0..100u32 {
///     store.put(b"hot", &n.to_be_bytes()).unwrap();
/// }
/// assert_eq!(store.inner().approximate_len(), 0, "nothing written through yet");
/// store.flush().unwrap();
/// assert_eq!(store.inner().get(b"hot").unwrap(), Some(99u32.to_be_bytes().to_vec()));
/// ```
pub struct CachingStore<S: StateStore> {
    inner: S,
    dirty: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    dirty_bytes: usize,
    max_bytes: usize,
    early_flushes: u64,
}

impl<S: StateStore> CachingStore<S> {
    /// A cache of at most `max_bytes` of dirty entries over `inner`.
    pub fn new(inner: S, max_bytes: usize) -> Self {
        CachingStore {
            inner,
            dirty: BTreeMap::new(),
            dirty_bytes: 0,
            max_bytes,
            early_flushes: 0,
        }
    }

    /// The store below.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many times the bound forced a flush before a checkpoint.
    pub fn early_flushes(&self) -> u64 {
        self.early_flushes
    }

    fn stage(&mut self, key: &[u8], value: Option<Vec<u8>>) -> Result<(), StateError> {
        let added = key.len() + value.as_ref().map_or(0, Vec::len);
        if let Some(old) = self.dirty.insert(key.to_vec(), value) {
            self.dirty_bytes -= key.len() + old.map_or(0, |v| v.len());
        }
        self.dirty_bytes += added;
        if self.dirty_bytes > self.max_bytes {
            self.early_flushes += 1;
            self.flush_dirty()?;
        }
        Ok(())
    }

    fn flush_dirty(&mut self) -> Result<(), StateError> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let entries: Vec<(Vec<u8>, Option<Vec<u8>>)> =
            std::mem::take(&mut self.dirty).into_iter().collect();
        self.dirty_bytes = 0;
        self.inner.write_batch(&entries)
    }

    /// Merges cached entries over `below`, both in key order.
    fn overlay(&self, below: Entries, cached: Vec<(&Vec<u8>, &Option<Vec<u8>>)>) -> Entries {
        let mut out = Vec::with_capacity(below.len() + cached.len());
        let mut below = below.into_iter().peekable();
        let mut cached = cached.into_iter().peekable();
        loop {
            match (below.peek(), cached.peek()) {
                (Some((bk, _)), Some((ck, _))) if bk < *ck => {
                    out.push(below.next().expect("peeked"))
                }
                (Some((bk, _)), Some((ck, _))) if bk == *ck => {
                    below.next();
                }
                (_, Some(_)) => {
                    let (k, v) = cached.next().expect("peeked");
                    if let Some(v) = v {
                        out.push((k.clone(), v.clone()));
                    }
                }
                (Some(_), None) => out.push(below.next().expect("peeked")),
                (None, None) => return out,
            }
        }
    }
}

impl<S: StateStore> StateStore for CachingStore<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        match self.dirty.get(key) {
            Some(v) => Ok(v.clone()),
            None => self.inner.get(key),
        }
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.stage(key, Some(value.to_vec()))
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.stage(key, None)
    }
    fn range(&self, start: &[u8], end: &[u8]) -> Result<Entries, StateError> {
        let cached = self
            .dirty
            .range::<[u8], _>((
                std::ops::Bound::Included(start),
                std::ops::Bound::Excluded(end),
            ))
            .collect();
        Ok(self.overlay(self.inner.range(start, end)?, cached))
    }
    fn prefix(&self, prefix: &[u8]) -> Result<Entries, StateError> {
        let cached = self
            .dirty
            .range::<[u8], _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
            .collect();
        Ok(self.overlay(self.inner.prefix(prefix)?, cached))
    }
    fn first_in_range(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>, StateError> {
        let mut from = start.to_vec();
        loop {
            let below = self.inner.first_in_range(&from, end)?;
            let cached = self
                .dirty
                .range::<[u8], _>((
                    std::ops::Bound::Included(from.as_slice()),
                    std::ops::Bound::Excluded(end),
                ))
                .next();
            let Some((key, value)) = cached else {
                return Ok(below);
            };
            if below.as_ref().is_some_and(|(b, _)| b < key) {
                return Ok(below);
            }
            match value {
                Some(v) => return Ok(Some((key.clone(), v.clone()))),
                // Deleted in the cache: the first entry is after it.
                None => {
                    from = key.clone();
                    from.push(0);
                }
            }
        }
    }
    fn approximate_len(&self) -> usize {
        self.inner.approximate_len() + self.dirty.values().filter(|v| v.is_some()).count()
    }
    fn flush(&mut self) -> Result<(), StateError> {
        self.flush_dirty()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InMemoryStore;

    #[test]
    fn first_in_range_sees_cached_puts_and_deletes_over_the_store() {
        let mut store = CachingStore::new(InMemoryStore::new("t"), 1 << 20);
        for key in [b"b1", b"b2", b"b3"] {
            store.put(key, b"v").unwrap();
        }
        store.flush().unwrap();
        let first =
            |s: &CachingStore<InMemoryStore>| s.first_in_range(b"b", b"c").unwrap().map(|(k, _)| k);
        assert_eq!(first(&store), Some(b"b1".to_vec()));
        store.delete(b"b1").unwrap();
        store.delete(b"b2").unwrap();
        assert_eq!(first(&store), Some(b"b3".to_vec()), "deleted in the cache");
        store.put(b"b0", b"w").unwrap();
        assert_eq!(first(&store), Some(b"b0".to_vec()), "put in the cache");
        store.delete(b"b0").unwrap();
        store.delete(b"b3").unwrap();
        assert_eq!(first(&store), None);
        assert_eq!(
            first(&store),
            store
                .range(b"b", b"c")
                .unwrap()
                .first()
                .map(|e| e.0.clone())
        );
    }
}
