//! The versions of what tidemark stores: every encoding that outlives a
//! process (operator state, changelog records, task checkpoints and the
//! offset metadata carrying them, local checkpoint files, the files
//! source's log, watermark markers) carries a version number, so that a
//! release reads what an older one wrote and refuses, with
//! [`Error::UnknownEncoding`], what a newer one wrote instead of misreading
//! it. `docs/architecture.md` lists each encoding with its version.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// The version field of a JSON encoding, `"v"`, read on its own before the
/// rest: a newer encoding may not parse as this release's type at all. An
/// encoding without the field predates versions: version 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodingVersion {
    /// The version; 1 when absent.
    #[serde(rename = "v", default = "first_version")]
    pub version: u32,
}

/// The version of an encoding written before versions were recorded.
pub const fn first_version() -> u32 {
    1
}

impl EncodingVersion {
    /// The version of the JSON object `text`: `None` when `text` is not a
    /// JSON object (left to the reader of the whole to report).
    pub fn of_json(text: &[u8]) -> Option<u32> {
        serde_json::from_slice::<EncodingVersion>(text)
            .ok()
            .map(|v| v.version)
    }
}

/// Refuses `found` when newer than `supported`, naming `what` (called only
/// then: building the description may allocate).
pub fn check_version(what: impl FnOnce() -> String, found: u32, supported: u32) -> Result<()> {
    if found > supported {
        return Err(Error::UnknownEncoding {
            what: what(),
            found,
            supported,
        });
    }
    Ok(())
}

/// Refuses the JSON object `text` when its `"v"` is newer than
/// `supported`; anything else (no version, not an object) passes, for the
/// reader of the whole to judge.
pub fn check_json_version(
    what: impl FnOnce() -> String,
    text: &[u8],
    supported: u32,
) -> Result<()> {
    match EncodingVersion::of_json(text) {
        Some(found) => check_version(what, found, supported),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_version_is_refused_naming_what_and_both_versions() {
        let e = check_json_version(|| "the log entry `3`".into(), br#"{"v": 2, "x": []}"#, 1)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::UnknownEncoding {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{e}"
        );
        let text = e.to_string();
        assert!(
            text.contains("the log entry `3`") && text.contains("version 2"),
            "{text}"
        );
        // The same or an older version, no version, not JSON: passed on.
        for ok in [&br#"{"v": 1}"#[..], br#"{"x": 1}"#, b"[1]", b"\x01\x02"] {
            check_json_version(|| unreachable!(), ok, 1).unwrap();
        }
        assert_eq!(EncodingVersion::of_json(br#"{"batchId": 3}"#), Some(1));
    }
}
