//! Who else runs a query: the members of its consumer group, each with the
//! address its interactive queries answer on and the partitions assigned
//! to it, read from the group's own description (as Kafka Streams finds
//! `application.server` in the group's assignment).
//!
//! A member serving interactive queries sets its consumer's `client.id` to
//! end in `@<advertised address>` ([`serving_client_id`]); the group
//! coordinator reports client ids and assignments to anyone who asks.

use crate::connection::KafkaConnection;
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::time::Duration;
use tidemark::error::{Error, Result};

/// One member of the group that serves interactive queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    /// The address its interactive queries answer on (`host:port`).
    pub advertised: String,
    /// The partitions assigned to it, as `topic/partition`.
    pub partitions: Vec<String>,
}

/// The consumer `client.id` of a member serving on `advertised`, keeping
/// the `client.id` the user set (or `tidemark`) in front.
pub fn serving_client_id(user_client_id: Option<&str>, advertised: &str) -> String {
    format!("{}@{advertised}", user_client_id.unwrap_or("tidemark"))
}

/// Reads a consumer group's members.
pub struct GroupMembers {
    client: BaseConsumer,
    group: String,
}

impl GroupMembers {
    /// A reader of `group`'s members on `cluster`.
    pub fn new(cluster: &KafkaConnection, group: &str) -> Result<Self> {
        let config = cluster.client_config(&[]);
        Ok(GroupMembers {
            client: cluster.create_plain(&config, "group members client")?,
            group: group.to_string(),
        })
    }

    /// The members serving interactive queries, when the group is stable;
    /// while it rebalances (or is empty) an error saying so: asking again
    /// later may give another answer.
    pub fn serving_members(&self) -> Result<Vec<GroupMember>> {
        let list = self
            .client
            .fetch_group_list(Some(&self.group), Duration::from_secs(5))
            .map_err(|e| Error::Source(format!("describing group `{}`: {e}", self.group)))?;
        let Some(group) = list.groups().iter().find(|g| g.name() == self.group) else {
            return Err(Error::Source(format!(
                "group `{}` is not known",
                self.group
            )));
        };
        if group.state() != "Stable" {
            return Err(Error::Source(format!(
                "group `{}` is rebalancing (state {})",
                self.group,
                group.state()
            )));
        }
        Ok(group
            .members()
            .iter()
            .filter_map(|m| {
                let (_, advertised) = m.client_id().rsplit_once('@')?;
                Some(GroupMember {
                    advertised: advertised.to_string(),
                    partitions: m.assignment().map(assigned_partitions).unwrap_or_default(),
                })
            })
            .collect())
    }
}

/// The partitions of a consumer protocol assignment (version, then per
/// topic its name and partitions; user data after is ignored); what does
/// not parse is left out.
fn assigned_partitions(bytes: &[u8]) -> Vec<String> {
    let mut reader = Reader(bytes);
    let mut partitions = Vec::new();
    let parsed = (|| {
        reader.i16()?;
        for _ in 0..reader.i32()? {
            let topic = reader.string()?;
            for _ in 0..reader.i32()? {
                partitions.push(format!("{topic}/{}", reader.i32()?));
            }
        }
        Some(())
    })();
    if parsed.is_none() {
        tracing::debug!("a group member's assignment did not parse");
    }
    partitions
}

/// Big-endian reads over a byte slice, `None` past its end.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let len = usize::try_from(self.i16()?).ok()?;
        Some(String::from_utf8_lossy(self.take(len)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_lists_its_topics_partitions() {
        let mut bytes = vec![0, 1, 0, 0, 0, 1, 0, 6];
        bytes.extend_from_slice(b"events");
        bytes.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 5]);
        bytes.extend_from_slice(&[0, 0, 0, 0]);
        assert_eq!(assigned_partitions(&bytes), vec!["events/3", "events/5"]);
        assert!(assigned_partitions(&bytes[..9]).is_empty());
    }

    #[test]
    fn the_serving_address_follows_the_last_at_sign() {
        let id = serving_client_id(Some("fraud@eu"), "host-a:7070");
        assert_eq!(id.rsplit_once('@').unwrap().1, "host-a:7070");
    }
}
