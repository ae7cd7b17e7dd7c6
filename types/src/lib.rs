//! tidemark's vocabulary, shared by its operators, runtime and connectors:
//! values and rows ([`row`]), Arrow batches read as rows ([`columns`]),
//! schemas ([`schema`]), Spark SQL expressions
//! ([`expr`]), timestamps and durations ([`time`], [`duration`]), windows
//! ([`window`]), watermarks ([`watermark`]), aggregate functions
//! ([`aggregate`], [`sketch_aggregates`]), typed rows ([`typed`]), records
//! as they come from a source ([`record`]), progress reports
//! ([`progress`]), errors ([`error`]) and the versions of stored
//! encodings ([`encoding`]).
//!
//! Applications use these through the `tidemark` crate, which re-exports
//! every module under the same name (`tidemark::row::Value`).
#![deny(missing_docs)]

pub mod aggregate;
pub mod aggregator;
pub mod columns;
pub mod columns_json;
pub mod duration;
pub mod encoding;
pub mod error;
pub mod expr;
pub mod progress;
pub mod record;
pub mod row;
pub mod schema;
pub mod secrets;
pub mod sketch_aggregates;
pub mod time;
pub mod typed;
pub mod typed_columns;
pub mod watermark;
pub mod window;

pub use error::{Error, Result};
