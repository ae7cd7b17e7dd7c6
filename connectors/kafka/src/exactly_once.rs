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
use crate::producer::{send_with_backpressure, DeliveryFailure, DeliveryTracker};
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::message::ToBytes;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};
use rdkafka::TopicPartitionList;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tidemark::error::{Error, Result};
use tidemark::runtime::retry::Backoff;

const TIMEOUT: Duration = Duration::from_secs(60);

/// How long past [`TIMEOUT`] a call that commits a transaction may block
/// before the producer is given up: after a broker restart librdkafka's
/// `send_offsets_to_transaction` has been seen to block for good, its own
/// timeout ignored (confluentinc/librdkafka#5456).
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// The transaction state shared by the source, the sink and the changelog
/// writer of one query.
pub struct Transactions {
    /// Shared with the thread a commit's calls run on (see [`within`]).
    producer: Arc<ThreadedProducer<DeliveryTracker>>,
    tracker: DeliveryTracker,
    open: bool,
    /// A commit call did not return: the producer is left to its thread
    /// and this one refuses every call (the query is rebuilt with a new
    /// producer, which fences the transaction left open).
    stuck: bool,
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
            Error::sink_failed(
                format!("initialising transactions for `{transactional_id}`"),
                e,
            )
        })?;
        Ok(SharedTransactions(Arc::new(Mutex::new(Transactions {
            producer: Arc::new(producer),
            tracker,
            open: false,
            stuck: false,
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
        let (topic, partition) = (record.topic, record.partition.unwrap_or(-1));
        send_with_backpressure(&t.producer, record).map_err(|e| {
            let failure = DeliveryFailure::new(topic, partition, &e);
            match failure.is_permanent() {
                true => failure.undeliverable(),
                false => Error::sink_failed("transactional send", e),
            }
        })
    }

    /// The tracker of this producer's deliveries.
    pub(crate) fn delivery_tracker(&self) -> DeliveryTracker {
        self.lock().tracker.clone()
    }

    /// Whether a transaction is open: the batch sent something in it.
    pub(crate) fn is_open(&self) -> bool {
        self.lock().open
    }

    /// Opens the batch's transaction if it is not open yet.
    pub fn begin(&self) -> Result<()> {
        self.lock().begin()
    }

    /// Commits the transaction with the consumer's `offsets`; on failure
    /// aborts it and returns the error (the batch will be replayed). A
    /// call that does not return in time gives the producer up: the error
    /// says it must be recreated.
    pub fn commit(&self, offsets: &TopicPartitionList, group: ConsumerGroupMetadata) -> Result<()> {
        let mut t = self.lock();
        t.begin()?;
        let offsets_sent = if offsets.count() > 0 {
            let (producer, offsets) = (t.producer.clone(), offsets.clone());
            let group = Arc::new(group);
            t.call_retrying(
                "sending the batch's offsets to its transaction",
                move || producer.send_offsets_to_transaction(&offsets, &group, TIMEOUT),
            )?
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
        let result = match offsets_sent {
            Ok(()) => {
                let producer = t.producer.clone();
                t.call_retrying("committing the transaction", move || {
                    producer.commit_transaction(TIMEOUT)
                })?
            }
            Err(e) => Err(e),
        };
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
                    (_, Some(f)) => f.to_string(),
                    _ => unreachable!("one of the two failed"),
                };
                let aborted = t.producer.abort_transaction(TIMEOUT);
                t.open = false;
                // A record the broker refuses for good fails every replay
                // the same way: the run ends, naming it.
                if let Some(permanent) = crate::producer::permanent_failure(&failures) {
                    return Err(permanent);
                }
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
        // A stuck producer cannot abort; the next one's initialisation
        // fences and aborts what it left open.
        if !self.open || self.stuck {
            return Ok(());
        }
        self.open = false;
        // Records still in flight when the abort is sent made the broker
        // refuse it (INVALID_TXN_STATE) under load: let them land first.
        let _ = self.producer.flush(TIMEOUT);
        self.tracker.take_failures();
        self.producer.abort_transaction(TIMEOUT).map_err(|e| {
            Error::sink_failed(
                "aborting the transaction failed, the producer must be recreated",
                e,
            )
        })
    }

    /// Calls the transactional `call` (on a thread of its own, see
    /// [`within`]) and again, after a wait, while librdkafka calls its
    /// error retriable and [`TIMEOUT`] has not passed: a broker restarting
    /// or a coordinator moving answers so, and librdkafka's contract is to
    /// repeat the call — an abort then fails (the commit may be under way)
    /// and costs the whole query's rebuild. The outer error: the call did
    /// not return in time and the producer is given up.
    fn call_retrying(
        &mut self,
        what: &str,
        call: impl Fn() -> rdkafka::error::KafkaResult<()> + Send + Sync + 'static,
    ) -> Result<rdkafka::error::KafkaResult<()>> {
        let call = Arc::new(call);
        let started = std::time::Instant::now();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        loop {
            let attempt = call.clone();
            let result = within(TIMEOUT + GIVE_UP_AFTER, move || attempt())
                .ok_or_else(|| self.give_up(what))?;
            match &result {
                Err(rdkafka::error::KafkaError::Transaction(e))
                    if e.is_retriable() && started.elapsed() < TIMEOUT =>
                {
                    tracing::warn!(what, error = %e, "a transactional call failed; calling it again");
                    backoff.wait_after_failure(None);
                }
                _ => return Ok(result),
            }
        }
    }

    /// Gives the producer up after `what` did not return in time; the
    /// error says it must be recreated.
    fn give_up(&mut self, what: &str) -> Error {
        self.stuck = true;
        self.open = false;
        tracing::error!(
            what,
            "a transactional call did not return within {} s; giving the producer up",
            (TIMEOUT + GIVE_UP_AFTER).as_secs()
        );
        Error::Sink(format!(
            "{what} did not return within {} s (a librdkafka hang, confluentinc/librdkafka#5456): the producer must be recreated",
            (TIMEOUT + GIVE_UP_AFTER).as_secs()
        ))
    }

    fn begin(&mut self) -> Result<()> {
        if self.stuck {
            return Err(Error::Sink(
                "the transactional producer was given up after a call did not return; it must be recreated".into(),
            ));
        }
        if !self.open {
            self.producer
                .begin_transaction()
                .map_err(|e| Error::sink_failed("beginning a transaction", e))?;
            self.open = true;
        }
        Ok(())
    }
}

/// Runs `call` on a thread of its own and waits at most `deadline` for it:
/// `None` when it has not returned by then (or the thread could not be
/// started). A call that never returns keeps its thread, and what it
/// holds, for good; the caller must not wait on anything it holds.
fn within<T: Send + 'static>(
    deadline: Duration,
    call: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (sender, receiver) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("tidemark-transaction-call".into())
        .spawn(move || {
            let _ = sender.send(call());
        })
        .ok()?;
    receiver.recv_timeout(deadline).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_returns_in_time_gives_its_result() {
        assert_eq!(within(Duration::from_secs(5), || 7), Some(7));
    }

    #[test]
    fn a_call_that_does_not_return_in_time_is_given_up() {
        let started = std::time::Instant::now();
        let answer = within(Duration::from_millis(100), || {
            std::thread::sleep(Duration::from_secs(3));
            7
        });
        assert_eq!(answer, None);
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "it did not wait the call out"
        );
    }
}
