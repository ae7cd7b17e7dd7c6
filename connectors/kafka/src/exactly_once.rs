//! Exactly-once: one transactional producer per instance carries a batch's
//! output records, its state changelog records and its consumer offsets in
//! one Kafka transaction (KIP-447: offsets sent with the consumer group's
//! metadata, so a zombie instance is fenced by the group generation).
//!
//! The sink and the changelog writer send through it during the batch; the
//! source commits the transaction with its offsets when the runtime commits
//! the batch. A failure aborts the transaction: nothing of the batch is
//! visible to `read_committed` readers and the batch is replayed from the
//! last committed offsets.

use crate::connection::KafkaConnection;
use crate::instance::InstanceIdentity;
use crate::producer::{send_with_backpressure, DeliveryTracker};
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::TopicPartitionList;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tidemark::error::{Error, Result};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The transaction state shared by the source, the sink and the changelog
/// writer of one query.
pub struct Transactions {
    producer: ThreadedProducer<DeliveryTracker>,
    tracker: DeliveryTracker,
    open: bool,
    /// The instance whose transactional id this is, held so that its
    /// state-directory slot stays taken while the producer lives.
    _identity: Option<Arc<InstanceIdentity>>,
}

/// A cheap handle on [`Transactions`].
#[derive(Clone)]
pub struct SharedTransactions(Arc<Mutex<Transactions>>);

impl SharedTransactions {
    /// A transactional producer with `transactional_id` (stable per
    /// instance, so that a restarted instance fences its predecessor at
    /// once and aborts what it left open). Every record a query writes
    /// to `cluster` goes through it: its sink's, changelog's, dead letters'
    /// and repartition topics', so `cluster` carries the sink producer's
    /// properties (compression, batching) over the query's.
    pub fn new(cluster: &KafkaConnection, transactional_id: &str) -> Result<Self> {
        Self::create(cluster, transactional_id, None)
    }

    /// A transactional producer for `stage` (a query's name) as instance
    /// `identity`: its transactional id is `<stage>-<instance id>`, so no
    /// two live instances share one.
    pub fn for_instance(
        cluster: &KafkaConnection,
        stage: &str,
        identity: Arc<InstanceIdentity>,
    ) -> Result<Self> {
        let transactional_id = identity.transactional_id(stage);
        for orphan in identity.orphaned_slots() {
            fence(cluster, &format!("{stage}-{}", orphan.id));
        }
        Self::create(cluster, &transactional_id, Some(identity))
    }

    fn create(
        cluster: &KafkaConnection,
        transactional_id: &str,
        identity: Option<Arc<InstanceIdentity>>,
    ) -> Result<Self> {
        let tracker = DeliveryTracker::default();
        let mut config =
            cluster.client_config(&[("linger.ms", "5"), ("transaction.timeout.ms", "60000")]);
        config
            .set("transactional.id", transactional_id)
            .set("enable.idempotence", "true")
            .set("acks", "all");
        let producer: ThreadedProducer<DeliveryTracker> =
            cluster.create(&config, tracker.clone(), "transactional producer")?;
        producer.init_transactions(TIMEOUT).map_err(|e| {
            Error::Sink(format!(
                "initialising transactions for `{transactional_id}`: {e}"
            ))
        })?;
        Ok(SharedTransactions(Arc::new(Mutex::new(Transactions {
            producer,
            tracker,
            open: false,
            _identity: identity,
        }))))
    }

    fn lock(&self) -> MutexGuard<'_, Transactions> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a record inside the current transaction, opening it if needed.
    pub fn send<K, P>(&self, record: BaseRecord<'_, K, P>) -> Result<()>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let mut t = self.lock();
        t.begin()?;
        send_with_backpressure(&t.producer, record)
            .map_err(|e| Error::Sink(format!("transactional send: {e}")))
    }

    /// Opens the batch's transaction if it is not open yet.
    pub fn begin(&self) -> Result<()> {
        self.lock().begin()
    }

    /// Commits the transaction with the consumer's `offsets`; on failure
    /// aborts it and returns the error (the batch will be replayed).
    pub fn commit(
        &self,
        offsets: &TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<()> {
        let mut t = self.lock();
        t.begin()?;
        let offsets_sent = if offsets.count() > 0 {
            t.producer
                .send_offsets_to_transaction(offsets, group, TIMEOUT)
        } else {
            Ok(())
        };
        if offsets_sent.is_ok()
            && tidemark::runtime::fault_injection::fire_armed("after_offsets_added")
        {
            t.abort()?;
            return Err(Error::BatchAborted(
                "injected failure after the offsets were added to the transaction".into(),
            ));
        }
        let result = offsets_sent.and_then(|_| t.producer.commit_transaction(TIMEOUT));
        let failures = t.tracker.take_failures();
        match (result, failures.first()) {
            (Ok(()), None) => {
                t.open = false;
                Ok(())
            }
            (result, failure) => {
                // A fatal error (fenced by a newer instance) needs a new
                // producer; anything else aborts and replays in place.
                let fatal = matches!(
                    &result,
                    Err(rdkafka::error::KafkaError::Transaction(e)) if e.is_fatal()
                );
                let reason = match (result, failure) {
                    (Err(e), _) => e.to_string(),
                    (_, Some(f)) => f.clone(),
                    _ => unreachable!("one of the two failed"),
                };
                let aborted = t.producer.abort_transaction(TIMEOUT);
                t.open = false;
                if fatal || aborted.is_err() {
                    return Err(Error::Sink(format!(
                        "transaction failed, the producer must be recreated: {reason}"
                    )));
                }
                Err(Error::BatchAborted(reason))
            }
        }
    }

    /// Aborts the open transaction, if any: nothing sent in it becomes
    /// visible to `read_committed` readers.
    pub fn abort(&self) -> Result<()> {
        self.lock().abort()
    }
}

/// Fences the transactional id of a dead instance: initialising a producer
/// with it aborts what it left open. Best effort: on failure the broker
/// aborts it at the transaction timeout anyway.
fn fence(cluster: &KafkaConnection, transactional_id: &str) {
    let mut config = cluster.client_config(&[]);
    config.set("transactional.id", transactional_id);
    let fenced = cluster
        .create_plain::<rdkafka::producer::BaseProducer>(&config, "fencing producer")
        .map_err(|e| e.to_string())
        .and_then(|p| {
            p.init_transactions(Duration::from_secs(10))
                .map_err(|e| e.to_string())
        });
    match fenced {
        Ok(()) => tracing::info!(
            transactional_id,
            "a dead instance's transactional id fenced"
        ),
        Err(error) => {
            tracing::warn!(transactional_id, %error, "could not fence a dead instance's transactional id")
        }
    }
}

impl Transactions {
    /// Aborts the open transaction; a producer that cannot abort must be
    /// recreated (the error says so).
    fn abort(&mut self) -> Result<()> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        // Records still in flight when the abort is sent made the broker
        // refuse it (INVALID_TXN_STATE) under load: let them land first.
        let _ = self.producer.flush(TIMEOUT);
        self.tracker.take_failures();
        self.producer.abort_transaction(TIMEOUT).map_err(|e| {
            Error::Sink(format!(
                "aborting the transaction failed, the producer must be recreated: {e}"
            ))
        })
    }

    fn begin(&mut self) -> Result<()> {
        if !self.open {
            self.producer
                .begin_transaction()
                .map_err(|e| Error::Sink(format!("beginning a transaction: {e}")))?;
            self.open = true;
        }
        Ok(())
    }
}
