//! The policy's cost a frame (issue 50): a network of 100 rules, none of
//! which the frames match before the last (the worst a first packet
//! meets), and the same frames again as an established flow (a hash of
//! the key and one probe of the flow table).
//!
//! `cargo bench -p vnet-core --bench policy`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use vnet_core::policy::{Action, Flows, NetPolicy, PolicySet, Rule, Selector};
use vnet_wire::MacAddr;

/// A TCP segment 10.0.0.1:sport -> 10.0.0.2:5432 (1500 bytes).
fn frame(sport: u16) -> Vec<u8> {
    let mut f = vec![0u8; 1514];
    f[..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&1500u16.to_be_bytes());
    f[23] = 6;
    f[26..34].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
    f[34..36].copy_from_slice(&sport.to_be_bytes());
    f[36..38].copy_from_slice(&5432u16.to_be_bytes());
    f
}

fn set(rules: usize) -> PolicySet {
    let mut rs: Vec<Rule> = (0..rules - 1)
        .map(|i| Rule {
            name: format!("r{i}").into(),
            action: Action::Allow,
            from: Selector::Net(IpAddr::V4(Ipv4Addr::new(10, 1 + (i / 250) as u8, (i % 250) as u8, 0)), 24),
            to: Selector::Any,
            ether: None,
            proto: Some(6),
            ports: Some((80, 80)),
            counters: Arc::default(),
        })
        .collect();
    rs.push(Rule {
        name: "db".into(),
        action: Action::Allow,
        from: Selector::Mac(MacAddr([0x52, 0x54, 0, 0, 0, 1])),
        to: Selector::Any,
        ether: None,
        proto: Some(6),
        ports: Some((5432, 5432)),
        counters: Arc::default(),
    });
    let net = NetPolicy::new(Action::Deny, rs);
    PolicySet {
        generation: 1,
        nets: [(0, net)].into_iter().collect(),
        groups: Default::default(),
        flows: Arc::new(Flows::default()),
        mirror: None,
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("policy");
    g.throughput(Throughput::Elements(1));
    let frames: Vec<Vec<u8>> = (0..1000).map(|i| frame(20000 + i)).collect();
    // Each frame a new flow: the rules decide (and a flow is written);
    // a new generation each round keeps every frame new.
    let mut p = set(100);
    let mut i = 0;
    g.bench_function("first packet, 100 rules, matched by the last", |b| {
        b.iter(|| {
            i = (i + 1) % frames.len();
            if i == 0 {
                p.generation += 1;
            }
            black_box(p.decide(0, black_box(&frames[i])))
        })
    });
    let p = set(100);
    for f in &frames {
        p.decide(0, f);
    }
    let mut i = 0;
    g.bench_function("established flow", |b| {
        b.iter(|| {
            i = (i + 1) % frames.len();
            black_box(p.decide(0, black_box(&frames[i])))
        })
    });
    let none = PolicySet::default();
    g.bench_function("no policy in the network", |b| {
        b.iter(|| black_box(none.decide(0, black_box(&frames[0]))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
