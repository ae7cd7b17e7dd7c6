//! Aggregate functions: one trait for built-ins and user aggregates, shaped
//! like Spark's `Aggregator` (`zero`, `reduce`, `merge`, `finish`) with a
//! serializable accumulator.

use crate::columns::Column;
use crate::error::{Error, Result};
use crate::row::Value;
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::sync::Arc;

pub use crate::aggregator::Aggregator;

/// A type-erased accumulator.
///
/// The small states of the common built-ins (count, sum, avg and the other
/// moments; any aggregate whose state is an `i64`) are stored inline: a
/// window's accumulators then sit in its one vector, with no allocation per
/// window and no pointer to follow per row, which was the fold's cache miss
/// (`docs/benchmarks.md`, window aggregation at scale). Other states are
/// boxed.
pub struct Accumulator(Slot);

enum Slot {
    Long(i64),
    Sum(SumAcc),
    Moments(MomentsAcc),
    Boxed(Box<dyn Any + Send>),
}

impl Accumulator {
    /// Wraps `state`, inline when its type is one of [`Slot`]'s.
    fn new<T: Any + Send>(state: T) -> Self {
        let mut state = Some(state);
        if let Some(v) = inline_take::<T, i64>(&mut state) {
            return Accumulator(Slot::Long(v));
        }
        if let Some(v) = inline_take::<T, SumAcc>(&mut state) {
            return Accumulator(Slot::Sum(v));
        }
        if let Some(v) = inline_take::<T, MomentsAcc>(&mut state) {
            return Accumulator(Slot::Moments(v));
        }
        match state {
            Some(state) => Accumulator(Slot::Boxed(Box::new(state))),
            None => unreachable!("taken only when stored inline"),
        }
    }

    /// The concrete state, when it is a `T` (rolling ranges take values back
    /// out of built-in accumulators).
    pub fn downcast_mut<T: 'static>(&mut self) -> Option<&mut T> {
        match &mut self.0 {
            Slot::Long(v) => (v as &mut dyn Any).downcast_mut(),
            Slot::Sum(v) => (v as &mut dyn Any).downcast_mut(),
            Slot::Moments(v) => (v as &mut dyn Any).downcast_mut(),
            Slot::Boxed(b) => b.downcast_mut(),
        }
    }

    fn downcast_ref<T: 'static>(&self) -> Option<&T> {
        match &self.0 {
            Slot::Long(v) => (v as &dyn Any).downcast_ref(),
            Slot::Sum(v) => (v as &dyn Any).downcast_ref(),
            Slot::Moments(v) => (v as &dyn Any).downcast_ref(),
            Slot::Boxed(b) => b.downcast_ref(),
        }
    }
}

/// Takes `state` out when `T` is `U` (the types are compared, not the
/// values): how [`Accumulator::new`] picks an inline slot without `unsafe`.
fn inline_take<T: Any, U: Any>(state: &mut Option<T>) -> Option<U> {
    (state as &mut dyn Any)
        .downcast_mut::<Option<U>>()
        .and_then(Option::take)
}

impl std::fmt::Debug for Accumulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Accumulator")
    }
}

trait ErasedAggregator: Send + Sync {
    fn zero(&self) -> Accumulator;
    fn reduce(&self, acc: &mut Accumulator, input: &Value);
    fn reduce_by(&self, acc: &mut Accumulator, input: &Value, ordering: &Value);
    fn merge(&self, acc: &mut Accumulator, other: &Accumulator);
    fn finish(&self, acc: &Accumulator) -> Value;
    fn clone_acc(&self, acc: &Accumulator) -> Accumulator;
    fn encode(&self, acc: &Accumulator) -> Result<Vec<u8>>;
    fn decode(&self, bytes: &[u8]) -> Result<Accumulator>;
}

impl<A: Aggregator> ErasedAggregator for A {
    fn zero(&self) -> Accumulator {
        Accumulator::new(Aggregator::zero(self))
    }
    fn reduce(&self, acc: &mut Accumulator, input: &Value) {
        if let Some(a) = acc.downcast_mut::<A::Acc>() {
            Aggregator::reduce(self, a, input)
        }
    }
    fn reduce_by(&self, acc: &mut Accumulator, input: &Value, ordering: &Value) {
        if let Some(a) = acc.downcast_mut::<A::Acc>() {
            Aggregator::reduce_by(self, a, input, ordering)
        }
    }
    fn merge(&self, acc: &mut Accumulator, other: &Accumulator) {
        if let (Some(a), Some(b)) = (acc.downcast_mut::<A::Acc>(), other.downcast_ref::<A::Acc>()) {
            Aggregator::merge(self, a, b)
        }
    }
    fn finish(&self, acc: &Accumulator) -> Value {
        acc.downcast_ref::<A::Acc>()
            .map(|a| Aggregator::finish(self, a))
            .unwrap_or(Value::Null)
    }
    fn clone_acc(&self, acc: &Accumulator) -> Accumulator {
        match acc.downcast_ref::<A::Acc>() {
            Some(a) => Accumulator::new(a.clone()),
            None => ErasedAggregator::zero(self),
        }
    }
    fn encode(&self, acc: &Accumulator) -> Result<Vec<u8>> {
        let acc = acc.downcast_ref::<A::Acc>().ok_or_else(|| {
            Error::Internal("an accumulator of another aggregate function".into())
        })?;
        serde_json::to_vec(acc).map_err(|e| Error::Internal(format!("cannot encode: {e}")))
    }
    fn decode(&self, bytes: &[u8]) -> Result<Accumulator> {
        let acc: A::Acc = serde_json::from_slice(bytes)
            .map_err(|e| Error::source_failed("corrupt accumulator", e))?;
        Ok(Accumulator::new(acc))
    }
}

/// A named aggregate function, built-in or user-defined.
#[derive(Clone)]
pub struct AggregateFn {
    name: Arc<str>,
    inner: Arc<dyn ErasedAggregator>,
    built_in: bool,
    column_fold: ColumnFold,
}

/// How [`AggregateFn::reduce_at`] reads a column: a typed loop for the
/// common built-ins, value by value for the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ColumnFold {
    Count,
    Sum,
    Moments,
    Extreme { max: bool },
    Values,
}

impl std::fmt::Debug for AggregateFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AggregateFn({})", self.name)
    }
}

/// Names of the built-in aggregates, for error messages.
pub const BUILT_IN_NAMES: &str = "count, sum, avg, min, max, max_by, min_by, stddev, stddev_samp, stddev_pop, variance, var_samp, var_pop, approx_count_distinct, approx_percentile";

impl AggregateFn {
    /// Wraps a user aggregate.
    pub fn custom(name: &str, aggregator: impl Aggregator) -> Self {
        AggregateFn {
            name: Arc::from(name),
            inner: Arc::new(aggregator),
            built_in: false,
            column_fold: ColumnFold::Values,
        }
    }

    /// A built-in aggregate by its Spark name.
    pub fn built_in(name: &str) -> Result<Self> {
        let f = |a: Arc<dyn ErasedAggregator>| AggregateFn {
            name: Arc::from(name),
            inner: a,
            built_in: true,
            column_fold: ColumnFold::Values,
        };
        let typed = |column_fold, a| AggregateFn {
            column_fold,
            ..f(a)
        };
        let moments = |result| typed(ColumnFold::Moments, Arc::new(Moments(result)));
        Ok(match name {
            "count" => typed(ColumnFold::Count, Arc::new(Count)),
            "sum" => typed(ColumnFold::Sum, Arc::new(Sum)),
            "avg" | "mean" => moments(MomentsResult::Mean),
            "min" => typed(
                ColumnFold::Extreme { max: false },
                Arc::new(Extreme { max: false }),
            ),
            "max" => typed(
                ColumnFold::Extreme { max: true },
                Arc::new(Extreme { max: true }),
            ),
            "max_by" => f(Arc::new(ExtremeBy { max: true })),
            "min_by" => f(Arc::new(ExtremeBy { max: false })),
            "stddev" | "stddev_samp" | "std" => moments(MomentsResult::StddevSamp),
            "stddev_pop" => moments(MomentsResult::StddevPop),
            "variance" | "var_samp" => moments(MomentsResult::VarSamp),
            "var_pop" => moments(MomentsResult::VarPop),
            "approx_count_distinct" => f(Arc::new(
                crate::sketch_aggregates::ApproxCountDistinct::new(0.05),
            )),
            "approx_percentile" | "percentile_approx" => f(Arc::new(
                crate::sketch_aggregates::ApproxPercentile::new(0.5, 10_000),
            )),
            other => {
                return Err(Error::config(
                    "fn",
                    format!("unknown aggregate `{other}`; allowed: {BUILT_IN_NAMES}"),
                ))
            }
        })
    }

    /// Spark's `approx_count_distinct(col, rsd)`.
    pub fn approx_count_distinct(rsd: f64) -> Self {
        Self::custom(
            "approx_count_distinct",
            crate::sketch_aggregates::ApproxCountDistinct::new(rsd),
        )
    }

    /// Spark's `approx_percentile(col, percentage, accuracy)`.
    pub fn approx_percentile(percentage: f64, accuracy: u32) -> Self {
        Self::custom(
            "approx_percentile",
            crate::sketch_aggregates::ApproxPercentile::new(percentage, accuracy),
        )
    }

    /// The function's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The built-in function's name; `None` for a user aggregate.
    pub fn built_in_name(&self) -> Option<&str> {
        self.built_in.then_some(&*self.name)
    }
    /// The state of an empty group.
    pub fn zero(&self) -> Accumulator {
        self.inner.zero()
    }
    /// Folds one value in.
    pub fn reduce(&self, acc: &mut Accumulator, input: &Value) {
        self.inner.reduce(acc, input)
    }
    /// Folds one value in with the value it is ordered by (`max_by`).
    pub fn reduce_by(&self, acc: &mut Accumulator, input: &Value, ordering: &Value) {
        self.inner.reduce_by(acc, input, ordering)
    }
    /// Whether the function takes a second, ordering input (`max_by`,
    /// `min_by`).
    pub fn takes_ordering(&self) -> bool {
        self.built_in && matches!(&*self.name, "max_by" | "min_by")
    }
    /// Folds another partial state in.
    pub fn merge(&self, acc: &mut Accumulator, other: &Accumulator) {
        self.inner.merge(acc, other)
    }
    /// The result.
    pub fn finish(&self, acc: &Accumulator) -> Value {
        self.inner.finish(acc)
    }
    /// A copy of an accumulator.
    pub fn clone_acc(&self, acc: &Accumulator) -> Accumulator {
        self.inner.clone_acc(acc)
    }
    /// The accumulator's bytes, for checkpoints and changelogs. An
    /// accumulator its serializer refuses (a user aggregate's state with,
    /// say, a map keyed by a non-string) is an [`Error::Internal`] naming
    /// the function, never empty bytes that would restore as nothing.
    pub fn encode(&self, acc: &Accumulator) -> Result<Vec<u8>> {
        self.inner.encode(acc).map_err(|e| match e {
            Error::Internal(reason) => {
                Error::Internal(format!("the state of aggregate `{}`: {reason}", self.name))
            }
            other => other,
        })
    }
    /// An accumulator from its bytes.
    pub fn decode(&self, bytes: &[u8]) -> Result<Accumulator> {
        self.inner.decode(bytes)
    }
}

impl AggregateFn {
    /// Folds row `row` of `column` in (`column` `None`: `count(*)`'s
    /// marker): what [`AggregateFn::reduce`] does with the row's value,
    /// bit for bit. Count, sum, min, max and the moments (avg, stddev,
    /// variance) read the typed array with no call through the function's
    /// vtable, and but for min/max of a timestamp no [`Value`] made (min
    /// and max, whose state is boxed, still downcast it per row); other
    /// functions, and columns these have no typed fold for, read the
    /// value.
    pub fn reduce_at(&self, acc: &mut Accumulator, column: Option<&Column<'_>>, row: usize) {
        if !fold_typed(self.column_fold, &mut acc.0, column, row) {
            let value = column.map_or(Value::Bool(true), |c| c.value(row));
            self.reduce(acc, &value);
        }
    }
}

/// Folds row `row` of `column` into `slot` without making a [`Value`],
/// when the function has a typed fold for this column and slot; `false`
/// leaves it to the value-by-value fold. Each arm does what the
/// function's `reduce` does with the row's value: `count` counts
/// non-NULLs, `sum` and the moments take integers and floats and ignore
/// the rest (strings, booleans, timestamps, NULLs).
fn fold_typed(kind: ColumnFold, slot: &mut Slot, column: Option<&Column<'_>>, row: usize) -> bool {
    match (kind, slot, column) {
        (ColumnFold::Count, Slot::Long(n), None) => *n += 1,
        (ColumnFold::Count, Slot::Long(n), Some(c)) => *n += i64::from(!c.is_null(row)),
        (ColumnFold::Sum, Slot::Sum(sum), Some(Column::Long(ints))) => {
            if let Some(v) = ints.get(row) {
                sum.add(SumAcc::Long(v));
            }
        }
        (ColumnFold::Sum, Slot::Sum(sum), Some(Column::Double(floats))) => {
            if let Some(v) = floats.get(row) {
                sum.add(SumAcc::Double(v));
            }
        }
        (ColumnFold::Sum, Slot::Sum(_), Some(_)) => {}
        (ColumnFold::Moments, Slot::Moments(moments), Some(Column::Long(ints))) => {
            if let Some(v) = ints.get(row) {
                moments.add(v as f64);
            }
        }
        (ColumnFold::Moments, Slot::Moments(moments), Some(Column::Double(floats))) => {
            if let Some(v) = floats.get(row) {
                moments.add(v);
            }
        }
        (ColumnFold::Moments, Slot::Moments(_), Some(_)) => {}
        (ColumnFold::Extreme { max }, Slot::Boxed(state), Some(column)) => {
            let Some(extreme) = state.downcast_mut::<ExtremeAcc>() else {
                return false;
            };
            return extreme.keep_at(column, row, max);
        }
        _ => return false,
    }
    true
}

/// `count(col)` counts non-null values; `count(*)` is fed a non-null marker.
struct Count;
impl Aggregator for Count {
    type Acc = i64;
    fn zero(&self) -> i64 {
        0
    }
    fn reduce(&self, acc: &mut i64, input: &Value) {
        if !input.is_null() {
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

/// Spark's sum: long in, long out; double in, double out; NULL over nothing.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
enum SumAcc {
    #[default]
    Empty,
    Long(i64),
    Double(f64),
}

impl SumAcc {
    /// Adds `other` in: long + long wraps (Spark's non-ANSI sum), a double
    /// on either side makes a double.
    fn add(&mut self, other: SumAcc) {
        *self = match (*self, other) {
            (a, SumAcc::Empty) => a,
            (SumAcc::Empty, b) => b,
            (SumAcc::Long(a), SumAcc::Long(b)) => SumAcc::Long(a.wrapping_add(b)),
            (SumAcc::Long(a), SumAcc::Double(b)) | (SumAcc::Double(b), SumAcc::Long(a)) => {
                SumAcc::Double(a as f64 + b)
            }
            (SumAcc::Double(a), SumAcc::Double(b)) => SumAcc::Double(a + b),
        };
    }
}

struct Sum;
impl Aggregator for Sum {
    type Acc = SumAcc;
    fn zero(&self) -> SumAcc {
        SumAcc::Empty
    }
    fn reduce(&self, acc: &mut SumAcc, input: &Value) {
        let add = match input {
            Value::Long(v) => SumAcc::Long(*v),
            Value::Double(v) => SumAcc::Double(*v),
            _ => return,
        };
        acc.add(add);
    }
    fn merge(&self, acc: &mut SumAcc, other: &SumAcc) {
        acc.add(*other);
    }
    fn finish(&self, acc: &SumAcc) -> Value {
        match acc {
            SumAcc::Empty => Value::Null,
            SumAcc::Long(v) => Value::Long(*v),
            SumAcc::Double(v) => Value::Double(*v),
        }
    }
}

/// Count, mean and sum of squared deviations (Welford / Chan's parallel
/// merge): numerically stable and mergeable.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct MomentsAcc {
    n: f64,
    mean: f64,
    m2: f64,
}

impl MomentsAcc {
    /// Folds `x` in (Welford's update).
    fn add(&mut self, x: f64) {
        self.n += 1.0;
        let delta = x - self.mean;
        self.mean += delta / self.n;
        self.m2 += delta * (x - self.mean);
    }

    /// Takes `x` back out: the inverse of folding it in (reverse Welford).
    pub fn remove(&mut self, x: f64) {
        if self.n <= 1.0 {
            *self = MomentsAcc::default();
            return;
        }
        let n = self.n - 1.0;
        let mean = (self.n * self.mean - x) / n;
        let term = (x - mean) * (x - self.mean);
        let m2 = self.m2 - term;
        // A difference below the rounding error of its operands is zero:
        // left as a residue, its square root (a standard deviation of
        // 1e-8 over equal values) would read as a real change.
        let noise = 8.0 * f64::EPSILON * (self.m2.abs() + term.abs());
        self.m2 = if m2 <= noise { 0.0 } else { m2 };
        self.mean = mean;
        self.n = n;
    }
}

#[derive(Clone, Copy)]
enum MomentsResult {
    Mean,
    VarSamp,
    VarPop,
    StddevSamp,
    StddevPop,
}

struct Moments(MomentsResult);
impl Aggregator for Moments {
    type Acc = MomentsAcc;
    fn zero(&self) -> MomentsAcc {
        MomentsAcc::default()
    }
    fn reduce(&self, acc: &mut MomentsAcc, input: &Value) {
        if matches!(input, Value::Timestamp(_)) {
            return;
        }
        if let Some(x) = input.as_f64() {
            acc.add(x);
        }
    }
    fn merge(&self, acc: &mut MomentsAcc, other: &MomentsAcc) {
        if other.n == 0.0 {
            return;
        }
        let n = acc.n + other.n;
        let delta = other.mean - acc.mean;
        acc.m2 += other.m2 + delta * delta * acc.n * other.n / n;
        acc.mean += delta * other.n / n;
        acc.n = n;
    }
    fn finish(&self, acc: &MomentsAcc) -> Value {
        // Spark: stddev_samp/var_samp of one row is NULL, var_pop of one row 0.
        let value = match self.0 {
            _ if acc.n == 0.0 => return Value::Null,
            MomentsResult::Mean => acc.mean,
            MomentsResult::VarPop => acc.m2 / acc.n,
            MomentsResult::StddevPop => (acc.m2 / acc.n).sqrt(),
            _ if acc.n < 2.0 => return Value::Null,
            MomentsResult::VarSamp => acc.m2 / (acc.n - 1.0),
            MomentsResult::StddevSamp => (acc.m2 / (acc.n - 1.0)).sqrt(),
        };
        Value::Double(value)
    }
}

/// Minimum or maximum, kept as the original value so that the type is
/// preserved (long stays long, timestamp stays timestamp).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub enum ExtremeAcc {
    /// No value yet.
    #[default]
    Empty,
    /// A long.
    Long(i64),
    /// A double.
    Double(f64),
    /// A string.
    Str(String),
    /// A timestamp in microseconds.
    Timestamp(i64),
    /// A boolean.
    Bool(bool),
}

impl ExtremeAcc {
    /// Keeps row `row` of `column` if it is the new extreme, as
    /// [`Extreme`]'s `reduce` does, for a long, double or timestamp column
    /// whose values meet an accumulator of their own kind (or an empty
    /// one); `false` leaves any other case to `reduce`.
    fn keep_at(&mut self, column: &Column<'_>, row: usize, max: bool) -> bool {
        if column.is_null(row) {
            return true;
        }
        // `reduce`'s rule: replace when strictly better; a NaN, which
        // compares with nothing, replaces only an empty accumulator.
        fn better<T: PartialOrd>(current: &T, value: &T, max: bool) -> bool {
            match current.partial_cmp(value) {
                None => false,
                Some(ord) => (ord == std::cmp::Ordering::Less) == max && ord.is_ne(),
            }
        }
        match (&*self, column) {
            (ExtremeAcc::Empty, Column::Long(ints)) => *self = ExtremeAcc::Long(ints.value(row)),
            (ExtremeAcc::Long(c), Column::Long(ints)) => {
                let v = ints.value(row);
                if better(c, &v, max) {
                    *self = ExtremeAcc::Long(v);
                }
            }
            (ExtremeAcc::Empty, Column::Double(floats)) => {
                *self = ExtremeAcc::Double(floats.value(row))
            }
            (ExtremeAcc::Double(c), Column::Double(floats)) => {
                let v = floats.value(row);
                if better(c, &v, max) {
                    *self = ExtremeAcc::Double(v);
                }
            }
            (ExtremeAcc::Empty | ExtremeAcc::Timestamp(_), Column::Timestamp(_)) => {
                let Value::Timestamp(v) = column.value(row) else {
                    return false;
                };
                if let ExtremeAcc::Timestamp(c) = self {
                    if !better(c, &v, max) {
                        return true;
                    }
                }
                *self = ExtremeAcc::Timestamp(v);
            }
            _ => return false,
        }
        true
    }

    fn from_value(v: &Value) -> Self {
        match v {
            Value::Long(x) => ExtremeAcc::Long(*x),
            Value::Double(x) => ExtremeAcc::Double(*x),
            Value::Str(s) => ExtremeAcc::Str(s.to_string()),
            Value::Timestamp(t) => ExtremeAcc::Timestamp(*t),
            Value::Bool(b) => ExtremeAcc::Bool(*b),
            Value::Null => ExtremeAcc::Empty,
        }
    }
    fn to_value(&self) -> Value {
        match self {
            ExtremeAcc::Empty => Value::Null,
            ExtremeAcc::Long(x) => Value::Long(*x),
            ExtremeAcc::Double(x) => Value::Double(*x),
            ExtremeAcc::Str(s) => Value::from(s.as_str()),
            ExtremeAcc::Timestamp(t) => Value::Timestamp(*t),
            ExtremeAcc::Bool(b) => Value::Bool(*b),
        }
    }
}

struct Extreme {
    max: bool,
}
impl Aggregator for Extreme {
    type Acc = ExtremeAcc;
    fn zero(&self) -> ExtremeAcc {
        ExtremeAcc::Empty
    }
    fn reduce(&self, acc: &mut ExtremeAcc, input: &Value) {
        if input.is_null() {
            return;
        }
        let current = acc.to_value();
        let replace = match current.sql_cmp(input) {
            None => current.is_null(),
            Some(ord) => {
                (ord == std::cmp::Ordering::Less) == self.max && ord != std::cmp::Ordering::Equal
            }
        };
        if replace {
            *acc = ExtremeAcc::from_value(input);
        }
    }
    fn merge(&self, acc: &mut ExtremeAcc, other: &ExtremeAcc) {
        Aggregator::reduce(self, acc, &other.to_value());
    }
    fn finish(&self, acc: &ExtremeAcc) -> Value {
        acc.to_value()
    }
}

/// Spark's `max_by(x, y)` / `min_by(x, y)`: the `x` of the row with the
/// largest (smallest) `y`; rows with a null `y` are skipped, and of rows
/// with equal `y` the first one kept wins (Spark leaves ties unspecified).
struct ExtremeBy {
    max: bool,
}

/// The value kept by `max_by`/`min_by` and the ordering value it won with.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExtremeByAcc {
    value: ExtremeAcc,
    ordering: ExtremeAcc,
}

impl Aggregator for ExtremeBy {
    type Acc = ExtremeByAcc;
    fn zero(&self) -> ExtremeByAcc {
        ExtremeByAcc::default()
    }
    fn reduce(&self, _acc: &mut ExtremeByAcc, _input: &Value) {
        // Without its ordering a value cannot be placed; the operators
        // always call `reduce_by` for these functions.
    }
    fn reduce_by(&self, acc: &mut ExtremeByAcc, input: &Value, ordering: &Value) {
        if ordering.is_null() {
            return;
        }
        let current = acc.ordering.to_value();
        let replace = current.is_null()
            || match current.sql_cmp(ordering) {
                Some(std::cmp::Ordering::Less) => self.max,
                Some(std::cmp::Ordering::Greater) => !self.max,
                _ => false,
            };
        if replace {
            *acc = ExtremeByAcc {
                value: ExtremeAcc::from_value(input),
                ordering: ExtremeAcc::from_value(ordering),
            };
        }
    }
    fn merge(&self, acc: &mut ExtremeByAcc, other: &ExtremeByAcc) {
        Aggregator::reduce_by(
            self,
            acc,
            &other.value.to_value(),
            &other.ordering.to_value(),
        );
    }
    fn finish(&self, acc: &ExtremeByAcc) -> Value {
        acc.value.to_value()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{
        ArrayRef, BooleanArray, Float32Array, Float64Array, Int16Array, Int32Array, Int64Array,
        Int8Array, LargeStringArray, NullArray, StringArray, TimestampMicrosecondArray,
        TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray,
    };
    use proptest::prelude::*;

    /// A user aggregate whose state its serializer refuses (JSON maps need
    /// string keys) fails the checkpoint with an internal error naming the
    /// function, instead of writing empty bytes that would restore as an
    /// empty group.
    #[test]
    fn an_accumulator_that_cannot_be_encoded_is_an_error_naming_the_function() {
        struct ByPair;
        impl Aggregator for ByPair {
            type Acc = std::collections::HashMap<(i64, i64), i64>;
            fn zero(&self) -> Self::Acc {
                Default::default()
            }
            fn reduce(&self, acc: &mut Self::Acc, input: &Value) {
                if let Value::Long(x) = input {
                    *acc.entry((*x, *x)).or_default() += 1;
                }
            }
            fn merge(&self, acc: &mut Self::Acc, other: &Self::Acc) {
                for (k, v) in other {
                    *acc.entry(*k).or_default() += v;
                }
            }
            fn finish(&self, acc: &Self::Acc) -> Value {
                Value::Long(acc.len() as i64)
            }
        }
        let f = AggregateFn::custom("by_pair", ByPair);
        let mut acc = f.zero();
        f.reduce(&mut acc, &Value::Long(7));
        match f.encode(&acc) {
            Err(Error::Internal(reason)) => assert!(reason.contains("by_pair"), "{reason}"),
            other => panic!("expected an internal error, got {other:?}"),
        }
    }

    /// A double for `v`: sevenths, and the doubles that compare oddly
    /// (NaN, -0.0) at the ends of the range.
    fn float(v: i8) -> f64 {
        match v {
            i8::MIN => f64::NAN,
            i8::MAX => -0.0,
            v => f64::from(v) / 7.0,
        }
    }

    /// Every column type a batch can hold (each timestamp unit, both
    /// string offsets), from one list of optional small integers (the
    /// floats from [`float`]).
    fn columns_of(values: &[Option<i8>]) -> Vec<ArrayRef> {
        let wide = |v: &Option<i8>| v.map(i64::from);
        vec![
            Arc::new(Int8Array::from(values.to_vec())),
            Arc::new(Int16Array::from_iter(
                values.iter().map(|v| v.map(i16::from)),
            )),
            Arc::new(Int32Array::from_iter(
                values.iter().map(|v| v.map(i32::from)),
            )),
            Arc::new(Int64Array::from_iter(values.iter().map(wide))),
            Arc::new(Float32Array::from_iter(
                values.iter().map(|v| v.map(|v| float(v) as f32)),
            )),
            Arc::new(Float64Array::from_iter(values.iter().map(|v| v.map(float)))),
            Arc::new(StringArray::from_iter(
                values.iter().map(|v| v.map(|v| v.to_string())),
            )),
            Arc::new(BooleanArray::from_iter(
                values.iter().map(|v| v.map(|v| v > 0)),
            )),
            Arc::new(LargeStringArray::from_iter(
                values.iter().map(|v| v.map(|v| v.to_string())),
            )),
            Arc::new(TimestampSecondArray::from_iter(values.iter().map(wide))),
            Arc::new(TimestampMillisecondArray::from_iter(
                values.iter().map(wide),
            )),
            Arc::new(TimestampMicrosecondArray::from_iter(
                values.iter().map(wide),
            )),
            Arc::new(TimestampNanosecondArray::from_iter(
                values.iter().map(|v| v.map(|v| i64::from(v) * 999)),
            )),
            Arc::new(NullArray::new(values.len())),
        ]
    }

    /// Four groups' accumulators: one empty, the others already holding a
    /// long, a double and a timestamp, so that a column meets states of
    /// its own kind and of others.
    fn seeded(f: &AggregateFn) -> Vec<Accumulator> {
        let seeds = [
            None,
            Some(Value::Long(3)),
            Some(Value::Double(2.5)),
            Some(Value::Timestamp(5)),
        ];
        seeds
            .iter()
            .map(|seed| {
                let mut acc = f.zero();
                if let Some(seed) = seed {
                    f.reduce(&mut acc, seed);
                }
                acc
            })
            .collect()
    }

    proptest! {
        /// `reduce_at` over any column type, NULLs and groups in any
        /// order: the states folding the rows' values gives, bit for bit.
        #[test]
        fn a_column_folded_by_group_equals_the_values_folded_row_by_row(
            rows in proptest::collection::vec(
                (proptest::option::weighted(0.8, any::<i8>()), 0u32..4),
                0..40,
            ),
        ) {
            let values: Vec<Option<i8>> = rows.iter().map(|r| r.0).collect();
            let pairs: Vec<(u32, u32)> =
                rows.iter().enumerate().map(|(i, r)| (i as u32, r.1)).collect();
            let names = ["count", "sum", "avg", "stddev", "var_pop", "min", "max", "max_by"];
            for name in names {
                let f = AggregateFn::built_in(name).unwrap();
                let arrays = columns_of(&values);
                let mut columns: Vec<Option<Column<'_>>> = arrays
                    .iter()
                    .map(|a| Some(Column::of("c", a.as_ref()).unwrap()))
                    .collect();
                columns.push(Some(Column::Missing));
                columns.push(None);
                for column in &columns {
                    let mut by_column = seeded(&f);
                    for &(row, group) in &pairs {
                        f.reduce_at(&mut by_column[group as usize], column.as_ref(), row as usize);
                    }
                    let mut by_row = seeded(&f);
                    for &(row, group) in &pairs {
                        let value =
                            column.as_ref().map_or(Value::Bool(true), |c| c.value(row as usize));
                        f.reduce(&mut by_row[group as usize], &value);
                    }
                    for (a, b) in by_column.iter().zip(&by_row) {
                        // The state's bytes, and the result's bits
                        // (NaN and -0.0 included, which JSON blurs).
                        let bits = |acc: &Accumulator| match f.finish(acc) {
                            Value::Double(d) => format!("{:x}", d.to_bits()),
                            other => format!("{other:?}"),
                        };
                        prop_assert_eq!(f.encode(a).unwrap(), f.encode(b).unwrap(), "{} over {:?}", name, column);
                        prop_assert_eq!(bits(a), bits(b), "{} over {:?}", name, column);
                    }
                }
            }
        }
    }

    #[test]
    fn small_states_are_inline_and_others_boxed_and_both_downcast() {
        let mut count = Accumulator::new(4i64);
        assert!(matches!(count.0, Slot::Long(4)));
        *count.downcast_mut::<i64>().unwrap() += 1;
        assert_eq!(count.downcast_ref::<i64>(), Some(&5));
        assert!(count.downcast_ref::<SumAcc>().is_none());
        let sum = Accumulator::new(SumAcc::Double(1.5));
        assert!(matches!(sum.0, Slot::Sum(SumAcc::Double(_))));
        assert!(sum.downcast_ref::<i64>().is_none());
        let mut text = Accumulator::new(String::from("a"));
        assert!(matches!(text.0, Slot::Boxed(_)));
        text.downcast_mut::<String>().unwrap().push('b');
        assert_eq!(
            text.downcast_ref::<String>().map(String::as_str),
            Some("ab")
        );
        assert!(text.downcast_ref::<i64>().is_none());
    }

    #[test]
    fn max_by_and_min_by_keep_the_value_of_the_extreme_ordering() {
        let rows = [
            (Value::Str("a".into()), Value::Long(3)),
            (Value::Str("b".into()), Value::Long(7)),
            (Value::Str("c".into()), Value::Null),
            (Value::Str("d".into()), Value::Long(7)),
            (Value::Null, Value::Long(1)),
        ];
        let run = |name: &str, rows: &[(Value, Value)]| {
            let f = AggregateFn::built_in(name).unwrap();
            let mut acc = f.zero();
            for (v, o) in rows {
                f.reduce_by(&mut acc, v, o);
            }
            (
                f.finish(&acc),
                f.decode(&f.encode(&acc).unwrap())
                    .map(|a| f.finish(&a))
                    .unwrap(),
            )
        };
        assert_eq!(run("max_by", &rows).0, Value::Str("b".into()));
        assert_eq!(run("max_by", &rows).1, Value::Str("b".into()));
        // The value of the winning row, even when that value is null.
        assert_eq!(run("min_by", &rows).0, Value::Null);
        assert_eq!(run("min_by", &rows[..4]).0, Value::Str("a".into()));
        assert_eq!(run("max_by", &[]).0, Value::Null);
        // Merging partial states (sessions) keeps the extreme of both.
        let f = AggregateFn::built_in("max_by").unwrap();
        let (mut left, mut right) = (f.zero(), f.zero());
        f.reduce_by(&mut left, &Value::Long(1), &Value::Double(0.5));
        f.reduce_by(&mut right, &Value::Long(2), &Value::Double(9.0));
        f.merge(&mut left, &right);
        assert_eq!(f.finish(&left), Value::Long(2));
        assert!(f.takes_ordering());
        assert!(!AggregateFn::built_in("max").unwrap().takes_ordering());
    }

    fn run(name: &str, values: &[Value]) -> Value {
        let f = AggregateFn::built_in(name).unwrap();
        let mut acc = f.zero();
        for v in values {
            f.reduce(&mut acc, v);
        }
        f.finish(&acc)
    }

    #[test]
    fn spark_edge_cases() {
        let one = [Value::Double(4.0)];
        assert_eq!(run("stddev_samp", &one), Value::Null);
        assert_eq!(run("var_pop", &one), Value::Double(0.0));
        assert_eq!(run("sum", &[]), Value::Null);
        assert_eq!(run("count", &[Value::Null, Value::Long(1)]), Value::Long(1));
        assert_eq!(
            run("sum", &[Value::Long(2), Value::Long(3)]),
            Value::Long(5)
        );
        assert_eq!(
            run("min", &[Value::Long(2), Value::Null, Value::Long(-3)]),
            Value::Long(-3)
        );
        assert_eq!(
            run(
                "max",
                &[Value::from("a"), Value::from("c"), Value::from("b")]
            ),
            Value::from("c")
        );
        assert_eq!(
            run("avg", &[Value::Long(1), Value::Long(2)]),
            Value::Double(1.5)
        );
    }

    #[test]
    fn merge_equals_sequential() {
        let values: Vec<Value> = (0..50)
            .map(|i| Value::Double((i * 7 % 13) as f64))
            .collect();
        for name in [
            "var_samp",
            "stddev_pop",
            "sum",
            "min",
            "max",
            "avg",
            "count",
        ] {
            let f = AggregateFn::built_in(name).unwrap();
            let (mut a, mut b) = (f.zero(), f.zero());
            for v in &values[..20] {
                f.reduce(&mut a, v);
            }
            for v in &values[20..] {
                f.reduce(&mut b, v);
            }
            f.merge(&mut a, &b);
            let merged = f.finish(&a).as_f64().unwrap();
            let sequential = run(name, &values).as_f64().unwrap();
            assert!(
                (merged - sequential).abs() < 1e-9,
                "{name}: {merged} vs {sequential}"
            );
            let round_trip = f.decode(&f.encode(&a).unwrap()).unwrap();
            assert_eq!(f.finish(&round_trip), f.finish(&a));
        }
    }

    #[test]
    fn unknown_name_lists_allowed() {
        let err = AggregateFn::built_in("median").unwrap_err().to_string();
        assert!(err.contains("allowed: count"), "{err}");
    }
}
