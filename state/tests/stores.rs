//! The store layers against each other and against a model.

use proptest::prelude::*;
use std::collections::BTreeMap;
use tidemark_state::*;

#[derive(Debug, Clone)]
enum Op {
    Put(u8, u8),
    Delete(u8),
    Flush,
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            (0u8..20, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
            (0u8..20).prop_map(Op::Delete),
            Just(Op::Flush),
        ],
        0..200,
    )
}

fn key(k: u8) -> Vec<u8> {
    vec![b'k', k / 10, k % 10]
}

/// Applies `ops` to `store` and to a BTreeMap model, checking reads and
/// scans along the way.
fn check(store: &mut dyn StateStore, ops: &[Op]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut model = BTreeMap::new();
    for op in ops {
        match op {
            Op::Put(k, v) => {
                store.put(&key(*k), &[*v]).unwrap();
                model.insert(key(*k), vec![*v]);
            }
            Op::Delete(k) => {
                store.delete(&key(*k)).unwrap();
                model.remove(&key(*k));
            }
            Op::Flush => store.flush().unwrap(),
        }
        let all: Vec<(Vec<u8>, Vec<u8>)> = model.clone().into_iter().collect();
        assert_eq!(store.prefix(b"k").unwrap(), all);
        let mid: Vec<(Vec<u8>, Vec<u8>)> = model
            .range(key(5)..key(15))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(store.range(&key(5), &key(15)).unwrap(), mid);
    }
    model
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn cached_and_change_logged_rocksdb_behaves_like_a_map(ops in ops(), cache_bytes in 0usize..64) {
        let dir = tempfile::tempdir().unwrap();
        let db = TaskDb::open(dir.path(), "app", "0_0", &MemoryBudget::new(16 << 20)).unwrap();
        let logged = ChangeLoggingStore::new(db.store("s").unwrap(), VecChangelog::default(), 0);
        let mut store = CachingStore::new(logged, cache_bytes);
        let model = check(&mut store, &ops);
        store.flush().unwrap();

        // Replaying the changelog into an empty store rebuilds the same state.
        let log = store.inner().writer().records.clone();
        let other = tempfile::tempdir().unwrap();
        let fresh = TaskDb::open(other.path(), "app", "0_0", &MemoryBudget::new(16 << 20)).unwrap();
        let mut restored = ChangeLoggingStore::new(fresh.store("s").unwrap(), VecChangelog::default(), 0);
        restored.restore(log).unwrap();
        let expected: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
        prop_assert_eq!(restored.prefix(b"k").unwrap(), expected);
        prop_assert!(restored.writer().records.is_empty(), "a restore is not logged again");
    }
}

#[test]
fn the_cache_sends_only_the_latest_value_per_key_to_the_changelog() {
    let logged = ChangeLoggingStore::new(InMemoryStore::new("counts"), VecChangelog::default(), 7);
    let mut store = CachingStore::new(logged, 1 << 20);
    for n in 0..1000u32 {
        store.put(b"hot", &n.to_be_bytes()).unwrap();
        store.put(b"cold", b"x").unwrap();
    }
    store.delete(b"cold").unwrap();
    store.flush().unwrap();
    let log = &store.inner().writer().records;
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log.iter().all(|r| r.partition == 7 && r.store == "counts"));
    let hot = log.iter().find(|r| r.key == b"hot").unwrap();
    assert_eq!(hot.value.as_deref(), Some(&999u32.to_be_bytes()[..]));
    assert_eq!(log.iter().find(|r| r.key == b"cold").unwrap().value, None);
}

#[test]
fn a_small_cache_flushes_early() {
    let mut store = CachingStore::new(InMemoryStore::new("s"), 100);
    for n in 0..100u8 {
        store.put(&[n], &[0; 10]).unwrap();
    }
    assert!(store.early_flushes() > 0);
    assert!(store.inner().approximate_len() > 0);
}

#[test]
fn rocksdb_state_survives_a_reopen_and_column_families_are_separate() {
    let dir = tempfile::tempdir().unwrap();
    let budget = MemoryBudget::new(32 << 20);
    {
        let db = TaskDb::open(dir.path(), "app", "0_1", &budget).unwrap();
        let (mut a, mut b) = (db.store("a").unwrap(), db.store("b").unwrap());
        a.write_batch(&[
            (b"x".to_vec(), Some(b"1".to_vec())),
            (b"y".to_vec(), Some(b"2".to_vec())),
        ])
        .unwrap();
        b.put(b"x", b"other").unwrap();
        a.flush().unwrap();
    }
    let db = TaskDb::open(dir.path(), "app", "0_1", &budget).unwrap();
    let (a, b) = (db.store("a").unwrap(), db.store("b").unwrap());
    assert_eq!(a.get(b"x").unwrap(), Some(b"1".to_vec()));
    assert_eq!(a.prefix(b"").unwrap().len(), 2);
    assert_eq!(b.get(b"x").unwrap(), Some(b"other".to_vec()));
    drop((a, b, db));
    TaskDb::destroy(dir.path(), "app", "0_1").unwrap();
    let db = TaskDb::open(dir.path(), "app", "0_1", &budget).unwrap();
    assert_eq!(
        db.store("a").unwrap().get(b"x").unwrap(),
        None,
        "a destroyed task starts empty"
    );
}
