//! Why a session with etcd ended, said once and whole (its sources'
//! words), and which failures no retry mends (said at once, in `show
//! cluster`, rather than retried quietly forever).

use super::config::Store;
use std::time::Duration;

/// Why a session with etcd ended (logged, and shown by `show cluster`).
#[derive(Debug, thiserror::Error)]
pub(super) enum SessionError {
    /// An etcd request failed; `what` names it (connect, lease grant, list,
    /// watch, keepalive, put, release).
    #[error("{what}: {source}")]
    Etcd {
        what: String,
        #[source]
        source: etcd_client::Error,
    },
    #[error("watch: closed by etcd")]
    WatchClosed,
    #[error("watch canceled: {0}")]
    WatchCanceled(String),
    #[error("the lease expired (etcd was out of reach for longer than the TTL?)")]
    LeaseExpired,
    /// This host has no address to advertise (its `listen` changed since
    /// vnetd started).
    #[error("{0}")]
    NoAddress(String),
}

/// An error and its sources, each said once: `transport error: tcp
/// connect error: Connection refused (os error 111)`, where the error's
/// own text says only `transport error`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let t = s.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        next = s.source();
    }
    out
}

impl SessionError {
    /// What it says, with what the etcd client keeps under its own words
    /// (a transport error's cause).
    pub(super) fn said(&self) -> String {
        match self {
            SessionError::Etcd { what, source: etcd_client::Error::TransportError(t) } => {
                format!("{what}: {}", chain(t))
            }
            // The status's own words and its cause, not its debug form.
            SessionError::Etcd { what, source: etcd_client::Error::GRpcStatus(st) } => {
                let cause = std::error::Error::source(st).map(chain).unwrap_or_default();
                match cause.is_empty() || st.message().contains(&cause) {
                    true => format!("{what}: {}", st.message()),
                    false => format!("{what}: {} ({cause})", st.message()),
                }
            }
            e => chain(e),
        }
    }

    /// What to fix, in one sentence, when the error is one that retrying
    /// will not mend (a password, a CA, a client certificate, a
    /// permission); `None` for an outage or anything else.
    pub(super) fn permanent(&self, store: &Store, network: &str) -> Option<String> {
        let SessionError::Etcd { source, .. } = self else { return None };
        let a = &store.auth;
        let file =
            |f: &Option<std::path::PathBuf>| f.as_ref().map_or("(none)".into(), |p| p.display().to_string());
        let user = a.user.clone().unwrap_or_else(|| "(the client certificate's common name)".into());
        if let etcd_client::Error::GRpcStatus(st) = source {
            match st.code() {
                tonic::Code::Unauthenticated | tonic::Code::InvalidArgument
                    if st.message().contains("authentication failed") || st.message().contains("invalid auth token") =>
                {
                    return Some(format!(
                        "etcd refused the password of user {user} (etcd-password-file {}): put that user's \
                         password in the file, or set a new one with `etcdctl user passwd {user}`",
                        file(&a.password_file)
                    ))
                }
                tonic::Code::PermissionDenied => {
                    return Some(format!(
                        "etcd user {user} may not read /vnet/{network}/ or write this host's keys: grant its role \
                         read on that prefix and readwrite on the host's own keys, as `vnetctl network approve` \
                         does (`etcdctl role grant-permission ROLE --prefix=true read /vnet/{network}/`; readwrite \
                         on /vnet/{network}/hosts/HOST, and with --prefix=true on /vnet/{network}/claims/HOST/ and \
                         /vnet/{network}/ipam/HOST/; `etcdctl user grant-role {user} ROLE`)"
                    ))
                }
                _ => {}
            }
        }
        // TLS failures come as an unavailable service or a transport
        // error; their words are rustls'.
        let text = format!("{source:?} {}", self.said());
        let has = |w: &str| text.contains(w);
        if has("UnknownIssuer")
            || has("invalid peer certificate")
            || has("BadSignature")
            || has("NotValidForName")
        {
            return Some(format!(
                "etcd's server certificate is not one the CA in etcd-ca {} signed (or does not name the \
                 address vnetd dials): give the CA that signed etcd's --cert-file",
                file(&a.ca)
            ));
        }
        if has("CertificateRequired") || (has("BadCertificate") && a.cert.is_none()) {
            return Some(
                "etcd requires a client certificate (its --client-cert-auth) and this host gives none: add \
                 etcd-cert and etcd-key (a certificate signed by etcd's --trusted-ca-file)"
                    .to_string(),
            );
        }
        if has("BadCertificate")
            || has("UnknownCA")
            || has("bad certificate")
            || has("unknown certificate authority")
        {
            return Some(format!(
                "etcd refused this host's client certificate (etcd-cert {}): give one signed by the CA etcd \
                 trusts (its --trusted-ca-file)",
                file(&a.cert)
            ));
        }
        None
    }
}

/// Why etcd closed a TLS connection just after its handshake, if it said
/// so: with TLS 1.3 a server checks the client's certificate after the
/// client has finished, and its alert (`bad certificate`, `certificate
/// required`) races the client's first request, which mostly sees the
/// connection closed. One handshake of our own, then a read of what the
/// server says, tells the two apart. `None`: nothing refused (an outage).
pub(super) async fn refused_client_certificate(store: &Store) -> Option<String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let a = &store.auth;
    let url = store.endpoints.first()?.strip_prefix("https://")?;
    let hostport = url.split('/').next()?;
    let (host, _) = hostport.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let ca = std::fs::read(a.ca.as_ref()?).ok()?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca).flatten() {
        roots.add(c).ok()?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let b = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let cfg = match (&a.cert, &a.key) {
        (Some(c), Some(k)) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(c).ok()?.flatten().collect();
            let key = PrivateKeyDer::from_pem_file(k).ok()?;
            b.with_client_auth_cert(chain, key).ok()?
        }
        _ => b.with_no_client_auth(),
    };
    let name = ServerName::try_from(host).ok()?;
    let tcp = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(hostport))
        .await
        .ok()?
        .ok()?;
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let said = match tokio::time::timeout(Duration::from_secs(2), connector.connect(name, tcp)).await.ok()? {
        Err(e) => e.to_string(),
        Ok(mut tls) => {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 64];
            match tokio::time::timeout(Duration::from_secs(2), tls.read(&mut buf)).await {
                Ok(Err(e)) => e.to_string(),
                _ => return None,
            }
        }
    };
    let file =
        |f: &Option<std::path::PathBuf>| f.as_ref().map_or("(none)".into(), |p| p.display().to_string());
    if said.contains("CertificateRequired") || (said.contains("BadCertificate") && a.cert.is_none()) {
        return Some(
            "etcd requires a client certificate (its --client-cert-auth) and this host gives none: add \
             etcd-cert and etcd-key (a certificate signed by etcd's --trusted-ca-file)"
                .to_string(),
        );
    }
    if ["BadCertificate", "UnknownCA", "UnsupportedCertificate", "CertificateUnknown", "AccessDenied"]
        .iter()
        .any(|w| said.contains(w))
    {
        return Some(format!(
            "etcd refused this host's client certificate (etcd-cert {}): give one signed by the CA etcd \
             trusts (its --trusted-ca-file)",
            file(&a.cert)
        ));
    }
    None
}

/// Names a failed etcd request.
pub(super) fn etcd(what: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> SessionError {
    let what = what.into();
    move |source| SessionError::Etcd { what, source }
}
