//! When etcd does not answer: how long `network` and `join` wait for it
//! (an etcd just started, as the quickstart does, answers within a second
//! or two), and what they say then: where they looked, what the
//! connection met, and the command that starts it, instead of gRPC's text.

use std::future::Future;
use std::time::Duration;

/// How long a command waits for an etcd that does not answer (each try
/// bounded by the connect timeout, 2 s).
pub const WAIT: Duration = Duration::from_secs(10);
/// After this long without an answer, a command says it is waiting.
const SAY_AFTER: Duration = Duration::from_secs(2);

/// Whether an etcd error says etcd is not (yet) there to answer.
pub fn unreachable(e: &etcd_client::Error) -> bool {
    let said = e.to_string();
    matches!(e, etcd_client::Error::TransportError(_))
        || said.contains("currently unavailable")
        || said.contains("connect error")
}

/// What the connection met, in words (read off the error's chain).
fn met(e: &etcd_client::Error) -> &'static str {
    let all = format!("{e} {e:?}");
    if all.contains("ConnectionRefused") || all.contains("Connection refused") {
        "connection refused: nothing listens there"
    } else if all.contains("TimedOut") || all.contains("timed out") || all.contains("Elapsed") {
        "no answer within the connect timeout"
    } else if all.contains("HostUnreachable")
        || all.contains("NetworkUnreachable")
        || all.contains("No route")
    {
        "no route to it"
    } else if all.contains("certificate") || all.contains("InvalidCertificate") {
        "its TLS certificate is not the network's CA's"
    } else {
        "it does not answer"
    }
}

/// Where etcd's configuration is: the admin's directory, if known.
pub enum Start<'a> {
    /// On the admin machine, with its directory.
    Admin(&'a std::path::Path),
    /// On a host: the admin machine's business.
    Host,
}

/// The message for an etcd at `url` that does not answer.
pub fn down(url: &str, e: &etcd_client::Error, start: Start<'_>) -> String {
    let how = match start {
        Start::Admin(dir) => format!(
            "Start it with `etcd --config-file {}/etcd.yml` (or its unit), then run this again",
            dir.display()
        ),
        Start::Host => "On the admin machine, start it with `etcd --config-file DIR/etcd.yml` (DIR: the \
             directory `vnetctl network init` made), then run this again"
            .to_string(),
    };
    format!("etcd at {url} does not answer ({}): is it running? {how}", met(e))
}

/// Runs `attempt` until it succeeds, fails otherwise than by etcd not
/// answering, or `wait` ([`WAIT`]) has passed; says once that it waits.
pub async fn retry<T, F, Fut>(url: &str, wait: Duration, mut attempt: F) -> Result<T, etcd_client::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, etcd_client::Error>>,
{
    let t0 = tokio::time::Instant::now();
    let mut said = false;
    loop {
        match attempt().await {
            Err(e) if unreachable(&e) && t0.elapsed() < wait => {
                if !said && t0.elapsed() >= SAY_AFTER {
                    eprintln!("vnetctl: waiting for etcd at {url} ({}), up to {} s", met(&e), wait.as_secs());
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// etcd not running: within the bound (not 30 s), a message naming the
    /// address, asking whether it runs, and the command that starts it.
    #[test]
    fn an_etcd_that_is_not_running_is_named_with_the_command_that_starts_it() {
        // A loopback port nobody listens on.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("https://127.0.0.1:{port}");
        let rt = crate::onboard::runtime().unwrap();
        let t0 = std::time::Instant::now();
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        let wait = Duration::from_secs(1);
        let r = rt.block_on(retry(&url, wait, || crate::onboard::connect(&url, &ca, Some(("root", "pw")))));
        let took = t0.elapsed();
        let e = r.err().expect("nobody listens");
        assert!(unreachable(&e), "{e:?}");
        assert!(took < wait + Duration::from_secs(5), "{took:?}");
        let dir = std::path::Path::new("/root/vnet-lab");
        let said = down(&url, &e, Start::Admin(dir));
        let want = [
            url.as_str(),
            "connection refused",
            "is it running?",
            "etcd --config-file /root/vnet-lab/etcd.yml",
        ];
        for want in want {
            assert!(said.contains(want), "{want}: {said}");
        }
        assert!(!said.contains("tonic") && !said.contains("grpc"), "{said}");
        let said = down(&url, &e, Start::Host);
        assert!(said.contains("On the admin machine") && said.contains("etcd --config-file DIR/etcd.yml"));
    }
}
