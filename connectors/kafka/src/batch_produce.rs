//! Enqueuing a sink's records in one call per batch: librdkafka's
//! `rd_kafka_produce_batch`, which rust-rdkafka does not wrap.
//!
//! `rd_kafka_producev`, behind rust-rdkafka's `send`, looks the topic up by
//! name, reads the monotonic clock and the wall clock, and takes the topic's
//! lock for every record: in a profile of the stateless Kafka → filter →
//! Kafka pipeline that was a third of what enqueuing a record cost. The
//! batch call does each once per call. Records are partitioned by the same
//! partitioner (the producer's `partitioner`, by key), get the same
//! timestamp (the time of the call, as `producev` gives the time of its
//! call), and their payloads and keys are copied; they carry no headers.

use rdkafka::bindings as rd;
use rdkafka::producer::{Producer, ThreadedProducer};
use std::ffi::CString;
use std::ptr::{self, NonNull};
use std::time::Duration;
use tidemark::error::{Error, Result};

use crate::producer::DeliveryTracker;

/// librdkafka's "any partition": the partitioner picks it by key.
const PARTITION_UNASSIGNED: i32 = -1;

/// A handle on one topic of one producer, to enqueue records to it in
/// batches.
///
/// It must be dropped before its producer: a struct holding both declares
/// it first (fields drop in declaration order).
pub(crate) struct BatchTopic {
    handle: NonNull<rd::rd_kafka_topic_t>,
    name: String,
}

// SAFETY: librdkafka topic handles are reference counted and may be used
// from any thread; this one is only used through `&mut self` or moved.
unsafe impl Send for BatchTopic {}

impl BatchTopic {
    /// A handle on `topic` for `producer`.
    pub(crate) fn new(producer: &ThreadedProducer<DeliveryTracker>, topic: &str) -> Result<Self> {
        let name = CString::new(topic)
            .map_err(|_| Error::Sink(format!("topic name `{topic}` holds a NUL byte")))?;
        // SAFETY: the client pointer is valid while `producer` lives, which
        // outlives this handle (see the type's documentation); a null topic
        // configuration takes the producer's defaults.
        let handle = unsafe {
            rd::rd_kafka_topic_new(
                producer.client().native_ptr(),
                name.as_ptr(),
                ptr::null_mut(),
            )
        };
        let handle = NonNull::new(handle).ok_or_else(|| {
            Error::Sink(format!("librdkafka refused a handle on topic `{topic}`"))
        })?;
        Ok(BatchTopic {
            handle,
            name: topic.to_string(),
        })
    }

    /// Enqueues `records` (key, payload) in order, waiting for deliveries
    /// while the producer's queue is full, as `send_with_backpressure` does.
    pub(crate) fn produce(&mut self, records: &[(Option<&[u8]>, &[u8])]) -> Result<()> {
        let mut messages: Vec<rd::rd_kafka_message_t> = records
            .iter()
            .map(|(key, payload)| rd::rd_kafka_message_t {
                err: rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR,
                rkt: ptr::null_mut(),
                partition: PARTITION_UNASSIGNED,
                payload: payload.as_ptr() as *mut _,
                len: payload.len(),
                key: key.map_or(ptr::null_mut(), |k| k.as_ptr() as *mut _),
                key_len: key.map_or(0, <[u8]>::len),
                offset: 0,
                _private: ptr::null_mut(),
            })
            .collect();
        let mut from = 0;
        while from < messages.len() {
            let pending = &mut messages[from..];
            let count = i32::try_from(pending.len()).unwrap_or(i32::MAX);
            // SAFETY: the handle is valid (see `new`); `pending` holds
            // `count` initialised messages whose payloads and keys borrow
            // `records`, which outlive the call; F_COPY makes librdkafka
            // copy them before it returns.
            let enqueued = unsafe {
                rd::rd_kafka_produce_batch(
                    self.handle.as_ptr(),
                    PARTITION_UNASSIGNED,
                    rd::RD_KAFKA_MSG_F_COPY,
                    pending.as_mut_ptr(),
                    count,
                )
            };
            let Some(failed) = pending
                .iter()
                .position(|m| m.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
            else {
                break;
            };
            match pending[failed].err {
                // After a full queue every later message fails too: what
                // was enqueued is the prefix before it, and order holds.
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__QUEUE_FULL => {
                    debug_assert_eq!(usize::try_from(enqueued).ok(), Some(failed));
                    from += failed;
                    for message in &mut messages[from..] {
                        message.err = rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                // Any other error (a record over the size limit) fails the
                // batch, though librdkafka enqueued the records after it:
                // its replay writes them again, as at-least-once allows.
                err => {
                    let code = rdkafka::error::RDKafkaErrorCode::from(err);
                    if crate::producer::is_permanent_delivery_error(code) {
                        return Err(Error::Undeliverable {
                            topic: self.name.clone(),
                            partition: pending[failed].partition,
                            reason: code.to_string(),
                        });
                    }
                    return Err(Error::sink_failed(
                        format!("producing to `{}`", self.name),
                        code,
                    ));
                }
            }
        }
        Ok(())
    }
}

impl Drop for BatchTopic {
    fn drop(&mut self) {
        // SAFETY: created by `rd_kafka_topic_new` and destroyed once, while
        // the producer still lives (see the type's documentation).
        unsafe { rd::rd_kafka_topic_destroy(self.handle.as_ptr()) }
    }
}

/// A range of bytes: start and end.
type Span = (usize, usize);

/// Records encoded back to back in one buffer, for [`BatchTopic::produce`].
#[derive(Default)]
pub(crate) struct EncodedRecords {
    bytes: Vec<u8>,
    /// Per record: where its key (if any) and its value lie in `bytes`.
    spans: Vec<(Option<Span>, Span)>,
}

impl EncodedRecords {
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
    }

    /// Adds a record of `key` and the value `encode` appends.
    pub(crate) fn push(
        &mut self,
        key: Option<&[u8]>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let key = key.map(|key| {
            let start = self.bytes.len();
            self.bytes.extend_from_slice(key);
            (start, self.bytes.len())
        });
        let start = self.bytes.len();
        encode(&mut self.bytes)?;
        self.spans.push((key, (start, self.bytes.len())));
        Ok(())
    }

    /// The records as (key, value) slices.
    pub(crate) fn records(&self) -> Vec<(Option<&[u8]>, &[u8])> {
        self.spans
            .iter()
            .map(|(key, (start, end))| {
                (
                    key.map(|(s, e)| &self.bytes[s..e]),
                    &self.bytes[*start..*end],
                )
            })
            .collect()
    }
}
