//! How vnetd runs, whatever it is told to forward: the daemon's settings,
//! one struct, as `vnetd`'s flags say them (clap derive: the binary
//! flattens them into its command line) and as [`crate::Daemon::new`]
//! takes them. The control language says what to forward; these say with
//! what (CPUs, sockets, the host key, the state directory, the kernel
//! path's maps).

use crate::keys::FileError;
use std::path::PathBuf;

/// The daemon's settings (`vnetd --help` lists them with the rest).
#[derive(Debug, Clone, clap::Args)]
pub struct Settings {
    /// Run the data-path workers on these CPUs: worker k (queue k of every
    /// interface; worker 0 also receives the links) on the k-th CPU of the
    /// list, wrapping around, e.g. `--worker-cpus 1` or `--worker-cpus 0,1`.
    #[arg(long, value_delimiter = ',')]
    pub worker_cpus: Vec<usize>,
    /// Sockets on each link listening port (`listen`, `listen vxlan`): a
    /// `SO_REUSEPORT` group among which the kernel spreads peers' flows, each
    /// socket read by its own worker. 0: one per CPU of `--worker-cpus`, or
    /// one per two CPUs this process may run on (at least 1, at most 8).
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=8))]
    pub link_readers: u16,
    /// This host's private key (`vnetctl genkey FILE` makes it, mode 0600), for
    /// links with `peer-key` (authenticated or encrypted).
    #[arg(long, value_name = "FILE")]
    pub key: Option<std::path::PathBuf>,
    /// Where vnetd keeps what must outlive a restart: each peer's last
    /// handshake timestamp (file `handshakes`), so an initiation replayed
    /// after a restart is refused, and the interfaces `attach` made (file
    /// `attached`: CNI containers, libvirt VMs), attached again at the
    /// start. Made 0700 if missing; one per vnetd.
    #[arg(long, default_value = "/var/lib/vnet", value_name = "DIR")]
    pub state_dir: std::path::PathBuf,
    /// Entries the kernel path's route maps hold: its destination map (one
    /// entry per MAC routed whatever the source, per network) and each of
    /// its two (port, destination, source) tables. Decisions past it take
    /// the user path, counted as kernel_route_overflow. Kernel memory is
    /// taken as entries are written (about 100 bytes each), not up front.
    #[arg(long, default_value_t = 262_144, value_name = "N", value_parser = clap::value_parser!(u32).range(1024..=16_777_216))]
    pub kernel_routes: u32,
    /// A bpffs directory where a hand-over (SIGUSR2: an upgrade, a restart
    /// that must not cut the VMs) pins the kernel path's programs so they
    /// keep forwarding until the next vnetd takes them over; one per vnetd.
    /// Default: /sys/fs/bpf/vnet/ and the --state-dir's last name.
    #[arg(long, value_name = "DIR")]
    pub bpf_dir: Option<std::path::PathBuf>,
    /// Secured links start a new session after this many seconds.
    #[arg(long, default_value_t = 120, value_name = "SECS")]
    pub rekey_after: u64,
    /// Relay between this host's secured peers: a link that names this
    /// host's key with `relay` sends through it while its peer is not
    /// reachable directly (both behind symmetric NATs). What passes is
    /// sealed end to end; this host cannot read or forge it
    /// (`docs/MULTISITE.md`).
    #[arg(long)]
    pub relay: bool,
    /// Read netdev and `direct` devices frame by frame instead of through
    /// a shared receive ring (as where the kernel refuses a ring).
    #[arg(long)]
    pub no_rx_ring: bool,
    /// The flow log (`--flow-log` and its settings).
    #[command(flatten)]
    pub flow_log: crate::flowlog::FlowLogArgs,
    /// Where `key` came from, for what a refusal says: the config's
    /// `cluster` line rather than `--key`.
    #[arg(skip)]
    pub key_from_config: bool,
}

/// Settings vnetd cannot start with (it exits with 2).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("--state-dir {0}")]
    StateDir(#[source] FileError),
    #[error("{flag} {source}")]
    Key { flag: &'static str, source: FileError },
    #[error("--worker-cpus: cpu {cpu} is not one this process may run on (allowed: {allowed})")]
    Cpu { cpu: usize, allowed: String },
    #[error("--flow-log {0}")]
    FlowLog(#[source] crate::flowlog::sink::SinkError),
}

impl Settings {
    /// The flag (or line) the host key came from.
    pub fn key_flag(&self) -> &'static str {
        if self.key_from_config {
            "the config's `cluster` line: key"
        } else {
            "--key"
        }
    }

    /// Whether the state directory is vnetd's own: what it holds (the
    /// hand-over socket, the attached interfaces, the handshakes'
    /// timestamps) is taken as vnetd's, so a directory others may write is
    /// refused. A directory not there yet is made later, 0700.
    pub fn check_state_dir(&self) -> Result<(), SettingsError> {
        match std::fs::metadata(&self.state_dir) {
            Ok(meta) => crate::keys::check_trusted(
                &meta,
                &self.state_dir.display().to_string(),
                "the state directory",
            )
            .map_err(SettingsError::StateDir),
            Err(_) => Ok(()),
        }
    }

    /// The worker CPUs, each one this process may run on.
    pub fn checked_cpus(&self) -> Result<&[usize], SettingsError> {
        if self.worker_cpus.is_empty() {
            return Ok(&[]);
        }
        let allowed = crate::sys::allowed_cpus().unwrap_or_default();
        if let Some(&cpu) = self.worker_cpus.iter().find(|c| !allowed.contains(c)) {
            let list: Vec<String> = allowed.iter().map(|c| c.to_string()).collect();
            return Err(SettingsError::Cpu { cpu, allowed: list.join(",") });
        }
        Ok(&self.worker_cpus)
    }

    /// Sockets on each link listening port: `--link-readers`, or one per
    /// CPU of `--worker-cpus`, or one per two CPUs this process may run on.
    pub fn readers(&self) -> usize {
        let mut cpus = self.worker_cpus.clone();
        cpus.sort_unstable();
        cpus.dedup();
        match (self.link_readers, cpus.len()) {
            (0, 0) => crate::link::udp::readers_wanted(),
            (0, n) => n,
            (n, _) => n as usize,
        }
    }

    /// Where a hand-over pins the kernel path's links: `--bpf-dir`, or
    /// /sys/fs/bpf/vnet/ and the state directory's last name.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpf_dir.clone().unwrap_or_else(|| {
            let name = self.state_dir.file_name().map_or("vnet".into(), |n| n.to_string_lossy().into_owned());
            std::path::Path::new("/sys/fs/bpf/vnet").join(name)
        })
    }
}
