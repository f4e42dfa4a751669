//! `RouteTable::lookup`, and the route cache in front of it, against a
//! plain linear scan of the Palacios rules: every route that matches
//! (ingress filter, source and destination classes), the highest priority
//! only, never back out the ingress port, split horizon between mesh links
//! (group frames always; unicast unless the route names the ingress in its
//! `from`), each port once. Tables of up to 90 routes over
//! up to 60 links exercise both ways the lookup deduplicates (scan, sort).

use proptest::prelude::*;
use std::collections::BTreeSet;
use vnet_core::{priority, MacSpec, Port, Route, RouteCache, RouteTable, SourceFilter};
use vnet_wire::MacAddr;

const POOL: [MacAddr; 5] = [
    MacAddr([0x52, 0x54, 0, 0, 0, 1]),
    MacAddr([0x52, 0x54, 0, 0, 0, 2]),
    MacAddr([0x52, 0x54, 0, 0, 0, 3]),
    MacAddr([0x33, 0x33, 0, 0, 0, 1]), // multicast
    MacAddr::BROADCAST,
];
const EDGE: u32 = 59;

fn mac() -> impl Strategy<Value = MacAddr> {
    (0..POOL.len()).prop_map(|i| POOL[i])
}

fn spec() -> impl Strategy<Value = MacSpec> {
    prop_oneof![
        3 => mac().prop_map(MacSpec::Addr),
        2 => Just(MacSpec::Any),
        1 => mac().prop_map(MacSpec::Not),
        1 => Just(MacSpec::None),
    ]
}

fn port() -> impl Strategy<Value = Port> {
    prop_oneof![(0u32..4).prop_map(Port::Interface), (0u32..60).prop_map(Port::Link)]
}

fn route() -> impl Strategy<Value = (MacSpec, MacSpec, Port, Option<Port>)> {
    (spec(), spec(), port(), proptest::option::weighted(0.2, port()))
}

fn mesh(p: Port) -> bool {
    matches!(p, Port::Link(l) if l != EDGE)
}

/// The rules, read one route at a time.
fn model(routes: &[Route], ingress: Port, src: MacAddr, dst: MacAddr) -> (BTreeSet<Port>, u8) {
    let mut best = 0;
    let mut ports = Vec::new();
    for r in routes {
        if matches!(r.from, SourceFilter::Port(p) if p != ingress) {
            continue;
        }
        let (Some(s), Some(d)) = (r.src.class(src), r.dst.class(dst)) else { continue };
        let p = priority(s, d);
        if p > best {
            best = p;
            ports.clear();
        }
        if p == best {
            ports.push((r.to, r.from));
        }
    }
    let group = dst.is_group();
    let transit = |from: SourceFilter| !group && from == SourceFilter::Port(ingress);
    let out = ports
        .into_iter()
        .filter(|&(p, from)| p != ingress && !(mesh(ingress) && mesh(p) && !transit(from)))
        .map(|(p, _)| p)
        .collect();
    (out, best)
}

type Def = (MacSpec, MacSpec, Port, Option<Port>);

/// A broadcast-heavy table: fan-outs to dozens of links, deduplicated by sorting.
fn fanout() -> impl Strategy<Value = Def> {
    let dst = prop_oneof![Just(MacSpec::Addr(MacAddr::BROADCAST)), Just(MacSpec::Any)];
    (Just(MacSpec::Any), dst, port(), Just(None))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn lookup_and_cache_agree_with_a_linear_scan(
        defs in proptest::collection::vec(route(), 0..90),
        queries in proptest::collection::vec((port(), mac(), mac()), 1..20),
    ) {
        check(&defs, &queries)?;
    }

    #[test]
    fn big_fanouts_agree_with_a_linear_scan(
        defs in proptest::collection::vec(fanout(), 30..120),
        queries in proptest::collection::vec((port(), mac(), mac()), 1..10),
    ) {
        check(&defs, &queries)?;
    }
}

fn check(defs: &[Def], queries: &[(Port, MacAddr, MacAddr)]) -> Result<(), TestCaseError> {
    {
        let routes: Vec<Route> = defs
            .iter()
            .enumerate()
            .map(|(i, &(s, d, to, from))| {
                Route::new(i as u32, s, d, to, from.map_or(SourceFilter::Any, SourceFilter::Port))
            })
            .collect();
        let table = RouteTable::new(1, routes.clone()).with_edge_links([EDGE]);
        let mut cache = RouteCache::new(64);
        let mut out = Vec::new();
        // Each query twice through the cache: a miss, then (mostly) a hit.
        for &(ingress, src, dst) in queries.iter().chain(queries.iter()) {
            let (want, best) = model(&routes, ingress, src, dst);
            table.lookup(ingress, src, dst, &mut out);
            let got: Vec<Port> = out.iter().map(|d| d.0).collect();
            let set: BTreeSet<Port> = got.iter().copied().collect();
            prop_assert_eq!(set.len(), got.len(), "a port twice: {:?}", out);
            prop_assert_eq!(&set, &want, "{:?} {} -> {}", ingress, src, dst);
            for &(p, i) in &out {
                let r = &routes[i as usize];
                prop_assert_eq!(r.to, p);
                let (s, d) = (r.src.class(src).unwrap(), r.dst.class(dst).unwrap());
                prop_assert_eq!(priority(s, d), best, "route {} is not of the best priority", i);
            }
            cache.lookup(&table, ingress, src, dst, &mut out);
            let cached: BTreeSet<Port> = out.iter().map(|d| d.0).collect();
            prop_assert_eq!(&cached, &want, "through the cache");
        }
    }
    Ok(())
}
