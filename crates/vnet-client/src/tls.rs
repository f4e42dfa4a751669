//! The TLS side of a host (links and the control endpoint): its
//! certificate chain, key and CA loaded from PEM files into rustls client
//! and server configurations (TLS 1.3, both sides authenticated).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::sync::Arc;
use vnet_control::TlsFiles;

/// The TLS side of a host: its client and server configurations.
pub struct Tls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl Tls {
    /// Loads the host's certificate chain, key and CA (PEM files).
    pub fn load(files: &TlsFiles) -> Result<Tls, String> {
        let read_certs = |path: &str| -> Result<Vec<CertificateDer<'static>>, String> {
            let certs: Vec<_> = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("{path}: {e}"))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{path}: {e}"))?;
            if certs.is_empty() {
                return Err(format!("{path}: no certificate in it"));
            }
            Ok(certs)
        };
        let chain = read_certs(&files.cert)?;
        let key_pem =
            crate::keys::read_secret(std::path::Path::new(&files.key), "the private key", 64 * 1024)?;
        let key =
            || PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| format!("{}: {e}", files.key));
        let mut roots = RootCertStore::empty();
        for c in read_certs(&files.ca)? {
            roots.add(c).map_err(|e| format!("{}: {e}", files.ca))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key()?)
            .map_err(|e| format!("{}: {e}", files.cert))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| format!("{}: {e}", files.ca))?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key()?)
            .map_err(|e| format!("{}: {e}", files.cert))?;
        Ok(Tls { client: Arc::new(client), server: Arc::new(server) })
    }

    /// The server side (the peer's certificate must chain to the CA).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// The client side (it presents the host's certificate).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.client.clone()
    }
}
