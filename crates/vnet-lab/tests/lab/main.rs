//! Namespace integration tests: real vnetds, TAPs and UDP in a lab.
//!
//! They need root (network namespaces, TAP devices), so they are `#[ignore]`d
//! and the project's test command runs them with `--ignored`. Each builds
//! its own lab with per-run names; the lab's `Drop` removes it even when an
//! assertion fails.
//!
//! The tests are in rooms by area, and in each room in a module per pass
//! (`both`, `user`, `kernel`, and `*_alone` for those that run one at a
//! time): a test's full name says where it runs (`security::user::...`),
//! and `scripts/lab-plan.py` reads the steps from those names alone.

mod harness;

mod basics;
mod cluster;
mod dashboard;
mod drops;
mod edge;
mod flowlog;
mod guard;
mod integration;
mod k8s;
mod k8s_up;
mod k8s_walkthrough;
mod life;
mod links;
mod multisite;
mod netpol;
mod onboarding;
mod operations;
mod pods;
mod policy;
mod qemu;
mod quickstart;
mod security;
mod trace;
