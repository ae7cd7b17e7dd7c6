//! The one error type of the core crate.

use crate::record::SourcePosition;

/// Errors raised by the tidemark engine.
///
/// Record-level errors carry the record's [`SourcePosition`] so that a
/// dead-letter entry or a log line names exactly which input failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value is invalid; names the key and what is allowed.
    #[error("invalid configuration `{key}`: {reason}")]
    Config {
        /// The configuration key, e.g. `watermark` or `source.kind`.
        key: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A record could not be decoded or evaluated.
    #[error("bad record at {position}: field `{field}`: {reason}")]
    BadRecord {
        /// Where the record came from.
        position: SourcePosition,
        /// The field (or `<value>` for the whole payload).
        field: String,
        /// Why it was refused.
        reason: String,
    },
    /// A step could not evaluate a row (a missing key, a column of the
    /// wrong type): bad data, which the router reports as a
    /// [`Error::BadRecord`] naming the record.
    #[error("field `{field}`: {reason}")]
    BadRow {
        /// The column (or `<step>`).
        field: String,
        /// Why the row was refused.
        reason: String,
    },
    /// An expression could not be parsed (or, on a row, evaluated).
    #[error("invalid expression `{expression}`: {reason}")]
    Expression {
        /// The expression text.
        expression: String,
        /// What is wrong.
        reason: String,
    },
    /// A source failed (connection, read, commit).
    #[error("source error: {0}")]
    Source(String),
    /// A sink failed (write, flush, commit).
    #[error("sink error: {0}")]
    Sink(String),
    /// A source's client failed (the broker, a file, the registry): what
    /// was being done, with the client's own error kept as the source, so
    /// that a caller can inspect it (`std::error::Error::source`, then
    /// `downcast_ref`) rather than parse a message.
    #[error("source error: {context}: {source}")]
    SourceFailed {
        /// What was being done (`reading the committed checkpoints`).
        context: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A sink's client failed (a write, flush or commit), its own error
    /// kept as the source (see [`Error::SourceFailed`]).
    #[error("sink error: {context}: {source}")]
    SinkFailed {
        /// What was being done.
        context: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The batch's transaction was aborted (a rebalance moved partitions
    /// while it ran, or it timed out): nothing of it is visible, and the
    /// query replays from the last commit without restarting its clients.
    #[error("batch aborted, replaying from the last commit: {0}")]
    BatchAborted(String),
    /// Output no retry can deliver: the broker (or the client) refuses a
    /// record or a topic for good — a record over the topic's size limit, a
    /// missing write ACL, an unkeyed record into a compacted topic. The run
    /// ends with it rather than replay the batch for ever.
    #[error("cannot deliver to `{topic}` partition {partition}: {reason}")]
    Undeliverable {
        /// The topic refused.
        topic: String,
        /// Its partition (-1: not chosen yet).
        partition: i32,
        /// The broker's or librdkafka's reason.
        reason: String,
    },
    /// An internal invariant failed: a bug in tidemark or in a user's
    /// aggregate (an accumulator that cannot be encoded). Running again
    /// would fail the same way, so the run ends with it, never retried.
    #[error("internal error: {0}")]
    Internal(String),
    /// Stored bytes that do not hold what their layout says (a truncated
    /// operator state, a count of the wrong size): never read as a guess.
    /// Retried like a source failure within the task timeout, since a
    /// rebuild can restore a corrupt local store from its changelog.
    #[error("{what} is corrupt: {reason}")]
    Corrupt {
        /// What was read, with where it is (a store and its entry, a
        /// record).
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Stored bytes (operator state, a changelog record, a checkpoint, a
    /// log entry) in an encoding newer than this release reads: written by
    /// a later release. Never read as if it were an older encoding, and
    /// never retried: reading again meets the same bytes.
    #[error("{what} has encoding version {found}, written by a newer release (this one reads up to {supported}): run that release or a later one, or start over without it")]
    UnknownEncoding {
        /// What was read, with where it is (a topic, partition and offset,
        /// a file).
        what: String,
        /// The version it carries, as found.
        found: String,
        /// The newest version this release reads.
        supported: u32,
    },
    /// A user's stateful processor returned an error or panicked: the
    /// batch fails with the key it was handling and is not committed;
    /// running again would meet the same rows, so the run ends with it.
    #[error("stateful processor `{processor}` failed on key {key}: {source}")]
    Processor {
        /// The processor's step, as `describe` names it.
        processor: String,
        /// The grouping key being handled.
        key: String,
        /// The processor's error (or the panic's message).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// State could not be read or written.
    #[error("state error: {0}")]
    State(#[from] StateError),
    /// An I/O error with the path or resource involved.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// Shorthand for [`Error::Config`].
    pub fn config(key: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Config {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::BadRow`].
    pub fn bad_row(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::BadRow {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Whether the error is about the data of one record (it goes to the
    /// dead-letter output and the query goes on) rather than about the
    /// infrastructure — state, disk, broker, registry — which holds the
    /// batch back: its offsets are not committed and it is replayed.
    pub fn is_bad_data(&self) -> bool {
        matches!(
            self,
            Error::BadRecord { .. } | Error::BadRow { .. } | Error::Expression { .. }
        )
    }

    /// Shorthand for [`Error::SourceFailed`]: `context` is what was being
    /// done, `source` the client's error.
    pub fn source_failed(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::SourceFailed {
            context: context.into(),
            source: source.into(),
        }
    }

    /// Shorthand for [`Error::SinkFailed`].
    pub fn sink_failed(
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::SinkFailed {
            context: context.into(),
            source: source.into(),
        }
    }

    /// A source's or sink's error with what the caller was doing (`outer`)
    /// put before its own context; a client's error stays the source, so
    /// that wrapping one tidemark error in another does not hide it. Other
    /// errors come back unchanged.
    pub fn in_context(self, outer: impl std::fmt::Display) -> Self {
        match self {
            Error::SourceFailed { context, source } => Error::SourceFailed {
                context: format!("{outer}: {context}"),
                source,
            },
            Error::SinkFailed { context, source } => Error::SinkFailed {
                context: format!("{outer}: {context}"),
                source,
            },
            Error::Source(message) => Error::Source(format!("{outer}: {message}")),
            Error::Sink(message) => Error::Sink(format!("{outer}: {message}")),
            other => other,
        }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

/// Result type of the core crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of a state store (`tidemark_state` re-exports it).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The backing store failed.
    #[error("state store `{store}`: {reason}")]
    Backend {
        /// The store's name.
        store: String,
        /// What failed.
        reason: String,
    },
    /// A store holds bytes of a layout newer than this release reads:
    /// written by a later release. Never retried: reading again meets the
    /// same bytes.
    #[error("state store `{store}`: {what} has layout {found}, written by a newer release (this one reads up to {supported}): run that release or a later one, or start over without its state")]
    UnknownLayout {
        /// The store's name.
        store: String,
        /// What was read (a cell, at its key).
        what: String,
        /// The layout it carries.
        found: u32,
        /// The newest layout this release reads.
        supported: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// A client's error stays inspectable through every layer that adds
    /// what it was doing, and the message reads outermost first.
    #[test]
    fn a_client_error_stays_the_source_through_added_context() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::source_failed("reading committed offsets", refused)
            .in_context("reading the committed checkpoints");
        assert_eq!(
            e.to_string(),
            "source error: reading the committed checkpoints: reading committed offsets: refused"
        );
        let source = std::error::Error::source(&e).expect("kept");
        let io = source
            .downcast_ref::<std::io::Error>()
            .expect("the client's own type");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        let config = Error::config("k", "r").in_context("ignored");
        assert_eq!(config.to_string(), "invalid configuration `k`: r");
    }
}
