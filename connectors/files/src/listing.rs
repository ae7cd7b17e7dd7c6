//! Which files of the source directory are ready to be read: not hidden,
//! not a temporary name, matching the pattern, and settled (unmodified for
//! the settle delay), in name order.

use crate::progress::LoggedFile;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tidemark::error::{Error, Result};

/// Suffixes writers give a file while they write it, renaming it when
/// done (HDFS and Spark's `._COPYING_`, browsers', editors', rsync's).
const TEMPORARY_SUFFIXES: [&str; 6] = [
    ".tmp",
    ".part",
    ".crdownload",
    "._COPYING_",
    ".inprogress",
    ".swp",
];

/// Whether a file name is one a writer is still busy with, or one that is
/// not data (hidden, `_SUCCESS`-style markers).
pub(crate) fn is_temporary_or_hidden(name: &str) -> bool {
    name.starts_with('.')
        || name.starts_with('_')
        || TEMPORARY_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// What makes a file ready.
#[derive(Debug, Clone)]
pub(crate) struct ReadyRule {
    /// Only names matching this glob (`*.csv.gz`); `None`: every name.
    pub(crate) pattern: Option<glob::Pattern>,
    /// Files modified more recently than this are left for a later batch.
    pub(crate) settle_delay: Duration,
    /// Whether symbolic links are read as what they point to.
    pub(crate) follow_symlinks: bool,
}

/// A batch-sized unit of input: one file, or (a source of several streams)
/// the files of one name across the streams' sub-directories.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    /// The files, relative to the source directory.
    pub(crate) files: Vec<LoggedFile>,
}

/// The units ready to read in `dir` (or, with `inputs`, in each
/// `dir/<input>`), in name order, leaving out files in `seen`.
pub(crate) fn ready_units(
    dir: &Path,
    inputs: &[String],
    rule: &ReadyRule,
    seen: &BTreeSet<String>,
) -> Result<Vec<Unit>> {
    let now = SystemTime::now();
    let mut by_name: BTreeMap<String, Vec<LoggedFile>> = BTreeMap::new();
    let mut unsettled = BTreeSet::new();
    let subdirs: Vec<Option<&str>> = match inputs.is_empty() {
        true => vec![None],
        false => inputs.iter().map(|i| Some(i.as_str())).collect(),
    };
    for sub in subdirs {
        let listed = sub.map_or_else(|| dir.to_path_buf(), |s| dir.join(s));
        for (name, path) in list_files(&listed, rule.follow_symlinks)? {
            if is_temporary_or_hidden(&name)
                || !rule.pattern.as_ref().is_none_or(|p| p.matches(&name))
            {
                continue;
            }
            let relative = sub.map_or_else(|| name.clone(), |s| format!("{s}/{name}"));
            if seen.contains(&relative) {
                continue;
            }
            let Some((file, settled)) = describe(&path, relative, now, rule.settle_delay)? else {
                continue;
            };
            if !settled {
                unsettled.insert(name.clone());
            }
            by_name.entry(name).or_default().push(file);
        }
    }
    Ok(by_name
        .into_iter()
        .filter(|(name, _)| !unsettled.contains(name))
        .map(|(_, files)| Unit { files })
        .collect())
}

/// The regular files of `dir` by name; a symbolic link only when
/// `follow_symlinks` (and it leads to a regular file).
fn list_files(dir: &Path, follow_symlinks: bool) -> Result<Vec<(String, PathBuf)>> {
    let mut files = Vec::new();
    for entry in
        fs::read_dir(dir).map_err(|e| Error::io(format!("reading {}", dir.display()), e))?
    {
        let entry = entry.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        let path = entry.path();
        // The entry's own type: a link is not followed to decide.
        let kind = entry
            .file_type()
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let is_file = match kind.is_symlink() {
            true if !follow_symlinks => {
                tracing::debug!(path = %path.display(), "symbolic link left alone (source.follow_symlinks: false)");
                false
            }
            true => path.is_file(),
            false => kind.is_file(),
        };
        if let (Some(name), true) = (entry.file_name().to_str(), is_file) {
            files.push((name.to_string(), path));
        }
    }
    Ok(files)
}

/// A file's size and modification time in epoch milliseconds, as the log
/// records them; `None` when it is gone.
pub(crate) fn size_and_modified(path: &Path) -> Result<Option<(u64, i64)>> {
    let metadata = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    Ok(Some((metadata.len(), modified_ms(&metadata))))
}

/// A file's modification time in epoch milliseconds (0 when unknown).
fn modified_ms(metadata: &fs::Metadata) -> i64 {
    metadata
        .modified()
        .unwrap_or(UNIX_EPOCH)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A file's log entry and whether it has settled; `None` when it vanished
/// since the listing (renamed away: it is not there to read).
fn describe(
    path: &Path,
    relative: String,
    now: SystemTime,
    settle_delay: Duration,
) -> Result<Option<(LoggedFile, bool)>> {
    let metadata = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
    };
    let modified = metadata.modified().unwrap_or(UNIX_EPOCH);
    let age = now.duration_since(modified).unwrap_or_default();
    let file = LoggedFile {
        path: relative,
        size: metadata.len(),
        modified_ms: modified_ms(&metadata),
    };
    Ok(Some((file, age >= settle_delay)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(pattern: Option<&str>, settle_delay: Duration) -> ReadyRule {
        ReadyRule {
            pattern: pattern.map(|p| glob::Pattern::new(p).unwrap()),
            settle_delay,
            follow_symlinks: false,
        }
    }

    fn names(units: &[Unit]) -> Vec<String> {
        units
            .iter()
            .flat_map(|u| u.files.iter().map(|f| f.path.clone()))
            .collect()
    }

    #[test]
    fn temporary_hidden_unmatched_and_seen_files_are_not_ready() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "b.csv",
            "a.csv",
            ".hidden.csv",
            "_SUCCESS",
            "c.csv.tmp",
            "d.csv._COPYING_",
            "e.json",
            "f.csv",
        ] {
            fs::write(dir.path().join(name), "x").unwrap();
        }
        let seen = ["f.csv".to_string()].into();
        let ready =
            ready_units(dir.path(), &[], &rule(Some("*.csv"), Duration::ZERO), &seen).unwrap();
        assert_eq!(names(&ready), ["a.csv", "b.csv"]);
    }

    #[test]
    fn a_file_modified_within_the_settle_delay_waits() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("fresh"), "x").unwrap();
        let waiting = ready_units(
            dir.path(),
            &[],
            &rule(None, Duration::from_secs(3600)),
            &BTreeSet::new(),
        )
        .unwrap();
        assert!(waiting.is_empty());
        let ready = ready_units(
            dir.path(),
            &[],
            &rule(None, Duration::ZERO),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(names(&ready), ["fresh"]);
    }

    #[test]
    fn several_streams_group_files_of_one_name() {
        let dir = tempfile::tempdir().unwrap();
        for (input, name) in [("l", "1"), ("r", "1"), ("r", "2")] {
            fs::create_dir_all(dir.path().join(input)).unwrap();
            fs::write(dir.path().join(input).join(name), "x").unwrap();
        }
        let inputs = ["l".to_string(), "r".to_string()];
        let ready = ready_units(
            dir.path(),
            &inputs,
            &rule(None, Duration::ZERO),
            &BTreeSet::new(),
        )
        .unwrap();
        assert_eq!(ready.len(), 2);
        assert_eq!(names(&ready[..1]), ["l/1", "r/1"]);
        assert_eq!(names(&ready[1..]), ["r/2"]);
    }
}
