//! The change-logging layer: every write that reaches it is also appended to
//! the store's changelog (a compacted Kafka topic in production), so that a
//! task's state can be rebuilt anywhere. Under a [`crate::CachingStore`] it
//! sees only the latest value per key per checkpoint.

use crate::{Entries, Entry, StateError, StateStore};

/// One changelog entry: a key and its new value, `None` for a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogRecord {
    /// The store the entry belongs to.
    pub store: String,
    /// The task's partition (the changelog partition).
    pub partition: i32,
    /// The key.
    pub key: Vec<u8>,
    /// The value; `None` deletes the key.
    pub value: Option<Vec<u8>>,
}

/// Where changelog records go (the Kafka producer in connectors).
pub trait ChangelogWriter: Send {
    /// Appends one record; delivery is confirmed at the checkpoint.
    fn append(&mut self, record: ChangelogRecord) -> Result<(), StateError>;
}

/// Collects changelog records in memory (tests, restore checks).
#[derive(Debug, Default, Clone)]
pub struct VecChangelog {
    /// Records in append order.
    pub records: Vec<ChangelogRecord>,
}

impl ChangelogWriter for VecChangelog {
    fn append(&mut self, record: ChangelogRecord) -> Result<(), StateError> {
        self.records.push(record);
        Ok(())
    }
}

/// Writes through to `inner` and appends each change to a changelog.
///
/// ```
/// use tidemark_state::{ChangeLoggingStore, InMemoryStore, StateStore, VecChangelog};
/// let mut store = ChangeLoggingStore::new(InMemoryStore::new("counts"), VecChangelog::default(), 3);
/// store.put(b"a", b"1").unwrap();
/// store.delete(b"a").unwrap();
/// let log = store.writer();
/// assert_eq!(log.records.len(), 2);
/// assert_eq!(log.records[1].value, None, "a tombstone");
/// ```
pub struct ChangeLoggingStore<S: StateStore, W: ChangelogWriter> {
    inner: S,
    writer: W,
    partition: i32,
}

impl<S: StateStore, W: ChangelogWriter> ChangeLoggingStore<S, W> {
    /// Logs `inner`'s changes to `writer` under `partition`.
    pub fn new(inner: S, writer: W, partition: i32) -> Self {
        ChangeLoggingStore {
            inner,
            writer,
            partition,
        }
    }

    /// The changelog writer.
    pub fn writer(&self) -> &W {
        &self.writer
    }

    /// Replays changelog records into the store below without logging them
    /// again (restore after a restart or a rebalance).
    pub fn restore(
        &mut self,
        records: impl IntoIterator<Item = ChangelogRecord>,
    ) -> Result<u64, StateError> {
        let mut batch = Vec::new();
        let mut count = 0;
        for r in records {
            batch.push((r.key, r.value));
            count += 1;
            if batch.len() >= 10_000 {
                self.inner.write_batch(&batch)?;
                batch.clear();
            }
        }
        self.inner.write_batch(&batch)?;
        Ok(count)
    }

    /// Replays one chunk of a changelog's `(key, value)` entries (no value:
    /// a tombstone) into the store below, in one write batch, without
    /// logging them again.
    pub fn restore_entries(
        &mut self,
        entries: &[(Vec<u8>, Option<Vec<u8>>)],
    ) -> Result<(), StateError> {
        self.inner.write_batch(entries)
    }

    fn log(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), StateError> {
        let store = self.inner.name().to_string();
        self.writer.append(ChangelogRecord {
            store,
            partition: self.partition,
            key: key.to_vec(),
            value: value.map(<[u8]>::to_vec),
        })
    }
}

impl<S: StateStore, W: ChangelogWriter> StateStore for ChangeLoggingStore<S, W> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.inner.get(key)
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.inner.put(key, value)?;
        self.log(key, Some(value))
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.inner.delete(key)?;
        self.log(key, None)
    }
    fn range(&self, start: &[u8], end: &[u8]) -> Result<Entries, StateError> {
        self.inner.range(start, end)
    }
    fn prefix(&self, prefix: &[u8]) -> Result<Entries, StateError> {
        self.inner.prefix(prefix)
    }
    fn first_in_range(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>, StateError> {
        self.inner.first_in_range(start, end)
    }
    fn approximate_len(&self) -> usize {
        self.inner.approximate_len()
    }
    fn write_batch(&mut self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StateError> {
        self.inner.write_batch(entries)?;
        for (key, value) in entries {
            self.log(key, value.as_deref())?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StateError> {
        self.inner.flush()
    }
}
