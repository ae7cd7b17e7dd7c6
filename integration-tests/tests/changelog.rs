//! State stores backed by a compacted changelog topic on a real broker:
//! local RocksDB state deleted, then rebuilt from the changelog.

use tidemark_connectors::kafka::{
    changelog_topic, ensure_topic_with_config, read_changelog, KafkaChangelogWriter,
};
use tidemark_integration_tests::*;
use tidemark_state::*;

#[test]
fn rocksdb_state_is_rebuilt_from_its_changelog_after_the_local_copy_is_lost() {
    let app = unique("state-app");
    let store_name = "counts";
    ensure_topic_with_config(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &changelog_topic(&app, store_name),
        2,
        1,
        &[("cleanup.policy", "compact")],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let budget = MemoryBudget::new(32 << 20);
    let writer = KafkaChangelogWriter::new(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &app,
    )
    .unwrap();

    // Task 0_1 counts 1,000 updates over 50 keys, deletes 10 of them, and
    // checkpoints twice.
    let mut expected = std::collections::BTreeMap::new();
    {
        let db = TaskDb::open(dir.path(), &app, "0_1", &budget).unwrap();
        let logged = ChangeLoggingStore::new(db.store(store_name).unwrap(), writer.clone(), 1);
        let mut store = CachingStore::new(logged, 1 << 20);
        for i in 0..1000u32 {
            let key = format!("key-{:02}", i % 50).into_bytes();
            let count = store
                .get(&key)
                .unwrap()
                .map_or(0, |v| u32::from_be_bytes(v.try_into().unwrap()))
                + 1;
            store.put(&key, &count.to_be_bytes()).unwrap();
            expected.insert(key, count.to_be_bytes().to_vec());
            if i == 500 {
                store.flush().unwrap();
                writer.flush().unwrap();
            }
        }
        for k in 0..10 {
            let key = format!("key-{k:02}").into_bytes();
            store.delete(&key).unwrap();
            expected.remove(&key);
        }
        store.flush().unwrap();
        writer.flush().unwrap();
    }

    // The caching layer sent at most two values per key (one per checkpoint)
    // plus the tombstones, not 1,000 updates.
    let (records, end) = read_changelog(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &app,
        store_name,
        1,
        None,
    )
    .unwrap();
    assert!(records.len() <= 50 * 2 + 10, "{} records", records.len());
    assert_eq!(end as usize, records.len());
    assert_eq!(records.iter().filter(|r| r.value.is_none()).count(), 10);

    TaskDb::destroy(dir.path(), &app, "0_1").unwrap();
    let db = TaskDb::open(dir.path(), &app, "0_1", &budget).unwrap();
    let mut restored =
        ChangeLoggingStore::new(db.store(store_name).unwrap(), VecChangelog::default(), 1);
    assert_eq!(
        restored.prefix(b"").unwrap().len(),
        0,
        "local state is gone"
    );
    restored.restore(records).unwrap();
    let rebuilt: std::collections::BTreeMap<Vec<u8>, Vec<u8>> =
        restored.prefix(b"").unwrap().into_iter().collect();
    assert_eq!(rebuilt, expected);
    assert_eq!(rebuilt.len(), 40);
}

/// A restore that starts while a transaction holding changelog records is
/// still open (a predecessor's last batch, whose commit markers the
/// coordinator has not written yet) waits for its outcome: the committed
/// records are restored, the aborted ones are not. Before, the restore
/// stopped at the last stable offset and missed the committed batch, whose
/// input offsets the next owner was already given: its state was lost.
#[test]
fn a_restore_waits_for_open_transactions_and_keeps_only_what_they_commit() {
    use rdkafka::config::ClientConfig;
    use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
    use std::time::Duration;

    let app = unique("state-txn-app");
    let store_name = "counts";
    let topic = changelog_topic(&app, store_name);
    ensure_topic_with_config(
        &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        &topic,
        1,
        1,
        &[("cleanup.policy", "compact")],
    )
    .unwrap();
    let producer: ThreadedProducer<_> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("transactional.id", format!("{app}-writer"))
        .create()
        .unwrap();
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();
    let write = |from: u32, to: u32| {
        producer.begin_transaction().unwrap();
        for i in from..to {
            let key = format!("key-{i:03}");
            producer
                .send(BaseRecord::to(&topic).partition(0).key(&key).payload("v"))
                .unwrap();
        }
        producer.flush(timeout).unwrap();
    };

    // 100 records in a transaction that commits 3 s after the restore began.
    write(0, 100);
    let (records, end) = std::thread::scope(|s| {
        let restore = s.spawn(|| {
            read_changelog(
                &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
                &app,
                store_name,
                0,
                None,
            )
        });
        std::thread::sleep(Duration::from_secs(3));
        producer.commit_transaction(timeout).unwrap();
        restore.join().unwrap().unwrap()
    });
    assert_eq!(records.len(), 100, "the committed batch is restored whole");
    assert!(end >= 100);

    // 20 more in a transaction that aborts while a restore waits.
    write(100, 120);
    let (records, _) = std::thread::scope(|s| {
        let restore = s.spawn(|| {
            read_changelog(
                &tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
                &app,
                store_name,
                0,
                None,
            )
        });
        std::thread::sleep(Duration::from_secs(3));
        producer.abort_transaction(timeout).unwrap();
        restore.join().unwrap().unwrap()
    });
    assert_eq!(
        records.len(),
        100,
        "nothing of the aborted batch is restored"
    );
    assert!(records
        .iter()
        .all(|r| r.key.as_slice() < b"key-100".as_slice()));
}
