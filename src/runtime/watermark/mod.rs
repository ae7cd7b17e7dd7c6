//! The watermark's runtime parts, in one place (issue 46 item 5): how
//! event-time progress crosses a repartition topic (`markers`), how the
//! instances of one query share it (`exchange`), how what the others
//! publish is kept in step with what this instance has read (`alignment`),
//! and the query-wide progress an instance has counted, which its task
//! manager asks (`shared`).
//! The tracker itself, which combines a task's inputs into its watermark, is
//! `tidemark_types::watermark`.

mod alignment;
mod exchange;
mod markers;
mod shared;

pub(super) use alignment::ExchangeAlignment;
pub use exchange::{PartitionProgress, WatermarkExchange};
pub(super) use markers::forwarded_stream_maxima;
pub use markers::{WatermarkMarker, WATERMARK_MARKER_HEADER};
pub(super) use shared::SharedProgress;
