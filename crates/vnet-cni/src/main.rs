//! `vnet-cni`: a CNI plugin that attaches containers (and, with
//! `vhostUserDir`, vhost-user VMs) to vnet.
//!
//! `ADD` makes a veth pair into `CNI_NETNS`, runs the delegated IPAM
//! plugin and gives the container its addresses, and `attach`es the
//! host end to the host's vnetd over its control socket, with the
//! container's MAC (so cluster mode publishes it); `DEL` undoes exactly
//! that and is idempotent; `CHECK`, `STATUS`, `GC` and `VERSION` are the
//! specification's (1.1.0; 1.0.0 and 0.4.0 configurations too). Errors
//! are the specification's error JSON on stdout with a non-zero exit.
//! `docs/INTEGRATION.md` has the configuration and the podman and
//! containerd files.

mod gateway;
mod ipam;
mod labels;
mod plugin;
mod record;
mod result;
mod spec;
mod veth;
mod vnetd;

use std::io::{Read, Write};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut stdin = Vec::new();
    // Bounded: a network configuration is small.
    let read = std::io::stdin().take(1 << 20).read_to_end(&mut stdin);
    let version = serde_json::from_slice::<serde_json::Value>(&stdin)
        .ok()
        .and_then(|v| v.get("cniVersion").and_then(|v| v.as_str()).map(str::to_string))
        .filter(|v| spec::SUPPORTED.contains(&v.as_str()))
        .unwrap_or_else(|| spec::CURRENT.to_string());
    let cmd = std::env::var("CNI_COMMAND").unwrap_or_default();
    let out = read
        .map_err(|e| spec::Error::with(spec::Code::Io, "reading the configuration", e))
        .and_then(|_| spec::Command::parse(&cmd))
        .and_then(|c| plugin::run(c, &plugin::Env::from_process(), &stdin));
    let mut so = std::io::stdout().lock();
    match out {
        Ok(Some(v)) => {
            let _ = writeln!(so, "{v}");
            ExitCode::SUCCESS
        }
        Ok(None) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(so, "{}", e.to_json(&version));
            ExitCode::FAILURE
        }
    }
}
