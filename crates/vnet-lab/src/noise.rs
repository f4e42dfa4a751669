//! How much a bench figure moves between repeats, and whether a rerun
//! stayed inside that.
//!
//! Repeats are interleaved in time (repeat 1 of every case, then repeat 2,
//! each on a freshly built lab), so the spread of one cell's repeats already
//! holds the machine's drift over the whole run, not only back-to-back
//! jitter. Three repeats are few for one cell, so the noise of a row is
//! pooled: for one condition and metric, it is the largest relative distance
//! of any single repeat from its own case's median, over every case of that
//! row. Ratios to native are formed per repeat (case in repeat r over native
//! in repeat r), which cancels drift that hits both alike; their noise is
//! pooled the same way over the non-native cases.
//!
//! What the repeats cannot hold is the host: on a VM, the CPU time the
//! hypervisor steals moves throughput by tens of percent and comes and goes
//! over seconds to hours, so a run in a quiet hour reports a narrow noise
//! that a run in a crowded hour falls outside of. The bench therefore
//! measures again what was stolen from (`bench::STEAL_MAX_PCT`), and every
//! sample carries its steal so a comparison can say which run was crowded.
//!
//! Besides, every cell carries its own spread (`cell_noise_pct`,
//! `cell_ratio_noise_pct`: its repeats' largest distance from their median),
//! and the rows' table judges each cell by its own spread, so one outlier
//! elsewhere in the row no longer widens every cell's band.
//!
//! The verdict (what `vnet-lab compare` and `bench --check` exit on) is
//! per vnet case: over the case's headline cells (every condition), the
//! median change of its ratio to native, signed so that a positive change
//! is better (more throughput, less latency or CPU). A case whose typical
//! headline figure got more than [`REGRESSION_PCT`] worse is a regression.
//! The median over a case's 36 cells (9 metrics, 4 conditions) is robust to
//! the few cells that move by tens of percent between honest runs (ping and
//! request-response latencies on this machine); a uniform 10 % slowdown
//! moves it by 10 %. `tests::a_uniform_ten_percent_slowdown_fails_and_an_honest_rerun_passes`
//! checks both on the committed runs. Robust, the median also hides one
//! cell that collapsed (raw and VXLAN once ran at a third of their speed in
//! one condition, and the median over nine cells called them ok): a case
//! with a headline rate at under half its ratio to native ([`COLLAPSE_PCT`]),
//! beyond the first run's repeats, is a regression too.
//!
//! A rerun passes for a row when its median lies within the first run's
//! median plus or minus that noise; [`compare`] counts both the absolute
//! medians and the ratios. It also counts the rows where the two runs
//! agree within the noise each reports (the intervals median ± noise of the
//! two runs overlap): the usual test of whether two noisy measurements of
//! one quantity disagree, since the rerun's median is as noisy as the
//! first's. Both counts are printed for every row and for the headline
//! metrics alone.

use serde_json::{json, Value};
use std::fmt::Write as _;

fn nums(v: &Value) -> Vec<f64> {
    v.as_array().into_iter().flatten().filter_map(Value::as_f64).collect()
}

pub(crate) fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 { s[m] } else { (s[m - 1] + s[m]) / 2.0 })
}

/// The largest |x - median| / median over the samples, in percent.
fn max_dev_pct(samples: &[f64]) -> f64 {
    let Some(m) = median(samples) else { return 0.0 };
    if m == 0.0 {
        return 0.0;
    }
    samples.iter().map(|x| ((x - m) / m).abs() * 100.0).fold(0.0, f64::max)
}

fn same_row(a: &Value, b: &Value) -> bool {
    a["mtu"] == b["mtu"] && a["shaped"] == b["shaped"] && a["metric"] == b["metric"]
}

/// The repeat number of each sample: `sample_repeats` when the run wrote
/// it, else 1, 2, ... (runs without failures write samples in repeat order).
fn repeats_of(row: &Value) -> Vec<u64> {
    let given: Vec<u64> =
        row["sample_repeats"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    let n = nums(&row["samples"]).len();
    if given.len() == n {
        given
    } else {
        (1..=n as u64).collect()
    }
}

/// Adds `ratio_samples`, `ratio_median`, `noise_pct` and `ratio_noise_pct`
/// to every row of a results document.
pub fn annotate(doc: &mut Value) {
    let Some(rows) = doc["results"].as_array().cloned() else { return };
    let mut out = rows.clone();
    for (i, row) in rows.iter().enumerate() {
        let native = rows.iter().find(|r| r["case"] == "native" && same_row(r, row));
        let mut ratios = Vec::new();
        if let Some(nat) = native {
            let (ns, nr) = (nums(&nat["samples"]), repeats_of(nat));
            for (x, rep) in nums(&row["samples"]).into_iter().zip(repeats_of(row)) {
                if let Some(j) = nr.iter().position(|&q| q == rep) {
                    if ns[j] != 0.0 {
                        ratios.push(x / ns[j]);
                    }
                }
            }
        }
        out[i]["ratio_median"] = json!(median(&ratios));
        out[i]["ratio_samples"] = json!(ratios);
        // Overlays also against the better no-overlay baseline (routed or
        // bridged, by median), repeat by repeat as against native.
        let case = row["case"].as_str().unwrap_or("");
        if !matches!(case, "native" | "routed" | "bridged") {
            let lower = lower_is_better(row["metric"].as_str().unwrap_or(""));
            let best = rows
                .iter()
                .filter(|r| (r["case"] == "routed" || r["case"] == "bridged") && same_row(r, row))
                .filter(|r| r["median"].as_f64().is_some_and(|m| m > 0.0))
                .max_by(|a, b| {
                    let (x, y) = (a["median"].as_f64().unwrap_or(0.0), b["median"].as_f64().unwrap_or(0.0));
                    if lower {
                        y.total_cmp(&x)
                    } else {
                        x.total_cmp(&y)
                    }
                });
            if let Some(b) = best {
                let (bs, br) = (nums(&b["samples"]), repeats_of(b));
                let paired: Vec<f64> = nums(&row["samples"])
                    .into_iter()
                    .zip(repeats_of(row))
                    .filter_map(|(x, rep)| br.iter().position(|&q| q == rep).map(|j| (x, bs[j])))
                    .filter(|&(_, y)| y != 0.0)
                    .map(|(x, y)| x / y)
                    .collect();
                out[i]["baseline"] = b["case"].clone();
                out[i]["baseline_ratio_median"] = json!(median(&paired));
            }
        }
    }
    let snapshot = out.clone();
    for row in out.iter_mut() {
        let peers = snapshot.iter().filter(|r| same_row(r, row));
        let (mut noise, mut ratio_noise) = (0.0f64, 0.0f64);
        for p in peers {
            noise = noise.max(max_dev_pct(&nums(&p["samples"])));
            if p["case"] != "native" {
                ratio_noise = ratio_noise.max(max_dev_pct(&nums(&p["ratio_samples"])));
            }
        }
        row["noise_pct"] = json!(noise);
        row["ratio_noise_pct"] = json!(ratio_noise);
        row["cell_noise_pct"] = json!(max_dev_pct(&nums(&row["samples"])));
        row["cell_ratio_noise_pct"] = json!(max_dev_pct(&nums(&row["ratio_samples"])));
    }
    doc["results"] = Value::Array(out);
}

/// How many rows of a kind passed each test.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// The rerun's figure lies within the first run's ± noise.
    pub inside: usize,
    /// The two intervals (figure ± each run's noise) overlap.
    pub agree: usize,
    /// Rows found in both runs.
    pub of: usize,
}

impl Counts {
    fn add(&mut self, inside: bool, agree: bool) {
        self.inside += usize::from(inside);
        self.agree += usize::from(agree);
        self.of += 1;
    }
}

/// The outcome of checking a rerun against a first run.
#[derive(Debug, Default)]
pub struct Comparison {
    pub medians: Counts,
    pub ratios: Counts,
    /// The same for the [`HEADLINE`] metrics only.
    pub headline_medians: Counts,
    pub headline_ratios: Counts,
    /// Per vnet case: how its headline ratios to native moved.
    pub cases: Vec<CaseVerdict>,
    /// A Markdown table, one line per row found in both runs.
    pub text: String,
}

impl Comparison {
    /// The vnet cases that regressed (empty: the rerun passes).
    pub fn regressed(&self) -> Vec<&CaseVerdict> {
        self.cases.iter().filter(|c| c.regressed()).collect()
    }
}

/// A typical headline figure more than this much worse (relative to
/// native) is a regression.
pub const REGRESSION_PCT: f64 = 5.0;

/// A headline rate (throughput, bandwidth) whose ratio to native fell by
/// more than this (and beyond the first run's repeats) is a collapse: a
/// regression whatever the case's median change says. Honest reruns move
/// rates by under 40 % (the committed pair: 33 % at worst, MPI peak
/// bandwidth through a 10 Gbit/s shaper), and latencies by up to 67 %,
/// which is why they are left to the median.
pub const COLLAPSE_PCT: f64 = 50.0;

/// How one vnet case's headline ratios to native moved between two runs.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseVerdict {
    pub case: String,
    /// Headline cells found in both runs.
    pub cells: usize,
    /// The median change over them, in percent; positive is better.
    pub change_pct: f64,
    /// Cells whose rerun ratio lies beyond the first run's own repeats, on
    /// the worse side.
    pub worse_than_range: usize,
    /// The worst cell's change, in percent (negative: worse).
    pub worst_pct: f64,
    /// Cells that collapsed: over [`COLLAPSE_PCT`] worse, beyond the first
    /// run's repeats.
    pub collapsed: usize,
}

impl CaseVerdict {
    pub fn regressed(&self) -> bool {
        self.change_pct < -REGRESSION_PCT || self.collapsed > 0
    }
}

/// Whether a smaller figure of `metric` is the better one (latencies, CPU).
fn lower_is_better(metric: &str) -> bool {
    metric.ends_with("_us") || metric.starts_with("cpu_")
}

fn inside(old: f64, noise_pct: f64, new: f64) -> bool {
    (new - old).abs() <= old.abs() * noise_pct / 100.0 + 1e-9
}

/// Whether `a ± a_pct` and `b ± b_pct` overlap.
fn agree(a: f64, a_pct: f64, b: f64, b_pct: f64) -> bool {
    (b - a).abs() <= a.abs() * a_pct / 100.0 + b.abs() * b_pct / 100.0 + 1e-9
}

/// The metrics the report's summary is about (the rest are per-size MPI
/// latencies, ping mdev and other detail).
pub const HEADLINE: [&str; 12] = [
    "tcp1_gbps",
    "tcp4_gbps",
    "udp_gbps",
    "ping56_rtt_us",
    "rr_tcp_p50_us",
    "rr_udp_p50_us",
    "mpi_lat_0B_us",
    "mpi_yield_lat_0B_us",
    "mpi_bw_peak_mbs",
    "cpu_s_per_gb",
    "many_gbps",
    "many_cpu_s_per_gb",
];

/// The CPU steal a run recorded, for the comparison's header.
fn steal_note(d: &Value) -> String {
    match (d["steal_pct_median"].as_f64(), d["steal_pct_max"].as_f64()) {
        (Some(m), Some(x)) => format!(
            "; steal during measurements: median {m:.1} %, largest {x:.1} %, {} taken again",
            d["steal_remeasured"].as_u64().unwrap_or(0)
        ),
        (Some(m), None) => {
            format!("; steal while idle before each case: median {m:.1} % (steal under load not recorded)")
        }
        _ => String::new(),
    }
}

/// Checks every row of `new` that `old` also has against `old`'s medians
/// and noise. Both documents are annotated first (so files written before
/// the noise fields existed work too).
pub fn compare(old: &Value, new: &Value) -> Comparison {
    let (mut old, mut new) = (old.clone(), new.clone());
    annotate(&mut old);
    annotate(&mut new);
    let mut c = Comparison::default();
    for (name, d) in [("First run", &old), ("Rerun", &new)] {
        let _ = writeln!(
            c.text,
            "{name}: {} ({}){}  ",
            d["date"].as_str().unwrap_or("?"),
            d["command"].as_str().unwrap_or("?"),
            steal_note(d)
        );
    }
    c.text.push('\n');
    let _ = writeln!(
        c.text,
        "| condition | case | metric | first: median ±noise | rerun ±noise | in | agree | first: ratio ±noise | rerun ±noise | in | agree |"
    );
    let _ = writeln!(c.text, "|---|---|---|---|---|---|---|---|---|---|---|");
    let empty = Vec::new();
    // Per vnet case: each headline cell's change, whether it lies beyond
    // the first run's repeats on the worse side, whether it is a rate.
    let mut changes: std::collections::BTreeMap<String, Vec<(f64, bool, bool)>> = Default::default();
    for o in old["results"].as_array().unwrap_or(&empty) {
        let Some(n) = new["results"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .find(|r| r["case"] == o["case"] && same_row(r, o))
        else {
            continue;
        };
        let (Some(om), Some(nm)) = (o["median"].as_f64(), n["median"].as_f64()) else { continue };
        let noise = o["cell_noise_pct"].as_f64().unwrap_or(0.0);
        let n_noise = n["cell_noise_pct"].as_f64().unwrap_or(0.0);
        let head = HEADLINE.iter().any(|h| o["metric"] == *h);
        let med_ok = inside(om, noise, nm);
        let med_agree = agree(om, noise, nm, n_noise);
        c.medians.add(med_ok, med_agree);
        if head {
            c.headline_medians.add(med_ok, med_agree);
        }
        let mark = |ok: bool| if ok { "yes" } else { "**no**" };
        let mut ratio_cells = String::from(" | | | ");
        if o["case"] != "native" {
            if let (Some(or), Some(nr)) = (o["ratio_median"].as_f64(), n["ratio_median"].as_f64()) {
                let metric = o["metric"].as_str().unwrap_or("");
                let case = o["case"].as_str().unwrap_or("");
                if head && case.starts_with("vnet") && or > 0.0 && nr > 0.0 {
                    let sign = if lower_is_better(metric) { -1.0 } else { 1.0 };
                    let change = sign * (nr / or).ln();
                    let rs = nums(&o["ratio_samples"]);
                    let (lo, hi) = rs.iter().fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
                    let beyond = if sign > 0.0 { nr < lo } else { nr > hi };
                    let rate = sign > 0.0;
                    changes.entry(case.to_string()).or_default().push((change, beyond, rate));
                }
                let rn = o["cell_ratio_noise_pct"].as_f64().unwrap_or(0.0);
                let nrn = n["cell_ratio_noise_pct"].as_f64().unwrap_or(0.0);
                let (ok, ag) = (inside(or, rn, nr), agree(or, rn, nr, nrn));
                c.ratios.add(ok, ag);
                if head {
                    c.headline_ratios.add(ok, ag);
                }
                ratio_cells = format!("{or:.2} ±{rn:.0}% | {nr:.2} ±{nrn:.0}% | {} | {}", mark(ok), mark(ag));
            }
        }
        let _ = writeln!(
            c.text,
            "| {} {} | {} | {} | {om:.2} ±{noise:.0}% | {nm:.2} ±{n_noise:.0}% | {} | {} | {ratio_cells} |",
            o["mtu"],
            o["shaped"].as_str().unwrap_or("unshaped"),
            o["case"].as_str().unwrap_or(""),
            o["metric"].as_str().unwrap_or(""),
            mark(med_ok),
            mark(med_agree),
        );
    }
    let _ = writeln!(
        c.text,
        "\n| rows | medians inside the first run's noise | medians agreeing (intervals overlap) | ratios inside | ratios agreeing |\n\
         |---|---|---|---|---|"
    );
    for (name, m, r) in
        [("all", c.medians, c.ratios), ("headline metrics", c.headline_medians, c.headline_ratios)]
    {
        let _ = writeln!(
            c.text,
            "| {name} | {}/{} | {}/{} | {}/{} | {}/{} |",
            m.inside, m.of, m.agree, m.of, r.inside, r.of, r.agree, r.of
        );
    }
    verdicts(&mut c, changes);
    c
}

/// Each vnet case's verdict from its headline cells' changes (the log of
/// the new ratio over the old, signed so that + is better; whether beyond
/// the first run's repeats on the worse side; whether a rate), and their
/// table.
fn verdicts(c: &mut Comparison, changes: std::collections::BTreeMap<String, Vec<(f64, bool, bool)>>) {
    for (case, v) in changes {
        let ch: Vec<f64> = v.iter().map(|x| x.0).collect();
        let change_pct = (median(&ch).unwrap_or(0.0).exp() - 1.0) * 100.0;
        let worse_than_range = v.iter().filter(|x| x.1).count();
        let pct = |ln: f64| (ln.exp() - 1.0) * 100.0;
        let worst_pct = pct(ch.iter().copied().fold(0.0, f64::min));
        let collapsed = v.iter().filter(|x| x.1 && x.2 && pct(x.0) < -COLLAPSE_PCT).count();
        c.cases.push(CaseVerdict {
            case,
            cells: v.len(),
            change_pct,
            worse_than_range,
            worst_pct,
            collapsed,
        });
    }
    let _ = writeln!(
        c.text,
        "\n| vnet case | headline cells | typical change of the ratio to native (median; + is better) | cells beyond the first run's repeats, worse side | worst cell | verdict |\n\
         |---|---|---|---|---|---|"
    );
    for v in &c.cases {
        let verdict = if v.collapsed > 0 {
            format!("**regressed** ({} cell(s) over {COLLAPSE_PCT} % worse)", v.collapsed)
        } else if v.regressed() {
            format!("**regressed** (over {REGRESSION_PCT} % worse)")
        } else {
            "ok".to_string()
        };
        let _ = writeln!(
            c.text,
            "| {} | {} | {:+.1} % | {} | {:+.1} % | {verdict} |",
            v.case, v.cells, v.change_pct, v.worse_than_range, v.worst_pct
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(case: &str, metric: &str, samples: &[f64]) -> Value {
        json!({"case": case, "mtu": 1500, "shaped": null, "metric": metric, "unit": "x",
               "samples": samples, "median": median(samples)})
    }

    #[test]
    fn noise_is_pooled_over_the_cases_of_a_row_and_ratios_pair_repeats() {
        let mut doc = json!({"results": [
            row("native", "tcp1_gbps", &[20.0, 22.0, 18.0]),
            row("vxlan", "tcp1_gbps", &[10.0, 11.0, 9.0]),
            row("native", "ping56_rtt_us", &[50.0, 50.0, 50.0]),
        ]});
        annotate(&mut doc);
        let r = &doc["results"];
        // vxlan deviates by 10 % at most, native by 10 %: the row's noise.
        assert!((r[0]["noise_pct"].as_f64().unwrap() - 10.0).abs() < 1e-9);
        assert!((r[1]["noise_pct"].as_f64().unwrap() - 10.0).abs() < 1e-9);
        // Per-repeat ratios are all 0.5: drift shared by both cancels.
        assert_eq!(nums(&r[1]["ratio_samples"]), vec![0.5, 0.5, 0.5]);
        assert!(r[1]["ratio_noise_pct"].as_f64().unwrap() < 1e-9);
        assert_eq!(r[2]["noise_pct"].as_f64(), Some(0.0));
    }

    #[test]
    fn overlays_are_also_given_against_the_better_no_overlay_baseline() {
        let mut doc = json!({"results": [
            row("native", "tcp1_gbps", &[20.0, 20.0, 20.0]),
            row("routed", "tcp1_gbps", &[16.0, 16.0, 16.0]),
            row("bridged", "tcp1_gbps", &[18.0, 18.0, 18.0]),
            row("vnet-kernel-vnet", "tcp1_gbps", &[9.0, 9.0, 9.0]),
            row("routed", "ping56_rtt_us", &[40.0, 40.0, 40.0]),
            row("bridged", "ping56_rtt_us", &[30.0, 30.0, 30.0]),
            row("vxlan", "ping56_rtt_us", &[60.0, 60.0, 60.0]),
        ]});
        annotate(&mut doc);
        let r = &doc["results"];
        // Throughput: the better is the higher (bridged 18): 9/18.
        assert_eq!(
            (r[3]["baseline"].as_str(), r[3]["baseline_ratio_median"].as_f64()),
            (Some("bridged"), Some(0.5))
        );
        // Latency: the better is the lower (bridged 30): 60/30.
        assert_eq!(
            (r[6]["baseline"].as_str(), r[6]["baseline_ratio_median"].as_f64()),
            (Some("bridged"), Some(2.0))
        );
        // The baselines themselves get none.
        assert!(r[1].get("baseline").is_none() && r[2].get("baseline").is_none());
    }

    #[test]
    fn ratios_pair_by_repeat_number_when_a_repeat_failed() {
        let mut nat = row("native", "tcp1_gbps", &[20.0, 30.0, 40.0]);
        nat["sample_repeats"] = json!([1, 2, 3]);
        let mut vx = row("vxlan", "tcp1_gbps", &[15.0, 20.0]);
        vx["sample_repeats"] = json!([2, 3]);
        let mut doc = json!({"results": [nat, vx]});
        annotate(&mut doc);
        assert_eq!(nums(&doc["results"][1]["ratio_samples"]), vec![0.5, 0.5]);
    }

    #[test]
    fn compare_counts_medians_and_ratios_inside_the_noise() {
        let old = json!({"results": [
            row("native", "tcp1_gbps", &[20.0, 22.0, 18.0]),
            row("vxlan", "tcp1_gbps", &[10.0, 11.0, 9.0]),
            row("vnet-user-vnet", "tcp1_gbps", &[8.0, 8.0, 8.0]),
        ]});
        let new = json!({"results": [
            row("native", "tcp1_gbps", &[21.0, 21.0, 21.0]),   // inside 20 ±10 %
            row("vxlan", "tcp1_gbps", &[12.0, 12.0, 12.0]),    // outside 10 ±10 %
            row("vnet-user-vnet", "tcp1_gbps", &[8.4, 8.4, 8.4]),
            row("vnet-kernel-vnet", "tcp1_gbps", &[20.0]),     // not in the first run
        ]});
        let c = compare(&old, &new);
        // Each cell by its own spread: native 20 ±10 % holds 21; vxlan
        // 10 ±10 % does not hold 12, nor vnet 8 ±0 % 8.4 (the row's pooled
        // 10 % would have let it pass).
        assert_eq!((c.medians.inside, c.medians.of), (1, 3), "{}", c.text);
        // Ratio noise pooled over vxlan and vnet: vxlan's per-repeat ratios
        // are all 0.5, vnet's 0.4, 0.364, 0.444 (max deviation 10 %).
        // Rerun ratios 0.571 (vxlan, outside 0.5 ±10 %) and 0.4 (inside).
        assert_eq!((c.ratios.inside, c.ratios.of), (1, 2), "{}", c.text);
        assert!(
            c.text.contains("vxlan | tcp1_gbps | 10.00 ±10% | 12.00 ±0% | **no** | **no**"),
            "{}",
            c.text
        );
        // The rerun's own noise is 0 here, so agreeing is being inside.
        assert_eq!((c.medians.agree, c.ratios.agree), (1, 1));
        assert_eq!(c.headline_medians, Counts { inside: 1, agree: 1, of: 3 });
        assert_eq!(c.headline_ratios, Counts { inside: 1, agree: 1, of: 2 });
        // vnet's ratio to native: 0.4 both times: no change, no regression.
        assert_eq!(c.cases.len(), 1);
        assert!(c.cases[0].change_pct.abs() < 1e-6 && c.regressed().is_empty(), "{:?}", c.cases);
    }

    /// How often an honest rerun's median falls inside the first run's band
    /// when nothing changed: three repeats a cell, drawn from one normal
    /// distribution (a xorshift generator and Box-Muller, fixed seed). The
    /// band is the cell's own largest distance from its median, or the
    /// largest over 7 cases (a row's pooled noise). The figures quoted in
    /// docs/BENCHMARKS.md ("about 96 %" pooled, "about 70 %" own) are these.
    pub(crate) fn inside_rates(trials: usize) -> (f64, f64) {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        let mut normal = move || (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
        let (mut own, mut pooled) = (0usize, 0usize);
        for _ in 0..trials {
            let cell = |n: &mut dyn FnMut() -> f64| {
                let v = [n(), n(), n()];
                let m = median(&v).unwrap_or(0.0);
                (m, v.iter().map(|x| (x - m).abs()).fold(0.0, f64::max))
            };
            let (m, d) = cell(&mut normal);
            let pool = (0..6).map(|_| cell(&mut normal).1).fold(d, f64::max);
            let (rerun, _) = cell(&mut normal);
            own += usize::from((rerun - m).abs() <= d);
            pooled += usize::from((rerun - m).abs() <= pool);
        }
        (own as f64 / trials as f64, pooled as f64 / trials as f64)
    }

    #[test]
    fn with_nothing_changed_a_rerun_lands_inside_a_cells_own_band_less_often_than_a_pooled_one() {
        let (own, pooled) = inside_rates(200_000);
        eprintln!("inside: own band {:.1} %, pooled over 7 cases {:.1} %", own * 100.0, pooled * 100.0);
        assert!((0.6..0.8).contains(&own), "{own}");
        assert!((0.93..0.99).contains(&pooled), "{pooled}");
    }

    /// A committed run (`docs/benchmarks/`): `previous.json` and
    /// `rerun.json` are one command run twice, back to back, at the same code.
    fn committed(name: &str) -> Value {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks").join(name);
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// `doc` with every vnet case `pct` percent worse: less throughput,
    /// more latency and CPU.
    fn slower(doc: &Value, pct: f64) -> Value {
        let mut d = doc.clone();
        for r in d["results"].as_array_mut().unwrap() {
            if !r["case"].as_str().unwrap_or("").starts_with("vnet") {
                continue;
            }
            let lower = lower_is_better(r["metric"].as_str().unwrap_or(""));
            let f = if lower { 1.0 / (1.0 - pct / 100.0) } else { 1.0 - pct / 100.0 };
            let s: Vec<f64> = nums(&r["samples"]).iter().map(|x| x * f).collect();
            r["median"] = json!(median(&s));
            r["samples"] = json!(s);
        }
        d
    }

    #[test]
    fn a_uniform_ten_percent_slowdown_fails_and_an_honest_rerun_passes() {
        let (first, rerun) = (committed("previous.json"), committed("rerun.json"));
        let honest = compare(&first, &rerun);
        // Honest: every case within 2.5 % (the threshold is 5).
        assert!(honest.regressed().is_empty(), "an honest rerun fails:\n{:?}", honest.cases);
        assert!(honest.cases.len() == 4 && honest.cases.iter().all(|c| c.cells == 36), "{:?}", honest.cases);
        assert!(honest.cases.iter().all(|c| c.change_pct.abs() < 3.0), "{:?}", honest.cases);
        // Every vnet case 10 % slower: every one caught (7.7-10.5 %).
        let bad = compare(&first, &slower(&rerun, 10.0));
        assert_eq!(bad.regressed().len(), 4, "{:?}", bad.cases);
        // A 3 % slowdown is within the threshold: not a regression.
        assert!(compare(&first, &slower(&rerun, 3.0)).regressed().is_empty());
        // One headline cell of one case at a third of its speed: the
        // median over its 36 cells hardly moves, the collapse fails it.
        let mut one = rerun.clone();
        let cell = one["results"]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .find(|r| r["case"] == "vnet-user-raw" && r["metric"] == "tcp1_gbps")
            .expect("a raw TCP cell in the committed rerun");
        let s: Vec<f64> = nums(&cell["samples"]).iter().map(|x| x / 3.0).collect();
        cell["median"] = json!(median(&s));
        cell["samples"] = json!(s);
        let c = compare(&first, &one);
        let raw = c.cases.iter().find(|c| c.case == "vnet-user-raw").unwrap();
        assert!(raw.change_pct.abs() < 3.0 && raw.collapsed == 1 && raw.regressed(), "{raw:?}");
        assert_eq!(c.regressed().len(), 1, "{:?}", c.cases);
        // Against itself, 10 % slower is exactly 10 % worse.
        let own = compare(&rerun, &slower(&rerun, 10.0));
        assert!(
            own.cases.iter().all(|c| c.regressed() && (c.change_pct + 10.0).abs() < 0.5),
            "{:?}",
            own.cases
        );
    }

    #[test]
    fn runs_agree_when_their_intervals_overlap() {
        let old = json!({"results": [
            row("native", "ping56_rtt_us", &[50.0, 55.0, 45.0]),  // 50 ±10 %
        ]});
        let new = json!({"results": [
            row("native", "ping56_rtt_us", &[54.0, 57.0, 60.0]),  // 57 ±5 %: 54 < 55
        ]});
        let c = compare(&old, &new);
        assert_eq!(c.medians, Counts { inside: 0, agree: 1, of: 1 }, "{}", c.text);
        let far = json!({"results": [row("native", "ping56_rtt_us", &[70.0, 70.0, 70.0])]});
        assert_eq!(compare(&old, &far).medians.agree, 0);
    }
}
