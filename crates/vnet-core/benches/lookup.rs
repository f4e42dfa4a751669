//! Route lookups at cluster scale (issue 16): a table of 100000 unicast
//! routes (one per VM MAC of a 1000-host network, to 999 links) and the
//! broadcast routes of the mesh; lookups of random destinations without
//! the cache, and of 1000 recurring flows through it.
//!
//! `cargo bench -p vnet-core --bench lookup`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use vnet_core::{MacSpec, Port, Route, RouteCache, RouteTable, SourceFilter};
use vnet_wire::MacAddr;

const HOSTS: u32 = 1000;
const VMS: u32 = 100;

fn mac(i: u32) -> MacAddr {
    let b = i.to_be_bytes();
    MacAddr([0x52, 0x54, b[0], b[1], b[2], b[3]])
}

fn table() -> (RouteTable, Vec<MacAddr>) {
    let mut routes = Vec::new();
    let mut macs = Vec::new();
    for h in 1..HOSTS {
        for v in 0..VMS {
            let m = mac(h * VMS + v);
            macs.push(m);
            let id = routes.len() as u32;
            routes.push(Route::new(id, MacSpec::Any, MacSpec::Addr(m), Port::Link(h), SourceFilter::Any));
        }
        let id = routes.len() as u32;
        routes.push(Route::new(
            id,
            MacSpec::Any,
            MacSpec::Addr(MacAddr::BROADCAST),
            Port::Link(h),
            SourceFilter::Any,
        ));
    }
    (RouteTable::new(1, routes), macs)
}

fn lookups(c: &mut Criterion) {
    let (t, macs) = table();
    let ingress = Port::Interface(0);
    let src = mac(1);
    let mut out = Vec::new();
    let mut g = c.benchmark_group("lookup_100k_routes");
    g.throughput(Throughput::Elements(1));
    let mut i = 0usize;
    g.bench_function("uncached_random_dst", |b| {
        b.iter(|| {
            i = i.wrapping_add(2_654_435_761);
            black_box(t.lookup(ingress, src, macs[i % macs.len()], &mut out));
        })
    });
    let mut cache = RouteCache::new(4096);
    let mut j = 0usize;
    g.bench_function("cached_1000_flows", |b| {
        b.iter(|| {
            j = (j + 1) % 1000;
            cache.lookup(&t, ingress, src, macs[j * 97], &mut out);
            black_box(out.len());
        })
    });
    g.bench_function("broadcast_to_999_links", |b| {
        b.iter(|| black_box(t.lookup(ingress, src, MacAddr::BROADCAST, &mut out)))
    });
    g.finish();
}

criterion_group!(benches, lookups);
criterion_main!(benches);
