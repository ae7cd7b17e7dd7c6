//! TLS for the HTTP services: a certificate and key (PEM files) served on
//! the socket, and the trust with which an instance asks another for a key
//! it does not hold (the instances of one query share the setting).

use crate::ServeError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;

/// A service's TLS: what it serves and how it trusts its peers.
#[derive(Clone)]
pub struct TlsConfig {
    pub(crate) server: Arc<rustls::ServerConfig>,
    pub(crate) client: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsConfig")
    }
}

impl TlsConfig {
    /// Serves the certificate chain in `cert` with the private key in
    /// `key` (PEM files); peers are trusted when their certificate chains
    /// to a certificate in `ca` (without one, to `cert`'s own certificates,
    /// which only a chain file that holds its issuer satisfies: give `ca`
    /// where reads are forwarded). `setting` names the
    /// configuration key in errors (`serve.tls`).
    pub fn from_pem_files(
        setting: &'static str,
        cert: &str,
        key: &str,
        ca: Option<&str>,
    ) -> Result<Self, ServeError> {
        let error = |file: &str, reason: String| ServeError::Tls {
            key: setting,
            reason: format!("{file}: {reason}"),
        };
        let chain = CertificateDer::pem_file_iter(cert)
            .map_err(|e| error(cert, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| error(cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(error(cert, "no certificate in it".into()));
        }
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| error(key, e.to_string()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| error(cert, e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| error(key, e.to_string()))?;
        let trusted = ca.unwrap_or(cert);
        let mut roots = rustls::RootCertStore::empty();
        for certificate in
            CertificateDer::pem_file_iter(trusted).map_err(|e| error(trusted, e.to_string()))?
        {
            let certificate = certificate.map_err(|e| error(trusted, e.to_string()))?;
            roots
                .add(certificate)
                .map_err(|e| error(trusted, e.to_string()))?;
        }
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| error(trusted, e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(TlsConfig {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}
