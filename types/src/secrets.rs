//! Client properties that may hold secrets — librdkafka's (`sasl.password`,
//! `ssl.key.password`, `sasl.oauthbearer.client.secret`), a schema
//! registry's (`basic.auth.user.info`), a Delta table's object-store
//! credentials — and the one rule for showing them anywhere (`Debug`,
//! logs, `describe`, progress, error texts, dead-letter headers): the value
//! of a property whose name looks secret is replaced by [`MASK`].

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};

/// What a secret value is shown as.
pub const MASK: &str = "*****";

/// Words that make a property's value a secret when its name contains one
/// (case-insensitive). `key` covers `ssl.key.pem`, `ssl.key.password` and
/// object stores' `access_key_id` / `secret_access_key`; `user.info` is the
/// registry's `user:password`; `jaas` a JAAS line with a password in it.
const SECRET_WORDS: [&str; 7] = [
    "password",
    "secret",
    "token",
    "key",
    "credential",
    "user.info",
    "jaas",
];

/// Whether the value of property `name` is a secret.
pub fn is_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|word| name.contains(word))
}

/// `url` with a password in its user info (`https://user:pw@host`) masked.
pub fn mask_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return url.to_string();
    };
    let authority_end = url[scheme_end..]
        .find('/')
        .map_or(url.len(), |at| scheme_end + at);
    match url[scheme_end..authority_end].rfind('@') {
        Some(at) => {
            let user_info = &url[scheme_end..scheme_end + at];
            let user = user_info.split(':').next().unwrap_or_default();
            format!(
                "{}{user}:{MASK}{}",
                &url[..scheme_end],
                &url[scheme_end + at..]
            )
        }
        None => url.to_string(),
    }
}

/// `text` with every occurrence of each of `secrets` (of 4 characters or
/// more: shorter ones would mask ordinary words) replaced by [`MASK`]; for
/// error texts from libraries that may echo a configuration value.
pub fn redact<'a>(text: &str, secrets: impl IntoIterator<Item = &'a str>) -> String {
    let mut out = text.to_string();
    for secret in secrets {
        if secret.len() >= 4 && out.contains(secret) {
            out = out.replace(secret, MASK);
        }
    }
    out
}

/// Named string properties whose secret values ([`is_secret`]) are masked
/// wherever they are shown: its `Debug` and [`Properties::masked`] never
/// print one. Reads and writes as a plain map (YAML, JSON).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Properties(pub BTreeMap<String, String>);

impl Properties {
    /// The properties with secret values replaced by [`MASK`].
    pub fn masked(&self) -> BTreeMap<String, String> {
        self.0
            .iter()
            .map(|(name, value)| {
                let shown = if is_secret(name) {
                    MASK.to_string()
                } else {
                    value.clone()
                };
                (name.clone(), shown)
            })
            .collect()
    }

    /// The secret values, to [`redact`] from texts that may echo them.
    pub fn secret_values(&self) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(|(name, _)| is_secret(name))
            .map(|(_, value)| value.as_str())
    }

    /// These properties with `overrides` added (an override wins).
    pub fn merged(&self, overrides: &BTreeMap<String, String>) -> Properties {
        let mut merged = self.clone();
        merged.extend(overrides.iter().map(|(k, v)| (k.clone(), v.clone())));
        merged
    }
}

impl fmt::Debug for Properties {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.masked()).finish()
    }
}

impl Deref for Properties {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Properties {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl From<BTreeMap<String, String>> for Properties {
    fn from(map: BTreeMap<String, String>) -> Self {
        Properties(map)
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Properties {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Properties(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl<'a> IntoIterator for &'a Properties {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_are_masked_and_others_shown() {
        let properties: Properties = [
            ("sasl.password", "hunter22"),
            ("sasl.username", "alice"),
            ("ssl.key.pem", "-----BEGIN"),
            ("sasl.oauthbearer.client.secret", "s3cret"),
            ("basic.auth.user.info", "u:p4ss"),
            ("AWS_SECRET_ACCESS_KEY", "abcd"),
            ("security.protocol", "SASL_SSL"),
        ]
        .into_iter()
        .collect();
        let shown = format!("{properties:?}");
        for secret in ["hunter22", "-----BEGIN", "s3cret", "u:p4ss", "abcd"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("alice") && shown.contains("SASL_SSL"),
            "{shown}"
        );
        assert_eq!(properties.masked()["sasl.password"], MASK);
        assert_eq!(properties.secret_values().count(), 5);
    }

    #[test]
    fn url_passwords_and_echoed_secrets_are_masked() {
        assert_eq!(
            mask_url("https://bob:pw@registry:8081/apis"),
            "https://bob:*****@registry:8081/apis"
        );
        assert_eq!(mask_url("http://registry:8081"), "http://registry:8081");
        assert_eq!(
            redact("bad value \"hunter22\" for x", ["hunter22", "ab"]),
            "bad value \"*****\" for x"
        );
    }
}
