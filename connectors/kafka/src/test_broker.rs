//! A Kafka broker for a user's integration tests, the part of what
//! testcontainers gives a Kafka Streams project that runs without Docker:
//! the broker `KAFKA_BOOTSTRAP` names when set, else the broker tidemark's
//! `scripts/kafka.sh` assembles from Maven Central jars and runs
//! (`TIDEMARK_KAFKA_SCRIPT` may point at the script). A container path on
//! the `testcontainers` crate is left out for now: that crate's
//! dependencies change the features of RocksDB's build dependencies, and
//! the build then compiles RocksDB's C++ again (see docs/pipeline-file.md,
//! "Testing a pipeline").
//!
//! ```no_run
//! use tidemark_kafka::test_broker::TestKafka;
//! let kafka = TestKafka::start().unwrap();
//! println!("testing against {} ({:?})", kafka.bootstrap(), kafka.origin());
//! // hand kafka.connection() to a KafkaSourceConfig, or kafka.bootstrap()
//! // to a pipeline file's `kafka.bootstrap`
//! ```

use crate::connection::KafkaConnection;
use tidemark::error::{Error, Result};

/// Where a [`TestKafka`]'s broker came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerOrigin {
    /// `KAFKA_BOOTSTRAP` named it.
    Environment,
    /// `scripts/kafka.sh` runs it.
    Script,
}

/// A broker for integration tests (see the module).
pub struct TestKafka {
    bootstrap: String,
    origin: BrokerOrigin,
}

impl TestKafka {
    /// The broker of `KAFKA_BOOTSTRAP`, else the script's.
    pub fn start() -> Result<Self> {
        if let Ok(bootstrap) = std::env::var("KAFKA_BOOTSTRAP") {
            return Ok(TestKafka::at(bootstrap, BrokerOrigin::Environment));
        }
        TestKafka::from_script()
    }

    /// The broker `scripts/kafka.sh start` runs (started if it is not):
    /// the script of this crate's repository, or `TIDEMARK_KAFKA_SCRIPT`.
    pub fn from_script() -> Result<Self> {
        let script = std::env::var("TIDEMARK_KAFKA_SCRIPT").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/kafka.sh").to_string()
        });
        if !std::path::Path::new(&script).exists() {
            return Err(Error::config(
                "TIDEMARK_KAFKA_SCRIPT",
                format!("no broker for the test: set KAFKA_BOOTSTRAP, or point TIDEMARK_KAFKA_SCRIPT at tidemark's scripts/kafka.sh ({script} does not exist)"),
            ));
        }
        let out = std::process::Command::new("bash")
            .args([script.as_str(), "start"])
            .output()
            .map_err(|e| Error::io("running scripts/kafka.sh", e))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let bootstrap = stdout
            .lines()
            .find_map(|l| l.strip_prefix("KAFKA_BOOTSTRAP="))
            .filter(|_| out.status.success())
            .ok_or_else(|| {
                Error::Source(format!(
                    "scripts/kafka.sh start failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            })?;
        Ok(TestKafka::at(bootstrap.to_string(), BrokerOrigin::Script))
    }

    fn at(bootstrap: String, origin: BrokerOrigin) -> Self {
        TestKafka { bootstrap, origin }
    }

    /// Its bootstrap servers.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// Where it came from.
    pub fn origin(&self) -> BrokerOrigin {
        self.origin
    }

    /// A connection to it, in plaintext.
    pub fn connection(&self) -> KafkaConnection {
        KafkaConnection::new(&self.bootstrap)
    }
}
