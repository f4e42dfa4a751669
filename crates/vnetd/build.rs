//! Builds the eBPF fast path (`bpf/vnet.bpf.c`) with the system's clang.
//!
//! Without clang the daemon still builds: the object is left empty and
//! `datapath auto` falls back to the user path, saying why.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let obj = out.join("vnet.bpf.o");
    let src = "bpf/vnet.bpf.c";
    println!("cargo:rerun-if-changed={src}");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let multiarch = format!("/usr/include/{}-linux-gnu", std::env::consts::ARCH);
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-Wall", "-Werror"])
        .arg(format!("-I{multiarch}"))
        .args(["-c", src, "-o"])
        .arg(&obj)
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{clang} failed to build {src} ({s}); see its messages above"),
        Err(e) => {
            println!(
                "cargo:warning=no eBPF fast path: cannot run `{clang}` ({e}); install clang and libbpf-dev"
            );
            std::fs::write(&obj, b"").expect("writing an empty eBPF object");
        }
    }
}
