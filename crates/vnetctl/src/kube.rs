//! `vnetctl kube daemonset NAMESPACE/NAME`: whether a DaemonSet remains
//! (`present`), is being deleted (`deleting`) or is gone (`absent`), asked
//! of the Kubernetes API as the pod's service account.
//!
//! vnet's DaemonSet (packaging/kubernetes/vnet.yaml) asks it when a vnet pod
//! stops: while the DaemonSet remains, a next pod follows on the node (an
//! update, a deleted pod) and vnetd hands the kernel path over to it; once
//! the DaemonSet is deleted (`kubectl delete -f`), none follows, so vnetd
//! removes its programs, pins and devices and the hook the CNI plugin and
//! configuration it installed.
//!
//! The in-cluster configuration, as client-go's `rest.InClusterConfig`
//! reads it: `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, the
//! token and CA in `/var/run/secrets/kubernetes.io/serviceaccount`. One GET,
//! bounded: 5 s, an answer of at most 1 MiB. The namespace and name are
//! checked as Kubernetes names before they become the request's path.
//!
//! `absent` also answers a 401: a pod's token is refused once its service
//! account is deleted, and vnet's manifest lists the account before the
//! DaemonSet, so `kubectl delete -f` removes it first. Any other failure is
//! an error (exit 1), which the hook takes as "remains": it hands over.

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, HOST};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::IpAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Where a pod's service account token and the cluster's CA are mounted.
const ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The most of an answer read (a DaemonSet is a few kB).
const LIMIT: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(5);

/// What became of a DaemonSet.
#[derive(Debug, PartialEq, Eq)]
pub enum State {
    Present,
    Deleting,
    Absent,
}

impl State {
    fn word(&self) -> &'static str {
        match self {
            State::Present => "present",
            State::Deleting => "deleting",
            State::Absent => "absent",
        }
    }
}

/// `vnetctl kube WORDS`: prints the state, exit 0; 1 when the API could not
/// tell (the hook then keeps the network: a hand-over), 2 for bad words.
pub fn run(words: &[&str]) -> ExitCode {
    let target = match words {
        ["daemonset", target] => parse_target(target),
        _ => Err("usage: vnetctl kube daemonset NAMESPACE/NAME".to_string()),
    };
    let (namespace, name) = match target {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vnetctl: kube: {e}");
            return ExitCode::from(2);
        }
    };
    let asked = in_cluster(|k| std::env::var(k).ok(), Path::new(ACCOUNT)).and_then(|api| {
        let path = format!("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        let (status, body) = rt.block_on(async {
            tokio::time::timeout(TIMEOUT, get(&api, &path))
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {TIMEOUT:?}")))
        })?;
        decide(status, &body)
    });
    match asked {
        Ok(state) => {
            crate::out(&format!("{}\n", state.word()));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vnetctl: kube: daemonset {namespace}/{name}: {e}");
            ExitCode::from(1)
        }
    }
}

/// `NAMESPACE/NAME`, each a Kubernetes name (an RFC 1123 subdomain: at
/// most 253 of `a-z0-9.-`, alphanumeric at both ends).
fn parse_target(s: &str) -> Result<(String, String), String> {
    let (ns, name) = s.split_once('/').ok_or_else(|| format!("{s:?}: expected NAMESPACE/NAME"))?;
    for (what, v) in [("namespace", ns), ("name", name)] {
        let ok = !v.is_empty()
            && v.len() <= 253
            && v.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
        if !ok {
            return Err(format!("{what} {v:?}: expected a Kubernetes name (a-z, 0-9, '.', '-')"));
        }
    }
    Ok((ns.to_string(), name.to_string()))
}

/// The API server and the service account's credentials.
#[derive(Debug)]
struct Api {
    host: String,
    port: u16,
    server: ServerName<'static>,
    bearer: HeaderValue,
    roots: rustls::RootCertStore,
}

/// The in-cluster configuration from `env` and the account directory.
fn in_cluster(env: impl Fn(&str) -> Option<String>, account: &Path) -> Result<Api, String> {
    let (Some(host), Some(port)) = (env("KUBERNETES_SERVICE_HOST"), env("KUBERNETES_SERVICE_PORT")) else {
        return Err("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set".into());
    };
    let port: u16 = port.parse().map_err(|_| format!("KUBERNETES_SERVICE_PORT {port:?}: expected a port"))?;
    let server = match host.parse::<IpAddr>() {
        Ok(ip) => ServerName::IpAddress(ip.into()),
        Err(_) => ServerName::try_from(host.clone())
            .map_err(|_| format!("KUBERNETES_SERVICE_HOST {host:?}: expected an address or a DNS name"))?,
    };
    let read =
        |f: &str| std::fs::read(account.join(f)).map_err(|e| format!("{}: {e}", account.join(f).display()));
    let token =
        String::from_utf8(read("token")?).map_err(|_| "the service account token is not text".to_string())?;
    let mut bearer = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
        .map_err(|_| "the service account token is not a header value".to_string())?;
    bearer.set_sensitive(true);
    let mut roots = rustls::RootCertStore::empty();
    let ca = read("ca.crt")?;
    for cert in CertificateDer::pem_slice_iter(&ca) {
        let cert = cert.map_err(|e| format!("ca.crt: {e}"))?;
        roots.add(cert).map_err(|e| format!("ca.crt: {e}"))?;
    }
    if roots.is_empty() {
        return Err("ca.crt: no certificate".into());
    }
    Ok(Api { host, port, server, bearer, roots })
}

/// One GET of `path`: the status and at most [`LIMIT`] bytes of the body.
async fn get(api: &Api, path: &str) -> Result<(u16, Bytes), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(api.roots.clone())
        .with_no_client_auth();
    let authority = match api.server {
        ServerName::IpAddress(_) if api.host.contains(':') => format!("[{}]:{}", api.host, api.port),
        _ => format!("{}:{}", api.host, api.port),
    };
    let tcp = tokio::net::TcpStream::connect((api.host.as_str(), api.port))
        .await
        .map_err(|e| format!("{authority}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(api.server.clone(), tcp)
        .await
        .map_err(|e| format!("{authority}: TLS: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
        .await
        .map_err(|e| format!("{authority}: {e}"))?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header(HOST, &authority)
        .header(AUTHORIZATION, api.bearer.clone())
        .header(ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = send.send_request(req).await.map_err(|e| format!("{authority}: {e}"))?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), LIMIT)
        .collect()
        .await
        .map_err(|e| format!("{authority}: the answer: {e}"))?
        .to_bytes();
    Ok((status, body))
}

/// The DaemonSet's state from the API's answer.
fn decide(status: u16, body: &[u8]) -> Result<State, String> {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    match status {
        200 => {
            let json = json.ok_or("the answer is not JSON")?;
            let deleting = json["metadata"]["deletionTimestamp"].is_string();
            Ok(if deleting { State::Deleting } else { State::Present })
        }
        404 => Ok(State::Absent),
        // The token's service account is gone (it is looked up at each
        // request): vnet's manifest lists the account before the
        // DaemonSet, so `kubectl delete -f` removed it first.
        401 => Ok(State::Absent),
        _ => {
            let message = json.as_ref().and_then(|j| j["message"].as_str()).unwrap_or("").to_string();
            Err(format!("the API answered {status} {message}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_kubernetes_names_or_refused() {
        assert_eq!(parse_target("kube-system/vnet"), Ok(("kube-system".into(), "vnet".into())));
        for bad in
            ["vnet", "kube-system/", "/vnet", "kube-system/../pods", "a/b/c", "A/vnet", "ns/vnet?x", "ns/-x"]
        {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
        assert!(parse_target(&format!("ns/{}", "a".repeat(254))).is_err());
    }

    #[test]
    fn the_answer_decides() {
        assert_eq!(decide(200, br#"{"metadata":{"name":"vnet"}}"#), Ok(State::Present));
        let deleting = br#"{"metadata":{"name":"vnet","deletionTimestamp":"2026-11-28T18:00:00Z"}}"#;
        assert_eq!(decide(200, deleting), Ok(State::Deleting));
        assert_eq!(decide(404, br#"{"kind":"Status","code":404}"#), Ok(State::Absent));
        assert_eq!(decide(401, br#"{"kind":"Status","code":401}"#), Ok(State::Absent));
        let e = decide(403, br#"{"kind":"Status","message":"forbidden: no"}"#).unwrap_err();
        assert!(e.contains("403") && e.contains("forbidden: no"), "{e}");
        assert!(decide(200, b"<html>").is_err());
        assert!(decide(500, b"").is_err());
    }

    #[test]
    fn the_in_cluster_configuration_is_checked() {
        let dir = std::env::temp_dir().join(format!("vnetctl-kube-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let env = |host: &'static str, port: &'static str| {
            move |k: &str| match k {
                "KUBERNETES_SERVICE_HOST" => Some(host.to_string()),
                "KUBERNETES_SERVICE_PORT" => Some(port.to_string()),
                _ => None,
            }
        };
        let none = |_: &str| None;
        assert!(in_cluster(none, &dir).unwrap_err().contains("not in a pod"));
        assert!(in_cluster(env("10.96.0.1", "https"), &dir).unwrap_err().contains("expected a port"));
        assert!(in_cluster(env("10.96.0.1", "443"), &dir).unwrap_err().contains("token"));
        std::fs::write(dir.join("token"), "abc\r\nX-Injected: 1\n").unwrap();
        std::fs::write(dir.join("ca.crt"), "").unwrap();
        assert!(in_cluster(env("10.96.0.1", "443"), &dir).unwrap_err().contains("header value"));
        std::fs::write(dir.join("token"), "eyJhbGc.x.y\n").unwrap();
        assert!(in_cluster(env("10.96.0.1", "443"), &dir).unwrap_err().contains("no certificate"));
        assert!(in_cluster(env("bad host!", "443"), &dir).unwrap_err().contains("DNS name"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A CA and a server certificate for 127.0.0.1: (CA PEM, server cert PEM, server key PEM).
    fn certificates() -> (String, String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate().unwrap();
        let p = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        (ca_pem, p.signed_by(&key, &issuer).unwrap().pem(), key.serialize_pem())
    }

    /// One TLS connection on 127.0.0.1 answered with `answer`; returns the
    /// port and what the client sent.
    async fn serve_once(cert: &str, key: &str, answer: Vec<u8>) -> (u16, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let certs = CertificateDer::pem_slice_iter(cert.as_bytes()).map(Result::unwrap).collect();
        let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let cfg =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = tokio_rustls::TlsAcceptor::from(Arc::new(cfg)).accept(tcp).await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tls.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its request ended");
                req.extend_from_slice(&buf[..n]);
            }
            let _ = tls.write_all(&answer).await;
            let _ = tls.shutdown().await;
            String::from_utf8(req).unwrap()
        });
        (port, task)
    }

    fn api(port: u16, ca: &str) -> Api {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(ca.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        Api {
            host: "127.0.0.1".into(),
            port,
            server: ServerName::IpAddress("127.0.0.1".parse::<IpAddr>().unwrap().into()),
            bearer: HeaderValue::from_static("Bearer t0ken"),
            roots,
        }
    }

    #[test]
    fn one_get_over_tls_with_the_token_and_a_bounded_answer() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (ca, cert, key) = certificates();
            let body = br#"{"metadata":{"name":"vnet","deletionTimestamp":"2026-11-28T18:00:00Z"}}"#;
            let mut answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes();
            answer.extend_from_slice(body);
            let (port, seen) = serve_once(&cert, &key, answer).await;
            let path = "/apis/apps/v1/namespaces/kube-system/daemonsets/vnet";
            let (status, got) = get(&api(port, &ca), path).await.unwrap();
            assert_eq!((status, decide(status, &got)), (200, Ok(State::Deleting)));
            let req = seen.await.unwrap();
            assert!(req.starts_with(&format!("GET {path} HTTP/1.1\r\n")), "{req}");
            assert!(req.to_ascii_lowercase().contains("authorization: bearer t0ken\r\n"), "{req}");

            // An answer past the limit is refused, not held.
            let big =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{}", LIMIT + 1, "x".repeat(LIMIT + 1));
            let (port, _seen) = serve_once(&cert, &key, big.into_bytes()).await;
            let e = get(&api(port, &ca), path).await.unwrap_err();
            assert!(e.contains("the answer"), "{e}");

            // A server the CA did not sign is refused.
            let (_, other_cert, other_key) = certificates();
            let (port, _seen) = serve_once(&other_cert, &other_key, Vec::new()).await;
            let e = get(&api(port, &ca), path).await.unwrap_err();
            assert!(e.contains("TLS"), "{e}");
        });
    }
}
