//! Asked for help, no subcommand writes anything (issue 45: `vnetctl genkey
//! --help` made a private key in a file named `--help`, and exited 0), and
//! `vnetctl --help` lists every subcommand.

use std::process::Command;

fn vnetctl(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vnetctl")).args(args).current_dir(dir).output().unwrap()
}

#[test]
fn help_writes_nothing_and_names_every_subcommand() {
    let dir = std::env::temp_dir().join(format!("vnetctl-help-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for args in [
        &["genkey", "--help"][..],
        &["genkey", "-h"],
        &["netkey", "--help"],
        &["netkey", "-h"],
        &["sign", "--help"],
        &["revoke", "-h"],
        &["pubkey", "--help"],
        &["move", "--help"],
    ] {
        let out = vnetctl(&dir, args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(text.contains("genkey [FILE]"), "{args:?}: {text}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{args:?} wrote {left:?}");
    }
    let out = vnetctl(&dir, &["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["genkey", "pubkey", "netkey", "sign", "revoke", "move", "apply", "show", "save", "activate"] {
        assert!(text.contains(sub), "`vnetctl --help` does not name {sub}:\n{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
