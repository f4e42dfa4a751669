//! Container images for the Kubernetes lab, made without a registry or an
//! image builder: a directory becomes one layer (`tar`, with fixed owner
//! and times so the same files give the same digest), and the layer, an
//! image configuration and a manifest become an OCI image layout archive
//! (`oci-layout`, `index.json`, `blobs/sha256/`) that `ctr images import`
//! takes, named by the index's `io.containerd.image.name` annotation.
//!
//! Four images: vnet's (vnetd, vnetctl, vnet-cni with the shared
//! libraries they load, the reference `portmap` plugin as
//! `/usr/lib/cni/vnet-portmap`, and Debian's static busybox for the init
//! container's `sh` and `cp`), a test image (the same busybox), the
//! pause image (a static `pause` built here from C with gcc: the sandbox's
//! first process, which waits for a signal and reaps what it inherits),
//! and CoreDNS's (its static binary, when `scripts/k8s-build.sh` built it).

use crate::{io, Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An image to build: its name (`localhost/NAME:TAG`, or the name a test
/// suite expects), its root directory and the configuration's entrypoint
/// and command (`Cmd`, what a container runs when its pod names none).
pub struct ImageSpec<'a> {
    pub name: &'a str,
    pub root: &'a Path,
    pub entrypoint: &'a [&'a str],
    pub cmd: &'a [&'a str],
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes).as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(io("writing an image file"))
}

/// Writes `spec`'s image as an OCI archive at `out` and returns `out`.
pub fn build(spec: &ImageSpec, work: &Path, out: &Path) -> Result<PathBuf> {
    let layout = work.join("layout");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(io("making an image layout"))?;
    let layer = work.join("layer.tar");
    let st = Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C"])
        .arg(spec.root)
        .arg("-cf")
        .arg(&layer)
        .arg(".")
        .status()
        .map_err(io("running tar"))?;
    if !st.success() {
        return Err(Error::Other(format!("tar of {} failed: {st}", spec.root.display())));
    }
    let layer_bytes = std::fs::read(&layer).map_err(io("reading a layer"))?;
    let layer_digest = sha256_hex(&layer_bytes);
    std::fs::rename(&layer, blobs.join(&layer_digest)).map_err(io("placing a layer"))?;
    let mut config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    });
    if !spec.entrypoint.is_empty() {
        config["config"]["Entrypoint"] = serde_json::json!(spec.entrypoint);
    }
    if !spec.cmd.is_empty() {
        config["config"]["Cmd"] = serde_json::json!(spec.cmd);
    }
    let config = config.to_string();
    let config_digest = sha256_hex(config.as_bytes());
    write(&blobs.join(&config_digest), config.as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_digest}"),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer_bytes.len(),
        }],
    })
    .to_string();
    let manifest_digest = sha256_hex(manifest.as_bytes());
    write(&blobs.join(&manifest_digest), manifest.as_bytes())?;
    let tag = spec.name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_digest}"),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": spec.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    })
    .to_string();
    write(&layout.join("index.json"), index.as_bytes())?;
    write(&layout.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let st = Command::new("tar")
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner", "--mtime=@0", "-C"])
        .arg(&layout)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()
        .map_err(io("running tar"))?;
    if !st.success() {
        return Err(Error::Other(format!("tar of the image layout failed: {st}")));
    }
    std::fs::remove_dir_all(&layout).map_err(io("removing an image layout"))?;
    Ok(out.to_path_buf())
}

/// vnet's image, `localhost/vnet:TAG`, at `out`: Debian's static busybox
/// (the init containers' `sh` and `cp`), `vnetd` and `vnetctl` in
/// `/usr/bin`, `vnet-cni` and the reference `portmap` plugin (static, from
/// `scripts/k8s-build.sh`) as `/usr/lib/cni/vnet-cni` and
/// `/usr/lib/cni/vnet-portmap`, with every shared library they load. vnet's
/// programs come from `bin` (`bin(NAME)` gives a program's path: the lab
/// passes [`crate::bin`], this build's). With `strip`, their debugging
/// information is left out (`strip --strip-debug` on the copies): the
/// release build keeps it, the image need not.
pub fn vnet_image(
    tag: &str,
    bin: &dyn Fn(&str) -> Result<PathBuf>,
    portmap: &Path,
    strip: bool,
    work: &Path,
    out: &Path,
) -> Result<PathBuf> {
    let root = work.join(format!("vnet-root-{tag}"));
    if root.exists() {
        std::fs::remove_dir_all(&root).map_err(io("removing an old image root"))?;
    }
    std::fs::create_dir_all(&root).map_err(io("making an image root"))?;
    add_busybox(&root)?;
    let programs =
        [("vnetd", "/usr/bin/vnetd"), ("vnetctl", "/usr/bin/vnetctl"), ("vnet-cni", "/usr/lib/cni/vnet-cni")];
    for (b, to) in programs {
        add_binary(&root, &bin(b)?, to)?;
        if strip {
            let copy = root.join(to.trim_start_matches('/'));
            let st = Command::new("strip")
                .arg("--strip-debug")
                .arg(&copy)
                .status()
                .map_err(io("running strip"))?;
            if !st.success() {
                return Err(Error::Other(format!("strip --strip-debug {}: {st}", copy.display())));
            }
        }
    }
    if !portmap.is_file() {
        return Err(Error::Other(format!(
            "{} not found: scripts/k8s-build.sh --portmap builds it",
            portmap.display()
        )));
    }
    copy_into(&root, portmap, "/usr/lib/cni/vnet-portmap")?;
    let name = format!("localhost/vnet:{tag}");
    let tar =
        build(&ImageSpec { name: &name, root: &root, entrypoint: &["/usr/bin/vnetd"], cmd: &[] }, work, out)?;
    std::fs::remove_dir_all(&root).map_err(io("removing an image root"))?;
    Ok(tar)
}

/// Copies `bin` into `root` at `to` (a path inside the image) with every
/// shared library `ldd` says it loads, at the same paths.
pub fn add_binary(root: &Path, bin: &Path, to: &str) -> Result<()> {
    copy_into(root, bin, to)?;
    let out = Command::new("ldd").arg(bin).output().map_err(io("running ldd"))?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
        // "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let path = line.split("=>").last().and_then(|s| s.split_whitespace().next()).unwrap_or("");
        if path.starts_with('/') {
            copy_into(root, Path::new(path), path)?;
        }
    }
    Ok(())
}

/// Copies the file `from` to `root`/`to`, following symbolic links.
pub fn copy_into(root: &Path, from: &Path, to: &str) -> Result<()> {
    let dest = root.join(to.trim_start_matches('/'));
    if let Some(d) = dest.parent() {
        std::fs::create_dir_all(d).map_err(io("making an image directory"))?;
    }
    std::fs::copy(from, &dest).map_err(|e| Error::Other(format!("copying {}: {e}", from.display())))?;
    Ok(())
}

/// Debian's static busybox at `root`/bin/busybox with the applets the
/// lab's pods and the manifest's scripts use linked to it.
pub fn add_busybox(root: &Path) -> Result<()> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.is_file() {
        return Err(Error::Other("/bin/busybox not found: install Debian's busybox-static".into()));
    }
    copy_into(root, busybox, "/bin/busybox")?;
    for applet in [
        "sh", "cp", "mv", "rm", "ls", "cat", "mkdir", "sleep", "ping", "nc", "md5sum", "dd", "head", "ip",
        "hostname", "kill", "test", "echo", "wc", "grep", "sed", "chmod", "true", "date", "seq", "wget",
        "httpd", "nslookup", "timeout",
    ] {
        let link = root.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", &link).map_err(io("linking a busybox applet"))?;
        }
    }
    for d in ["tmp", "etc", "proc", "sys", "dev", "run", "var/lib"] {
        std::fs::create_dir_all(root.join(d)).map_err(io("making an image directory"))?;
    }
    Ok(())
}

/// The pause program, in C (as Kubernetes' own is): exits on SIGINT or
/// SIGTERM, reaps children, otherwise sleeps.
pub const PAUSE_C: &str = r#"#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void quit(int s) { (void)s; _exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, 0, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction q = {0}, r = {0};
    q.sa_handler = quit;
    r.sa_handler = reap;
    r.sa_flags = SA_NOCLDSTOP;
    if (sigaction(SIGINT, &q, 0) || sigaction(SIGTERM, &q, 0) || sigaction(SIGCHLD, &r, 0)) return 1;
    for (;;) pause();
}
"#;

/// Builds the static pause program into `root`/pause with gcc.
pub fn add_pause(root: &Path, work: &Path) -> Result<()> {
    let src = work.join("pause.c");
    write(&src, PAUSE_C.as_bytes())?;
    let st = Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(root.join("pause"))
        .arg(&src)
        .status()
        .map_err(io("running gcc"))?;
    if !st.success() {
        return Err(Error::Other(format!("gcc of pause.c failed: {st}")));
    }
    Ok(())
}
