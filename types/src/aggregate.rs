//! Aggregate functions: one trait for built-ins and user aggregates, shaped
//! like Spark's `Aggregator` (`zero`, `reduce`, `merge`, `finish`) with a
//! serializable accumulator.

use crate::error::{Error, Result};
use crate::row::Value;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::any::Any;
use std::sync::Arc;

/// An aggregate function over one input value per row.
///
/// Implement this for a user aggregate; wrap it with [`AggregateFn::custom`].
///
/// ```
/// use tidemark_types::aggregate::{Aggregator, AggregateFn};
/// use tidemark_types::row::Value;
///
/// /// Counts rows whose value is an even long.
/// struct CountEven;
/// impl Aggregator for CountEven {
///     type Acc = i64;
///     fn zero(&self) -> i64 { 0 }
///     fn reduce(&self, acc: &mut i64, v: &Value) { if matches!(v, Value::Long(x) if x % 2 == 0) { *acc += 1 } }
///     fn merge(&self, acc: &mut i64, other: &i64) { *acc += other }
///     fn finish(&self, acc: &i64) -> Value { Value::Long(*acc) }
/// }
/// let f = AggregateFn::custom("count_even", CountEven);
/// let mut acc = f.zero();
/// for v in [2i64, 3, 4] { f.reduce(&mut acc, &Value::Long(v)); }
/// assert_eq!(f.finish(&acc), Value::Long(2));
/// ```
pub trait Aggregator: Send + Sync + 'static {
    /// The running state; serializable so that it can be checkpointed.
    type Acc: Clone + Serialize + DeserializeOwned + Send + 'static;
    /// The state of an empty group.
    fn zero(&self) -> Self::Acc;
    /// Folds one input value in.
    fn reduce(&self, acc: &mut Self::Acc, input: &Value);
    /// Folds one input value in with the value it is ordered by (Spark's
    /// `max_by(x, ordering)`); aggregates of one input ignore `ordering`.
    fn reduce_by(&self, acc: &mut Self::Acc, input: &Value, ordering: &Value) {
        let _ = ordering;
        self.reduce(acc, input)
    }
    /// Folds another partial state in (session merges, partial aggregation).
    fn merge(&self, acc: &mut Self::Acc, other: &Self::Acc);
    /// The result.
    fn finish(&self, acc: &Self::Acc) -> Value;
}

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
    fn encode(&self, acc: &Accumulator) -> Vec<u8>;
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
    fn encode(&self, acc: &Accumulator) -> Vec<u8> {
        acc.downcast_ref::<A::Acc>()
            .and_then(|a| serde_json::to_vec(a).ok())
            .unwrap_or_default()
    }
    fn decode(&self, bytes: &[u8]) -> Result<Accumulator> {
        let acc: A::Acc = serde_json::from_slice(bytes)
            .map_err(|e| Error::Source(format!("corrupt accumulator: {e}")))?;
        Ok(Accumulator::new(acc))
    }
}

/// A named aggregate function, built-in or user-defined.
#[derive(Clone)]
pub struct AggregateFn {
    name: Arc<str>,
    inner: Arc<dyn ErasedAggregator>,
    built_in: bool,
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
        }
    }

    /// A built-in aggregate by its Spark name.
    pub fn built_in(name: &str) -> Result<Self> {
        let f = |a: Arc<dyn ErasedAggregator>| AggregateFn {
            name: Arc::from(name),
            inner: a,
            built_in: true,
        };
        Ok(match name {
            "count" => f(Arc::new(Count)),
            "sum" => f(Arc::new(Sum)),
            "avg" | "mean" => f(Arc::new(Moments(MomentsResult::Mean))),
            "min" => f(Arc::new(Extreme { max: false })),
            "max" => f(Arc::new(Extreme { max: true })),
            "max_by" => f(Arc::new(ExtremeBy { max: true })),
            "min_by" => f(Arc::new(ExtremeBy { max: false })),
            "stddev" | "stddev_samp" | "std" => f(Arc::new(Moments(MomentsResult::StddevSamp))),
            "stddev_pop" => f(Arc::new(Moments(MomentsResult::StddevPop))),
            "variance" | "var_samp" => f(Arc::new(Moments(MomentsResult::VarSamp))),
            "var_pop" => f(Arc::new(Moments(MomentsResult::VarPop))),
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
    /// The accumulator's bytes, for checkpoints and changelogs.
    pub fn encode(&self, acc: &Accumulator) -> Vec<u8> {
        self.inner.encode(acc)
    }
    /// An accumulator from its bytes.
    pub fn decode(&self, bytes: &[u8]) -> Result<Accumulator> {
        self.inner.decode(bytes)
    }
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
        Aggregator::merge(self, acc, &add);
    }
    fn merge(&self, acc: &mut SumAcc, other: &SumAcc) {
        *acc = match (*acc, *other) {
            (a, SumAcc::Empty) => a,
            (SumAcc::Empty, b) => b,
            (SumAcc::Long(a), SumAcc::Long(b)) => SumAcc::Long(a.wrapping_add(b)),
            (SumAcc::Long(a), SumAcc::Double(b)) | (SumAcc::Double(b), SumAcc::Long(a)) => {
                SumAcc::Double(a as f64 + b)
            }
            (SumAcc::Double(a), SumAcc::Double(b)) => SumAcc::Double(a + b),
        };
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
            acc.n += 1.0;
            let delta = x - acc.mean;
            acc.mean += delta / acc.n;
            acc.m2 += delta * (x - acc.mean);
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
                f.decode(&f.encode(&acc)).map(|a| f.finish(&a)).unwrap(),
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
            let round_trip = f.decode(&f.encode(&a)).unwrap();
            assert_eq!(f.finish(&round_trip), f.finish(&a));
        }
    }

    #[test]
    fn unknown_name_lists_allowed() {
        let err = AggregateFn::built_in("median").unwrap_err().to_string();
        assert!(err.contains("allowed: count"), "{err}");
    }
}
