//! The trait every aggregate function implements, built-in or a user's. A
//! module of its own so that the aggregates built on it
//! (`sketch_aggregates`) and the functions that name them (`aggregate`)
//! depend on it, not on each other; `aggregate::Aggregator` re-exports it.

use crate::row::Value;
use serde::de::DeserializeOwned;
use serde::Serialize;

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
