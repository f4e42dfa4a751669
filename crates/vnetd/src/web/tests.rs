use super::*;

fn get_req(path: &str, host: Option<&str>) -> Vec<u8> {
    let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
    format!("GET {path} HTTP/1.1\r\n{host}User-Agent: t\r\n\r\n").into_bytes()
}

#[test]
fn requests_are_routed_and_only_get_is_answered() {
    assert_eq!(asked(&get_req("/metrics", None)), Asked::Metrics);
    assert_eq!(asked(&get_req("/", Some("127.0.0.1:9108"))), Asked::Page);
    assert_eq!(asked(&get_req("/dashboard?x=1", Some("localhost:9108"))), Asked::Page);
    assert_eq!(asked(&get_req("/api/state.json", Some("[::1]:9108"))), Asked::State);
    let http10 = b"GET /api/state.json HTTP/1.0\r\nUser-Agent: t\r\n\r\n";
    assert_eq!(asked(http10), Asked::State, "no Host: an HTTP/1.0 client");
    assert_eq!(asked(&get_req("/api/state.json", None)), Asked::ForeignHost, "HTTP/1.1 without a Host");
    assert_eq!(asked(&get_req("/etc/passwd", None)), Asked::NotFound);
    for m in ["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"] {
        let req = format!("{m} /api/state.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        assert_eq!(asked(req.as_bytes()), Asked::NotAllowed, "{m}");
    }
    assert_eq!(asked(b"\x16\x03\x01garbage"), Asked::Bad);
    assert_eq!(asked(b""), Asked::Bad);
}

/// DNS rebinding, as an attacker does it: a page of theirs, its name
/// pointed at 127.0.0.1, asks this listener; the browser sends the
/// attacker's name as `Host`. Refused for the page and its document; the
/// same request naming the address (the positive control) is served.
#[test]
fn a_rebound_name_gets_neither_the_page_nor_its_document() {
    for path in ["/", "/dashboard", "/api/state.json"] {
        for evil in
            ["evil.example", "evil.example:9108", "127.0.0.1.evil.example", "localhost.evil.example:9108"]
        {
            assert_eq!(asked(&get_req(path, Some(evil))), Asked::ForeignHost, "{path} {evil}");
        }
        for good in ["127.0.0.1", "127.0.0.1:9108", "10.0.0.1:9108", "localhost", "[::1]", "[::1]:9108"] {
            assert_ne!(asked(&get_req(path, Some(good))), Asked::ForeignHost, "{path} {good}");
        }
    }
    for odd in ["[::1", "[::1]x", "127.0.0.1:port", ""] {
        assert!(!host_is_an_address(odd), "{odd}");
    }
    // A request sized so that the read limit cuts it just before its
    // Host (the rest of the head never read): refused, not served as a
    // request without a Host. The same request whole is the control.
    for path in ["/", "/api/state.json"] {
        let whole = get_req(&format!("{path}?{}", "A".repeat(MAX_HTTP_REQUEST)), Some("evil.example"));
        let cut = &whole[..whole.windows(2).position(|w| w == b"\r\n").unwrap() + 2];
        assert_eq!(asked(cut), Asked::Bad, "{path}: a head cut before its Host");
        assert_eq!(asked(&whole), Asked::ForeignHost, "{path}: the whole head");
    }
    // Scrapers name their targets as they like.
    assert_eq!(asked(&get_req("/metrics", Some("node1.example:9108"))), Asked::Metrics);
}

/// The page is one document: its script and style inline, and the policy
/// it is served with allows exactly those (a browser runs the script only
/// when its hash is in `script-src`), requests to this origin, nothing
/// fetched from elsewhere.
#[test]
fn the_page_carries_its_assets_and_a_policy_that_allows_only_them() {
    use base64::Engine as _;
    let p = page();
    let between = |open: &str, close: &str| {
        let a = p.find(open).unwrap() + open.len();
        &p[a..a + p[a..].find(close).unwrap()]
    };
    let hash = |s: &str| {
        let d = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
        base64::engine::general_purpose::STANDARD.encode(d.as_ref())
    };
    let csp = page_policy();
    assert!(
        csp.contains(&format!("script-src 'sha256-{}';", hash(between("<script>", "</script>")))),
        "{csp}"
    );
    assert!(csp.contains(&format!("style-src 'sha256-{}';", hash(between("<style>", "</style>")))), "{csp}");
    assert!(csp.starts_with("default-src 'none';") && csp.contains("connect-src 'self';"), "{csp}");
    // Nothing from elsewhere: no address but SVG's namespace name, no
    // element that loads one.
    let p_ = p.replace("\"http://www.w3.org/2000/svg\"", "");
    for loads in ["http://", "https://", "\"//", "src=", "href=", "<link", "@import", "url("] {
        assert!(!p_.contains(loads), "{loads}");
    }
    assert_eq!(p.matches("<script>").count(), 1);
    // Text from peers and the store goes in as text, never as markup.
    for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function("] {
        assert!(!PAGE_JS.contains(sink), "{sink}");
    }
}

#[test]
fn the_listener_serves_metrics_the_page_and_its_document_and_refuses_writes() {
    let mut d = Daemon::default();
    let text = "listen udp 127.0.0.1:0\nlink b udp 127.0.0.2\nroute any any -> link b\n";
    d.apply(&vnet_control::parse(text).unwrap()).unwrap();
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let daemon = Arc::new(Mutex::new(d));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let send = move |req: String| {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        c.write_all(req.as_bytes()).unwrap();
        let mut r = String::new();
        c.read_to_string(&mut r).unwrap();
        r
    };
    let get = move |path: &str| send(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n"));
    rt.block_on(async {
        let server = tokio::spawn(serve(addr, daemon));
        let replies = tokio::task::spawn_blocking(move || {
            // The listener is up once it answers (the test connects until then).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::net::TcpStream::connect(addr).is_err() && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            [
                get("/metrics"),
                get("/"),
                get("/api/state.json"),
                get("/other"),
                send(format!(
                    "POST /api/state.json HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 2\r\n\r\n{{}}"
                )),
                send("GET / HTTP/1.0\r\nHost: evil.example\r\n\r\n".into()),
            ]
        })
        .await
        .unwrap();
        let [metrics, page, state, missing, post, rebound] = replies;
        assert!(
            metrics.starts_with("HTTP/1.0 200 OK\r\n")
                && metrics.contains("vnet_link_rx_packets{link=\"b\"} 0"),
            "{metrics}"
        );
        assert!(page.starts_with("HTTP/1.0 200 OK\r\nContent-Type: text/html"), "{page}");
        assert!(page.contains("Content-Security-Policy: default-src 'none'"), "{page}");
        assert!(page.contains("id=\"graph\""), "{page}");
        let body = state.split_once("\r\n\r\n").unwrap().1;
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["links"][0]["name"], "b", "{v}");
        assert!(missing.starts_with("HTTP/1.0 404"), "{missing}");
        assert!(post.starts_with("HTTP/1.0 405") && post.contains("Allow: GET\r\n"), "{post}");
        assert!(rebound.starts_with("HTTP/1.0 403"), "{rebound}");
        server.abort();
    });
}
