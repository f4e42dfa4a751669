//! The bench's Markdown report (`results.md`): per condition, a table of
//! medians with their ratios to native and the spread of the repeats, and
//! the runs that failed.

use serde_json::Value;
use std::fmt::Write as _;

/// One cell of the Markdown report: median (ratio to native) b(ratio to
/// the better baseline) [min-max]; † a ratio of medians, ‡ fewer repeats.
fn cell(r: &Value, native: Option<f64>, repeats: usize) -> String {
    let med = r["median"].as_f64().unwrap_or(f64::NAN);
    let s: Vec<f64> = r["samples"].as_array().into_iter().flatten().filter_map(|x| x.as_f64()).collect();
    let (lo, hi) = s.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
    // † a ratio of medians (no repeat of native to pair
    // with); ‡ fewer repeats than the run made.
    let ratio = match (r["ratio_median"].as_f64(), native) {
        (Some(x), _) => format!(" ({x:.2}x)"),
        (None, Some(n)) if r["case"] != "native" => format!(" ({:.2}x†)", med / n),
        _ => String::new(),
    };
    let short = if s.len() < repeats { "‡" } else { "" };
    let spread = if s.len() > 1 { format!(" [{lo:.1}-{hi:.1}]") } else { String::new() };
    // Against the better of routed and bridged.
    let base = r["baseline_ratio_median"].as_f64().map_or(String::new(), |x| format!(" b{x:.2}x"));
    format!(" {med:.2}{short}{ratio}{base}{spread} |")
}

/// The Markdown report: per condition, a table of medians with ratios to native.
pub fn markdown(doc: &Value) -> String {
    let mut md = String::new();
    if doc["complete"] == false {
        let _ = writeln!(
            md,
            "**Incomplete: the run was cut short; the conditions below are what it measured.**\n"
        );
    }
    let _ = writeln!(md, "Date: {}  ", doc["date"].as_str().unwrap_or(""));
    let _ = writeln!(md, "Machine: {}  ", doc["machine"].as_str().unwrap_or(""));
    let _ = writeln!(md, "Kernel: {}  ", doc["kernel"].as_str().unwrap_or(""));
    let _ = writeln!(md, "Command: `{}`  ", doc["command"].as_str().unwrap_or(""));
    let _ = writeln!(
        md,
        "Repeats: {}, {} s per transfer; CPU steal during measurements: median {:.1} %, largest {:.1} % \
         (limit {:.0} %; {} measurements taken again); measurements started on a machine that did not go \
         idle: {}; congestion control: {}\n",
        doc["repeats"],
        doc["seconds"],
        doc["steal_pct_median"].as_f64().unwrap_or(0.0),
        doc["steal_pct_max"].as_f64().unwrap_or(0.0),
        doc["steal_limit_pct"].as_f64().unwrap_or(0.0),
        doc["steal_remeasured"].as_u64().unwrap_or(0),
        doc["idle_wait_gave_up"].as_u64().map_or("not recorded".to_string(), |n| n.to_string()),
        doc["congestion_control"].as_str().unwrap_or("")
    );
    let repeats = doc["repeats"].as_u64().unwrap_or(0) as usize;
    for n in doc["notes"].as_array().into_iter().flatten() {
        let _ = writeln!(md, "- {}", n.as_str().unwrap_or(""));
    }
    let rows = doc["results"].as_array().cloned().unwrap_or_default();
    let mut conds: Vec<(u64, String)> = rows
        .iter()
        .map(|r| (r["mtu"].as_u64().unwrap_or(0), r["shaped"].as_str().unwrap_or("unshaped").to_string()))
        .collect();
    conds.sort();
    conds.dedup();
    let mut cases: Vec<String> = rows.iter().filter_map(|r| r["case"].as_str().map(String::from)).collect();
    cases.sort_by_key(|c| (c != "native", c != "routed", c != "bridged", c != "vxlan", c.clone()));
    cases.dedup();
    for (mtu, shaped) in &conds {
        table(&mut md, &rows, &cases, (*mtu, shaped), repeats);
    }
    failures(&mut md, doc);
    md
}

/// The metrics of the report's tables, in their order.
const METRICS: [&str; 14] = [
    "tcp1_gbps",
    "tcp4_gbps",
    "udp_gbps",
    "ping56_rtt_us",
    "ping1024_rtt_us",
    "ping8000_rtt_us",
    "rr_tcp_p50_us",
    "rr_udp_p50_us",
    "mpi_lat_0B_us",
    "mpi_yield_lat_0B_us",
    "mpi_bw_peak_mbs",
    "cpu_s_per_gb",
    "many_gbps",
    "many_cpu_s_per_gb",
];

/// The table of one condition (underlay MTU, shaping): a row per metric
/// measured, a column per case.
fn table(md: &mut String, rows: &[Value], cases: &[String], (mtu, shaped): (u64, &str), repeats: usize) {
    let _ = writeln!(md, "\n### Underlay MTU {mtu}, {shaped}\n");
    let _ = writeln!(
        md,
        "Each cell: median (ratio to native) b(ratio to the better of routed and bridged) [min-max of the \
         repeats]; ‡ fewer repeats than the run made, \
         † a ratio of medians (native had no repeat to pair with). Noise: the row's ± for medians / for ratios. \
         UDP is iperf3 with datagrams of the VM MTU less 28 bytes: with a 64 KB VM MTU (the user path's \
         offloads) one datagram is 64 KB, so its goodput is not comparable to native's 1472-byte datagrams.\n"
    );
    let _ = write!(md, "| metric | noise |");
    for c in cases {
        let _ = write!(md, " {c} |");
    }
    let _ = write!(md, "\n|---|---|");
    for _ in cases {
        let _ = write!(md, "---|");
    }
    md.push('\n');
    for m in METRICS {
        let find = |c: &str| {
            rows.iter().find(|r| {
                r["case"] == c
                    && r["metric"] == m
                    && r["mtu"].as_u64() == Some(mtu)
                    && r["shaped"].as_str().unwrap_or("unshaped") == shaped
            })
        };
        if cases.iter().all(|c| find(c).is_none()) {
            continue; // not measured in this run (`--only`)
        }
        let native = find("native").and_then(|r| r["median"].as_f64());
        let any = cases.iter().find_map(|c| find(c));
        let unit = any.and_then(|r| r["unit"].as_str()).unwrap_or("");
        let noise =
            |k: &str| any.and_then(|r| r[k].as_f64()).map_or(String::from("-"), |x| format!("{x:.0}%"));
        let _ = write!(md, "| {m} ({unit}) | ±{} / ±{} |", noise("noise_pct"), noise("ratio_noise_pct"));
        for c in cases {
            match find(c) {
                Some(r) => md.push_str(&cell(r, native, repeats)),
                None => {
                    let _ = write!(md, " failed |");
                }
            }
        }
        md.push('\n');
    }
}

/// The runs that failed, with their errors.
fn failures(md: &mut String, doc: &Value) {
    let fails = doc["failures"].as_array().cloned().unwrap_or_default();
    if !fails.is_empty() {
        let _ = writeln!(md, "\n### Failed runs\n");
        for f in fails {
            let _ = writeln!(
                md,
                "- {} mtu {} {} repeat {}: {}",
                f["case"].as_str().unwrap_or(""),
                f["mtu"],
                f["shaped"].as_str().unwrap_or("unshaped"),
                f["repeat"],
                f["error"].as_str().unwrap_or("")
            );
        }
    }
}
