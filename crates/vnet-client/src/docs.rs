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
    let page = man_page(&cmd)?;
    std::fs::write(dir.join(format!("{name}.8")), page)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
        clap_complete::generate_to(shell, &mut cmd, &name, dir)?;
    }
    Ok(())
}

/// The command's man page (section 8): clap_mangen's sections, but the
/// text after the options (`after_help`) as sections of its own, one per
/// heading, each command a tagged paragraph (clap_mangen runs that text
/// together into one paragraph under "EXTRA").
pub fn man_page(cmd: &clap::Command) -> std::io::Result<Vec<u8>> {
    let extra = cmd.get_after_long_help().or_else(|| cmd.get_after_help()).map(|t| t.to_string());
    let plain = cmd.clone().after_help(None::<&str>).after_long_help(None::<&str>);
    let man = clap_mangen::Man::new(plain.clone()).section("8");
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if plain.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if plain.get_subcommands().any(|c| !c.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    if let Some(text) = extra {
        page.extend_from_slice(sections_roff(&text).as_bytes());
    }
    if plain.get_version().is_some() || plain.get_long_version().is_some() {
        man.render_version_section(&mut page)?;
    }
    if plain.get_author().is_some() {
        man.render_authors_section(&mut page)?;
    }
    Ok(page)
}

/// Text laid out as `--help` shows it, as roff: a line `Heading:` at the
/// margin a section (`.SH HEADING`), a line indented two spaces a tagged
/// paragraph's tag (`.TP`; the lines right after it more tags, `.TQ`),
/// deeper lines its text.
fn sections_roff(text: &str) -> String {
    let mut out = String::new();
    let mut tagged = false;
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        match indent {
            0 if t.ends_with(':') => {
                let title = t.trim_end_matches(':').to_uppercase();
                out.push_str(&format!(".SH \"{}\"\n", escape(&title).replace('"', "")));
            }
            0 => out.push_str(&format!(".PP\n{}\n", escape(t))),
            1 | 2 => {
                let tag = if tagged { ".TQ" } else { ".TP" };
                out.push_str(&format!("{tag}\n\\fB{}\\fR\n", escape(t)));
                tagged = true;
                continue;
            }
            _ => out.push_str(&format!("{}\n", escape(t))),
        }
        tagged = false;
    }
    out
}

/// A line of text made safe for roff: backslashes, hyphens (not to be
/// broken or shown as dashes) and a leading `.` or `'` (a request).
fn escape(t: &str) -> String {
    let s = t.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with('.') || s.starts_with('\'') {
        format!("\\&{s}")
    } else {
        s
    }
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

    /// The text after the options comes out as sections and tagged
    /// paragraphs, not one paragraph under "EXTRA".
    #[test]
    fn after_help_headings_are_sections_and_commands_tagged_paragraphs() {
        let cmd = clap::Command::new("demo").version("1").about("a demo").after_help(
            "Commands:\n  show WHAT\n  show MORE\n      what it has\n  .dot --x\n      a \\ backslash\nExit status:\n  0\n      done",
        );
        let page = String::from_utf8(super::man_page(&cmd).unwrap()).unwrap();
        assert!(!page.contains("EXTRA"), "{page}");
        for want in [
            ".SH \"COMMANDS\"\n.TP\n\\fBshow WHAT\\fR\n.TQ\n\\fBshow MORE\\fR\nwhat it has\n",
            ".TP\n\\fB\\&.dot \\-\\-x\\fR\na \\e backslash\n",
            ".SH \"EXIT STATUS\"\n.TP\n\\fB0\\fR\ndone\n",
        ] {
            assert!(page.contains(want), "{want}\n{page}");
        }
        assert!(page.find("EXIT STATUS").unwrap() < page.find(".SH VERSION").unwrap(), "{page}");
    }
}
