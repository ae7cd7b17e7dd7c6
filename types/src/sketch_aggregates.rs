//! Approximate aggregates on Apache DataSketches: `approx_count_distinct`
//! (HyperLogLog) and `approx_percentile` (KLL), mergeable and serializable
//! like every other aggregate.

use crate::aggregator::Aggregator;
use crate::row::Value;
use datasketches::common::SearchCriteria;
use datasketches::hll::{HllSketch, HllType, HllUnion};
use datasketches::kll::{KllFloat, KllSketch};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `lg_k` for a relative standard deviation, as Spark sizes HLL++:
/// `m = (1.106 / rsd)^2` registers, rounded up to a power of two.
pub fn lg_k_for_rsd(rsd: f64) -> u8 {
    let m = (1.106 / rsd.clamp(1e-4, 0.39)).powi(2);
    (m.log2().ceil() as u8).clamp(4, 21)
}

/// An HLL sketch that serializes as its compact DataSketches image.
#[derive(Clone)]
pub struct HllAcc(HllSketch);

impl Serialize for HllAcc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0.serialize())
    }
}

impl<'de> Deserialize<'de> for HllAcc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: Vec<u8> = Deserialize::deserialize(d)?;
        HllSketch::deserialize(&bytes)
            .map(HllAcc)
            .map_err(D::Error::custom)
    }
}

/// Spark's `approx_count_distinct(col, rsd)`: distinct non-null values.
pub struct ApproxCountDistinct {
    lg_k: u8,
}

impl ApproxCountDistinct {
    /// With relative standard deviation `rsd` (Spark's default 0.05).
    pub fn new(rsd: f64) -> Self {
        ApproxCountDistinct {
            lg_k: lg_k_for_rsd(rsd),
        }
    }
}

impl Aggregator for ApproxCountDistinct {
    type Acc = HllAcc;
    fn zero(&self) -> HllAcc {
        HllAcc(
            HllSketch::new(self.lg_k, HllType::Hll8).expect("lg_k is clamped to the valid range"),
        )
    }
    fn reduce(&self, acc: &mut HllAcc, input: &Value) {
        if !input.is_null() {
            acc.0
                .update(crate::row::encode_key(std::slice::from_ref(input)));
        }
    }
    fn merge(&self, acc: &mut HllAcc, other: &HllAcc) {
        let mut union = HllUnion::new(self.lg_k).expect("lg_k is clamped to the valid range");
        union.update(&acc.0);
        union.update(&other.0);
        acc.0 = union.to_sketch(HllType::Hll8);
    }
    fn finish(&self, acc: &HllAcc) -> Value {
        Value::Long(acc.0.estimate().round() as i64)
    }
}

/// A KLL sketch of doubles that serializes as its DataSketches image.
#[derive(Clone)]
pub struct KllAcc(KllSketch<KllFloat<f64>>);

impl Serialize for KllAcc {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0.serialize())
    }
}

impl<'de> Deserialize<'de> for KllAcc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let bytes: Vec<u8> = Deserialize::deserialize(d)?;
        KllSketch::deserialize(&bytes)
            .map(KllAcc)
            .map_err(D::Error::custom)
    }
}

/// Spark's `approx_percentile(col, percentage, accuracy)`: the smallest value
/// whose rank is at least `percentage`; exact while a group holds fewer
/// values than the sketch's `k`.
pub struct ApproxPercentile {
    percentage: f64,
    k: u16,
}

impl ApproxPercentile {
    /// `percentage` in [0, 1]; `accuracy` as Spark's (default 10000): higher
    /// is more exact and uses more memory (KLL `k = min(accuracy, 65535)`).
    pub fn new(percentage: f64, accuracy: u32) -> Self {
        ApproxPercentile {
            percentage: percentage.clamp(0.0, 1.0),
            k: accuracy.clamp(8, u16::MAX as u32) as u16,
        }
    }
}

impl Aggregator for ApproxPercentile {
    type Acc = KllAcc;
    fn zero(&self) -> KllAcc {
        KllAcc(KllSketch::new(self.k).expect("k is clamped to the valid range"))
    }
    fn reduce(&self, acc: &mut KllAcc, input: &Value) {
        if matches!(input, Value::Timestamp(_)) {
            return;
        }
        if let Some(x) = input.as_f64().and_then(|x| KllFloat::<f64>::new(x).ok()) {
            acc.0.update(x);
        }
    }
    fn merge(&self, acc: &mut KllAcc, other: &KllAcc) {
        // KLL merges sketches of any k; it refuses only another m (both
        // sketches are built or decoded with the default m: decoding
        // refuses any other) or a combined weight past u64::MAX. The
        // trait's merge cannot fail, so that impossible case is logged
        // loudly rather than dropped without a word.
        if let Err(e) = acc.0.merge(&other.0) {
            tracing::error!(error = %e, "approx_percentile: sketches could not be merged");
        }
    }
    fn finish(&self, acc: &KllAcc) -> Value {
        match acc.0.quantile(self.percentage, SearchCriteria::Inclusive) {
            Ok(Some(v)) => Value::Double(*v),
            _ => Value::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::aggregate::AggregateFn;
    use crate::row::Value;

    #[test]
    fn distinct_count_is_close_and_merges() {
        let f = AggregateFn::custom(
            "approx_count_distinct",
            super::ApproxCountDistinct::new(0.05),
        );
        let (mut a, mut b) = (f.zero(), f.zero());
        for i in 0..5000i64 {
            f.reduce(&mut a, &Value::Long(i));
            f.reduce(&mut b, &Value::Long(i + 2500));
        }
        f.merge(&mut a, &b);
        let Value::Long(n) = f.finish(&f.decode(&f.encode(&a).unwrap()).unwrap()) else {
            panic!()
        };
        assert!((n - 7500).abs() < 7500 / 10, "{n}");
    }

    #[test]
    fn percentile_is_exact_on_small_groups_as_spark() {
        let f = AggregateFn::custom(
            "approx_percentile",
            super::ApproxPercentile::new(0.5, 10000),
        );
        let mut acc = f.zero();
        for v in [4.0, 1.0, 3.0, 2.0] {
            f.reduce(&mut acc, &Value::Double(v));
        }
        // percentile_approx([1, 2, 3, 4], 0.5) = 2 in Spark.
        assert_eq!(f.finish(&acc), Value::Double(2.0));
        assert_eq!(f.finish(&f.zero()), Value::Null);
    }
}
