//! What a lab is made of: the spec, the link and overlay kinds, and the
//! addresses every host and VM gets.

use std::net::IpAddr;
use std::net::Ipv4Addr;
use std::net::Ipv6Addr;
use std::net::SocketAddr;
use vnet_control::Security;
use vnet_control::Transport;

/// Which link format the lab's vnetds use: the control language's.
pub use vnet_control::LinkFormat as Format;

/// What to build.
#[derive(Debug, Clone)]
pub struct Spec {
    pub hosts: usize,
    pub vms_per_host: usize,
    pub format: Format,
    /// MTU of the underlay veths.
    pub underlay_mtu: u32,
    /// MTU of the VMs' interfaces.
    pub vm_mtu: u32,
    /// Hosts whose links and routes are written only as Palacios lines.
    pub palacios_hosts: Vec<usize>,
    /// Hosts whose VMs are containers on a veth pair (vnetd attaches to the
    /// host end as a `netdev`) instead of owning a TAP.
    pub veth_hosts: Vec<usize>,
    /// What joins the VMs: vnet, the kernel's VXLAN, or nothing (hosts only).
    pub overlay: Overlay,
    /// Shape each host's underlay egress to this rate (`tc tbf`), e.g. "10gbit".
    pub shape: Option<String>,
    /// TCP congestion control set in every namespace, e.g. "cubic".
    pub congestion_control: Option<String>,
    /// vnetd dispatch mode for interfaces and the link socket
    /// (`notify`, `poll`, `adaptive`; vnetd's default when `None`).
    pub dispatch: Option<String>,
    /// vnetd `datapath` for every interface (`user`, `kernel`, `auto`;
    /// `None` is `auto`: vnetd chooses). `kernel` makes every VM a container
    /// on a veth (the kernel path serves netdevs); `user` keeps the spec's
    /// TAPs (which vnetd reads) and puts its veths (`veth_hosts`) and QEMU
    /// TAPs on packet sockets. Default: the `VNET_LAB_DATAPATH` environment
    /// variable, so the whole integration suite runs on one path a pass
    /// ([`Spec::datapath_of`] is the path an interface must then be on).
    pub datapath: Option<String>,
    /// Hosts whose first VM is a QEMU guest (TCG, Debian's kernel and a
    /// busybox initramfs from `lab/build-guest.sh`) on a TAP in the host
    /// namespace, which vnetd attaches to as a `netdev` (or, with
    /// `qemu_vhost`, on a vhost-user socket vnetd serves).
    pub qemu_hosts: Vec<usize>,
    /// QEMU guests get a vhost-user NIC (`interface ... vhost-user`)
    /// instead of a TAP.
    pub qemu_vhost: bool,
    /// Queue pairs of a vhost-user guest's NIC (and its vCPUs, so that the
    /// guest uses them all).
    pub qemu_queues: u32,
    /// Queues of each VM's TAP on vnetd's user path (`queues N`: a worker
    /// per queue, the VM's flows spread over them by its kernel).
    pub tap_queues: u32,
    /// More kernel command line for host h's guest (`vnet_peer=IP`,
    /// `vnet_ping=1`, `vnet_send_mb=N`: see `lab/build-guest.sh`).
    pub guest_args: Vec<(usize, String)>,
    /// More command-line arguments for every vnetd (e.g. `--worker-cpus 1`).
    pub vnetd_args: Vec<String>,
    /// The vnetd binary to run (default: the one `cargo build` made).
    pub vnetd: Option<std::path::PathBuf>,
    /// Run every vnetd with only these capabilities in its bounding set
    /// (e.g. `CAP_NET_ADMIN`), and no new privileges, as the unit does.
    pub vnetd_caps: Option<Vec<String>>,
    /// In a vnet lab, hosts that are Linux kernel VTEPs instead of vnetds:
    /// a bridge with a `vxlan` device (VNI [`VNI`], port 4789, no learning,
    /// static FDB entries, head-end replication to every other host) and
    /// the VMs on veths in the bridge. vnetd hosts reach them over `vxlan`
    /// links.
    pub vteps: Vec<usize>,
    /// The kind of link between vnetd hosts.
    pub links: Links,
    /// A host whose "physical LAN" is a bridge (in a namespace of its own)
    /// with a plain machine on it, no vnetd ([`Lab::lan`], [`LAN_MAC`],
    /// [`LAN_IP`]); the host reaches it with a `direct` link on `dl0`, and
    /// the other hosts' routes send the machine's MAC to that host.
    pub lan_host: Option<usize>,
    /// Cluster mode: a real etcd (Debian's `etcd-server`) in the switch
    /// namespace, on [`ETCD_IP`], and every vnetd started with `--cluster`;
    /// the configs hold interfaces only, no link or route lines. The hosts
    /// sit on a bridge even when there are two.
    pub cluster: Option<Cluster>,
    /// An IPv6-only underlay: hosts' underlay addresses in `fd00:77::/64`
    /// ([`underlay_ip`]), no IPv4 address on it; a cluster's etcd on
    /// `fd00:77::fa`; kernel VTEPs accept zero UDP checksums
    /// (`udp6zerocsumrx`, as vnet's kernel path sends them).
    pub ipv6_underlay: bool,
    /// Every VM's interface declares the VM's address (`addresses IP`):
    /// the IP source guard on from the start.
    pub addresses: bool,
    /// Hosts whose vnetd listens on every address, IPv4 and IPv6
    /// (`listen udp [::]:9000`, one dual-stack socket) instead of its
    /// underlay address: a host whose address may change (roaming), or
    /// with links of both families.
    pub listen_any: Vec<usize>,
    /// Two sites: each of the two hosts on its own underlay segment
    /// (10.77.H.1/24) behind a router namespace (10.77.H.254), the two
    /// routers joined by a link of this MTU (the hosts' segments keep
    /// `underlay_mtu`); the routers send no ICMP (their ICMP output is
    /// dropped and counted, `iptables -L OUTPUT`), as on a path that
    /// filters it.
    pub site_mtu: Option<u32>,
    /// Hosts behind NAT (three or four hosts): host 0 behind a cone-like
    /// NAT (its router masquerades and forwards UDP port 9000 to it:
    /// endpoint-independent mapping and filtering for vnetd's port, as a
    /// static or UPnP forward gives), hosts 1 and 3 each behind a symmetric
    /// NAT (masquerade with `--random-fully`: a new random port per
    /// destination), host 2 public and a relay (`vnetd --relay`). The
    /// routers' outsides and host 2 share an "internet" segment,
    /// 203.0.113.0/24 ([`public_ip`]); every link is `nat`, to the peer's
    /// public address, and a link between two hosts behind NATs names host
    /// 2 as its `relay`.
    pub nat: bool,
    /// Secured links' `cipher` (`auto` says nothing on the line).
    pub cipher: vnet_control::Cipher,
    /// No vnetd is started by [`crate::Lab::up`] (nor written a config it
    /// uses): the test brings its own, as a user would (the quickstart).
    pub no_vnetd: bool,
}

/// A cluster-mode lab's settings.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// Every vnetd's lease (`--cluster-ttl`), in seconds.
    pub ttl_s: u64,
    /// Hosts whose vnetd is not started by [`Lab::up`] (start them with
    /// [`Lab::start_vnetd`]: they join a running network).
    pub late: Vec<usize>,
    /// An open cluster: etcd over plain http without users, hosts without
    /// keys, records unsigned. By default the lab's cluster is secured as
    /// `docs/CLUSTER.md` says to run one: etcd over TLS with client
    /// certificates and a user per host (a role on the network's prefix
    /// only), a network key that signs each host's certificate, and every
    /// link encrypted.
    pub open: bool,
    /// The settings as a `cluster` line in each host's config file instead
    /// of vnetd's flags.
    pub in_config: bool,
    /// The etcd's members (0 or 1: one), every vnetd given all of them.
    pub members: usize,
}

impl Cluster {
    /// Whether the lab's cluster is the secured one.
    pub fn secured(&self) -> bool {
        !self.open
    }
}

/// Where a cluster-mode lab's etcd listens for clients (on the switch
/// namespace's bridge).
pub const ETCD_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 250);
pub const ETCD_PORT: u16 = 2379;

/// The LAN machine's MAC and address (on the VMs' /16).
pub const LAN_MAC: &str = "52:54:00:88:fa:01";
pub const LAN_IP: Ipv4Addr = Ipv4Addr::new(10, 88, 250, 1);

/// The kind of link the lab's vnetds reach each other over (`vnet-lab up
/// --links`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Links {
    /// `udp` links in the spec's `format`.
    #[default]
    Udp,
    /// `vxlan` links, VNI [`VNI`].
    Vxlan,
    /// `tcp` links.
    Tcp,
    /// `tcp ... tls` links, with a CA and a certificate per host made for
    /// the lab (`pki`).
    Tls,
    /// `udp` links in the `vnet` format with `security auth`: a key pair
    /// per host (`vnetd --key`), each link naming its peer's public key.
    Auth,
    /// The same with `security encrypt`.
    Encrypt,
}

impl Links {
    /// What host `h`'s link to host `k` is (`underlay_ip` and `key`: host
    /// `k`'s address on the underlay and its public key): VXLAN when
    /// `vxlan`, TCP or TLS, else UDP in the spec's format and security (a
    /// Palacios host's raw format).
    pub(crate) fn transport(
        self,
        s: &Spec,
        underlay_ip: IpAddr,
        key: Option<vnet_control::PeerKey>,
        k: usize,
        vxlan: bool,
    ) -> Transport {
        let ip = if s.nat { public_ip(k) } else { underlay_ip };
        if vxlan {
            Transport::Vxlan { remote: SocketAddr::new(ip, vnet_wire::vxlan::IANA_PORT), vni: VNI }
        } else if matches!(self, Links::Tcp | Links::Tls) {
            Transport::Tcp { remote: SocketAddr::new(ip, 9000), tls: self == Links::Tls }
        } else {
            // A link to a Palacios host speaks its (raw) format.
            let format = if s.palacios_hosts.contains(&k) { Format::Raw } else { s.format };
            let security = match (self, key) {
                (Links::Auth, Some(k)) => Security::Auth(k),
                (Links::Encrypt, Some(k)) => Security::Encrypt(k),
                _ => Security::None,
            };
            let format = if security == Security::None { format } else { Format::Vnet };
            let nat = s.nat && security != Security::None;
            Transport::Udp {
                remote: SocketAddr::new(ip, 9000),
                format,
                network: 0,
                security,
                cipher: if security == Security::None { Default::default() } else { s.cipher },
                nat,
                relay: None,
            }
        }
    }
}

/// The VXLAN network identifier of the lab's VXLAN links and devices.
pub const VNI: u32 = 42;

/// What joins the lab's VMs across hosts (`vnet-lab up --overlay`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Overlay {
    /// A vnetd per host; VMs on TAPs (or veths, see `veth_hosts`).
    Vnet,
    /// A Linux bridge and a kernel vxlan device per host; VMs on veths.
    Vxlan,
    /// No overlay and no vnetd: the hosts alone (the native baseline).
    #[value(skip)]
    None,
    /// No overlay: VMs on veths, each host an IP router between its VMs'
    /// /24 and the underlay (one VM per host). What a VM's extra veth hop
    /// costs by itself.
    Routed,
    /// No overlay and no routing: VMs on veths whose host ends sit in a
    /// Linux bridge with the underlay device (the host's address moves to
    /// the bridge), so every VM is on one L2 segment with the wire. What a
    /// VM's virtual NIC costs with nothing else in the way.
    Bridged,
    /// tinc 1.0 in switch mode per host (its default crypto), its TAP and
    /// the VMs' veths in a bridge: an L2 VPN users might pick instead.
    Tinc,
    /// wireguard-go per host, as `Routed` but each host routes the other
    /// hosts' VM /24s into its WireGuard device: an L3 reference.
    #[value(name = "wireguard")]
    WireGuard,
}

impl Default for Spec {
    fn default() -> Self {
        let datapath = std::env::var("VNET_LAB_DATAPATH").ok().filter(|d| !d.is_empty());
        // On the kernel path a VM's frames must fit the underlay with the
        // encapsulation (larger ones are vnetd's to fragment).
        let vm_mtu = if datapath.as_deref() == Some("kernel") {
            1500 - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32
        } else {
            1500
        };
        Spec {
            hosts: 2,
            vms_per_host: 1,
            format: Format::Vnet,
            underlay_mtu: 1500,
            vm_mtu,
            palacios_hosts: Vec::new(),
            veth_hosts: Vec::new(),
            overlay: Overlay::Vnet,
            shape: None,
            congestion_control: None,
            dispatch: None,
            datapath,
            qemu_hosts: Vec::new(),
            qemu_vhost: false,
            qemu_queues: 1,
            tap_queues: 1,
            guest_args: Vec::new(),
            vnetd_args: Vec::new(),
            vnetd: None,
            vnetd_caps: None,
            vteps: Vec::new(),
            links: Links::Udp,
            lan_host: None,
            cluster: None,
            ipv6_underlay: false,
            addresses: false,
            listen_any: Vec::new(),
            site_mtu: None,
            nat: false,
            cipher: vnet_control::Cipher::Auto,
            no_vnetd: false,
        }
    }
}

impl Spec {
    /// Whether host `h` runs a kernel VXLAN bridge (a VXLAN lab's hosts,
    /// and a vnet lab's `vteps`) rather than a vnetd or nothing.
    pub fn kernel_vtep(&self, h: usize) -> bool {
        self.overlay == Overlay::Vxlan || (self.overlay == Overlay::Vnet && self.vteps.contains(&h))
    }

    /// The data path an interface of kind `kind` (`tap`, `netdev`,
    /// `vhost-user`) must be on in this spec: `None` where vnetd chooses
    /// (`auto`). A vhost-user interface's rings are always vnetd's.
    pub fn datapath_of(&self, kind: &str) -> Option<&'static str> {
        match (self.datapath.as_deref(), kind) {
            (None | Some("auto"), _) => None,
            (_, "vhost-user") | (Some("user"), _) => Some("user"),
            (Some("kernel"), _) => Some("kernel"),
            _ => None,
        }
    }

    /// Whether host `h` runs a vnetd.
    pub fn runs_vnetd(&self, h: usize) -> bool {
        self.overlay == Overlay::Vnet && !self.vteps.contains(&h) && !self.no_vnetd
    }
}

/// The MAC of VM `v` on host `h`.
pub fn vm_mac(h: usize, v: usize) -> String {
    format!("52:54:00:88:{:02x}:{:02x}", h, v + 1)
}

/// The IP of VM `v` on host `h` (in 10.88.0.0/16).
pub fn vm_ip(h: usize, v: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, h as u8, v as u8 + 1)
}

/// Host h's address on its VMs' /24 in a routed lab (one VM per host).
pub(crate) fn routed_gateway(h: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 88, h as u8, 254)
}

/// Host h's underlay address: 10.77.0.(h+1), or fd00:77::(h+1) on an
/// IPv6 underlay.
pub fn underlay_ip(h: usize, v6: bool) -> IpAddr {
    if v6 {
        Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, h as u16 + 1).into()
    } else {
        Ipv4Addr::new(10, 77, 0, h as u8 + 1).into()
    }
}

/// Host h's public address in a NAT lab ([`Spec::nat`]): its router's
/// outside for hosts 0 and 1, its own for host 2.
pub fn public_ip(h: usize) -> IpAddr {
    Ipv4Addr::new(203, 0, 113, if h == 2 { 10 } else { h as u8 + 1 }).into()
}

/// Where a cluster-mode lab's etcd listens: [`ETCD_IP`], or fd00:77::fa
/// on an IPv6 underlay.
pub fn etcd_ip(v6: bool) -> IpAddr {
    if v6 {
        Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 0xfa).into()
    } else {
        ETCD_IP.into()
    }
}

/// An underlay address with its prefix, as `ip addr add` takes it (IPv6
/// without duplicate address detection: usable at once).
pub(crate) fn underlay_cidr(ip: IpAddr) -> Vec<String> {
    match ip {
        IpAddr::V4(a) => vec![format!("{a}/24")],
        IpAddr::V6(a) => vec![format!("{a}/64"), "nodad".into()],
    }
}
