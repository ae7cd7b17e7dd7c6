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
    /// What the serving members' client ids start with (`<client.id>@`):
    /// another client in the group cannot name an address to be asked.
    prefix: String,
}

impl GroupMembers {
    /// A reader of `group`'s members on `cluster`, those serving with the
    /// consumer `client.id` `user_client_id` (or the default).
    pub fn new(
        cluster: &KafkaConnection,
        group: &str,
        user_client_id: Option<&str>,
    ) -> Result<Self> {
        let config = cluster.client_config(&[]);
        Ok(GroupMembers {
            client: cluster.create_plain(&config, "group members client")?,
            group: group.to_string(),
            prefix: serving_client_id(user_client_id, ""),
        })
    }

    /// The members serving interactive queries, when the group is stable;
    /// while it rebalances (or is empty) an error saying so: asking again
    /// later may give another answer.
    pub fn serving_members(&self) -> Result<Vec<GroupMember>> {
        let list = self
            .client
            .fetch_group_list(Some(&self.group), Duration::from_secs(5))
            .map_err(|e| Error::source_failed(format!("describing group `{}`", self.group), e))?;
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
        let members: Vec<GroupMember> = group
            .members()
            .iter()
            .filter_map(|m| {
                let advertised = m.client_id().strip_prefix(&self.prefix)?;
                Some(GroupMember {
                    advertised: advertised.to_string(),
                    partitions: m.assignment().map(assigned_partitions).unwrap_or_default(),
                })
            })
            .collect();
        self.check_all_assigned(&members)?;
        Ok(members)
    }

    /// Between the rounds of a cooperative rebalance the group is stable
    /// with revoked partitions not yet given to anyone: a key in one of
    /// them is held by no member for now.
    fn check_all_assigned(&self, members: &[GroupMember]) -> Result<()> {
        let assigned: std::collections::BTreeSet<&str> = members
            .iter()
            .flat_map(|m| m.partitions.iter().map(String::as_str))
            .collect();
        let topics: std::collections::BTreeSet<&str> = assigned
            .iter()
            .filter_map(|p| p.rsplit_once('/').map(|(topic, _)| topic))
            .collect();
        for topic in topics {
            let metadata = self
                .client
                .fetch_metadata(Some(topic), Duration::from_secs(5))
                .map_err(|e| Error::source_failed(format!("partitions of `{topic}`"), e))?;
            let count = metadata
                .topics()
                .first()
                .map_or(0, |t| t.partitions().len());
            let unassigned: Vec<usize> = (0..count)
                .filter(|p| !assigned.contains(format!("{topic}/{p}").as_str()))
                .collect();
            if !unassigned.is_empty() {
                return Err(Error::Source(format!(
                    "partitions {unassigned:?} of `{topic}` are assigned to no member of group `{}` yet (a rebalance is under way)",
                    self.group
                )));
            }
        }
        Ok(())
    }
}

/// The partitions of a consumer protocol assignment (version, then per
/// topic its name and partitions; user data after is ignored); what does
/// not parse is left out.
pub(crate) fn assigned_partitions(bytes: &[u8]) -> Vec<String> {
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
