//! The benchmark: native, kernel VXLAN and every vnet path, measured in one
//! run on the same machine, each figure reported as a ratio to native.
//!
//! For every condition (underlay MTU, shaping), repeat and case, the bench
//! builds a fresh lab, warms it up, waits until the machine is idle, runs
//! every measurement, and tears the lab down (its `Drop`, also on failure;
//! Ctrl-C is handled by the lab's signal cleanup). A case that fails is
//! recorded as failed with its error, never skipped silently.
//!
//! Results go to `<out>/results.json` (every sample), `<out>/results.md`
//! (medians as ratios to native, with the spread of the repeats) and PNG
//! plots made by `bench/plot.py`.

use crate::noise::median;
use crate::report::markdown;
use crate::{Format, Lab, Links, Overlay, Spec};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

mod case;
mod monitor;
pub use case::{policy_requests, Case, Wire, MONITOR_ARGS, MONITOR_VNETD_ARGS, POLICY_RULES};
use monitor::Monitors;

/// Underlay conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub mtu: u32,
    pub shaped: Option<String>,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Opts {
    pub cases: Vec<Case>,
    pub conditions: Vec<Condition>,
    pub repeats: usize,
    /// Seconds per iperf3 and sockperf run.
    pub seconds: u32,
    /// Pings per RTT measurement (10 ms apart).
    pub pings: u32,
    /// Largest MPI message, and the iteration scale (1.0 = full).
    pub mpi_max: u64,
    pub mpi_scale: f64,
    /// The compiled `bench/mpi_pingpong.c`, and `bench/rsh-netns`.
    pub mpi_bin: PathBuf,
    pub rsh_agent: PathBuf,
    pub out: PathBuf,
    pub command: String,
    /// Only these measurements ([`MEASUREMENTS`]); empty is all of them.
    pub only: Vec<String>,
    /// More arguments for every vnetd.
    pub vnetd_args: Vec<String>,
}

/// The measurements a run can be limited to (`--only`): one stream's TCP
/// (with CPU per GB), four streams, UDP goodput, the three pings, the two
/// sockperf round trips, the MPI ping-pongs, the many-flows case ([`many`]).
pub const MEASUREMENTS: [&str; 7] = ["tcp1", "tcp4", "udp", "ping", "rr", "mpi", "many"];

impl Opts {
    fn wants(&self, m: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == m)
    }
}

/// One measured value, with the CPU steal during the measurement it came
/// from.
struct Sample {
    metric: String,
    unit: &'static str,
    value: f64,
    steal_pct: f64,
}

fn sample(metric: impl Into<String>, unit: &'static str, value: f64) -> Sample {
    Sample { metric: metric.into(), unit, value, steal_pct: 0.0 }
}

type Key = (String, u32, Option<String>, String); // case, mtu, shaped, metric

/// The samples of one result row, with each one's repeat and steal.
#[derive(Default)]
struct Row {
    unit: &'static str,
    samples: Vec<f64>,
    repeats: Vec<usize>,
    steal: Vec<f64>,
}

/// A measurement during which the hypervisor stole more than this share of
/// the machine's CPU time is taken again. On this kind of VM throughput
/// falls almost in proportion to steal (measured: 22 Gbit/s native TCP at
/// 1-2 % steal, 13-15 at 22-30 %), and steal comes and goes over minutes,
/// so two runs an hour apart differ by more than the repeats of one run
/// show unless stolen measurements are refused.
pub const STEAL_MAX_PCT: f64 = 8.0;
/// Tries per measurement; when every one is stolen, the least stolen is
/// kept (and its steal is in the results).
const STEAL_TRIES: usize = 3;
/// Measuring again may add at most this share to the run's time: when the
/// host is busy for long, steal stays high on every try, and the run must
/// still end.
const REMEASURE_BUDGET: f64 = 0.10;

/// Steal seen by the measurements of a run.
struct StealLog {
    /// The steal of every measurement kept, in percent.
    kept: Vec<f64>,
    /// Measurements started after the idle wait gave up.
    idle_gave_up: u64,
    /// Measurements taken again because of steal.
    remeasured: usize,
    /// When the run started, and the time spent measuring again.
    start: Instant,
    spent: Duration,
}

impl Default for StealLog {
    fn default() -> Self {
        StealLog {
            kept: Vec::new(),
            idle_gave_up: 0,
            remeasured: 0,
            start: Instant::now(),
            spent: Duration::ZERO,
        }
    }
}

impl StealLog {
    fn may_remeasure(&self) -> bool {
        self.spent.as_secs_f64() < REMEASURE_BUDGET * self.start.elapsed().as_secs_f64()
    }
}

/// Steal as a percentage of all CPU time between two [`cpu_ticks`] readings.
fn steal_pct(a: (u64, u64, u64), b: (u64, u64, u64)) -> f64 {
    b.1.saturating_sub(a.1) as f64 / b.2.saturating_sub(a.2).max(1) as f64 * 100.0
}

/// Runs one measurement after the machine is idle, again while the steal
/// during it exceeds [`STEAL_MAX_PCT`] (up to [`STEAL_TRIES`] times, within
/// [`REMEASURE_BUDGET`]), and returns the least stolen result with its
/// steal. An error ends it.
fn steady<T>(
    what: &str,
    log: &mut StealLog,
    mut f: impl FnMut() -> crate::Result<T>,
) -> crate::Result<(T, f64)> {
    let mut best: Option<(T, f64)> = None;
    for attempt in 1..=STEAL_TRIES {
        if !wait_idle() {
            log.idle_gave_up += 1;
            eprint!("({what}: the machine did not go idle) ");
        }
        let t = Instant::now();
        let a = cpu_ticks();
        let v = f()?;
        let st = steal_pct(a, cpu_ticks());
        if best.as_ref().is_none_or(|b| st < b.1) {
            best = Some((v, st));
        }
        if attempt > 1 {
            log.spent += t.elapsed();
        }
        if st <= STEAL_MAX_PCT || !log.may_remeasure() {
            break;
        }
        if attempt < STEAL_TRIES {
            log.remeasured += 1;
            eprint!("({what}: {st:.0} % stolen, again) ");
        }
    }
    let (v, st) = best.ok_or_else(|| format!("{what}: not measured"))?;
    log.kept.push(st);
    Ok((v, st))
}

/// Stamps the steal of the measurement they came from on samples.
fn stolen(mut v: Vec<Sample>, st: f64) -> Vec<Sample> {
    for s in &mut v {
        s.steal_pct = st;
    }
    v
}

/// Writes `results.json` and `results.md` of what `rows` hold; a run cut
/// short (`complete` false: conditions still to come) says so in its
/// document and in the Markdown's title.
fn write(
    opts: &Opts,
    rows: &BTreeMap<Key, Row>,
    failures: &[Value],
    steal: &StealLog,
    complete: bool,
) -> crate::Result<()> {
    let results: Vec<Value> = rows
        .iter()
        .map(|((case, mtu, shaped, metric), r)| {
            json!({
                "case": case, "mtu": mtu, "shaped": shaped, "metric": metric, "unit": r.unit,
                "samples": r.samples, "sample_repeats": r.repeats, "sample_steal_pct": r.steal,
                "median": median(&r.samples),
            })
        })
        .collect();
    let mut doc = json!({
        "date": now_utc(),
        "machine": machine(),
        "kernel": sh(&["uname", "-r"]),
        "command": opts.command,
        // New namespaces inherit the machine's default; all cases alike.
        "congestion_control": std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
            .unwrap_or_default().trim(),
        "repeats": opts.repeats,
        // false while conditions are still to come (a run cut short keeps
        // what it measured).
        "complete": complete,
        "seconds": opts.seconds,
        "steal_pct_median": median(&steal.kept),
        "steal_pct_max": steal.kept.iter().copied().fold(0.0, f64::max),
        "steal_limit_pct": STEAL_MAX_PCT,
        "steal_remeasured": steal.remeasured,
        "idle_wait_gave_up": steal.idle_gave_up,
        "notes": [
            "Sender, receiver and overlay share the machine's cores: every case competes for the same CPUs.",
            "routed: no overlay at all; VMs on veths (as for vxlan and vnet-kernel) and plain IP routing in each host: what VMs behind veths cost without any overlay (a reference, not a strict bound: the kernel path skips the hosts' IP routing).",
            "bridged: no overlay and no routing; VMs on veths whose host ends share a Linux bridge with the underlay device (one L2 segment): what a VM's virtual NIC costs with nothing else in the way. Overlay cases are also given as a ratio to the better of routed and bridged (the `vs best baseline` column of each cell, `b`).",
            "Endpoint MTU: native, routed and bridged = underlay; vxlan = underlay - 50; vnet raw = underlay - 42; vnet vnet = 65000 (vnet splits frames itself).",
            "vnet-user-*: vnetd's user-space path in its default adaptive dispatch; vnet-userpoll-*: the same with every worker in poll mode (spins up to 20 ms after the last frame).",
            "vnet-kernel-*: vnetd's in-kernel eBPF fast path (TC programs; VMs are containers on veths, like the vxlan case); endpoint MTU = underlay - 62 for vnet (- 42 for raw), since the kernel path does not fragment.",
            "tinc: tinc 1.0 in switch mode with its default crypto, its TAP and the VMs' veths in a bridge per host; wireguard-go: WireGuard in user space, each host routing the other's VM /24 into it (L3, as routed). Both Debian's packages, endpoint MTU = underlay - 80: what users would run instead of a secured vnet link.",
            "UDP goodput uses the largest datagram that fits the endpoint MTU (MTU - 28).",
            "Ratios are to native in the same run; latency ratios above 1 and throughput ratios below 1 are worse than native.",
            "Repeats are interleaved (repeat 1 of every case, then repeat 2, ...), each on a freshly built lab. Each measurement is taken again (up to 3 tries, the least stolen kept, while measuring again has added under 10 % to the run's time) when the hypervisor stole more than the steal limit of the machine's CPU time during it (`sample_steal_pct` per sample): on this VM throughput falls almost in proportion to steal, which comes and goes over minutes. Ratios are formed per repeat. Noise (±) is the largest distance of one repeat from its case's median, pooled over the cases of a row; a rerun's medians are expected within it, or at least to agree with it (the two runs' intervals overlap); `vnet-lab compare` counts both.",
        ],
        "failures": failures,
        "results": results,
    });
    crate::noise::annotate(&mut doc);
    let json_path = opts.out.join("results.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&doc).unwrap_or_default())
        .map_err(crate::io("writing results.json"))?;
    std::fs::write(opts.out.join("results.md"), markdown(&doc)).map_err(crate::io("writing results.md"))?;
    Ok(())
}

/// Runs the whole matrix and writes the results. Returns the output directory.
pub fn run(opts: &Opts) -> crate::Result<PathBuf> {
    std::fs::create_dir_all(&opts.out).map_err(crate::io("creating the results directory"))?;
    let mut rows: BTreeMap<Key, Row> = BTreeMap::new();
    let mut failures: Vec<Value> = Vec::new();
    let mut steal = StealLog::default();
    let total = opts.conditions.len() * opts.repeats * opts.cases.len();
    let mut n = 0;
    for cond in &opts.conditions {
        for rep in 0..opts.repeats {
            for &case in &opts.cases {
                n += 1;
                let t0 = Instant::now();
                eprint!(
                    "[{n}/{total}] mtu {} {} repeat {} {} ... ",
                    cond.mtu,
                    cond.shaped.as_deref().unwrap_or("unshaped"),
                    rep + 1,
                    case.name()
                );
                match measure(case, cond, opts, &mut steal) {
                    Ok(samples) => {
                        eprintln!("ok ({:.0} s)", t0.elapsed().as_secs_f64());
                        for s in samples {
                            let key = (case.name().to_string(), cond.mtu, cond.shaped.clone(), s.metric);
                            let row =
                                rows.entry(key).or_insert_with(|| Row { unit: s.unit, ..Row::default() });
                            row.samples.push(s.value);
                            row.repeats.push(rep + 1);
                            row.steal.push(s.steal_pct);
                        }
                    }
                    Err(e) => {
                        eprintln!("FAILED: {e}");
                        failures.push(json!({
                            "case": case.name(), "mtu": cond.mtu, "shaped": cond.shaped,
                            "repeat": rep + 1, "error": e.to_string(),
                        }));
                    }
                }
            }
        }
        // What is measured so far, should the run be cut short.
        let last = Some(cond) == opts.conditions.last();
        write(opts, &rows, &failures, &steal, last)?;
    }
    Ok(opts.out.clone())
}

fn sh(args: &[&str]) -> String {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn now_utc() -> String {
    sh(&["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"])
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().next().map(|l| l.split_whitespace().nth(1).unwrap_or("0").parse::<u64>().unwrap_or(0))
        })
        .unwrap_or(0);
    format!("{} cores, {cpu}, {} GiB", sh(&["nproc"]), mem / 1024 / 1024)
}

/// CPU time counters from /proc/stat: (busy, steal, total) in ticks.
fn cpu_ticks() -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> =
        text.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let g = |i: usize| f.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = g(0) + g(1) + g(2) + g(5) + g(6);
    (busy, g(7), busy + g(3) + g(4) + g(7))
}

/// Waits until the machine is idle (busy < 15 %, steal < 10 % over 0.2 s),
/// up to 20 tries. Returns false when it gave up (the run records how
/// often: a measurement then started on a busy machine).
fn wait_idle() -> bool {
    for _ in 0..20 {
        let a = cpu_ticks();
        std::thread::sleep(Duration::from_millis(200));
        let b = cpu_ticks();
        let busy = b.0.saturating_sub(a.0) as f64 / b.2.saturating_sub(a.2).max(1) as f64 * 100.0;
        if busy < 15.0 && steal_pct(a, b) < 10.0 {
            return true;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    false
}

/// One endpoint of a measurement.
struct End {
    ns: String,
    ip: String,
}

/// The lab a case is measured on, with `vms` VMs per host (native: none).
fn spec_for(case: Case, cond: &Condition, vms: usize, vnetd_args: &[String]) -> Spec {
    let mut vnetd_args = vnetd_args.to_vec();
    if case.monitored() {
        vnetd_args.extend(MONITOR_VNETD_ARGS.map(String::from));
    }
    let case = case.base();
    let no_vnet = (Links::Udp, Format::Raw);
    let (overlay, (links, format), dispatch, datapath) = match case {
        Case::Native => (Overlay::None, no_vnet, None, None),
        Case::Vxlan => (Overlay::Vxlan, no_vnet, None, None),
        Case::Routed => (Overlay::Routed, no_vnet, None, None),
        Case::Bridged => (Overlay::Bridged, no_vnet, None, None),
        Case::Tinc => (Overlay::Tinc, no_vnet, None, None),
        Case::WireGuardGo => (Overlay::WireGuard, no_vnet, None, None),
        Case::VnetUser(w) => (Overlay::Vnet, w.lab(), None, None),
        Case::VnetUserPoll(w) => (Overlay::Vnet, w.lab(), Some("poll".to_string()), None),
        Case::VnetKernel(w) => (Overlay::Vnet, w.lab(), None, Some("kernel".to_string())),
        Case::VnetUserRules(_) | Case::VnetKernelRules(_) | Case::VnetKernelMonitor(_) => {
            unreachable!("the base case above")
        }
    };
    Spec {
        hosts: 2,
        vms_per_host: if case == Case::Native { 0 } else { vms },
        format,
        links,
        underlay_mtu: cond.mtu,
        vm_mtu: case.endpoint_mtu(cond.mtu),
        overlay,
        shape: cond.shaped.clone(),
        dispatch,
        datapath,
        ipv6_underlay: matches!(case, Case::VnetUser(Wire::Vnet6) | Case::VnetKernel(Wire::Vnet6)),
        cipher: match case {
            Case::VnetUser(w) | Case::VnetUserPoll(w) | Case::VnetKernel(w) => w.cipher(),
            _ => vnet_control::Cipher::Auto,
        },
        vnetd_args,
        ..Spec::default()
    }
}

/// A lab for `case`: up, and with the `*-rules100` cases' policy on every
/// host; the `*-monitor` cases' monitors are started by [`Monitors::start`].
fn lab_for(case: Case, cond: &Condition, vms: usize, opts: &Opts) -> crate::Result<Lab> {
    let lab = Lab::up(spec_for(case, cond, vms, &opts.vnetd_args)).map_err(|e| format!("lab: {e}"))?;
    if case.ruled() {
        let text: String = policy_requests()?.iter().map(|r| format!("{r}\n")).collect();
        for h in 0..lab.hosts.len() {
            lab.apply(h, &text).map_err(|e| format!("the policy: {e}"))?;
        }
    }
    Ok(lab)
}

/// Waits until `a` reaches `b` (ARP, routes, the overlay's learning).
fn reach(lab: &Lab, a: &End, b: &End) -> crate::Result<()> {
    for _ in 0..20 {
        let o = lab.ns_output(&a.ns, &["ping", "-n", "-c", "1", "-W", "1", &b.ip])?;
        if o.status.success() {
            return Ok(());
        }
    }
    Err(format!("{} does not reach {}", a.ip, b.ip).into())
}

fn measure(case: Case, cond: &Condition, opts: &Opts, log: &mut StealLog) -> crate::Result<Vec<Sample>> {
    let mut lab = lab_for(case, cond, 1, opts)?;
    // Watching from before the warm-up to after the last measurement.
    let monitors = Monitors::start(case, &lab)?;
    let (a, b) = if case == Case::Native {
        (
            End { ns: lab.hosts[0].ns.clone(), ip: lab.hosts[0].underlay_ip.to_string() },
            End { ns: lab.hosts[1].ns.clone(), ip: lab.hosts[1].underlay_ip.to_string() },
        )
    } else {
        let (x, y) = (lab.vm(0, 0), lab.vm(1, 0));
        (End { ns: x.ns.clone(), ip: x.ip.to_string() }, End { ns: y.ns.clone(), ip: y.ip.to_string() })
    };
    let subnet = if case == Case::Native { "10.77.0.0/24" } else { "10.88.0.0/16" };
    let mtu = case.endpoint_mtu(cond.mtu);
    let secs = opts.seconds;

    // Warm up: reachability, ARP, a short transfer.
    reach(&lab, &a, &b)?;
    iperf(&mut lab, &a, &b, 1, &[]).map_err(|x| format!("warm-up: {x}"))?;

    let mut out = Vec::new();
    if opts.wants("tcp1") {
        tcp1(&mut lab, &a, &b, secs, log, &mut out)?;
    }
    if opts.wants("tcp4") {
        let (g, st) = steady("tcp4", log, || iperf(&mut lab, &a, &b, secs, &["-P", "4"]))?;
        out.extend(stolen(vec![sample("tcp4_gbps", "Gbit/s", g.0)], st));
    }
    if opts.wants("udp") {
        let len = (mtu - 28).min(65_507).to_string();
        let (g, st) = steady("udp", log, || iperf(&mut lab, &a, &b, secs, &["-u", "-b", "0", "-l", &len]))?;
        out.extend(stolen(vec![sample("udp_gbps", "Gbit/s", g.0)], st));
    }
    for size in [56u32, 1024, 8000].into_iter().filter(|_| opts.wants("ping")) {
        let ((avg, mdev, loss), st) = steady("ping", log, || ping_rtt(&lab, &a, &b, size, opts.pings))?;
        out.extend(stolen(
            vec![
                sample(format!("ping{size}_rtt_us"), "us", avg),
                sample(format!("ping{size}_mdev_us"), "us", mdev),
                sample(format!("ping{size}_loss_pct"), "%", loss),
            ],
            st,
        ));
    }
    for (proto, metric) in
        [("--tcp", "rr_tcp_p50_us"), ("", "rr_udp_p50_us")].into_iter().filter(|_| opts.wants("rr"))
    {
        let (p50, st) = steady(metric, log, || sockperf(&mut lab, &a, &b, proto, secs))?;
        out.extend(stolen(vec![sample(metric, "us", p50)], st));
    }
    if opts.wants("mpi") {
        let (m, st) = steady("mpi", log, || mpi(&lab, &a, &b, subnet, opts, false))?;
        out.extend(stolen(m, st));
        // The same 0-byte ping-pong with ranks that yield the CPU while they
        // wait (Open MPI's setting for more threads than cores: here two
        // hosts' overlays and two ranks share the machine's CPUs).
        let (m, st) = steady("mpi-yield", log, || mpi(&lab, &a, &b, subnet, opts, true))?;
        let lat0 = m.into_iter().filter(|s| s.metric == "mpi_lat_0B_us");
        out.extend(stolen(lat0.map(|s| sample("mpi_yield_lat_0B_us", "us", s.value)).collect(), st));
    }
    monitors.finish()?;
    if opts.wants("many") {
        drop(lab);
        out.extend(many(case, cond, opts, log)?);
    }
    Ok(out)
}

/// VMs per host in the many-flows measurement, and TCP streams per pair.
pub const MANY_VMS: usize = 4;
const MANY_STREAMS: usize = 2;

/// Many flows and VMs: `MANY_VMS` VMs on each host, VM k on host 0 sending
/// to VM k on host 1 with `MANY_STREAMS` TCP streams each, all at once
/// (native: as many iperf3 pairs between the hosts): the aggregate
/// Gbit/s, and the machine's CPU time per GB moved.
fn many(case: Case, cond: &Condition, opts: &Opts, log: &mut StealLog) -> crate::Result<Vec<Sample>> {
    let mut lab =
        lab_for(case, cond, MANY_VMS, opts).map_err(|e| format!("lab ({MANY_VMS} VMs per host): {e}"))?;
    let monitors = Monitors::start(case, &lab)?;
    let end = |h: usize, v: usize| {
        if case == Case::Native {
            End { ns: lab.hosts[h].ns.clone(), ip: lab.hosts[h].underlay_ip.to_string() }
        } else {
            let vm = lab.vm(h, v);
            End { ns: vm.ns.clone(), ip: vm.ip.to_string() }
        }
    };
    // Native has one address per host: its pairs differ by port.
    let pairs: Vec<(End, End, String)> =
        (0..MANY_VMS).map(|v| (end(0, v), end(1, v), (5201 + v).to_string())).collect();
    for (a, b, _) in &pairs {
        reach(&lab, a, b)?;
    }
    let secs = opts.seconds.to_string();
    let streams = MANY_STREAMS.to_string();
    let ((gbps, bytes, cpu_s), st) = steady("many", log, || {
        for (_, b, port) in &pairs {
            lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip, "-p", port])?;
            lab.wait_listening(&b.ns, port.parse().unwrap_or(5201))?;
        }
        let t0 = cpu_ticks();
        let mut clients = Vec::new();
        for (a, b, port) in &pairs {
            let mut cmd = Command::new("ip");
            cmd.args([
                "netns", "exec", &a.ns, "iperf3", "-c", &b.ip, "-p", port, "-t", &secs, "-J", "-P", &streams,
            ]);
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null());
            clients.push(cmd.spawn().map_err(|e| format!("iperf3: {e}"))?);
        }
        let (mut bps, mut bytes) = (0.0, 0.0);
        let mut errs = Vec::new();
        for c in clients {
            let o = c.wait_with_output().map_err(|e| format!("iperf3: {e}"))?;
            match iperf_received(&o.stdout) {
                Ok((b, n)) => (bps, bytes) = (bps + b, bytes + n),
                Err(e) => errs.push(e.to_string()),
            }
        }
        let t1 = cpu_ticks();
        if !errs.is_empty() || bytes <= 0.0 {
            return Err(format!("iperf3, {MANY_VMS} pairs at once: {}", errs.join("; ")).into());
        }
        Ok((bps / 1e9, bytes, busy_seconds(t0, t1)))
    })?;
    monitors.finish()?;
    Ok(stolen(
        vec![sample("many_gbps", "Gbit/s", gbps), sample("many_cpu_s_per_gb", "s/GB", cpu_s / (bytes / 1e9))],
        st,
    ))
}

/// TCP, one stream, with the machine's CPU time per GB moved.
fn tcp1(
    lab: &mut Lab,
    a: &End,
    b: &End,
    secs: u32,
    log: &mut StealLog,
    out: &mut Vec<Sample>,
) -> crate::Result<()> {
    let ((gbps, bytes, cpu_s), st) = steady("tcp1", log, || {
        let t0 = cpu_ticks();
        let (gbps, bytes) = iperf(lab, a, b, secs, &[])?;
        Ok((gbps, bytes, busy_seconds(t0, cpu_ticks())))
    })?;
    let mut first = vec![sample("tcp1_gbps", "Gbit/s", gbps)];
    if bytes > 0.0 {
        first.push(sample("cpu_s_per_gb", "s/GB", cpu_s / (bytes / 1e9)));
    }
    out.extend(stolen(first, st));
    Ok(())
}

/// iperf3 from `a` to `b`: (Gbit/s received, bytes received).
fn iperf(lab: &mut Lab, a: &End, b: &End, secs: u32, extra: &[&str]) -> crate::Result<(f64, f64)> {
    lab.spawn(&b.ns, &["iperf3", "-s", "-1", "-B", &b.ip])?;
    lab.wait_listening(&b.ns, 5201)?;
    let s = secs.to_string();
    let mut args = vec!["iperf3", "-c", b.ip.as_str(), "-t", &s, "-J"];
    args.extend_from_slice(extra);
    let o = lab.ns_output(&a.ns, &args)?;
    let (bps, bytes) = iperf_received(&o.stdout).map_err(|e| format!("iperf3 {extra:?}: {e}"))?;
    if bps <= 0.0 {
        return Err(format!("iperf3 {extra:?} moved nothing").into());
    }
    Ok((bps / 1e9, bytes))
}

/// What an iperf3 client's JSON report (`-J`) says the receiver got: (bits
/// per second, bytes), or the error it reports.
fn iperf_received(json: &[u8]) -> crate::Result<(f64, f64)> {
    let v: Value = serde_json::from_slice(json).map_err(|x| x.to_string())?;
    if let Some(err) = v.get("error") {
        return Err(err.to_string().into());
    }
    let r = &v["end"]["sum_received"];
    Ok((r["bits_per_second"].as_f64().unwrap_or(0.0), r["bytes"].as_f64().unwrap_or(0.0)))
}

/// Busy CPU seconds between two [`cpu_ticks`] readings.
fn busy_seconds(t0: (u64, u64, u64), t1: (u64, u64, u64)) -> f64 {
    let hz = 100.0; // USER_HZ on Linux
    t1.0.saturating_sub(t0.0) as f64 / hz
}

/// Most pings a measurement may lose: beyond it the RTT of the few that
/// came back is no figure (the measurement fails, and says why).
const PING_LOSS_MAX_PCT: f64 = 2.0;

/// `count` pings 10 ms apart: (avg, mdev) in microseconds, and the loss in
/// percent.
fn ping_rtt(lab: &Lab, a: &End, b: &End, size: u32, count: u32) -> crate::Result<(f64, f64, f64)> {
    let (s, c) = (size.to_string(), count.to_string());
    let o = lab.ns_output(&a.ns, &["ping", "-n", "-q", "-c", &c, "-i", "0.01", "-s", &s, &b.ip])?;
    let text = String::from_utf8_lossy(&o.stdout);
    let loss = crate::PingResult::parse(&text);
    let loss =
        if loss.sent == 0 { 100.0 } else { (loss.sent - loss.received) as f64 * 100.0 / loss.sent as f64 };
    if loss > PING_LOSS_MAX_PCT {
        return Err(
            format!("ping -s {size}: {loss:.1} % lost (at most {PING_LOSS_MAX_PCT} % makes an RTT)").into()
        );
    }
    let line = text.lines().find(|l| l.starts_with("rtt")).ok_or(format!("ping -s {size}: no replies"))?;
    let (avg, mdev) = parse_rtt(line).ok_or_else(|| format!("ping -s {size}: cannot read `{line}`"))?;
    Ok((avg, mdev, loss))
}

/// Reads `rtt min/avg/max/mdev = a/b/c/d ms[, pipe N]` as (avg, mdev) in
/// microseconds.
fn parse_rtt(line: &str) -> Option<(f64, f64)> {
    let nums: Vec<f64> = line
        .split('=')
        .nth(1)?
        .split(" ms")
        .next()?
        .trim()
        .split('/')
        .filter_map(|x| x.trim().parse().ok())
        .collect();
    match nums.as_slice() {
        [_, avg, _, mdev] => Some((avg * 1000.0, mdev * 1000.0)),
        _ => None,
    }
}

/// sockperf ping-pong (full round trip), median in microseconds.
fn sockperf(lab: &mut Lab, a: &End, b: &End, proto: &str, secs: u32) -> crate::Result<f64> {
    let port = "11111";
    let mut srv = vec!["sockperf", "sr", "-i", b.ip.as_str(), "-p", port];
    if !proto.is_empty() {
        srv.push(proto);
    }
    lab.spawn(&b.ns, &srv)?;
    if !proto.is_empty() {
        lab.wait_listening(&b.ns, 11111)?;
    } else {
        std::thread::sleep(Duration::from_millis(300));
    }
    let s = secs.to_string();
    let mut cli = vec!["sockperf", "pp", "-i", b.ip.as_str(), "-p", port, "-t", &s, "--full-rtt"];
    if !proto.is_empty() {
        cli.push(proto);
    }
    let o = lab.ns_output(&a.ns, &cli)?;
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    text.lines()
        .find(|l| l.contains("percentile 50.000"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|x| x.trim().parse().ok())
        .ok_or_else(|| {
            format!("sockperf {proto}: no median in output: {}", text.chars().take(400).collect::<String>())
                .into()
        })
}

/// The MPI ping-pong between one rank in each endpoint, over Open MPI's TCP
/// transport.
fn mpi(
    lab: &Lab,
    a: &End,
    b: &End,
    subnet: &str,
    opts: &Opts,
    yield_idle: bool,
) -> crate::Result<Vec<Sample>> {
    let hosts = format!("{},{}", a.ip, b.ip);
    let max = if yield_idle { "1".to_string() } else { opts.mpi_max.to_string() };
    let scale = opts.mpi_scale.to_string();
    let agent = opts.rsh_agent.to_string_lossy().to_string();
    let bin = opts.mpi_bin.to_string_lossy().to_string();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &a.ns, "timeout", "300", "mpirun", "-np", "2", "--host", &hosts])
        .args(["--bind-to", "none", "--mca", "plm_rsh_agent", &agent, "--mca", "btl", "tcp,self"])
        .args([
            "--mca",
            "pml",
            "ob1",
            "--mca",
            "btl_tcp_if_include",
            subnet,
            "--mca",
            "oob_tcp_if_include",
            subnet,
            "--mca",
            "mpi_yield_when_idle",
            if yield_idle { "1" } else { "0" },
        ])
        .args([&bin, &max, &scale])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("VNET_LAB_PREFIX", &lab.prefix);
    let o = crate::run_group(cmd).map_err(|e| format!("mpirun: {e}"))?;
    let text = String::from_utf8_lossy(&o.stdout);
    let mut out = Vec::new();
    let mut peak: f64 = 0.0;
    for line in text.lines() {
        let f: Vec<f64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if let [size, lat, bw] = f[..] {
            out.push(sample(format!("mpi_lat_{}B_us", size as u64), "us", lat));
            peak = peak.max(bw);
        }
    }
    if out.is_empty() || !o.status.success() {
        return Err(format!(
            "mpirun failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).chars().take(600).collect::<String>()
        )
        .into());
    }
    out.push(sample("mpi_bw_peak_mbs", "MB/s", peak));
    Ok(out)
}

/// Where the repository is, from this binary's place in `target/`.
pub fn repo_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| {
            p.ancestors().find(|a| a.join("bench").join("plot.py").is_file()).map(Path::to_path_buf)
        })
        .unwrap_or_else(|| PathBuf::from("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ping_rtt_lines() {
        let r = parse_rtt("rtt min/avg/max/mdev = 0.137/0.915/18.716/1.818 ms, pipe 2").unwrap();
        assert!((r.0 - 915.0).abs() < 1e-6 && (r.1 - 1818.0).abs() < 1e-6);
        assert_eq!(parse_rtt("rtt min/avg/max/mdev = 0.1/0.2/0.3/0.5 ms"), Some((200.0, 500.0)));
        assert_eq!(parse_rtt("rtt garbage"), None);
    }

    #[test]
    fn steal_is_a_share_of_all_cpu_time_and_survives_a_counter_reset() {
        assert_eq!(steal_pct((0, 100, 1000), (0, 150, 2000)), 5.0);
        assert_eq!(steal_pct((0, 100, 1000), (0, 90, 1000)), 0.0);
        let s = stolen(vec![sample("a", "us", 1.0), sample("b", "us", 2.0)], 7.5);
        assert!(s.iter().all(|x| x.steal_pct == 7.5));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
    }

    #[test]
    fn report_gives_ratios_to_native_and_marks_failures() {
        let row = |case: &str, metric: &str, unit: &str, samples: &[f64]| {
            json!({"case": case, "mtu": 1500, "shaped": null, "metric": metric, "unit": unit,
                   "samples": samples, "median": median(samples)})
        };
        // Repeats 2 and 3, native's only repeat 1: nothing to pair.
        let mut unpaired = row("vxlan", "udp_gbps", "Gbit/s", &[5.0, 5.0]);
        unpaired["sample_repeats"] = json!([2, 3]);
        let doc = json!({
            "date": "d", "machine": "m", "kernel": "k", "command": "c", "repeats": 3, "seconds": 5,
            "steal_pct_median": 1.0, "congestion_control": "bbr", "notes": [],
            "failures": [{"case": "vnet-user-raw", "mtu": 1500, "shaped": null, "repeat": 2, "error": "boom"}],
            "results": [
                row("native", "tcp1_gbps", "Gbit/s", &[20.0, 22.0, 21.0]),
                row("vxlan", "tcp1_gbps", "Gbit/s", &[10.0, 10.5, 11.0]),
                row("vnet-user-raw", "tcp1_gbps", "Gbit/s", &[8.0, 8.4]),
                row("native", "udp_gbps", "Gbit/s", &[10.0]),
                unpaired,
            ],
        });
        let mut doc = doc;
        crate::noise::annotate(&mut doc);
        let md = markdown(&doc);
        assert!(
            md.contains(
                "| tcp1_gbps (Gbit/s) | ±5% / ±5% | 21.00 (1.00x) [20.0-22.0] | 10.50 (0.50x) [10.0-11.0] |"
            ),
            "{md}"
        );
        assert!(md.contains("vnet-user-raw mtu 1500 unshaped repeat 2: boom"), "{md}");
        // Fewer repeats than the run's: marked ‡; a ratio that could only be
        // one of medians (native's repeat 1 pairs with none of 2 and 3): †.
        assert!(md.contains("| 8.20‡ (0.39x) [8.0-8.4] |"), "{md}");
        assert!(md.contains("| 10.00‡ (1.00x) | 5.00‡ (0.50x†) [5.0-5.0] |"), "{md}");
        assert!(md.contains("did not go idle: not recorded"), "{md}");
    }
}
