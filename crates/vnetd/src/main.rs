//! `vnetd`: the vnet host daemon. See the `vnetd` library for the design.

use clap::Parser;
use std::sync::{Arc, Mutex};
use vnetd::{control, Daemon, Endpoint};

#[derive(Parser)]
#[command(version, about = "vnet host daemon: a layer-2 overlay for VMs and containers")]
struct Args {
    /// Config file in the vnet control language, applied at start.
    #[arg(long, short)]
    config: Option<std::path::PathBuf>,
    /// Control endpoint: unix:PATH or tcp:ADDR:PORT (tcp:PORT is loopback).
    #[arg(long, default_value = control::DEFAULT_ENDPOINT)]
    control: Endpoint,
    /// Serve Prometheus metrics (`GET /metrics`) on this address, e.g.
    /// 127.0.0.1:9108.
    #[arg(long)]
    metrics: Option<std::net::SocketAddr>,
    /// Run the data-path workers on these CPUs: worker k (queue k of every
    /// interface; worker 0 also receives the links) on the k-th CPU of the
    /// list, wrapping around, e.g. `--worker-cpus 1` or `--worker-cpus 0,1`.
    #[arg(long, value_delimiter = ',')]
    worker_cpus: Vec<usize>,
    /// Log filter, e.g. info or vnetd=debug.
    #[arg(long, default_value = "info", env = "VNETD_LOG")]
    log: String,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&args.log))
        .with_writer(std::io::stderr)
        .init();
    let mut daemon = Daemon::new();
    if !args.worker_cpus.is_empty() {
        let allowed = vnetd::sys::allowed_cpus().unwrap_or_default();
        if let Some(bad) = args.worker_cpus.iter().find(|c| !allowed.contains(c)) {
            let list: Vec<String> = allowed.iter().map(|c| c.to_string()).collect();
            eprintln!(
                "vnetd: --worker-cpus: cpu {bad} is not one this process may run on (allowed: {})",
                list.join(",")
            );
            return std::process::ExitCode::from(2);
        }
        daemon.set_worker_cpus(args.worker_cpus.clone());
    }
    if let Some(path) = &args.config {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("vnetd: {}: {e}", path.display());
                return std::process::ExitCode::from(2);
            }
        };
        let applied = vnet_control::parse(&text).and_then(|cmds| daemon.apply(&cmds));
        if let Err(e) = applied {
            eprintln!("vnetd: {}", e.in_file(path.display().to_string()));
            return std::process::ExitCode::from(2);
        }
    }
    let daemon = Arc::new(Mutex::new(daemon));
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vnetd: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let served = rt.block_on(async {
        let shutdown = async {
            let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        };
        if let Some(addr) = args.metrics {
            let d = daemon.clone();
            tokio::spawn(async move {
                if let Err(e) = control::serve_metrics(addr, d).await {
                    tracing::error!("metrics endpoint {addr}: {e}");
                }
            });
        }
        tracing::info!(control = %args.control, "vnetd ready");
        control::serve(&args.control, daemon.clone(), shutdown).await
    });
    daemon.lock().unwrap_or_else(|p| p.into_inner()).shutdown();
    match served {
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
