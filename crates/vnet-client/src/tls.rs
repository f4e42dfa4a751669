//! The TLS side of a host (links and the control endpoint): its
//! certificate chain, key and CA loaded from PEM files into rustls client
//! and server configurations (TLS 1.3, both sides authenticated).
//!
//! An identity is renewed in place ([`Tls::renew`], on vnetd's `reload`):
//! when the files' contents changed, they are loaded and checked as at the
//! start, and the new configurations replace the old ones for every
//! handshake from then on; connections already made keep theirs, so a
//! renewal drops no link. A certificate outside its validity (expired, or
//! not valid yet) is refused, at the start as at a renewal, and a refused
//! renewal leaves the running identity as it was.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, RwLock};
use vnet_control::TlsFiles;

/// Why a TLS identity was not loaded: each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA or the key file refused (others may change or read it, ...).
    #[error(transparent)]
    File(#[from] crate::keys::FileError),
    #[error("{path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Pem {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path}: no certificate in it")]
    NoCertificate { path: String },
    #[error("{path}: not a certificate ({source})")]
    NotACertificate { path: String, source: webpki::Error },
    #[error("{path}: the certificate expired at {at} (it is {now} now): renew it")]
    Expired { path: String, at: String, now: String },
    #[error("{path}: the certificate is not valid before {from} (it is {now} now)")]
    NotYetValid { path: String, from: String, now: String },
    /// rustls refused the chain, the key or the CA in `path`.
    #[error("{path}: {source}")]
    Rustls {
        path: String,
        #[source]
        source: rustls::Error,
    },
    #[error("{path}: {source}")]
    Verifier {
        path: String,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
}

/// The TLS side of a host: its client and server configurations.
pub struct Tls {
    now: RwLock<Loaded>,
}

/// One loading of the files.
struct Loaded {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
    /// A hash of the three files' contents (what a renewal compares).
    stamp: u64,
}

impl Tls {
    /// Loads the host's certificate chain, key and CA (PEM files).
    pub fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        Ok(Tls { now: RwLock::new(Loaded::read(files)?) })
    }

    /// Loads `files` again if their contents changed: `Ok(true)` when the
    /// new identity replaced the old one for the handshakes to come,
    /// `Ok(false)` when nothing changed; on an error (an expired
    /// certificate, a key that does not match) the old one stays.
    pub fn renew(&self, files: &TlsFiles) -> Result<bool, TlsError> {
        let l = Loaded::read(files)?;
        let mut now = self.now.write().unwrap_or_else(|p| p.into_inner());
        if l.stamp == now.stamp {
            return Ok(false);
        }
        *now = l;
        Ok(true)
    }

    /// The server side (the peer's certificate must chain to the CA).
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.now.read().unwrap_or_else(|p| p.into_inner()).server.clone()
    }

    /// The client side (it presents the host's certificate).
    pub fn client_config(&self) -> Arc<ClientConfig> {
        self.now.read().unwrap_or_else(|p| p.into_inner()).client.clone()
    }
}

impl Loaded {
    fn read(files: &TlsFiles) -> Result<Loaded, TlsError> {
        // The CA is what every peer is trusted by: only root and vnetd's
        // user may change it. Checked first.
        let ca_file = crate::keys::read_trusted(std::path::Path::new(&files.ca), "the CA", 1 << 20)?;
        let read_certs = |path: &str| -> Result<(Vec<CertificateDer<'static>>, Vec<u8>), TlsError> {
            let bytes = if path == files.ca {
                ca_file.clone()
            } else {
                std::fs::read(path).map_err(|source| TlsError::Read { path: path.into(), source })?
            };
            let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
                .collect::<Result<_, _>>()
                .map_err(|source| TlsError::Pem { path: path.into(), source })?;
            if certs.is_empty() {
                return Err(TlsError::NoCertificate { path: path.into() });
            }
            Ok((certs, bytes))
        };
        let (chain, cert_bytes) = read_certs(&files.cert)?;
        valid_now(&chain[0], &files.cert)?;
        let key_pem =
            crate::keys::read_secret(std::path::Path::new(&files.key), "the private key", 64 * 1024)?;
        let key = || {
            PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
                .map_err(|source| TlsError::Pem { path: files.key.clone(), source })
        };
        let (cas, ca_bytes) = read_certs(&files.ca)?;
        let mut roots = RootCertStore::empty();
        for c in cas {
            roots.add(c).map_err(|source| TlsError::Rustls { path: files.ca.clone(), source })?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls_err(&files.cert))?
            .with_root_certificates(roots.clone())
            .with_client_auth_cert(chain.clone(), key()?)
            .map_err(rustls_err(&files.cert))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|source| TlsError::Verifier { path: files.ca.clone(), source })?;
        let server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(rustls_err(&files.cert))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key()?)
            .map_err(rustls_err(&files.cert))?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (cert_bytes, key_pem.as_bytes(), ca_bytes).hash(&mut h);
        Ok(Loaded { client: Arc::new(client), server: Arc::new(server), stamp: h.finish() })
    }
}

fn rustls_err(path: &str) -> impl Fn(rustls::Error) -> TlsError + '_ {
    move |source| TlsError::Rustls { path: path.to_string(), source }
}

/// Refuses a certificate outside its validity period. webpki checks the
/// period before it looks for an issuer, so no trust anchor is needed
/// here: any other error (the issuer unknown to an empty list) is not
/// this check's, and the handshakes judge the chain.
fn valid_now(cert: &CertificateDer<'_>, path: &str) -> Result<(), TlsError> {
    let ee = webpki::EndEntityCert::try_from(cert)
        .map_err(|source| TlsError::NotACertificate { path: path.into(), source })?;
    let r = ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &[],
        &[],
        UnixTime::now(),
        webpki::KeyUsage::client_auth(),
        None,
        None,
    );
    match r {
        Err(webpki::Error::CertExpired { time, not_after }) => {
            Err(TlsError::Expired { path: path.into(), at: utc(not_after), now: utc(time) })
        }
        Err(webpki::Error::CertNotValidYet { time, not_before }) => {
            Err(TlsError::NotYetValid { path: path.into(), from: utc(not_before), now: utc(time) })
        }
        _ => Ok(()),
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a certificate's time.
fn utc(t: UnixTime) -> String {
    crate::utc::seconds(t.as_secs())
}
