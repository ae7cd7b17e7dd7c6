//! Entry points for the fuzz targets (`fuzz/`): each reads arbitrary bytes
//! as one operator's stored state, as a restore reads it back from RocksDB
//! or a changelog topic another process wrote. An error is the right answer
//! to bytes that are not such state; a panic, an abort (an allocation sized
//! from the bytes) or a hang is a defect.

use crate::aggregate_spec::{AggregateInput, AggregateSpec};
use crate::error::Result;
use crate::rolling::{FrontierSpec, RollingMeasure, RollingWindow};
use std::sync::Arc;
use tidemark_types::aggregate::AggregateFn;

/// Every built-in aggregate, over a column `v` (`max_by`/`min_by` by `o`).
fn every_aggregate() -> Result<Vec<AggregateSpec>> {
    let column = || AggregateInput::Column(Arc::from("v"));
    let mut specs = Vec::new();
    for name in [
        "count",
        "sum",
        "avg",
        "min",
        "max",
        "stddev",
        "stddev_pop",
        "variance",
        "var_pop",
        "approx_count_distinct",
        "approx_percentile",
    ] {
        specs.push(AggregateSpec::new(AggregateFn::built_in(name)?, column()));
    }
    for name in ["max_by", "min_by"] {
        let input = AggregateInput::By {
            value: Arc::from("v"),
            ordering: Arc::from("o"),
        };
        specs.push(AggregateSpec::new(AggregateFn::built_in(name)?, input));
    }
    Ok(specs)
}

/// A window aggregation's (tumbling, sliding, session) state of one group,
/// with every built-in aggregate.
pub fn window_state(bytes: &[u8]) -> Result<()> {
    crate::state_codec::decode_key_state(bytes, &every_aggregate()?).map(drop)
}

/// A rolling window's state of one key, as stored (with its timer).
pub fn rolling_state(bytes: &[u8]) -> Result<()> {
    let mut measures = Vec::new();
    for spec in every_aggregate()? {
        if !matches!(spec.input, AggregateInput::By { .. }) {
            measures.push(RollingMeasure::new(spec).over("10 minutes")?);
        }
    }
    let window = RollingWindow::new(&["k"], "ts", FrontierSpec::new("1 minute", None)?, measures)?;
    window.decode_for_fuzzing(bytes)
}

/// A deduplication key's stored eviction time.
pub fn dedup_state(bytes: &[u8]) -> Result<()> {
    crate::dedup::decode_time(bytes).map(drop)
}

/// A stream–stream join's buffered row.
pub fn join_state(bytes: &[u8]) -> Result<()> {
    crate::join::decode_buffered_row(bytes).map(drop)
}

/// A stream–table join's table row.
pub fn table_join_state(bytes: &[u8]) -> Result<()> {
    crate::table_join::decode_row(bytes).map(drop)
}
