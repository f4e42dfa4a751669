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
//! Only a 404 is `absent`. A 401 or 403 (a token refused, a role missing)
//! says nothing of the DaemonSet: a transient failure of authentication
//! in a rolling update must not tear the node's network down, so it is an
//! error (exit 1), which the hook takes as "remains": it hands over, and
//! logs why. (Removing vnet therefore deletes the DaemonSet first, while
//! the account its pods ask with still exists: docs/INTEGRATION.md.)

use std::process::ExitCode;
use vnet_kube::Api;

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
    let asked = Api::in_this_pod().and_then(|api| {
        let path = format!("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        let (status, body) = rt.block_on(vnet_kube::get_bounded(&api, &path))?;
        decide(status, &body)
    });
    match asked {
        Ok(state) => {
            {
                use std::io::Write as _;
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{}", state.word()).and_then(|()| o.flush());
            }
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
        if !vnet_kube::is_name(v) {
            return Err(format!("{what} {v:?}: expected a Kubernetes name (a-z, 0-9, '.', '-')"));
        }
    }
    Ok((ns.to_string(), name.to_string()))
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
        401 | 403 => Err(format!(
            "the API refused this pod's credentials ({status} {}): the DaemonSet's state is unknown, \
             so the network stays",
            vnet_kube::message(body)
        )),
        _ => Err(format!("the API answered {status} {}", vnet_kube::message(body))),
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
        // Refused credentials say nothing of the DaemonSet: the network stays.
        let e = decide(401, br#"{"kind":"Status","code":401,"message":"Unauthorized"}"#).unwrap_err();
        assert!(e.contains("401") && e.contains("network stays"), "{e}");
        let e = decide(403, br#"{"kind":"Status","message":"forbidden: no"}"#).unwrap_err();
        assert!(e.contains("403") && e.contains("forbidden: no"), "{e}");
        assert!(decide(200, b"<html>").is_err());
        assert!(decide(500, b"").is_err());
    }
}
