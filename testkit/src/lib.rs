//! A Kafka broker for integration tests of tidemark pipelines, as
//! Testcontainers' `KafkaContainer` gives Java tests one:
//!
//! 1. `KAFKA_BOOTSTRAP`, when set: a broker someone already runs (CI, a
//!    shared cluster);
//! 2. else, where Docker runs, a container of the `apache/kafka` image,
//!    started by the `testcontainers` crate and removed when dropped;
//! 3. else the broker `scripts/kafka.sh` assembles from Maven Central jars
//!    (no Docker; `TIDEMARK_KAFKA_SCRIPT` names the script from outside the
//!    tidemark repository).
//!
//! ```no_run
//! let kafka = tidemark_testcontainers::KafkaContainer::start().unwrap();
//! let pipeline = format!("kafka: {{bootstrap: \"{}\"}}\n...", kafka.bootstrap());
//! # let _ = pipeline;
//! ```
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;
use testcontainers_modules::kafka::apache::{Kafka, KAFKA_PORT};
use testcontainers_modules::testcontainers::runners::SyncRunner;
use testcontainers_modules::testcontainers::Container;

/// Why no broker could be had.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// Docker runs but the container did not start.
    #[error("starting the Kafka container: {0}")]
    Container(String),
    /// Neither `KAFKA_BOOTSTRAP` nor Docker, and no script to fall back on.
    #[error("no broker: set KAFKA_BOOTSTRAP, run Docker, or point TIDEMARK_KAFKA_SCRIPT at tidemark's scripts/kafka.sh (looked for {0})")]
    NoScript(PathBuf),
    /// The script failed.
    #[error("`{script} start` failed: {reason}")]
    Script {
        /// The script run.
        script: PathBuf,
        /// Its exit status or error.
        reason: String,
    },
}

/// Where the broker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerOrigin {
    /// `KAFKA_BOOTSTRAP`.
    Environment,
    /// A container this value started (stopped and removed on drop).
    Container,
    /// `scripts/kafka.sh` (left running for the next test).
    Script,
}

/// A running broker and how to reach it.
pub struct KafkaContainer {
    bootstrap: String,
    origin: BrokerOrigin,
    /// Held for its drop: the container stops with this value.
    _container: Option<Container<Kafka>>,
}

impl KafkaContainer {
    /// A broker, by the first of `KAFKA_BOOTSTRAP`, Docker, the script.
    pub fn start() -> Result<Self, BrokerError> {
        let from_env = std::env::var("KAFKA_BOOTSTRAP")
            .ok()
            .filter(|b| !b.is_empty());
        match choose(from_env.is_some(), docker_available()) {
            BrokerOrigin::Environment => Ok(KafkaContainer {
                bootstrap: from_env.unwrap_or_default(),
                origin: BrokerOrigin::Environment,
                _container: None,
            }),
            BrokerOrigin::Container => start_container(),
            BrokerOrigin::Script => start_script(&script_path()),
        }
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Where the broker came from.
    pub fn origin(&self) -> BrokerOrigin {
        self.origin
    }
}

/// Which broker to use: the environment's, else a container where Docker
/// runs, else the script.
pub fn choose(bootstrap_set: bool, docker: bool) -> BrokerOrigin {
    match (bootstrap_set, docker) {
        (true, _) => BrokerOrigin::Environment,
        (false, true) => BrokerOrigin::Container,
        (false, false) => BrokerOrigin::Script,
    }
}

/// Whether a Docker engine is reachable the way testcontainers looks for
/// one: `DOCKER_HOST`, or the default socket.
pub fn docker_available() -> bool {
    std::env::var_os("DOCKER_HOST").is_some() || Path::new("/var/run/docker.sock").exists()
}

fn start_container() -> Result<KafkaContainer, BrokerError> {
    let container = Kafka::default()
        .start()
        .map_err(|e| BrokerError::Container(e.to_string()))?;
    let host = container
        .get_host()
        .map_err(|e| BrokerError::Container(e.to_string()))?;
    let port = container
        .get_host_port_ipv4(KAFKA_PORT)
        .map_err(|e| BrokerError::Container(e.to_string()))?;
    Ok(KafkaContainer {
        bootstrap: format!("{host}:{port}"),
        origin: BrokerOrigin::Container,
        _container: Some(container),
    })
}

/// `TIDEMARK_KAFKA_SCRIPT`, else `scripts/kafka.sh` of the tidemark
/// repository this crate sits in.
fn script_path() -> PathBuf {
    std::env::var_os("TIDEMARK_KAFKA_SCRIPT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka.sh"))
}

fn start_script(script: &Path) -> Result<KafkaContainer, BrokerError> {
    if !script.is_file() {
        return Err(BrokerError::NoScript(script.to_path_buf()));
    }
    let status = Command::new("bash")
        .arg(script)
        .arg("start")
        .status()
        .map_err(|e| BrokerError::Script {
            script: script.to_path_buf(),
            reason: e.to_string(),
        })?;
    if !status.success() {
        return Err(BrokerError::Script {
            script: script.to_path_buf(),
            reason: status.to_string(),
        });
    }
    let port = std::env::var("TIDEMARK_KAFKA_PORT").unwrap_or_else(|_| "9092".into());
    Ok(KafkaContainer {
        bootstrap: format!("127.0.0.1:{port}"),
        origin: BrokerOrigin::Script,
        _container: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_then_docker_then_the_script() {
        assert_eq!(choose(true, true), BrokerOrigin::Environment);
        assert_eq!(choose(false, true), BrokerOrigin::Container);
        assert_eq!(choose(false, false), BrokerOrigin::Script);
    }

    #[test]
    fn a_missing_script_is_named() {
        let error = start_script(Path::new("/nowhere/kafka.sh")).err().unwrap();
        assert!(error.to_string().contains("/nowhere/kafka.sh"), "{error}");
        assert!(error.to_string().contains("KAFKA_BOOTSTRAP"), "{error}");
    }
}
