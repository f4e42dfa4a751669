//! Writes the fuzz targets' seed corpora into `fuzz/corpus/TARGET/`:
//! real traffic (datagrams captured in the simulator between the `wire`
//! target's host and a peer of each link kind, secured handshakes
//! included), the repository's configs, and well-formed offload frames
//! and stream records. `cargo run -p vnet-fuzz --bin vnet-fuzz-seeds`.

use std::path::{Path, PathBuf};
use vnet_engine::sim::Net;
use vnet_wire::virtio::VirtioNetHdr;

fn main() -> std::process::ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    match write_all(&root) {
        Ok(n) => {
            println!("wrote {n} seeds under {}", root.display());
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vnet-fuzz-seeds: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn put(root: &Path, target: &str, name: &str, data: &[u8]) -> std::io::Result<()> {
    let dir: PathBuf = root.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(name), data)
}

/// An Ethernet + IPv4 + TCP frame with `payload` bytes.
fn tcp4(payload: usize) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + 20 + payload];
    f[0..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 2]);
    f[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip_len = (20 + 20 + payload) as u16;
    f[14] = 0x45;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 88, 0, 1]);
    f[30..34].copy_from_slice(&[10, 88, 0, 2]);
    f[34..36].copy_from_slice(&5201u16.to_be_bytes());
    f[36..38].copy_from_slice(&40000u16.to_be_bytes());
    f[46] = 0x50;
    f[47] = 0x18;
    for (i, b) in f[54..].iter_mut().enumerate() {
        *b = i as u8;
    }
    f
}

fn vh_bytes(h: &VirtioNetHdr) -> Vec<u8> {
    let mut v = vec![h.flags, h.gso_type];
    for x in [h.hdr_len, h.gso_size, h.csum_start, h.csum_offset] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

fn write_all(root: &Path) -> Result<usize, String> {
    let io = |e: std::io::Error| e.to_string();
    let mut n = 0;
    n += wire_seeds(root)?;
    // control: the configs this repository ships and writes.
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    put(root, "control", "wire-host", vnet_fuzz::wire_config().as_bytes()).map_err(io)?;
    let example = std::fs::read(here.join("packaging/example.conf")).map_err(io)?;
    put(root, "control", "example", &example).map_err(io)?;
    let palacios = "add 10.0.0.2 9000 udp\nadd any ff:ff:ff:ff:ff:ff edge 10.0.0.2 any\n[routes]\ndel 0\n";
    put(root, "control", "palacios", palacios.as_bytes()).map_err(io)?;
    let misc = "listen tcp 10.0.0.1:9000\ntls cert a.pem key a.key ca ca.pem\nlink t tcp 10.0.0.2:9000 tls\n\
                link l direct eth1\ninterface v vhost-user /run/v.sock queues 4 mode adaptive\n\
                route not 52:54:00:00:00:01 any -> link t from interface v\ndelete route 0\nshow stats json\n";
    put(root, "control", "misc", misc.as_bytes()).map_err(io)?;
    n += 4;
    // offload: a TCP frame with and without a GSO header, a partial checksum.
    let gso =
        VirtioNetHdr { flags: 1, gso_type: 1, hdr_len: 54, gso_size: 1448, csum_start: 34, csum_offset: 16 };
    let csum = VirtioNetHdr { gso_type: 0, gso_size: 0, ..gso };
    for (name, h, len) in [("gso", gso, 6000), ("csum", csum, 500), ("plain", VirtioNetHdr::default(), 1400)]
    {
        let mut d = vh_bytes(&h);
        d.extend_from_slice(&tcp4(len));
        put(root, "offload", name, &d).map_err(io)?;
        n += 1;
    }
    // stream: records back to back, one cut into a heartbeat.
    let mut s = vec![3u8];
    for len in [60usize, 1514, 0] {
        s.extend_from_slice(&vnet_engine::codec::stream::header(len, false));
        s.extend(std::iter::repeat_n(0xab, len));
    }
    s.extend_from_slice(&vnet_engine::codec::stream::heartbeat());
    put(root, "stream", "records", &s).map_err(io)?;
    n += 1;
    vhost_seeds(root, &gso)?;
    Ok(n + 3)
}

/// wire (and reasm): for each peer kind, the datagrams of a ping-like
/// exchange in the simulator, captured. Returns how many seeds.
fn wire_seeds(root: &Path) -> Result<usize, String> {
    let io = |e: std::io::Error| e.to_string();
    let mut n = 0;
    let peers: [(&str, u8, String); 4] = [
        ("raw", 0, "link a udp 10.0.0.1 format raw".to_string()),
        ("vnet", 1, "link a udp 10.0.0.1 format vnet mtu 1500".to_string()),
        ("secured", 2, format!("link a udp 10.0.0.1 peer-key {}", Net::public_key("10.0.0.1"))),
        ("vxlan", 3, "link a vxlan 10.0.0.1 vni 42".to_string()),
    ];
    for (i, (kind, sel, link)) in peers.iter().enumerate() {
        let ip = format!("10.0.0.{}", i + 2);
        let mut net = Net::new(7);
        let host = net.add_host("10.0.0.1", &vnet_fuzz::wire_config()).map_err(|e| e.0)?;
        let listen = if *kind == "vxlan" {
            "listen udp 10.0.0.5:50000\nlisten vxlan 10.0.0.5:4789".to_string()
        } else {
            format!("listen udp {ip}:9000")
        };
        let cfg = format!(
            "{listen}\ninterface vm0 tap t0 mac 52:54:00:00:00:0{m}\n{link}\n\
             route any ff:ff:ff:ff:ff:ff -> link a\nroute any 52:54:00:00:00:01 -> link a\n\
             route any 52:54:00:00:00:0{m} -> interface vm0\n",
            m = i + 2
        );
        let peer = net.add_host(&ip, &cfg).map_err(|e| format!("{kind}: {}", e.0))?;
        net.start_capture();
        let mut broadcast = tcp4(100);
        broadcast[0..6].copy_from_slice(&[0xff; 6]);
        broadcast[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, i as u8 + 2]);
        let mut frame = tcp4(1200);
        frame[0..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]);
        frame[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, i as u8 + 2]);
        // Secured links handshake on their timers: let them, then send again.
        for _ in 0..3 {
            net.send(peer, "vm0", &frame);
            net.send(peer, "vm0", &broadcast);
            net.run(100);
            net.advance(200_000_000);
            net.run(100);
        }
        // A frame larger than the link: `vnet` splits it, reassembly joins it.
        let gso = VirtioNetHdr {
            flags: 1,
            gso_type: 1,
            hdr_len: 54,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        let mut big = tcp4(4000);
        big[0..12].copy_from_slice(&frame[0..12]);
        net.send_with(peer, "vm0", gso, &big);
        net.run(100);
        let _ = net.take(host, "vm0");
        let mut input = Vec::new();
        for d in net.captured() {
            let len = d.len().min(u16::MAX as usize) as u16;
            input.push(*sel);
            input.extend_from_slice(&len.to_le_bytes());
            input.extend_from_slice(&d[..len as usize]);
            if *kind == "vnet" {
                let mut r = vec![0u8];
                r.extend_from_slice(&len.to_le_bytes());
                r.extend_from_slice(&d[..len as usize]);
                put(root, "reasm", &format!("captured-{n}"), &r).map_err(io)?;
                n += 1;
            }
        }
        put(root, "wire", &format!("captured-{kind}"), &input).map_err(io)?;
        n += 1;
    }
    Ok(n)
}

/// vhost: a guest's ring as a driver leaves it: TX chains of a guest
/// header and a frame (one buffer, header and frame apart, an indirect
/// table), or RX buffers posted (small pages, mergeable-sized). Three seeds.
fn vhost_seeds(root: &Path, gso: &VirtioNetHdr) -> Result<(), String> {
    let io = |e: std::io::Error| e.to_string();
    use vnet_virtio::fake::{raw_desc, Guest, BUFFERS, INDIRECT, NEXT};
    let image = |g: &Guest| g.read(0, 0x6000);
    let mut tx = Guest::new(256, true);
    let mut frame = vh_bytes(gso);
    frame.extend_from_slice(&[0, 0]);
    frame.extend_from_slice(&tcp4(3000));
    tx.write(BUFFERS, &frame);
    tx.post(&[(BUFFERS, frame.len() as u32)], false);
    tx.post(&[(BUFFERS, 12), (BUFFERS + 12, frame.len() as u32 - 12)], false);
    let table = BUFFERS + 0x2000;
    tx.desc(200, table, 32, INDIRECT, 0);
    tx.write(table, &raw_desc(BUFFERS, 12, NEXT, 1));
    tx.write(table + 16, &raw_desc(BUFFERS + 12, 1000, 0, 0));
    tx.make_available(200);
    let mut d = vec![255u8, 1];
    d.extend_from_slice(&image(&tx));
    put(root, "vhost", "tx", &d).map_err(io)?;
    for (name, size, len, count) in [("rx-pages", 64u16, 4096u32, 3u64), ("rx-mergeable", 16, 1536, 8)] {
        let mut rx = Guest::new(size, false);
        for k in 0..count {
            rx.post(&[(BUFFERS + u64::from(len) * k, len)], true);
        }
        let mut d = vec![(size - 1) as u8, 0];
        d.extend_from_slice(&image(&rx));
        put(root, "vhost", name, &d).map_err(io)?;
    }
    Ok(())
}
