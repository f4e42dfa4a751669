//! `vnet-lab scale`: a cluster of real vnetds in namespaces on one etcd
//! (TLS, signed: the lab's secured cluster), a few VMs each, and what it
//! costs (issue 50): the time to converge from a cold start, a new host's
//! time to be linked by every host, a move's time to reach every host's
//! routes, each vnetd's memory and CPU at rest, etcd's keys and write rate
//! at rest, and the ARP requests each host floods with and without the
//! VMs' addresses in their claims (`neigh`).

use crate::{Cluster, Lab, Result, Spec};
use std::time::{Duration, Instant};

/// What `vnet-lab scale` measures with.
#[derive(Debug, Clone)]
pub struct Opts {
    pub hosts: usize,
    pub vms: usize,
    /// Seconds of rest over which CPU and etcd's writes are counted.
    pub rest_s: u64,
    /// An open cluster (etcd over http, hosts without keys, records
    /// unsigned): its links are plain, on the kernel path. The secured
    /// cluster's links are all encrypted (a signed network secures every
    /// link), so on the user path: the kernel maps' figures need this.
    pub plain_links: bool,
}

/// The figures, one line each.
pub type Report = Vec<String>;

/// Polls `ok` every 100 ms for `within`; how long it took, or `None`.
fn until(within: Duration, mut ok: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if ok() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    None
}

/// Whether every host of `hosts` sees `n` live hosts and routes `routes` MACs.
fn converged(lab: &Lab, hosts: &[usize], n: usize, routes: u64) -> bool {
    hosts.iter().all(|&h| {
        lab.cluster_status(h).is_ok_and(|c| {
            c["hosts"].as_array().map_or(0, Vec::len) == n && c["routes"] == routes && c["store"] == "up"
        })
    })
}

/// A process's CPU ticks (user + system) and resident set (kB).
fn cpu_rss(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's closing parenthesis: utime is the 12th, stime the 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<u64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (ticks, rss)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Runs the measurement; the lab is removed when it returns.
pub fn run(o: &Opts) -> Result<Report> {
    let mut r = Report::new();
    let late = o.hosts - 1;
    let spec = Spec {
        hosts: o.hosts,
        vms_per_host: o.vms,
        veth_hosts: (0..o.hosts).collect(),
        cluster: Some(Cluster {
            ttl_s: 10,
            late: vec![late],
            open: o.plain_links,
            in_config: false,
            members: 1,
        }),
        ..Spec::default()
    };
    let t0 = Instant::now();
    let mut lab = Lab::up(spec)?;
    let up = t0.elapsed();
    let early: Vec<usize> = (0..late).collect();
    let routes = ((late - 1) * o.vms) as u64;
    let cold = until(Duration::from_secs(300), || converged(&lab, &early, late, routes));
    r.push(format!(
        "cold start: {} hosts x {} VMs: namespaces made and vnetds started one after another in {:.1} s; \
         every host linked to every other and routing every VM {}",
        late,
        o.vms,
        up.as_secs_f64(),
        cold.map_or("not within 300 s".into(), |d| format!(
            "{:.2} s after the last vnetd started",
            d.as_secs_f64()
        ))
    ));
    // A new host.
    let t = Instant::now();
    lab.start_vnetd(late)?;
    let started = t.elapsed();
    let all: Vec<usize> = (0..o.hosts).collect();
    let linked =
        until(Duration::from_secs(120), || converged(&lab, &all, o.hosts, ((o.hosts - 1) * o.vms) as u64));
    r.push(format!(
        "a new host: started in {:.2} s; linked and routed by all {} hosts (and routing all of theirs) {}",
        started.as_secs_f64(),
        o.hosts,
        linked.map_or("not within 120 s".into(), |d| format!("{:.2} s later", d.as_secs_f64()))
    ));
    // Where host 2's links run: a move reaches a host's kernel maps in
    // the transaction that publishes its route (vnetd writes the maps
    // before the route table), so on the kernel path the route's time is
    // the maps'.
    let links: serde_json::Value = lab
        .control(2, "show links json")
        .ok()
        .and_then(|r| serde_json::from_str(&r.body).ok())
        .unwrap_or_default();
    let on_kernel =
        links["links"].as_array().map_or(0, |l| l.iter().filter(|x| x["datapath"] == "kernel").count());
    let n_links = links["links"].as_array().map_or(0, Vec::len);
    let mut why: Vec<String> = links["links"]
        .as_array()
        .map(|l| l.iter().filter_map(|x| x["datapath_reason"].as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    why.sort();
    why.dedup();
    r.push(format!(
        "host 2's links on the kernel path: {on_kernel} of {n_links}{}",
        if why.is_empty() { String::new() } else { format!(" (the others: {})", why.join("; ")) }
    ));
    // A move.
    let mac = lab.vm(0, 0).mac.clone();
    let t = Instant::now();
    lab.relocate(0, 0, 1)?;
    let moved = t.elapsed();
    let seen = until(Duration::from_secs(60), || {
        (2..o.hosts).all(|h| lab.route_to(h, &mac).as_deref() == Some("link h1"))
    });
    r.push(format!(
        "a move (vnetctl move, host 0 to host 1): {:.2} s; every other host routes the MAC to host 1 {}",
        moved.as_secs_f64(),
        seen.map_or("not within 60 s".into(), |d| format!("{:.3} s after it returned", d.as_secs_f64()))
    ));
    rest(&lab, o, &mut r)?;
    let flooded_with_neigh = arp(&mut lab, o, &mut r)?;
    // A run where something did not happen in time, or where a question
    // was flooded although every address was known, fails.
    let wrong_path = o.plain_links && on_kernel != n_links;
    if r.iter().any(|l| l.contains("not within")) || flooded_with_neigh > 0 || wrong_path {
        return Err(crate::Error::Other(format!("scale: a figure is out of bounds:\n{}", r.join("\n"))));
    }
    Ok(r)
}

/// Memory and CPU of the vnetds, and etcd's keys and writes, at rest.
fn rest(lab: &Lab, o: &Opts, r: &mut Report) -> Result<()> {
    std::thread::sleep(Duration::from_secs(2));
    let pids: Vec<u32> = (0..o.hosts).filter_map(|h| lab.vnetd_pid(h)).collect();
    let before: Vec<(u64, u64)> = pids.iter().map(|&p| cpu_rss(p)).collect();
    let rev = |lab: &Lab| -> u64 {
        let out = lab.etcdctl(&["endpoint", "status", "-w", "json"]).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v[0]["Status"]["header"]["revision"].as_u64().unwrap_or(0)
    };
    let rev0 = rev(lab);
    std::thread::sleep(Duration::from_secs(o.rest_s));
    let rev1 = rev(lab);
    let after: Vec<(u64, u64)> = pids.iter().map(|&p| cpu_rss(p)).collect();
    // The kernel's USER_HZ (clock ticks of /proc/PID/stat): 100 on Linux.
    let hz = 100.0;
    let cpu: Vec<u64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| ((a.0 - b.0.min(a.0)) as f64 / hz / o.rest_s as f64 * 1e4) as u64)
        .collect();
    let rss: Vec<u64> = after.iter().map(|a| a.1).collect();
    r.push(format!(
        "at rest ({} s): each vnetd's RSS median {} kB (max {} kB), CPU median {:.2} % (max {:.2} %)",
        o.rest_s,
        median(rss.clone()),
        rss.iter().max().copied().unwrap_or(0),
        median(cpu.clone()) as f64 / 100.0,
        cpu.iter().max().copied().unwrap_or(0) as f64 / 100.0
    ));
    let keys = lab
        .etcdctl(&["get", "--prefix", "--keys-only", &format!("/vnet/{}/", lab.prefix)])
        .map(|o| o.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0);
    r.push(format!(
        "etcd: {keys} keys under the network's prefix; {} writes in {} s at rest ({:.2}/s)",
        rev1.saturating_sub(rev0),
        o.rest_s,
        rev1.saturating_sub(rev0) as f64 / o.rest_s as f64
    ));
    Ok(())
}

/// Every VM's ARP for one VM of each of 5 other hosts, cache flushed, with
/// and without the VMs' addresses in their claims: what each host floods.
/// Returns the questions flooded with every address known.
fn arp(lab: &mut Lab, o: &Opts, r: &mut Report) -> Result<u64> {
    let count = |lab: &Lab| -> (u64, u64) {
        (0..o.hosts).fold((0, 0), |(a, f), h| {
            let g = lab
                .control(h, "show stats json")
                .ok()
                .and_then(|c| serde_json::from_str::<serde_json::Value>(&c.body).ok());
            let g = g.map(|g| g["global"].clone()).unwrap_or_default();
            let n = |k: &str| g[k].as_u64().unwrap_or(0);
            (a + n("neigh_answered") + n("kernel_neigh_answered"), f + n("neigh_flooded"))
        })
    };
    let mut flooded = 0;
    for with in [false, true] {
        if with {
            for h in 0..o.hosts {
                let lines: String =
                    lab.hosts[h].vms.iter().map(|v| format!("neigh {} {}\n", v.ip, v.mac)).collect();
                lab.apply(h, &lines)?;
            }
            let want = (o.hosts * o.vms) as u64;
            until(Duration::from_secs(60), || {
                (0..o.hosts)
                    .all(|h| lab.cluster_status(h).is_ok_and(|c| c["neighbors"].as_u64() == Some(want)))
            });
        }
        let (a0, f0) = count(lab);
        let t = Instant::now();
        for h in 0..o.hosts {
            for v in &lab.hosts[h].vms {
                let _ = lab.ns_output(&v.ns, &["ip", "neigh", "flush", "all"]);
                for k in 1..=5 {
                    let peer = &lab.hosts[(h + k) % o.hosts].vms[0];
                    let _ = lab.ns_output(&v.ns, &["ping", "-c", "1", "-W", "1", &peer.ip.to_string()]);
                }
                // The kernel's ARP table is one for every namespace (1024
                // entries): what this VM learnt goes before the next asks.
                let _ = lab.ns_output(&v.ns, &["ip", "neigh", "flush", "all"]);
            }
        }
        let (a1, f1) = count(lab);
        let n = lab.hosts.iter().map(|h| h.vms.len()).sum::<usize>() * 5;
        r.push(format!(
            "ARP, neigh {}: {n} resolutions ({:.1} s): {} questions answered at the edge, {} flooded, each to {} hosts \
             ({} broadcast datagrams in all)",
            if with { "on (every VM's address in its claim)" } else { "off" },
            t.elapsed().as_secs_f64(),
            a1 - a0,
            f1 - f0,
            o.hosts - 1,
            (f1 - f0) * (o.hosts as u64 - 1)
        ));
        if with {
            flooded = f1 - f0;
        }
    }
    Ok(flooded)
}
