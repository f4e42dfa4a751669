//! `vnetctl monitor [drops|flows|all] [FILTER...] [json] [count N]`: the
//! drops vnetd records, or the flow log's records (`vnetd --flow-log`), or
//! both, live, one a line (text, or JSON lines with `--json`), as `hubble
//! observe` streams flows. It polls `show drops since SEQ json` (and `show
//! flows since SEQ json`) ten times a second; each drops poll also keeps
//! the kernel path's program sending its drop events (vnetd stops them a
//! few seconds after the last poll). Filters, all of which a record must
//! match: `reason R`, `interface NAME`, `link NAME`, `mac MAC` (source or
//! destination), `ip IP` (source or destination), `port P`, `path
//! user|kernel`, `verdict allow|deny` and `rule NAME` (flows).

use serde_json::Value;
use std::process::ExitCode;
use std::time::Duration;
use vnet_client::client::Client;
use vnet_client::request::Request;
use vnet_control::drops::{DropsQuery, MAX_LAST};
use vnet_control::flows::FlowsQuery;

/// How often vnetd is asked for what is new.
const POLL: Duration = Duration::from_millis(100);

pub const USAGE: &str =
    "usage: vnetctl [--json] monitor [drops|flows|all] [reason R] [interface NAME] [link NAME] \
                         [mac MAC] [ip IP] [port P] [path user|kernel] [verdict allow|deny] [rule NAME] [count N]";

/// What a drop must match to be shown.
#[derive(Debug, Default, PartialEq)]
struct Filter {
    /// What to stream: drops, flow records.
    drops: bool,
    flows: bool,
    fields: Vec<(&'static str, String)>,
    count: Option<u64>,
    json: bool,
}

impl Filter {
    fn parse(words: &[String]) -> Result<Filter, String> {
        let mut f = Filter { drops: true, ..Filter::default() };
        let mut w = words.iter().map(String::as_str).peekable();
        (f.drops, f.flows) = match w.peek() {
            Some(&"drops") => (true, false),
            Some(&"flows") => (false, true),
            Some(&"all") => (true, true),
            _ => (true, false),
        };
        if matches!(w.peek(), Some(&"drops" | &"flows" | &"all")) {
            w.next();
        }
        while let Some(k) = w.next() {
            if matches!(k, "json" | "--json") {
                f.json = true;
                continue;
            }
            let v = w.next().ok_or(format!("`{k}` needs a value; {USAGE}"))?;
            let field = match k {
                "reason" if vnet_core::DropReason::from_name(v).is_some() => "reason",
                "reason" => {
                    let all: Vec<&str> = vnet_core::DropReason::ALL.iter().map(|r| r.name()).collect();
                    return Err(format!("reason `{v}`: one of {}", all.join(", ")));
                }
                "interface" => "interface",
                "link" => "link",
                "path" => "path",
                "verdict" if matches!(v, "allow" | "deny") => "verdict",
                "verdict" => return Err(format!("verdict `{v}`: allow or deny")),
                "rule" => "rule",
                "mac" => {
                    let m: vnet_wire::MacAddr = v.parse().map_err(|_| format!("mac `{v}`: a MAC address"))?;
                    f.fields.push(("mac", m.to_string()));
                    continue;
                }
                "ip" => {
                    let a: std::net::IpAddr = v.parse().map_err(|_| format!("ip `{v}`: an IP address"))?;
                    f.fields.push(("ip", a.to_string()));
                    continue;
                }
                "port" => {
                    v.parse::<u16>().map_err(|_| format!("port `{v}`: a port (0-65535)"))?;
                    "port"
                }
                "count" => {
                    f.count = Some(v.parse().map_err(|_| format!("count `{v}`: a number of drops"))?);
                    continue;
                }
                _ => return Err(format!("unexpected `{k}`; {USAGE}")),
            };
            f.fields.push((field, v.to_string()));
        }
        Ok(f)
    }

    fn matches(&self, d: &Value) -> bool {
        let s = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("");
        let n = |k: &str| d.get(k).and_then(Value::as_u64).map(|p| p.to_string()).unwrap_or_default();
        // A drop names its ends `src_ip` and `src_port`, a flow `src` and `sport`.
        self.fields.iter().all(|(k, v)| match *k {
            "mac" => s("src_mac") == v || s("dst_mac") == v,
            "ip" => [s("src_ip"), s("dst_ip"), s("src"), s("dst")].contains(&v.as_str()),
            "port" => [n("src_port"), n("dst_port"), n("sport"), n("dport")].contains(v),
            k => s(k) == v,
        })
    }
}

/// What a poll asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Drops,
    Flows,
}

impl Kind {
    fn request(self, last: u32, since: u64) -> Request {
        match self {
            Kind::Drops => Request::Drops(DropsQuery { last, since: Some(since), json: true }),
            Kind::Flows => Request::Flows(FlowsQuery { last, since: Some(since), json: true }),
        }
    }

    /// The reply's list.
    fn list(self) -> &'static str {
        match self {
            Kind::Drops => "drops",
            Kind::Flows => "flows",
        }
    }

    fn text(self, v: &Value) -> String {
        match self {
            Kind::Drops => vnet_client::drops::entry_text(v),
            Kind::Flows => vnet_client::flows::entry_text(v),
        }
    }
}

/// Streams drops, flow records or both until interrupted (or `count` of
/// them were shown).
pub fn run(c: &mut Client, words: &[String], json: bool) -> ExitCode {
    let mut f = match Filter::parse(words) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("vnetctl: monitor: {e}");
            return ExitCode::from(2);
        }
    };
    f.json |= json;
    let kinds = [(f.drops, Kind::Drops), (f.flows, Kind::Flows)].into_iter().filter(|(on, _)| *on);
    // The first poll of each starts the watch and says where "now" is.
    let mut cursors = Vec::new();
    for (_, k) in kinds {
        let v = match poll(c, k, 1, 0) {
            Ok(v) => v,
            Err(code) => return code,
        };
        if k == Kind::Flows && v["enabled"] == false {
            eprintln!(
                "vnetctl: monitor: vnetd runs without --flow-log, so it records no flows \
                 (start it with --flow-log PATH, or - for standard output)"
            );
            return ExitCode::from(1);
        }
        cursors.push((k, v["next"].as_u64().unwrap_or(0)));
    }
    let mut shown = 0;
    loop {
        std::thread::sleep(POLL);
        for (k, since) in &mut cursors {
            let v = match poll(c, *k, MAX_LAST, *since) {
                Ok(v) => v,
                Err(code) => return code,
            };
            *since = v["next"].as_u64().unwrap_or(*since);
            for d in v[k.list()].as_array().into_iter().flatten().filter(|d| f.matches(d)) {
                let line = if f.json { d.to_string() } else { k.text(d) };
                if !out_line(&line) {
                    return ExitCode::SUCCESS;
                }
                shown += 1;
                if f.count.is_some_and(|n| shown >= n) {
                    return ExitCode::SUCCESS;
                }
            }
        }
    }
}

/// Writes `line` and a newline to stdout, flushed (a stream's reader sees
/// it at once); false once the reader went away.
fn out_line(line: &str) -> bool {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    o.write_all(line.as_bytes()).and_then(|()| o.write_all(b"\n")).and_then(|()| o.flush()).is_ok()
}

/// One `show drops|flows N since SEQ json`.
fn poll(c: &mut Client, kind: Kind, last: u32, since: u64) -> Result<Value, ExitCode> {
    match c.send(&kind.request(last, since)) {
        Ok(r) => match r.result {
            Ok(()) => serde_json::from_str(&r.body).map_err(|e| {
                eprintln!("vnetctl: monitor: vnetd's answer is not JSON: {e}");
                ExitCode::from(1)
            }),
            Err(e) => {
                eprintln!("vnetctl: monitor: {e}");
                Err(ExitCode::from(1))
            }
        },
        Err(e) => {
            eprintln!("vnetctl: monitor: {e}");
            Err(ExitCode::from(3))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn filters_parse_and_match_either_end_and_bad_values_say_what_is_expected() {
        let f = Filter::parse(&words("drops reason no_route ip 10.0.0.2 port 53 count 3 json")).unwrap();
        assert_eq!((f.count, f.json), (Some(3), true));
        let d = serde_json::json!({"reason": "no_route", "src_ip": "10.0.0.1", "dst_ip": "10.0.0.2", "dst_port": 53});
        assert!(f.matches(&d));
        let other = serde_json::json!({"reason": "policy_denied", "dst_ip": "10.0.0.2", "dst_port": 53});
        assert!(!f.matches(&other));
        assert!(Filter::parse(&words("all")).unwrap().matches(&other), "no filter: everything");
        let e = Filter::parse(&words("drops reason nope")).unwrap_err();
        assert!(e.contains("no_route") && e.contains("policy_denied"), "{e}");
        let flows = Filter::parse(&words("flows verdict deny rule no-ssh ip 10.0.0.2 port 22")).unwrap();
        assert_eq!((flows.drops, flows.flows), (false, true));
        let rec = serde_json::json!({"verdict": "deny", "rule": "no-ssh", "src": "10.0.0.1", "dst": "10.0.0.2",
            "sport": 40000, "dport": 22});
        assert!(flows.matches(&rec), "a flow's ends are `src`/`dst`, `sport`/`dport`");
        assert!(!flows.matches(
            &serde_json::json!({"verdict": "allow", "rule": "no-ssh", "dst": "10.0.0.2", "dport": 22})
        ));
        assert_eq!(Filter::parse(&words("all")).map(|f| (f.drops, f.flows)), Ok((true, true)));
        assert_eq!(
            Filter::parse(&words("")).map(|f| (f.drops, f.flows)),
            Ok((true, false)),
            "drops by default"
        );
        assert!(Filter::parse(&words("flows verdict maybe")).unwrap_err().contains("allow or deny"));
        assert!(Filter::parse(&words("drops mac nope")).is_err());
        assert!(Filter::parse(&words("drops port")).unwrap_err().contains("needs a value"));
        let m = Filter::parse(&words("mac 52:54:00:00:00:01")).unwrap();
        assert!(m.matches(&serde_json::json!({"dst_mac": "52:54:00:00:00:01"})));
    }
}
