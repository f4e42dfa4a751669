//! Drops as `vnetd` reports them (`show drops json`, one JSON object per
//! drop: `docs/control.md`), as text: what `vnetctl show drops` and
//! `vnetctl monitor drops` print.

use serde_json::Value;

/// A drop as one line of text, from its JSON form:
/// `TIME PATH REASON in INGRESS SRC > DST [IP:PORT > IP:PORT PROTO] [rule R] len N`.
pub fn entry_text(v: &Value) -> String {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-");
    let secs = v.get("time").and_then(Value::as_f64).filter(|t| t.is_finite() && *t >= 0.0).unwrap_or(0.0);
    let when = crate::utc::millis(std::time::Duration::from_secs_f64(secs.min(1e12)));
    let mut out = format!("{when} {:<6} {:<18}", s("path"), s("reason"));
    let ingress = v.get("interface").or(v.get("link")).and_then(Value::as_str);
    out.push_str(&format!(" in {}", ingress.unwrap_or("?")));
    out.push_str(&format!(" {} > {} {}", s("src_mac"), s("dst_mac"), s("ethertype")));
    if let (Some(a), Some(b)) =
        (v.get("src_ip").and_then(Value::as_str), v.get("dst_ip").and_then(Value::as_str))
    {
        let port = |k: &str| v.get(k).and_then(Value::as_u64).map_or(String::new(), |p| format!(":{p}"));
        out.push_str(&format!(" {a}{} > {b}{}", port("src_port"), port("dst_port")));
        if let Some(p) = v.get("proto").and_then(Value::as_str) {
            out.push_str(&format!(" {p}"));
        }
    }
    if let Some(r) = v.get("rule").and_then(Value::as_str) {
        out.push_str(&format!(" rule {r}"));
    }
    out.push_str(&format!(" len {}", v.get("len").and_then(Value::as_u64).unwrap_or(0)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drop_is_one_line_with_what_it_has() {
        let v = serde_json::json!({"time": 1.5, "path": "kernel", "reason": "spoofed_source_ip", "interface": "vm1",
            "src_mac": "02:00:00:00:00:0a", "dst_mac": "02:00:00:00:00:0b", "ethertype": "0x0800",
            "src_ip": "10.0.0.99", "dst_ip": "10.0.0.2", "proto": "udp", "src_port": 1000, "dst_port": 2000, "len": 100});
        assert_eq!(
            entry_text(&v),
            "1970-01-01T00:00:01.500Z kernel spoofed_source_ip  in vm1 02:00:00:00:00:0a > 02:00:00:00:00:0b 0x0800 \
             10.0.0.99:1000 > 10.0.0.2:2000 udp len 100"
        );
        let bare = serde_json::json!({"reason": "malformed", "path": "user", "len": 3});
        assert!(
            entry_text(&bare).ends_with("user   malformed          in ? - > - - len 3"),
            "{}",
            entry_text(&bare)
        );
    }
}
