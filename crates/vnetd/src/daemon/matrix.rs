//! `show matrix`: who talks to whom through this host, both data paths
//! merged. Per MAC pair (VM to VM, as this host forwarded them: a pair
//! between two hosts is counted on both) the frames and bytes the user
//! path ([`vnet_engine::matrix`]) and the kernel path (its per-CPU `pairs`
//! map) moved; the top [`TOP`] pairs by bytes, the rest as `other`; and
//! host to host, each link's bytes each way. The Prometheus text has the
//! top [`METRIC_PAIRS`] pairs only, so its series stay bounded.

use super::Daemon;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use vnet_engine::matrix::Pair;
use vnet_wire::MacAddr;

/// Pairs `show matrix` lists.
pub const TOP: usize = 20;
/// Pairs the metrics carry.
pub const METRIC_PAIRS: usize = 10;

/// The merged matrix: pairs by bytes (largest first), and what the tables
/// had no room for.
struct Merged {
    pairs: Vec<Pair>,
    other: (u64, u64),
}

impl Merged {
    /// The first `n` pairs, and (frames, bytes) of everything else: the
    /// pairs after them and what the tables had no room for.
    fn top(&self, n: usize) -> (&[Pair], (u64, u64)) {
        let (top, rest) = self.pairs.split_at(self.pairs.len().min(n));
        (top, rest.iter().fold(self.other, |(f, b), p| (f + p.frames, b + p.bytes)))
    }
}

impl Daemon {
    fn merged_matrix(&self) -> Merged {
        let mut by: BTreeMap<(MacAddr, MacAddr), (u64, u64)> = BTreeMap::new();
        let kernel = self.kernel.path.as_ref().map(|k| k.pairs()).unwrap_or_default();
        for p in self.shared.global.matrix.pairs().into_iter().chain(kernel) {
            let e = by.entry((p.src, p.dst)).or_default();
            e.0 += p.frames;
            e.1 += p.bytes;
        }
        let mut pairs: Vec<Pair> =
            by.into_iter().map(|((src, dst), (frames, bytes))| Pair { src, dst, frames, bytes }).collect();
        pairs.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.src.cmp(&b.src)).then(a.dst.cmp(&b.dst)));
        Merged { pairs, other: self.shared.global.matrix.other() }
    }

    /// The local interface of `mac`, if one has it.
    fn iface_of(&self, mac: MacAddr) -> Option<&str> {
        self.state.interfaces.values().find(|i| i.mac == Some(mac)).map(|i| i.name.as_str())
    }

    /// `show matrix json`: the top pairs, the rest, and each link's bytes.
    pub(super) fn matrix_json(&self) -> Value {
        let m = self.merged_matrix();
        let (top, other) = m.top(TOP);
        let total: u64 = m.pairs.iter().map(|p| p.bytes).sum::<u64>() + m.other.1;
        let links: Vec<Value> = self
            .links_json()
            .iter()
            .map(|v| json!({ "link": v["name"], "remote": v["remote"], "tx_bytes": v["tx_bytes"], "rx_bytes": v["rx_bytes"] }))
            .collect();
        let rows: Vec<Value> = top
            .iter()
            .map(|p| {
                json!({
                    "src": p.src.to_string(),
                    "dst": p.dst.to_string(),
                    "src_interface": self.iface_of(p.src),
                    "dst_interface": self.iface_of(p.dst),
                    "frames": p.frames,
                    "bytes": p.bytes,
                })
            })
            .collect();
        json!({
            "matrix": {
                "pairs": rows,
                "other": { "frames": other.0, "bytes": other.1 },
                "pairs_seen": m.pairs.len(),
                "pairs_evicted": self.shared.global.matrix.evicted(),
                "bytes": total,
                "capacity": { "user": vnet_engine::matrix::SLOTS, "kernel": crate::kernel::MATRIX_PAIRS },
                "links": links,
            }
        })
    }

    /// The reply body of `show matrix [json]`.
    pub fn show_matrix(&self, as_json: bool) -> String {
        if as_json {
            return self.matrix_json().to_string();
        }
        let m = self.merged_matrix();
        let (top, other) = m.top(TOP);
        let total: u64 = m.pairs.iter().map(|p| p.bytes).sum::<u64>() + m.other.1;
        let v = self.matrix_json();
        let links = v["matrix"]["links"].as_array().cloned().unwrap_or_default();
        let name = |mac: MacAddr| match self.iface_of(mac) {
            Some(i) => format!("{mac} ({i})"),
            None => mac.to_string(),
        };
        let mut out = format!("pairs (top {} of {}, by bytes):\n", top.len(), m.pairs.len());
        let width = top.iter().flat_map(|p| [name(p.src).len(), name(p.dst).len()]).max().unwrap_or(3).max(3);
        out.push_str(&format!(
            "  {:width$}  {:width$}  {:>12}  {:>16}  {:>6}\n",
            "src", "dst", "frames", "bytes", "share"
        ));
        for p in top {
            let share = if total == 0 { 0.0 } else { p.bytes as f64 * 100.0 / total as f64 };
            out.push_str(&format!(
                "  {:width$}  {:width$}  {:>12}  {:>16}  {:>5.1}%\n",
                name(p.src),
                name(p.dst),
                p.frames,
                p.bytes,
                share
            ));
        }
        out.push_str(&format!("  other: {} frames, {} bytes\nlinks (host to host):\n", other.0, other.1));
        for l in &links {
            out.push_str(&format!(
                "  {} {}: tx {} bytes, rx {} bytes\n",
                l["link"].as_str().unwrap_or("?"),
                l["remote"].as_str().unwrap_or("-"),
                l["tx_bytes"],
                l["rx_bytes"]
            ));
        }
        out
    }

    /// The matrix's Prometheus series: the top pairs and the rest.
    pub(super) fn matrix_metrics(&self, out: &mut String) {
        let m = self.merged_matrix();
        let (top, other) = m.top(METRIC_PAIRS);
        out.push_str("# TYPE vnet_matrix_bytes counter\n# TYPE vnet_matrix_frames counter\n");
        for p in top {
            let l = format!("src=\"{}\",dst=\"{}\"", p.src, p.dst);
            out.push_str(&format!(
                "vnet_matrix_bytes{{{l}}} {}\nvnet_matrix_frames{{{l}}} {}\n",
                p.bytes, p.frames
            ));
        }
        out.push_str(&format!(
            "# TYPE vnet_matrix_other_bytes untyped\nvnet_matrix_other_bytes {}\n# TYPE vnet_matrix_other_frames untyped\nvnet_matrix_other_frames {}\n",
            other.1, other.0
        ));
    }
}
