//! `vnetd`: the vnet host daemon. See the `vnetd` library for the design.

use clap::Parser;
use std::sync::{Arc, Mutex};
use vnetd::link::tcp::Tls;
use vnetd::{control, Daemon, Endpoint};

#[derive(Parser)]
#[command(version, about = "vnet host daemon: a layer-2 overlay for VMs and containers")]
struct Args {
    /// Config file in the vnet control language, applied at start;
    /// `vnetctl save` writes the running state back to it, and SIGHUP (or
    /// `vnetctl reload`) applies its changes.
    #[arg(long, short)]
    config: Option<std::path::PathBuf>,
    /// Control endpoint: unix:PATH or tcp:ADDR:PORT (tcp:PORT is loopback).
    #[arg(long, default_value = control::DEFAULT_ENDPOINT)]
    control: Endpoint,
    /// For a `tls:ADDR:PORT` control endpoint: this host's certificate, key
    /// and the CA whose certificates clients must present (PEM files).
    #[arg(long, value_delimiter = ',', num_args = 3, value_names = ["CERT", "KEY", "CA"])]
    control_tls: Vec<String>,
    /// For a `tcp:` control endpoint: the file of its token (made, mode
    /// 0600, if missing); a client's first line is `auth TOKEN`
    /// (`vnetctl --token FILE`).
    #[arg(long, value_name = "FILE")]
    control_token: Option<std::path::PathBuf>,
    /// For a `unix:` control endpoint: a group (name or id) whose members
    /// may use it besides root and vnetd's user (checked by SO_PEERCRED,
    /// the client's primary group).
    #[arg(long, value_name = "GROUP")]
    control_group: Option<String>,
    /// For a `tls:` control endpoint: the DNS name a client certificate
    /// must hold (so a certificate of the CA made for a host's links is
    /// not an administrator's).
    #[arg(long, value_name = "NAME")]
    control_client_name: Option<String>,
    /// Control endpoint: a connection idle this many seconds is closed.
    #[arg(long, default_value_t = control::IDLE_TIMEOUT.as_secs(), value_name = "SECS")]
    control_idle_timeout: u64,
    /// Serve Prometheus metrics (`GET /metrics`) and the read-only
    /// dashboard (`GET /`, its document `GET /api/state.json`) on PORT (of
    /// 127.0.0.1) or ADDR:PORT, e.g. 9108 or 10.0.0.1:9108.
    #[arg(long, value_parser = control::metrics_addr, value_name = "[ADDR:]PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// A hand-over outside systemd: how long this vnetd waits for the next
    /// one to take the user path's sockets and devices from
    /// STATE-DIR/handover (a supervisor starts the next vnetd once that
    /// socket exists); 0: it hands none over. Under systemd (with
    /// $NOTIFY_SOCKET) they go to its file descriptor store instead.
    #[arg(long, default_value_t = 5, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=60))]
    hand_over_wait: u64,
    /// Cluster mode: program links and routes from etcd (`docs/CLUSTER.md`),
    /// e.g. etcd:https://10.0.0.1:2379,https://10.0.0.2:2379 (with
    /// --etcd-ca; plain http:// is for loopback). Or a `cluster` line in
    /// the config file, with the same settings (not both).
    #[arg(long, value_name = "etcd:URL[,URL...]", requires = "network")]
    cluster: Option<String>,
    /// Cluster mode, https:// URLs: the CA of etcd's server certificate.
    #[arg(long, value_name = "FILE", requires = "cluster")]
    etcd_ca: Option<std::path::PathBuf>,
    /// Cluster mode, https:// URLs: this host's client certificate for
    /// etcd (`--client-cert-auth`), with --etcd-key.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    etcd_cert: Option<std::path::PathBuf>,
    /// The private key of --etcd-cert (owner only).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<std::path::PathBuf>,
    /// Cluster mode: the etcd user (etcd's auth; `docs/CLUSTER.md` has a
    /// role recipe), with --etcd-password-file. Over http:// only to
    /// loopback.
    #[arg(long, value_name = "NAME", requires = "etcd_password_file")]
    etcd_user: Option<String>,
    /// The file of --etcd-user's password (owner only).
    #[arg(long, value_name = "FILE", requires = "etcd_user")]
    etcd_password_file: Option<std::path::PathBuf>,
    /// Cluster mode: the network this host joins.
    #[arg(long, value_name = "NAME")]
    network: Option<String>,
    /// Cluster mode: this host's name (by default the system's host name).
    #[arg(long, value_name = "NAME")]
    host: Option<String>,
    /// Cluster mode: the underlay address and port other hosts send to (by
    /// default the `listen udp` address).
    #[arg(long, value_name = "ADDR:PORT")]
    advertise: Option<std::net::SocketAddr>,
    /// Cluster mode: a host that stops is gone from the others' links
    /// within this many seconds (its etcd lease is a second shorter).
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    cluster_ttl: u64,
    /// Cluster mode: words added to each link to another host, e.g.
    /// "network 7 mtu 9000" (the interfaces then need `network 7` too) or
    /// "security encrypt" (`format vnet` unless
    /// they name another format; `security auth|encrypt` refuses hosts
    /// without a key).
    #[arg(long, default_value = "", value_name = "WORDS")]
    cluster_link_options: String,
    /// Cluster mode: the network's public key (`vnetctl netkey`), base64 or
    /// a file holding it. Every host record must carry a certificate it
    /// signed and every MAC claim its host's signature; every link is
    /// secured (needs --key and --host-cert), unless
    /// --cluster-link-options says `security none` (plain links, which
    /// the kernel path forwards; records and claims are still checked).
    #[arg(long, value_name = "KEY|FILE", requires = "cluster")]
    network_key: Option<String>,
    /// Cluster mode: this host's certificate (`vnetctl sign`), published
    /// in its record for the others to check.
    #[arg(long, value_name = "FILE", requires = "network_key")]
    host_cert: Option<std::path::PathBuf>,
    /// Cluster mode in a Kubernetes pod (vnet's DaemonSet): enforce the
    /// cluster's NetworkPolicies on the cluster's network, watched as the
    /// pod's service account (pods, namespaces, networkpolicies: list and
    /// watch).
    #[arg(long, requires = "cluster")]
    kube_network_policy: bool,
    /// Cluster mode in a Kubernetes pod (vnet's DaemonSet): another host's
    /// claim counts only for a pod the API schedules to that host (its
    /// node's name is its --host), with the pod's addresses, in the
    /// groups of its labels (--kube-group-label); watched as the pod's
    /// service account (pods: list and watch). This host's interfaces'
    /// groups are not held to its certificate's.
    #[arg(long, requires = "cluster")]
    kube: bool,
    /// With --kube: a label key whose value, in the pod's namespace
    /// (`NAMESPACE.VALUE`), is one of the pod's groups, as vnet-cni's
    /// `groupLabels` under `groupScope: namespace` (repeat for several).
    #[arg(long, value_name = "KEY", requires = "kube")]
    kube_group_label: Vec<String>,
    /// How vnetd runs: its CPUs, sockets, key, state and kernel maps.
    #[command(flatten)]
    daemon: vnetd::Settings,
    /// Log filter, e.g. info or vnetd=debug.
    #[arg(long, default_value = "info", env = "VNETD_LOG")]
    log: String,
}

fn main() -> std::process::ExitCode {
    if let Some(code) = vnetd::docs::generate_if_asked(<Args as clap::CommandFactory>::command) {
        return code;
    }
    let args = Args::parse();
    // Everything vnetd makes (sockets, saved configs, tokens) is its own.
    vnetd::sys::set_umask(0o077);
    // Colours only for a person at a terminal: a log file or the journal
    // gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match start(&args) {
        Ok(ready) => run(&args, ready),
        Err(e) => {
            eprintln!("vnetd: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// What [`start`] made of the command line and the config file.
struct Ready {
    daemon: Daemon,
    control_tls: Option<Arc<Tls>>,
    access: control::Access,
    cluster: Option<vnetd::cluster::Config>,
    status: vnetd::membership::Shared,
}

/// Checks the command line and builds the daemon from it and the config
/// file. Every error here is the operator's (vnetd exits with 2).
fn start(args: &Args) -> Result<Ready, String> {
    if let Endpoint::Tcp(addr) = &args.control {
        control::check_tcp_endpoint(*addr).map_err(|e| format!("--control: {e}"))?;
    }
    let control_tls = control_tls(args)?;
    let access = control_access(args)?;
    if matches!(args.control, Endpoint::Tls(_)) && control_tls.is_none() {
        return Err(format!("--control {}: a tls: endpoint needs --control-tls CERT,KEY,CA", args.control));
    }
    let (mut daemon, claim_key) = daemon_from(args)?;
    let control_tls = control_tls.map(|(tls, files)| {
        daemon.set_control_tls(tls.clone(), files);
        tls
    });
    let cluster = cluster_config(args, &daemon, claim_key)?;
    // Signed: this host's interfaces may be only in the groups its
    // certificate allows (its claims naming others are quarantined). On
    // Kubernetes (--kube) a pod's groups are its labels', by the API.
    if let Some(c) = cluster.as_ref().filter(|_| !args.kube) {
        let cert = c.network_key.as_ref().zip(c.cert.as_deref()).and_then(|(nk, t)| nk.verify(t).ok());
        if let Some(cert) = cert {
            daemon
                .set_group_authority(c.link_options.network, cert.groups)
                .map_err(|e| format!("--host-cert: the config's interfaces: {e}"))?;
        }
    }
    daemon.fix_cluster_line();
    let status = vnetd::membership::Shared::default();
    if cluster.is_some() {
        daemon.set_cluster(status.clone());
    }
    Ok(Ready { daemon, control_tls, access, cluster, status })
}

/// `--control-tls CERT,KEY,CA`: the control endpoint's TLS identity.
fn control_tls(args: &Args) -> Result<Option<(Arc<Tls>, vnet_control::TlsFiles)>, String> {
    match args.control_tls.as_slice() {
        [] => Ok(None),
        [cert, key, ca] => {
            let files = vnet_control::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() };
            let t = Tls::load(&files).map_err(|e| format!("--control-tls: {e}"))?;
            Ok(Some((Arc::new(t), files)))
        }
        _ => Err("--control-tls takes CERT,KEY,CA".into()),
    }
}

/// The daemon the flags and the config file declare (the host key, the
/// workers' CPUs, the config's transaction), and the host's claim key.
fn daemon_from(args: &Args) -> Result<(Daemon, Option<Arc<vnet_cluster::trust::ClaimKey>>), String> {
    // The host key: `--key`, or the config's `cluster` line's `key` (not both).
    let line = match &args.config {
        Some(path) => {
            std::fs::read_to_string(path).ok().and_then(|t| vnet_control::parse(&t).ok()).and_then(|cmds| {
                cmds.into_iter().find_map(|c| match c.item {
                    vnet_control::Command::Cluster(l) => Some(l.key.map(std::path::PathBuf::from)),
                    _ => None,
                })
            })
        }
        None => None,
    };
    let in_cluster = args.cluster.is_some() || line.is_some();
    let line_key = line.flatten();
    let mut settings = args.daemon.clone();
    match (&settings.key, line_key) {
        (Some(_), Some(_)) => {
            return Err("--key and the config's `cluster` line's `key`: give one".to_string())
        }
        (None, Some(k)) => (settings.key, settings.key_from_config) = (Some(k), true),
        _ => {}
    }
    let mut daemon = Daemon::new(&settings).map_err(|e| e.to_string())?;
    let claim_key = daemon.claim_key();
    if in_cluster {
        // A predecessor's pins forward until the store's routes are in.
        daemon.hold_pins();
    }
    // A hand-over's sockets and devices, before anything opens its own.
    match vnetd::handover::receive(&args.daemon.state_dir) {
        Ok((0, _)) => {}
        Ok((n, from)) => tracing::info!("hand-over: took {n} sockets and devices from {from}"),
        Err(e) => {
            tracing::warn!("hand-over: the previous vnetd's sockets and devices could not be taken ({e})")
        }
    }
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        vnet_control::parse(&text)
            .and_then(|cmds| daemon.apply(&cmds))
            .map_err(|e| e.in_file(path.display().to_string()).to_string())?;
        daemon.set_config_path(std::path::absolute(path).unwrap_or_else(|_| path.clone()));
    }
    // What `attach` made before a restart (CNI plugins, libvirt's hook).
    for said in daemon.restore_attached(&args.daemon.state_dir) {
        tracing::warn!("--state-dir {said}");
    }
    // (Held pins: the cluster's first convergence takes them over, then
    // drops the rest.)
    if !daemon.pins_held() {
        if let Some(said) = daemon.drop_unadopted_pins() {
            tracing::info!("{said}");
        }
    }
    let unused = vnetd::handover::close_unused();
    if !unused.is_empty() {
        tracing::info!("hand-over: closed what the configuration no longer uses: {}", unused.join(", "));
    }
    Ok((daemon, claim_key))
}

/// The exit status of a hand-over (EX_TEMPFAIL): the unit restarts on it
/// (`RestartForceExitStatus=75`).
const HAND_OVER_EXIT: u8 = 75;

/// Runs the daemon until SIGTERM or Ctrl-C (a stop: everything goes) or
/// SIGUSR2 (a hand-over: the kernel path's links are pinned first, and the
/// exit status asks the supervisor for the next vnetd): its background
/// tasks, cluster mode, and the control endpoint; then shuts it down.
fn run(args: &Args, ready: Ready) -> std::process::ExitCode {
    let Ready { daemon, control_tls, access, cluster, status } = ready;
    let daemon = Arc::new(Mutex::new(daemon));
    let hand_over = std::sync::atomic::AtomicBool::new(false);
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vnetd: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let served = rt.block_on(async {
        let shutdown = async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut usr2)) =
                (signal(SignalKind::terminate()), signal(SignalKind::user_defined2()))
            else {
                return std::future::pending().await;
            };
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
                _ = usr2.recv() => hand_over.store(true, std::sync::atomic::Ordering::Relaxed),
            }
        };
        spawn_background(&daemon, args.metrics);
        let mut limits =
            control::Limits::new(std::time::Duration::from_secs(args.control_idle_timeout.max(1)))
                .with_access(access);
        let control = args.control.to_string();
        let cluster_status = cluster.as_ref().map(|_| status.clone());
        if let Some(mut cfg) = cluster {
            if args.kube {
                let (tx, rx) = vnetd::kube_pods::channel();
                cfg.kube_pods = Some(rx);
                tokio::spawn(vnetd::kube_pods::run(args.kube_group_label.clone(), tx));
            }
            let (tx, rx) = vnetd::ipam::channel();
            if args.kube_network_policy {
                tokio::spawn(vnetd::netpol::run(daemon.clone(), cfg.link_options.network, tx.clone()));
            }
            limits = limits.with_ipam(tx);
            tokio::spawn(vnetd::cluster::run(cfg, daemon.clone(), status, Some(rx)));
        }
        tokio::spawn(say_ready(control, cluster_status));
        control::serve(&args.control, daemon.clone(), limits, control_tls, shutdown).await
    });
    finish(args, &daemon, served, hand_over.load(std::sync::atomic::Ordering::Relaxed))
}

/// After the control endpoint stopped: the daemon shut down, and on a
/// hand-over (`handing_over`) its kernel path pinned and its sockets and
/// devices (the control listener of `served` among them) offered to the
/// next vnetd; the exit status.
fn finish(
    args: &Args,
    daemon: &Mutex<Daemon>,
    served: std::io::Result<Option<(String, std::os::fd::OwnedFd)>>,
    handing_over: bool,
) -> std::process::ExitCode {
    let mut d = daemon.lock().unwrap_or_else(|p| p.into_inner());
    let mut handed = Vec::new();
    if handing_over {
        match d.hand_over() {
            Ok(n) => tracing::info!(
                "hand-over: {n} kernel-path links pinned; they forward until the next vnetd takes them over"
            ),
            Err(e) => tracing::error!(
                "hand-over: the kernel path could not be kept ({e}); it stops with this process"
            ),
        }
        handed = d.hand_over_fds();
    } else if let Some(m) = d.remove_pins() {
        tracing::info!("{m}");
    }
    d.shutdown();
    drop(d);
    let served = served.map(|listener| match listener {
        // The control listener goes with the rest: clients wait in its
        // queue, and no one can bind its address or path meanwhile.
        Some(l) if handing_over => handed.push(l),
        _ => {
            if let vnet_client::endpoint::Endpoint::Unix(path) = &args.control {
                let _ = std::fs::remove_file(path);
            }
        }
    });
    if handing_over {
        // The user path's sockets and devices: what arrives until the next
        // vnetd reads them waits in their queues.
        let n = handed.len();
        let wait = std::time::Duration::from_secs(args.hand_over_wait);
        match vnetd::handover::offer(&args.daemon.state_dir, handed, wait) {
            Ok(k) => tracing::info!(
                "hand-over: {k} of the user path's sockets and devices handed to the next vnetd"
            ),
            Err(e) => {
                tracing::warn!("hand-over: the user path's {n} sockets and devices were not taken ({e})")
            }
        }
    }
    match served {
        Ok(()) if handing_over => {
            tracing::info!("vnetd handed over (exit {HAND_OVER_EXIT}: the supervisor starts the next one)");
            std::process::ExitCode::from(HAND_OVER_EXIT)
        }
        Ok(()) => {
            tracing::info!("vnetd stopped");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vnetd: control endpoint {}: {e}", args.control);
            std::process::ExitCode::FAILURE
        }
    }
}

/// Says vnetd is ready (the log, and systemd's `READY=1`): at once in
/// static mode; in cluster mode once the store answered, or is out of reach
/// (the data path runs on and the task retries), and never while it refuses
/// this host for good (a password, a CA, a client certificate, a
/// permission): `show cluster` says why.
async fn say_ready(control: String, cluster: Option<vnetd::membership::Shared>) {
    use vnetd::membership::Health;
    if let Some(status) = cluster {
        // A refusal can first look like an outage (a client certificate
        // refused after the handshake closes the connection): an outage
        // makes vnetd ready only after it lasted this long.
        const OUTAGE: std::time::Duration = std::time::Duration::from_secs(3);
        let t0 = std::time::Instant::now();
        loop {
            let h = status.lock().unwrap_or_else(|p| p.into_inner()).health;
            if h == Health::Up || (h == Health::Down && t0.elapsed() >= OUTAGE) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
    tracing::info!(%control, "vnetd ready");
    vnetd::handover::notify("READY=1\nSTATUS=ready");
}

/// The daemon's background tasks: the links' timers, devices noticed gone,
/// the metrics endpoint, and SIGHUP's reload.
fn spawn_background(daemon: &Arc<Mutex<Daemon>>, metrics: Option<std::net::SocketAddr>) {
    // The links' timers: handshakes and rekeys of secured links.
    let shared = daemon.lock().unwrap_or_else(|p| p.into_inner()).shared();
    let timer = shared.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_millis(100));
        loop {
            every.tick().await;
            timer.tick();
        }
    });
    // Standby interfaces whose VM arrived (a live migration): activated.
    let (d, arrivals) = (daemon.clone(), shared.arrivals.clone());
    tokio::spawn(async move {
        loop {
            arrivals.notified().await;
            d.lock().unwrap_or_else(|p| p.into_inner()).activate_arrived();
        }
    });
    // Devices deleted under vnetd: noticed and reattached; idle pairs leave
    // the traffic matrix.
    let (d, sweep) = (daemon.clone(), shared.clone());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            every.tick().await;
            sweep.global.matrix.sweep();
            // The flow log's second: the engine's closed accounts, the
            // kernel path's scan (without the daemon's lock, and on a
            // blocking thread: a scan of a full flows map is many system
            // calls, which must not hold up this runtime's timers and
            // control endpoint).
            if sweep.flow_log.get().is_some() {
                let kernel = d.lock().unwrap_or_else(|p| p.into_inner()).kernel_flows();
                let s = sweep.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    let Some(log) = s.flow_log.get() else { return };
                    let (wall_s, mono) =
                        (vnetd::shared::wall_ns() / 1_000_000_000, vnetd::sys::bpf::monotonic_ns());
                    log.sweep(&s.plane.load().policy.flows, kernel.as_deref(), wall_s, mono);
                })
                .await;
            }
            let mut d = d.lock().unwrap_or_else(|p| p.into_inner());
            d.check_devices();
            if let Some(e) = d.save_handshakes() {
                tracing::warn!("--state-dir {e}");
            }
        }
    });
    if let Some(addr) = metrics {
        let d = daemon.clone();
        tokio::spawn(async move {
            if let Err(e) = vnetd::web::serve(addr, d).await {
                tracing::error!("metrics endpoint {addr}: {e}");
            }
        });
    }
    // SIGHUP: the config file's difference, as one transaction.
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        let d = daemon.clone();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match d.lock().unwrap_or_else(|p| p.into_inner()).reload() {
                    Ok(said) => tracing::info!("SIGHUP: {}", said.trim_end()),
                    Err(e) => tracing::error!("SIGHUP: nothing changed: {e}"),
                }
            }
        });
    }
}

/// Who may use the control endpoint: a `tcp:` one needs its token file.
fn control_access(args: &Args) -> Result<control::Access, String> {
    let token = match (&args.control, &args.control_token) {
        (Endpoint::Tcp(_), None) => {
            return Err(format!(
                "--control {}: a tcp: endpoint needs --control-token FILE (any local user could use it otherwise)",
                args.control
            ))
        }
        (_, Some(path)) => Some(control::load_token(path).map_err(|e| format!("--control-token {e}"))?),
        (_, None) => None,
    };
    let group = match &args.control_group {
        None => None,
        Some(g) => Some(vnetd::paths::group_id(g).map_err(|e| format!("--control-group: {e}"))?),
    };
    Ok(control::Access { group, token, client_name: args.control_client_name.clone() })
}

/// Cluster mode's settings: from the flags, or from the config file's
/// `cluster` line (never both).
struct ClusterSettings {
    store: String,
    auth: vnetd::cluster::StoreAuth,
    network: Option<String>,
    host: Option<String>,
    advertise: Option<std::net::SocketAddr>,
    ttl: u64,
    link_options: String,
    network_key: Option<String>,
    host_cert: Option<std::path::PathBuf>,
}

impl ClusterSettings {
    fn from_flags(args: &Args) -> Option<Self> {
        Some(ClusterSettings {
            store: args.cluster.clone()?,
            auth: vnetd::cluster::StoreAuth {
                ca: args.etcd_ca.clone(),
                cert: args.etcd_cert.clone(),
                key: args.etcd_key.clone(),
                user: args.etcd_user.clone(),
                password_file: args.etcd_password_file.clone(),
            },
            network: args.network.clone(),
            host: args.host.clone(),
            advertise: args.advertise,
            ttl: args.cluster_ttl,
            link_options: args.cluster_link_options.clone(),
            network_key: args.network_key.clone(),
            host_cert: args.host_cert.clone(),
        })
    }

    fn from_line(c: &vnet_control::ClusterLine, default_ttl: u64) -> Self {
        let path = |p: &Option<String>| p.as_ref().map(std::path::PathBuf::from);
        ClusterSettings {
            store: c.store.clone(),
            auth: vnetd::cluster::StoreAuth {
                ca: path(&c.etcd_ca),
                cert: path(&c.etcd_cert),
                key: path(&c.etcd_key),
                user: c.etcd_user.clone(),
                password_file: path(&c.etcd_password_file),
            },
            network: Some(c.network.clone()),
            host: c.host.clone(),
            advertise: c.advertise,
            ttl: c.ttl.unwrap_or(default_ttl),
            link_options: c.link.join(" "),
            network_key: c.network_key.clone(),
            host_cert: path(&c.host_cert),
        }
    }
}

/// Cluster mode's configuration, checked, when `--cluster` or a `cluster`
/// line is given.
fn cluster_config(
    args: &Args,
    daemon: &Daemon,
    claim_key: Option<Arc<vnet_cluster::trust::ClaimKey>>,
) -> Result<Option<vnetd::cluster::Config>, String> {
    let settings = match (ClusterSettings::from_flags(args), &daemon.state().cluster) {
        (Some(_), Some(_)) => {
            return Err("--cluster and the config's `cluster` line: give one (flags or the line)".into())
        }
        (Some(s), None) => s,
        (None, Some(line)) => ClusterSettings::from_line(line, args.cluster_ttl),
        (None, None) => return Ok(None),
    };
    let from_line = args.cluster.is_none();
    cluster_settings(settings, daemon, claim_key, args.daemon.relay, &args.daemon.state_dir)
        .map(Some)
        .map_err(|e| if from_line { format!("the config's `cluster` line: {e}") } else { e })
}

fn cluster_settings(
    args: ClusterSettings,
    daemon: &Daemon,
    claim_key: Option<Arc<vnet_cluster::trust::ClaimKey>>,
    relay_flag: bool,
    state_dir: &std::path::Path,
) -> Result<vnetd::cluster::Config, String> {
    let (store, warning) = vnetd::cluster::Store::load(&args.store, &args.auth).map_err(|e| e.to_string())?;
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    let network = args.network.clone().unwrap_or_default();
    vnetd::cluster::check_name("--network", &network).map_err(|e| e.to_string())?;
    let host = match &args.host {
        Some(h) => h.clone(),
        None => std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string(),
    };
    vnetd::cluster::check_name("--host", &host).map_err(|e| e.to_string())?;
    let addr = vnetd::cluster::advertised(args.advertise, daemon.state().listen)
        .map_err(|e| format!("--cluster: {e}"))?;
    let mut link_options = vnet_cluster::apply::LinkOptions::parse(&args.link_options)
        .map_err(|e| format!("--cluster-link-options: {e}"))?;
    if link_options.require_key() && daemon.public_key().is_none() {
        return Err("--cluster-link-options: secured links need this host's key (--key FILE)".into());
    }
    let (network_key, cert) = match &args.network_key {
        None => (None, None),
        Some(k) => {
            let (nk, cert) =
                vnetd::cluster::load_trust(k, args.host_cert.as_deref(), &network, &host, addr, daemon)
                    .map_err(|e| e.to_string())?;
            // Secured unless the options say `security none` (plain links,
            // which the kernel path forwards: records and claims are
            // still signed and checked, frames on the wire are not).
            if link_options.protect == vnet_cluster::apply::Protect::AsKeyed {
                link_options.protect = vnet_cluster::apply::Protect::Encrypt;
            }
            (Some(nk), Some(cert))
        }
    };
    // Signed networks: the trust state the last run kept (the newest
    // policy, the revocations); one that does not read or check stops the
    // start rather than be forgotten.
    let (kept_file, kept) = match &network_key {
        None => (None, None),
        Some(nk) => {
            let file = vnetd::cluster::kept::path(state_dir, &network);
            let max = vnet_cluster::Policy::default().max_revoked;
            let kept = vnetd::cluster::kept::load(&file, &network, nk, max).map_err(|e| e.to_string())?;
            (Some(file), kept)
        }
    };
    Ok(vnetd::cluster::Config {
        store,
        network,
        host,
        advertise: args.advertise,
        ttl: std::time::Duration::from_secs(args.ttl.clamp(3, 3600)),
        link_options,
        network_key,
        cert,
        claim_key,
        relay: relay_flag,
        kept_file,
        kept,
        kube_pods: None,
    })
}
