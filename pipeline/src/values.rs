//! Values the file's sections share: durations, timestamps, triggers.

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::time::Duration;
use tidemark::duration::parse_duration;
use tidemark::error::Error;
use tidemark::runtime::Trigger;

/// A duration written as a Spark interval string; checked on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationSpec(pub Duration);

impl DurationSpec {
    /// The duration as a string the parser accepts.
    pub fn to_spark_string(self) -> String {
        tidemark::duration::format_duration(self.0)
    }
}

pub(crate) fn strip_config_prefix(e: &Error) -> String {
    match e {
        Error::Config { reason, .. } => reason.clone(),
        other => other.to_string(),
    }
}

/// An RFC 3339 timestamp, checked on read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampSpec(pub i64);

/// `available_now` or `{micro_batch: 1 second}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TriggerSpec(pub Trigger);

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(DurationSpec)
            .map_err(|e| de::Error::custom(strip_config_prefix(&e)))
    }
}

impl<'de> Deserialize<'de> for TimestampSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        tidemark::time::parse_rfc3339(&text)
            .map(TimestampSpec)
            .ok_or_else(|| {
                de::Error::custom(format!(
                    "`{text}` is not an RFC 3339 timestamp (e.g. 2026-01-01T10:00:00Z)"
                ))
            })
    }
}

impl<'de> Deserialize<'de> for TriggerSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        const ALLOWED: &str =
            "allowed: available_now, {micro_batch: <interval>}, {real_time: <checkpoint interval>}";
        impl<'de> Visitor<'de> for V {
            type Value = TriggerSpec;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                write!(f, "a trigger; {ALLOWED}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<TriggerSpec, E> {
                match v {
                    "available_now" => Ok(TriggerSpec(Trigger::AvailableNow)),
                    other => Err(E::custom(format!("unknown trigger `{other}`; {ALLOWED}"))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<TriggerSpec, A::Error> {
                let key: String = map
                    .next_key()?
                    .ok_or_else(|| de::Error::custom(format!("empty trigger; {ALLOWED}")))?;
                match key.as_str() {
                    "micro_batch" => {
                        let d: DurationSpec = map.next_value()?;
                        Ok(TriggerSpec(Trigger::MicroBatch { interval: d.0 }))
                    }
                    "real_time" => {
                        let d: DurationSpec = map.next_value()?;
                        Ok(TriggerSpec(Trigger::RealTime {
                            checkpoint_interval: d.0,
                        }))
                    }
                    other => Err(de::Error::custom(format!(
                        "unknown trigger `{other}`; {ALLOWED}"
                    ))),
                }
            }
        }
        d.deserialize_any(V)
    }
}
