//! Live migration of a lab guest (QEMU, TCG, on a TAP or on a vhost-user
//! socket vnetd serves) from one host to another, as libvirt drives it: the destination's QEMU started with
//! `-incoming`, the migration stream over the lab's underlay, the source
//! stopped once it completes; and what vnet needs around it:
//!
//! 1. before: the destination attaches the guest's TAP, or serves a
//!    vhost-user socket for it, `standby` (what the libvirt hook does at
//!    `migrate`): nothing is routed to it and, in cluster mode, its MAC is
//!    not claimed while the guest still runs on the source;
//! 2. at the switch-over the guest's first frame on the destination (the
//!    announcement QEMU sends for a TAP, the guest itself for vhost-user,
//!    told by QEMU: `VIRTIO_NET_F_GUEST_ANNOUNCE`) activates the interface
//!    there: routed, claimed in cluster mode (every host reroutes from its
//!    watch), announced;
//! 3. static mode has no store to tell the other hosts: a `vnetctl move
//!    ... wait` started with the migration waits for the activation and
//!    reroutes them;
//! 4. after: the source's interface is detached (libvirt's `release` hook).
//!
//! QEMU is driven over QMP (a line of JSON per message) on a socket in the
//! lab's directory. For a vhost-user guest the source's vnetd logs the
//! guest pages it writes while QEMU copies them (`VHOST_F_LOG_ALL`,
//! `vnet_virtio::log`); what it logged is read before the source goes.

use crate::{bin, io, Error, Guest, Host, Lab, Result, Vm};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::process::Output;
use std::process::Stdio;
use std::time::Duration;
use std::time::Instant;
use vnet_control::request::{Dev, DevName, Interface, Name, Request, SocketPath};
use vnet_control::Datapath;

/// What a migration took.
#[derive(Debug, Clone, Default)]
pub struct Migration {
    /// QEMU's own figures: the source's stop-and-copy (`downtime`) and the
    /// whole migration (`total-time`), in ms.
    pub downtime_ms: u64,
    pub total_ms: u64,
    /// The guest's pause as its two QEMUs saw it: from the source's `STOP`
    /// event to the destination's `RESUME` (µs): `downtime` and the
    /// destination's loading of the last pages.
    pub paused_us: Option<u64>,
    /// What the static-mode mover said (`None` in cluster mode).
    pub mover: Option<String>,
    /// The source's last `query-migrate` answer.
    pub query: String,
    /// A vhost-user guest: the writes the source's vnetd marked in QEMU's
    /// dirty log during the migration.
    pub logged_writes: Option<u64>,
}

/// A QMP connection: commands and their answers; events are kept with
/// their timestamps (µs of the host's clock), by name.
struct Qmp {
    rd: BufReader<UnixStream>,
    wr: UnixStream,
    events: Vec<(String, u64)>,
}

impl Qmp {
    /// Connects to `path` (waiting up to `wait` for QEMU to make it) and
    /// leaves capabilities negotiation.
    fn connect(path: &Path, wait: Duration) -> Result<Qmp> {
        let deadline = Instant::now() + wait;
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() > deadline => {
                    return Err(Error::Other(format!("QMP {}: {e}", path.display())))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(30))).map_err(io("QMP timeout"))?;
        let wr = s.try_clone().map_err(io("QMP socket"))?;
        let mut q = Qmp { rd: BufReader::new(s), wr, events: Vec::new() };
        q.read()?; // the greeting
        q.execute("qmp_capabilities", serde_json::json!({}))?;
        Ok(q)
    }

    fn read(&mut self) -> Result<serde_json::Value> {
        let mut line = String::new();
        if self.rd.read_line(&mut line).map_err(io("QMP read"))? == 0 {
            return Err(Error::Other("QMP: QEMU closed the socket".into()));
        }
        serde_json::from_str(&line).map_err(|e| Error::Other(format!("QMP: {e}: {line}")))
    }

    /// Runs `cmd` with `args`; its `return` value, or its error.
    fn execute(&mut self, cmd: &str, args: serde_json::Value) -> Result<serde_json::Value> {
        let msg = serde_json::json!({ "execute": cmd, "arguments": args });
        writeln!(self.wr, "{msg}").map_err(io("QMP write"))?;
        loop {
            let v = self.read()?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(Error::Other(format!("QMP {cmd}: {e}")));
            }
            if let Some(name) = v["event"].as_str() {
                let ts = &v["timestamp"];
                let us = ts["seconds"].as_u64().unwrap_or(0) * 1_000_000
                    + ts["microseconds"].as_u64().unwrap_or(0);
                self.events.push((name.to_string(), us));
            }
        }
    }

    /// Runs `cmd` every 20 ms until `done` says its answer is the last
    /// (or fails), for at most `within`; returns that answer.
    fn poll(
        &mut self,
        cmd: &str,
        within: Duration,
        done: impl Fn(&serde_json::Value) -> Result<bool>,
    ) -> Result<serde_json::Value> {
        let deadline = Instant::now() + within;
        loop {
            let v = self.execute(cmd, serde_json::json!({}))?;
            if done(&v)? {
                return Ok(v);
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!("QMP {cmd}: not done within {within:?}: {v}")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// When event `name` last came (µs), if it did.
    fn last(&self, name: &str) -> Option<u64> {
        self.events.iter().rev().find(|(n, _)| n == name).map(|(_, t)| *t)
    }
}

/// Replaces the argument after `flag` in `args` (QEMU's `-flag value`).
fn set_arg(args: &mut [String], flag: &str, value: String) {
    if let Some(i) = args.iter().position(|a| a == flag) {
        if let Some(v) = args.get_mut(i + 1) {
            *v = value;
        }
    }
}

/// The QMP socket of a guest's QEMU, from its arguments.
fn qmp_path(args: &[String]) -> Option<PathBuf> {
    let i = args.iter().position(|a| a == "-qmp")?;
    let spec = args.get(i + 1)?.strip_prefix("unix:")?;
    Some(PathBuf::from(spec.split(',').next()?))
}

impl Lab {
    /// Migrates host `from`'s QEMU guest (on a TAP) to host `to`, live:
    /// see the module's steps. In static mode (no cluster) a `vnetctl move
    /// ... wait` reroutes the other hosts once the guest arrived. Returns
    /// what it took; the guest is then its new host's last VM.
    pub fn migrate_guest(&mut self, from: usize, to: usize) -> Result<Migration> {
        let i = self
            .guests
            .iter()
            .position(|g| g.host == from)
            .ok_or_else(|| Error::Other(format!("host {from} has no QEMU guest")))?;
        let v = self.hosts[from].vms.iter().position(|vm| vm.console.is_some()).unwrap_or(0);
        let vm = self.hosts[from].vms[v].clone();
        let src = self.guests[i].clone();
        let (to_ns, to_ip) = (self.hosts[to].ns.clone(), self.hosts[to].underlay_ip);
        let mut args = src.args.clone();
        // 1. The destination's TAP or socket, attached standby.
        let (iface, vhost) = self.standby_at(to, &vm, &mut args)?;
        // The destination's QEMU: the same machine, waiting for the stream.
        let console = self.dir.join(format!("guest-h{to}-in.log"));
        let qmp = self.dir.join(format!("qmp-h{to}-in.sock"));
        set_arg(&mut args, "-serial", format!("file:{}", console.display()));
        set_arg(&mut args, "-qmp", format!("unix:{},server=on,wait=off", qmp.display()));
        let port = 4444;
        args.extend(["-incoming".to_string(), format!("tcp:{to_ip}:{port}")]);
        let _ = std::fs::remove_file(&console);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let pid = self.spawn_logged(&to_ns, &argv, &console.with_extension("qemu"))?;
        let mut dst = Qmp::connect(&qmp, Duration::from_secs(30))?;
        self.wait_listening(&to_ns, port)?;
        let src_qmp =
            qmp_path(&src.args).ok_or_else(|| Error::Other("the guest has no QMP socket".into()))?;
        let mut sq = Qmp::connect(&src_qmp, Duration::from_secs(5))?;
        // 3. Static mode: the mover waits for the arrival.
        let mover = if self.spec.cluster.is_none() { Some(self.mover(to, &vm, &iface)?) } else { None };
        // 2. The migration; the switch-over activates the interface.
        sq.execute("migrate-set-parameters", serde_json::json!({ "max-bandwidth": 1u64 << 30 }))?;
        sq.execute("migrate", serde_json::json!({ "uri": format!("tcp:{to_ip}:{port}") }))?;
        // A vhost-user guest: what the source's vnetd logged, read while it
        // migrates (in static mode the mover detaches the source's
        // interface once the guest arrived).
        let old = format!("vm{v}");
        let logged = std::cell::Cell::new(None);
        let done = sq.poll("query-migrate", Duration::from_secs(300), |q| {
            if vm.vhost.is_some() {
                if let Ok(n) = self.logged_writes(from, &old) {
                    logged.set(Some(n));
                }
            }
            match q["status"].as_str() {
                Some("completed") => Ok(true),
                Some("failed" | "cancelled") => Err(Error::Other(format!("the migration failed: {q}"))),
                _ => Ok(false),
            }
        })?;
        // The source completes when it has sent the last pages; the
        // destination runs once it has loaded them.
        dst.poll("query-status", Duration::from_secs(30), |s| Ok(s["status"] == "running"))?;
        let mut m = Migration {
            downtime_ms: done["downtime"].as_u64().unwrap_or(0),
            total_ms: done["total-time"].as_u64().unwrap_or(0),
            mover: None,
            query: done.to_string(),
            paused_us: sq
                .last("STOP")
                .zip(dst.last("RESUME"))
                .map(|(stop, resume)| resume.saturating_sub(stop)),
            logged_writes: logged.get(),
        };
        if let Some(t) = mover {
            let out = t
                .join()
                .map_err(|_| Error::Other("the mover panicked".into()))?
                .map_err(io("running vnetctl move"))?;
            let said =
                String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
            if !out.status.success() {
                return Err(Error::Other(format!(
                    "vnetctl move: {said}\n{}",
                    self.migration_report(to, &src, &console)
                )));
            }
            m.mover = Some(said);
        }
        // 4. The source stops; its interface goes (unless the mover took it).
        if let Some(p) = src.pid {
            self.kill_child(p);
        }
        let detach = Name::new(&old).map(Request::Detach).map_err(|e| Error::Other(format!("{old}: {e}")))?;
        let r = self.send(from, &detach)?;
        r.result.map_err(|e| Error::Other(format!("host {from}: detach {old}: {e}")))?;
        self.guests[i] =
            Guest { host: to, ns: to_ns.clone(), args, console: console.clone(), pid: Some(pid) };
        let moved = Vm { ns: to_ns, console: Some(console), vhost: vhost.or(vm.vhost), ..vm };
        self.hosts[from].vms.remove(v);
        self.hosts[to].vms.push(moved);
        Ok(m)
    }

    /// Step 1 of a migration to host `to`: the guest's TAP, or a vhost-user
    /// socket vnetd serves (`args`, the destination QEMU's, then name it),
    /// attached `standby` as `vmig`. Returns the interface as declared
    /// (not standby) and the socket.
    fn standby_at(
        &mut self,
        to: usize,
        vm: &Vm,
        args: &mut [String],
    ) -> Result<(Interface, Option<PathBuf>)> {
        let typed = |e: vnet_control::request::Invalid| Error::Other(format!("the migrating interface: {e}"));
        let name = Name::new("vmig").map_err(typed)?;
        let vhost = vm.vhost.as_ref().map(|_| self.dir.join(format!("vhost-h{to}-in.sock")));
        let mut i = match &vhost {
            Some(sock) => {
                let chardev = format!("socket,id=chr0,path={},reconnect=1", sock.display());
                set_arg(args, "-chardev", chardev);
                let path = SocketPath::new(&sock.display().to_string()).map_err(typed)?;
                let mut i = Interface::new(name, Dev::VhostUser(path));
                i.queues = self.spec.qemu_queues.max(1);
                // vhost-user is the user path's, whatever the pass.
                i.datapath = Datapath::User;
                i
            }
            None => {
                self.guest_tap(&self.hosts[to].ns)?;
                let mut i = Interface::new(name, Dev::Netdev(DevName::new("q0").map_err(typed)?));
                i.datapath = crate::config::modes(&self.spec)?.1;
                i
            }
        };
        i.mac = Some(vm.mac.parse().map_err(|_| Error::Other(format!("a lab MAC `{}`", vm.mac)))?);
        let attach = Request::attach(Interface { standby: true, ..i.clone() }).map_err(typed)?;
        let r = self.send(to, &attach)?;
        r.result.map_err(|e| Error::Other(format!("host {to}: attach standby: {e}")))?;
        Ok((i, vhost))
    }

    /// Static mode's `vnetctl move ... wait`, started: it waits for the
    /// guest's arrival on host `to` (as interface `i`), then reroutes the
    /// other hosts.
    fn mover(
        &self,
        to: usize,
        vm: &Vm,
        i: &Interface,
    ) -> Result<std::thread::JoinHandle<std::io::Result<Output>>> {
        let ep = |h: &Host| format!("unix:{}", h.control.display());
        let hosts: Vec<String> = self.hosts.iter().map(ep).collect();
        let mut cmd = Command::new(bin("vnetctl")?);
        cmd.args(["move", &vm.mac, "to", &ep(&self.hosts[to]), "hosts", &hosts.join(","), "wait", "300"]);
        // The declaration's words, as the typed request writes them.
        cmd.args(Request::Declare(i.clone()).line().split_whitespace());
        Ok(std::thread::spawn(move || cmd.stdin(Stdio::null()).output()))
    }

    /// What a failed migration leaves to read: the destination's
    /// interfaces, both QEMUs' output and the destination guest's console.
    fn migration_report(&self, to: usize, src: &Guest, console: &Path) -> String {
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| format!("({e})"));
        let ifaces = self.control(to, "show interfaces json").map(|r| r.body).unwrap_or_default();
        format!(
            "host {to}'s interfaces: {ifaces}\nthe source QEMU said: {}\nthe destination QEMU said: {}\nthe destination console: {}",
            read(&src.console.with_extension("qemu")),
            read(&console.with_extension("qemu")),
            read(console)
        )
    }

    /// The writes host `h`'s vnetd marked in QEMU's dirty log for its
    /// vhost-user interface `name` (`show interfaces`).
    fn logged_writes(&self, h: usize, name: &str) -> Result<u64> {
        let r = self.control(h, "show interfaces json")?;
        r.result.map_err(|e| Error::Other(format!("host {h}: show interfaces: {e}")))?;
        let v: serde_json::Value =
            serde_json::from_str(&r.body).map_err(|e| Error::Other(format!("show interfaces json: {e}")))?;
        v["interfaces"]
            .as_array()
            .and_then(|a| a.iter().find(|i| i["name"] == name))
            .and_then(|i| i["vhost_logged_writes"].as_u64())
            .ok_or_else(|| Error::Other(format!("host {h}: no vhost_logged_writes for {name}: {v}")))
    }
}
