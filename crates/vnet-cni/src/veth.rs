//! The container's veth pair, through rtnetlink: made in the plugin's
//! (the host's) network namespace, its container end moved into
//! `CNI_NETNS`, renamed to `CNI_IFNAME`, given its addresses and routes
//! there. Work inside the container's namespace runs on a thread of its
//! own that enters it (`setns` changes only the calling thread), so the
//! plugin's own thread never leaves the host's namespace.

use crate::spec::{Code, Error, IpConfig, Result, RouteConfig};
use futures_util::TryStreamExt;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};
use std::fs::File;
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

fn io(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> Error {
    let what = what.into();
    move |e| Error::with(Code::Io, what, e)
}

/// Runs `f` with a netlink handle in the current thread's namespace.
fn block<T, F, Fut>(f: F) -> Result<T>
where
    F: FnOnce(Handle) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(|e| Error::with(Code::Io, "a runtime for netlink", e))?;
    rt.block_on(async move {
        let (conn, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::with(Code::Io, "netlink", e))?;
        tokio::spawn(conn);
        f(handle).await
    })
}

/// Runs `f` with a netlink handle inside the namespace `ns`.
fn in_netns<T: Send + 'static, F, Fut>(ns: &File, f: F) -> Result<T>
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T>>,
{
    on_thread_in(ns, move || block(f))
}

/// Runs `f` on a thread of its own that entered the namespace `ns` (what
/// it opens under `/proc/sys/net` is that namespace's: the thread's).
fn on_thread_in<T: Send + 'static>(ns: &File, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let ns = ns.try_clone().map_err(|e| Error::with(Code::Io, "the network namespace", e))?;
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| Error::with(Code::Io, "entering the container's network namespace", e))?;
        f()
    })
    .join()
    .unwrap_or_else(|_| Err(Error::new(Code::Io, "the namespace thread failed")))
}

/// Turns IPv6 off in the namespace `ns` (a pod given no IPv6 address):
/// `net.ipv6.conf.{all,default,IFNAME}.disable_ipv6` 1, as `sysctl` would
/// there, written by a thread inside it. Its interfaces lose every IPv6
/// address, the link-local one (from its MAC) and `::1` included, and
/// make none later: a pod with IPv6 on has an `fe80::` address the
/// pods' NetworkPolicy entries (`status.podIPs`) never name. Where the
/// kernel has no IPv6, there is nothing to turn off.
pub fn no_ipv6(ns: &File, ifname: &str) -> Result<()> {
    let ifname = ifname.to_string();
    on_thread_in(ns, move || {
        // (`CNI_IFNAME` has no `/` and is not `.` or `..`: one file.)
        for (i, conf) in ["all", "default", ifname.as_str()].into_iter().enumerate() {
            let path = std::path::Path::new("/proc/sys/net/ipv6/conf").join(conf).join("disable_ipv6");
            match std::fs::write(&path, "1") {
                // No `all`: a kernel without IPv6.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && i == 0 => return Ok(()),
                Err(e) => return Err(Error::with(Code::Io, format!("writing 1 to {}", path.display()), e)),
                Ok(()) => {}
            }
        }
        Ok(())
    })
}

async fn by_name(h: &Handle, name: &str) -> Result<Option<LinkMessage>> {
    let mut links = h.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(l) => Ok(l),
        // ENODEV: no such link.
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(io(format!("looking up {name}"))(e)),
    }
}

fn mac_of(l: &LinkMessage) -> String {
    l.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(b) => {
                Some(b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":"))
            }
            _ => None,
        })
        .unwrap_or_default()
}

/// Makes the pair: `host` in this namespace, up; its peer (made as `tmp`)
/// moved into `ns` as `ifname`, up. Returns the container end's MAC.
pub fn make(host: &str, tmp: &str, ns: &File, ifname: &str, mtu: Option<u32>) -> Result<String> {
    let (host_s, tmp_s, nsfd) = (host.to_string(), tmp.to_string(), ns.as_raw_fd());
    block(move |h| async move {
        let mut b = LinkVeth::new(&host_s, &tmp_s);
        if let Some(m) = mtu {
            b = b.mtu(m);
        }
        h.link().add(b.build()).execute().await.map_err(io(format!("making the veth pair {host_s}")))?;
        let peer =
            by_name(&h, &tmp_s).await?.ok_or_else(|| Error::new(Code::Io, "the new veth peer is gone"))?;
        let mut set = LinkUnspec::new_with_index(peer.header.index).setns_by_fd(nsfd);
        if let Some(m) = mtu {
            set = set.mtu(m);
        }
        h.link().set(set.build()).execute().await.map_err(io("moving the veth peer into the container"))?;
        let me = by_name(&h, &host_s).await?.ok_or_else(|| Error::new(Code::Io, "the new veth is gone"))?;
        let up = LinkUnspec::new_with_index(me.header.index).up().build();
        h.link().set(up).execute().await.map_err(io(format!("setting {host_s} up")))
    })?;
    quiet(host)?;
    let (tmp, ifname) = (tmp.to_string(), ifname.to_string());
    in_netns(ns, move |h| async move {
        let l =
            by_name(&h, &tmp).await?.ok_or_else(|| Error::new(Code::Io, "the veth peer did not arrive"))?;
        let set = LinkUnspec::new_with_index(l.header.index).name(ifname.clone()).up().build();
        h.link()
            .set(set)
            .execute()
            .await
            .map_err(io(format!("naming the container's interface {ifname}")))?;
        Ok(mac_of(&l))
    })
}

/// Keeps the node's own IP stack off `name`, an end vnetd attaches (a
/// port of its switch, not an interface of the node): the node answers no
/// ARP request arriving on it (`arp_ignore` 8; by default Linux answers
/// for any of its addresses on any interface, so a pod asking for its
/// gateway got this end's MAC too, and on the user path, where vnetd
/// reads the frames beside the node's stack, the node then took the pod's
/// packets straight, never judged by vnetd), and no IPv6 (neighbour
/// discovery alike). Where IPv6 is off the node's, its file is absent.
pub fn quiet(name: &str) -> Result<()> {
    let arp = format!("/proc/sys/net/ipv4/conf/{name}/arp_ignore");
    std::fs::write(&arp, "8").map_err(|e| Error::with(Code::Io, format!("writing 8 to {arp}"), e))?;
    let v6 = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    match std::fs::write(&v6, "1") {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::with(Code::Io, format!("writing 1 to {v6}"), e))
        }
        _ => Ok(()),
    }
}

/// Gives `ifname` in `ns` the addresses and routes of an IPAM result.
pub fn configure(ns: &File, ifname: &str, ips: &[IpConfig], routes: &[RouteConfig]) -> Result<()> {
    let addrs = ips.iter().map(IpConfig::cidr).collect::<Result<Vec<_>>>()?;
    let mut rs = Vec::new();
    for r in routes {
        let bad = || Error::new(Code::Decode, format!("IPAM route `{}`: expected ADDR/PREFIX", r.dst));
        let (d, p) = r.dst.split_once('/').ok_or_else(bad)?;
        let d: IpAddr = d.parse().map_err(|_| bad())?;
        let p: u8 = p.parse().map_err(|_| bad())?;
        let gw: Option<IpAddr> = match &r.gw {
            Some(g) => Some(g.parse().map_err(|_| Error::new(Code::Decode, format!("IPAM gateway `{g}`")))?),
            None => None,
        };
        rs.push((d, p, gw));
    }
    let ifname = ifname.to_string();
    in_netns(ns, move |h| async move {
        let l =
            by_name(&h, &ifname).await?.ok_or_else(|| Error::new(Code::Io, format!("{ifname} is gone")))?;
        let index = l.header.index;
        for (a, p) in addrs {
            h.address().add(index, a, p).execute().await.map_err(io(format!("adding {a}/{p}")))?;
        }
        for (d, p, gw) in rs {
            let msg = match (d, gw) {
                (IpAddr::V4(d), gw) => {
                    let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                        .destination_prefix(d, p)
                        .output_interface(index);
                    if let Some(IpAddr::V4(g)) = gw {
                        b = b.gateway(g);
                    }
                    b.build()
                }
                (IpAddr::V6(d), gw) => {
                    let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                        .destination_prefix(d, p)
                        .output_interface(index);
                    if let Some(IpAddr::V6(g)) = gw {
                        b = b.gateway(g);
                    }
                    b.build()
                }
            };
            h.route().add(msg).execute().await.map_err(io(format!("adding the route to {d}/{p}")))?;
        }
        Ok(())
    })
}

/// Deletes link `name` of this namespace (a veth's peer goes with it);
/// `false` if there was none.
pub fn delete(name: &str) -> Result<bool> {
    let name = name.to_string();
    block(move |h| async move {
        let Some(l) = by_name(&h, &name).await? else { return Ok(false) };
        match h.link().del(l.header.index).execute().await {
            Ok(()) => Ok(true),
            Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(false),
            Err(e) => Err(io(format!("deleting {name}"))(e)),
        }
    })
}

/// Whether link `name` exists in this namespace.
pub fn exists(name: &str) -> Result<bool> {
    let name = name.to_string();
    block(move |h| async move { Ok(by_name(&h, &name).await?.is_some()) })
}

/// `ifname` in `ns`: its MAC and its addresses as `ADDR/PREFIX`; `None`
/// if it is not there.
pub fn inspect(ns: &File, ifname: &str) -> Result<Option<(String, Vec<String>)>> {
    let ifname = ifname.to_string();
    in_netns(ns, move |h| async move { look(&h, &ifname).await })
}

/// [`inspect`] in this namespace.
pub fn inspect_here(ifname: &str) -> Result<Option<(String, Vec<String>)>> {
    let ifname = ifname.to_string();
    block(move |h| async move { look(&h, &ifname).await })
}

async fn look(h: &Handle, ifname: &str) -> Result<Option<(String, Vec<String>)>> {
    let Some(l) = by_name(h, ifname).await? else { return Ok(None) };
    let mut addrs = Vec::new();
    let mut it = h.address().get().set_link_index_filter(l.header.index).execute();
    while let Some(a) = it.try_next().await.map_err(io("listing addresses"))? {
        for attr in &a.attributes {
            if let rtnetlink::packet_route::address::AddressAttribute::Address(ip) = attr {
                addrs.push(format!("{ip}/{}", a.header.prefix_len));
            }
        }
    }
    Ok(Some((mac_of(&l), addrs)))
}

/// Makes a veth pair whose two ends stay in this namespace (the node's
/// gateway: `attached` for vnetd, `node` for the node's address), both up;
/// returns `node`'s MAC.
pub fn make_here(attached: &str, node: &str, mtu: Option<u32>) -> Result<String> {
    let (a, n) = (attached.to_string(), node.to_string());
    block(move |h| async move {
        let mut b = LinkVeth::new(&a, &n);
        if let Some(m) = mtu {
            b = b.mtu(m);
        }
        h.link().add(b.build()).execute().await.map_err(io(format!("making the veth pair {a}")))?;
        let mut mac = String::new();
        for name in [&a, &n] {
            let l =
                by_name(&h, name).await?.ok_or_else(|| Error::new(Code::Io, format!("{name} is gone")))?;
            // The builder's MTU is the first end's: each end is given it.
            let mut up = LinkUnspec::new_with_index(l.header.index).up();
            if let Some(m) = mtu {
                up = up.mtu(m);
            }
            h.link().set(up.build()).execute().await.map_err(io(format!("setting {name} up")))?;
            mac = mac_of(&l);
        }
        Ok(mac)
    })
    .and_then(|mac| quiet(attached).map(|()| mac))
}

/// Gives link `name` of this namespace the address `ip/len` (the kernel
/// adds the route to its subnet through it).
pub fn add_address_here(name: &str, ip: IpAddr, len: u8) -> Result<()> {
    let name = name.to_string();
    block(move |h| async move {
        let l = by_name(&h, &name).await?.ok_or_else(|| Error::new(Code::Io, format!("{name} is gone")))?;
        h.address().add(l.header.index, ip, len).execute().await.map_err(io(format!("adding {ip}/{len}")))
    })
}

/// The names of one attachment: vnetd's interface and the veth's host end
/// (one name), and the peer's name until it is in the container.
pub fn names(network: &str, id: &str, ifname: &str) -> (String, String) {
    let d = ring::digest::digest(&ring::digest::SHA256, format!("{network}\0{id}\0{ifname}").as_bytes());
    let hex: String = d.as_ref()[..5].iter().map(|b| format!("{b:02x}")).collect();
    (format!("vc{hex}"), format!("vp{hex}"))
}
