//! Man pages and shell completions, generated from the command-line
//! definitions themselves (clap_mangen, clap_complete) so they cannot
//! drift from the code. `scripts/package.sh` asks each binary for them by
//! running it with `VNET_GEN_DOCS=DIR` set.

use std::path::Path;

/// The variable that makes `vnetd` and `vnetctl` write their docs and exit.
pub const GEN_DOCS_ENV: &str = "VNET_GEN_DOCS";

/// Writes `NAME.8` and the bash, zsh and fish completions of `cmd` into `dir`.
pub fn write(mut cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let name = cmd.get_name().to_string();
    let man = clap_mangen::Man::new(cmd.clone()).section("8");
    let mut page = Vec::new();
    man.render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.8")), page)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, &name, dir)?;
    }
    Ok(())
}

/// If [`GEN_DOCS_ENV`] is set, writes the docs of `cmd` there and returns
/// the exit status to leave with.
pub fn generate_if_asked(cmd: impl FnOnce() -> clap::Command) -> Option<std::process::ExitCode> {
    let dir = std::env::var_os(GEN_DOCS_ENV)?;
    Some(match write(cmd(), Path::new(&dir)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {e}", Path::new(&dir).display());
            std::process::ExitCode::FAILURE
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_man_page_and_completions_come_out_of_a_command() {
        let dir = std::env::temp_dir().join(format!("vnet-docs-test-{}", std::process::id()));
        let cmd = clap::Command::new("demo").about("a demo").arg(clap::Arg::new("verbose").long("verbose"));
        super::write(cmd, &dir).unwrap();
        let page = std::fs::read_to_string(dir.join("demo.8")).unwrap();
        assert!(page.contains(".TH demo 8") && page.contains("verbose"), "{page}");
        for f in ["demo.bash", "_demo", "demo.fish"] {
            assert!(dir.join(f).is_file(), "{f}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
