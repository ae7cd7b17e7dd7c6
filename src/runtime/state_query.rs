//! Interactive queries: reading the state a running query keeps, by key,
//! from other threads (Kafka Streams' interactive queries).
//!
//! A reader never touches the operators: it sends its request to the
//! query's loop, which answers between polls (and while it waits out a
//! trigger interval) from the tasks this instance runs, so that an answer
//! always reflects whole batches. A key this instance's tasks do not hold
//! is answered [`KeyLookup::NotHere`] with the partitions it does hold and
//! those still restoring: finding the instance that holds it is the
//! caller's (the HTTP service asks the group's other members).

use crate::operators::{KeyRange, QueryableState};
use crate::row::{Row, Value};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// At most this many typed readings of a text key are tried (each reads
/// every task's store): a key of many columns is read as text beyond it.
const MAX_KEY_READINGS: usize = 64;

/// At most this many requests are answered before the loop polls again:
/// readers cannot starve the query.
const MAX_ANSWERS_PER_POLL: usize = 32;

/// How long a reader waits for the loop: a batch in progress answers
/// after it, so this bounds the longest batch a read waits out.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a state read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateQueryError {
    /// No store of that name.
    #[error("no store `{name}`; the query's stores: {known:?}")]
    UnknownStore {
        /// The name asked for.
        name: String,
        /// The stores there are.
        known: Vec<String>,
    },
    /// The key does not have the store's number of columns.
    #[error("store `{store}` is keyed by {columns:?}: give {} value(s), got {given}", columns.len())]
    KeyArity {
        /// The store.
        store: String,
        /// Its key columns.
        columns: Vec<String>,
        /// How many values were given.
        given: usize,
    },
    /// The query is not running (not started, ended, or restarting):
    /// retry later.
    #[error("the query is not running; retry once it runs")]
    NotRunning,
    /// The loop did not answer in time (a long batch): retry.
    #[error("the query did not answer within {0:?} (a batch is running); retry")]
    Busy(Duration),
    /// Reading the store failed.
    #[error("reading store `{store}`: {reason}")]
    Store {
        /// The store.
        store: String,
        /// The underlying error.
        reason: String,
    },
}

impl StateQueryError {
    /// Whether asking again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            StateQueryError::NotRunning | StateQueryError::Busy(_) | StateQueryError::Store { .. }
        )
    }
}

/// One store a query keeps per task, as interactive queries name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoreDescription {
    /// `op<index>`: the name `describe` gives it and its changelog topic
    /// is made from.
    pub name: String,
    /// The operator that keeps it, as `describe` writes it.
    pub operator: String,
    /// What it holds: `window_aggregate`, `session_window`, `dedup`,
    /// `rolling_window`, `table`.
    pub kind: String,
    /// The columns a key is made of, in order.
    pub key_columns: Vec<String>,
}

/// A key's values, typed or as text (read from a URL: each is tried as
/// text, then as a number or boolean when it reads as one).
#[derive(Debug, Clone, PartialEq)]
pub enum KeyValues {
    /// Values in the store's key column order.
    Typed(Vec<Value>),
    /// Text values in the store's key column order.
    Text(Vec<String>),
}

impl KeyValues {
    fn len(&self) -> usize {
        match self {
            KeyValues::Typed(v) => v.len(),
            KeyValues::Text(v) => v.len(),
        }
    }

    /// The typed keys this may mean, the likeliest first (each text value
    /// as a string, a long, a double or a boolean when it reads as one).
    pub(super) fn candidates(&self) -> Vec<Vec<Value>> {
        let texts = match self {
            KeyValues::Typed(values) => return vec![values.clone()],
            KeyValues::Text(texts) => texts,
        };
        let mut keys: Vec<Vec<Value>> = vec![Vec::new()];
        for text in texts {
            let readings = text_readings(text);
            if keys.len() * readings.len() > MAX_KEY_READINGS {
                // A wide composite key: its text readings only beyond this.
                keys.iter_mut().for_each(|k| k.push(readings[0].clone()));
                continue;
            }
            keys = keys
                .into_iter()
                .flat_map(|key| {
                    readings.iter().map(move |value| {
                        let mut key = key.clone();
                        key.push(value.clone());
                        key
                    })
                })
                .collect();
        }
        keys
    }
}

/// What a key's text may mean: itself, a long (and the same double), a
/// double, a timestamp (RFC 3339), a boolean, null.
fn text_readings(text: &str) -> Vec<Value> {
    let mut readings = vec![Value::Str(Arc::from(text))];
    if let Ok(long) = text.parse::<i64>() {
        readings.push(Value::Long(long));
        readings.push(Value::Double(long as f64));
    } else if let Ok(double) = text.parse::<f64>() {
        readings.push(Value::Double(double));
    } else if let Some(time) = crate::time::parse_rfc3339(text) {
        readings.push(Value::Timestamp(time));
    }
    match text {
        "true" => readings.push(Value::Bool(true)),
        "false" => readings.push(Value::Bool(false)),
        "null" => readings.push(Value::Null),
        _ => {}
    }
    readings
}

/// What this instance knows of a key.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum KeyLookup {
    /// A task of this instance holds state for the key.
    Found {
        /// The task (input partition) holding it.
        partition: i32,
        /// The state, shaped like the operator's output rows.
        rows: Vec<Row>,
    },
    /// No task of this instance holds state for the key.
    NotHere {
        /// The partitions whose tasks run here (and were asked).
        partitions: Vec<i32>,
        /// Partitions assigned here whose state is still restoring: the
        /// key may be in one of them.
        restoring: Vec<i32>,
    },
}

/// A request to the query's loop.
pub(super) enum StateRequest {
    Stores(Sender<Result<Vec<StoreDescription>, StateQueryError>>),
    Get {
        store: String,
        key: KeyValues,
        range: KeyRange,
        reply: Sender<Result<KeyLookup, StateQueryError>>,
    },
}

/// The channel between readers and the query's loop. One service outlives
/// restarts of its query: give the same one to each rebuilt query, and
/// readers keep working across them.
#[derive(Clone)]
pub struct StateService {
    requests: Sender<StateRequest>,
    inbox: Arc<Mutex<Receiver<StateRequest>>>,
    /// Whether a loop answers: readers are told to retry at once when not.
    running: Arc<AtomicBool>,
}

impl Default for StateService {
    fn default() -> Self {
        let (requests, inbox) = mpsc::channel();
        StateService {
            requests,
            inbox: Arc::new(Mutex::new(inbox)),
            running: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl std::fmt::Debug for StateService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateService")
    }
}

impl StateService {
    /// A reader of the state of the query this service is given to.
    pub fn reader(&self) -> StateReader {
        StateReader {
            requests: self.requests.clone(),
            running: self.running.clone(),
        }
    }

    /// A loop starts (`true`) or stops answering; a stop tells the
    /// requests still waiting to retry.
    pub(super) fn set_running(&self, running: bool) {
        self.running.store(running, Ordering::SeqCst);
        if running {
            return;
        }
        if let Ok(inbox) = self.inbox.try_lock() {
            while let Ok(request) = inbox.try_recv() {
                refuse(request, StateQueryError::NotRunning);
            }
        }
    }

    /// Answers the requests waiting; with `wait`, waits that long for the
    /// first (the loop's idle time between triggers).
    pub(super) fn answer_requests(&self, holder: &mut dyn StateHolder, wait: Option<Duration>) {
        let Ok(inbox) = self.inbox.try_lock() else {
            // Another run of the query still holds it (a restart
            // overlapping its predecessor's end): wait as asked.
            if let Some(wait) = wait {
                std::thread::sleep(wait);
            }
            return;
        };
        // The service holds a sender: waiting never ends disconnected.
        let mut next = match wait {
            Some(wait) => inbox.recv_timeout(wait).ok(),
            None => inbox.try_recv().ok(),
        };
        let mut answered = 0;
        while let Some(request) = next {
            answer(request, holder);
            answered += 1;
            next = (answered < MAX_ANSWERS_PER_POLL)
                .then(|| inbox.try_recv().ok())
                .flatten();
        }
    }
}

fn refuse(request: StateRequest, error: StateQueryError) {
    match request {
        StateRequest::Stores(reply) => {
            let _ = reply.send(Err(error));
        }
        StateRequest::Get { reply, .. } => {
            let _ = reply.send(Err(error));
        }
    }
}

/// Reads a running query's state from any thread ([`crate::runtime::Query::stores`]).
#[derive(Clone)]
pub struct StateReader {
    requests: Sender<StateRequest>,
    running: Arc<AtomicBool>,
}

impl StateReader {
    /// The stores the query keeps.
    pub fn stores(&self) -> Result<Vec<StoreDescription>, StateQueryError> {
        let (reply, answer) = mpsc::channel();
        self.send(StateRequest::Stores(reply))?;
        wait(answer)?
    }

    /// The store named `name` (`op<index>`, as `describe` lists it).
    pub fn store(&self, name: &str) -> Result<StoreHandle, StateQueryError> {
        let stores = self.stores()?;
        match stores.iter().find(|s| s.name == name) {
            Some(description) => Ok(StoreHandle {
                reader: self.clone(),
                description: description.clone(),
            }),
            None => Err(StateQueryError::UnknownStore {
                name: name.to_string(),
                known: stores.into_iter().map(|s| s.name).collect(),
            }),
        }
    }

    /// Reads `key` in `store`, windows within `range`.
    pub fn get(
        &self,
        store: &str,
        key: KeyValues,
        range: KeyRange,
    ) -> Result<KeyLookup, StateQueryError> {
        let (reply, answer) = mpsc::channel();
        self.send(StateRequest::Get {
            store: store.to_string(),
            key,
            range,
            reply,
        })?;
        wait(answer)?
    }

    fn send(&self, request: StateRequest) -> Result<(), StateQueryError> {
        if !self.running.load(Ordering::SeqCst) {
            return Err(StateQueryError::NotRunning);
        }
        self.requests
            .send(request)
            .map_err(|_| StateQueryError::NotRunning)
    }
}

fn wait<T>(answer: Receiver<T>) -> Result<T, StateQueryError> {
    answer.recv_timeout(ANSWER_TIMEOUT).map_err(|e| match e {
        RecvTimeoutError::Timeout => StateQueryError::Busy(ANSWER_TIMEOUT),
        // The loop dropped the request: it ended before answering.
        RecvTimeoutError::Disconnected => StateQueryError::NotRunning,
    })
}

/// One store of a running query.
#[derive(Clone)]
pub struct StoreHandle {
    reader: StateReader,
    description: StoreDescription,
}

impl StoreHandle {
    pub(super) fn new(reader: StateReader, description: StoreDescription) -> Self {
        StoreHandle {
            reader,
            description,
        }
    }

    /// What the store is.
    pub fn description(&self) -> &StoreDescription {
        &self.description
    }

    /// The state this instance holds for `key` (values in the order of
    /// the store's key columns).
    pub fn get(&self, key: &[Value]) -> Result<KeyLookup, StateQueryError> {
        self.get_range(key, KeyRange::default())
    }

    /// As [`StoreHandle::get`], a window aggregation's windows limited to
    /// `range`.
    pub fn get_range(&self, key: &[Value], range: KeyRange) -> Result<KeyLookup, StateQueryError> {
        self.reader.get(
            &self.description.name,
            KeyValues::Typed(key.to_vec()),
            range,
        )
    }
}

/// The loop's side: what it needs to answer.
pub(super) trait StateHolder {
    /// The stores, from the plan.
    fn describe_stores(&self) -> Vec<StoreDescription>;
    /// Asks each running task's operator `index` for `key`.
    fn read_tasks(
        &mut self,
        index: usize,
        key: &[Value],
        range: &KeyRange,
    ) -> crate::error::Result<Option<(i32, Vec<Row>)>>;
    /// The partitions running here and those restoring.
    fn partitions(&self) -> (Vec<i32>, Vec<i32>);
}

fn answer(request: StateRequest, holder: &mut dyn StateHolder) {
    match request {
        StateRequest::Stores(reply) => {
            let _ = reply.send(Ok(holder.describe_stores()));
        }
        StateRequest::Get {
            store,
            key,
            range,
            reply,
        } => {
            let _ = reply.send(lookup(holder, &store, &key, &range));
        }
    }
}

fn lookup(
    holder: &mut dyn StateHolder,
    store: &str,
    key: &KeyValues,
    range: &KeyRange,
) -> Result<KeyLookup, StateQueryError> {
    let stores = holder.describe_stores();
    let Some(description) = stores.iter().find(|s| s.name == store) else {
        return Err(StateQueryError::UnknownStore {
            name: store.to_string(),
            known: stores.into_iter().map(|s| s.name).collect(),
        });
    };
    if key.len() != description.key_columns.len() {
        return Err(StateQueryError::KeyArity {
            store: store.to_string(),
            columns: description.key_columns.clone(),
            given: key.len(),
        });
    }
    let index: usize = store
        .strip_prefix("op")
        .and_then(|i| i.parse().ok())
        .expect("store names are op<index>");
    for candidate in key.candidates() {
        let found =
            holder
                .read_tasks(index, &candidate, range)
                .map_err(|e| StateQueryError::Store {
                    store: store.to_string(),
                    reason: e.to_string(),
                })?;
        if let Some((partition, rows)) = found {
            return Ok(KeyLookup::Found { partition, rows });
        }
    }
    let (partitions, restoring) = holder.partitions();
    Ok(KeyLookup::NotHere {
        partitions,
        restoring,
    })
}

/// The store description of operator `index` keeping `state`.
pub(super) fn store_description(
    index: usize,
    operator: String,
    state: QueryableState,
) -> StoreDescription {
    StoreDescription {
        name: format!("op{index}"),
        operator,
        kind: state.kind.to_string(),
        key_columns: state.key_columns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_keys_are_tried_as_text_then_as_what_they_read_as() {
        let key = KeyValues::Text(vec!["a".into(), "7".into()]);
        assert_eq!(
            key.candidates(),
            vec![
                vec![Value::Str("a".into()), Value::Str("7".into())],
                vec![Value::Str("a".into()), Value::Long(7)],
                vec![Value::Str("a".into()), Value::Double(7.0)],
            ]
        );
        let flag = KeyValues::Text(vec!["true".into()]);
        assert_eq!(flag.candidates().len(), 2);
        let time = KeyValues::Text(vec!["2026-01-01T10:00:00Z".into()]);
        assert_eq!(
            time.candidates()[1],
            vec![Value::Timestamp(
                crate::time::parse_rfc3339("2026-01-01T10:00:00Z").unwrap()
            )]
        );
        // A wide key of numbers is not tried in every combination.
        let wide = KeyValues::Text((0..10).map(|i| i.to_string()).collect());
        assert!(wide.candidates().len() <= MAX_KEY_READINGS);
    }

    #[test]
    fn a_reader_without_a_running_query_is_told_to_retry() {
        let service = StateService::default();
        let reader = service.reader();
        drop(service);
        let error = reader.stores().unwrap_err();
        assert_eq!(error, StateQueryError::NotRunning);
        assert!(error.is_retryable());
    }
}
