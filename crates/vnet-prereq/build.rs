//! See `src/lib.rs`. One line on failure: what is missing, the packages,
//! and the script that installs them.

use std::path::Path;
use std::process::Command;

fn runs(cmd: &str) -> bool {
    Command::new(cmd).arg("--version").output().is_ok_and(|o| o.status.success())
}

fn main() {
    for v in ["PROTOC", "PROTOC_INCLUDE", "CLANG"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let protoc = std::env::var("PROTOC").unwrap_or_else(|_| "protoc".into());
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let include = std::env::var("PROTOC_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
    let mut missing = Vec::new();
    if !runs(&protoc) {
        missing.push(("`protoc`", "protobuf-compiler"));
    }
    let wkt = Path::new(&include).join("google/protobuf/descriptor.proto");
    println!("cargo:rerun-if-changed={}", wkt.display());
    if !wkt.exists() {
        missing.push(("protobuf's well-known .proto files", "libprotobuf-dev"));
    }
    // Without clang vnetd builds without its eBPF path (and says so); with
    // it, the object needs libbpf's headers.
    let helpers = Path::new("/usr/include/bpf/bpf_helpers.h");
    println!("cargo:rerun-if-changed={}", helpers.display());
    if runs(&clang) && !helpers.exists() {
        missing.push(("libbpf's headers (bpf/bpf_helpers.h)", "libbpf-dev"));
    }
    if missing.is_empty() {
        return;
    }
    let what: Vec<&str> = missing.iter().map(|m| m.0).collect();
    let pkgs: Vec<&str> = missing.iter().map(|m| m.1).collect();
    eprintln!(
        "vnet's build needs {}: install the Debian packages {} (`apt-get install {}`), or run \
         `./scripts/test.sh` or `./scripts/demo.sh` as root, which install them",
        what.join(", "),
        pkgs.join(" "),
        pkgs.join(" ")
    );
    std::process::exit(1);
}
