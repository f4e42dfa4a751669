//! The images Kubernetes' end-to-end suite (`e2e.test`, run on the lab by
//! `scripts/k8s-e2e.sh`) starts, built here without a registry under the
//! exact names the suite asks for (`test/utils/image/manifest.go` of
//! `k8s.io/kubernetes` at the lab's version) and imported into every
//! node's containerd, where the kubelet finds them present (the suite's
//! pods pull `IfNotPresent`).
//!
//! | name | made from |
//! |---|---|
//! | `e2e-test-images/agnhost:2.59` | `agnhost` built from `test/images/agnhost` of the same module (`scripts/k8s-build.sh --e2e`) and its porter's `localhost.crt` and `localhost.key`, with the tools its Dockerfile installs, from Debian's packages: bash, dig (bind9-dnsutils), curl, nc (netcat-openbsd), ip and ss (iproute2), getent, busybox for the rest; `sh` is bash (busybox's shell would run its own `nc` before Debian's) |
//! | `e2e-test-images/jessie-dnsutils:1.7` | the same tools (the DNS tests' second querier: `dig`, `getent`) |
//! | `e2e-test-images/busybox:1.37.0-1` | Debian's static busybox with every applet |
//! | `e2e-test-images/nginx:1.14-4`, `1.15-4` | Debian's nginx (`scripts/k8s-e2e.sh` unpacks the package), serving port 80 |
//! | `pause:3.10.1` | the lab's pause ([`image::PAUSE_C`]) |
//!
//! The tools are each copied with the shared libraries `ldd` names, as
//! vnet's own image is made ([`image::add_binary`]).

use super::{image, Kube};
use crate::{io, Error, Result};
use std::path::Path;
use std::process::Command;

/// The suite's registries (`manifest.go`'s `PromoterE2eRegistry` and
/// `GcRegistry`).
const E2E: &str = "registry.k8s.io/e2e-test-images";
pub const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10.1";

/// Debian's programs in the agnhost and jessie-dnsutils images: (path on
/// this machine, path in the image).
const TOOLS: [(&str, &str); 8] = [
    ("/usr/bin/bash", "/bin/bash"),
    ("/usr/bin/dig", "/usr/bin/dig"),
    ("/usr/bin/curl", "/usr/bin/curl"),
    ("/usr/bin/nc.openbsd", "/usr/bin/nc"),
    ("/usr/sbin/ip", "/sbin/ip"),
    ("/usr/bin/ss", "/usr/bin/ss"),
    ("/usr/bin/getent", "/usr/bin/getent"),
    ("/usr/bin/host", "/usr/bin/host"),
];

/// What building the e2e images needs and this machine lacks, if anything.
pub fn unavailable(bin: &Path) -> Option<String> {
    for (p, _) in TOOLS {
        if !Path::new(p).is_file() {
            return Some(format!(
                "{p} missing: install bash, bind9-dnsutils, curl, netcat-openbsd, iproute2 (scripts/k8s-e2e.sh does)"
            ));
        }
    }
    for b in ["agnhost", "agnhost-localhost.crt", "agnhost-localhost.key", "nginx"] {
        if !bin.join(b).is_file() {
            return Some(format!("{} missing: scripts/k8s-e2e.sh builds it", bin.join(b).display()));
        }
    }
    None
}

/// Every busybox applet, linked in `root`/bin (those not there already).
fn all_applets(root: &Path) -> Result<()> {
    image::add_busybox(root)?;
    let out = Command::new("/bin/busybox").arg("--list").output().map_err(io("running busybox --list"))?;
    for applet in String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|a| !a.is_empty()) {
        let link = root.join("bin").join(applet);
        if !link.exists() && !link.is_symlink() {
            std::os::unix::fs::symlink("busybox", &link).map_err(io("linking a busybox applet"))?;
        }
    }
    Ok(())
}

/// The files every image's tools read: users, groups, name service.
fn etc(root: &Path) -> Result<()> {
    let d = root.join("etc");
    std::fs::create_dir_all(&d).map_err(io("making an image directory"))?;
    for (f, text) in [
        ("passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
        ("group", "root:x:0:\nnogroup:x:65534:\n"),
        ("nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n"),
    ] {
        std::fs::write(d.join(f), text).map_err(io("writing an image file"))?;
    }
    Ok(())
}

/// busybox, then Debian's tools over it, in `root`.
fn tools(root: &Path) -> Result<()> {
    all_applets(root)?;
    etc(root)?;
    for (from, to) in TOOLS {
        // A busybox applet of the same name gives way.
        let _ = std::fs::remove_file(root.join(to.trim_start_matches('/')));
        image::add_binary(root, Path::new(from), to)?;
    }
    // `sh` is bash: Debian's busybox shell runs its own applets before
    // anything on PATH (its `nc` has no `-v` or `-z`, which the suite's
    // `nc -v -z -w 2 HOST PORT` needs); bash finds Debian's tools.
    for link in ["bin/sh", "usr/bin/bash"] {
        let p = root.join(link);
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink("/bin/bash", p).map_err(io("linking bash"))?;
    }
    Ok(())
}

/// One image: its root made by `fill`, built and imported.
fn one(
    kube: &Kube,
    name: &str,
    fill: &dyn Fn(&Path) -> Result<()>,
    entrypoint: &[&str],
    cmd: &[&str],
) -> Result<()> {
    let work = kube.dir.join("images");
    let slug: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let root = work.join(format!("{slug}-root"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).map_err(io("making an image root"))?;
    fill(&root)?;
    let tar = image::build(
        &image::ImageSpec { name, root: &root, entrypoint, cmd },
        &work,
        &work.join(format!("{slug}.tar")),
    )?;
    kube.import(&tar)?;
    let _ = std::fs::remove_file(&tar);
    std::fs::remove_dir_all(&root).map_err(io("removing an image root"))
}

/// nginx's configuration in its images: in the foreground, as root, port
/// 80, logs to the container's output.
const NGINX_CONF: &str =
    "daemon off;\nuser root;\nworker_processes 1;\nerror_log stderr;\npid /run/nginx.pid;\n\
                          events { worker_connections 64; }\nhttp {\n  access_log /dev/stdout;\n  \
                          server { listen 80; root /usr/share/nginx/html; }\n}\n";

/// Builds the e2e suite's images and imports them into every node;
/// returns their names.
pub fn import_images(kube: &Kube) -> Result<Vec<String>> {
    if let Some(why) = unavailable(&kube.bin) {
        return Err(Error::Other(why));
    }
    let bin = kube.bin.clone();
    let agnhost = |root: &Path| -> Result<()> {
        tools(root)?;
        image::copy_into(root, &bin.join("agnhost"), "/agnhost")?;
        // porter's TLS certificate and key, in the image's working directory.
        for f in ["localhost.crt", "localhost.key"] {
            image::copy_into(root, &bin.join(format!("agnhost-{f}")), &format!("/{f}"))?;
        }
        std::os::unix::fs::symlink("agnhost", root.join("agnhost-2")).map_err(io("linking agnhost-2"))?;
        std::fs::create_dir_all(root.join("uploads")).map_err(io("making /uploads"))
    };
    one(kube, AGNHOST_IMAGE, &agnhost, &["/agnhost"], &["pause"])?;
    let mut names = vec![AGNHOST_IMAGE.to_string()];
    let jessie = format!("{E2E}/jessie-dnsutils:1.7");
    one(kube, &jessie, &tools, &[], &["/bin/sh"])?;
    names.push(jessie);
    let busybox = format!("{E2E}/busybox:1.37.0-1");
    let bb = |root: &Path| -> Result<()> {
        all_applets(root)?;
        etc(root)
    };
    one(kube, &busybox, &bb, &[], &["sh"])?;
    names.push(busybox);
    let nginx = |root: &Path| -> Result<()> {
        etc(root)?;
        image::add_binary(root, &bin.join("nginx"), "/usr/sbin/nginx")?;
        for d in ["var/lib/nginx", "var/log/nginx", "run", "tmp", "usr/share/nginx/html"] {
            std::fs::create_dir_all(root.join(d)).map_err(io("making an image directory"))?;
        }
        std::fs::write(root.join("etc/nginx.conf"), NGINX_CONF).map_err(io("writing nginx.conf"))?;
        std::fs::write(root.join("usr/share/nginx/html/index.html"), "nginx\n")
            .map_err(io("writing index.html"))
    };
    for tag in ["1.14-4", "1.15-4"] {
        let name = format!("{E2E}/nginx:{tag}");
        one(kube, &name, &nginx, &["/usr/sbin/nginx", "-c", "/etc/nginx.conf"], &[])?;
        names.push(name);
    }
    let work = kube.dir.join("images");
    let pause = |root: &Path| image::add_pause(root, &work);
    one(kube, PAUSE_IMAGE, &pause, &["/pause"], &[])?;
    names.push(PAUSE_IMAGE.to_string());
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nginx_runs_in_the_foreground_on_port_80() {
        assert!(NGINX_CONF.starts_with("daemon off;"));
        assert!(NGINX_CONF.contains("listen 80;"));
    }
}
