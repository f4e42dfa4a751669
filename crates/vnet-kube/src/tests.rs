use super::*;

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
pub(crate) fn certificates() -> (String, String, String) {
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
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
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

pub(crate) fn api(port: u16, ca: &str) -> Api {
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
        assert_eq!(status, 200);
        assert_eq!(&got[..], &body[..]);
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

#[test]
fn names_are_kubernetes_names_or_refused() {
    assert!(is_name("kube-system") && is_name("web-0.db"));
    for bad in ["", "A", "-x", "x-", "a/b", "..", "ns?x", "a b"] {
        assert!(!is_name(bad), "{bad}");
    }
    assert!(!is_name(&"a".repeat(254)) && is_name(&"a".repeat(253)));
}

#[test]
fn a_pods_labels_from_the_answer() {
    let pod = br#"{"metadata":{"name":"web","labels":{"app":"web","tier":"front"}}}"#;
    let l = labels_of(200, pod).unwrap();
    assert_eq!(l.get("app").map(String::as_str), Some("web"));
    assert_eq!(l.len(), 2);
    assert!(labels_of(200, br#"{"metadata":{"name":"web"}}"#).unwrap().is_empty());
    assert!(labels_of(200, br#"{"metadata":{"labels":{"app":1}}}"#).unwrap_err().contains("not a string"));
    assert!(labels_of(200, br#"{"metadata":{"labels":[]}}"#).is_err());
    assert!(labels_of(200, b"<html>").is_err());
    assert_eq!(labels_of(404, b"{}").unwrap_err(), "no such pod");
    let e = labels_of(403, br#"{"kind":"Status","message":"pods is forbidden"}"#).unwrap_err();
    assert!(e.contains("403") && e.contains("pods is forbidden"), "{e}");
}

#[test]
fn a_pod_that_is_not_a_kubernetes_name_is_never_asked() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let api = api(1, &certificates().0);
    for (ns, name) in [("default", "../nodes"), ("a/b", "web"), ("default", "web?watch=1")] {
        let e = rt.block_on(pod_labels(&api, ns, name)).unwrap_err();
        assert!(e.contains("expected a Kubernetes name"), "{e}");
    }
}
