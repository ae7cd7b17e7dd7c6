//! `${VAR}` and `${VAR:-default}` in a pipeline file's string values, taken
//! from the environment — so that passwords and tokens live outside the
//! file. Substitution runs on parsed YAML strings, not on the text: a value
//! holding quotes, colons or `#` cannot change the file's structure, and a
//! parse error can never echo a secret. `$${` stands for a literal `${`.

/// Why a substitution failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EnvVarError {
    /// `${NAME}` with `NAME` unset and no default.
    Unset(String),
    /// `${` without its closing `}`.
    Unclosed,
}

/// `value` with every `${VAR}` / `${VAR:-default}` replaced by `lookup`.
pub(crate) fn substitute(
    value: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<String, EnvVarError> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        if let Some(literal) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = literal;
        } else if let Some(body) = after.strip_prefix("${") {
            let end = body.find('}').ok_or(EnvVarError::Unclosed)?;
            let (name, default) = match body[..end].split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (&body[..end], None),
            };
            // `${VAR:-x}` takes the default when VAR is unset or empty, as
            // the shell does.
            match (lookup(name).filter(|v| !v.is_empty()), default) {
                (Some(found), _) => out.push_str(&found),
                (None, Some(default)) => out.push_str(default),
                (None, None) => return Err(EnvVarError::Unset(name.to_string())),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// Substitutes in every string value of `yaml` (not in keys), reporting
/// the first failure with the dotted path of its value.
pub(crate) fn substitute_in_yaml(
    yaml: &mut serde_yaml::Value,
    path: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(), (String, EnvVarError)> {
    match yaml {
        serde_yaml::Value::String(s) => {
            *s = substitute(s, lookup).map_err(|e| (path.to_string(), e))?;
        }
        serde_yaml::Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                substitute_in_yaml(item, &format!("{path}[{i}]"), lookup)?;
            }
        }
        serde_yaml::Value::Mapping(map) => {
            for (key, item) in map.iter_mut() {
                let key = key.as_str().unwrap_or("?");
                let path = if path.is_empty() {
                    key.to_string()
                } else {
                    format!("{path}.{key}")
                };
                substitute_in_yaml(item, &path, lookup)?;
            }
        }
        serde_yaml::Value::Tagged(tagged) => substitute_in_yaml(&mut tagged.value, path, lookup)?,
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "USER" => Some("alice".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn variables_defaults_and_escapes() {
        assert_eq!(substitute("u=${USER}!", &env).unwrap(), "u=alice!");
        assert_eq!(substitute("${NOPE:-x:y}", &env).unwrap(), "x:y");
        assert_eq!(substitute("${EMPTY:-d}", &env).unwrap(), "d");
        assert_eq!(substitute("$${USER} $5", &env).unwrap(), "${USER} $5");
        assert_eq!(
            substitute("${NOPE}", &env),
            Err(EnvVarError::Unset("NOPE".into()))
        );
        assert_eq!(substitute("${USER", &env), Err(EnvVarError::Unclosed));
    }

    #[test]
    fn only_string_values_are_substituted_and_errors_name_the_path() {
        let mut yaml: serde_yaml::Value =
            serde_yaml::from_str("a: {b: ['${USER}', '${NOPE}']}").unwrap();
        let (path, error) = substitute_in_yaml(&mut yaml, "", &env).unwrap_err();
        assert_eq!(
            (path.as_str(), error),
            ("a.b[1]", EnvVarError::Unset("NOPE".into()))
        );
        assert_eq!(yaml["a"]["b"][0], "alice");
    }
}
