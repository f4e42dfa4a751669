//! Policy groups from a pod's labels (`groupLabels`): for each label key
//! the network names, the pod's value of it is one of its groups (`app:
//! web` puts the pod in group `web`). The labels come from vnetd
//! (`pod-labels NAMESPACE/NAME`), which asks the Kubernetes API as its
//! pod's service account; the pod is the one the runtime names in
//! `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`), as the kubelet's CRI
//! runtimes pass it.
//!
//! A value that is not a group name (a letter, then letters, digits, `_`,
//! `-` or `.`) fails the `ADD` (code 103): the pod would otherwise run
//! outside a group its policy counts on.
//!
//! Groups are the namespace's (`groupScope`, default `namespace`): `app:
//! db` in namespace `prod` is group `prod.db`, so a pod anyone may create
//! in another namespace, with the same label, is not in `prod`'s group: a
//! rule `from group prod.db` is met by `prod`'s pods alone. A scoped name
//! that is no group name (a namespace starting with a digit, or over 64
//! characters together) fails the `ADD` the same way. `groupScope:
//! cluster` takes the value alone, for clusters whose every namespace is
//! trusted with every group.

use crate::result::{Code, Error, Result};
use serde_json::Value;
use vnet_client::request::{Name, PodRef};

/// The most label keys a network may name.
pub const MAX_KEYS: usize = 16;

/// True for a Kubernetes label key: an optional prefix (a DNS subdomain)
/// and `/`, then a name of 1-63 of `A-Za-z0-9-_.`, alphanumeric at both
/// ends.
pub fn is_label_key(k: &str) -> bool {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let alnum_ends = |s: &str| {
        s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    let name_ok = (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && alnum_ends(name);
    let prefix_ok = prefix.is_none_or(vnet_control::ast::is_kube_name);
    name_ok && prefix_ok
}

/// The pod `CNI_ARGS` names (`K8S_POD_NAMESPACE=...;K8S_POD_NAME=...`).
pub fn pod_of(args: Option<&str>) -> Result<PodRef> {
    let mut ns = None;
    let mut name = None;
    for pair in args.unwrap_or("").split(';') {
        match pair.split_once('=') {
            Some(("K8S_POD_NAMESPACE", v)) => ns = Some(v),
            Some(("K8S_POD_NAME", v)) => name = Some(v),
            _ => {}
        }
    }
    let (Some(ns), Some(name)) = (ns, name) else {
        return Err(Error::new(
            Code::InvalidEnvironment,
            "groupLabels needs the pod: CNI_ARGS has no K8S_POD_NAMESPACE and K8S_POD_NAME",
        ));
    };
    PodRef::new(&format!("{ns}/{name}"))
        .map_err(|e| Error::with(Code::InvalidEnvironment, "CNI_ARGS K8S_POD_NAMESPACE/K8S_POD_NAME", e))
}

/// The groups vnetd's answer (`{"labels": {...}}`) gives through `keys`,
/// each once, in the order of `keys`: each value prefixed with
/// `namespace.` when one is given (the pod's, under `groupScope:
/// namespace`).
pub fn groups(answer: &str, keys: &[String], namespace: Option<&str>) -> Result<Vec<Name>> {
    let v: Value = serde_json::from_str(answer)
        .map_err(|e| Error::with(Code::Decode, "vnetd's answer to pod-labels is not JSON", e))?;
    let labels = v["labels"]
        .as_object()
        .ok_or_else(|| Error::new(Code::Decode, "vnetd's answer to pod-labels has no `labels`"))?;
    let mut out: Vec<Name> = Vec::new();
    for k in keys {
        let Some(value) = labels.get(k).and_then(Value::as_str) else { continue };
        let not_group = |name: &str| {
            Error::with(
                Code::LabelNotGroup,
                format!("pod label {k}={value}: {name} is not a group name"),
                Name::EXPECTED,
            )
        };
        let mut g = Name::new(value).map_err(|_| not_group("the value"))?;
        if let Some(ns) = namespace {
            let scoped = format!("{ns}.{value}");
            g = Name::new(&scoped).map_err(|_| not_group(&format!("`{scoped}` (namespace.value)")))?;
        }
        if !out.contains(&g) {
            out.push(g);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_client::request::Request;

    #[test]
    fn label_keys_are_kubernetes_label_keys() {
        for ok in ["app", "tier", "vnet.dev/group", "app.kubernetes.io/name", "a_b-c.d"] {
            assert!(is_label_key(ok), "{ok}");
        }
        for bad in ["", "/app", "vnet.dev/", "-app", "app-", "a b", "Vnet.dev/x", "a/b/c", &"a".repeat(64)] {
            assert!(!is_label_key(bad), "{bad}");
        }
    }

    #[test]
    fn the_pod_is_the_one_cni_args_names_and_a_kubernetes_name() {
        let args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc";
        assert_eq!(pod_of(Some(args)).unwrap().as_str(), "shop/web-0");
        assert_eq!(pod_of(None).unwrap_err().code, Code::InvalidEnvironment as u32);
        assert!(pod_of(Some("K8S_POD_NAME=web")).is_err());
        for bad in ["K8S_POD_NAMESPACE=shop;K8S_POD_NAME=../x", "K8S_POD_NAMESPACE=a/b;K8S_POD_NAME=w"] {
            assert_eq!(pod_of(Some(bad)).unwrap_err().code, Code::InvalidEnvironment as u32, "{bad}");
        }
        assert_eq!(Request::PodLabels(pod_of(Some(args)).unwrap()).line(), "pod-labels shop/web-0");
    }

    #[test]
    fn the_named_labels_values_are_the_groups() {
        let keys = vec!["app".to_string(), "vnet.dev/group".to_string(), "tier".to_string()];
        let answer = r#"{"pod":"shop/web-0","labels":{"app":"web","vnet.dev/group":"front","other":"x"}}"#;
        let g: Vec<String> = groups(answer, &keys, None).unwrap().iter().map(Name::to_string).collect();
        assert_eq!(g, ["web", "front"]);
        // The same group through two labels: once.
        let twice = r#"{"labels":{"app":"web","tier":"web"}}"#;
        assert_eq!(groups(twice, &keys, None).unwrap().len(), 1);
        assert!(groups(r#"{"labels":{}}"#, &keys, None).unwrap().is_empty());
        // A value that cannot be a group (or would be a word of another
        // line) fails, naming the label.
        for v in ["1st", "web\nlink x udp 1.2.3.4:9", "any", ""] {
            let answer = serde_json::json!({ "labels": { "app": v } }).to_string();
            for ns in [None, Some("prod")] {
                let e = groups(&answer, &keys, ns).unwrap_err();
                assert_eq!(e.code, Code::LabelNotGroup as u32, "{v:?}");
                assert!(e.msg.contains("pod label app="), "{e}");
            }
        }
        assert_eq!(groups("{}", &keys, None).unwrap_err().code, Code::Decode as u32);
    }

    /// Under `groupScope: namespace` a label's value is its namespace's
    /// group: `db` in `prod` and `db` in `dev` are two groups, and neither
    /// is the bare `db` a rule of another scope names.
    #[test]
    fn a_labels_group_is_its_namespaces() {
        let keys = vec!["app".to_string()];
        let answer = r#"{"labels":{"app":"db"}}"#;
        let of = |ns| groups(answer, &keys, ns).unwrap().iter().map(Name::to_string).collect::<Vec<_>>();
        assert_eq!(of(Some("prod")), ["prod.db"]);
        assert_eq!(of(Some("dev")), ["dev.db"]);
        assert_eq!(of(None), ["db"], "groupScope: cluster");
        let conf = |scope: &str| {
            let c = format!(r#"{{"cniVersion":"1.0.0","name":"n","type":"vnet-cni"{scope}}}"#);
            crate::spec::parse_conf(c.as_bytes()).map(|(c, _)| c.group_scope)
        };
        use crate::spec::GroupScope;
        assert_eq!(conf("").unwrap(), GroupScope::Namespace, "the default");
        assert_eq!(conf(r#","groupScope":"cluster""#).unwrap(), GroupScope::Cluster);
        assert_eq!(conf(r#","groupScope":"everyone""#).unwrap_err().code, Code::InvalidConfig as u32);
        // A scoped name that is no group name fails, naming it.
        for ns in ["1ns".to_string(), "n".repeat(63)] {
            let e = groups(answer, &keys, Some(&ns)).unwrap_err();
            assert_eq!(e.code, Code::LabelNotGroup as u32);
            assert!(e.msg.contains("(namespace.value) is not a group name"), "{e}");
        }
    }
}
