//! Flow logs (`vnetd --flow-log PATH|-`): every flow of a network with a
//! policy, allowed or denied, as one JSON line ([`record::Line`]) with the
//! rule that decided its first packet, its first and last second, and its
//! packets and bytes each way (docs/POLICY.md, "Flow logs").
//!
//! Where the records come from, on each data path:
//! - the user path: the engine's flow table counts each flow's packets in
//!   its slot's account (`vnet_core::policy::account`: atomics, no lock,
//!   no allocation per packet); a denied flow is counted in a small table
//!   of its own. [`FlowLog::sweep`], once a second, closes the accounts
//!   idle for `--flow-log-idle` seconds (or open for `--flow-log-active`,
//!   as NetFlow's active timeout) into records;
//! - the kernel path: the programs count a known flow's frames in their
//!   `flows` map (per CPU first, added to the map's entry at most once a
//!   second); [`kernel::Tracker`] scans it once a second, and a flow whose
//!   counts stopped growing is recorded, joined with the engine's account
//!   of its first packet (which the engine judged and handed over).
//!
//! Records are formatted by the sweep (a control-plane task, never a
//! worker) and go through a bounded queue to the writer thread, which
//! alone touches the file (or standard output); a full queue drops the
//! record and counts it (`flow_log_dropped`). Memory is bounded: the
//! accounts are the flow table's slots (65536) and the denied table's
//! ([`DENIED_SLOTS`]), the kernel's tracker holds at most the map's
//! entries; a flow past them is counted (`flow_log_overflow`) and not
//! logged. The file is capped: past `--flow-log-max-bytes` it is renamed
//! PATH.1 (the one before replaced) and begun again. The newest
//! [`HISTORY`] records are also kept, numbered, for `show flows` and
//! `vnetctl monitor flows`.

pub mod kernel;
pub mod record;
pub mod sink;

use crate::kernel::flows::{key_of, KernelFlows};
use record::Line;
use serde_json::{json, Value};
use sink::{Sink, SinkError, Target};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use vnet_control::flows::FlowsQuery;
use vnet_core::policy::flows::{IDLE_S, TCP_IDLE_S};
use vnet_core::policy::Flows;

/// Slots of the allowed flows' table with a flow log (the engine's usual size).
pub const FLOW_SLOTS: usize = 1 << 16;
/// Slots of the denied flows' table.
pub const DENIED_SLOTS: usize = 4096;
/// Records the queue to the writer holds.
pub const QUEUE: usize = 4096;
/// Records kept for `show flows` (as many as one reply lists).
pub const HISTORY: usize = vnet_control::flows::MAX_LAST as usize;

/// `vnetd`'s flow log flags.
#[derive(Debug, Clone, clap::Args)]
pub struct FlowLogArgs {
    /// Write a flow log: each allowed and denied flow of a network with a
    /// policy, with its rule, times, packets and bytes each way, as a JSON
    /// line, to PATH (appended; mode 0600) or to standard output (`-`).
    #[arg(long, value_name = "PATH|-")]
    pub flow_log: Option<Target>,
    /// The flow log's size cap: past it the file is renamed PATH.1
    /// (replacing the last) and begun again.
    #[arg(long, default_value_t = 100 << 20, value_name = "BYTES", requires = "flow_log")]
    pub flow_log_max_bytes: u64,
    /// A flow counted nothing for this many seconds is recorded (and a
    /// record begun afresh if it goes on).
    #[arg(long, default_value_t = 15, value_name = "SECS", requires = "flow_log",
          value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub flow_log_idle: u32,
    /// A flow that goes on is recorded every this many seconds.
    #[arg(long, default_value_t = 300, value_name = "SECS", requires = "flow_log",
          value_parser = clap::value_parser!(u32).range(1..=86400))]
    pub flow_log_active: u32,
}

/// The running flow log.
pub struct FlowLog {
    tx: SyncSender<Vec<u8>>,
    idle_s: u32,
    active_s: u32,
    tracker: Mutex<kernel::Tracker>,
    /// The newest records, each with its number, and the next number.
    history: Mutex<(VecDeque<Value>, u64)>,
    /// Records queued, dropped on a full queue, written, not written (an
    /// error of the file).
    pub queued: AtomicU64,
    pub dropped: AtomicU64,
    pub written: Arc<AtomicU64>,
    pub failed: Arc<AtomicU64>,
}

impl std::fmt::Debug for FlowLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowLog").field("idle_s", &self.idle_s).finish()
    }
}

fn flow_idle_ns(proto: u8) -> u64 {
    u64::from(if proto == vnet_wire::ip::PROTO_TCP { TCP_IDLE_S } else { IDLE_S }) * 1_000_000_000
}

impl FlowLog {
    /// The flow log `args` ask for, its target opened and its writer
    /// started (`None`: none asked for).
    pub fn start(args: &FlowLogArgs) -> Result<Option<Arc<FlowLog>>, SinkError> {
        let Some(target) = args.flow_log.clone() else { return Ok(None) };
        let mut sink = Sink::open(target, args.flow_log_max_bytes)?;
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let (written, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (w, f) = (written.clone(), failed.clone());
        let spawned = std::thread::Builder::new().name("vnet-flowlog".into()).spawn(move || {
            for line in rx {
                match sink.write(&line) {
                    Ok(()) => w.fetch_add(1, Relaxed),
                    Err(e) => {
                        if f.fetch_add(1, Relaxed) == 0 {
                            tracing::warn!("--flow-log: {e} (further errors only counted: flow_log_failed)");
                        }
                        0
                    }
                };
            }
        });
        spawned.map_err(SinkError::Write)?;
        Ok(Some(Arc::new(FlowLog { written, failed, ..FlowLog::feeding(tx, args) })))
    }

    /// A flow log that sends its lines to `tx`, with `args`' times.
    fn feeding(tx: SyncSender<Vec<u8>>, args: &FlowLogArgs) -> FlowLog {
        FlowLog {
            tx,
            idle_s: args.flow_log_idle,
            active_s: args.flow_log_active,
            tracker: Mutex::new(kernel::Tracker::new(crate::kernel::maps::shared::FLOW_ENTRIES as usize)),
            history: Mutex::new((VecDeque::with_capacity(HISTORY), 0)),
            queued: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            written: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// The engine's flow table for a flow log (its flows accounted).
    pub fn flows() -> Flows {
        Flows::logging(FLOW_SLOTS, DENIED_SLOTS)
    }

    fn send(&self, line: &Line) {
        match self.tx.try_send(line.to_json()) {
            Ok(()) => self.queued.fetch_add(1, Relaxed),
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => self.dropped.fetch_add(1, Relaxed),
        };
        if let (Ok(mut h), Ok(Value::Object(mut v))) = (self.history.lock(), serde_json::to_value(line)) {
            let (list, next) = &mut *h;
            v.insert("seq".into(), (*next).into());
            *next += 1;
            if list.len() == HISTORY {
                list.pop_front();
            }
            list.push_back(Value::Object(v));
        }
    }

    /// `show flows [N] [since SEQ] [json]`: the newest records (of those
    /// numbered SEQ on), as JSON (`{"flows": [...], "next": N}`) or text.
    pub fn show(&self, q: FlowsQuery) -> String {
        let h = self.history.lock().unwrap_or_else(|p| p.into_inner());
        let (list, next) = &*h;
        let from = |v: &&Value| q.since.is_none_or(|s| v["seq"].as_u64().is_some_and(|n| n >= s));
        let picked: Vec<&Value> = list.iter().filter(from).collect();
        let recs = &picked[picked.len().saturating_sub(q.last as usize)..];
        if q.json {
            return json!({ "flows": recs, "next": next, "enabled": true }).to_string();
        }
        recs.iter().map(|v| vnet_client::flows::entry_text(v) + "\n").collect()
    }

    /// One second's work: the engine's closed accounts of `flows` and,
    /// with the kernel path's `kernel` flows, its scan; at Unix second
    /// `wall_s` and CLOCK_MONOTONIC `mono_ns`.
    pub fn sweep(&self, flows: &Flows, kernel: Option<&KernelFlows>, wall_s: u64, mono_ns: u64) {
        let now = flows.now_s();
        let wall = |t: u32| wall_s.saturating_sub(u64::from(now.saturating_sub(t)));
        let mut held = Vec::new();
        flows.sweep(self.idle_s, self.active_s, &mut |r| {
            let line = Line::user(&r, wall);
            match key_of(&r.opened.key).filter(|_| r.mirrored && kernel.is_some()) {
                Some((k, fwd)) => held.push((k, fwd, line)),
                None => self.send(&line),
            }
        });
        let Some(kf) = kernel else { return };
        let counts = kf.scan(crate::kernel::maps::shared::FLOW_ENTRIES as usize);
        let Ok(mut t) = self.tracker.lock() else { return };
        for (k, fwd, line) in held {
            t.hold(k, fwd, line, wall_s);
        }
        let times = kernel::Timeouts { idle_s: self.idle_s, active_s: self.active_s, flow_idle_ns };
        let dead = t.scan(&counts, wall_s, mono_ns, times, &mut |l| self.send(&l));
        drop(t);
        for k in &dead {
            kf.remove(k);
        }
    }

    /// The flow log's counters, for `show stats` (and so the metrics).
    pub fn stats(&self, flows: &Flows) -> Value {
        let tracked = self.tracker.lock().map_or((0, 0), |t| (t.len(), t.overflow));
        json!({
            "flow_log_records": self.queued.load(Relaxed),
            "flow_log_written": self.written.load(Relaxed),
            "flow_log_dropped": self.dropped.load(Relaxed),
            "flow_log_failed": self.failed.load(Relaxed),
            "flow_log_overflow": flows.overflow() + tracked.1,
            "flow_log_kernel_tracked": tracked.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vnet_core::policy::account::{Dir, Opened};

    fn args(target: Option<Target>) -> FlowLogArgs {
        FlowLogArgs { flow_log: target, flow_log_max_bytes: 1 << 30, flow_log_idle: 1, flow_log_active: 60 }
    }

    #[test]
    fn a_full_queue_drops_records_and_counts_them_and_never_waits() {
        // A writer that does not read: the queue fills.
        let (tx, rx) = sync_channel(QUEUE);
        let log = FlowLog::feeding(tx, &args(None));
        let line = record::Line::of(&record::tests::key(), record::Path::User, true, None);
        let t0 = std::time::Instant::now();
        for _ in 0..(QUEUE + 100) {
            log.send(&line);
        }
        assert!(t0.elapsed() < std::time::Duration::from_secs(2), "never blocked");
        assert_eq!((log.queued.load(Relaxed), log.dropped.load(Relaxed)), (QUEUE as u64, 100));
        // The control: with room (one line read), the next record is queued.
        rx.recv().unwrap();
        log.send(&line);
        assert_eq!((log.queued.load(Relaxed), log.dropped.load(Relaxed)), (QUEUE as u64 + 1, 100));
        // Kept for `show flows`: the newest HISTORY, numbered.
        let v: Value =
            serde_json::from_str(&log.show(FlowsQuery { last: 2, since: None, json: true })).unwrap();
        assert_eq!(v["flows"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["next"], (QUEUE + 101) as u64);
        assert_eq!(v["flows"][1]["seq"], (QUEUE + 100) as u64);
        let since = FlowsQuery { last: 4096, since: Some((QUEUE + 100) as u64), json: false };
        assert_eq!(log.show(since).lines().count(), 1, "only those numbered SEQ on");
    }

    #[test]
    fn the_writer_writes_each_record_as_a_line_and_a_sweep_sends_closed_accounts() {
        let dir = std::env::temp_dir().join(format!("vnet-flowlog-q-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = FlowLog::start(&args(Some(Target::File(dir.join("f"))))).unwrap().unwrap();
        let flows = FlowLog::flows();
        flows.tick(1_000_000_000);
        let k = record::tests::key();
        let s = flows.insert(&k);
        flows.open(s, Opened { key: k, rule: None, allow: true });
        flows.count(s, Dir::Forward, 60);
        log.sweep(&flows, None, 1_800_000_000, 0);
        assert_eq!(log.queued.load(Relaxed), 0, "not idle yet");
        flows.tick(5_000_000_000);
        log.sweep(&flows, None, 1_800_000_004, 0);
        assert_eq!(log.queued.load(Relaxed), 1);
        wait(|| log.written.load(Relaxed) == 1);
        let text = std::fs::read_to_string(dir.join("f")).unwrap();
        let v: Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(
            (v["start"].as_u64(), v["bytes"].as_u64(), v["path"].as_str()),
            (Some(1_800_000_000), Some(60), Some("user"))
        );
        assert_eq!(log.stats(&flows)["flow_log_overflow"], 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn wait(mut ok: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !ok() {
            assert!(std::time::Instant::now() < deadline, "not within 20 s");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
