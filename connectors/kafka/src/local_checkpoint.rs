//! The checkpoint file a cleanly closed task leaves next to its RocksDB
//! files: the changelog offset each store's local files reflect, so that a
//! restart restores only what came after (and a standby resumes from it).

use tidemark::error::{Error, Result};

/// The file a cleanly closed task leaves next to its RocksDB files.
pub(crate) const CHECKPOINT_FILE: &str = ".checkpoint";

/// Changelog offset (exclusive) each store's local files reflect.
pub(crate) type LocalCheckpoint = std::collections::BTreeMap<String, i64>;

/// Reads and deletes the task's checkpoint file: from now on the local
/// files change, and a crash before the next clean close must not trust
/// them. Missing or unreadable: empty.
pub(crate) fn take_local_checkpoint(file: &std::path::Path) -> LocalCheckpoint {
    let Ok(text) = std::fs::read_to_string(file) else {
        return LocalCheckpoint::new();
    };
    let _ = std::fs::remove_file(file);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        tracing::warn!(file = %file.display(), error = %e, "unreadable local checkpoint ignored");
        LocalCheckpoint::new()
    })
}

/// Reads a checkpoint file without deleting it; missing or unreadable:
/// empty.
pub(crate) fn read_local_checkpoint(file: &std::path::Path) -> LocalCheckpoint {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default()
}

/// Writes the checkpoint file atomically (temporary file, then rename).
pub(crate) fn write_local_checkpoint(
    file: &std::path::Path,
    checkpoint: &LocalCheckpoint,
) -> Result<()> {
    let text = serde_json::to_string(checkpoint).map_err(|e| Error::Source(e.to_string()))?;
    let temporary = file.with_extension("tmp");
    std::fs::write(&temporary, text)
        .and_then(|_| std::fs::rename(&temporary, file))
        .map_err(|e| Error::io(format!("writing {}", file.display()), e))
}
