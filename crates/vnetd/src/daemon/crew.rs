//! The data-path workers as a resource of the daemon: started again
//! (released and acquired whole) when the interfaces or the link sockets
//! they read changed.

use super::interfaces::Interfaces;
use super::links::LinkSet;
use super::sockets::LinkSockets;
use crate::dataplane;
use crate::shared::Shared;
use crate::workers::{self, WorkerHandle};
use std::sync::Arc;
use vnet_core::Port;
use vnet_engine::Via;
use vnet_wire::reasm;

/// The running workers and the CPUs they run on.
#[derive(Default)]
pub(super) struct Crew {
    /// Worker k serves queue k of every interface; worker 0 also the link sockets.
    pub(super) handles: Vec<WorkerHandle>,
    /// CPUs the workers run on: worker k on `cpus[k % len]` (empty:
    /// wherever the scheduler puts them).
    pub(super) cpus: Vec<usize>,
}

impl Crew {
    /// Replaces the workers: worker k reads queue k of every interface and
    /// socket j of each listening group where `j mod workers = k` (as many
    /// workers as the most queues or sockets), and worker 0 the `direct`
    /// links too.
    pub(super) fn respawn(
        &mut self,
        shared: &Arc<Shared>,
        sockets: &LinkSockets,
        links: &LinkSet,
        ifaces: &Interfaces,
        reasm: reasm::Config,
    ) {
        self.handles.drain(..).for_each(WorkerHandle::stop);
        let queues = ifaces.running.values().map(|p| p.dev.queues()).max().unwrap_or(1).max(1);
        let groups = [(&sockets.bound.udp, Via::Udp), (&sockets.bound.vxlan, Via::Vxlan)];
        let readers =
            groups.iter().filter_map(|(b, _)| b.as_ref().map(|b| b.readers.len())).max().unwrap_or(0);
        let workers = queues.max(readers);
        for k in 0..workers {
            let mut sources = Vec::new();
            for (b, via) in groups {
                let Some(b) = b else { continue };
                for r in b.readers.iter().skip(k).step_by(workers) {
                    let mode = sockets.mode;
                    sources.push(dataplane::link_source(shared, r, via, mode, reasm));
                }
            }
            if k == 0 {
                for (id, r) in links.io.iter().filter_map(|(id, l)| Some((id, l.reader()?))) {
                    let stats = shared.global.link_dispatch.clone();
                    let (port, mode) = (Port::Link(*id), sockets.mode);
                    sources.push(dataplane::frame_source(shared, port, r, true, mode, stats));
                }
            }
            for p in ifaces.running.values() {
                sources.extend(dataplane::iface_source(shared, p, k));
            }
            if sources.is_empty() {
                continue;
            }
            let cpu = (!self.cpus.is_empty()).then(|| self.cpus[k % self.cpus.len()]);
            match workers::spawn_worker(format!("vnet-w{k}"), cpu, sources) {
                Ok(w) => self.handles.push(w),
                Err(e) => tracing::error!("cannot start worker {k}: {e}"),
            }
        }
    }

    /// Stops every worker.
    pub(super) fn stop_all(&mut self) {
        self.handles.drain(..).for_each(WorkerHandle::stop);
    }
}
