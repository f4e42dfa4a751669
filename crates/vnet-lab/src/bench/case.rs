//! What the bench measures: the link kinds (`Wire`) and the cases, each a
//! lab's overlay and the figures it is compared by.

use crate::{Format, Links};

/// The link vnetds use in a vnet case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// `udp ... format raw` (Palacios).
    Raw,
    /// `udp ... format vnet`.
    Vnet,
    /// `vxlan`.
    Vxlan,
    /// `tcp`.
    Tcp,
    /// `tcp ... tls`.
    Tls,
    /// `udp ... format vnet` with `security auth`.
    VnetAuth,
    /// `udp ... format vnet` with `security encrypt` (`cipher auto`: the
    /// best for this CPU).
    VnetEncrypt,
    /// `security encrypt` with `cipher aes-256-gcm`.
    VnetAesGcm,
    /// `security encrypt` with `cipher chacha20-poly1305`.
    VnetChaCha,
    /// `udp ... format vnet` over an IPv6-only underlay.
    Vnet6,
}

impl Wire {
    fn word(self) -> &'static str {
        match self {
            Wire::Raw => "raw",
            Wire::Vnet => "vnet",
            Wire::Vxlan => "vxlan",
            Wire::Tcp => "tcp",
            Wire::Tls => "tls",
            Wire::VnetAuth => "vnet-auth",
            Wire::VnetEncrypt => "vnet-encrypt",
            Wire::VnetAesGcm => "vnet-aesgcm",
            Wire::VnetChaCha => "vnet-chacha",
            Wire::Vnet6 => "vnet6",
        }
    }

    /// The lab's link kind and `udp` format for it.
    pub(super) fn lab(self) -> (Links, Format) {
        match self {
            Wire::Raw => (Links::Udp, Format::Raw),
            Wire::Vnet | Wire::Vnet6 => (Links::Udp, Format::Vnet),
            Wire::Vxlan => (Links::Vxlan, Format::Vnet),
            Wire::Tcp => (Links::Tcp, Format::Vnet),
            Wire::Tls => (Links::Tls, Format::Vnet),
            Wire::VnetAuth => (Links::Auth, Format::Vnet),
            Wire::VnetEncrypt | Wire::VnetAesGcm | Wire::VnetChaCha => (Links::Encrypt, Format::Vnet),
        }
    }

    /// Secured links' `cipher`.
    pub(super) fn cipher(self) -> vnet_control::Cipher {
        match self {
            Wire::VnetAesGcm => vnet_control::Cipher::Aes256Gcm,
            Wire::VnetChaCha => vnet_control::Cipher::ChaCha20Poly1305,
            _ => vnet_control::Cipher::Auto,
        }
    }

    /// The VMs' MTU over an underlay of `mtu` on vnetd's user path: what a
    /// frame gains must fit where the link cannot split frames; `vnet`
    /// splits them, and a stream carries 64 KB frames whole.
    fn user_mtu(self, mtu: u32) -> u32 {
        match self {
            Wire::Raw => mtu - 42, // outer IPv4 20 + UDP 8 + Ethernet 14
            Wire::Vxlan => mtu - vnet_wire::vxlan::IPV4_OVERHEAD as u32,
            Wire::Vnet
            | Wire::Vnet6
            | Wire::Tcp
            | Wire::Tls
            | Wire::VnetAuth
            | Wire::VnetEncrypt
            | Wire::VnetAesGcm
            | Wire::VnetChaCha => 65_000,
        }
    }
}

/// A kind of path between two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    Native,
    Vxlan,
    /// No overlay: VMs on veths and IP routing in the hosts. The cost of a
    /// VM's veth alone, a floor for every VM-on-veth case (vxlan, kernel).
    Routed,
    /// No overlay and no routing: VMs on veths bridged with the underlay,
    /// one L2 segment. The cost of a VM's virtual NIC alone.
    Bridged,
    /// tinc 1.0 in switch mode (its default crypto): an L2 VPN in user space.
    Tinc,
    /// wireguard-go between the hosts, routing the VMs' subnets: an L3 VPN
    /// in user space.
    WireGuardGo,
    /// vnetd's user-space path in its default (adaptive) dispatch mode.
    VnetUser(Wire),
    /// vnetd's user-space path with every worker in `poll` mode.
    VnetUserPoll(Wire),
    /// vnetd's in-kernel eBPF fast path (`datapath kernel`; VMs on veths).
    VnetKernel(Wire),
    /// The user path with a policy of [`POLICY_RULES`] rules in force, every
    /// new flow allowed by the last ([`policy_requests`]).
    VnetUserRules(Wire),
    /// The kernel path with the same policy.
    VnetKernelRules(Wire),
    /// The kernel path with `vnetctl monitor all` running against each
    /// host's vnetd for the whole measurement (vnetd with `--flow-log -`,
    /// which `monitor all` needs): what watching costs ([`MONITOR_ARGS`]).
    VnetKernelMonitor(Wire),
}

/// What the `*-monitor` cases run against each host's vnetd:
/// `vnetctl monitor all` (drops, and the flow log's records).
pub const MONITOR_ARGS: [&str; 2] = ["monitor", "all"];

/// The vnetd arguments the `*-monitor` cases add: `monitor all` streams the
/// flow log's records too, and refuses to run without one. Standard output
/// is the lab's vnetd log; a network without a policy has no flows to log.
pub const MONITOR_VNETD_ARGS: [&str; 2] = ["--flow-log", "-"];

/// The rules of the `*-rules100` cases.
pub const POLICY_RULES: usize = 100;

/// The policy of the `*-rules100` cases: deny by default, 99 rules that the
/// bench's traffic never matches (prefixes and ports of no VM, tried in
/// order) and a last one allowing everything: each new flow is judged
/// against all 100.
pub fn policy_requests() -> crate::Result<Vec<vnet_control::request::Request>> {
    use vnet_control::policy::{RuleDef, Sel, Verb};
    let mut out = vec![vnet_control::request::Request::Policy { network: 0, verb: Verb::Deny }];
    let rule = |i: usize, verb, from, proto, ports| RuleDef {
        name: format!("r{i:03}"),
        verb,
        network: 0,
        priority: 100,
        from,
        to: Sel::Any,
        ether: None,
        proto,
        ports,
    };
    for i in 0..POLICY_RULES - 1 {
        let net = std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 201, i as u8, 0));
        let verb = if i % 2 == 0 { Verb::Allow } else { Verb::Deny };
        let port = 1000 + i as u16;
        let r = rule(i, verb, Sel::Net(net, 24), Some(6), Some((port, port)));
        out.push(vnet_control::request::Request::rule(r).map_err(|e| e.to_string())?);
    }
    let last = rule(POLICY_RULES - 1, Verb::Allow, Sel::Any, None, None);
    out.push(vnet_control::request::Request::rule(last).map_err(|e| e.to_string())?);
    Ok(out)
}

impl Case {
    pub fn name(self) -> String {
        match self {
            Case::Native => "native".into(),
            Case::Vxlan => "vxlan".into(),
            Case::Routed => "routed".into(),
            Case::Bridged => "bridged".into(),
            Case::Tinc => "tinc".into(),
            Case::WireGuardGo => "wireguard-go".into(),
            Case::VnetUser(w) => format!("vnet-user-{}", w.word()),
            Case::VnetUserPoll(w) => format!("vnet-userpoll-{}", w.word()),
            Case::VnetKernel(w) => format!("vnet-kernel-{}", w.word()),
            Case::VnetUserRules(w) => format!("vnet-user-{}-rules{POLICY_RULES}", w.word()),
            Case::VnetKernelRules(w) => format!("vnet-kernel-{}-rules{POLICY_RULES}", w.word()),
            Case::VnetKernelMonitor(w) => format!("vnet-kernel-{}-monitor", w.word()),
        }
    }

    /// The same case without what it adds to its lab: no policy, no monitor.
    pub(super) fn base(self) -> Case {
        match self {
            Case::VnetUserRules(w) => Case::VnetUser(w),
            Case::VnetKernelRules(w) | Case::VnetKernelMonitor(w) => Case::VnetKernel(w),
            c => c,
        }
    }

    /// Whether the case applies the `*-rules100` policy to every host.
    pub(super) fn ruled(self) -> bool {
        matches!(self, Case::VnetUserRules(_) | Case::VnetKernelRules(_))
    }

    /// Whether the case runs `vnetctl monitor all` against every host's
    /// vnetd while it is measured.
    pub fn monitored(self) -> bool {
        matches!(self, Case::VnetKernelMonitor(_))
    }

    pub fn all() -> Vec<Case> {
        vec![
            Case::Native,
            Case::Routed,
            Case::Bridged,
            Case::Vxlan,
            Case::VnetUser(Wire::Raw),
            Case::VnetUser(Wire::Vnet),
            Case::VnetUser(Wire::Vxlan),
            Case::VnetUser(Wire::Tcp),
            Case::VnetUser(Wire::Tls),
            Case::VnetUser(Wire::VnetAuth),
            Case::VnetUser(Wire::VnetEncrypt),
            Case::VnetUser(Wire::VnetAesGcm),
            Case::Tinc,
            Case::WireGuardGo,
            Case::VnetUserPoll(Wire::Vnet),
            Case::VnetKernel(Wire::Vnet),
            Case::VnetKernel(Wire::Vxlan),
            Case::VnetKernel(Wire::VnetEncrypt),
            Case::VnetKernelRules(Wire::Vnet),
        ]
    }

    /// Every case the bench knows, for `--cases`.
    pub fn known() -> Vec<Case> {
        let mut v = Case::all();
        v.push(Case::VnetUserPoll(Wire::Raw));
        v.push(Case::VnetUser(Wire::Vnet6));
        v.push(Case::VnetKernel(Wire::Vnet6));
        v.push(Case::VnetUser(Wire::VnetChaCha));
        v.push(Case::VnetUserRules(Wire::Vnet));
        v.push(Case::VnetKernelMonitor(Wire::Vnet));
        v
    }

    /// The endpoints' MTU over an underlay of `mtu`.
    pub(super) fn endpoint_mtu(self, mtu: u32) -> u32 {
        match self {
            Case::VnetUserRules(_) | Case::VnetKernelRules(_) | Case::VnetKernelMonitor(_) => {
                self.base().endpoint_mtu(mtu)
            }
            Case::Native | Case::Routed | Case::Bridged => mtu,
            // Room for what each adds (WireGuard's 60 bytes over IPv4 and
            // its padding; tinc's sequence number, MAC, cipher padding and
            // Ethernet header), as wg-quick's 1420 leaves.
            Case::Tinc | Case::WireGuardGo => mtu - 80,
            Case::Vxlan => mtu - vnet_wire::vxlan::IPV4_OVERHEAD as u32,
            Case::VnetUser(w) | Case::VnetUserPoll(w) => w.user_mtu(mtu),
            // The kernel path does not fragment: the VM's frames must fit.
            Case::VnetKernel(Wire::Vxlan) => mtu - vnet_wire::vxlan::IPV4_OVERHEAD as u32,
            Case::VnetKernel(Wire::Vnet) => mtu - vnet_wire::vnet::IPV4_ENCAP_OVERHEAD as u32,
            Case::VnetKernel(Wire::Vnet6) => mtu - vnet_wire::vnet::IPV6_ENCAP_OVERHEAD as u32,
            // These stay on the user path (raw cannot mark unfinished
            // frames, a stream is vnetd's): the user path's MTU.
            // Secured links too, until the kernel path has IPsec.
            Case::VnetKernel(
                w @ (Wire::Raw
                | Wire::Tcp
                | Wire::Tls
                | Wire::VnetAuth
                | Wire::VnetEncrypt
                | Wire::VnetAesGcm
                | Wire::VnetChaCha),
            ) => w.user_mtu(mtu),
        }
    }
}
