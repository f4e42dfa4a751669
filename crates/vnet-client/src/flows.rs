//! Flow records as `vnetd` writes them (`--flow-log`, `show flows json`:
//! docs/POLICY.md "Flow logs"), as text: what `vnetctl show flows` and
//! `vnetctl monitor flows` print.

use serde_json::Value;

/// A flow record as one line of text, from its JSON form: `START PATH
/// VERDICT rule R SRC:PORT > DST:PORT proto P Ns packets N bytes N back N
/// bytes N`.
pub fn entry_text(v: &Value) -> String {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-");
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let when = crate::utc::seconds(n("start"));
    format!(
        "{when} {:<6} {:<5} rule {} {}:{} > {}:{} proto {} {}s packets {} bytes {} back {} bytes {}",
        s("path"),
        s("verdict"),
        v.get("rule").and_then(Value::as_str).unwrap_or("-"),
        s("src"),
        n("sport"),
        s("dst"),
        n("dport"),
        n("proto"),
        n("end").saturating_sub(n("start")),
        n("packets"),
        n("bytes"),
        n("packets_back"),
        n("bytes_back"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_record_is_one_line() {
        let v = serde_json::json!({"start": 60, "end": 62, "path": "kernel", "verdict": "allow", "rule": "bulk",
            "src": "10.0.0.1", "dst": "10.0.0.2", "proto": 6, "sport": 40000, "dport": 7001,
            "packets": 10, "bytes": 15000, "packets_back": 5, "bytes_back": 330});
        assert_eq!(
            entry_text(&v),
            "1970-01-01T00:01:00Z kernel allow rule bulk 10.0.0.1:40000 > 10.0.0.2:7001 proto 6 2s \
             packets 10 bytes 15000 back 5 bytes 330"
        );
        assert!(entry_text(&serde_json::json!({})).contains("rule - -:0 > -:0"));
    }
}
