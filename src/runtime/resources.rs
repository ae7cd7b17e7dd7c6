//! The live parts a query runs with, apart from its plan: how records are
//! decoded, where bad and late ones go, where state lives, who hears of
//! progress, how watermarks are shared with other instances, where
//! interactive queries reach it and where global tables are read from.
//! The trigger loop takes them; the plan stays as it was built.

use super::{DeadLetter, Decoder, Sink, StateBackend, StateService, TableFeed, WatermarkExchange};
use crate::progress::ProgressListener;

/// A query's resources. Each is optional: the loop has a default for
/// each, except a global table's feed, whose absence `Query::run` refuses.
#[derive(Default)]
pub(crate) struct QueryResources {
    /// How records become rows (default: JSON objects, types inferred).
    pub(super) decoder: Option<Box<dyn Decoder>>,
    /// Where records that fail go (default: logged and counted).
    pub(super) dead_letter: Option<Box<dyn DeadLetter>>,
    /// Where rows behind the watermark go (default: dropped and counted).
    pub(super) late_data: Option<Box<dyn Sink>>,
    /// Where operators keep state (default: in memory).
    pub(super) state_backend: Option<Box<dyn StateBackend>>,
    /// Who receives each batch's progress.
    pub(super) listeners: Vec<Box<dyn ProgressListener>>,
    /// Shares partitions' progress with the query's other instances
    /// (`watermark_scope: query`).
    pub(super) watermark_exchange: Option<Box<dyn WatermarkExchange>>,
    /// Where interactive queries' requests reach the running query.
    pub(super) state_service: Option<StateService>,
    /// Where each global table (by name) reads its topic from.
    pub(super) table_feeds: Vec<(String, Box<dyn TableFeed>)>,
}
