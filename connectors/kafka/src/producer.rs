//! The producer every writer of this crate shares: an idempotent
//! `ThreadedProducer` with a tracker of delivery failures, a flush that
//! watches the in-flight count, and a send that waits out a full queue.

use crate::connection::KafkaConnection;
use rdkafka::producer::{BaseRecord, DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tidemark::error::Result;

/// Collects delivery failures reported by the producer's thread.
#[derive(Clone, Default)]
pub(crate) struct DeliveryTracker {
    failures: Arc<Mutex<Vec<String>>>,
}

impl DeliveryTracker {
    pub(crate) fn take_failures(&self) -> Vec<String> {
        std::mem::take(&mut *self.failures.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl ClientContext for DeliveryTracker {}

impl ProducerContext for DeliveryTracker {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.failures
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(e.to_string());
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
