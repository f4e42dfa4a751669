//! Asked for help, no subcommand writes anything (issue 45: `vnetctl genkey
//! --help` made a private key in a file named `--help`, and exited 0), and
//! `vnetctl --help` lists every subcommand.

use std::process::Command;

/// vnetctl, pointed at a vnetd that is not there: help must not need one.
fn vnetctl(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vnetctl"))
        .args(args)
        .current_dir(dir)
        .env("VNETCTL_CONTROL", "unix:/nonexistent/vnetd.sock")
        .output()
        .unwrap()
}

/// Issue 70: each command's help is its own usage (not the global list,
/// not a request to vnetd), in each way of asking, with no vnetd.
#[test]
fn each_commands_help_prints_its_own_usage_without_a_daemon() {
    let dir = std::env::temp_dir().join(format!("vnetctl-help-own-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (args, usage) in [
        (&["help", "join"][..], "usage: vnetctl join --token-file"),
        (&["join", "--help"], "usage: vnetctl join --token-file"),
        (&["join", "-h"], "usage: vnetctl join --token-file"),
        (&["network", "approve", "--help"], "usage: vnetctl network approve DIR HOST"),
        (&["help", "network", "approve"], "usage: vnetctl network approve DIR HOST"),
        (&["network", "revoke", "--help"], "usage: vnetctl network revoke DIR HOST"),
        (&["network", "token", "-h"], "usage: vnetctl network token DIR HOST"),
        (&["revoke", "--help"], "usage: vnetctl revoke NETKEY"),
        (&["attach", "--help"], "usage: vnetctl attach NAME"),
        (&["attach", "vm0", "--help"], "usage: vnetctl attach NAME"),
        (&["detach", "--help"], "usage: vnetctl detach NAME"),
        (&["help", "route"], "usage: vnetctl route SRC DST"),
        (&["show", "--help"], "usage: vnetctl show routes|"),
        (&["trace", "--help"], "usage: vnetctl trace from VM|MAC|IP"),
        (&["help", "trace"], "usage: vnetctl trace from VM|MAC|IP"),
        (&["monitor", "--help"], "usage: vnetctl monitor [drops|flows|all]"),
        (&["apply", "-h"], "usage: vnetctl apply FILE"),
        (&["move", "--help"], "usage: vnetctl move MAC"),
        (&["kube", "--help"], "usage: vnetctl kube daemonset"),
        (&["genkey", "help"], "usage: vnetctl genkey"),
    ] {
        let out = vnetctl(&dir, args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert!(text.starts_with(usage), "{args:?}: {text}");
        assert!(!text.contains("Keys and certificates"), "{args:?} printed the global list: {text}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{args:?} wrote {left:?}");
    }
    // `help` alone: vnetctl's own; a command that is none: says so, exit 2.
    let out = vnetctl(&dir, &["help"]);
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Keys and certificates"));
    let out = vnetctl(&dir, &["help", "frobnicate"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no command `frobnicate`"), "{out:?}");
    // The control: a control line without help does go to vnetd (none here).
    let out = vnetctl(&dir, &["attach", "vm0", "netdev", "x"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach vnetd"), "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The man page: every control verb, the command list as sections and
/// tagged paragraphs, not one paragraph of run-together headings.
#[test]
fn the_man_page_lists_every_command_under_its_heading() {
    let dir = std::env::temp_dir().join(format!("vnetctl-man-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_vnetctl")).env("VNET_GEN_DOCS", &dir).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(dir.join("vnetctl.8")).unwrap();
    assert!(!page.contains(".SH EXTRA"), "{page}");
    for want in [
        ".SH \"CONTROL COMMANDS (TO THIS HOST'S VNETD)\"",
        ".SH \"KEYS AND CERTIFICATES (NO VNETD NEEDED)\"",
        ".SH \"EXIT STATUS\"",
        ".TP\n\\fBattach NAME",
        ".TP\n\\fBdetach NAME\\fR",
        ".TP\n\\fBtrace from VM|MAC|IP",
        ".TP\n\\fBjoin \\-\\-token\\-file",
        ".TP\n\\fBnetwork approve DIR HOST",
    ] {
        assert!(page.contains(want), "{want}\n{page}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
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
        assert!(text.starts_with(&format!("usage: vnetctl {}", args[0])), "{args:?}: {text}");
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{args:?} wrote {left:?}");
    }
    let out = vnetctl(&dir, &["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in [
        "genkey",
        "pubkey",
        "netkey",
        "sign",
        "revoke",
        "move",
        "apply",
        "show",
        "save",
        "activate",
        "attach",
        "detach",
        "trace from",
        "network approve",
        "join",
        "-n, --name",
    ] {
        assert!(text.contains(sub), "`vnetctl --help` does not name {sub}:\n{text}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
