//! Nothing but its build script: it runs among the first of a build (it
//! has no dependencies) and stops the build with one line naming the
//! Debian packages to install when a tool a later build script needs is
//! missing: `protoc` and the well-known `.proto` files for `etcd-client`,
//! the libbpf headers for vnetd's eBPF object. Without it a fresh machine
//! fails minutes later, deep in those scripts. `vnetd` depends on it.
