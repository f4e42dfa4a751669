//! `vnetctl`: talk to a running vnetd.
//!
//! ```text
//! vnetctl show routes            # any control line, as words
//! vnetctl --json show stats
//! vnetctl route any 52:54:00:00:00:02 to link hostb   # `to` = `->`
//! vnetctl apply changes.conf     # a file, applied atomically
//! ```

use clap::Parser;
use std::process::ExitCode;
use vnetd::client::Client;
use vnetd::control::{Endpoint, DEFAULT_ENDPOINT};

#[derive(Parser)]
#[command(version, about = "Control a running vnetd", trailing_var_arg = true)]
struct Args {
    /// Control endpoint: unix:PATH or tcp:ADDR:PORT.
    #[arg(long, default_value = DEFAULT_ENDPOINT, env = "VNETCTL_CONTROL")]
    control: Endpoint,
    /// Ask `show` for JSON.
    #[arg(long)]
    json: bool,
    /// A control line as words (`show routes`, `route ...`, `delete route 3`),
    /// or `apply FILE` to apply a file as one transaction.
    #[arg(required = true, allow_hyphen_values = true)]
    words: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut c = match Client::connect(&args.control) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vnetctl: cannot reach vnetd at {}: {e}", args.control);
            return ExitCode::from(3);
        }
    };
    if args.words.len() == 2 && args.words[0] == "apply" {
        let path = &args.words[1];
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("vnetctl: {path}: {e}");
                return ExitCode::from(2);
            }
        };
        return match c.apply(&text) {
            Ok(Ok(())) => ExitCode::SUCCESS,
            Ok(Err(e)) => {
                eprintln!("vnetctl: {path}:{e}");
                ExitCode::from(1)
            }
            Err(e) => {
                eprintln!("vnetctl: {e}");
                ExitCode::from(3)
            }
        };
    }
    let mut line = args.words.join(" ");
    if args.json && args.words.first().is_some_and(|w| w == "show") {
        line.push_str(" json");
    }
    match c.request(&line) {
        Ok(r) => {
            print!("{}", r.body);
            match r.result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("vnetctl: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Err(e) => {
            eprintln!("vnetctl: {e}");
            ExitCode::from(3)
        }
    }
}
