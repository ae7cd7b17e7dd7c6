//! The versions of what tidemark stores: every encoding that outlives a
//! process (operator state, changelog records, task checkpoints and the
//! offset metadata carrying them, local checkpoint files, the files
//! source's log, watermark markers) carries a version number, so that a
//! release reads what an older one wrote and refuses, with
//! [`Error::UnknownEncoding`], what a newer one wrote instead of misreading
//! it. `docs/architecture.md` lists each encoding with its version.

use crate::error::{Error, Result};

/// The version of an encoding written before versions were recorded.
pub const fn first_version() -> u32 {
    1
}

/// Refuses `found` when newer than `supported`, naming `what` (called only
/// then: building the description may allocate).
pub fn check_version(what: impl FnOnce() -> String, found: u32, supported: u32) -> Result<()> {
    if found > supported {
        return Err(unknown(what, found.to_string(), supported));
    }
    Ok(())
}

/// [`Error::UnknownEncoding`] of `what`, which carries `found`.
pub fn unknown(what: impl FnOnce() -> String, found: String, supported: u32) -> Error {
    Error::UnknownEncoding {
        what: what(),
        found,
        supported,
    }
}

/// Refuses the JSON object `text` when its `"v"` is newer than
/// `supported`, or is no version at all (not a whole number from 1 up: a
/// writer this release does not know). An object without `"v"` predates
/// versions; anything not a JSON object passes, for the reader of the
/// whole to judge.
pub fn check_json_version(
    what: impl FnOnce() -> String,
    text: &[u8],
    supported: u32,
) -> Result<()> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_slice(text) else {
        return Ok(());
    };
    check_fields_version(what, &fields, supported)
}

/// [`check_json_version`] of a JSON object already parsed.
pub fn check_fields_version(
    what: impl FnOnce() -> String,
    fields: &serde_json::Map<String, serde_json::Value>,
    supported: u32,
) -> Result<()> {
    let Some(v) = fields.get("v") else {
        return Ok(());
    };
    match v
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n >= 1)
    {
        Some(found) => check_version(what, found, supported),
        None => Err(unknown(what, v.to_string(), supported)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found_of(e: &Error) -> &str {
        match e {
            Error::UnknownEncoding { found, .. } => found,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn a_newer_version_is_refused_naming_what_and_both_versions() {
        let e = check_json_version(|| "the log entry `3`".into(), br#"{"v": 2, "x": []}"#, 1)
            .unwrap_err();
        assert_eq!(found_of(&e), "2");
        let text = e.to_string();
        assert!(
            text.contains("the log entry `3`") && text.contains("version 2"),
            "{text}"
        );
        // A "v" that is no version number is no version this release wrote.
        for odd in [
            &br#"{"v": "2"}"#[..],
            br#"{"v": 2.5}"#,
            br#"{"v": 0}"#,
            br#"{"v": -1}"#,
        ] {
            assert!(check_json_version(|| "x".into(), odd, 1).is_err());
        }
        // The same or an older version, no version, not an object: passed on.
        for ok in [&br#"{"v": 1}"#[..], br#"{"x": 1}"#, b"[2]", b"\x01\x02"] {
            check_json_version(|| unreachable!(), ok, 1).unwrap();
        }
    }
}
