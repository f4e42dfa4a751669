//! Cluster-wide address allocation (`ipam add|del` on the control
//! endpoint), done by the cluster session with its etcd client and under
//! its lease ([`vnet_cluster::ipam`] has the layout and the choice).
//!
//! - `add`: the owner's address if it holds one in the pool already (a
//!   retried `ADD`); else an address no host holds, put under this host's
//!   own prefix (`/vnet/NET/ipam/HOST/`, the only one its etcd role may
//!   write); then the pool's keys for that address are read again, and if
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
    /// Every host's node gateway address ([`is_gateway`]).
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
pub(crate) async fn serve(
    c: &mut Client,
    network: &str,
    host: &str,
    lease: i64,
    op: &Op,
    races: &mut u64,
) -> Result<Reply, IpamError> {
    match op {
        Op::Gateways => gateways(c, network).await.map(Reply::Gateways),
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

/// Every host's node gateway address in the network's pools, sorted.
async fn gateways(c: &mut Client, network: &str) -> Result<Vec<IpAddr>, IpamError> {
    let (listed, _) = crate::listing::list(c, &prefix(network)).await?;
    let mut out: Vec<IpAddr> = listed
        .iter()
        .filter_map(|kv| {
            let (_, _, a) = parse_key(network, kv.key_str().ok()?)?;
            Allocation::from_json(kv.value()).filter(|v| is_gateway(&v.owner)).map(|_| a)
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
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
        if p != name {
            continue;
        }
        if h == host && Allocation::from_json(kv.value()).is_some_and(|v| v.owner == owner) {
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
            let holder = holder(c, network, &name, a).await?;
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

/// The host whose key for `addr` in pool `name` was created first.
async fn holder(
    c: &mut Client,
    network: &str,
    name: &str,
    addr: IpAddr,
) -> Result<Option<String>, IpamError> {
    let (listed, _) = crate::listing::list(c, &prefix(network)).await?;
    let keys = listed.iter().filter_map(|kv| {
        let (h, p, a) = parse_key(network, kv.key_str().ok()?)?;
        (p == name && a == addr).then_some((h, kv.create_revision()))
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
}
