//! The Kubernetes API as a pod asks it: the in-cluster configuration
//! (what client-go's `rest.InClusterConfig` reads), GETs over TLS
//! bounded in time and size, and watches ([`watch`]: a list, then the
//! changes, each event bounded). Two programs of vnet's DaemonSet ask it:
//! `vnetctl kube daemonset` (does the DaemonSet remain?) and vnetd
//! (`pod-labels NAMESPACE/NAME`: the labels vnet-cni turns into a pod's
//! policy groups; and, with `--kube-network-policy`, the pods, namespaces
//! and NetworkPolicies it translates into isolation, [`netpol`], and the
//! Services and EndpointSlices whose backends it judges Service traffic
//! by, [`services`]; with `--kube`, where each pod runs, which binds the
//! cluster's claims, [`placement`]).
//!
//! A hand-written client rather than kube-rs: vnet asks a few GETs and
//! six watches of the API and needs none of its types or configuration
//! files; hyper and rustls (already vnet's) carry them.

pub mod netpol;
pub mod objects;
pub mod placement;
pub mod services;
pub mod watch;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, ACCEPT, AUTHORIZATION, HOST};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Where a pod's service account token and the cluster's CA are mounted.
pub const ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The most of an answer read (a pod or a DaemonSet is a few kB).
pub const LIMIT: usize = 1 << 20;
/// How long one request may take, connection and answer.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// True for a Kubernetes object name (`vnet_control::ast::is_kube_name`):
/// only such names become a request's path.
pub use vnet_control::ast::is_kube_name as is_name;

/// The API server and the service account's credentials.
#[derive(Debug)]
pub struct Api {
    pub host: String,
    pub port: u16,
    pub server: ServerName<'static>,
    pub bearer: HeaderValue,
    pub roots: rustls::RootCertStore,
}

impl Api {
    /// The in-cluster configuration of this process (its environment and
    /// [`ACCOUNT`]), read anew at each call: the kubelet rotates the token.
    pub fn in_this_pod() -> Result<Api, String> {
        in_cluster(|k| std::env::var(k).ok(), Path::new(ACCOUNT))
    }
}

/// The in-cluster configuration from `env` and the account directory.
pub fn in_cluster(env: impl Fn(&str) -> Option<String>, account: &Path) -> Result<Api, String> {
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
/// (No time bound of its own: callers wrap it in [`TIMEOUT`].)
pub async fn get(api: &Api, path: &str) -> Result<(u16, Bytes), String> {
    get_limited(api, path, LIMIT).await
}

/// One GET of `path`: the status and at most `limit` bytes of the body.
pub async fn get_limited(api: &Api, path: &str, limit: usize) -> Result<(u16, Bytes), String> {
    let (authority, resp) = send(api, path).await?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), limit)
        .collect()
        .await
        .map_err(|e| format!("{authority}: the answer: {e}"))?
        .to_bytes();
    Ok((status, body))
}

/// Sends a GET of `path` on a connection of its own: the server's
/// authority and its answer, the body still to read.
pub(crate) async fn send(
    api: &Api,
    path: &str,
) -> Result<(String, hyper::Response<hyper::body::Incoming>), String> {
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
    Ok((authority, resp))
}

/// [`get`] within [`TIMEOUT`].
pub async fn get_bounded(api: &Api, path: &str) -> Result<(u16, Bytes), String> {
    tokio::time::timeout(TIMEOUT, get(api, path))
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {TIMEOUT:?}")))
}

/// The API's message of a failed answer (its `Status` object's).
pub fn message(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|j| j["message"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The labels of pod `namespace`/`name` (each a Kubernetes name, checked).
pub async fn pod_labels(api: &Api, namespace: &str, name: &str) -> Result<BTreeMap<String, String>, String> {
    for (what, v) in [("namespace", namespace), ("pod name", name)] {
        if !is_name(v) {
            return Err(format!("{what} {v:?}: expected a Kubernetes name (a-z, 0-9, '.', '-')"));
        }
    }
    let (status, body) = get_bounded(api, &format!("/api/v1/namespaces/{namespace}/pods/{name}")).await?;
    labels_of(status, &body).map_err(|e| format!("pod {namespace}/{name}: {e}"))
}

/// A pod's labels from the API's answer.
pub fn labels_of(status: u16, body: &[u8]) -> Result<BTreeMap<String, String>, String> {
    match status {
        200 => {
            let pod: serde_json::Value =
                serde_json::from_slice(body).map_err(|_| "the answer is not JSON")?;
            let labels = &pod["metadata"]["labels"];
            if labels.is_null() {
                return Ok(BTreeMap::new());
            }
            let map = labels.as_object().ok_or("its labels are not an object")?;
            map.iter()
                .map(|(k, v)| {
                    let v = v.as_str().ok_or_else(|| format!("label {k:?} is not a string"))?;
                    Ok((k.clone(), v.to_string()))
                })
                .collect()
        }
        404 => Err("no such pod".into()),
        _ => Err(format!("the API answered {status} {}", message(body))),
    }
}

#[cfg(test)]
mod tests;
