use super::*;
use serde_json::json;

fn policy(ns: &str, name: &str, rv: &str) -> serde_json::Value {
    json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}, "spec": {"podSelector": {}}})
}

fn line(kind: &str, obj: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"type": kind, "object": obj})).unwrap()
}

#[test]
fn a_list_by_pages_then_events_keep_the_store() {
    let kind = network_policies();
    let mut s = Store::default();
    let mut into = BTreeMap::new();
    let page1 = json!({"metadata": {"resourceVersion": "10", "continue": "abc"},
                       "items": [policy("a", "p", "5"), {"metadata": {"name": "no-namespace"}}]});
    let next = s.page(&serde_json::to_vec(&page1).unwrap(), kind.parse, &mut into).unwrap();
    assert_eq!(next.as_deref(), Some("abc"));
    assert_eq!(
        (into.len(), s.bad, s.objects.len()),
        (1, 1, 0),
        "the list is built apart, the bad one counted"
    );
    let page2 = json!({"metadata": {"resourceVersion": "11"}, "items": [policy("b", "q", "6")]});
    assert_eq!(s.page(&serde_json::to_vec(&page2).unwrap(), kind.parse, &mut into).unwrap(), None);
    s.objects = into;
    assert_eq!(s.version, "11");
    assert!(s.event(&line("ADDED", policy("c", "r", "12")), kind.parse).unwrap());
    assert_eq!(s.version, "12");
    assert!(s.event(&line("DELETED", policy("a", "p", "13")), kind.parse).unwrap());
    assert!(!s.event(&line("DELETED", policy("a", "p", "14")), kind.parse).unwrap(), "already gone");
    assert!(!s.event(&line("BOOKMARK", json!({"metadata": {"resourceVersion": "20"}})), kind.parse).unwrap());
    assert_eq!(s.version, "20");
    assert_eq!(s.objects.keys().collect::<Vec<_>>(), ["b/q", "c/r"]);
    // A policy that cannot be read: counted, and what was held stays.
    let bad = json!({"metadata": {"namespace": "b", "name": "q"}, "spec": {"ingress": "all"}});
    assert!(!s.event(&line("MODIFIED", bad), kind.parse).unwrap());
    assert_eq!((s.bad, s.objects.len()), (2, 2));
    let gone = json!({"kind": "Status", "code": 410, "message": "too old resource version"});
    assert_eq!(s.event(&line("ERROR", gone), kind.parse), Err(WatchError::Gone));
    let denied = json!({"kind": "Status", "code": 403, "message": "forbidden"});
    assert_eq!(s.event(&line("ERROR", denied), kind.parse), Err(WatchError::Status(403, "forbidden".into())));
    assert!(s.event(b"{\"type\":\"SURPRISE\"}", kind.parse).is_err());
    assert!(s.event(b"not json", kind.parse).is_err());
}

#[test]
fn events_are_split_into_lines_and_bounded() {
    let mut buf = Vec::new();
    let mut seen = Vec::new();
    let mut take = |l: &[u8]| {
        seen.push(String::from_utf8(l.to_vec()).unwrap());
        Ok(())
    };
    lines(&mut buf, b"{\"a\":1}\n{\"b\"", 100, &mut take).unwrap();
    lines(&mut buf, b":2}\n\n", 100, &mut take).unwrap();
    assert_eq!(seen, ["{\"a\":1}", "{\"b\":2}"]);
    assert!(buf.is_empty());
    let mut buf = Vec::new();
    let e = lines(&mut buf, &[b'x'; 101], 100, |_| Ok(())).unwrap_err();
    assert_eq!(e, WatchError::TooLong(100), "a line never ended is not held past the bound");
}

#[test]
fn a_full_store_refuses_and_counts() {
    let kind = namespaces();
    let mut s = Store::default();
    for i in 0..MAX_OBJECTS {
        s.objects.insert(
            format!("n{i}"),
            crate::objects::Namespace { name: String::new(), labels: Default::default() },
        );
    }
    let ns = json!({"metadata": {"name": "one-more"}});
    assert!(!s.event(&line("ADDED", ns), kind.parse).unwrap());
    assert_eq!((s.refused, s.objects.len()), (1, MAX_OBJECTS));
    assert!(s
        .event(&line("MODIFIED", json!({"metadata": {"name": "n7", "labels": {"a": "b"}}})), kind.parse)
        .unwrap());
}

#[test]
fn a_continue_token_is_escaped() {
    let e: String = url_escape("a+b/c=&d e").collect();
    assert_eq!(e, "a%2Bb%2Fc%3D%26d%20e");
}

/// A TLS server on 127.0.0.1 answering its connections in turn with
/// `answers` (one each); returns the port and the requests' first lines.
async fn serve(answers: Vec<Vec<u8>>) -> (u16, String, tokio::task::JoinHandle<Vec<String>>) {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (ca, cert, key) = crate::tests::certificates();
    let certs =
        rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes()).map(Result::unwrap).collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut seen = Vec::new();
        for answer in answers {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = tls.read(&mut buf).await.unwrap();
                assert!(n > 0);
                req.extend_from_slice(&buf[..n]);
            }
            seen.push(String::from_utf8_lossy(&req).lines().next().unwrap_or_default().to_string());
            let _ = tls.write_all(&answer).await;
            let _ = tls.shutdown().await;
        }
        seen
    });
    (port, ca, task)
}

fn http(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Over TLS: a list of two pages, then a watch whose events change the
/// store and wake the translation; then a watch the API says is too old
/// (410), which asks for a list again.
#[test]
fn a_list_by_pages_then_a_watch_over_tls() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let page1 = json!({"metadata": {"resourceVersion": "10", "continue": "c/1+"}, "items": [policy("a", "p", "5")]});
        let page2 = json!({"metadata": {"resourceVersion": "11"}, "items": [policy("b", "q", "6")]});
        let events = [line("ADDED", policy("c", "r", "12")), line("DELETED", policy("a", "p", "13"))]
            .map(|l| String::from_utf8(l).unwrap())
            .join("\n")
            + "\n";
        let gone = http("410 Gone", r#"{"kind":"Status","code":410,"message":"too old"}"#);
        let (port, ca, seen) = serve(vec![
            http("200 OK", &page1.to_string()),
            http("200 OK", &page2.to_string()),
            http("200 OK", &events),
            gone,
        ])
        .await;
        let api = crate::tests::api(port, &ca);
        let kind = network_policies();
        let store = Mutex::new(Store::default());
        let changed = tokio::sync::Notify::new();
        list(&api, &kind, &store).await.unwrap();
        {
            let s = store.lock().unwrap();
            assert!(s.synced && s.version == "11");
            assert_eq!(s.objects.keys().collect::<Vec<_>>(), ["a/p", "b/q"]);
        }
        follow(&api, &kind, &store, &changed).await.unwrap();
        // The change was told (a permit is stored for the next waiter).
        tokio::time::timeout(Duration::from_secs(1), changed.notified()).await.unwrap();
        {
            let s = store.lock().unwrap();
            assert_eq!(s.objects.keys().collect::<Vec<_>>(), ["b/q", "c/r"]);
            assert_eq!(s.version, "13");
        }
        assert_eq!(follow(&api, &kind, &store, &changed).await, Err(WatchError::Gone));
        let seen = seen.await.unwrap();
        let base = "/apis/networking.k8s.io/v1/networkpolicies";
        assert_eq!(seen[0], format!("GET {base}?limit=250 HTTP/1.1"));
        assert_eq!(seen[1], format!("GET {base}?limit=250&continue=c%2F1%2B HTTP/1.1"));
        assert!(seen[2].starts_with(&format!("GET {base}?watch=1&allowWatchBookmarks=true")), "{}", seen[2]);
        assert!(seen[2].ends_with("&resourceVersion=11 HTTP/1.1"), "{}", seen[2]);
        assert!(seen[3].ends_with("&resourceVersion=13 HTTP/1.1"), "{}", seen[3]);
    });
}

/// The API failing midway through a list (a page answered, then a 500, or
/// no answer at all) leaves the store as it was: the last view stays in
/// force while the API cannot be reached.
#[test]
fn a_list_that_fails_midway_keeps_the_last_view() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let page1 = json!({"metadata": {"resourceVersion": "20", "continue": "x"}, "items": [policy("new", "p", "19")]});
        let (port, ca, _seen) = serve(vec![
            http("200 OK", &page1.to_string()),
            http("500 Internal Server Error", r#"{"kind":"Status","message":"etcdserver: request timed out"}"#),
        ])
        .await;
        let kind = network_policies();
        let mut held = Store::default();
        held.objects.insert("old/p".to_string(), objects::network_policy(&policy("old", "p", "3")).unwrap());
        held.synced = true;
        let store = Mutex::new(held);
        let e = list(&crate::tests::api(port, &ca), &kind, &store).await.unwrap_err();
        assert_eq!(e, WatchError::Status(500, "etcdserver: request timed out".into()));
        assert_eq!(store.lock().unwrap().objects.keys().collect::<Vec<_>>(), ["old/p"]);
        // Nobody listening: the same.
        let e = list(&crate::tests::api(1, &ca), &kind, &store).await.unwrap_err();
        assert!(matches!(e, WatchError::Api(_)), "{e}");
        assert_eq!(store.lock().unwrap().objects.keys().collect::<Vec<_>>(), ["old/p"]);
    });
}
