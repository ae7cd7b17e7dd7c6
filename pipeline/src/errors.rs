//! A pipeline file's errors, naming the line and column of the key at
//! fault.

use std::fmt;

/// A pipeline-file error with its place in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineError {
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "line {l}, column {c}: {}", self.message),
            (Some(l), None) => write!(f, "line {l}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PipelineError {}

/// A YAML error at `path`, placed at the key's line when serde_yaml lost it.
pub(crate) fn yaml_error(text: &str, path: String, inner: serde_yaml::Error) -> PipelineError {
    let (_, message) = split_yaml_message(&inner.to_string());
    // serde_yaml loses the place of errors raised while checking a value
    // (it reports 1:1); the path finds the key's line instead.
    let by_path = (path != ".")
        .then(|| crate::yaml_paths::position_of(text, &path))
        .flatten();
    let by_serde = inner
        .location()
        .filter(|l| (l.line(), l.column()) != (1, 1))
        .map(|l| (l.line(), l.column()));
    let place = match (by_path, by_serde) {
        (Some(p), Some(s)) => Some(if s.0 >= p.0 { s } else { p }),
        (p, s) => p.or(s),
    };
    PipelineError {
        line: place.map(|p| p.0),
        column: place.map(|p| p.1),
        message: if path == "." {
            message
        } else {
            format!("`{path}`: {message}")
        },
    }
}

/// A failed `${VAR}` substitution, naming the variable and the value's key
/// (never a value: it may be a secret).
pub(crate) fn env_var_error(
    text: &str,
    path: &str,
    error: crate::env_vars::EnvVarError,
) -> PipelineError {
    let message = match error {
        crate::env_vars::EnvVarError::Unset(name) => format!(
            "`{path}`: environment variable `{name}` is not set (set it, or give a default: `${{{name}:-value}}`)"
        ),
        crate::env_vars::EnvVarError::Unclosed => {
            format!("`{path}`: `${{` without its closing `}}` (write `$${{` for a literal `${{`)")
        }
    };
    let place = crate::yaml_paths::position_of(text, path);
    PipelineError {
        line: place.map(|p| p.0),
        column: place.map(|p| p.1),
        message,
    }
}

pub(crate) fn line_of_key(text: &str, key: &str) -> Option<usize> {
    let needle = format!("{key}:");
    text.lines()
        .position(|l| l.trim_start().trim_start_matches("- ").starts_with(&needle))
        .map(|i| i + 1)
}

/// Splits serde_yaml's `path: message at line L column C` into its parts.
fn split_yaml_message(raw: &str) -> (Option<String>, String) {
    let without_place = match raw.rfind(" at line ") {
        Some(i) => &raw[..i],
        None => raw,
    };
    match without_place.split_once(": ") {
        Some((path, message))
            if !path.contains(' ') && !path.is_empty() && !path.starts_with('`') =>
        {
            (Some(path.to_string()), message.to_string())
        }
        _ => (None, without_place.to_string()),
    }
}
