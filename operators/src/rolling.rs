//! Rolling windows (Databricks' `rollingWindow`): per key, aggregates over
//! the events in a look-back range that ends at a moving frontier, plus
//! lifetime aggregates over every accepted event.
//!
//! Each key keeps its events sorted by event time. An event with
//! `event_time > frontier` waits; a bounded measure over range `d` covers
//! `frontier - d <= event_time <= frontier`. Per measure, the events of the
//! range are folded into one accumulator that is updated as events enter
//! and leave: invertible aggregates (count, sum, avg) take a leaving event
//! back out; the others (min, max, variances, deviations, sketches, user
//! aggregates) keep a two-stacks queue (suffix aggregates of the oldest
//! events plus a running aggregate of the newest), so that every event is
//! folded O(1) times on average. A key's events are dropped once they left
//! every range; memory is proportional to the events inside the ranges.

use super::state_codec::{
    expired_by, expiry_key, parse_expiry_key, put_value, state_key, Reader, STATE_KEY_PREFIX,
};
use super::{
    encode_key_into, AggregateInput, AggregateSpec, BatchContext, KeyRange, Operator,
    QueryableState,
};
use crate::aggregate::{Accumulator, AggregateFn, MomentsAcc};
use crate::error::{Error, Result};
use crate::progress::StateOperatorProgress;
use crate::row::{Row, Value};
use crate::time::TimestampMicros;
use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use tidemark_state::StateStore;

type HashMap<K, V> = crate::CacheMap<K, V>;

/// The layout of a key's rolling state this release writes (after the
/// stored value's timer).
const STATE_VERSION: u8 = 1;

/// The store entry with the number of keys and of events stored.
const COUNTS: &[u8] = b"N";

/// The memory a cached key is reckoned to take, with `measures` measures
/// (events inside the ranges come on top). Measured: about 860 bytes with
/// two measures and one event (`bench/src/bin/state.rs --window rolling`).
fn cached_key_bytes(measures: usize) -> usize {
    768 + 64 * measures
}

/// Ranges longer than this log a warning (Databricks advises at most 7
/// days: the events of a range are state).
const LONG_RANGE_MICROS: i64 = 7 * 24 * 3600 * 1_000_000;

/// What the frontier follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FrontierBasis {
    /// Processing time minus the delay (Databricks' only option): fixed per
    /// micro-batch, moving continuously in real-time mode.
    #[default]
    ProcessingTime,
    /// The watermark in effect minus the delay: results depend on the input
    /// only, so a replay gives the same rows.
    EventTime,
}

/// The frontier: the operator's "now", `delay` behind its basis, written to
/// the output column `alias`.
///
/// ```
/// use tidemark_operators::FrontierSpec;
/// let f = FrontierSpec::new("5 seconds", Some("window_time")).unwrap();
/// assert_eq!(f.alias.as_ref(), "window_time");
/// assert_eq!(FrontierSpec::default().alias.as_ref(), "__frontier");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontierSpec {
    /// How far behind its basis the frontier stays, in microseconds.
    pub delay_micros: i64,
    /// The output column holding the frontier.
    pub alias: Arc<str>,
    /// What the frontier follows.
    pub basis: FrontierBasis,
}

impl Default for FrontierSpec {
    fn default() -> Self {
        FrontierSpec {
            delay_micros: 0,
            alias: Arc::from("__frontier"),
            basis: FrontierBasis::ProcessingTime,
        }
    }
}

impl FrontierSpec {
    /// A processing-time frontier `delay` behind (e.g. `"10 seconds"`),
    /// named `alias` (default `__frontier`).
    pub fn new(delay: &str, alias: Option<&str>) -> Result<Self> {
        let delay = crate::duration::parse_duration(delay)
            .map_err(|e| Error::config("frontier.delay", e.to_string()))?;
        Ok(FrontierSpec {
            delay_micros: tidemark_types::duration::micros(delay),
            alias: Arc::from(alias.unwrap_or("__frontier")),
            basis: FrontierBasis::ProcessingTime,
        })
    }

    /// Follows the watermark instead of processing time.
    pub fn on_event_time(mut self) -> Self {
        self.basis = FrontierBasis::EventTime;
        self
    }
}

/// One measure: an aggregate, bounded by a look-back range (`.over`) or
/// lifetime (no range).
///
/// ```
/// use tidemark_operators::RollingMeasure;
/// let m = RollingMeasure::of("sum", "revenue").unwrap().over("1 hour").unwrap();
/// assert_eq!(m.aggregate.output.as_ref(), "sum(revenue)");
/// assert!(m.over("2 hours").is_err(), "one range per measure");
/// ```
#[derive(Debug, Clone)]
pub struct RollingMeasure {
    /// Function, input and output name.
    pub aggregate: AggregateSpec,
    /// The look-back range in microseconds; `None` is a lifetime measure.
    pub range_micros: Option<i64>,
}

impl RollingMeasure {
    /// A lifetime measure of a built-in aggregate over `column` (`*` for
    /// `count(*)`), named as Spark names it.
    pub fn of(function: &str, column: &str) -> Result<Self> {
        let input = if column == "*" {
            AggregateInput::Star
        } else {
            AggregateInput::Column(Arc::from(column))
        };
        Ok(RollingMeasure {
            aggregate: AggregateSpec::new(AggregateFn::built_in(function)?, input),
            range_micros: None,
        })
    }

    /// A lifetime measure of any aggregate (user aggregates included).
    pub fn new(aggregate: AggregateSpec) -> Self {
        RollingMeasure {
            aggregate,
            range_micros: None,
        }
    }

    /// Bounds the measure to the events within `range` before the
    /// frontier (`preceding(Range(range))`); a measure takes one range.
    pub fn over(mut self, range: &str) -> Result<Self> {
        if self.range_micros.is_some() {
            return Err(Error::config(
                "measures.range",
                format!(
                    "`{}` already has a range: a measure takes at most one `.over`",
                    self.aggregate.output
                ),
            ));
        }
        let d = crate::duration::parse_duration(range)
            .map_err(|e| Error::config("measures.range", e.to_string()))?;
        if d.is_zero() {
            return Err(Error::config(
                "measures.range",
                "a range must be longer than zero",
            ));
        }
        self.range_micros = Some(tidemark_types::duration::micros(d));
        Ok(self)
    }

    /// Renames the output column.
    pub fn alias(mut self, name: &str) -> Self {
        self.aggregate = self.aggregate.alias(name);
        self
    }

    fn input<'a>(&self, row: &'a Row) -> &'a Value {
        const STAR: Value = Value::Bool(true);
        match &self.aggregate.input {
            AggregateInput::Star => &STAR,
            AggregateInput::Column(c) => row.get(c).unwrap_or(&Value::Null),
            // Refused when the window is built.
            AggregateInput::By { .. } => &Value::Null,
        }
    }
}

/// One accepted event of a key: its time and each measure's input.
#[derive(Debug, Clone)]
struct Event {
    time: TimestampMicros,
    inputs: Vec<Value>,
}

/// Spark's `sum` kept so that values can be taken back out: long in, long
/// out; any double makes it double; NULL over no values.
#[derive(Debug, Clone, Default)]
struct InvertibleSum {
    longs: i64,
    doubles: f64,
    /// Neumaier compensation of `doubles`, so that adding and removing
    /// values for days does not drift.
    compensation: f64,
    long_values: u64,
    double_values: u64,
}

impl InvertibleSum {
    fn add_double(&mut self, x: f64) {
        let t = self.doubles + x;
        if self.doubles.abs() >= x.abs() {
            self.compensation += (self.doubles - t) + x;
        } else {
            self.compensation += (x - t) + self.doubles;
        }
        self.doubles = t;
    }

    fn apply(&mut self, v: &Value, sign: i64) {
        match v {
            Value::Long(x) => {
                self.longs = self.longs.wrapping_add(x.wrapping_mul(sign));
                self.long_values = self.long_values.wrapping_add_signed(sign);
            }
            Value::Double(x) => {
                self.add_double(*x * sign as f64);
                self.double_values = self.double_values.wrapping_add_signed(sign);
            }
            _ => {}
        }
        if self.double_values == 0 {
            // Exactly zero again: no rounding error carried forward.
            self.doubles = 0.0;
            self.compensation = 0.0;
        }
    }

    fn value(&self) -> Value {
        match (self.long_values, self.double_values) {
            (0, 0) => Value::Null,
            (_, 0) => Value::Long(self.longs),
            _ => Value::Double(self.longs as f64 + self.doubles + self.compensation),
        }
    }
}

/// The aggregate of one bounded measure over the events in its range.
enum RangeAggregate {
    /// `count`: plus and minus one.
    Count(i64),
    /// `sum`.
    Sum(InvertibleSum),
    /// `avg`: Welford moments, taken out in reverse.
    Moments(Accumulator),
    /// Everything else (min, max, sketches, user aggregates): two stacks.
    Stacks(TwoStacks),
}

/// Sliding-window aggregation with two stacks: `front` holds suffix
/// aggregates of the oldest events (its last entry covers all of them),
/// `back` the running aggregate of the rest. Removing the oldest event pops
/// `front`, rebuilding it from the window's events when empty; each event
/// is folded a constant number of times on average.
struct TwoStacks {
    front: Vec<Accumulator>,
    back: Accumulator,
}

fn moments_input(v: &Value) -> Option<f64> {
    match v {
        Value::Timestamp(_) => None,
        other => other.as_f64(),
    }
}

impl RangeAggregate {
    fn new(function: &AggregateFn) -> Self {
        match function.built_in_name() {
            Some("count") => RangeAggregate::Count(0),
            Some("sum") => RangeAggregate::Sum(InvertibleSum::default()),
            // Variances and deviations take the two stacks: taking values
            // back out of moments leaves a rounding residue that a square
            // root turns into a visible deviation over equal values (1e-8
            // instead of 0), and a restart, recomputing from scratch, would
            // then write the key again.
            Some("avg" | "mean") => RangeAggregate::Moments(function.zero()),
            _ => RangeAggregate::Stacks(TwoStacks {
                front: Vec::new(),
                back: function.zero(),
            }),
        }
    }

    /// Folds in an event at position `index` of the range (0 = oldest).
    fn insert(&mut self, function: &AggregateFn, index: usize, input: &Value) {
        match self {
            RangeAggregate::Count(n) => *n += i64::from(!input.is_null()),
            RangeAggregate::Sum(s) => s.apply(input, 1),
            RangeAggregate::Moments(acc) => function.reduce(acc, input),
            RangeAggregate::Stacks(stacks) => {
                if index < stacks.front.len() {
                    // An out-of-order event among the oldest: fold the
                    // front into the back (aggregates are commutative);
                    // the next removal rebuilds the front.
                    if let Some(all) = stacks.front.last() {
                        let mut merged = function.clone_acc(all);
                        function.merge(&mut merged, &stacks.back);
                        stacks.back = merged;
                    }
                    stacks.front.clear();
                }
                function.reduce(&mut stacks.back, input);
            }
        }
    }

    /// Takes out the oldest event of the range; `range` lists the inputs of
    /// the range's events, oldest first, the leaving one included.
    fn remove_oldest<'a>(
        &mut self,
        function: &AggregateFn,
        input: &Value,
        range: impl DoubleEndedIterator<Item = &'a Value>,
    ) {
        match self {
            RangeAggregate::Count(n) => *n -= i64::from(!input.is_null()),
            RangeAggregate::Sum(s) => s.apply(input, -1),
            RangeAggregate::Moments(acc) => {
                if let (Some(x), Some(m)) = (moments_input(input), acc.downcast_mut::<MomentsAcc>())
                {
                    m.remove(x);
                }
            }
            RangeAggregate::Stacks(stacks) => {
                if stacks.front.is_empty() {
                    let mut suffix = function.zero();
                    for v in range.rev() {
                        function.reduce(&mut suffix, v);
                        stacks.front.push(function.clone_acc(&suffix));
                    }
                    stacks.back = function.zero();
                }
                stacks.front.pop();
            }
        }
    }

    fn value(&self, function: &AggregateFn) -> Value {
        match self {
            RangeAggregate::Count(n) => Value::Long(*n),
            RangeAggregate::Sum(s) => s.value(),
            RangeAggregate::Moments(acc) => function.finish(acc),
            RangeAggregate::Stacks(stacks) => match stacks.front.last() {
                None => function.finish(&stacks.back),
                Some(front) => {
                    let mut all = function.clone_acc(front);
                    function.merge(&mut all, &stacks.back);
                    function.finish(&all)
                }
            },
        }
    }
}

/// The state of one key.
struct KeyState {
    key_values: Vec<Value>,
    /// Sorted by time; `events[..entered]` have reached the frontier, the
    /// rest wait for it.
    events: VecDeque<Event>,
    entered: usize,
    /// Per bounded measure: the first event of its range.
    lows: Vec<usize>,
    ranges: Vec<RangeAggregate>,
    /// Per lifetime measure.
    lifetime: Vec<Accumulator>,
    /// What the key last emitted; `None`: nothing yet.
    last_emitted: Option<Vec<Value>>,
    /// The frontier the key was last brought to.
    frontier: TimestampMicros,
    /// When the key's values next change as the frontier moves: the
    /// registered timer.
    timer: Option<TimestampMicros>,
    /// Listed in `touched` (micro-batch: settles at the batch's end).
    touched: bool,
    /// Listed in `dirty` (written at the next checkpoint).
    dirty: bool,
    /// What the store holds for the key; `None`: nothing.
    stored: Option<Stored>,
}

/// What the store holds for a key, as last written or read: the timer its
/// index entry is under, and its number of events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stored {
    timer: Option<TimestampMicros>,
    events: usize,
}

/// The keys whose stored state is behind their state in memory. Tracked
/// only with a store: without one a checkpoint writes nothing, and listing
/// every changed key would cost it a pass over them all.
#[derive(Default)]
struct ChangedKeys {
    tracking: bool,
    keys: Vec<Vec<u8>>,
}

/// The rolling-window operator. Output mode update only; one row per key
/// whose measure values changed (micro-batch: at most one per batch, at the
/// batch's frontier; real-time: whenever they change).
pub struct RollingWindow {
    spec: RollingSpec,
    keys: HashMap<Vec<u8>, Box<KeyState>>,
    /// (time, key) of the next change of every key whose values will
    /// change as the frontier moves.
    timers: BTreeSet<(TimestampMicros, Vec<u8>)>,
    /// Keys touched in this batch (micro-batch mode).
    touched: Vec<Vec<u8>>,
    /// Keys changed (or forgotten) since the last checkpoint.
    dirty: ChangedKeys,
    /// The key of the row at hand, reused.
    key_buffer: Vec<u8>,
    store: Option<Box<dyn StateStore>>,
    /// Reading through the store: at most this many keys stay in memory
    /// between batches; the store's index (`E` + timer + key) finds the
    /// others whose timers are due.
    max_cached_keys: Option<usize>,
    /// Keys forgotten since the last checkpoint that the store still holds.
    forgotten: HashMap<Vec<u8>, Stored>,
    /// Keys and events in the store (with a store).
    stored_keys: u64,
    stored_events: u64,
    /// The earliest timer in the store's index at the last checkpoint.
    next_stored_timer: Option<TimestampMicros>,
    dropped_by_watermark: u64,
    late_rows: Vec<Row>,
    rows_updated: u64,
    rows_removed: u64,
}

/// What the operator computes: columns, frontier and measures, and the
/// per-key logic (kept apart from the keys so that one key's state can be
/// borrowed while the spec is read).
struct RollingSpec {
    partition_by: Vec<Arc<str>>,
    order_by: Arc<str>,
    frontier: FrontierSpec,
    /// Bounded measures' positions in `measures`, and lifetime ones'.
    bounded: Vec<usize>,
    lifetime: Vec<usize>,
    measures: Vec<RollingMeasure>,
    /// The values of a key that never emitted: counts 0, others null.
    empty: Vec<Value>,
}

impl RollingWindow {
    /// Reads `bytes` as a key's stored state (the fuzz targets).
    pub(crate) fn decode_for_fuzzing(&self, bytes: &[u8]) -> Result<()> {
        self.spec.read_for_fuzzing(bytes)
    }

    /// A rolling window over events grouped by `partition_by`, ordered by
    /// the timestamp column `order_by`.
    ///
    /// ```
    /// use tidemark_operators::{FrontierSpec, RollingMeasure, RollingWindow};
    /// let op = RollingWindow::new(
    ///     &["user_id"],
    ///     "event_time",
    ///     FrontierSpec::new("0 seconds", Some("frontier")).unwrap(),
    ///     vec![
    ///         RollingMeasure::of("sum", "value").unwrap().over("10 minutes").unwrap(),
    ///         RollingMeasure::of("count", "value").unwrap().alias("n"),
    ///     ],
    /// ).unwrap();
    /// ```
    pub fn new<S: AsRef<str>>(
        partition_by: &[S],
        order_by: &str,
        frontier: FrontierSpec,
        measures: Vec<RollingMeasure>,
    ) -> Result<Self> {
        if partition_by.is_empty() {
            return Err(Error::config(
                "rolling_window.partition_by",
                "needs at least one column",
            ));
        }
        if measures.is_empty() {
            return Err(Error::config(
                "rolling_window.measures",
                "needs at least one measure",
            ));
        }
        let mut seen = BTreeSet::new();
        for m in &measures {
            if matches!(m.aggregate.input, AggregateInput::By { .. }) {
                return Err(Error::config(
                    "rolling_window.measures",
                    format!(
                        "`{}` is a window_aggregate aggregate, not a rolling measure",
                        m.aggregate.output
                    ),
                ));
            }
            if !seen.insert(m.aggregate.output.clone()) {
                return Err(Error::config(
                    "rolling_window.measures",
                    format!(
                        "two measures are named `{}`; rename one with `as`",
                        m.aggregate.output
                    ),
                ));
            }
            if let Some(d) = m.range_micros {
                if d > LONG_RANGE_MICROS {
                    tracing::warn!(
                        measure = %m.aggregate.output,
                        "range over 7 days: its events are kept as state"
                    );
                }
            }
        }
        let bounded = (0..measures.len())
            .filter(|&i| measures[i].range_micros.is_some())
            .collect();
        let lifetime = (0..measures.len())
            .filter(|&i| measures[i].range_micros.is_none())
            .collect();
        let empty = measures
            .iter()
            .map(|m| {
                let f = &m.aggregate.function;
                f.finish(&f.zero())
            })
            .collect();
        Ok(RollingWindow {
            spec: RollingSpec {
                partition_by: partition_by.iter().map(|c| Arc::from(c.as_ref())).collect(),
                order_by: Arc::from(order_by),
                frontier,
                bounded,
                lifetime,
                measures,
                empty,
            },
            keys: HashMap::default(),
            timers: BTreeSet::new(),
            touched: Vec::new(),
            dirty: ChangedKeys::default(),
            key_buffer: Vec::new(),
            store: None,
            max_cached_keys: None,
            forgotten: HashMap::default(),
            stored_keys: 0,
            stored_events: 0,
            next_stored_timer: None,
            dropped_by_watermark: 0,
            late_rows: Vec::new(),
            rows_updated: 0,
            rows_removed: 0,
        })
    }

    /// The output columns: partition keys, frontier, measures.
    pub fn output_columns(&self) -> Vec<Arc<str>> {
        let spec = &self.spec;
        let mut out = spec.partition_by.clone();
        out.push(spec.frontier.alias.clone());
        out.extend(spec.measures.iter().map(|m| m.aggregate.output.clone()));
        out
    }

    /// Marks `key` to be written at the next checkpoint (when there is a
    /// store to write it to).
    fn mark_dirty(dirty: &mut ChangedKeys, state: &mut KeyState, key: &[u8]) {
        if dirty.tracking && !state.dirty {
            state.dirty = true;
            dirty.keys.push(key.to_vec());
        }
    }

    /// Emits the key's row if its values changed, re-registers its timer,
    /// and forgets a key with nothing left to remember.
    fn settle(&mut self, key: &[u8], out: &mut Vec<Row>) {
        let spec = &self.spec;
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        let values = spec.values(state);
        let last = state.last_emitted.as_ref().unwrap_or(&spec.empty);
        if !same_values(last, &values) {
            out.push(spec.output_row(state, &values));
            state.last_emitted = Some(values);
            Self::mark_dirty(&mut self.dirty, state, key);
        }
        let next = spec.next_change(state);
        if next != state.timer {
            if let Some(t) = state.timer {
                self.timers.remove(&(t, key.to_vec()));
            }
            if let Some(t) = next {
                self.timers.insert((t, key.to_vec()));
            }
            state.timer = next;
        }
        let forgettable = spec.lifetime.is_empty()
            && state.events.is_empty()
            && state
                .last_emitted
                .as_ref()
                .is_none_or(|v| same_values(v, &spec.empty));
        if forgettable {
            Self::mark_dirty(&mut self.dirty, state, key);
            if let Some(stored) = state.stored {
                self.forgotten.insert(key.to_vec(), stored);
            }
            self.keys.remove(key);
            self.rows_removed += 1;
        }
    }

    /// Brings every key whose values change by `frontier` to it and emits
    /// those that changed; reading through the store, first loads the keys
    /// whose stored timers are due.
    fn fire_timers(&mut self, frontier: TimestampMicros, out: &mut Vec<Row>) -> Result<()> {
        if let (Some(_), Some(store)) = (self.max_cached_keys, self.store.as_ref()) {
            for (index_key, _) in expired_by(store.as_ref(), frontier)? {
                let Some((_, key)) = parse_expiry_key(&index_key) else {
                    continue;
                };
                if !self.keys.contains_key(key) && !self.forgotten.contains_key(key) {
                    if let Some(state) = self.load_key(key)? {
                        self.cache_key(key.to_vec(), state);
                    }
                }
            }
        }
        while let Some((t, key)) = self.timers.first().cloned() {
            if t > frontier {
                break;
            }
            self.timers.pop_first();
            if let Some(state) = self.keys.get_mut(&key) {
                state.timer = None;
                self.spec.advance(state, frontier);
                Self::mark_dirty(&mut self.dirty, state, &key);
                self.settle(&key, out);
            }
        }
        Ok(())
    }

    /// Reads a key from the store; its timer is registered when cached.
    fn load_key(&self, key: &[u8]) -> Result<Option<KeyState>> {
        let Some(store) = self.store.as_ref() else {
            return Ok(None);
        };
        let Some(bytes) = store.get(&state_key(key))? else {
            return Ok(None);
        };
        Ok(Some(self.spec.read_stored(&bytes)?))
    }

    /// Puts a key read from the store in memory, with its timer.
    fn cache_key(&mut self, key: Vec<u8>, state: KeyState) {
        if let Some(t) = state.timer {
            self.timers.insert((t, key.clone()));
        }
        self.keys.insert(key, Box::new(state));
    }

    /// Brings the row's key into memory: from the store when it holds it,
    /// new otherwise (a key forgotten in this batch starts anew).
    fn open_key(&mut self, key: &[u8], row: &Row) -> Result<()> {
        let forgotten = self.forgotten.remove(key);
        if forgotten.is_none() && self.max_cached_keys.is_some() {
            if let Some(state) = self.load_key(key)? {
                self.cache_key(key.to_vec(), state);
                return Ok(());
            }
        }
        let key_values = self
            .spec
            .partition_by
            .iter()
            .map(|c| row.get(c).cloned().unwrap_or(Value::Null))
            .collect();
        let mut state = self.spec.new_key(key_values);
        state.stored = forgotten;
        self.keys.insert(key.to_vec(), Box::new(state));
        Ok(())
    }

    /// The store entries that write `key`'s state, or delete it, with its
    /// index entry; keeps the stored counts.
    fn stored_changes(
        &mut self,
        key: &[u8],
        entries: &mut Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ) -> Result<()> {
        let (old, new) = match self.keys.get_mut(key) {
            Some(state) => {
                // Encoded first: a failure leaves the key dirty and its
                // stored counts untouched.
                let bytes = self.spec.encode_stored(state)?;
                state.dirty = false;
                let new = Stored {
                    timer: state.timer,
                    events: state.events.len(),
                };
                let old = state.stored.replace(new);
                entries.push((state_key(key), Some(bytes)));
                (old, Some(new))
            }
            None => match self.forgotten.remove(key) {
                Some(old) => {
                    entries.push((state_key(key), None));
                    (Some(old), None)
                }
                None => return Ok(()),
            },
        };
        let (old_timer, new_timer) = (old.and_then(|o| o.timer), new.and_then(|n| n.timer));
        if old_timer != new_timer {
            if let Some(t) = old_timer {
                entries.push((expiry_key(t, key), None));
            }
            if let Some(t) = new_timer {
                entries.push((expiry_key(t, key), Some(Vec::new())));
            }
        }
        self.stored_keys =
            (self.stored_keys + new.is_some() as u64).saturating_sub(old.is_some() as u64);
        self.stored_events = (self.stored_events + new.map_or(0, |n| n.events) as u64)
            .saturating_sub(old.map_or(0, |o| o.events) as u64);
        Ok(())
    }

    /// Keys and events held: the store's counts, with the changes not
    /// yet written (progress is reported before the checkpoint).
    fn live_counts(&self) -> (u64, u64) {
        let mut dirty: Vec<&Vec<u8>> = self.dirty.keys.iter().collect();
        dirty.sort();
        dirty.dedup();
        let (mut keys, mut events) = (self.stored_keys as i64, self.stored_events as i64);
        for key in dirty {
            let state = self.keys.get(key);
            let old = match state {
                Some(state) => state.stored,
                None => self.forgotten.get(key).copied(),
            };
            keys += state.is_some() as i64 - old.is_some() as i64;
            events +=
                state.map_or(0, |s| s.events.len()) as i64 - old.map_or(0, |o| o.events) as i64;
        }
        (keys.max(0) as u64, events.max(0) as u64)
    }

    /// The stored counts as one entry.
    fn counts_entry(&self) -> (Vec<u8>, Option<Vec<u8>>) {
        let mut value = self.stored_keys.to_le_bytes().to_vec();
        value.extend(self.stored_events.to_le_bytes());
        (COUNTS.to_vec(), Some(value))
    }

    /// After a checkpoint, when the store holds everything: keeps at most
    /// `max_keys` keys in memory, with their timers, and notes the
    /// store's earliest timer.
    fn shrink_to(&mut self, max_keys: usize) -> Result<()> {
        if self.keys.len() > max_keys {
            super::shrink_cache(&mut self.keys, max_keys * 3 / 4, max_keys);
            let keys = &self.keys;
            self.timers.retain(|(_, key)| keys.contains_key(key));
        }
        self.next_stored_timer = match self.store.as_ref() {
            Some(store) => first_timer(store.as_ref())?,
            None => None,
        };
        Ok(())
    }

    /// Restores state from the store: every key into memory, or (reading
    /// through) the counts and the earliest timer only. A store written
    /// before the `K`/`E`/`N` layout is rewritten into it first.
    fn restore(&mut self, store: &mut dyn StateStore) -> Result<()> {
        let counts = match store.get(COUNTS)? {
            Some(bytes) => Some(bytes),
            None => {
                self.migrate(store)?;
                store.get(COUNTS)?
            }
        };
        (self.stored_keys, self.stored_events) = match counts {
            Some(bytes) => {
                let mut r = Reader(&bytes);
                (r.i64()? as u64, r.i64()? as u64)
            }
            None => (0, 0),
        };
        if self.max_cached_keys.is_some() {
            self.next_stored_timer = first_timer(store)?;
            return Ok(());
        }
        for (key, bytes) in store.prefix(STATE_KEY_PREFIX)? {
            let key = key[STATE_KEY_PREFIX.len()..].to_vec();
            let state = self.spec.read_stored(&bytes)?;
            self.cache_key(key, state);
        }
        Ok(())
    }

    /// Rewrites a store of the first layout (each key's state under the
    /// bare key) into `K` + key, the timer index and the counts.
    fn migrate(&mut self, store: &mut dyn StateStore) -> Result<()> {
        let old_entries = store.prefix(b"")?;
        if old_entries.is_empty() {
            // A new store: nothing to write until the first checkpoint.
            return Ok(());
        }
        let mut entries = Vec::new();
        for (key, bytes) in old_entries {
            let mut state = self.spec.decode_state(&bytes)?;
            state.timer = self.spec.next_change(&state);
            entries.push((key.clone(), None));
            self.keys.insert(key.clone(), Box::new(state));
            self.stored_changes(&key, &mut entries)?;
        }
        entries.push(self.counts_entry());
        store.write_batch(&entries)?;
        self.keys.clear();
        Ok(())
    }
}

/// The earliest timer in a store's index.
fn first_timer(store: &dyn StateStore) -> Result<Option<TimestampMicros>> {
    let first = store.first_in_range(
        &expiry_key(TimestampMicros::MIN, b""),
        &expiry_key(TimestampMicros::MAX, b""),
    )?;
    Ok(first.and_then(|(k, _)| parse_expiry_key(&k).map(|(t, _)| t)))
}

impl RollingSpec {
    /// The frontier for `ctx`: in real-time mode it moves with the wall
    /// clock; otherwise it is fixed for the batch.
    fn frontier_at(&self, ctx: &BatchContext) -> TimestampMicros {
        let basis = match (self.frontier.basis, ctx.real_time) {
            (FrontierBasis::EventTime, _) => ctx.watermark,
            (FrontierBasis::ProcessingTime, true) => crate::time::now_micros(),
            (FrontierBasis::ProcessingTime, false) => ctx.processing_time,
        };
        basis.saturating_sub(self.frontier.delay_micros)
    }

    /// The row a key emits with `values`: key columns, the key's
    /// frontier, the measures.
    fn output_row(&self, state: &KeyState, values: &[Value]) -> Row {
        let mut row = Row::with_capacity(self.partition_by.len() + 1 + values.len());
        for (column, value) in self.partition_by.iter().zip(&state.key_values) {
            row.set(column.clone(), value.clone());
        }
        row.set(
            self.frontier.alias.clone(),
            Value::Timestamp(state.frontier),
        );
        for (m, v) in self.measures.iter().zip(values) {
            row.set(m.aggregate.output.clone(), v.clone());
        }
        row
    }

    fn new_key(&self, key_values: Vec<Value>) -> KeyState {
        KeyState {
            key_values,
            events: VecDeque::new(),
            entered: 0,
            lows: vec![0; self.bounded.len()],
            ranges: self
                .bounded
                .iter()
                .map(|&i| RangeAggregate::new(&self.measures[i].aggregate.function))
                .collect(),
            lifetime: self
                .lifetime
                .iter()
                .map(|&i| self.measures[i].aggregate.function.zero())
                .collect(),
            last_emitted: None,
            frontier: TimestampMicros::MIN,
            timer: None,
            touched: false,
            dirty: false,
            stored: None,
        }
    }

    /// Brings `key` to `frontier`: waiting events that it reached enter,
    /// events that fell out of a range leave it.
    fn advance(&self, state: &mut KeyState, frontier: TimestampMicros) {
        if frontier <= state.frontier {
            return;
        }
        state.frontier = frontier;
        while state.entered < state.events.len() && state.events[state.entered].time <= frontier {
            let index = state.entered;
            state.entered += 1;
            self.fold_lifetime(state, index);
            // The newest entered event: appended to every range, then
            // taken out below if it is already too old for some.
            for slot in 0..self.bounded.len() {
                self.insert_in_range(state, slot, index);
            }
        }
        for (slot, &measure) in self.bounded.iter().enumerate() {
            let function = &self.measures[measure].aggregate.function;
            let range = self.measures[measure].range_micros.unwrap_or(0);
            let low = frontier.saturating_sub(range);
            while state.lows[slot] < state.entered && state.events[state.lows[slot]].time < low {
                let first = state.lows[slot];
                let inputs = state
                    .events
                    .range(first..state.entered)
                    .map(|e| &e.inputs[measure]);
                let leaving = &state.events[first].inputs[measure];
                state.ranges[slot].remove_oldest(function, leaving, inputs);
                state.lows[slot] += 1;
            }
        }
        self.drop_left_events(state);
    }

    /// Folds the event at `index` into the lifetime measures.
    fn fold_lifetime(&self, state: &mut KeyState, index: usize) {
        for (slot, &measure) in self.lifetime.iter().enumerate() {
            let input = &state.events[index].inputs[measure];
            self.measures[measure]
                .aggregate
                .function
                .reduce(&mut state.lifetime[slot], input);
        }
    }

    /// Folds the event at `index` (at or after the range's first) into
    /// bounded measure `slot`.
    fn insert_in_range(&self, state: &mut KeyState, slot: usize, index: usize) {
        let measure = self.bounded[slot];
        let function = &self.measures[measure].aggregate.function;
        let position = index - state.lows[slot];
        let input = &state.events[index].inputs[measure];
        state.ranges[slot].insert(function, position, input);
    }

    /// Places the entered event at `index`, which no range has seen, in
    /// the ranges it falls in at the key's frontier; for the others it
    /// lies before the range (at or before its first event).
    fn place_in_ranges(&self, state: &mut KeyState, index: usize) {
        let time = state.events[index].time;
        for (slot, &measure) in self.bounded.iter().enumerate() {
            let range = self.measures[measure].range_micros.unwrap_or(0);
            if time < state.frontier.saturating_sub(range) {
                state.lows[slot] += 1;
            } else {
                self.insert_in_range(state, slot, index);
            }
        }
    }

    /// Accepts one event at the key's current frontier.
    fn accept(&self, state: &mut KeyState, time: TimestampMicros, row: &Row) {
        let inputs: Vec<Value> = self.measures.iter().map(|m| m.input(row).clone()).collect();
        // Entered events have times at or before the frontier, waiting ones
        // after it: the sorted position also tells which the event is.
        let at = state.events.partition_point(|e| e.time <= time);
        state.events.insert(at, Event { time, inputs });
        if time > state.frontier {
            // Waits for the frontier.
            return;
        }
        state.entered += 1;
        self.fold_lifetime(state, at);
        self.place_in_ranges(state, at);
        self.drop_left_events(state);
    }

    /// Drops the events every range has left.
    fn drop_left_events(&self, state: &mut KeyState) {
        let gone = state.lows.iter().copied().min().unwrap_or(state.entered);
        if gone > 0 {
            state.events.drain(..gone);
            state.entered -= gone;
            for low in state.lows.iter_mut() {
                *low -= gone;
            }
        }
    }

    /// When the key's values next change as the frontier moves.
    fn next_change(&self, state: &KeyState) -> Option<TimestampMicros> {
        let waiting = state.events.get(state.entered).map(|e| e.time);
        let leaving = self.bounded.iter().enumerate().filter_map(|(slot, &i)| {
            let first = state.events.get(state.lows[slot])?;
            (state.lows[slot] < state.entered)
                .then(|| first.time + self.measures[i].range_micros.unwrap_or(0) + 1)
        });
        waiting.into_iter().chain(leaving).min()
    }

    fn values(&self, state: &KeyState) -> Vec<Value> {
        let mut values = vec![Value::Null; self.measures.len()];
        for (slot, &i) in self.bounded.iter().enumerate() {
            values[i] = state.ranges[slot].value(&self.measures[i].aggregate.function);
        }
        for (slot, &i) in self.lifetime.iter().enumerate() {
            values[i] = self.measures[i]
                .aggregate
                .function
                .finish(&state.lifetime[slot]);
        }
        values
    }

    fn encode_state(&self, state: &KeyState) -> Result<Vec<u8>> {
        let mut out = vec![STATE_VERSION];
        out.extend((state.key_values.len() as u16).to_le_bytes());
        for v in &state.key_values {
            put_value(v, &mut out);
        }
        out.extend(state.frontier.to_le_bytes());
        match &state.last_emitted {
            None => out.push(0),
            Some(values) => {
                out.push(1);
                for v in values {
                    put_value(v, &mut out);
                }
            }
        }
        for (slot, &i) in self.lifetime.iter().enumerate() {
            let bytes = self.measures[i]
                .aggregate
                .function
                .encode(&state.lifetime[slot])?;
            out.extend((bytes.len() as u32).to_le_bytes());
            out.extend(bytes);
        }
        // Events that already left some range are kept in full: the ranges
        // are rebuilt from the frontier when the state is read back.
        out.extend((state.events.len() as u32).to_le_bytes());
        out.extend((state.entered as u32).to_le_bytes());
        for e in &state.events {
            out.extend(e.time.to_le_bytes());
            for v in &e.inputs {
                put_value(v, &mut out);
            }
        }
        Ok(out)
    }

    /// A key's state as stored: the timer its index entry is under (a
    /// flag, then 8 bytes), then [`Self::encode_state`].
    fn encode_stored(&self, state: &KeyState) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        match state.timer {
            Some(t) => {
                out.push(1);
                out.extend(t.to_le_bytes());
            }
            None => out.push(0),
        }
        out.extend(self.encode_state(state)?);
        Ok(out)
    }

    /// A key read back from the store: what the store holds for it, and
    /// its timer recomputed from its events.
    fn read_stored(&self, bytes: &[u8]) -> Result<KeyState> {
        let (mut state, indexed) = self.decode_stored(bytes)?;
        state.stored = Some(Stored {
            timer: indexed,
            events: state.events.len(),
        });
        state.timer = self.next_change(&state);
        Ok(state)
    }

    /// Reads what [`Self::encode_stored`] wrote, then its timer as a
    /// restore does.
    fn read_for_fuzzing(&self, bytes: &[u8]) -> Result<()> {
        let (state, _) = self.decode_stored(bytes)?;
        self.next_change(&state);
        Ok(())
    }

    /// Reads what [`Self::encode_stored`] wrote.
    fn decode_stored(&self, bytes: &[u8]) -> Result<(KeyState, Option<TimestampMicros>)> {
        let mut r = Reader(bytes);
        let timer = match r.u8()? {
            0 => None,
            _ => Some(r.i64()?),
        };
        Ok((self.decode_state(r.0)?, timer))
    }

    fn decode_state(&self, bytes: &[u8]) -> Result<KeyState> {
        let mut r = Reader(bytes);
        r.version("rolling window", STATE_VERSION)?;
        let n = r.u16()? as usize;
        let key_values = (0..n).map(|_| r.value()).collect::<Result<Vec<_>>>()?;
        let mut state = self.new_key(key_values);
        let frontier = r.i64()?;
        state.last_emitted = match r.u8()? {
            0 => None,
            _ => Some(
                (0..self.measures.len())
                    .map(|_| r.value())
                    .collect::<Result<_>>()?,
            ),
        };
        for (slot, &i) in self.lifetime.iter().enumerate() {
            let len = r.u32()? as usize;
            state.lifetime[slot] = self.measures[i].aggregate.function.decode(r.take(len)?)?;
        }
        let events = r.u32()? as usize;
        let entered = r.u32()? as usize;
        // The count comes from stored bytes: a corrupt one must fail the
        // read below, not ask for terabytes here (each event takes at least
        // its 8-byte time).
        let mut list = VecDeque::with_capacity(events.min(r.0.len() / 8));
        for _ in 0..events {
            let time = r.i64()?;
            let inputs = (0..self.measures.len())
                .map(|_| r.value())
                .collect::<Result<Vec<_>>>()?;
            list.push_back(Event { time, inputs });
        }
        // Replay: entered events enter at the saved frontier (lifetime
        // measures already hold them), waiting ones stay waiting.
        let waiting = list.split_off(entered.min(list.len()));
        state.frontier = frontier;
        for event in list {
            let at = state.events.len();
            state.events.push_back(event);
            state.entered += 1;
            self.place_in_ranges(&mut state, at);
        }
        self.drop_left_events(&mut state);
        state.events.extend(waiting);
        Ok(state)
    }
}

/// Whether two tuples of measure values are the same. Doubles within 1e-12
/// of each other, relative to the larger (or to 1 below it), are: taking
/// values back out of a running sum or moments, or rebuilding them after a
/// restart in another order, moves the last bits (an average of 0 read back
/// as 1.1e-16), which is rounding, not a change worth a row.
fn same_values(a: &[Value], b: &[Value]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Value::Double(x), Value::Double(y)) => {
                x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs()).max(1.0)
            }
            _ => x == y,
        })
}

impl Operator for RollingWindow {
    fn describe(&self) -> String {
        let spec = &self.spec;
        let measures: Vec<String> = spec
            .measures
            .iter()
            .map(|m| match m.range_micros {
                Some(d) => format!(
                    "{} over {}",
                    m.aggregate.output,
                    crate::duration::format_duration(std::time::Duration::from_micros(d as u64))
                ),
                None => format!("{} (lifetime)", m.aggregate.output),
            })
            .collect();
        format!(
            "RollingWindow[partition_by={:?}, order_by={}, frontier={} - {} as {}, measures=[{}]]",
            spec.partition_by
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>(),
            spec.order_by,
            match spec.frontier.basis {
                FrontierBasis::ProcessingTime => "processing_time",
                FrontierBasis::EventTime => "watermark",
            },
            crate::duration::format_duration(std::time::Duration::from_micros(
                spec.frontier.delay_micros.max(0) as u64
            )),
            spec.frontier.alias,
            measures.join(", ")
        )
    }

    fn on_row(&mut self, row: Row, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let spec = &self.spec;
        let time = match row.get(&spec.order_by) {
            Some(Value::Timestamp(t)) => *t,
            // Epoch milliseconds, as event time accepts them.
            Some(Value::Long(ms)) => ms.saturating_mul(1000),
            Some(Value::Null) | None => {
                return Err(Error::Expression {
                    expression: spec.order_by.to_string(),
                    reason: "the order_by column is missing or null".into(),
                })
            }
            Some(other) => {
                return Err(Error::Expression {
                    expression: spec.order_by.to_string(),
                    reason: format!("the order_by column must be a timestamp, got {other:?}"),
                })
            }
        };
        // The watermark in effect in this batch (not the lagged late-row
        // threshold of window aggregation); none before the first event.
        if ctx.watermark > 0 && time <= ctx.watermark {
            self.dropped_by_watermark += 1;
            if ctx.collect_late_rows {
                self.late_rows.push(row);
            }
            return Ok(());
        }
        let null = Value::Null;
        let mut key = std::mem::take(&mut self.key_buffer);
        encode_key_into(
            spec.partition_by
                .iter()
                .map(|c| row.get(c).unwrap_or(&null)),
            &mut key,
        );
        let frontier = spec.frontier_at(ctx);
        if !self.keys.contains_key(&key) {
            if let Err(e) = self.open_key(&key, &row) {
                self.key_buffer = key;
                return Err(e);
            }
        }
        let spec = &self.spec;
        let state = self.keys.get_mut(&key).expect("inserted above");
        spec.advance(state, frontier);
        spec.accept(state, time, &row);
        Self::mark_dirty(&mut self.dirty, state, &key);
        if ctx.real_time {
            self.settle(&key, out);
        } else if !state.touched {
            state.touched = true;
            self.touched.push(key.clone());
        }
        self.key_buffer = key;
        Ok(())
    }

    fn on_batch_end(&mut self, ctx: &BatchContext, out: &mut Vec<Row>) -> Result<()> {
        let frontier = self.spec.frontier_at(ctx);
        self.fire_timers(frontier, out)?;
        for key in std::mem::take(&mut self.touched) {
            if let Some(state) = self.keys.get_mut(&key) {
                state.touched = false;
                self.spec.advance(state, frontier);
            }
            self.settle(&key, out);
        }
        Ok(())
    }

    fn wants_batch(&self, ctx: &BatchContext) -> bool {
        let frontier = self.spec.frontier_at(ctx);
        let stored = self
            .next_stored_timer
            .filter(|_| self.max_cached_keys.is_some());
        self.timers
            .first()
            .map(|(t, _)| *t)
            .into_iter()
            .chain(stored)
            .any(|t| t <= frontier)
    }

    fn take_late_rows(&mut self) -> Vec<Row> {
        std::mem::take(&mut self.late_rows)
    }

    fn is_stateful(&self) -> bool {
        true
    }

    fn open_state(
        &mut self,
        mut store: Box<dyn StateStore>,
        cache_bytes: Option<usize>,
    ) -> Result<()> {
        self.keys.clear();
        self.timers.clear();
        self.touched.clear();
        self.dirty = ChangedKeys {
            tracking: true,
            keys: Vec::new(),
        };
        self.forgotten.clear();
        let key_bytes = cached_key_bytes(self.spec.measures.len());
        self.max_cached_keys = cache_bytes.map(|bytes| (bytes / key_bytes).max(16));
        self.restore(store.as_mut())?;
        self.store = Some(store);
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<()> {
        // Without a store no change is tracked: nothing to write.
        let dirty = std::mem::take(&mut self.dirty.keys);
        if self.store.is_none() {
            return Ok(());
        }
        let mut entries = Vec::with_capacity(dirty.len() * 3 + 1);
        for key in &dirty {
            self.stored_changes(key, &mut entries)?;
        }
        self.rows_updated += dirty.len() as u64;
        entries.push(self.counts_entry());
        let store = self.store.as_mut().expect("checked above");
        store.write_batch(&entries)?;
        store.flush()?;
        if let Some(max_keys) = self.max_cached_keys {
            self.shrink_to(max_keys)?;
        }
        Ok(())
    }

    /// The partition-by columns.
    fn queryable_state(&self) -> Option<QueryableState> {
        Some(QueryableState {
            kind: "rolling_window",
            key_columns: self
                .spec
                .partition_by
                .iter()
                .map(|c| c.to_string())
                .collect(),
        })
    }

    /// The key's current measures as the operator emits them: the
    /// partition-by columns, the frontier column (the frontier the key's
    /// measures were last brought to; they hold until its next change),
    /// then each measure's output column, valued from the events now in
    /// its range (or all accepted, lifetime measures), whether or not that
    /// row was emitted yet. Empty when the key has no state. The range is
    /// not used. Reads through the store without caching the key or
    /// changing any state.
    fn read_key(&mut self, key: &[Value], _range: &KeyRange) -> Result<Vec<Row>> {
        let mut encoded = Vec::new();
        encode_key_into(key.iter(), &mut encoded);
        let spec = &self.spec;
        if let Some(state) = self.keys.get(&encoded) {
            return Ok(vec![spec.output_row(state, &spec.values(state))]);
        }
        // A key forgotten in this batch is gone though the store still
        // holds it until the checkpoint; only a bounded cache leaves keys
        // to the store, in memory otherwise the map is the whole state.
        if self.forgotten.contains_key(&encoded) || self.max_cached_keys.is_none() {
            return Ok(Vec::new());
        }
        Ok(match self.load_key(&encoded)? {
            Some(state) => vec![spec.output_row(&state, &spec.values(&state))],
            None => Vec::new(),
        })
    }

    fn state_progress(&mut self) -> Option<StateOperatorProgress> {
        let cached_events: usize = self.keys.values().map(|s| s.events.len()).sum();
        let (keys, events) = match self.max_cached_keys {
            Some(_) => self.live_counts(),
            None => (self.keys.len() as u64, cached_events as u64),
        };
        let mut custom_metrics = std::collections::BTreeMap::new();
        custom_metrics.insert("numEventsInRanges".to_string(), events);
        Some(StateOperatorProgress {
            operator_name: "rollingWindow".into(),
            num_rows_total: keys,
            num_rows_updated: std::mem::take(&mut self.rows_updated),
            num_rows_removed: std::mem::take(&mut self.rows_removed),
            num_rows_dropped_by_watermark: std::mem::take(&mut self.dropped_by_watermark),
            memory_used_bytes: (self.keys.len() * 256
                + cached_events * (32 + 24 * self.spec.measures.len()))
                as u64,
            custom_metrics,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Aggregator;
    use crate::test_store::SharedStore;

    /// A user aggregate: the number of even values.
    struct CountEven;
    impl Aggregator for CountEven {
        type Acc = i64;
        fn zero(&self) -> i64 {
            0
        }
        fn reduce(&self, acc: &mut i64, v: &Value) {
            if matches!(v, Value::Long(x) if x % 2 == 0) {
                *acc += 1;
            }
        }
        fn merge(&self, acc: &mut i64, other: &i64) {
            *acc += other;
        }
        fn finish(&self, acc: &i64) -> Value {
            Value::Long(*acc)
        }
    }

    const SECOND: i64 = 1_000_000;

    fn batch(op: &mut RollingWindow, at_seconds: i64, rows: &[(i64, i64)]) -> Vec<Row> {
        let ctx = BatchContext {
            batch_id: 0,
            processing_time: at_seconds * SECOND,
            late_threshold: 0,
            watermark: 0,
            collect_late_rows: false,
            real_time: false,
        };
        let mut out = Vec::new();
        for (t, v) in rows {
            let mut row = Row::new();
            row.set("k", Value::from("a"));
            row.set("t", Value::Timestamp(t * SECOND));
            row.set("v", Value::Long(*v));
            op.on_row(row, &ctx, &mut out).unwrap();
        }
        op.on_batch_end(&ctx, &mut out).unwrap();
        out
    }

    /// How a rolling run treats its store between batches.
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum Between {
        /// The same operator goes on.
        Continue,
        /// A new operator opens the same store after every checkpoint.
        Restart,
        /// Like `Restart`, once, after rewriting the store into the first
        /// layout (each key's state under the bare key).
        RestartFromFirstLayout,
    }

    /// Rewrites a store into the layout before `K`/`E`/`N`.
    fn to_first_layout(op: &RollingWindow, store: &mut SharedStore) {
        let states = store.prefix(STATE_KEY_PREFIX).unwrap();
        for (key, _) in store.prefix(b"").unwrap() {
            store.delete(&key).unwrap();
        }
        for (key, bytes) in states {
            let (state, _) = op.spec.decode_stored(&bytes).unwrap();
            store
                .put(&key[1..], &op.spec.encode_state(&state).unwrap())
                .unwrap();
        }
    }

    /// A stored event count far beyond the bytes that follow (a corrupt
    /// changelog record) is a clean error: the read does not reserve room
    /// for that many events first, which would abort the process.
    #[test]
    fn a_corrupt_event_count_is_an_error_not_an_allocation() {
        let store = SharedStore::default();
        let op = sum_and_max(&store, None, FrontierSpec::default());
        let mut bytes = op
            .spec
            .encode_state(&op.spec.new_key(vec![Value::from("a")]))
            .unwrap();
        let at = bytes.len() - 8;
        bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let Err(error) = op.spec.decode_state(&bytes) else {
            panic!("a corrupt event count read as state");
        };
        assert!(error.to_string().contains("corrupt"), "{error}");
    }

    /// `sum(v)` over 10 seconds and `max(v)` over 5 by `k`, on `store`.
    fn sum_and_max(
        store: &SharedStore,
        cache_bytes: Option<usize>,
        frontier: FrontierSpec,
    ) -> RollingWindow {
        let mut op = RollingWindow::new(
            &["k"],
            "t",
            frontier,
            vec![
                RollingMeasure::of("sum", "v")
                    .unwrap()
                    .over("10 seconds")
                    .unwrap(),
                RollingMeasure::of("max", "v")
                    .unwrap()
                    .over("5 seconds")
                    .unwrap(),
            ],
        )
        .unwrap();
        op.open_state(Box::new(store.clone()), cache_bytes).unwrap();
        op
    }

    /// Fourteen batches over 400 keys, 100 rows each for ten of them, then
    /// none while the frontier moves on: every row as text, and per batch
    /// whether the operator wanted it, its keys and its events held.
    fn run_rolling(
        cache_bytes: Option<usize>,
        between: Between,
    ) -> (Vec<String>, Vec<String>, usize) {
        let store = SharedStore::default();
        let open = |store: &SharedStore| sum_and_max(store, cache_bytes, FrontierSpec::default());
        let mut op = open(&store);
        let (mut out, mut per_batch, mut most_cached) = (Vec::new(), Vec::new(), 0);
        for b in 0..14i64 {
            let now = if b < 10 {
                100 + 3 * b
            } else {
                127 + 4 * (b - 9)
            };
            let ctx = BatchContext {
                batch_id: b as u64,
                processing_time: now * SECOND,
                late_threshold: 0,
                watermark: 0,
                collect_late_rows: false,
                real_time: false,
            };
            let wanted = op.wants_batch(&ctx);
            for i in (0..100i64).filter(|_| b < 10) {
                let mut row = Row::new();
                row.set(
                    "k",
                    Value::from(format!("k{}", (i * 7 + b * 37) % 400).as_str()),
                );
                row.set("t", Value::Timestamp((now - i % 8) * SECOND));
                row.set("v", Value::Long(i + b));
                op.on_row(row, &ctx, &mut out).unwrap();
            }
            op.on_batch_end(&ctx, &mut out).unwrap();
            let p = op.state_progress().unwrap();
            let events = p.custom_metrics["numEventsInRanges"];
            per_batch.push(format!(
                "{b}: wanted {wanted}, {} keys, {events} events",
                p.num_rows_total
            ));
            op.checkpoint().unwrap();
            most_cached = most_cached.max(op.keys.len());
            if between == Between::RestartFromFirstLayout && b == 4 {
                to_first_layout(&op, &mut store.clone());
            }
            if between != Between::Continue {
                op = open(&store);
            }
        }
        let rows = out.iter().map(|r| r.to_json().to_string()).collect();
        (rows, per_batch, most_cached)
    }

    #[test]
    fn state_read_through_the_store_gives_the_in_memory_results() {
        let (in_memory, per_batch, all) = run_rolling(None, Between::Continue);
        assert!(all > 200, "{all} keys");
        assert!(in_memory.len() > 1000, "{}", in_memory.len());
        assert!(per_batch[11].contains("wanted true"), "{per_batch:?}");
        assert!(per_batch[13].contains("0 keys, 0 events"), "{per_batch:?}");
        for between in [
            Between::Continue,
            Between::Restart,
            Between::RestartFromFirstLayout,
        ] {
            for cache_bytes in [None, Some(1)] {
                if (cache_bytes, between) == (None, Between::Continue) {
                    continue;
                }
                let run = run_rolling(cache_bytes, between);
                assert_eq!(run.1, per_batch, "{between:?} {cache_bytes:?}");
                assert_eq!(run.0, in_memory, "{between:?} {cache_bytes:?}");
                if cache_bytes.is_some() {
                    assert!(run.2 <= 16, "{between:?}: {} keys cached", run.2);
                }
            }
        }
    }

    /// Processing-time batch context at `now` seconds.
    fn at(now: i64) -> BatchContext {
        BatchContext {
            batch_id: 0,
            processing_time: now * SECOND,
            late_threshold: 0,
            watermark: 0,
            collect_late_rows: false,
            real_time: false,
        }
    }

    /// Rows `(key, second, value)` fed at `now` seconds, without ending
    /// the batch.
    fn feed(op: &mut RollingWindow, now: i64, rows: &[(i64, i64, i64)]) -> Vec<Row> {
        let mut out = Vec::new();
        for (key, t, v) in rows {
            let mut row = Row::new();
            row.set("k", Value::from(format!("k{key}").as_str()));
            row.set("t", Value::Timestamp(t * SECOND));
            row.set("v", Value::Long(*v));
            op.on_row(row, &at(now), &mut out).unwrap();
        }
        out
    }

    /// Progress without the memory used: which keys a bounded cache keeps
    /// depends on its hasher's random seed.
    fn progress(op: &mut RollingWindow) -> StateOperatorProgress {
        let mut progress = op.state_progress().unwrap();
        progress.memory_used_bytes = 0;
        progress
    }

    fn read(op: &mut RollingWindow, key: i64) -> Vec<Row> {
        let key = [Value::from(format!("k{key}").as_str())];
        op.read_key(&key, &KeyRange::default()).unwrap()
    }

    #[test]
    fn read_key_gives_the_current_measures_through_the_store_and_changes_nothing() {
        // All in memory (with a store), and read through the store with
        // 16 keys cached at most.
        for cache_bytes in [None, Some(1)] {
            let (store, twin_store) = (SharedStore::default(), SharedStore::default());
            let open = |store: &SharedStore| {
                let frontier = FrontierSpec::new("0 seconds", Some("frontier")).unwrap();
                sum_and_max(store, cache_bytes, frontier)
            };
            // `op` is read, `twin` is not: they must stay alike.
            let (mut op, mut twin) = (open(&store), open(&twin_store));
            let state = op.queryable_state().unwrap();
            assert_eq!(state.kind, "rolling_window");
            assert_eq!(state.key_columns, vec!["k".to_string()]);

            // 40 keys at 100 s, two events each in [91, 99] s.
            let rows: Vec<(i64, i64, i64)> = (0..80).map(|i| (i % 40, 91 + i % 9, i)).collect();
            let mut out = feed(&mut op, 100, &rows);
            op.on_batch_end(&at(100), &mut out).unwrap();
            let mut twin_out = feed(&mut twin, 100, &rows);
            twin.on_batch_end(&at(100), &mut twin_out).unwrap();
            assert_eq!(out.len(), 40);
            assert_eq!(out, twin_out);
            op.checkpoint().unwrap();
            twin.checkpoint().unwrap();
            let cached: BTreeSet<Vec<u8>> = op.keys.keys().cloned().collect();
            if cache_bytes.is_some() {
                assert!(cached.len() < 40, "{} keys cached", cached.len());
            }
            let (stored, timers) = (store.approximate_len(), op.timers.clone());

            // Each key reads as the row it emitted, cached or not.
            for emitted in &out {
                let Some(Value::Str(k)) = emitted.get("k") else {
                    panic!("{emitted:?}");
                };
                let key = k[1..].parse().unwrap();
                assert_eq!(read(&mut op, key), vec![emitted.clone()], "{cache_bytes:?}");
            }
            let k3 = &out
                .iter()
                .find(|r| r.get("k") == Some(&Value::from("k3")))
                .unwrap();
            assert_eq!(k3.get("frontier"), Some(&Value::Timestamp(100 * SECOND)));
            // k3: 3 at 94 s, 43 at 98 s.
            assert_eq!(k3.get("sum(v)"), Some(&Value::Long(46)));
            assert!(read(&mut op, 40).is_empty());
            let other = [Value::Long(3)];
            assert!(op
                .read_key(&other, &KeyRange::default())
                .unwrap()
                .is_empty());

            // Nothing cached, stored, timed or counted by the reads.
            let now_cached: BTreeSet<Vec<u8>> = op.keys.keys().cloned().collect();
            assert_eq!(now_cached, cached, "{cache_bytes:?}");
            assert_eq!(op.timers, timers, "{cache_bytes:?}");
            assert_eq!(store.approximate_len(), stored, "{cache_bytes:?}");
            assert_eq!(progress(&mut op), progress(&mut twin));

            // Mid-batch, a key reads with its new event, not yet emitted.
            assert!(feed(&mut op, 102, &[(3, 101, 1000)]).is_empty());
            let now = read(&mut op, 3);
            assert_eq!(now[0].get("sum(v)"), Some(&Value::Long(1046)));
            assert_eq!(now[0].get("max(v)"), Some(&Value::Long(1000)));
            assert_eq!(
                now[0].get("frontier"),
                Some(&Value::Timestamp(102 * SECOND))
            );
            let mut out = Vec::new();
            op.on_batch_end(&at(102), &mut out).unwrap();
            let mut twin_out = feed(&mut twin, 102, &[(3, 101, 1000)]);
            twin.on_batch_end(&at(102), &mut twin_out).unwrap();
            assert_eq!(out, twin_out, "{cache_bytes:?}");
            assert!(out.contains(&now[0]), "{out:?} lacks {now:?}");
            op.checkpoint().unwrap();
            twin.checkpoint().unwrap();
            assert_eq!(progress(&mut op), progress(&mut twin));

            // At 200 s every event left its ranges: keys are forgotten,
            // before the checkpoint deletes them from the store too.
            let mut out = Vec::new();
            op.on_batch_end(&at(200), &mut out).unwrap();
            assert_eq!(out.len(), 40, "{cache_bytes:?}");
            assert!((0..40).all(|k| read(&mut op, k).is_empty()));
            op.checkpoint().unwrap();
            assert!((0..40).all(|k| read(&mut op, k).is_empty()));
            assert_eq!(op.state_progress().unwrap().num_rows_total, 0);
        }
    }

    #[test]
    fn user_aggregates_and_sketches_roll_through_two_stacks() {
        let even = AggregateSpec::new(
            AggregateFn::custom("count_even", CountEven),
            AggregateInput::Column("v".into()),
        );
        let distinct = AggregateSpec::new(
            AggregateFn::approx_count_distinct(0.01),
            AggregateInput::Column("v".into()),
        );
        let mut op = RollingWindow::new(
            &["k"],
            "t",
            FrontierSpec::default(),
            vec![
                RollingMeasure::new(even).over("10 seconds").unwrap(),
                RollingMeasure::new(distinct).over("10 seconds").unwrap(),
            ],
        )
        .unwrap();
        let values = |rows: &[Row]| -> Vec<(Value, Value)> {
            rows.iter()
                .map(|r| {
                    (
                        r.get("count_even(v)").cloned().unwrap(),
                        r.get("approx_count_distinct(v)").cloned().unwrap(),
                    )
                })
                .collect()
        };
        // At 100 s: values 2, 4, 4, 7 at 91..94 s (all inside [90, 100]).
        let out = batch(&mut op, 100, &[(91, 2), (92, 4), (93, 4), (94, 7)]);
        assert_eq!(values(&out), vec![(Value::Long(3), Value::Long(3))]);
        // At 102 s the range is [92, 102]: the 2 left.
        let out = batch(&mut op, 102, &[]);
        assert_eq!(values(&out), vec![(Value::Long(2), Value::Long(2))]);
        // An out-of-order 6 at 93 s lands among the oldest events.
        let out = batch(&mut op, 102, &[(93, 6)]);
        assert_eq!(values(&out), vec![(Value::Long(3), Value::Long(3))]);
        // At 103 s the range is [93, 103]: 92's 4 left; at 104 s, 93's 4
        // and 6 left too.
        let out = batch(&mut op, 103, &[]);
        assert_eq!(values(&out), vec![(Value::Long(2), Value::Long(3))]);
        let out = batch(&mut op, 104, &[]);
        assert_eq!(values(&out), vec![(Value::Long(0), Value::Long(1))]);
        // Everything gone: zero of each, as a key that never emitted.
        let out = batch(&mut op, 200, &[]);
        assert_eq!(values(&out), vec![(Value::Long(0), Value::Long(0))]);
    }
}
