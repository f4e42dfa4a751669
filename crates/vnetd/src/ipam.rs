//! Cluster-wide address allocation (`ipam add|del` on the control
//! endpoint), done by the cluster session with its etcd client and under
//! its lease ([`vnet_cluster::ipam`] has the layout and the choice).
//!
//! - `add`: the owner's address if it holds one in the pool already (a
//!   retried `ADD`); else an address no host holds, put under this host's
//!   own prefix (`/vnet/NET/ipam/HOST/`, the only one its etcd role may
//!   write); then every pool's keys for that address are read again, and if
//!   another host's key for it was created first
//!   ([`vnet_cluster::ipam::winner`]) this host gives its key up and tries
//!   the next (a lost race, logged), so two hosts never hold one address.
//! - `del`: what the owner holds on this host goes, each only while it
//!   still holds this host's value.
//! - [`keep`]: at the start of a session, this host's allocations are put
//!   under the session's lease (unless another host took the address
//!   meanwhile, which is logged): a host that dies loses its addresses
//!   with its lease; one that comes back keeps them.

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use std::collections::HashSet;
use std::net::IpAddr;
use tokio::sync::{mpsc, oneshot};
use vnet_cluster::ipam::{host_prefix, key, parse_key, pool_name, prefix, winner, Allocation, Pool};
use vnet_control::IpamOp;
use vnet_wire::MacAddr;

/// One request, and where its answer goes.
#[derive(Debug)]
pub struct Request {
    pub op: Op,
    pub reply: oneshot::Sender<Result<Reply, IpamError>>,
}

/// What is asked: a control client's `ipam` line, or the nodes' gateway
/// addresses (`--kube-network-policy`'s translators of Services).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Control(IpamOp),
    Gateways,
}

impl Op {
    /// Whether it adds or releases a node gateway's address (this host's
    /// record names its gateway: read again after it).
    pub fn moves_gateway(&self) -> bool {
        match self {
            Op::Control(IpamOp::Add { owner, .. } | IpamOp::Del { owner }) => is_gateway(owner),
            Op::Gateways => false,
        }
    }
}

/// A live host's gateway as its record names it (checked and, in a
/// signed network, signed by its claim key: [`vnet_cluster::Member::gateways`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub host: String,
    pub addr: IpAddr,
    pub mac: MacAddr,
    /// Whether the member view's owner of `mac` is `host` (the gateway's
    /// MAC held by its host: [`vnet_cluster::Member::owner`]).
    pub mac_held: bool,
}

impl From<IpamOp> for Op {
    fn from(op: IpamOp) -> Op {
        Op::Control(op)
    }
}

/// What a request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `add`: the owner's address, with the pool's prefix length.
    Allocated { addr: IpAddr, prefix_len: u8 },
    /// `del`: how many addresses the owner held here and released.
    Released(usize),
    /// The translators: each live host's signed gateway address that the
    /// IPAM confirms ([`translators`]).
    Gateways(Vec<IpAddr>),
}

impl Reply {
    /// The reply's body on the control endpoint (`ADDR/LEN`, or
    /// `released N`), one line.
    pub fn body(&self) -> String {
        match self {
            Reply::Allocated { addr, prefix_len } => format!("{addr}/{prefix_len}\n"),
            Reply::Released(n) => format!("released {n}\n"),
            Reply::Gateways(a) => a.iter().map(|a| format!("{a}\n")).collect(),
        }
    }
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    #[error(transparent)]
    Pool(#[from] vnet_cluster::ipam::PoolError),
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("no address left in {subnet}/{len} from {first} to {last} ({taken} allocated)")]
    Full { subnet: IpAddr, len: u8, first: IpAddr, last: IpAddr, taken: usize },
    #[error("no address taken after {0} tries (others allocating at once)")]
    Contended(usize),
}

pub type Sender = mpsc::Sender<Request>;
pub type Receiver = mpsc::Receiver<Request>;

/// The queue between the control endpoint and the cluster session.
pub fn channel() -> (Sender, Receiver) {
    mpsc::channel(64)
}

/// How many addresses a request tries before it gives up (each lost race
/// costs one).
const TRIES: usize = 32;

/// Serves one request against etcd.
/// `signed`: the live hosts' gateways as their records name them (read
/// for [`Op::Gateways`] only).
pub(crate) async fn serve(
    c: &mut Client,
    (network, host, lease): (&str, &str, i64),
    op: &Op,
    signed: &[Signed],
    races: &mut u64,
) -> Result<Reply, IpamError> {
    match op {
        Op::Gateways => gateways(c, network, signed).await.map(Reply::Gateways),
        Op::Control(IpamOp::Add { subnet, owner, range }) => {
            let pool = Pool::new(subnet, *range)?;
            let addr = add(c, network, (host, lease), &pool, owner, races).await?;
            Ok(Reply::Allocated { addr, prefix_len: pool.len })
        }
        Op::Control(IpamOp::Del { owner }) => del(c, network, host, owner).await.map(Reply::Released),
    }
}

/// Whether `owner` is a node's gateway's (vnet-cni's `isDefaultGateway`:
/// `CNI-NETWORK/node-gateway-MAC/gw`). Owners are written by the hosts'
/// vnet-cni: a pod's is `CNI-NETWORK/CONTAINER-ID/IFNAME`, both chosen by
/// the runtime, not by a pod's author.
pub fn is_gateway(owner: &str) -> bool {
    let mut parts = owner.split('/');
    matches!(
        (parts.next(), parts.next(), parts.next(), parts.next()),
        (Some(_), Some(id), Some("gw"), None) if id.starts_with("node-gateway-")
    )
}

/// The MAC a gateway owner names (`CNI-NETWORK/node-gateway-HEX/gw`).
pub fn gateway_mac(owner: &str) -> Option<MacAddr> {
    if !is_gateway(owner) {
        return None;
    }
    let hex = owner.split('/').nth(1)?.strip_prefix("node-gateway-")?;
    if hex.len() != 12 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut m = [0u8; 6];
    for (i, b) in m.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(MacAddr(m))
}

/// Whether `addr` is inside the subnet a pool's name says (`10.244.0.0_16`).
fn in_pool(pool: &str, addr: IpAddr) -> bool {
    let Some((net, len)) = pool.split_once('_') else { return false };
    match (net.parse::<IpAddr>(), len.parse::<u8>()) {
        (Ok(net), Ok(len)) => net.is_ipv4() == addr.is_ipv4() && vnet_core::policy::in_prefix(addr, net, len),
        _ => false,
    }
}

/// How many bits a gateway's pool leaves to its hosts at least: a pool
/// of 16 addresses or more (a /28 in IPv4, a /124 in IPv6).
const GATEWAY_POOL_HOST_BITS: u32 = 4;

/// Whether `pool` may hold a node gateway at `addr`: a pool vnetd itself
/// would name (`SUBNET_LEN`, the subnet's first address, the prefix
/// lengths [`Pool::new`] takes) of at least 16 addresses, containing
/// `addr`. vnetd is not told the network's pools (each `ipam add` names
/// its own); this keeps out a pool made up to hold one address alone
/// (`10.244.0.5_32`).
fn gateway_pool(pool: &str, addr: IpAddr) -> bool {
    let Some((net, len)) = pool.split_once('_') else { return false };
    let Ok(p) = Pool::new(&format!("{net}/{len}"), None) else { return false };
    let width = if addr.is_ipv4() { 32 } else { 128 };
    pool_name(&p) == pool && u32::from(p.len) + GATEWAY_POOL_HOST_BITS <= width && in_pool(pool, addr)
}

/// One allocation key as listed: its host, pool, address, etcd
/// `create_revision`, and its value if it is one.
pub struct Listed<'a> {
    pub host: &'a str,
    pub pool: &'a str,
    pub addr: IpAddr,
    pub created: i64,
    pub value: Option<Allocation>,
}

/// The translators: of `signed` (at most one per live host), each address
/// whose host holds its MAC in the member view, and whose winning
/// allocation among every pool's keys for it ([`winner`]: the first
/// created, whatever its pool) is its host's, held by its host's gateway
/// owner naming the same MAC, in a [`gateway_pool`] that is, where the
/// host holds pods' addresses (`pod_pools`: host and pool of each
/// allocation that is no gateway's), one of theirs. A value in the IPAM
/// alone makes nothing a translator; a record's gateway at an address
/// its host does not hold, or under another owner, neither. Sorted.
pub fn translators(
    signed: &[Signed],
    listed: &[Listed<'_>],
    pod_pools: &HashSet<(&str, &str)>,
) -> Vec<IpAddr> {
    let pod_pool = |host: &str, pool: &str| {
        !pod_pools.iter().any(|(h, _)| *h == host) || pod_pools.contains(&(host, pool))
    };
    let mut out: Vec<IpAddr> = signed
        .iter()
        .filter(|g| {
            let at = listed.iter().filter(|l| l.addr == g.addr);
            let Some(won) = at.min_by(|a, b| (a.created, a.host).cmp(&(b.created, b.host))) else {
                return false;
            };
            let held =
                won.value.as_ref().is_some_and(|v| v.host == g.host && gateway_mac(&v.owner) == Some(g.mac));
            let pool = gateway_pool(won.pool, g.addr) && pod_pool(won.host, won.pool);
            g.mac_held && won.host == g.host && held && pool
        })
        .map(|g| g.addr)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The translators ([`translators`]) as etcd holds the IPAM now.
async fn gateways(c: &mut Client, network: &str, signed: &[Signed]) -> Result<Vec<IpAddr>, IpamError> {
    if signed.is_empty() {
        return Ok(Vec::new());
    }
    let (listed, _) = crate::listing::list(c, &prefix(network)).await?;
    let wanted: HashSet<IpAddr> = signed.iter().map(|g| g.addr).collect();
    let mut pod_pools = HashSet::new();
    let mut keys = Vec::new();
    for kv in &listed {
        let Some((host, pool, addr)) = kv.key_str().ok().and_then(|k| parse_key(network, k)) else {
            continue;
        };
        let value = Allocation::from_json(kv.value());
        if value.as_ref().is_some_and(|v| !is_gateway(&v.owner)) {
            pod_pools.insert((host, pool));
        }
        if wanted.contains(&addr) {
            keys.push(Listed { host, pool, addr, created: kv.create_revision(), value });
        }
    }
    Ok(translators(signed, &keys, &pod_pools))
}

/// This host's node gateway by its own allocations: the lowest address
/// held under a gateway owner, inside its pool ([`gateway_pool`]), with the MAC the owner
/// names (its record names it, [`vnet_cluster::layout::Gateway`]).
pub(crate) async fn own_gateway(
    c: &mut Client,
    network: &str,
    host: &str,
) -> Result<Option<(IpAddr, MacAddr)>, etcd_client::Error> {
    let (listed, _) = crate::listing::list(c, &host_prefix(network, host)).await?;
    let mut held: Vec<(IpAddr, MacAddr)> = listed
        .iter()
        .filter_map(|kv| {
            let (h, pool, a) = parse_key(network, kv.key_str().ok()?)?;
            let v = Allocation::from_json(kv.value()).filter(|v| v.host == host && h == host)?;
            gateway_pool(pool, a).then_some((a, gateway_mac(&v.owner)?))
        })
        .collect();
    held.sort_unstable();
    if held.len() > 1 {
        tracing::warn!(
            gateways = held.len(),
            "ipam: this host holds several node gateway addresses; its record names the lowest"
        );
    }
    Ok(held.into_iter().next())
}

/// `races` counts the addresses another host took at once (each given up).
async fn add(
    c: &mut Client,
    network: &str,
    (host, lease): (&str, i64),
    pool: &Pool,
    owner: &str,
    races: &mut u64,
) -> Result<IpAddr, IpamError> {
    let name = pool_name(pool);
    let (listed, _) = crate::listing::list(c, &prefix(network)).await?;
    let mut taken = HashSet::new();
    for kv in &listed {
        let Some((h, p, a)) = kv.key_str().ok().and_then(|k| parse_key(network, k)) else { continue };
        // An address held in any pool (another pool's key, even one made
        // up) is taken: the holder is the first key whatever its pool.
        if p == name && h == host && Allocation::from_json(kv.value()).is_some_and(|v| v.owner == owner) {
            return Ok(a);
        }
        taken.insert(a);
    }
    let value = Allocation { host: host.to_string(), owner: owner.to_string() }.to_json();
    let mut tried = 0;
    loop {
        let cands = pool.candidates(owner, &taken, 4);
        if cands.is_empty() {
            let (subnet, len, first, last) = (pool.subnet, pool.len, pool.first, pool.last);
            return Err(IpamError::Full { subnet, len, first, last, taken: taken.len() });
        }
        for a in cands {
            if tried == TRIES {
                return Err(IpamError::Contended(TRIES));
            }
            tried += 1;
            taken.insert(a);
            let k = key(network, host, pool, a);
            let txn = Txn::new()
                .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(k.clone(), value.clone(), Some(PutOptions::new().with_lease(lease)))]);
            if !c.txn(txn).await?.succeeded() {
                continue;
            }
            let holder = holder(c, network, a).await?;
            if holder.as_deref() == Some(host) {
                return Ok(a);
            }
            tracing::info!(%a, holder = ?holder, "ipam: another host took this address at once; trying the next");
            *races += 1;
            let txn = Txn::new()
                .when([Compare::value(k.clone(), CompareOp::Equal, value.clone())])
                .and_then([TxnOp::delete(k, None)]);
            c.txn(txn).await?;
        }
    }
}

/// The host whose key for `addr`, in any pool, was created first.
async fn holder(c: &mut Client, network: &str, addr: IpAddr) -> Result<Option<String>, IpamError> {
    let (listed, _) = crate::listing::list(c, &prefix(network)).await?;
    let keys = listed.iter().filter_map(|kv| {
        let (h, _, a) = parse_key(network, kv.key_str().ok()?)?;
        (a == addr).then_some((h, kv.create_revision()))
    });
    Ok(winner(keys).map(str::to_string))
}

async fn del(c: &mut Client, network: &str, host: &str, owner: &str) -> Result<usize, IpamError> {
    let (listed, _) = crate::listing::list(c, &host_prefix(network, host)).await?;
    let mut n = 0;
    for kv in &listed {
        if Allocation::from_json(kv.value()).is_none_or(|v| v.owner != owner || v.host != host) {
            continue;
        }
        let txn = Txn::new()
            .when([Compare::value(kv.key(), CompareOp::Equal, kv.value())])
            .and_then([TxnOp::delete(kv.key(), None)]);
        if c.txn(txn).await?.succeeded() {
            n += 1;
        }
    }
    Ok(n)
}

/// Puts this host's allocations under `lease`; returns how many moved.
pub(crate) async fn keep(
    c: &mut Client,
    network: &str,
    host: &str,
    lease: i64,
) -> Result<usize, etcd_client::Error> {
    let (listed, _) = crate::listing::list(c, &host_prefix(network, host)).await?;
    let mut n = 0;
    for kv in &listed {
        if kv.lease() == lease || Allocation::from_json(kv.value()).is_none_or(|v| v.host != host) {
            continue;
        }
        let txn = Txn::new()
            .when([Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision())])
            .and_then([TxnOp::put(kv.key(), kv.value(), Some(PutOptions::new().with_lease(lease)))]);
        if c.txn(txn).await?.succeeded() {
            n += 1;
        } else {
            tracing::warn!(key = %String::from_utf8_lossy(kv.key()), "cluster: an address this host held was taken meanwhile");
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    /// Only vnet-cni's gateway owners are gateways: a pod's owner, even
    /// one whose container id begins alike, is not.
    #[test]
    fn only_a_node_gateways_owner_is_a_gateway() {
        assert!(super::is_gateway("vnet/node-gateway-5254000000aa/gw"));
        assert!(!super::is_gateway("vnet/3f2a9c/eth0"), "a pod's");
        assert!(!super::is_gateway("vnet/node-gateway-5254000000aa/eth0"), "not the gateway's interface");
        assert!(!super::is_gateway("vnet/node-gateway-5254000000aa/gw/x"));
        assert!(!super::is_gateway("vnet/gw"));
    }

    #[test]
    fn a_gateway_owner_names_its_mac() {
        let m = super::gateway_mac("vnet/node-gateway-5254000000aa/gw").unwrap();
        assert_eq!(m.to_string(), "52:54:00:00:00:aa");
        assert_eq!(super::gateway_mac("vnet/node-gateway-5254000000aa/eth0"), None);
        assert_eq!(super::gateway_mac("vnet/node-gateway-5254000000a/gw"), None, "11 digits");
        assert_eq!(super::gateway_mac("vnet/node-gateway-5254000000ag/gw"), None);
        assert_eq!(super::gateway_mac("vnet/node-gateway-+254000000aa/gw"), None);
    }

    /// Node 2's etcd credential writes, under its own prefix, a gateway
    /// allocation for an address it controls (10.244.0.66, its pod's, or
    /// any): without node 2's record naming it, signed, it is no
    /// translator. Node 2's record naming an address another host won, or
    /// held under a pod's owner, or under another MAC, or outside its pool,
    /// neither. The positive control: the same allocation with node 2's
    /// signed record naming it is a translator (as every gateway value
    /// was before, read from the IPAM alone), and so is node 1's.
    #[test]
    fn only_a_signed_gateway_the_ipam_confirms_is_a_translator() {
        use super::{translators, Allocation, Listed, Signed};
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let mac = |s: &str| s.parse::<vnet_wire::MacAddr>().unwrap();
        let alloc = |host: &'static str, pool: &'static str, addr: &str, created: i64, owner: &str| Listed {
            host,
            pool,
            addr: ip(addr),
            created,
            value: Some(Allocation { host: host.into(), owner: owner.into() }),
        };
        let pool = "10.244.0.0_16";
        let gw1 = "vnet/node-gateway-020000000001/gw";
        let gw2 = "vnet/node-gateway-020000000002/gw";
        let listed = [
            alloc("n1", pool, "10.244.0.1", 5, gw1),
            // Node 2's forgery: a gateway value for an address it controls.
            alloc("n2", pool, "10.244.0.66", 9, gw2),
            // Node 2's copy of node 1's address, created later: n1 wins.
            alloc("n2", pool, "10.244.0.1", 7, gw2),
            alloc("n2", pool, "10.244.0.70", 11, "vnet/3f2a9c/eth0"),
            alloc("n2", "10.88.0.0_24", "10.244.0.71", 12, gw2),
        ];
        let signed = |host: &str, addr: &str, m: &str| Signed {
            host: host.into(),
            addr: ip(addr),
            mac: mac(m),
            mac_held: true,
        };
        let translators = |s: &[Signed], l: &[Listed<'_>]| translators(s, l, &Default::default());
        let n1 = signed("n1", "10.244.0.1", "02:00:00:00:00:01");
        assert_eq!(translators(std::slice::from_ref(&n1), &listed), [ip("10.244.0.1")]);
        assert!(translators(&[], &listed).is_empty(), "the IPAM alone makes no translator");
        for (addr, m) in [
            ("10.244.0.1", "02:00:00:00:00:02"),  // node 1 won it
            ("10.244.0.70", "02:00:00:00:00:02"), // a pod's owner
            ("10.244.0.66", "02:00:00:00:00:09"), // another MAC than the owner's
            ("10.244.0.71", "02:00:00:00:00:02"), // outside its pool
        ] {
            let forged = [n1.clone(), signed("n2", addr, m)];
            assert_eq!(translators(&forged, &listed), [ip("10.244.0.1")], "n2 naming {addr} {m}");
        }
        // The control: node 2's record names its allocation, signed.
        let both = [n1, signed("n2", "10.244.0.66", "02:00:00:00:00:02")];
        assert_eq!(translators(&both, &listed), [ip("10.244.0.1"), ip("10.244.0.66")]);
    }

    /// The second review's attack: node X, alone in a pool it makes up
    /// (`10.244.0.5_32`), holds a pod's address 10.244.0.5 under a gateway
    /// owner, and its record names it, signed. Not a translator: the pool
    /// is no pool vnetd hands out from; in a real pool, the pod's key
    /// (created first, in whatever pool) wins; in a /28 that is not the
    /// pool X's pods are in, neither; nor where the member view does not
    /// give X the MAC. The controls: the same gateway in X's pods' pool,
    /// its key first, with X holding the MAC, is one, and a /28 pool of a
    /// host with no pod yet is taken.
    #[test]
    fn a_gateway_in_a_made_up_pool_or_over_a_pods_key_is_no_translator() {
        use super::{translators, Allocation, Listed, Signed};
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let gw = "vnet/node-gateway-0200000000aa/gw";
        let alloc = |host: &'static str, pool: &'static str, created: i64, owner: &str| Listed {
            host,
            pool,
            addr: ip("10.244.0.5"),
            created,
            value: Some(Allocation { host: host.into(), owner: owner.into() }),
        };
        let x = |mac_held| Signed {
            host: "x".into(),
            addr: ip("10.244.0.5"),
            mac: "02:00:00:00:00:aa".parse().unwrap(),
            mac_held,
        };
        let pods: std::collections::HashSet<(&str, &str)> =
            [("x", "10.244.0.0_16"), ("n1", "10.244.0.0_16")].into();
        let none = Default::default();
        // Alone in a pool of one address: no translator, even with no pod
        // key for the address at all.
        let alone = [alloc("x", "10.244.0.5_32", 9, gw)];
        assert!(translators(&[x(true)], &alone, &none).is_empty(), "a /32 pool");
        for bad in ["10.244.0.4_30", "10.244.0.1_28", "10.244.0.0_x", "10.244.0.0_33", "::_120"] {
            let l = [alloc("x", bad, 9, gw)];
            assert!(translators(&[x(true)], &l, &none).is_empty(), "pool {bad}");
        }
        // A pod's key for the address, another host's or X's own, created
        // first in the real pool: the made-up pool's gateway key loses.
        for pod_host in ["n1", "x"] {
            let l =
                [alloc(pod_host, "10.244.0.0_16", 5, "vnet/3f2a9c/eth0"), alloc("x", "10.244.0.0_28", 9, gw)];
            assert!(translators(&[x(true)], &l, &pods).is_empty(), "a pod of {pod_host} holds it");
        }
        // A /28 alone, X's pods being in the /16.
        let l = [alloc("x", "10.244.0.0_28", 9, gw)];
        assert!(translators(&[x(true)], &l, &pods).is_empty(), "not X's pods' pool");
        // In X's pods' pool, first, but the MAC not X's in the member view.
        let l = [alloc("x", "10.244.0.0_16", 9, gw)];
        assert!(translators(&[x(false)], &l, &pods).is_empty(), "the MAC not held by X");
        // The controls.
        assert_eq!(translators(&[x(true)], &l, &pods), [ip("10.244.0.5")], "X's gateway");
        let l = [alloc("x", "10.244.0.0_28", 9, gw)];
        assert_eq!(translators(&[x(true)], &l, &none), [ip("10.244.0.5")], "a /28, no pod yet");
        let l = [alloc("x", "10.244.0.0_16", 5, gw), alloc("n1", "10.244.0.0_16", 7, "vnet/3f2a9c/eth0")];
        assert_eq!(translators(&[x(true)], &l, &pods), [ip("10.244.0.5")], "X's key first");
    }
}
