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

/// Two instances on one partition's changelog, as after a rebalance that
/// moved the partition while its first owner had not noticed yet: the
/// first owner's local checkpoint (written when it finally closes the
/// task) must claim only what it restored and wrote itself, not the
/// changelog's end, which by then holds the new owner's writes. Before,
/// it claimed the end, and its next start on that partition skipped the
/// new owner's records: their counts were lost.
#[test]
fn a_local_checkpoint_claims_only_what_its_own_process_restored_and_wrote() {
    use tidemark::runtime::StateBackend;
    use tidemark_connectors::state_backend::{ChangelogConfig, RocksDbStateBackend};

    let app = unique("state-handover-app");
    let cluster = tidemark_connectors::kafka::KafkaConnection::new(bootstrap());
    let backend = |dir: &std::path::Path| {
        let changelog = ChangelogConfig {
            cluster: cluster.clone(),
            partitions: 1,
            replication: 1,
        };
        RocksDbStateBackend::new(dir, &app, 32 << 20, 8 << 20, Some(changelog)).unwrap()
    };
    let count = |store: &dyn StateStore| {
        store
            .get(b"key")
            .unwrap()
            .map(|v| u32::from_be_bytes(v.try_into().unwrap()))
    };
    let commit = |backend: &mut RocksDbStateBackend, store: &mut dyn StateStore, n: u32| {
        store.put(b"key", &n.to_be_bytes()).unwrap();
        store.flush().unwrap();
        backend.commit().unwrap();
        backend.batch_committed().unwrap();
    };
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());

    // The first owner counts 1 and commits.
    let mut first = backend(first_dir.path());
    let mut store = first.open(0, "counts").unwrap();
    commit(&mut first, store.as_mut(), 1);
    // The partition moves: the second owner restores 1 and counts 2.
    let mut second = backend(second_dir.path());
    let mut taken_over = second.open(0, "counts").unwrap();
    assert_eq!(count(taken_over.as_ref()), Some(1));
    commit(&mut second, taken_over.as_mut(), 2);
    // The first owner learns of the move only now and closes its task.
    drop(store);
    first.close(0).unwrap();
    drop(first);

    // The partition comes back to the first owner's directory: it must
    // see the second owner's count.
    let mut again = backend(first_dir.path());
    let store = again.open(0, "counts").unwrap();
    assert_eq!(
        count(store.as_ref()),
        Some(2),
        "the new owner's write is kept"
    );
}

/// A task closed after its batch aborted (the rebalance that fenced the
/// commit also revoked the partition) leaves no checkpoint: its local
/// files hold the aborted writes, and its next start restores them from
/// the changelog alone.
#[test]
fn a_task_closed_after_an_aborted_batch_leaves_no_local_checkpoint() {
    use tidemark::runtime::StateBackend;
    use tidemark_connectors::state_backend::{ChangelogConfig, RocksDbStateBackend};

    let app = unique("state-abort-app");
    let dir = tempfile::tempdir().unwrap();
    let changelog = ChangelogConfig {
        cluster: tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
        partitions: 1,
        replication: 1,
    };
    let mut backend =
        RocksDbStateBackend::new(dir.path(), &app, 32 << 20, 8 << 20, Some(changelog)).unwrap();
    let mut store = backend.open(0, "counts").unwrap();
    store.put(b"key", b"committed").unwrap();
    store.flush().unwrap();
    backend.commit().unwrap();
    backend.batch_committed().unwrap();
    // Nothing written since the commit: a checkpoint would be true here...
    backend.between_batches().unwrap();
    let checkpoint = dir.path().join(&app).join("0").join(".checkpoint");
    assert!(checkpoint.exists(), "a committed task is checkpointed");
    // ...until a batch aborts.
    store.put(b"key", b"aborted").unwrap();
    store.flush().unwrap();
    drop(store);
    backend.batch_aborted().unwrap();
    // Other tasks' commits do not vouch for the abandoned one.
    backend.batch_committed().unwrap();
    backend.close(0).unwrap();
    assert!(
        !checkpoint.exists(),
        "no checkpoint vouches for the aborted write"
    );
}

/// A batch that aborts without writing to a task (static members keep
/// their partitions through an abort, so every task of the instance takes
/// this path) leaves no checkpoint file behind: the task's store reopens
/// empty and restores the whole changelog, and a process killed before
/// that restore reaches the disk must find no file at its next start.
/// Before, the file of the last commit stayed; the next start trusted the
/// empty local store and replayed only the changelog after the file's
/// offsets — every key last written before them lost, while the offsets of
/// the rows that built it stayed committed (#43: windows one record short).
#[test]
fn a_batch_aborted_without_writing_a_task_leaves_no_checkpoint_for_its_fresh_restore() {
    use tidemark::runtime::StateBackend;
    use tidemark_connectors::state_backend::{ChangelogConfig, RocksDbStateBackend};

    let app = unique("state-abort-idle-app");
    let dir = tempfile::tempdir().unwrap();
    let backend = || {
        let changelog = ChangelogConfig {
            cluster: tidemark_connectors::kafka::KafkaConnection::new(bootstrap()),
            partitions: 1,
            replication: 1,
        };
        RocksDbStateBackend::new(dir.path(), &app, 32 << 20, 8 << 20, Some(changelog)).unwrap()
    };
    let mut first = backend();
    let mut store = first.open(0, "counts").unwrap();
    store.put(b"early", b"1").unwrap();
    store.flush().unwrap();
    first.commit().unwrap();
    first.batch_committed().unwrap();
    first.between_batches().unwrap();
    let checkpoint = dir.path().join(&app).join("0").join(".checkpoint");
    assert!(checkpoint.exists(), "a committed task is checkpointed");
    // The next batch aborts without writing this task; the runtime drops
    // its stores and reopens them, which restores afresh.
    drop(store);
    first.batch_aborted().unwrap();
    let restore = first.open_deferred(0, "counts").unwrap();
    assert!(
        !checkpoint.exists(),
        "the checkpoint of the last commit outlived the abort"
    );
    // The process dies (SIGKILL) before the restore ran: nothing closes
    // the task (dropping the backend writes no checkpoint).
    drop(restore);
    drop(first);

    let mut again = backend();
    let store = again.open(0, "counts").unwrap();
    assert_eq!(
        store.get(b"early").unwrap().as_deref(),
        Some(&b"1"[..]),
        "a key written before the abort is restored"
    );
}

/// Changelog records carry their encoding version in a `v` header; one
/// without it (written before versions) restores as version 1, and a
/// record of a newer version stops the restore with an error naming its
/// topic, partition and offset instead of being read as this layout.
#[test]
fn changelog_records_carry_their_version_and_a_newer_one_is_refused_naming_it() {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    use tidemark_connectors::kafka::KafkaConnection;

    let app = unique("versions-app");
    let store_name = "op0";
    let topic = changelog_topic(&app, store_name);
    let cluster = KafkaConnection::new(bootstrap());
    ensure_topic_with_config(&cluster, &topic, 1, 1, &[("cleanup.policy", "compact")]).unwrap();
    // As the release before versions wrote it: no header.
    produce_to(&topic, Some(0), &[("before".into(), b"1".to_vec())]);
    let writer = KafkaChangelogWriter::new(&cluster, &app).unwrap();
    let mut writer_handle = writer.clone();
    ChangelogWriter::append(
        &mut writer_handle,
        ChangelogRecord {
            store: store_name.into(),
            partition: 0,
            key: b"now".to_vec(),
            value: Some(b"2".to_vec()),
        },
    )
    .unwrap();
    writer.flush().unwrap();
    let written = consume_all(&topic, 2, std::time::Duration::from_secs(30));
    assert_eq!(written.len(), 2);
    assert!(written[0].headers.is_empty(), "{:?}", written[0].headers);
    assert_eq!(
        written[1].headers.get("v").map(String::as_bytes),
        Some(&[1u8][..])
    );
    let (records, end) = read_changelog(&cluster, &app, store_name, 0, None).unwrap();
    let keys: Vec<&[u8]> = records.iter().map(|r| r.key.as_slice()).collect();
    assert_eq!((keys, end), (vec![&b"before"[..], b"now"], 2));

    // A newer release's record.
    let producer: ThreadedProducer<DefaultProducerContext> = plain().create().unwrap();
    producer
        .send(
            BaseRecord::to(&topic)
                .partition(0)
                .key(b"later".as_slice())
                .payload(b"3".as_slice())
                .headers(OwnedHeaders::new().insert(Header {
                    key: "v",
                    value: Some(&[2u8]),
                })),
        )
        .map_err(|(e, _)| e)
        .unwrap();
    producer.flush(std::time::Duration::from_secs(30)).unwrap();
    let e = read_changelog(&cluster, &app, store_name, 0, None).unwrap_err();
    assert!(
        matches!(&e, tidemark::error::Error::UnknownEncoding { found, supported: 1, .. } if found == "2"),
        "{e}"
    );
    let text = e.to_string();
    assert!(text.contains(&format!("`{topic}`/0 at offset 2")), "{text}");
}
