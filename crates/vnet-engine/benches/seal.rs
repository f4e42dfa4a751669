//! What sealing and opening a secured link's datagrams costs per byte, for
//! each AEAD: a 64 KB GSO frame as the 1420-byte `vnet` datagrams an MTU
//! 1500 underlay carries, and as 8948-byte ones (MTU 9000), sealed in
//! place one after the other in one buffer, as `codec::vnet` does; then
//! opened in place, as the receive path does.
//!
//! `cargo bench -p vnet-engine --bench seal`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use vnet_engine::secure::{Aead, Mode, Session, OVERHEAD};

const FRAME: usize = 65_000;

fn seal_and_open(c: &mut Criterion) {
    let mut g = c.benchmark_group("seal");
    g.throughput(Throughput::Bytes(FRAME as u64));
    for aead in [Aead::Aes256Gcm, Aead::ChaCha20Poly1305] {
        for dgram in [1420usize, 8948] {
            let plain = dgram - OVERHEAD;
            let n = FRAME.div_ceil(plain);
            let tx = Session::with_keys(aead, 1, 2, &[7; 32], &[9; 32]).unwrap();
            let rx = Session::with_keys(aead, 2, 1, &[9; 32], &[7; 32]).unwrap();
            // The frame's datagrams sealed one after the other in `buf`.
            let seal_all = |buf: &mut [u8]| {
                for d in buf.chunks_exact_mut(dgram) {
                    black_box(tx.seal(Mode::Encrypt, d, plain));
                }
            };
            let mut buf = vec![0x5au8; n * dgram];
            g.bench_function(format!("{}/{dgram}", aead.word()), |b| b.iter(|| seal_all(&mut buf)));
            g.bench_function(format!("{}/{dgram}/open", aead.word()), |b| {
                b.iter_batched_ref(
                    || {
                        let mut v = vec![0u8; n * dgram];
                        seal_all(&mut v);
                        v
                    },
                    |v| {
                        for d in v.chunks_exact_mut(dgram) {
                            assert!(rx.open(Mode::Encrypt, d).is_some());
                        }
                    },
                    criterion::BatchSize::LargeInput,
                )
            });
        }
    }
    g.finish();
}

criterion_group!(benches, seal_and_open);
criterion_main!(benches);
