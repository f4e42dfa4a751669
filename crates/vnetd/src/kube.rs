//! `pod-labels NAMESPACE/NAME`: a Kubernetes pod's labels, asked of the API
//! as the service account of the pod vnetd runs in (vnet's DaemonSet). The
//! CNI plugin asks it during `ADD` to turn the labels its network names
//! (`groupLabels`) into the pod's policy groups; it runs on the node, with
//! no credentials of its own.
//!
//! The answer is JSON, `{"pod": "NAMESPACE/NAME", "labels": {KEY: VALUE}}`.
//! The pod is a checked [`PodRef`] (Kubernetes names only), so nothing a
//! client sends becomes anything but that path.

use vnet_control::request::PodRef;

/// Answers a `pod-labels` request.
pub async fn pod_labels(pod: &str) -> vnet_control::Reply {
    let pod = match PodRef::new(pod) {
        Ok(p) => p,
        Err(e) => return vnet_control::Reply::error(format!("pod-labels: {e}")),
    };
    let (namespace, name) = pod.parts();
    let asked = match vnet_kube::Api::in_this_pod() {
        Ok(api) => vnet_kube::pod_labels(&api, namespace, name).await,
        Err(e) => Err(e),
    };
    match asked {
        Ok(labels) => {
            let body = serde_json::json!({ "pod": pod.as_str(), "labels": labels });
            vnet_control::Reply::data(body.to_string())
        }
        Err(e) => vnet_control::Reply::error(format!("pod-labels {pod}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_pod_the_answer_says_so_and_a_bad_pod_is_refused() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
            let r = rt.block_on(pod_labels("default/web"));
            let (body, end) = (r.body.clone(), r.end_line());
            assert!(body.is_empty());
            assert!(end.starts_with("end error pod-labels default/web: not in a pod"), "{end}");
        }
        let end = rt.block_on(pod_labels("default/../nodes")).end_line();
        assert!(end.starts_with("end error pod-labels: pod"), "{end}");
    }
}
