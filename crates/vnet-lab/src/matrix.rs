//! The traffic matrix in the lab (`vnet-lab matrix`, issue 30): known
//! iperf3 flows between the VMs of three hosts, each host's `show matrix`,
//! and a heat map of the network's matrix as SVG that a person reads at a
//! glance (rows: senders, columns: receivers, the cell's shade and label
//! its bytes).

use crate::{iperf3_bytes, Error, Lab, Result, Vm};
use serde_json::Value;
use std::collections::BTreeMap;

/// One flow the lab ran: from VM, to VM, and the bytes iperf3 sent.
#[derive(Debug, Clone)]
pub struct Flow {
    pub from: Vm,
    pub to: Vm,
    /// iperf3's bytes written by the sender, and read by the receiver
    /// (less by what was still in flight when the test ended).
    pub sent: u64,
    pub received: u64,
}

impl Lab {
    /// Runs an iperf3 TCP stream of `seconds` at `rate` (`-b`) for each
    /// `(from host, to host)` of `pairs`, between each host's VM 0, one
    /// after the other; returns what each sent.
    pub fn matrix_flows(&mut self, pairs: &[(usize, usize, &str)], seconds: u32) -> Result<Vec<Flow>> {
        let mut flows = Vec::new();
        for &(f, t, rate) in pairs {
            let (from, to) = (self.vm(f, 0).clone(), self.vm(t, 0).clone());
            let (_, text) = self.iperf3(&from, &to, seconds, &["-b", rate])?;
            let (sent, received) = iperf3_bytes(&text);
            flows.push(Flow { from, to, sent, received });
        }
        Ok(flows)
    }

    /// Each host's `show matrix json` (its `matrix` object).
    pub fn matrices(&self) -> Result<Vec<Value>> {
        (0..self.hosts.len())
            .map(|h| {
                let r = self.control(h, "show matrix json")?;
                r.result.map_err(|e| Error::Other(format!("host {h}: show matrix: {e}")))?;
                let v: Value = serde_json::from_str(&r.body)
                    .map_err(|e| Error::Other(format!("host {h}: show matrix: {e}")))?;
                Ok(v["matrix"].clone())
            })
            .collect()
    }

    /// The VMs' names by MAC (`hHvV`).
    pub fn vm_names(&self) -> BTreeMap<String, String> {
        let mut names = BTreeMap::new();
        for (h, host) in self.hosts.iter().enumerate() {
            for (v, vm) in host.vms.iter().enumerate() {
                names.insert(vm.mac.clone(), format!("h{h}v{v}"));
            }
        }
        names
    }
}

/// The bytes of pair `src` -> `dst` in one host's matrix (0 if absent).
pub fn pair_bytes(matrix: &Value, src: &str, dst: &str) -> u64 {
    matrix["pairs"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["src"] == src && p["dst"] == dst))
        .and_then(|p| p["bytes"].as_u64())
        .unwrap_or(0)
}

/// The network's matrix from every host's: a pair between two hosts is
/// counted on both, so each pair's largest count is taken.
pub fn network_matrix(matrices: &[Value]) -> BTreeMap<(String, String), u64> {
    let mut out: BTreeMap<(String, String), u64> = BTreeMap::new();
    for m in matrices {
        for p in m["pairs"].as_array().into_iter().flatten() {
            let (Some(s), Some(d), Some(b)) = (p["src"].as_str(), p["dst"].as_str(), p["bytes"].as_u64())
            else {
                continue;
            };
            let e = out.entry((s.to_string(), d.to_string())).or_default();
            *e = (*e).max(b);
        }
    }
    out
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.0} MB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.0} kB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// A heat map of `matrix` as SVG: one row per sender and one column per
/// receiver (named by `names`, else by MAC), each cell shaded by its bytes
/// on a log scale and labelled with them; broadcast and unnamed MACs are
/// left out unless they carried more than 1 % of the bytes.
pub fn svg(
    matrix: &BTreeMap<(String, String), u64>,
    names: &BTreeMap<String, String>,
    title: &str,
) -> String {
    let total: u64 = matrix.values().sum::<u64>().max(1);
    let shown = |mac: &str, bytes: u64| names.contains_key(mac) || bytes * 100 > total;
    let mut macs: Vec<String> = Vec::new();
    for ((s, d), b) in matrix {
        for m in [s, d] {
            if shown(m, *b) && !macs.contains(m) {
                macs.push(m.clone());
            }
        }
    }
    macs.sort_by_key(|m| names.get(m).cloned().unwrap_or_else(|| format!("~{m}")));
    let label = |m: &str| names.get(m).cloned().unwrap_or_else(|| m.to_string());
    let (cell, left, top) = (110, 150, 90);
    let (w, h) = ((left + cell * macs.len() + 20).max(620), top + cell * macs.len() + 60);
    let max = matrix.values().copied().max().unwrap_or(1).max(2) as f64;
    let mut s = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='13'>\n\
         <rect width='100%' height='100%' fill='white'/>\n\
         <text x='12' y='24' font-size='16' font-weight='bold'>{title}</text>\n\
         <text x='{left}' y='{}' fill='#555'>receiver</text>\n\
         <text x='12' y='{}' fill='#555'>sender</text>\n",
        top - 40,
        top + 16
    );
    for (i, m) in macs.iter().enumerate() {
        let x = left + i * cell + cell / 2;
        s.push_str(&format!("<text x='{x}' y='{}' text-anchor='middle'>{}</text>\n", top - 10, label(m)));
        s.push_str(&format!(
            "<text x='{}' y='{}' text-anchor='end'>{}</text>\n",
            left - 10,
            top + i * cell + cell / 2 + 5,
            label(m)
        ));
    }
    for (r, src) in macs.iter().enumerate() {
        for (c, dst) in macs.iter().enumerate() {
            let b = matrix.get(&(src.clone(), dst.clone())).copied().unwrap_or(0);
            let t = if b == 0 { 0.0 } else { (b as f64).ln() / max.ln() };
            // White to deep blue.
            let (rr, gg, bb) = (255.0 - 225.0 * t, 255.0 - 175.0 * t, 255.0 - 75.0 * t);
            let (x, y) = (left + c * cell, top + r * cell);
            s.push_str(&format!(
                "<rect x='{x}' y='{y}' width='{cell}' height='{cell}' fill='rgb({rr:.0},{gg:.0},{bb:.0})' stroke='#ccc'/>\n"
            ));
            if b > 0 {
                let fill = if t > 0.6 { "white" } else { "black" };
                s.push_str(&format!(
                    "<text x='{}' y='{}' text-anchor='middle' fill='{fill}'>{}</text>\n",
                    x + cell / 2,
                    y + cell / 2 + 5,
                    human(b)
                ));
            }
        }
    }
    s.push_str(&format!(
        "<text x='12' y='{}' fill='#555'>bytes each sender's frames carried to each receiver, from every host's `show matrix` (shade: log scale)</text>\n</svg>\n",
        top + cell * macs.len() + 30
    ));
    s
}
