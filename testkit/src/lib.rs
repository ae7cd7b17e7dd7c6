//! A Kafka broker for integration tests of tidemark pipelines, as
//! Testcontainers' `KafkaContainer` gives Java tests one:
//!
//! 1. `KAFKA_BOOTSTRAP`, when set: a broker someone already runs (CI, a
//!    shared cluster);
//! 2. else, where a Docker engine answers, a container of the local Kafka
//!    image (`tidemark/kafka:4.1.1`, made by tidemark's `scripts/images.sh`
//!    from Maven Central jars; `TIDEMARK_KAFKA_IMAGE` names another), started
//!    by the `testcontainers` crate on the host network with ports of its
//!    own, and removed when the value is dropped;
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

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testcontainers::core::WaitFor;
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

/// The Kafka image a container starts from when `TIDEMARK_KAFKA_IMAGE` is
/// unset: the one tidemark's `scripts/images.sh kafka` builds.
pub const DEFAULT_KAFKA_IMAGE: &str = "tidemark/kafka:4.1.1";

/// The label on every container this crate starts, so that what a killed
/// test run left behind can be found (`docker ps -a --filter
/// label=tidemark.testkit`).
pub const CONTAINER_LABEL: &str = "tidemark.testkit";

/// The line the image's broker prints on stdout once it takes clients.
const READY_LINE: &str = "Kafka Server started";

/// How long a container may take to print [`READY_LINE`]: the JVM's start
/// and the storage format, a few seconds on an idle machine, far more on a
/// loaded 2-core one.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(180);

/// Why no broker could be had.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// Docker runs but the container did not start.
    #[error("starting a Kafka container from {image}: {reason} (no image registry is needed: tidemark's scripts/images.sh kafka builds the image locally)")]
    Container {
        /// The image, `name:tag`.
        image: String,
        /// What testcontainers or Docker said.
        reason: String,
    },
    /// The Docker engine has no such image. testcontainers would pull it
    /// from a registry; the image is built locally instead, so nothing of
    /// unknown origin runs on the host network.
    #[error("the Docker engine has no image {0}: build it with tidemark's scripts/images.sh kafka (it is never pulled from a registry)")]
    ImageMissing(String),
    /// `TIDEMARK_KAFKA_IMAGE` is not `name:tag`.
    #[error("TIDEMARK_KAFKA_IMAGE={0:?} is not an image `name:tag`")]
    ImageName(String),
    /// No free port on 127.0.0.1 for the container's listeners.
    #[error("finding a free port on 127.0.0.1 for the Kafka container: {0}")]
    Port(#[source] std::io::Error),
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
    /// Held for its drop: testcontainers stops and removes the container
    /// with this value.
    container: Option<Container<GenericImage>>,
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
                container: None,
            }),
            BrokerOrigin::Container => Self::start_container(&kafka_image()),
            BrokerOrigin::Script => start_script(&script_path()),
        }
    }

    /// A container of `image` (`name:tag`, a local image), whatever the
    /// environment says: the broker listens on 127.0.0.1 on two free ports
    /// of the host (host network, so every connection stays on loopback and
    /// the advertised address is the one clients dial).
    pub fn start_container(image: &str) -> Result<Self, BrokerError> {
        let (name, tag) = image
            .rsplit_once(':')
            .filter(|(name, tag)| !name.is_empty() && !tag.is_empty() && !tag.contains('/'))
            .ok_or_else(|| BrokerError::ImageName(image.to_string()))?;
        if !image_present(image) {
            return Err(BrokerError::ImageMissing(image.to_string()));
        }
        let [port, controller_port] = free_ports()?;
        let failed = |e: testcontainers::TestcontainersError| BrokerError::Container {
            image: image.to_string(),
            reason: e.to_string(),
        };
        let container = GenericImage::new(name, tag)
            .with_wait_for(WaitFor::message_on_stdout(READY_LINE))
            .with_network("host")
            .with_label(CONTAINER_LABEL, "kafka")
            .with_env_var("KAFKA_PORT", port.to_string())
            .with_env_var("KAFKA_CONTROLLER_PORT", controller_port.to_string())
            .with_startup_timeout(STARTUP_TIMEOUT)
            .start()
            .map_err(failed)?;
        Ok(KafkaContainer {
            bootstrap: format!("127.0.0.1:{port}"),
            origin: BrokerOrigin::Container,
            container: Some(container),
        })
    }

    /// `host:port` for `bootstrap.servers`.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Where the broker came from.
    pub fn origin(&self) -> BrokerOrigin {
        self.origin
    }

    /// The Docker id of the container this value started, if it started one
    /// (for `docker exec`, e.g. the image's `kafka-tool produce TOPIC`).
    pub fn container_id(&self) -> Option<&str> {
        self.container.as_ref().map(|container| container.id())
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

/// `TIDEMARK_KAFKA_IMAGE`, else [`DEFAULT_KAFKA_IMAGE`].
pub fn kafka_image() -> String {
    std::env::var("TIDEMARK_KAFKA_IMAGE")
        .ok()
        .filter(|image| !image.is_empty())
        .unwrap_or_else(|| DEFAULT_KAFKA_IMAGE.to_string())
}

/// Whether the Docker engine holds `image`, asked with the `docker` CLI
/// (which finds the engine as testcontainers does: `DOCKER_HOST`, else the
/// default socket). Only a clear "no such image" counts as absent: without
/// the CLI, or when it cannot reach the engine, testcontainers' own start
/// says what is wrong.
fn image_present(image: &str) -> bool {
    match Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", image])
        .output()
    {
        Ok(out) => {
            out.status.success()
                || !String::from_utf8_lossy(&out.stderr)
                    .to_lowercase()
                    .contains("no such image")
        }
        Err(_) => true,
    }
}

/// Two ports nothing listens on, both held while the second is found so
/// they differ. Another process may still take one before the broker binds
/// it; the broker then fails to start and says so.
fn free_ports() -> Result<[u16; 2], BrokerError> {
    let first = TcpListener::bind("127.0.0.1:0").map_err(BrokerError::Port)?;
    let second = TcpListener::bind("127.0.0.1:0").map_err(BrokerError::Port)?;
    let port = |listener: &TcpListener| {
        listener
            .local_addr()
            .map(|address| address.port())
            .map_err(BrokerError::Port)
    };
    Ok([port(&first)?, port(&second)?])
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
        container: None,
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
    fn an_image_name_without_a_tag_is_refused_naming_it() {
        for image in [
            "tidemark/kafka",
            "tidemark/kafka:",
            ":4.1.1",
            "host:5000/kafka",
        ] {
            let error = KafkaContainer::start_container(image).err().unwrap();
            assert!(
                matches!(error, BrokerError::ImageName(_)),
                "{image}: {error}"
            );
            assert!(error.to_string().contains(image), "{error}");
        }
    }

    #[test]
    fn an_image_the_engine_lacks_is_refused_before_anything_is_pulled() {
        let image = "tidemark/no-such-image:0";
        let error = KafkaContainer::start_container(image).err().unwrap();
        assert!(matches!(error, BrokerError::ImageMissing(_)), "{error}");
        assert!(
            error.to_string().contains("scripts/images.sh kafka"),
            "{error}"
        );
    }

    #[test]
    fn two_free_ports_differ() {
        let [a, b] = free_ports().unwrap();
        assert_ne!(a, b);
        assert!(a > 0 && b > 0);
    }

    #[test]
    fn a_missing_script_is_named() {
        let error = start_script(Path::new("/nowhere/kafka.sh")).err().unwrap();
        assert!(error.to_string().contains("/nowhere/kafka.sh"), "{error}");
        assert!(error.to_string().contains("KAFKA_BOOTSTRAP"), "{error}");
    }
}
