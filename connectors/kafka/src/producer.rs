//! The producer every writer of this crate shares: an idempotent
//! `ThreadedProducer` with a tracker of delivery failures, a flush that
//! watches the in-flight count, and a send that waits out a full queue.

use crate::connection::KafkaConnection;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::error::{Error, Result};

/// A record the broker (or librdkafka) did not take.
#[derive(Debug, Clone)]
pub(crate) struct DeliveryFailure {
    topic: String,
    partition: i32,
    code: Option<RDKafkaErrorCode>,
    reason: String,
}

impl std::fmt::Display for DeliveryFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` partition {}: {}",
            self.topic, self.partition, self.reason
        )
    }
}

impl std::error::Error for DeliveryFailure {}

impl DeliveryFailure {
    /// A record of `topic`/`partition` refused with `error`.
    pub(crate) fn new(topic: &str, partition: i32, error: &KafkaError) -> Self {
        DeliveryFailure {
            topic: topic.to_string(),
            partition,
            code: error.rdkafka_error_code(),
            reason: error.to_string(),
        }
    }

    /// Whether no retry can deliver it: the record or the topic is refused
    /// for good, not for a while (a broker away, a leader moving, a
    /// timeout are for retrying).
    pub(crate) fn is_permanent(&self) -> bool {
        self.code.is_some_and(is_permanent_delivery_error)
    }

    /// The batch's error for this failure: [`Error::Undeliverable`].
    pub(crate) fn undeliverable(&self) -> Error {
        Error::Undeliverable {
            topic: self.topic.clone(),
            partition: self.partition,
            reason: self.reason.clone(),
        }
    }
}

/// Whether a delivery refused with `code` would be refused again: a record
/// over the topic's or the client's size limit, a write the cluster's ACLs
/// or policies refuse, a record the topic cannot take (an unkeyed one into
/// a compacted topic is `INVALID_RECORD`).
pub(crate) fn is_permanent_delivery_error(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as Code;
    matches!(
        code,
        Code::MessageSizeTooLarge
            | Code::MessageBatchTooLarge
            | Code::InvalidMessageSize
            | Code::InvalidRecord
            | Code::InvalidRequiredAcks
            | Code::UnsupportedForMessageFormat
            | Code::PolicyViolation
            | Code::TopicAuthorizationFailed
            | Code::ClusterAuthorizationFailed
            | Code::TransactionalIdAuthorizationFailed
    )
}

/// The error of the first failure of `failures` that no retry can mend.
pub(crate) fn permanent_failure(failures: &[DeliveryFailure]) -> Option<Error> {
    failures
        .iter()
        .find(|f| f.is_permanent())
        .map(DeliveryFailure::undeliverable)
}

/// Collects delivery failures reported by the producer's thread, and how
/// far the acknowledged records of the topics asked for reach.
#[derive(Clone, Default)]
pub(crate) struct DeliveryTracker {
    failures: Arc<Mutex<Vec<DeliveryFailure>>>,
    written_ends: Arc<WrittenEnds>,
}

/// Per topic asked for, per partition: the offset after the last record
/// the broker acknowledged.
#[derive(Default)]
struct WrittenEnds {
    /// Set once a topic is asked for: until then a delivery takes no lock.
    any: AtomicBool,
    ends: Mutex<HashMap<String, HashMap<i32, i64>>>,
}

impl DeliveryTracker {
    pub(crate) fn take_failures(&self) -> Vec<DeliveryFailure> {
        std::mem::take(&mut *self.failures.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Notes from now on how far this producer's acknowledged records of
    /// `topic` reach (see [`DeliveryTracker::written_end`]).
    pub(crate) fn track_written_end(&self, topic: &str) {
        let mut ends = self.written_ends.lock();
        if !ends.contains_key(topic) {
            ends.insert(topic.to_string(), HashMap::new());
        }
        self.written_ends.any.store(true, Ordering::Release);
    }

    /// The offset after the last record of `topic`/`partition` this
    /// producer got acknowledged since the topic was tracked; `None` when
    /// none was.
    pub(crate) fn written_end(&self, topic: &str, partition: i32) -> Option<i64> {
        self.written_ends
            .lock()
            .get(topic)
            .and_then(|partitions| partitions.get(&partition).copied())
    }
}

impl WrittenEnds {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<i32, i64>>> {
        self.ends.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Err((e, m)) => self
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(DeliveryFailure::new(m.topic(), m.partition(), e)),
            Ok(m) if self.written_ends.any.load(Ordering::Acquire) => {
                if let Some(partitions) = self.written_ends.lock().get_mut(m.topic()) {
                    let end = partitions.entry(m.partition()).or_insert(0);
                    *end = (*end).max(m.offset() + 1);
                }
            }
            Ok(_) => {}
        }
    }
}

/// An idempotent producer with its delivery tracker.
pub(crate) fn producer(
    cluster: &KafkaConnection,
    what: &str,
) -> Result<(ThreadedProducer<DeliveryTracker>, DeliveryTracker)> {
    let tracker = DeliveryTracker::default();
    let config = cluster.client_config(&[
        ("enable.idempotence", "true"),
        ("acks", "all"),
        ("linger.ms", "5"),
    ]);
    let producer = cluster.create(&config, tracker.clone(), what)?;
    Ok((producer, tracker))
}

/// Waits until every record sent so far is acknowledged. librdkafka's
/// flush, with rust-rdkafka's threaded producer serving delivery reports,
/// slept out a 100 ms poll interval at most checkpoints (measured in the
/// real-time latency bench: every record arriving meanwhile waited);
/// watching the in-flight count reacts within a fraction of a millisecond.
pub(crate) fn flush_producer(
    producer: &ThreadedProducer<DeliveryTracker>,
    timeout: Duration,
) -> std::result::Result<(), String> {
    use rdkafka::producer::Producer;
    let deadline = std::time::Instant::now() + timeout;
    if producer.in_flight_count() > 0 {
        // Sends what lingers at once; it cannot finish in no time.
        let _ = producer.flush(Duration::ZERO);
    }
    while producer.in_flight_count() > 0 {
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "{} record(s) not acknowledged after {timeout:?}",
                producer.in_flight_count()
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(())
}

/// Sends one record, waiting for deliveries while the local queue is full;
/// any other error is returned.
pub fn send_with_backpressure<C, K, P>(
    producer: &ThreadedProducer<C>,
    record: BaseRecord<'_, K, P>,
) -> std::result::Result<(), rdkafka::error::KafkaError>
where
    C: ProducerContext<DeliveryOpaque = ()> + 'static,
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    let mut pending = record;
    loop {
        match producer.send(pending) {
            Ok(()) => return Ok(()),
            Err((e, back))
                if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) =>
            {
                std::thread::sleep(Duration::from_millis(5));
                pending = back;
            }
            Err((e, _)) => return Err(e),
        }
    }
}
