//! RocksDB: one database per task under `state_dir/<application_id>/<task>`,
//! a column family per store, one memory budget for block cache and write
//! buffers.

use crate::{Entries, Entry, RestoreEntries, StateError, StateStore};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, Direction, IteratorMode, MultiThreaded,
    Options, WriteBatch, WriteBufferManager,
};

/// Column families are created while stores are in use, from `&self`.
type DB = rocksdb::DBWithThreadMode<MultiThreaded>;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Memory RocksDB may use across every task of an instance: half for the
/// block cache, half for memtables, both charged to the same cache so the
/// total stays within the budget.
#[derive(Clone)]
pub struct MemoryBudget {
    cache: Cache,
    write_buffers: WriteBufferManager,
    bytes: usize,
}

impl MemoryBudget {
    /// A budget of `bytes` (at least 16 MiB).
    pub fn new(bytes: usize) -> Self {
        let bytes = bytes.max(16 << 20);
        let cache = Cache::new_lru_cache(bytes);
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            bytes / 2,
            false,
            cache.clone(),
        );
        MemoryBudget {
            cache,
            write_buffers,
            bytes,
        }
    }

    /// The budget in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn options(&self) -> Options {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_write_buffer_manager(&self.write_buffers);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&self.cache);
        table.set_bloom_filter(10.0, false);
        table.set_cache_index_and_filter_blocks(true);
        // Partitioned index and filters: a whole-file filter block of a
        // large SST (megabytes) is bigger than a block-cache shard, is
        // never cached, and would be re-read and checksummed on every
        // lookup of a key the cache does not hold.
        table.set_partition_filters(true);
        table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_metadata_block_size(4096);
        table.set_pin_top_level_index_and_filter(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        opts.set_block_based_table_factory(&table);
        // Filters on a key's section too (see `scan_at_most`); every other
        // scan reads in total order.
        opts.set_prefix_extractor(rocksdb::SliceTransform::create(
            "tidemark.keyed_section",
            section_prefix,
            Some(in_a_section),
        ));
        opts
    }
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryBudget({} bytes)", self.bytes)
    }
}

/// The RocksDB database of one task.
///
/// ```
/// use tidemark_state::{MemoryBudget, StateStore, TaskDb};
/// let dir = tempfile::tempdir().unwrap();
/// let db = TaskDb::open(dir.path(), "orders-app", "0_3", &MemoryBudget::new(64 << 20)).unwrap();
/// let mut windows = db.store("window-aggregate").unwrap();
/// windows.put(b"k1", b"v1").unwrap();
/// assert_eq!(windows.get(b"k1").unwrap(), Some(b"v1".to_vec()));
/// ```
#[derive(Clone)]
pub struct TaskDb {
    db: Arc<DB>,
    path: PathBuf,
    budget: MemoryBudget,
}

fn backend(store: &str, e: impl std::fmt::Display) -> StateError {
    StateError::Backend {
        store: store.to_string(),
        reason: e.to_string(),
    }
}

impl TaskDb {
    /// Opens (or creates) `state_dir/<application_id>/<task>` with every
    /// column family it already has.
    pub fn open(
        state_dir: &Path,
        application_id: &str,
        task: &str,
        budget: &MemoryBudget,
    ) -> Result<Self, StateError> {
        let path = state_dir.join(application_id).join(task);
        std::fs::create_dir_all(&path)
            .map_err(|e| backend(task, format!("{}: {e}", path.display())))?;
        let opts = budget.options();
        let existing = DB::list_cf(&opts, &path).unwrap_or_default();
        let descriptors = existing
            .into_iter()
            .filter(|name| name != "default")
            .map(|name| ColumnFamilyDescriptor::new(name, budget.options()));
        let db = DB::open_cf_descriptors(&opts, &path, descriptors)
            .map_err(|e| backend(task, format!("{}: {e}", path.display())))?;
        Ok(TaskDb {
            db: Arc::new(db),
            path,
            budget: budget.clone(),
        })
    }

    /// The store `name` (its column family, created when missing).
    pub fn store(&self, name: &str) -> Result<RocksDbStore, StateError> {
        if self.db.cf_handle(name).is_none() {
            self.db
                .create_cf(name, &self.budget.options())
                .map_err(|e| backend(name, e))?;
        }
        Ok(RocksDbStore {
            db: self.db.clone(),
            name: name.to_string(),
        })
    }

    /// The store `name`, emptied (its column family dropped and created
    /// again): the start of a restore from the changelog.
    pub fn fresh_store(&self, name: &str) -> Result<RocksDbStore, StateError> {
        if self.db.cf_handle(name).is_some() {
            self.db.drop_cf(name).map_err(|e| backend(name, e))?;
        }
        self.store(name)
    }

    /// Writes a consistent copy of the database to `path` (which must not
    /// exist): RocksDB's checkpoint, hard links to its immutable files
    /// after a flush of what is in memory.
    pub fn checkpoint_to(&self, path: &Path) -> Result<(), StateError> {
        let name = path.display().to_string();
        rocksdb::checkpoint::Checkpoint::new(&self.db)
            .and_then(|c| c.create_checkpoint(path))
            .map_err(|e| backend(&name, e))
    }

    /// The task's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Deletes the task's directory (local state lost or corrupt: the next
    /// open starts empty and restores from the changelog).
    pub fn destroy(state_dir: &Path, application_id: &str, task: &str) -> Result<(), StateError> {
        let path = state_dir.join(application_id).join(task);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .map_err(|e| backend(task, format!("{}: {e}", path.display())))?;
        }
        Ok(())
    }
}

/// One store: a column family of a task's database.
pub struct RocksDbStore {
    db: Arc<DB>,
    name: String,
}

impl RocksDbStore {
    /// `entries` (puts, and deletes where no value) as one write batch.
    fn batch_of<'a>(
        &self,
        entries: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    ) -> Result<WriteBatch, StateError> {
        let cf = self.cf()?;
        let mut batch = WriteBatch::default();
        for (key, value) in entries {
            match value {
                Some(v) => batch.put_cf(&cf, key, v),
                None => batch.delete_cf(&cf, key),
            }
        }
        Ok(batch)
    }

    fn cf(&self) -> Result<Arc<rocksdb::BoundColumnFamily<'_>>, StateError> {
        self.db
            .cf_handle(&self.name)
            .ok_or_else(|| backend(&self.name, "column family missing"))
    }

    /// Entries from `start` up to `end` (exclusive; `None`: to the last).
    /// The bound is RocksDB's too: the iterator stops at it instead of
    /// stepping over the deleted keys that follow a range.
    fn scan(&self, start: &[u8], end: Option<Vec<u8>>) -> Result<Entries, StateError> {
        self.scan_at_most(start, end, usize::MAX)
    }

    /// [`Self::scan`], stopping after `limit` entries.
    fn scan_at_most(
        &self,
        start: &[u8],
        end: Option<Vec<u8>>,
        limit: usize,
    ) -> Result<Entries, StateError> {
        let cf = self.cf()?;
        let mut read = rocksdb::ReadOptions::default();
        // Within one key's section (the keyed state's scans), RocksDB's
        // prefix filters skip the files without it: a seek into every
        // level's file was most of a processor's key clearing. Any other
        // range may span prefixes and is read in total order.
        let one_section = crate::keyed::section_of(start).is_some_and(|section| {
            end.as_ref()
                .is_some_and(|end| prefix_end(section).is_some_and(|last| *end <= last))
        });
        if one_section {
            read.set_prefix_same_as_start(true);
        } else {
            read.set_total_order_seek(true);
        }
        if let Some(end) = end {
            read.set_iterate_upper_bound(end);
        }
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf_opt(&cf, read, IteratorMode::From(start, Direction::Forward))
            .take(limit)
        {
            let (k, v) = item.map_err(|e| backend(&self.name, e))?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }
}

fn section_prefix(key: &[u8]) -> &[u8] {
    crate::keyed::section_of(key).unwrap_or(key)
}

fn in_a_section(key: &[u8]) -> bool {
    crate::keyed::section_of(key).is_some()
}

/// The least key greater than every key starting with `prefix`; `None`
/// when there is none (the prefix is all `0xff`).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

impl StateStore for RocksDbStore {
    fn name(&self) -> &str {
        &self.name
    }
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db
            .get_cf(&self.cf()?, key)
            .map_err(|e| backend(&self.name, e))
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateError> {
        self.db
            .put_cf(&self.cf()?, key, value)
            .map_err(|e| backend(&self.name, e))
    }
    fn delete(&mut self, key: &[u8]) -> Result<(), StateError> {
        self.db
            .delete_cf(&self.cf()?, key)
            .map_err(|e| backend(&self.name, e))
    }
    fn range(&self, start: &[u8], end: &[u8]) -> Result<Entries, StateError> {
        self.scan(start, Some(end.to_vec()))
    }
    fn prefix(&self, prefix: &[u8]) -> Result<Entries, StateError> {
        self.scan(prefix, prefix_end(prefix))
    }
    fn first_in_range(&self, start: &[u8], end: &[u8]) -> Result<Option<Entry>, StateError> {
        Ok(self
            .scan_at_most(start, Some(end.to_vec()), 1)?
            .into_iter()
            .next())
    }
    fn approximate_len(&self) -> usize {
        let Ok(cf) = self.cf() else { return 0 };
        self.db
            .property_int_value_cf(&cf, "rocksdb.estimate-num-keys")
            .ok()
            .flatten()
            .unwrap_or(0) as usize
    }
    fn write_batch(&mut self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), StateError> {
        let batch = self.batch_of(entries.iter().map(|(k, v)| (k.as_slice(), v.as_deref())))?;
        self.db.write(batch).map_err(|e| backend(&self.name, e))
    }
    fn restore_batch(&mut self, entries: &mut RestoreEntries<'_>) -> Result<(), StateError> {
        let batch = self.batch_of(entries)?;
        let mut options = rocksdb::WriteOptions::default();
        options.disable_wal(true);
        self.db
            .write_opt(batch, &options)
            .map_err(|e| backend(&self.name, e))
    }
    fn flush(&mut self) -> Result<(), StateError> {
        self.db
            .flush_cf(&self.cf()?)
            .map_err(|e| backend(&self.name, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_scan_ends_where_the_prefix_does() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
        let dir = tempfile::tempdir().unwrap();
        let db = TaskDb::open(dir.path(), "app", "0", &MemoryBudget::new(8 << 20)).unwrap();
        let mut store = db.store("s").unwrap();
        for key in [
            &[1u8][..],
            &[1, 0xff],
            &[1, 0xff, 0],
            &[2],
            &[0xff],
            &[0xff, 0xff, 1],
        ] {
            store.put(key, b"").unwrap();
        }
        store.delete(&[2]).unwrap();
        let keys = |entries: Entries| entries.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
        assert_eq!(
            keys(store.prefix(&[1, 0xff]).unwrap()),
            vec![vec![1, 0xff], vec![1, 0xff, 0]]
        );
        assert_eq!(
            keys(store.prefix(&[0xff]).unwrap()),
            vec![vec![0xff], vec![0xff, 0xff, 1]]
        );
        assert_eq!(
            keys(store.range(&[1, 0xff, 0], &[0xff]).unwrap()),
            vec![vec![1, 0xff, 0]]
        );
        assert!(store.range(&[3], &[1]).unwrap().is_empty());
    }

    /// Keyed sections read with RocksDB's prefix filters return what a
    /// total-order read does, whether the entries sit in memory or in
    /// files, beside neighbouring sections and keys outside any section.
    #[test]
    fn a_keyed_section_scan_sees_exactly_its_key_across_files() {
        use crate::keyed::{cell_prefix, key_section, StateKind};
        let dir = tempfile::tempdir().unwrap();
        let db = TaskDb::open(dir.path(), "app", "0", &MemoryBudget::new(8 << 20)).unwrap();
        let mut store = db.store("s").unwrap();
        let keys: Vec<Vec<u8>> = (0..200u32)
            .map(|i| format!("card{i}").into_bytes())
            .chain([b"card1\xff".to_vec(), vec![], vec![0xff; 3]])
            .collect();
        for (round, key) in keys.iter().enumerate() {
            for state in ["a", "b"] {
                store
                    .put(&cell_prefix(key, state, StateKind::Value), b"v")
                    .unwrap();
            }
            store.put(&[b"t".as_slice(), key].concat(), b"").unwrap();
            if round % 50 == 49 {
                // Into an SST of its own: the next keys land in others.
                db.db.flush_cf(&store.cf().unwrap()).unwrap();
            }
        }
        store
            .delete(&cell_prefix(b"card7", "a", StateKind::Value))
            .unwrap();
        for key in &keys {
            let section = key_section(key);
            let found = store.prefix(&section).unwrap();
            let expected = if key.as_slice() == b"card7" { 1 } else { 2 };
            assert_eq!(found.len(), expected, "{key:?}: {found:?}");
            assert!(found.iter().all(|(k, _)| k.starts_with(&section)));
            let cells = store.prefix(&[section.clone(), b"s".to_vec()].concat());
            assert_eq!(cells.unwrap().len(), expected);
        }
        // Across sections (and outside them): total order.
        assert_eq!(store.prefix(b"k").unwrap().len(), keys.len() * 2 - 1);
        assert_eq!(store.prefix(b"t").unwrap().len(), keys.len());
        let first = key_section(&keys[0]);
        let last = key_section(&keys[1]);
        assert_eq!(store.range(&first, &last).unwrap().len(), 2);
    }
}
