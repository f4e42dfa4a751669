//! One line of the flow log: a flow's record as JSON (docs/POLICY.md,
//! "Flow logs", shows one).

use std::net::IpAddr;
use vnet_core::policy::account::FlowRecord;
use vnet_core::policy::FlowKey;

/// Which data path counted a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Path {
    User,
    Kernel,
}

/// A flow's record. Times are Unix seconds; `packets` and `bytes` went
/// from `src` to `dst` (the way of the flow's first packet, when the
/// record has it), the `_back` ones the other way. Bytes are whole
/// Ethernet frames as the data path took them (header included, no FCS).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Line {
    pub start: u64,
    pub end: u64,
    pub path: Path,
    pub verdict: &'static str,
    /// The rule that decided the flow's first packet, `(default)` for
    /// the network's default, null when unknown (a flow the engine found
    /// already carried by the kernel path).
    pub rule: Option<String>,
    pub network: u32,
    pub src_mac: String,
    pub dst_mac: String,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub packets: u64,
    pub bytes: u64,
    pub packets_back: u64,
    pub bytes_back: u64,
}

impl Line {
    /// A record of flow `key` (as its first packet went) from `path`.
    pub fn of(key: &FlowKey, path: Path, allow: bool, rule: Option<&str>) -> Line {
        Line {
            start: 0,
            end: 0,
            path,
            verdict: if allow { "allow" } else { "deny" },
            rule: rule.map(str::to_string),
            network: key.network,
            src_mac: key.src_mac.to_string(),
            dst_mac: key.dst_mac.to_string(),
            src: key.src,
            dst: key.dst,
            proto: key.proto,
            sport: key.sport,
            dport: key.dport,
            packets: 0,
            bytes: 0,
            packets_back: 0,
            bytes_back: 0,
        }
    }

    /// The user path's record `r`, its times (seconds of the flows'
    /// clock) made Unix seconds by `wall`.
    pub fn user(r: &FlowRecord, wall: impl Fn(u32) -> u64) -> Line {
        let o = &r.opened;
        Line {
            start: wall(r.start_s),
            end: wall(r.end_s),
            packets: r.packets[0],
            bytes: r.bytes[0],
            packets_back: r.packets[1],
            bytes_back: r.bytes[1],
            ..Line::of(&o.key, Path::User, o.allow, o.rule.as_deref())
        }
    }

    /// Adds `other`'s counts (the same flow, the same way) and times.
    pub fn absorb(&mut self, other: &Line) {
        self.packets += other.packets;
        self.bytes += other.bytes;
        self.packets_back += other.packets_back;
        self.bytes_back += other.bytes_back;
        self.start = self.start.min(other.start);
        self.end = self.end.max(other.end);
        if self.rule.is_none() {
            self.rule.clone_from(&other.rule);
        }
    }

    /// The JSON line, with its newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;
    use vnet_core::policy::account::Opened;
    use vnet_wire::MacAddr;

    pub(crate) fn key() -> FlowKey {
        FlowKey {
            generation: 2,
            network: 7,
            src_mac: MacAddr([0x52, 0x54, 0, 0, 0, 1]),
            dst_mac: MacAddr([0x52, 0x54, 0, 0, 0, 2]),
            src: "10.0.0.1".parse().unwrap(),
            dst: "10.0.0.2".parse().unwrap(),
            proto: 6,
            sport: 40000,
            dport: 5201,
            id: 0,
            fragment: false,
        }
    }

    #[test]
    fn a_record_is_one_json_line_with_every_field() {
        let r = FlowRecord {
            opened: Opened { key: key(), rule: Some(Arc::from("web-db")), allow: true },
            mirrored: false,
            start_s: 10,
            end_s: 12,
            packets: [7, 5],
            bytes: [10_000, 400],
        };
        let line = Line::user(&r, |s| 1_800_000_000 + u64::from(s));
        let text = String::from_utf8(line.to_json()).unwrap();
        assert_eq!(
            text,
            "{\"start\":1800000010,\"end\":1800000012,\"path\":\"user\",\"verdict\":\"allow\",\
             \"rule\":\"web-db\",\"network\":7,\"src_mac\":\"52:54:00:00:00:01\",\
             \"dst_mac\":\"52:54:00:00:00:02\",\"src\":\"10.0.0.1\",\"dst\":\"10.0.0.2\",\"proto\":6,\
             \"sport\":40000,\"dport\":5201,\"packets\":7,\"bytes\":10000,\"packets_back\":5,\
             \"bytes_back\":400}\n"
        );
        assert_eq!(text.matches('\n').count(), 1, "one line");
        let denied = Line::of(&key(), Path::Kernel, false, None);
        let v: serde_json::Value = serde_json::from_slice(&denied.to_json()).unwrap();
        assert_eq!(
            (v["verdict"].as_str(), v["path"].as_str(), v["rule"].is_null()),
            (Some("deny"), Some("kernel"), true)
        );
    }

    #[test]
    fn absorbing_adds_counts_and_widens_times() {
        let mut a =
            Line { start: 5, end: 6, packets: 1, bytes: 74, ..Line::of(&key(), Path::Kernel, true, None) };
        let b = Line {
            start: 4,
            end: 9,
            packets: 2,
            bytes_back: 9,
            ..Line::of(&key(), Path::User, true, Some("r"))
        };
        a.absorb(&b);
        assert_eq!((a.start, a.end, a.packets, a.bytes, a.bytes_back), (4, 9, 3, 74, 9));
        assert_eq!((a.path, a.rule.as_deref()), (Path::Kernel, Some("r")));
    }
}
