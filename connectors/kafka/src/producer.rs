//! The producer every writer of this crate shares: an idempotent
//! `ThreadedProducer` with a tracker of delivery failures, a flush that
//! watches the in-flight count, and a send that waits out a full queue.

use crate::connection::KafkaConnection;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::error::Result;

/// Collects delivery failures reported by the producer's thread, and how
/// far the acknowledged records of the topics asked for reach.
#[derive(Clone, Default)]
pub(crate) struct DeliveryTracker {
    failures: Arc<Mutex<Vec<String>>>,
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
    pub(crate) fn take_failures(&self) -> Vec<String> {
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
            Err((e, _)) => self
                .failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.to_string()),
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
