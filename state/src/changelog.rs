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

    /// Replays one chunk of a changelog into the store below, in one write
    /// batch, without logging it again.
    pub fn restore_chunk(&mut self, chunk: &ChangelogChunk) -> Result<(), StateError> {
        self.inner.restore_batch(&mut chunk.iter())
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

/// Store changes as a restore hands them on, in one reused buffer (no
/// allocation per record): `(key, value)`, no value for a tombstone.
#[derive(Debug, Default, Clone)]
pub struct ChangelogChunk {
    bytes: Vec<u8>,
    /// Per entry: key length, then value length (`None`: a tombstone).
    lengths: Vec<(u32, Option<u32>)>,
}

impl ChangelogChunk {
    /// Appends one change.
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.bytes.extend_from_slice(key);
        if let Some(v) = value {
            self.bytes.extend_from_slice(v);
        }
        self.lengths
            .push((key.len() as u32, value.map(|v| v.len() as u32)));
    }

    /// The changes held.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    /// Whether no change is held.
    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Forgets the changes, keeping the buffers.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.lengths.clear();
    }

    /// The changes in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        let mut at = 0;
        self.lengths.iter().map(move |(key_len, value_len)| {
            let key = &self.bytes[at..at + *key_len as usize];
            at += *key_len as usize;
            let value = value_len.map(|n| {
                let v = &self.bytes[at..at + n as usize];
                at += n as usize;
                v
            });
            (key, value)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_hands_back_its_changes_in_order_and_is_reused_after_clear() {
        let mut chunk = ChangelogChunk::default();
        let changes: [(&[u8], Option<&[u8]>); 4] = [
            (b"a", Some(b"1")),
            (b"", Some(b"")),
            (b"gone", None),
            (b"b", Some(b"22")),
        ];
        for (key, value) in changes {
            chunk.push(key, value);
        }
        assert_eq!(chunk.len(), 4);
        assert_eq!(chunk.bytes(), 1 + 1 + 4 + 1 + 2);
        assert_eq!(chunk.iter().collect::<Vec<_>>(), changes);
        chunk.clear();
        assert!(chunk.is_empty());
        chunk.push(b"c", None);
        assert_eq!(chunk.iter().collect::<Vec<_>>(), [(&b"c"[..], None)]);
    }
}
