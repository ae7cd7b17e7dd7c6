//! # tidemark
//!
//! Stateful stream processing on Apache Kafka with Spark Structured
//! Streaming's event-time semantics: watermarks, output modes, tumbling,
//! sliding and session windows, in micro-batch or available-now triggers.
//!
//! ```
//! use tidemark::prelude::*;
//! use tidemark::runtime::testing::{CollectSink, VecSource};
//!
//! let query = Query::builder("clicks-per-user")
//!     .event_time("ts")
//!     .watermark("1 minute").unwrap()
//!     .window_aggregate(["user"], tumbling("1 minute").unwrap(), vec![count()])
//!     .trigger(Trigger::AvailableNow)
//!     .build().unwrap();
//! let mut source = VecSource::json_batches(vec![
//!     vec![r#"{"ts": "2026-01-01T00:00:10Z", "user": "u1"}"#],
//!     vec![r#"{"ts": "2026-01-01T00:05:00Z", "user": "u1"}"#],
//! ]);
//! let mut sink = CollectSink::default();
//! query.run(&mut source, &mut sink).unwrap();
//! // The 00:00-00:01 window closed once the watermark passed its end.
//! assert_eq!(sink.rows[0].get("count"), Some(&Value::Long(1)));
//! ```
#![deny(missing_docs)]

pub mod async_step;
pub mod decode;
pub mod functions;
mod json_columns;
mod json_row;
pub mod runtime;
pub mod test_driver;
pub mod topology;

pub use tidemark_operators as operators;
pub use tidemark_types::{
    aggregate, columns, columns_json, duration, encoding, error, expr, progress, record, row,
    schema, secrets, sketch_aggregates, time, typed, typed_columns, watermark, window,
};

pub use error::{Error, Result};

/// The names most programs need.
pub mod prelude {
    pub use crate::aggregate::{AggregateFn, Aggregator};
    pub use crate::functions::{
        approx_count_distinct, approx_percentile, avg, count, count_of, max, max_by, min, min_by,
        session, sliding, stddev, sum, tumbling, variance,
    };
    pub use crate::operators::{AggregateInput, AggregateSpec, OutputMode};
    pub use crate::progress::QueryProgress;
    pub use crate::row::{Row, Value};
    pub use crate::runtime::{Clock, Query, Sink, Source, Trigger};
    pub use crate::schema::{FieldType, Schema};
    pub use crate::watermark::{WatermarkPolicy, WatermarkScope};
    pub use crate::window::WindowSpec;
}
