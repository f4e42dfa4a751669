//! `vnetctl trace from VM|MAC|IP to IP ... [far ENDPOINT]`: the line goes
//! to this host's vnetd, which answers with every decision the frame would
//! meet (docs/control.md, "Trace"). With `far ENDPOINT`, the far host's
//! vnetd is asked its part too: the trace line this host's reply gives for
//! it (the frame as it arrives there, by MAC and address, with the network
//! id this host's datagrams say), parsed back into a typed request before
//! it is sent, so nothing another program chose is sent as text. What
//! the far host answers is another host's text: read to at most
//! [`FAR_REPLY_MAX`] bytes, and printed with every control character (an
//! escape sequence, a carriage return) and bidirectional override shown
//! escaped ([`printable`]), never raw.

use serde_json::Value;
use std::process::ExitCode;
use vnet_client::client::Client;
use vnet_client::endpoint::Endpoint;
use vnet_client::request::Request;

/// The most bytes of the far host's reply read (a trace's reply is a few
/// kilobytes; one of a `trace hex` frame holds its hex once more).
pub const FAR_REPLY_MAX: usize = 256 * 1024;

/// Another host's text as it may be shown on a terminal: lines and tabs
/// kept, every other control character and the bidirectional controls
/// (which reorder what a terminal shows) escaped as `\u{..}`.
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bidi = matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}');
        if (c.is_control() && c != '\n' && c != '\t') || bidi {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

/// The words with `far ENDPOINT` taken out, and that endpoint.
fn split_far(words: &[String]) -> Result<(Vec<String>, Option<Endpoint>), String> {
    let mut rest = Vec::new();
    let mut far = None;
    let mut w = words.iter();
    while let Some(x) = w.next() {
        if x == "far" {
            let ep = w.next().ok_or("`far` needs the far host's control endpoint (unix:PATH, tcp:, tls:)")?;
            far = Some(ep.parse::<Endpoint>().map_err(|e| format!("far: {e}"))?);
        } else {
            rest.push(x.clone());
        }
    }
    Ok((rest, far))
}

/// The far host's request, from the `ask` line of this host's JSON reply.
fn far_request(reply: &Value, json: bool) -> Result<Option<Request>, String> {
    let Some(ask) = reply["far"]["ask"].as_str() else { return Ok(None) };
    let cmds = vnet_control::parse(ask).map_err(|e| format!("the far host's trace line: {e}"))?;
    if cmds.len() != 1 {
        return Err("the far host's trace line is not one line".into());
    }
    match cmds.into_iter().next().map(|c| c.item) {
        Some(vnet_control::Command::Trace(mut q)) => {
            q.json = json;
            Request::trace(*q).map(Some).map_err(|e| e.to_string())
        }
        Some(vnet_control::Command::TraceHex(mut q)) => {
            q.json = json;
            Request::trace_hex(*q).map(Some).map_err(|e| e.to_string())
        }
        _ => Err("the far host's trace line is no trace".into()),
    }
}

/// Runs `trace` (the words after it) on `c`, and on `far ENDPOINT`'s vnetd.
pub fn run(c: &mut Client, words: &[String], json: bool) -> ExitCode {
    let (words, far) = match split_far(words) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("vnetctl: trace: {e}");
            return ExitCode::from(2);
        }
    };
    let json = json || words.iter().any(|w| w == "json" || w == "--json");
    let words: Vec<&str> =
        words.iter().map(String::as_str).filter(|w| !matches!(*w, "json" | "--json")).collect();
    let line = format!("trace {}", words.join(" "));
    let asked = |c: &mut Client, line: &str| -> Result<String, (u8, String)> {
        match c.request(line) {
            Ok(r) => r.result.map(|()| r.body).map_err(|e| (1, e.to_string())),
            Err(e) => Err((3, e.to_string())),
        }
    };
    let result = (|| {
        let here = asked(c, &format!("{line} json"))?;
        let Some(ep) = far else {
            let body = if json { here } else { asked(c, &line)? };
            return Ok(body);
        };
        let v: Value = serde_json::from_str(&here).map_err(|e| (1, format!("the reply: {e}")))?;
        let req = far_request(&v, json).map_err(|e| (1, e))?;
        let mut body = if json { String::new() } else { asked(c, &line)? };
        let Some(req) = req else {
            if json {
                return Ok(serde_json::json!({ "here": v, "far": Value::Null }).to_string() + "\n");
            }
            body.push_str("(the frame leaves by no link: no far host to ask)\n");
            return Ok(body);
        };
        let mut fc = Client::connect(&ep).map_err(|e| (3, format!("far {ep}: {e}")))?;
        let there = match fc.send_bounded(&req, FAR_REPLY_MAX) {
            Ok(r) => {
                r.result.map(|()| r.body).map_err(|e| (1, format!("far {ep}: {}", printable(&e.to_string()))))
            }
            Err(e) => Err((3, format!("far {ep}: {e}"))),
        }?;
        if json {
            let t: Value =
                serde_json::from_str(&there).map_err(|e| (1, format!("far {ep}: the reply: {e}")))?;
            return Ok(serde_json::json!({ "here": v, "far": t }).to_string() + "\n");
        }
        body.push_str(&format!("far host ({ep}), asked `{}`:\n", req.line()));
        body.push_str(&printable(&there));
        Ok(body)
    })();
    match result {
        Ok(mut body) => {
            if !body.ends_with('\n') {
                body.push('\n');
            }
            // A reader that went away (`| head`) ends the output quietly.
            use std::io::Write as _;
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(body.as_bytes()).and_then(|()| o.flush());
            ExitCode::SUCCESS
        }
        Err((code, e)) => {
            eprintln!("vnetctl: {e}");
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn far_is_taken_out_and_the_far_line_is_parsed_back_into_a_typed_request() {
        let w: Vec<String> =
            "from vm0 to 10.0.0.2 far unix:/run/b.sock udp port 53".split(' ').map(String::from).collect();
        let (rest, far) = split_far(&w).unwrap();
        assert_eq!(rest.join(" "), "from vm0 to 10.0.0.2 udp port 53");
        assert_eq!(far.unwrap().to_string(), "unix:/run/b.sock");
        assert!(split_far(&["far".to_string()]).is_err());
        let reply = serde_json::json!({ "far": { "ask": "trace from 52:54:00:00:00:01 ip 10.0.0.1 to 10.0.0.2 \
            mac 52:54:00:00:00:02 udp port 53 size 60 network 0" } });
        let r = far_request(&reply, true).unwrap().unwrap();
        assert_eq!(
            r.line(),
            "trace from 52:54:00:00:00:01 ip 10.0.0.1 to 10.0.0.2 mac 52:54:00:00:00:02 udp port 53 size 60 \
             network 0 json"
        );
        assert!(far_request(&serde_json::json!({ "far": null }), false).unwrap().is_none());
        let bad = serde_json::json!({ "far": { "ask": "show routes\nroute any any -> link x" } });
        assert!(far_request(&bad, false).is_err());
    }

    #[test]
    fn a_far_hosts_text_is_shown_with_its_control_characters_escaped() {
        let evil = "  1 arrival pass\n\u{1b}]0;owned\u{7}\u{1b}[2J\rverdict: pass\u{202e}ssap\tok";
        let shown = printable(evil);
        assert!(!shown.chars().any(|c| c.is_control() && c != '\n' && c != '\t'), "{shown:?}");
        assert!(!shown.contains('\u{202e}'), "{shown:?}");
        assert_eq!(
            shown,
            "  1 arrival pass\n\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}verdict: pass\\u{202e}ssap\tok"
        );
        // The control: plain text (and other scripts) is shown as it is.
        let plain = "  2 policy    pass   r\u{e9}gle: allows it\n";
        assert_eq!(printable(plain), plain);
        // A far line of `trace hex` is parsed back too.
        let reply =
            serde_json::json!({ "far": { "ask": "trace hex 02000000000202000000000188b5 network 7" } });
        let r = far_request(&reply, false).unwrap().unwrap();
        assert_eq!(r.line(), "trace hex 02000000000202000000000188b5 network 7");
    }
}
