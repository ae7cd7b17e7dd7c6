//! The other instances of a query, and asking them for a key.

use std::collections::BTreeMap;
use std::time::Duration;

/// One other instance serving interactive queries for the same query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Where it answers (`host:port`).
    pub advertised: String,
    /// The partitions (task numbers) assigned to it.
    pub partitions: Vec<i32>,
}

/// Lists the instances of a query (a Kafka consumer group's members).
pub trait PeerDirectory: Send + Sync {
    /// Every instance serving interactive queries, this one included;
    /// `Err` with the reason while membership is changing (a rebalance,
    /// partitions not assigned to anyone yet): asking again later may
    /// give a different answer.
    fn peers(&self) -> Result<Vec<Peer>, String>;
}

/// A peer's answer to a key.
pub(crate) enum PeerAnswer {
    /// It holds the key: its JSON answer.
    Found(serde_json::Value),
    /// It holds nothing for the key.
    NotThere,
    /// It could not answer now (restoring, rebalancing, unreachable).
    Retry(String),
}

/// How long one peer may take to answer a forwarded read.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks `peer` for `key` (column → text) in `store`, from its own tasks,
/// with the service's token when it has one and over `https` when it
/// serves TLS (the instances of a query share both).
pub(crate) fn ask(
    peer: &Peer,
    store: &str,
    key: &BTreeMap<String, String>,
    range: &[(&str, &str)],
    service: &crate::Service,
) -> PeerAnswer {
    let mut agent = ureq::AgentBuilder::new().timeout(PEER_TIMEOUT);
    let scheme = match &service.peer_tls {
        Some(tls) => {
            agent = agent.tls_config(tls.clone());
            "https"
        }
        None => "http",
    };
    let url = format!("{scheme}://{}/v1/stores/{store}/keys", peer.advertised);
    let mut request = agent.build().get(&url).query("local", "true");
    if let Some(token) = service.auth_token.as_deref() {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    for (column, value) in key
        .iter()
        .map(|(c, v)| (c.as_str(), v.as_str()))
        .chain(range.iter().copied())
    {
        request = request.query(column, value);
    }
    match request.call() {
        Ok(response) => match response.into_json::<serde_json::Value>() {
            Ok(body) => PeerAnswer::Found(body),
            Err(e) => PeerAnswer::Retry(format!("{} answered unreadably: {e}", peer.advertised)),
        },
        Err(ureq::Error::Status(404, _)) => PeerAnswer::NotThere,
        // Its body is not passed on: only a member's own answer is.
        Err(ureq::Error::Status(code, _)) => {
            PeerAnswer::Retry(format!("{} answered {code}", peer.advertised))
        }
        Err(e) => PeerAnswer::Retry(format!("{} did not answer: {e}", peer.advertised)),
    }
}
