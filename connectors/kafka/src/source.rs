//! The Kafka source: a consumer group with cooperative-sticky assignment;
//! offsets are committed only after the batch's output is acknowledged.

use crate::batch_plan::BatchPlan;
use crate::carried::CarriedRecords;
use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tidemark::error::{Error, Result};
use tidemark::record::{Record, SourcePosition};
use tidemark::runtime::retry::{Backoff, RepeatedWarning, WARNING_INTERVAL};
use tidemark::runtime::{BatchRequest, Source, SourceBatch, SourceOffsets, TaskCheckpoint};

/// Settings of a [`KafkaSource`].
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// The cluster and the properties every client of the query gets.
    pub cluster: KafkaConnection,
    /// Topics; co-partitioned topics share tasks by partition number.
    pub topics: Vec<String>,
    /// The consumer group.
    pub group: String,
    /// Start from the earliest offset when the group has none (else latest).
    pub earliest: bool,
    /// This consumer's own librdkafka properties, over the cluster's.
    pub properties: BTreeMap<String, String>,
}

impl KafkaSourceConfig {
    /// The consumer's connection: the cluster's with its own properties.
    pub fn connection(&self) -> KafkaConnection {
        self.cluster.with_overrides(&self.properties)
    }
}

#[derive(Default)]
struct RebalanceLog {
    revoked: Vec<i32>,
    /// Revoked since the poll loop last looked: records already fetched
    /// from them must not be processed (their offsets cannot be committed
    /// by this member any more).
    revoked_unhandled: Vec<(String, i32)>,
    assigned: Vec<(String, i32)>,
}

struct SourceContext {
    log: Arc<Mutex<RebalanceLog>>,
    /// Set when `revoked_unhandled` gains partitions: the poll loop looks
    /// at the log only then, not under its lock after every record.
    revoked_pending: Arc<AtomicBool>,
    /// Whether the group runs the cooperative protocol (every configured
    /// assignor is `cooperative-sticky`), as librdkafka decides it.
    cooperative: bool,
}

impl ClientContext for SourceContext {}

impl ConsumerContext for SourceContext {
    /// rust-rdkafka's rebalance, but with the protocol taken from the
    /// configuration: its default asks librdkafka's
    /// `rd_kafka_rebalance_protocol()`, which, called from the rebalance
    /// callback while the consumer closes, can wait for ever
    /// (confluentinc/librdkafka#4041). Seen here: a static member stopped
    /// with Ctrl-C right after it started never exited, its main thread
    /// inside the consumer's drop.
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: rdkafka::types::RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        use rdkafka::types::RDKafkaRespErr as Code;
        let assign = err == Code::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        let rebalance = match err {
            Code::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(tpl),
            Code::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(tpl),
            other => Rebalance::Error(rdkafka::error::KafkaError::Rebalance(other.into())),
        };
        self.pre_rebalance(consumer, &rebalance);
        let applied = match (assign, self.cooperative) {
            (true, true) => consumer.incremental_assign(tpl),
            (true, false) => consumer.assign(tpl),
            (false, true) => consumer.incremental_unassign(tpl),
            (false, false) => consumer.unassign(),
        };
        if let Err(error) = applied {
            tracing::warn!(%error, assign, "applying a rebalance");
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            for e in tpl.elements() {
                tracing::info!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "partition revoked"
                );
                log.revoked.push(e.partition());
                log.revoked_unhandled
                    .push((e.topic().to_string(), e.partition()));
            }
            self.revoked_pending.store(true, Ordering::Release);
        }
    }
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            // librdkafka keeps a partition's pause across assignments: one
            // paused when it was taken away (held, or past a batch's
            // planned end) would come back paused, and never be read.
            if let Err(error) = consumer.resume(tpl) {
                tracing::warn!(%error, "resuming newly assigned partitions");
            }
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            for e in tpl.elements() {
                tracing::info!(
                    topic = e.topic(),
                    partition = e.partition(),
                    "partition assigned"
                );
                log.assigned.push((e.topic().to_string(), e.partition()));
            }
        }
    }
}

/// Records polled between two readings of the clock while draining.
const CLOCK_EVERY: u32 = 256;

/// The poll loop's clock: read before every waiting poll, and once every
/// [`CLOCK_EVERY`] records while polls return records without waiting.
struct Clock {
    last: Instant,
    reads_since: u32,
}

impl Clock {
    fn new() -> Self {
        Clock {
            last: Instant::now(),
            reads_since: 0,
        }
    }

    /// The time now, or at most [`CLOCK_EVERY`] records ago when `draining`.
    fn now(&mut self, draining: bool) -> Instant {
        self.reads_since += 1;
        if !draining || self.reads_since >= CLOCK_EVERY {
            self.last = Instant::now();
            self.reads_since = 0;
        }
        self.last
    }
}

/// A topic and partition, the topic's name shared: the per-record
/// bookkeeping clones it without allocating.
type TopicPartition = (Arc<str>, i32);

/// A map keyed by topic partition, hashed fast (keys are not attacker
/// chosen: they come from the broker's assignment).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Adds `offset` of `topic`/`partition` to `tpl`, with the task's
/// `checkpoint` as its metadata.
fn add_offset(
    tpl: &mut TopicPartitionList,
    topic: &str,
    partition: i32,
    offset: i64,
    checkpoint: Option<&TaskCheckpoint>,
) -> Result<()> {
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset))
        .map_err(|e| Error::source_failed("offset list", e))?;
    if let (Some(meta), Some(mut elem)) = (checkpoint, tpl.find_partition(topic, partition)) {
        // Kafka keeps up to `offset.metadata.max.bytes` (4 KiB by default)
        // of metadata with each committed offset.
        elem.set_metadata(meta.as_str());
    }
    Ok(())
}

fn topic_partition(topic: &str, partition: i32) -> TopicPartition {
    (Arc::from(topic), partition)
}

/// The shared name of `topic` among `names`, made once per topic.
fn topic_name(names: &mut Vec<Arc<str>>, topic: &str) -> Arc<str> {
    if let Some(name) = names.iter().find(|n| n.as_ref() == topic) {
        return name.clone();
    }
    let name: Arc<str> = Arc::from(topic);
    names.push(name.clone());
    name
}

/// A topic partition and the offset it resumes from when released (`None`:
/// the consumer's position, nothing having been handed out).
type ResumePoint = ((String, i32), Option<i64>);

/// How long a closing source waits for its partitions to be revoked
/// after it unsubscribed (see `KafkaSource::release_assignment`).
const UNSUBSCRIBE_WAIT: Duration = Duration::from_secs(10);

/// How long a closing consumer may take before the source stops waiting
/// for it (see the `Drop` impl).
const CLOSE_WAIT: Duration = Duration::from_secs(30);

impl Drop for KafkaSource {
    /// Closes the consumer without letting librdkafka's close hang the
    /// caller: it can wait for ever inside an assign or unassign called
    /// from the rebalance callback it runs while closing
    /// (confluentinc/librdkafka#4884; seen here: a static member stopped
    /// with Ctrl-C after a chaos soak never exited). A dynamic member first
    /// gives its partitions back (unsubscribe, then nothing assigned:
    /// the workaround librdkafka#4527 gives), which also lets the group
    /// rebalance at once; a static member keeps them, as KIP-345 means it
    /// to. Then the consumer closes on a thread of its own; one still
    /// closing after [`CLOSE_WAIT`] is left to it, with a warning, and the
    /// process goes on (or exits, which ends that thread).
    fn drop(&mut self) {
        if !self.config.properties.contains_key("group.instance.id") {
            self.release_assignment();
        }
        // SAFETY: taken once, here, and never used after: `self` is being
        // dropped and no method runs after `drop`.
        let consumer = unsafe { std::mem::ManuallyDrop::take(&mut self.consumer) };
        let (closed, closing) = std::sync::mpsc::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("tidemark-consumer-close".into())
            .spawn(move || {
                drop(consumer);
                let _ = closed.send(());
            });
        match spawned {
            Ok(_) => {
                if closing.recv_timeout(CLOSE_WAIT).is_err() {
                    tracing::warn!(
                        topics = ?self.config.topics,
                        "the consumer did not finish closing within {CLOSE_WAIT:?}: left to close on its own"
                    );
                }
            }
            Err(e) => tracing::warn!(error = %e, "no thread to close the consumer on"),
        }
    }
}

/// Reads Kafka topics as a member of a consumer group.
pub struct KafkaSource {
    config: KafkaSourceConfig,
    /// Dropped by hand, on a thread of its own and for a bounded time (see
    /// the `Drop` impl).
    consumer: std::mem::ManuallyDrop<BaseConsumer<SourceContext>>,
    log: Arc<Mutex<RebalanceLog>>,
    /// Shared with the consumer's context: see `SourceContext`.
    revoked_pending: Arc<AtomicBool>,
    /// Next offset to commit per (topic, partition): last handed out + 1.
    next_offsets: HashMap<TopicPartition, i64>,
    committed: HashMap<TopicPartition, i64>,
    /// Offset of the first record handed out since the last commit (or
    /// seek), per (topic, partition): where a held partition goes back to.
    first_uncommitted: HashMap<TopicPartition, i64>,
    /// Held task partitions (see [`Source::hold`]), with the offset each
    /// of their topic partitions resumes from.
    held: BTreeMap<i32, Vec<ResumePoint>>,
    committed_checkpoints: BTreeMap<i32, TaskCheckpoint>,
    /// Exactly-once: offsets commit inside the batch's transaction.
    transactions: Option<super::SharedTransactions>,
    /// Available-now: end offsets fixed at the first batch.
    end_offsets: Option<HashMap<TopicPartition, i64>>,
    /// The names of the topics read, shared by every record.
    topic_names: Vec<Arc<str>>,
    /// The next batch replays up to these offsets (see `replay_until`).
    replaying: bool,
    /// When the consumer first said a subscribed topic is unknown: its
    /// metadata is looked up once the grace has passed (librdkafka says so
    /// only once per metadata refresh, every few minutes).
    unknown_topic_since: Option<Instant>,
    /// The current batch's end offsets, when batches are planned
    /// ([`BatchRequest::plan_offsets`]).
    plan: Option<BatchPlan<TopicPartition>>,
    /// Records polled past the planned end of their partition, handed out
    /// by the next batch (see [`CarriedRecords`]).
    carried: CarriedRecords<TopicPartition>,
    /// Partitions paused because [`Self::carried`] was full when a record
    /// past their planned end arrived, with that record's offset: the next
    /// batch reads again from it.
    paused_at_plan: HashMap<TopicPartition, i64>,
    /// The last planned batch ended short of its plan: the next one is not
    /// planned, so that a plan that cannot be reached never stalls the
    /// query.
    plan_stalled: bool,
    /// The partitions the last plan reads to their latest offset.
    caught_up: BTreeSet<i32>,
    /// When the last plan asked for the latest offsets (epoch ms): what
    /// was appended after it is not in [`Self::caught_up`]'s plan.
    planned_at_ms: Option<i64>,
    /// Waits between consumer errors and failed plans while the cluster
    /// is unreachable, so that a broker restart is not a busy loop.
    error_backoff: Backoff,
    /// The consumer's repeated errors, logged once per interval.
    consumer_error_warning: RepeatedWarning,
    /// The batch plan's repeated failures, logged once per interval.
    plan_error_warning: RepeatedWarning,
    /// Spark's `failOnDataLoss` (see [`KafkaSource::fail_on_data_loss`]).
    fail_on_data_loss: bool,
}

/// The first wait after a consumer error or a failed plan, and its cap.
const ERROR_BACKOFF: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));

/// How long a planned batch may take to reach its end offsets before it
/// ends with what it has (a broker gone, records deleted under it, an end
/// the consumer's position never shows passed); the next batch then takes
/// what the polls return.
const PLANNED_BATCH_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a subscribed topic may stay unknown (metadata not yet
/// propagated after its creation, a broker restarting) before the cluster
/// is asked whether it exists.
const UNKNOWN_TOPIC_GRACE: Duration = Duration::from_secs(15);

/// A consumer error no retry can mend, as a configuration error naming the
/// key to fix: a topic that does not exist, or credentials the cluster
/// refuses. Anything else (a broker down, a timeout) is for retrying.
/// Whether the consumer error says a subscribed topic is unknown.
fn is_unknown_topic(error: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        error.rdkafka_error_code(),
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic)
    )
}

fn fatal_consumer_error(error: &rdkafka::error::KafkaError, topics: &[String]) -> Option<Error> {
    use rdkafka::types::RDKafkaErrorCode as Code;
    match error.rdkafka_error_code()? {
        Code::TopicAuthorizationFailed
        | Code::GroupAuthorizationFailed
        | Code::ClusterAuthorizationFailed => Some(Error::config(
            "source.properties",
            format!("the cluster refuses this client access to {topics:?} or its group: {error}"),
        )),
        Code::SaslAuthenticationFailed | Code::Authentication => Some(Error::config(
            "source.properties",
            format!("the cluster refused this client's credentials: {error}"),
        )),
        _ => None,
    }
}

impl KafkaSource {
    /// Connects and subscribes.
    pub fn new(config: KafkaSourceConfig) -> Result<Self> {
        let connection = config.connection();
        let mut client = connection.client_config(&[
            ("partition.assignment.strategy", "cooperative-sticky"),
            ("isolation.level", "read_committed"),
            ("fetch.wait.max.ms", "100"),
            ("fetch.queue.backoff.ms", crate::FETCH_QUEUE_BACKOFF_MS),
        ]);
        client
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                if config.earliest {
                    "earliest"
                } else {
                    "latest"
                },
            );
        let log = Arc::new(Mutex::new(RebalanceLog::default()));
        let revoked_pending = Arc::new(AtomicBool::new(false));
        let cooperative = client
            .get("partition.assignment.strategy")
            .is_some_and(|s| s.split(',').all(|a| a.trim() == "cooperative-sticky"));
        let consumer: BaseConsumer<SourceContext> = connection.create(
            &client,
            SourceContext {
                log: log.clone(),
                revoked_pending: revoked_pending.clone(),
                cooperative,
            },
            "source consumer",
        )?;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| Error::source_failed(format!("subscribing to {topics:?}"), e))?;
        Ok(KafkaSource {
            config,
            consumer: std::mem::ManuallyDrop::new(consumer),
            log,
            revoked_pending,
            next_offsets: HashMap::default(),
            committed: HashMap::default(),
            first_uncommitted: HashMap::default(),
            held: BTreeMap::new(),
            committed_checkpoints: BTreeMap::new(),
            transactions: None,
            end_offsets: None,
            topic_names: Vec::new(),
            replaying: false,
            unknown_topic_since: None,
            error_backoff: ERROR_BACKOFF,
            consumer_error_warning: RepeatedWarning::new(WARNING_INTERVAL),
            plan_error_warning: RepeatedWarning::new(WARNING_INTERVAL),
            fail_on_data_loss: true,
            plan: None,
            carried: CarriedRecords::default(),
            paused_at_plan: HashMap::default(),
            plan_stalled: false,
            caught_up: BTreeSet::new(),
            planned_at_ms: None,
        })
    }

    /// Commits offsets inside `transactions` together with the batch's
    /// output and state changes (exactly-once).
    pub fn with_transactions(mut self, transactions: super::SharedTransactions) -> Self {
        self.transactions = Some(transactions);
        self
    }

    /// The committed offsets (and task checkpoints) of the owned
    /// partitions not held back, as they stand.
    fn add_unchanged_offsets(
        &self,
        tpl: &mut TopicPartitionList,
        assigned: &[(String, i32)],
    ) -> Result<()> {
        for (topic, partition) in assigned {
            if self.held.contains_key(partition) {
                continue;
            }
            let Some(offset) = self.committed.get(&topic_partition(topic, *partition)) else {
                continue;
            };
            let checkpoint = self.committed_checkpoints.get(partition);
            add_offset(tpl, topic, *partition, *offset, checkpoint)?;
        }
        Ok(())
    }

    fn assigned(&self) -> Vec<(String, i32)> {
        self.consumer
            .assignment()
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .map(|e| (e.topic().to_string(), e.partition()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Fixes the end offsets for available-now once partitions are assigned.
    fn capture_end_offsets(&mut self, deadline: Instant) -> Result<()> {
        self.join(deadline)?;
        let mut ends = HashMap::default();
        let end_offsets = crate::admin::high_watermark_client(&self.config.connection())?;
        let committed = self
            .consumer
            .committed(Duration::from_secs(10))
            .map_err(|e| Error::source_failed("reading committed offsets", e))?;
        for (topic, partition) in self.assigned() {
            let (low, high) = end_offsets
                .fetch_watermarks(&topic, partition, Duration::from_secs(10))
                .map_err(|e| {
                    Error::source_failed(format!("end offsets of {topic}/{partition}"), e)
                })?;
            let start = committed
                .find_partition(&topic, partition)
                .and_then(|e| e.offset().to_raw())
                .filter(|o| *o >= 0)
                .unwrap_or(if self.config.earliest { low } else { high });
            self.next_offsets
                .entry(topic_partition(&topic, partition))
                .or_insert(start);
            ends.insert(topic_partition(&topic, partition), high);
        }
        self.end_offsets = Some(ends);
        Ok(())
    }

    /// Moves the consumer's position in `topic`/`partition` to `offset`
    /// (dropping what was prefetched from it).
    fn seek(&self, topic: &str, partition: i32, offset: Offset) -> Result<()> {
        self.consumer
            .seek(topic, partition, offset, Duration::from_secs(10))
            .map_err(|e| {
                Error::source_failed(format!("seeking {topic}/{partition} to {offset:?}"), e)
            })
    }

    /// Ends a replayed batch: what was fetched past its bounds is dropped
    /// and read again by the next batch.
    fn end_replay(&mut self) -> Result<()> {
        self.replaying = false;
        for ((topic, partition), bound) in self.end_offsets.take().unwrap_or_default() {
            let position = self
                .next_offsets
                .get(&(topic.clone(), partition))
                .copied()
                .unwrap_or(bound)
                .min(bound);
            // The replay ended at its bounds, a partition it read nothing
            // from too: its offsets say so, as the aborted batch's did
            // (otherwise a partition never committed, at its start, would
            // drop out of the batch's end offsets).
            self.next_offsets
                .entry((topic.clone(), partition))
                .or_insert(position);
            self.seek(&topic, partition, Offset::Offset(position))?;
        }
        Ok(())
    }

    /// The group's committed offsets of `partitions`, from the broker.
    fn committed_offsets(&self, partitions: &[(String, i32)]) -> Result<TopicPartitionList> {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in partitions {
            tpl.add_partition(topic, *partition);
        }
        self.consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .map_err(|e| Error::source_failed("reading committed offsets", e))
    }

    /// After the consumer called a subscribed topic unknown and the grace
    /// has passed, asks the cluster: a topic it does not have is a
    /// configuration error naming it.
    fn check_unknown_topics(&mut self) -> Result<()> {
        use rdkafka::types::RDKafkaRespErr;
        if self
            .unknown_topic_since
            .is_none_or(|since| since.elapsed() < UNKNOWN_TOPIC_GRACE)
        {
            return Ok(());
        }
        self.unknown_topic_since = None;
        // A regex subscription names no one topic to look up.
        for topic in self.config.topics.iter().filter(|t| !t.starts_with('^')) {
            let metadata = self
                .consumer
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .map_err(|e| Error::source_failed(format!("metadata of {topic}"), e))?;
            // Only the cluster's own "no such topic" counts: a leader being
            // elected or a broker restarting is for retrying.
            let missing = match metadata.topics().iter().find(|t| t.name() == topic) {
                None => true,
                Some(t) => {
                    t.error() == Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
                }
            };
            if missing {
                return Err(Error::config(
                    "source.topic",
                    format!(
                        "the topic `{topic}` does not exist (still unknown {} s after the consumer first said so): create it or name another",
                        UNKNOWN_TOPIC_GRACE.as_secs()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A poll's error: what no retry mends fails the batch (refused access,
    /// a topic that does not exist, a consumer failed for good); anything
    /// else is warned about (once per interval) and waited out, at most
    /// until the batch's `deadline` (see [`Backoff::wait_after_failure`]).
    fn consumer_error(&mut self, e: &rdkafka::error::KafkaError, deadline: Instant) -> Result<()> {
        if let Some(fatal) = fatal_consumer_error(e, &self.config.topics) {
            return Err(fatal);
        }
        self.fail_if_consumer_failed()?;
        if is_unknown_topic(e) {
            self.unknown_topic_since.get_or_insert_with(Instant::now);
        }
        self.check_unknown_topics()?;
        if let Some(times) = self.consumer_error_warning.occurred() {
            tracing::warn!(error = %e, times, "Kafka consumer error; retrying");
        }
        self.error_backoff.wait_after_failure(Some(deadline));
        Ok(())
    }

    /// Spark's `failOnDataLoss`: when a partition's committed offset is
    /// one it no longer holds (records deleted by retention or by hand, a
    /// topic made again), `true` (the default) fails the run with an error
    /// naming the topic, partition, committed and earliest offsets; `false`
    /// reads on from the earliest offset with a warning and counts the
    /// records skipped (`tidemark_source_records_lost_total`). Without the
    /// check the consumer's `auto.offset.reset` moved on in silence.
    pub fn fail_on_data_loss(mut self, fail: bool) -> Self {
        self.fail_on_data_loss = fail;
        self
    }

    /// Checks each `committed` offset against the records its partition
    /// holds (see [`KafkaSource::fail_on_data_loss`]).
    fn check_data_loss(&self, committed: &TopicPartitionList) -> Result<()> {
        for e in committed.elements() {
            let Some(offset) = e.offset().to_raw().filter(|o| *o >= 0) else {
                continue;
            };
            let (topic, partition) = (e.topic(), e.partition());
            let (earliest, latest) = self
                .consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(10))
                .map_err(|e| {
                    Error::source_failed(
                        format!("offsets held by `{topic}` partition {partition}"),
                        e,
                    )
                })?;
            if (earliest..=latest).contains(&offset) {
                continue;
            }
            let what = format!(
                "`{topic}` partition {partition}: the committed offset {offset} is not among the offsets the partition holds (earliest {earliest}, latest {latest}): records were deleted (retention, or by hand) or the topic was made again"
            );
            if self.fail_on_data_loss {
                return Err(Error::config(
                    "source.fail_on_data_loss",
                    format!("{what}. Set `source.fail_on_data_loss: false` to read on from the earliest offset"),
                ));
            }
            let lost = u64::try_from(earliest - offset).unwrap_or(0);
            tracing::warn!(
                topic,
                partition,
                committed = offset,
                earliest,
                lost,
                "{what}; reading on from the earliest offset (source.fail_on_data_loss: false)"
            );
            metrics::counter!("tidemark_source_records_lost_total", "topic" => topic.to_string())
                .increment(lost);
        }
        Ok(())
    }

    /// An error when librdkafka calls the consumer failed for good: a
    /// static member whose session timed out while the broker was away
    /// rejoins under its `group.instance.id` and is fenced as its own
    /// predecessor (`FENCED_INSTANCE_ID`); such a consumer answers every
    /// poll with an error, reads nothing again and fails every commit. The
    /// stage must be rebuilt with a new consumer, which the runner does.
    /// Gives the member's partitions back before the consumer closes:
    /// unsubscribes, then polls (its revocation handled by the rebalance
    /// callback as at any rebalance) until nothing is assigned, for at
    /// most [`UNSUBSCRIBE_WAIT`]. librdkafka's close can otherwise wait for
    /// ever inside an assign or unassign called from the rebalance callback
    /// it runs while closing (confluentinc/librdkafka#4884, #4527): seen
    /// here as a replica stopped with Ctrl-C that never exited. This is
    /// the workaround that thread gives (unsubscribe, wait for no
    /// assignment, then close).
    fn release_assignment(&mut self) {
        if self.consumer.client().fatal_error().is_some() {
            return;
        }
        self.consumer.unsubscribe();
        let deadline = Instant::now() + UNSUBSCRIBE_WAIT;
        while Instant::now() < deadline {
            match self.consumer.assignment() {
                Ok(assigned) if assigned.count() > 0 => {}
                _ => return,
            }
            // Records still fetched are dropped: their offsets were not
            // committed, the next owner reads them.
            let _ = self.consumer.poll(Duration::from_millis(50));
        }
        tracing::warn!(
            topics = ?self.config.topics,
            "partitions still assigned when the consumer closes"
        );
    }

    fn fail_if_consumer_failed(&self) -> Result<()> {
        match self.consumer.client().fatal_error() {
            Some((code, reason)) => Err(Error::Source(format!(
                "the consumer of {:?} failed for good ({code:?}: {reason}); it is recreated",
                self.config.topics
            ))),
            None => Ok(()),
        }
    }

    /// Polls until the group assigned partitions to this member.
    fn join(&mut self, deadline: Instant) -> Result<()> {
        while self.assigned().is_empty() && Instant::now() < deadline {
            self.check_unknown_topics()?;
            if let Some(Err(e)) = self.consumer.poll(Duration::from_millis(50)) {
                if let Some(fatal) = fatal_consumer_error(&e, &self.config.topics) {
                    return Err(fatal);
                }
                if is_unknown_topic(&e) {
                    self.unknown_topic_since.get_or_insert_with(Instant::now);
                    continue;
                }
                return Err(Error::source_failed("while joining the group", e));
            }
        }
        Ok(())
    }

    /// Drops what was fetched from partitions revoked since the last look:
    /// their new owner (maybe this member again) reads them from the last
    /// committed offset, so processing them here would duplicate them.
    fn forget_revoked(&mut self, records: &mut Vec<Record>) {
        if !self.revoked_pending.swap(false, Ordering::Acquire) {
            return;
        }
        let revoked = {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut log.revoked_unhandled)
        };
        for (topic, partition) in revoked {
            records.retain(|r| {
                !(r.position.topic.as_ref() == topic && r.position.partition == partition)
            });
            let key = topic_partition(&topic, partition);
            // Another member reads it now: a replay's bound or an
            // available-now end for it would never be reached here.
            if let Some(ends) = self.end_offsets.as_mut() {
                ends.remove(&key);
            }
            if let Some(plan) = self.plan.as_mut() {
                plan.forget(&key);
            }
            self.carried.forget(&key);
            self.paused_at_plan.remove(&key);
            self.next_offsets.remove(&key);
            self.first_uncommitted.remove(&key);
            self.committed.remove(&key);
            self.committed_checkpoints.remove(&partition);
            self.held.remove(&partition);
        }
    }

    /// The checkpoints committed with the offsets of `assigned`. A broker
    /// that cannot say is an error (the batch fails and is retried): tasks
    /// started without their watermark would take rows their windows
    /// already closed on as on time, and emit those windows again.
    fn checkpoints_of(&mut self, assigned: &[(String, i32)]) -> Result<Vec<(i32, TaskCheckpoint)>> {
        if assigned.is_empty() {
            return Ok(Vec::new());
        }
        let committed = self
            .committed_offsets(assigned)
            .map_err(|e| e.in_context("reading the committed checkpoints"))?;
        self.check_data_loss(&committed)?;
        // Every topic of a task partition keeps its own copy, written when
        // that topic last moved: one copy may be batches older than
        // another. All are handed back; the task keeps the newest.
        let mut out: BTreeSet<(i32, String)> = BTreeSet::new();
        for e in committed.elements() {
            if !e.metadata().is_empty() {
                out.insert((e.partition(), e.metadata().to_string()));
            }
            // Known from the start, a topic that delivers nothing still
            // gets its task's new checkpoints with its unchanged offset.
            if let Some(offset) = e.offset().to_raw().filter(|o| *o >= 0) {
                let key = topic_partition(e.topic(), e.partition());
                self.next_offsets.entry(key.clone()).or_insert(offset);
                self.committed.entry(key).or_insert(offset);
            }
        }
        let restored = out.into_iter();
        Ok(restored
            .map(|(p, c)| (p, TaskCheckpoint::from_stored(c)))
            .collect())
    }

    /// Whether every partition reached its available-now end. The cheap
    /// test (offsets handed out) runs per record; the consumer position,
    /// which also passes commit markers, only when `idle` (a poll found
    /// nothing).
    fn caught_up(&self, idle: bool) -> bool {
        let Some(ends) = &self.end_offsets else {
            return false;
        };
        if !self.held.is_empty() || !self.carried.is_empty() {
            // A held partition is read again from where it was held; the
            // consumer's position is past carried records not handed out.
            return false;
        }
        let handed_out_all = ends
            .iter()
            .all(|(tp, end)| self.next_offsets.get(tp).copied().unwrap_or(0) >= *end);
        if handed_out_all || !idle {
            return handed_out_all;
        }
        // A transactional topic ends with a commit marker that is never
        // handed out: the consumer's position (the application's, so never
        // ahead of undelivered records) moves past it; the offset after the
        // last record does not.
        let position = self.consumer.position().ok();
        ends.iter().all(|((topic, partition), end)| {
            let handed_out = self
                .next_offsets
                .get(&(topic.clone(), *partition))
                .copied()
                .unwrap_or(0);
            let fetched = position
                .as_ref()
                .and_then(|p| p.find_partition(topic, *partition))
                .and_then(|e| e.offset().to_raw())
                .unwrap_or(0);
            handed_out.max(fetched) >= *end
        })
    }

    /// Whether the batch being read ends before the next poll: a planned
    /// batch once every partition reached its planned end (or after
    /// [`PLANNED_BATCH_TIMEOUT`]), any other at the record cap or the
    /// deadline; a replay only at its bounds (an error after its deadline).
    fn batch_ends(
        &self,
        records: usize,
        request: &BatchRequest,
        replay_deadline: Instant,
        plan_deadline: Instant,
        now: Instant,
    ) -> Result<bool> {
        if self.replaying {
            if now >= replay_deadline {
                return Err(Error::Source(
                    "the replayed batch did not reach its recorded offsets in 5 minutes".into(),
                ));
            }
            return Ok(false);
        }
        match &self.plan {
            Some(plan) if plan.complete() => Ok(true),
            Some(plan) if now >= plan_deadline => {
                let short: Vec<_> = plan.unreached().collect();
                tracing::warn!(
                    ?short,
                    "the batch did not reach its planned end offsets in {} s; it ends with what it read, and the next batch takes what the polls return",
                    PLANNED_BATCH_TIMEOUT.as_secs()
                );
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Ok(records >= request.max_records || now >= request.deadline),
        }
    }

    /// How long the next poll may wait for a record.
    fn poll_wait(
        &self,
        draining: bool,
        request: &BatchRequest,
        no_records_yet: bool,
        now: Instant,
    ) -> Duration {
        if draining {
            Duration::ZERO
        } else if self.replaying || self.plan.is_some() {
            Duration::from_millis(100)
        } else if request.return_early && !no_records_yet {
            // Real-time: take what is already fetched, wait for nothing.
            Duration::ZERO
        } else {
            (request.deadline - now).min(Duration::from_millis(100))
        }
    }

    /// Plans the batch as Spark plans a micro-batch: the end offset of
    /// every partition this member reads (not held) is its latest one —
    /// the last stable offset, as the consumer reads committed records
    /// only; under available-now never past the end fixed at start — cut
    /// to its share of `max_records` by backlog. `None` when nothing waits.
    fn plan_batch(&mut self, max_records: usize) -> Result<Option<BatchPlan<TopicPartition>>> {
        let partitions: Vec<(String, i32)> = self
            .assigned()
            .into_iter()
            .filter(|(_, p)| !self.held.contains_key(p))
            .collect();
        if partitions.is_empty() {
            return Ok(None);
        }
        // Asked before the offsets: a record appended while they are
        // listed may be left out, never one appended before.
        let asked_at_ms = tidemark::time::now_micros() / 1_000;
        let mut latest = match &self.end_offsets {
            Some(ends) => ends.clone(),
            None => self.list_offsets(&partitions, Offset::End)?,
        };
        // An available-now end was fixed at start: what came later is not
        // this run's to read.
        self.planned_at_ms = self.end_offsets.is_none().then_some(asked_at_ms);
        latest.retain(|(topic, partition), _| {
            partitions
                .iter()
                .any(|(t, p)| t.as_str() == topic.as_ref() && p == partition)
        });
        let starts = self.start_offsets(&partitions, &latest)?;
        let plan = BatchPlan::new(max_records, &starts, &latest);
        let cut: BTreeSet<i32> = plan
            .iter()
            .flat_map(|plan| plan.cut_short(&latest))
            .map(|(_, partition)| *partition)
            .collect();
        self.caught_up = partitions
            .iter()
            .map(|(_, partition)| *partition)
            .filter(|partition| !cut.contains(partition))
            .collect();
        Ok(plan)
    }

    /// The offsets of `partitions` at `position` (`Offset::End`: the latest
    /// — the last stable offset under read_committed; `Offset::Beginning`:
    /// the earliest), asked of their leaders.
    fn list_offsets(
        &self,
        partitions: &[(String, i32)],
        position: Offset,
    ) -> Result<HashMap<TopicPartition, i64>> {
        let mut tpl = TopicPartitionList::new();
        for (topic, partition) in partitions {
            tpl.add_partition_offset(topic, *partition, position)
                .map_err(|e| Error::source_failed("offset list", e))?;
        }
        let listed = self
            .consumer
            .offsets_for_times(tpl, Duration::from_secs(10))
            .map_err(|e| {
                Error::source_failed(format!("listing the offsets of {partitions:?}"), e)
            })?;
        let mut offsets = HashMap::default();
        for e in listed.elements() {
            if let Err(error) = e.error() {
                return Err(Error::Source(format!(
                    "listing the offsets of {}/{}: {error}",
                    e.topic(),
                    e.partition()
                )));
            }
            if let Some(offset) = e.offset().to_raw().filter(|o| *o >= 0) {
                offsets.insert(topic_partition(e.topic(), e.partition()), offset);
            }
        }
        Ok(offsets)
    }

    /// Where each of `partitions` reads next: its first record read past
    /// the last plan, else after the last record handed out, else the
    /// consumer's position, else the group's committed
    /// offset, else the earliest or the `latest` offset by
    /// `auto.offset.reset`.
    fn start_offsets(
        &self,
        partitions: &[(String, i32)],
        latest: &HashMap<TopicPartition, i64>,
    ) -> Result<HashMap<TopicPartition, i64>> {
        let position = self.consumer.position().ok();
        let mut starts = HashMap::default();
        let mut unknown = Vec::new();
        for (topic, partition) in partitions {
            let key = topic_partition(topic, *partition);
            // The first record read past the last plan, kept or paused at,
            // is where the partition's next readable record is: the offsets
            // between it and the last one handed out hold nothing to read
            // (transaction markers, an aborted transaction's records). A
            // plan starting from the last handed out would end inside such
            // a gap for ever, its every batch empty.
            let known = self
                .carried
                .first_offset(&key)
                .or_else(|| self.paused_at_plan.get(&key).copied())
                .or_else(|| self.next_offsets.get(&key).copied())
                .or_else(|| {
                    position
                        .as_ref()?
                        .find_partition(topic, *partition)?
                        .offset()
                        .to_raw()
                        .filter(|o| *o >= 0)
                });
            match known {
                Some(offset) => {
                    starts.insert(key, offset);
                }
                None => unknown.push((topic.clone(), *partition)),
            }
        }
        if unknown.is_empty() {
            return Ok(starts);
        }
        let committed = self.committed_offsets(&unknown)?;
        let mut never_committed = Vec::new();
        for (topic, partition) in unknown {
            let offset = committed
                .find_partition(&topic, partition)
                .and_then(|e| e.offset().to_raw())
                .filter(|o| *o >= 0);
            match offset {
                Some(offset) => {
                    starts.insert(topic_partition(&topic, partition), offset);
                }
                None => never_committed.push((topic, partition)),
            }
        }
        if !never_committed.is_empty() && self.config.earliest {
            starts.extend(self.list_offsets(&never_committed, Offset::Beginning)?);
        } else {
            for (topic, partition) in never_committed {
                let key = topic_partition(&topic, partition);
                if let Some(end) = latest.get(&key) {
                    starts.insert(key, *end);
                }
            }
        }
        Ok(starts)
    }

    /// Keeps `record` of `key`, past its planned end or behind records
    /// kept before it, for the next batch: the partition has reached its
    /// end. Once a batch's worth of records is kept, the partition is
    /// paused instead, and read again from this record.
    fn carry(&mut self, key: TopicPartition, record: Record, max_records: usize) -> Result<()> {
        if let Some(plan) = self.plan.as_mut() {
            plan.reached(&key);
        }
        if self.paused_at_plan.contains_key(&key) {
            // Fetched before the pause took effect.
            return Ok(());
        }
        if self.carried.len() < max_records {
            self.carried.push(key, record);
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&key.0, key.1);
        self.consumer
            .pause(&tpl)
            .map_err(|e| Error::source_failed(format!("pausing {}/{}", key.0, key.1), e))?;
        self.paused_at_plan.insert(key, record.position.offset);
        Ok(())
    }

    /// Notes that the record at `offset` of `key` is handed out.
    fn handed_out(&mut self, key: TopicPartition, offset: i64) {
        match self.next_offsets.get_mut(&key) {
            Some(next) => *next = offset + 1,
            None => {
                self.next_offsets.insert(key.clone(), offset + 1);
            }
        }
        if let Some(plan) = self.plan.as_mut() {
            plan.advance(&key, offset + 1);
        }
        self.first_uncommitted.entry(key).or_insert(offset);
    }

    /// The partitions revoked and assigned by rebalances since the last
    /// batch, the assigned ones still owned.
    fn take_rebalanced(&mut self) -> (Vec<i32>, Vec<(String, i32)>) {
        let (revoked, mut assigned) = {
            let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
            (
                std::mem::take(&mut log.revoked),
                std::mem::take(&mut log.assigned),
            )
        };
        // Assigned (or rewound) and then revoked within this batch: not this
        // member's any more. Handing back its checkpoint would start a task
        // the runtime never closes (the revocation is applied first), whose
        // state goes stale while another member moves on, and is reused as
        // it stands if the partition comes back.
        if !assigned.is_empty() {
            // Asking librdkafka for the assignment waits on its main
            // thread: once per rebalance, not once per poll (a real-time
            // query polls thousands of times a second).
            let owned = self.assigned();
            assigned.retain(|partition| owned.contains(partition));
        }
        (revoked, assigned)
    }

    /// Hands out, first in the batch, the carried records the plan admits
    /// (every one when the batch is not planned).
    fn hand_out_carried(&mut self, records: &mut Vec<Record>) {
        if self.carried.is_empty() {
            return;
        }
        let plan = self.plan.as_ref();
        let (taken, stopped) = self
            .carried
            .take_admitted(|key, offset| plan.is_none_or(|p| p.admits(key, offset)));
        for key in stopped {
            if let Some(plan) = self.plan.as_mut() {
                plan.reached(&key);
            }
        }
        for (key, record) in taken {
            self.handed_out(key, record.position.offset);
            records.push(record);
        }
    }

    /// Reads again, from the record that stopped each, the partitions the
    /// last plan paused (a held one stays paused: its release rewinds it).
    fn resume_planned(&mut self) -> Result<()> {
        let paused: Vec<(TopicPartition, i64)> = self
            .paused_at_plan
            .iter()
            .map(|(tp, offset)| (tp.clone(), *offset))
            .collect();
        for ((topic, partition), offset) in paused {
            if !self.held.contains_key(&partition) {
                self.seek(&topic, partition, Offset::Offset(offset))?;
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition(&topic, partition);
                self.consumer.resume(&tpl).map_err(|e| {
                    Error::source_failed(format!("resuming {topic}/{partition}"), e)
                })?;
            }
            self.paused_at_plan.remove(&(topic, partition));
        }
        Ok(())
    }

    /// On a poll that found nothing: partitions whose consumer position
    /// passed their planned end (past transaction markers, never handed
    /// out) have reached it. Whether the plan is now complete.
    fn plan_complete_when_idle(&mut self) -> bool {
        let Some(plan) = self.plan.as_mut() else {
            return false;
        };
        if let Ok(position) = self.consumer.position() {
            let passed: Vec<TopicPartition> = plan
                .unreached()
                .filter(|((topic, partition), end)| {
                    position
                        .find_partition(topic, *partition)
                        .and_then(|e| e.offset().to_raw())
                        .is_some_and(|o| o >= *end)
                })
                .map(|(tp, _)| tp.clone())
                .collect();
            for tp in passed {
                plan.reached(&tp);
            }
        }
        plan.complete()
    }
}

impl Source for KafkaSource {
    fn describe(&self) -> String {
        format!("KafkaV2[Subscribe[{}]]", self.config.topics.join(","))
    }

    fn next_batch(&mut self, request: &BatchRequest) -> Result<SourceBatch> {
        self.check_unknown_topics()?;
        if request.available_now && self.end_offsets.is_none() {
            self.capture_end_offsets(Instant::now() + Duration::from_secs(60))?;
        }
        let mut may_plan = request.plan_offsets
            && !self.replaying
            && !request.return_early
            && !std::mem::take(&mut self.plan_stalled);
        self.plan = None;
        // Known again only from a plan.
        self.caught_up.clear();
        let mut unplannable = false;
        if may_plan {
            match self.plan_batch(request.max_records) {
                Ok(plan) => {
                    self.error_backoff.succeeded();
                    // Nothing waits: plan once the first record arrives.
                    may_plan = plan.is_none();
                    self.plan = plan;
                }
                Err(error) => {
                    // A broker restarting: no batch this time round, and a
                    // wait before the next try.
                    if let Some(times) = self.plan_error_warning.occurred() {
                        tracing::warn!(%error, times, "planning the batch's end offsets failed; retrying");
                    }
                    self.error_backoff
                        .wait_after_failure(Some(request.deadline));
                    unplannable = true;
                }
            }
        }
        // Resumed only now: the plan starts a partition paused past the
        // last plan at the record it was paused at.
        self.resume_planned()?;
        let mut records = Vec::new();
        if !unplannable {
            self.hand_out_carried(&mut records);
        }
        // A replayed batch is whole or nothing: neither the deadline nor the
        // record cap ends it, only its bounds.
        let bounded = request.available_now || self.replaying;
        let replay_deadline = Instant::now() + Duration::from_secs(300);
        let plan_deadline = Instant::now() + PLANNED_BATCH_TIMEOUT;
        // While polls return records, the next poll waits for nothing and
        // the clock is read once every CLOCK_EVERY records: reading it per
        // record (here and inside a poll with a timeout) was a tenth of the
        // stateless pipeline's time.
        let mut draining = false;
        let mut clock = Clock::new();
        // While draining, whether the last record reached its partition's
        // end (only then may the handed-out offsets have reached the ends).
        let mut reached_an_end = false;
        loop {
            let look = !draining || std::mem::take(&mut reached_an_end);
            if unplannable || (bounded && look && self.caught_up(false)) {
                break;
            }
            let now = clock.now(draining);
            if self.batch_ends(records.len(), request, replay_deadline, plan_deadline, now)? {
                break;
            }
            let wait = self.poll_wait(draining, request, records.is_empty(), now);
            // Revocations happen inside poll: purge what the last poll made
            // stale before fetching more.
            self.forget_revoked(&mut records);
            let polled = self.consumer.poll(wait);
            let drained = std::mem::replace(&mut draining, polled.is_some());
            let Some(polled) = polled else {
                if drained && (!request.return_early || records.is_empty()) {
                    // The fetched records ran out: wait for more as usual.
                    continue;
                }
                if (bounded && self.caught_up(true))
                    || self.plan_complete_when_idle()
                    || (request.return_early && !records.is_empty())
                {
                    break;
                }
                continue;
            };
            match polled {
                Err(e) => {
                    self.consumer_error(&e, request.deadline)?;
                    continue;
                }
                Ok(m) => {
                    self.error_backoff.succeeded();
                    if self.held.contains_key(&m.partition()) {
                        // Fetched before the pause took effect; read again
                        // after the release.
                        continue;
                    }
                    let key = (topic_name(&mut self.topic_names, m.topic()), m.partition());
                    let offset = m.offset();
                    let end = self.end_offsets.as_ref().and_then(|ends| ends.get(&key));
                    // Available-now reads only what was there at start.
                    if end.is_some_and(|end| offset >= *end) {
                        continue;
                    }
                    reached_an_end = end.is_some_and(|end| offset + 1 >= *end);
                    let past_plan = self.plan.as_ref().is_some_and(|p| !p.admits(&key, offset));
                    if past_plan || self.carried.holds(&key) {
                        let record = record_of(&m, key.0.clone());
                        drop(m);
                        self.carry(key, record, request.max_records)?;
                        continue;
                    }
                    records.push(record_of(&m, key.0.clone()));
                    drop(m);
                    self.handed_out(key, offset);
                    if std::mem::take(&mut may_plan) {
                        self.plan = match self.plan_batch(request.max_records) {
                            Ok(plan) => plan,
                            Err(error) => {
                                if let Some(times) = self.plan_error_warning.occurred() {
                                    tracing::warn!(%error, times, "planning the batch's end offsets failed; it takes what the polls return");
                                }
                                self.caught_up.clear();
                                None
                            }
                        };
                    }
                }
            }
        }
        self.forget_revoked(&mut records);
        let plan = self.plan.take();
        // A plan that ended short (its deadline): those partitions were
        // not read to their end after all.
        for ((_, partition), _) in plan.iter().flat_map(|plan| plan.unreached()) {
            self.caught_up.remove(partition);
        }
        self.plan_stalled = plan.is_some_and(|plan| !plan.complete());
        if self.replaying {
            self.end_replay()?;
        }
        let (revoked, assigned) = self.take_rebalanced();
        Ok(SourceBatch {
            records,
            exhausted: request.available_now && self.caught_up(true),
            revoked_partitions: revoked,
            restored_checkpoints: self.checkpoints_of(&assigned)?,
            ..Default::default()
        })
    }

    fn commit(&mut self, checkpoints: &BTreeMap<i32, TaskCheckpoint>) -> Result<()> {
        let assigned = self.assigned();
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in &self.next_offsets {
            if self.held.contains_key(partition) {
                continue;
            }
            let owned = assigned
                .iter()
                .any(|(t, p)| t.as_str() == topic.as_ref() && p == partition);
            let checkpoint = checkpoints.get(partition);
            let changed = self.committed.get(&(topic.clone(), *partition)) != Some(offset)
                || self.committed_checkpoints.get(partition) != checkpoint;
            if owned && changed {
                add_offset(&mut tpl, topic, *partition, *offset, checkpoint)?;
            }
        }
        self.committed_checkpoints = checkpoints.clone();
        if let Some(t) = &self.transactions {
            if tpl.count() == 0 && t.is_open() {
                // A batch that moved no offset but wrote (a no-data batch
                // closing windows, timers): its offsets are what fences
                // it if the partitions moved to another instance meanwhile
                // (KIP-447 checks the group generation with them), so the
                // unchanged ones go along. Without them a zombie's state
                // and output would commit next to the new owner's.
                self.add_unchanged_offsets(&mut tpl, &assigned)?;
            }
            let group = self.consumer.group_metadata().ok_or_else(|| {
                Error::Source("no consumer group metadata for the transaction".into())
            })?;
            t.commit(&tpl, group)?;
        } else {
            if tpl.count() == 0 {
                return Ok(());
            }
            self.consumer
                .commit(&tpl, CommitMode::Sync)
                .map_err(|e| Error::source_failed("committing offsets", e))?;
        }
        for e in tpl.elements() {
            if let Some(o) = e.offset().to_raw() {
                self.committed
                    .insert(topic_partition(e.topic(), e.partition()), o);
            }
        }
        let held = &self.held;
        self.first_uncommitted
            .retain(|(_, partition), _| held.contains_key(partition));
        Ok(())
    }

    fn hold(&mut self, partition: i32) -> Result<bool> {
        let topic_partitions: Vec<(String, i32)> = self
            .assigned()
            .into_iter()
            .filter(|(_, p)| *p == partition)
            .collect();
        let mut tpl = TopicPartitionList::new();
        let mut resume_from = Vec::new();
        for tp in topic_partitions {
            tpl.add_partition(&tp.0, tp.1);
            let key = topic_partition(&tp.0, tp.1);
            // Read past a plan's end (records carried, or paused), it
            // resumes from the first record not handed out, unless records
            // since the commit were.
            let paused_at = self.paused_at_plan.remove(&key);
            let first = self
                .first_uncommitted
                .remove(&key)
                .or(self.carried.first_offset(&key))
                .or(paused_at);
            self.carried.forget(&key);
            if let Some(offset) = first {
                self.next_offsets.insert(key, offset);
            }
            resume_from.push((tp, first));
        }
        self.consumer
            .pause(&tpl)
            .map_err(|e| Error::source_failed(format!("pausing partition {partition}"), e))?;
        self.held.insert(partition, resume_from);
        Ok(true)
    }

    fn release(&mut self, partition: i32) -> Result<()> {
        let Some(resume_from) = self.held.remove(&partition) else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::new();
        for ((topic, p), offset) in resume_from {
            // Nothing handed out since the last commit: the consumer's
            // position is already right.
            if let Some(offset) = offset {
                self.seek(&topic, p, Offset::Offset(offset))?;
            }
            tpl.add_partition(&topic, p);
        }
        self.consumer
            .resume(&tpl)
            .map_err(|e| Error::source_failed(format!("resuming partition {partition}"), e))
    }

    fn replay_until(&mut self, batch_id: u64, end: &SourceOffsets) -> Result<bool> {
        self.join(Instant::now() + Duration::from_secs(60))?;
        let assigned = self.assigned();
        let committed = self.committed_offsets(&assigned)?;
        let mut bounds = HashMap::default();
        // A batch without input moves no offset: the checkpoints committed
        // with the offsets say which batch committed them.
        let committed_batch = committed
            .elements()
            .iter()
            .filter_map(|e| TaskCheckpoint::from_stored(e.metadata()).batch_id())
            .max();
        let mut behind = committed_batch.is_some_and(|b| b < batch_id);
        for (topic, partition) in assigned {
            let start = committed
                .find_partition(&topic, partition)
                .and_then(|e| e.offset().to_raw())
                .filter(|o| *o >= 0);
            let bound = end.offset_of(&topic, partition);
            let key = topic_partition(&topic, partition);
            match (start, bound) {
                (Some(start), Some(bound)) if start < bound => {
                    behind = true;
                    self.next_offsets.insert(key.clone(), start);
                    bounds.insert(key, bound);
                }
                (None, Some(bound)) => {
                    // Never committed: the batch read from the beginning
                    // (or the end) up to its bound.
                    behind = true;
                    bounds.insert(key, bound);
                }
                (Some(start), _) => {
                    // Nothing of this partition in the replayed batch.
                    self.next_offsets.insert(key.clone(), start);
                    bounds.insert(key, start);
                }
                (None, None) => {
                    bounds.insert(key, 0);
                }
            }
        }
        if behind {
            tracing::info!(
                ?bounds,
                "the next batch replays up to the sink's recorded offsets"
            );
            self.end_offsets = Some(bounds);
            self.replaying = true;
        }
        Ok(behind)
    }

    fn abort(&mut self) -> Result<()> {
        match &self.transactions {
            Some(t) => t.abort(),
            None => Ok(()),
        }
    }

    fn rewind(&mut self) -> Result<bool> {
        self.fail_if_consumer_failed()?;
        let assigned = self.assigned();
        // Partitions paused past a plan's end are read again from their
        // commit too (the seeks below).
        let mut paused = TopicPartitionList::new();
        for (topic, partition) in self.paused_at_plan.keys() {
            paused.add_partition(topic, *partition);
        }
        if paused.count() > 0 {
            self.consumer
                .resume(&paused)
                .map_err(|e| Error::source_failed("resuming paused partitions", e))?;
        }
        self.paused_at_plan.clear();
        self.carried.clear();
        let committed = self.committed_offsets(&assigned)?;
        for e in committed.elements() {
            let (topic, partition) = (e.topic().to_string(), e.partition());
            let offset = match e.offset() {
                Offset::Offset(o) => Offset::Offset(o),
                _ if self.config.earliest => Offset::Beginning,
                _ => Offset::End,
            };
            // Seeking also drops what was prefetched from the partition.
            self.seek(&topic, partition, offset)?;
            let key = topic_partition(&topic, partition);
            self.first_uncommitted.remove(&key);
            match offset {
                Offset::Offset(o) => {
                    self.next_offsets.insert(key.clone(), o);
                    self.committed.insert(key, o);
                }
                _ => {
                    self.next_offsets.remove(&key);
                    self.committed.remove(&key);
                }
            }
        }
        self.committed_checkpoints.clear();
        // Every partition is read again from its commit, held ones too: the
        // replay must hold the whole aborted input, and it runs inside one
        // poll, which a held partition (released only between polls) would
        // block until the replay's deadline.
        if !self.held.is_empty() {
            let mut tpl = TopicPartitionList::new();
            for (topic, partition) in assigned.iter().filter(|(_, p)| self.held.contains_key(p)) {
                tpl.add_partition(topic, *partition);
            }
            self.consumer
                .resume(&tpl)
                .map_err(|e| Error::source_failed("resuming held partitions", e))?;
            self.held.clear();
        }
        // The next batch hands back every owned partition's checkpoint, as
        // after an assignment.
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .assigned
            .extend(assigned);
        tracing::info!("source rewound to the committed offsets");
        Ok(true)
    }

    fn offsets(&self) -> SourceOffsets {
        SourceOffsets::of_partitions(
            self.next_offsets
                .iter()
                .map(|((topic, partition), offset)| (&**topic, *partition, *offset)),
        )
    }

    fn latest_offsets(&self) -> SourceOffsets {
        let assigned = self.assigned();
        SourceOffsets::of_partitions(assigned.iter().filter_map(|(topic, partition)| {
            cached_high_watermark(&self.consumer, topic, *partition)
                .map(|high| (topic.as_str(), *partition, high))
        }))
    }

    fn partitions_caught_up(&self) -> BTreeSet<i32> {
        self.caught_up.clone()
    }

    fn caught_up_as_of_ms(&self) -> Option<i64> {
        self.planned_at_ms
    }

    fn assigned_inputs(&self) -> Vec<(String, i32)> {
        self.assigned()
    }

    fn lag(&self) -> Option<i64> {
        let mut lag = 0;
        for (topic, partition) in self.assigned() {
            let high = cached_high_watermark(&self.consumer, &topic, partition)?;
            let next = self
                .next_offsets
                .get(&topic_partition(&topic, partition))
                .copied()
                .unwrap_or(high);
            lag += (high - next).max(0);
        }
        Some(lag)
    }
}

/// The partition's end offset as last seen in fetch responses, without a
/// request to the broker (librdkafka's cached watermark).
fn cached_high_watermark(
    consumer: &BaseConsumer<SourceContext>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer lives as long as `consumer`; the out
    // parameters are valid for writes, and the call only reads local state.
    let code = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (code == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
        .then_some(high)
}

/// The record `m` carries, its topic's name shared.
fn record_of(m: &rdkafka::message::BorrowedMessage<'_>, topic: Arc<str>) -> Record {
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    Record {
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        timestamp_ms: m.timestamp().to_millis(),
        headers,
        position: SourcePosition::new(topic, m.partition(), m.offset()),
    }
}
