//! The parts of the Kubernetes objects NetworkPolicy needs, read from the
//! API's JSON: a pod's namespace, labels, addresses and named ports, a
//! namespace's labels, a NetworkPolicy's spec. Only what is read is kept
//! (the watch holds these, not the objects). Anything malformed is an
//! [`ObjectError`], never a panic.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Labels, as the API gives them.
pub type Labels = BTreeMap<String, String>;

/// An object the API sent that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ObjectError {
    #[error("not a {kind} object: {reason}")]
    Shape { kind: &'static str, reason: String },
    #[error("{0}: without a namespace or a name")]
    Unnamed(&'static str),
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub labels: Labels,
    #[serde(default)]
    pub resource_version: String,
}

/// A pod's named container port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedPort {
    pub name: String,
    pub proto: u8,
    pub port: u16,
}

/// A pod, as NetworkPolicy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    /// Its addresses (none yet: not selected, no peer).
    pub ips: Vec<IpAddr>,
    /// On the node's network: no policy applies to it.
    pub host_network: bool,
    pub ports: Vec<NamedPort>,
}

/// A namespace's labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Namespace {
    pub name: String,
    pub labels: Labels,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Requirement {
    pub key: String,
    pub operator: String,
    #[serde(default)]
    pub values: Vec<String>,
}

/// A label selector (`{}`: everything).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Selector {
    #[serde(default)]
    pub match_labels: Labels,
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IpBlock {
    pub cidr: String,
    #[serde(default)]
    pub except: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PeerSpec {
    pub pod_selector: Option<Selector>,
    pub namespace_selector: Option<Selector>,
    pub ip_block: Option<IpBlock>,
}

/// A port: a number or a name.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PortRef {
    Number(i64),
    Name(String),
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PortSpec {
    pub protocol: Option<String>,
    pub port: Option<PortRef>,
    pub end_port: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuleSpec {
    /// `from` (ingress) or `to` (egress).
    #[serde(default, alias = "from", alias = "to")]
    pub peers: Option<Vec<PeerSpec>>,
    #[serde(default)]
    pub ports: Option<Vec<PortSpec>>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PolicySpec {
    #[serde(default)]
    pub pod_selector: Selector,
    pub policy_types: Option<Vec<String>>,
    pub ingress: Option<Vec<RuleSpec>>,
    pub egress: Option<Vec<RuleSpec>>,
}

/// A NetworkPolicy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicy {
    pub namespace: String,
    pub name: String,
    pub spec: PolicySpec,
}

impl NetworkPolicy {
    /// `NAMESPACE/NAME`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

fn shape(kind: &'static str) -> impl Fn(serde_json::Error) -> ObjectError {
    move |e| ObjectError::Shape { kind, reason: e.to_string() }
}

/// The metadata of any object.
pub fn meta(obj: &serde_json::Value) -> Result<Meta, ObjectError> {
    Meta::deserialize(&obj["metadata"]).map_err(shape("Kubernetes"))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerPort {
    name: Option<String>,
    container_port: i64,
    protocol: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Container {
    #[serde(default)]
    ports: Vec<ContainerPort>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodSpec {
    #[serde(default)]
    host_network: bool,
    #[serde(default)]
    containers: Vec<Container>,
    #[serde(default)]
    init_containers: Vec<Container>,
}

#[derive(Deserialize)]
struct PodIp {
    ip: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct PodStatus {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(default, rename = "podIPs")]
    pod_ips: Vec<PodIp>,
}

/// The protocol number of a `protocol` field (TCP when left out).
pub fn protocol(p: Option<&str>) -> Option<u8> {
    match p.unwrap_or("TCP") {
        "TCP" => Some(6),
        "UDP" => Some(17),
        "SCTP" => Some(132),
        _ => None,
    }
}

/// A pod from the API's JSON. A pod that ended (`Succeeded`, `Failed`)
/// has no addresses any more: its address may be another pod's next.
pub fn pod(obj: &serde_json::Value) -> Result<Pod, ObjectError> {
    let m = meta(obj)?;
    if m.name.is_empty() || m.namespace.is_empty() {
        return Err(ObjectError::Unnamed("pod"));
    }
    let spec = match obj.get("spec") {
        Some(s) => PodSpec::deserialize(s).map_err(shape("pod"))?,
        None => PodSpec::default(),
    };
    let status = match obj.get("status") {
        Some(s) => PodStatus::deserialize(s).map_err(shape("pod"))?,
        None => PodStatus::default(),
    };
    let ended = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    let mut ips: Vec<IpAddr> = status.pod_ips.iter().filter_map(|i| i.ip.parse().ok()).collect();
    if ips.is_empty() {
        ips.extend(status.pod_ip.as_deref().and_then(|i| i.parse::<IpAddr>().ok()));
    }
    if ended {
        ips.clear();
    }
    let ports = spec
        .containers
        .iter()
        .chain(&spec.init_containers)
        .flat_map(|c| &c.ports)
        .filter_map(|p| {
            Some(NamedPort {
                name: p.name.clone()?,
                proto: protocol(p.protocol.as_deref())?,
                port: u16::try_from(p.container_port).ok()?,
            })
        })
        .collect();
    Ok(Pod {
        namespace: m.namespace,
        name: m.name,
        labels: m.labels,
        ips,
        host_network: spec.host_network,
        ports,
    })
}

/// A namespace from the API's JSON.
pub fn namespace(obj: &serde_json::Value) -> Result<Namespace, ObjectError> {
    let m = meta(obj)?;
    if m.name.is_empty() {
        return Err(ObjectError::Unnamed("namespace"));
    }
    Ok(Namespace { name: m.name, labels: m.labels })
}

/// A NetworkPolicy from the API's JSON.
pub fn network_policy(obj: &serde_json::Value) -> Result<NetworkPolicy, ObjectError> {
    let m = meta(obj)?;
    if m.name.is_empty() || m.namespace.is_empty() {
        return Err(ObjectError::Unnamed("NetworkPolicy"));
    }
    let spec = PolicySpec::deserialize(&obj["spec"]).map_err(shape("NetworkPolicy"))?;
    Ok(NetworkPolicy { namespace: m.namespace, name: m.name, spec })
}

/// A Service's port: its name (empty for a lone unnamed port), protocol,
/// number and node port (0: none; an EndpointSlice's ports have none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub name: String,
    pub proto: u8,
    pub port: u16,
    pub node_port: u16,
}

/// A Service with a cluster address (headless and `ExternalName` ones
/// have none: nothing to judge in their place).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub namespace: String,
    pub name: String,
    pub cluster_ips: Vec<IpAddr>,
    pub ports: Vec<ServicePort>,
    /// Its other addresses that kube-proxy translates on every node, at
    /// its ports: `spec.externalIPs` and `status.loadBalancer.ingress[].ip`
    /// (at most [`MAX_EXTERNAL_IPS`] of each).
    pub external_ips: Vec<IpAddr>,
    /// The external and load balancer addresses past [`MAX_EXTERNAL_IPS`],
    /// left out.
    pub external_over: usize,
}

/// At most this many of a Service's `externalIPs`, and as many of its load
/// balancer addresses, are read (each one multiplies its ports' keys).
pub const MAX_EXTERNAL_IPS: usize = 16;

/// At most this many cluster addresses (one of each family, as the API
/// allows).
const MAX_CLUSTER_IPS: usize = 2;

/// An endpoint of an EndpointSlice: its addresses and conditions (left
/// out: `ready` is true, `serving` is `ready`, as the API says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub ips: Vec<IpAddr>,
    pub ready: bool,
    pub serving: bool,
}

/// An EndpointSlice: the Service it belongs to (its
/// `kubernetes.io/service-name` label), its endpoints and its ports (each
/// Service port's number on these endpoints, by the Service port's name,
/// named target ports resolved by the controller that wrote it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointSlice {
    pub namespace: String,
    pub service: String,
    pub endpoints: Vec<Endpoint>,
    pub ports: Vec<ServicePort>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawServicePort {
    #[serde(default)]
    name: Option<String>,
    protocol: Option<String>,
    port: Option<i64>,
    node_port: Option<i64>,
}

impl RawServicePort {
    fn read(&self) -> Option<ServicePort> {
        Some(ServicePort {
            name: self.name.clone().unwrap_or_default(),
            proto: protocol(self.protocol.as_deref())?,
            port: u16::try_from(self.port?).ok().filter(|&p| p > 0)?,
            node_port: self.node_port.and_then(|p| u16::try_from(p).ok()).unwrap_or(0),
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ServiceSpec {
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(default, rename = "clusterIPs")]
    cluster_ips: Vec<String>,
    #[serde(default)]
    ports: Vec<RawServicePort>,
    #[serde(default, rename = "externalIPs")]
    external_ips: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ServiceStatus {
    #[serde(default)]
    load_balancer: LoadBalancerStatus,
}

#[derive(Deserialize, Default)]
struct LoadBalancerStatus {
    #[serde(default)]
    ingress: Vec<LoadBalancerIngress>,
}

#[derive(Deserialize, Default)]
struct LoadBalancerIngress {
    ip: Option<String>,
}

/// A Service from the API's JSON (`None` and unparsable addresses and
/// ports left out).
pub fn service(obj: &serde_json::Value) -> Result<Service, ObjectError> {
    let m = meta(obj)?;
    if m.name.is_empty() || m.namespace.is_empty() {
        return Err(ObjectError::Unnamed("Service"));
    }
    let spec = match obj.get("spec") {
        Some(s) => ServiceSpec::deserialize(s).map_err(shape("Service"))?,
        None => ServiceSpec::default(),
    };
    let mut cluster_ips: Vec<IpAddr> =
        spec.cluster_ips.iter().filter_map(|a| a.parse().ok()).take(MAX_CLUSTER_IPS).collect();
    if cluster_ips.is_empty() {
        cluster_ips.extend(spec.cluster_ip.as_deref().and_then(|a| a.parse::<IpAddr>().ok()));
    }
    let ports = spec.ports.iter().filter_map(RawServicePort::read).collect();
    let status = match obj.get("status") {
        Some(s) => ServiceStatus::deserialize(s).map_err(shape("Service"))?,
        None => ServiceStatus::default(),
    };
    let lb: Vec<IpAddr> =
        status.load_balancer.ingress.iter().filter_map(|i| i.ip.as_deref()?.parse().ok()).collect();
    let ext: Vec<IpAddr> = spec.external_ips.iter().filter_map(|a| a.parse().ok()).collect();
    let external_over =
        ext.len().saturating_sub(MAX_EXTERNAL_IPS) + lb.len().saturating_sub(MAX_EXTERNAL_IPS);
    let mut external_ips: Vec<IpAddr> =
        ext.into_iter().take(MAX_EXTERNAL_IPS).chain(lb.into_iter().take(MAX_EXTERNAL_IPS)).collect();
    external_ips.sort_unstable();
    external_ips.dedup();
    Ok(Service { namespace: m.namespace, name: m.name, cluster_ips, ports, external_ips, external_over })
}

/// A node's addresses, as a pod may reach its NodePorts: its
/// `status.addresses` of type `InternalIP` and `ExternalIP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub addresses: Vec<IpAddr>,
}

#[derive(Deserialize, Default)]
struct NodeStatus {
    #[serde(default)]
    addresses: Vec<NodeAddress>,
}

#[derive(Deserialize)]
struct NodeAddress {
    #[serde(default, rename = "type")]
    kind: String,
    #[serde(default)]
    address: String,
}

/// A Node from the API's JSON (other kinds of address, and unparsable
/// ones, left out).
pub fn node(obj: &serde_json::Value) -> Result<Node, ObjectError> {
    let m = meta(obj)?;
    if m.name.is_empty() {
        return Err(ObjectError::Unnamed("Node"));
    }
    let status = match obj.get("status") {
        Some(s) => NodeStatus::deserialize(s).map_err(shape("Node"))?,
        None => NodeStatus::default(),
    };
    let mut addresses: Vec<IpAddr> = status
        .addresses
        .iter()
        .filter(|a| matches!(a.kind.as_str(), "InternalIP" | "ExternalIP"))
        .filter_map(|a| a.address.parse().ok())
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    Ok(Node { addresses })
}

#[derive(Deserialize, Default)]
struct Conditions {
    ready: Option<bool>,
    serving: Option<bool>,
}

#[derive(Deserialize)]
struct RawEndpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Conditions,
}

#[derive(Deserialize)]
struct RawSlice {
    #[serde(default)]
    endpoints: Vec<RawEndpoint>,
    #[serde(default)]
    ports: Option<Vec<RawServicePort>>,
}

/// The label naming an EndpointSlice's Service.
pub const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// An EndpointSlice from the API's JSON (one of no Service: `service`
/// empty; unparsable addresses and ports left out).
pub fn endpoint_slice(obj: &serde_json::Value) -> Result<EndpointSlice, ObjectError> {
    let m = meta(obj)?;
    if m.name.is_empty() || m.namespace.is_empty() {
        return Err(ObjectError::Unnamed("EndpointSlice"));
    }
    let raw = RawSlice::deserialize(obj).map_err(shape("EndpointSlice"))?;
    let endpoints = raw
        .endpoints
        .iter()
        .map(|e| {
            let ready = e.conditions.ready.unwrap_or(true);
            Endpoint {
                ips: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                ready,
                serving: e.conditions.serving.unwrap_or(ready),
            }
        })
        .collect();
    let ports = raw.ports.iter().flatten().filter_map(RawServicePort::read).collect();
    Ok(EndpointSlice {
        namespace: m.namespace,
        service: m.labels.get(SERVICE_NAME).cloned().unwrap_or_default(),
        endpoints,
        ports,
    })
}
