//! Pages of commands in the docs, read so that a lab test runs them as
//! they are written (a page run by a test cannot drift from the code).
//!
//! [`fences`] reads every fenced block of a page: its info string (what
//! follows the opening three backquotes) and its body. `docs/QUICKSTART.md`'s
//! test runs the blocks fenced `sh on=WORD` and compares the `text` ones
//! with what the machines show, and refuses any other fence.
//!
//! A page (or a section of one, [`section`]) that a test walks through
//! whole is stricter ([`walkthrough`]): every fence in it is one the test
//! knows, or the walk fails before anything runs.
//!
//! - ```` ```sh on=WORD ````: commands the test runs (bash, `-euo pipefail`)
//!   where WORD says (the test's contexts: the admin's machine, each
//!   node, ...). ` until=SECONDS` after it: the test runs the block again
//!   until it passes, at most that long (a user who reruns a command that
//!   shows a state not reached yet).
//! - ```` ```sh lab=WORD ````: commands the test does not run, because the
//!   lab does that step its own way (WORD names the test's step). The
//!   block's first line is a comment `# Not run by the lab: WHY`, which a
//!   reader sees.
//! - ```` ```text output ````: right after a `sh on=` block, what its
//!   standard output shows. Each line must be found in the output, in
//!   order ([`check_output`]): runs of spaces and tabs count as one space,
//!   and `...` stands for any text (a name, an address, a date).

use std::fmt;

/// A fenced block: where it starts (1-based line), its info string, its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub line: usize,
    pub info: String,
    pub body: String,
}

/// Every fenced block of `text`, in order.
pub fn fences(text: &str) -> Vec<Fence> {
    let (mut out, mut cur): (Vec<Fence>, Option<Fence>) = (Vec::new(), None);
    for (i, line) in text.lines().enumerate() {
        match cur.as_mut() {
            Some(_) if line.trim_start().starts_with("```") => out.extend(cur.take()),
            Some(f) => {
                f.body.push_str(line);
                f.body.push('\n');
            }
            None => {
                if let Some(info) = line.trim_start().strip_prefix("```") {
                    cur = Some(Fence { line: i + 1, info: info.trim().to_string(), body: String::new() });
                }
            }
        }
    }
    out
}

/// The section of `text` under the heading line `heading` (exactly), up to
/// the next heading of its level or above (a `#` line outside a fence).
pub fn section<'a>(text: &'a str, heading: &str) -> Result<&'a str, DocError> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let start = text
        .find(&format!("\n{heading}\n"))
        .map(|i| i + 1)
        .ok_or_else(|| DocError::NoSection(heading.to_string()))?;
    let mut in_fence = false;
    let mut at = start + heading.len() + 1;
    for line in text[at..].split_inclusive('\n') {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !in_fence && hashes > 0 && hashes <= level && line[hashes..].starts_with(' ') {
            break;
        }
        at += line.len();
    }
    Ok(&text[start..at])
}

/// What a walkthrough block asks of the test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Run where `on` says; rerun until it passes, at most `until` seconds.
    Run { on: String, until: Option<u64> },
    /// Not run: the lab's own step `word`, for the reason `why`.
    Lab { word: String, why: String },
}

/// A block of a walkthrough: its step, its commands, the output it states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub line: usize,
    pub step: Step,
    pub body: String,
    /// The lines of the `text output` block after it, if any.
    pub output: Vec<String>,
}

/// Why a walkthrough cannot be read, or a block's output is not the stated one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DocError {
    #[error("no section headed {0:?}")]
    NoSection(String),
    #[error("line {line}: a fence the walkthrough's test does not know: ```{info}")]
    UnknownFence { line: usize, info: String },
    #[error("line {line}: ```sh on={on}: no such place in this test (it knows {known:?})")]
    UnknownPlace { line: usize, on: String, known: Vec<String> },
    #[error("line {line}: ```sh lab={word}: no such step of the lab's (it knows {known:?})")]
    UnknownLabStep { line: usize, word: String, known: Vec<String> },
    #[error("line {line}: a `lab=` block starts with `# Not run by the lab: WHY`")]
    NoReason { line: usize },
    #[error("line {line}: a `text output` block follows no `sh on=` block")]
    StrayOutput { line: usize },
    #[error("the stated output line {want:?} is not in the output (after the lines matched before it)")]
    OutputDiffers { want: String },
}

impl DocError {
    /// The same error with its line counted `by` lines further (a section's
    /// line made the page's).
    pub fn shifted(self, by: usize) -> DocError {
        use DocError::*;
        match self {
            UnknownFence { line, info } => UnknownFence { line: line + by, info },
            UnknownPlace { line, on, known } => UnknownPlace { line: line + by, on, known },
            UnknownLabStep { line, word, known } => UnknownLabStep { line: line + by, word, known },
            NoReason { line } => NoReason { line: line + by },
            StrayOutput { line } => StrayOutput { line: line + by },
            e @ (NoSection(_) | OutputDiffers { .. }) => e,
        }
    }
}

/// The blocks of a walkthrough: every fence of `text` classified, with
/// `on=` places from `places` and `lab=` steps from `lab_steps` only.
pub fn walkthrough(text: &str, places: &[&str], lab_steps: &[&str]) -> Result<Vec<Block>, DocError> {
    let known = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut out: Vec<Block> = Vec::new();
    for f in fences(text) {
        let words: Vec<&str> = f.info.split_whitespace().collect();
        let unknown = || DocError::UnknownFence { line: f.line, info: f.info.clone() };
        let step = match words.as_slice() {
            ["text", "output"] => {
                match out.last_mut() {
                    Some(b) if matches!(b.step, Step::Run { .. }) && b.output.is_empty() => {
                        b.output =
                            f.body.lines().filter(|l| !l.trim().is_empty()).map(str::to_string).collect();
                    }
                    _ => return Err(DocError::StrayOutput { line: f.line }),
                }
                continue;
            }
            ["sh", on, rest @ ..] if on.starts_with("on=") => {
                let on = &on["on=".len()..];
                if !places.contains(&on) {
                    return Err(DocError::UnknownPlace { line: f.line, on: on.into(), known: known(places) });
                }
                let until = match rest {
                    [] => None,
                    [u] => Some(u.strip_prefix("until=").and_then(|s| s.parse().ok()).ok_or_else(unknown)?),
                    _ => return Err(unknown()),
                };
                Step::Run { on: on.into(), until }
            }
            ["sh", lab] if lab.starts_with("lab=") => {
                let word = &lab["lab=".len()..];
                if !lab_steps.contains(&word) {
                    let known = known(lab_steps);
                    return Err(DocError::UnknownLabStep { line: f.line, word: word.into(), known });
                }
                let first = f.body.lines().next().unwrap_or("");
                let why = first.strip_prefix("# Not run by the lab: ").map(str::trim).unwrap_or("");
                if why.is_empty() {
                    return Err(DocError::NoReason { line: f.line });
                }
                Step::Lab { word: word.into(), why: why.into() }
            }
            _ => return Err(unknown()),
        };
        out.push(Block { line: f.line, step, body: f.body, output: Vec::new() });
    }
    Ok(out)
}

/// Whether `output` shows each of `want`'s lines, in order, each on a line
/// of its own ([`walkthrough`]'s `text output`: blanks collapsed, `...` any text).
pub fn check_output(want: &[String], output: &str) -> Result<(), DocError> {
    let collapse = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut lines = output.lines().map(collapse);
    for w in want {
        let w = collapse(w);
        if !lines.by_ref().any(|l| glob(&w, &l)) {
            return Err(DocError::OutputDiffers { want: w });
        }
    }
    Ok(())
}

/// Whether `line` is `pattern` with each `...` standing for any text.
fn glob(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split("...").collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return line == pattern;
    }
    if !line.starts_with(first) || line.len() < first.len() + last.len() || !line.ends_with(last) {
        return false;
    }
    let mut rest = &line[first.len()..line.len() - last.len()];
    for p in &parts[1..parts.len() - 1] {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    true
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Run { on, until: None } => write!(f, "sh on={on}"),
            Step::Run { on, until: Some(s) } => write!(f, "sh on={on} until={s}"),
            Step::Lab { word, .. } => write!(f, "sh lab={word}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# Page\n\n## Walk\n\nFirst:\n\n```sh lab=init\n# Not run by the lab: it has its own.\nkubeadm init\n```\n\n\
        ```sh on=admin until=30\nkubectl get nodes\n```\n\n```text output\nnode/... condition met\n\nnode/... condition met\n```\n\n\
        ```sh on=node\nctr images import x.tar\n```\n\n### Sub\n\n```sh on=admin\ntrue\n```\n\n## Next\n\n```yaml\na: 1\n```\n";

    #[test]
    fn a_walkthrough_is_read_whole_with_its_outputs() {
        let s = section(PAGE, "## Walk").unwrap();
        assert!(s.starts_with("## Walk\n") && s.contains("### Sub") && !s.contains("## Next"), "{s}");
        let b = walkthrough(s, &["admin", "node"], &["init"]).unwrap();
        assert_eq!(b.len(), 4);
        assert_eq!(b[0].step, Step::Lab { word: "init".into(), why: "it has its own.".into() });
        assert_eq!(b[1].step, Step::Run { on: "admin".into(), until: Some(30) });
        assert_eq!(b[1].output, ["node/... condition met", "node/... condition met"]);
        assert_eq!((b[2].body.as_str(), b[2].output.len()), ("ctr images import x.tar\n", 0));
        assert_eq!(b[3].step.to_string(), "sh on=admin");
    }

    /// A fence the test does not know fails the walk, whatever it is;
    /// the control: the same page without it is read.
    #[test]
    fn an_unknown_fence_place_or_step_is_refused() {
        let s = section(PAGE, "## Walk").unwrap();
        let ok = walkthrough(s, &["admin", "node"], &["init"]);
        assert!(ok.is_ok(), "{ok:?}");
        for (from, to) in [
            ("```sh on=node", "```sh"),
            ("```sh on=node", "```bash on=node"),
            ("```sh on=node", "```sh on=node until=soon"),
            ("```text output\nnode", "```text\nnode"),
            ("```sh lab=init", "```yaml"),
        ] {
            let broken = s.replacen(from, to, 1);
            let e = walkthrough(&broken, &["admin", "node"], &["init"]).unwrap_err();
            assert!(matches!(e, DocError::UnknownFence { .. }), "{to}: {e}");
        }
        let e = walkthrough(&s.replacen("on=node", "on=pod", 1), &["admin", "node"], &["init"]);
        assert!(matches!(e, Err(DocError::UnknownPlace { .. })), "{e:?}");
        let e = walkthrough(&s.replacen("lab=init", "lab=other", 1), &["admin", "node"], &["init"]);
        assert!(matches!(e, Err(DocError::UnknownLabStep { .. })), "{e:?}");
        let e = walkthrough(
            &s.replacen("# Not run by the lab: it has its own.\n", "", 1),
            &["admin", "node"],
            &["init"],
        );
        assert!(matches!(e, Err(DocError::NoReason { line: 5 })), "{e:?}");
        let e = walkthrough("```text output\nx\n```\n", &[], &[]);
        assert!(matches!(e, Err(DocError::StrayOutput { line: 1 })), "{e:?}");
        assert_eq!(e.unwrap_err().shifted(100), DocError::StrayOutput { line: 101 });
    }

    #[test]
    fn the_stated_output_is_found_in_order_with_blanks_collapsed_and_ellipses() {
        let want = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let out =
            "node/vl-h0 condition met\nnode/vl-h1   condition met\nName:\tweb.demo.svc\nAddress: 10.96.4.2\n";
        assert_eq!(check_output(&want(&["node/... condition met", "node/... condition met"]), out), Ok(()));
        assert_eq!(check_output(&want(&["Name: web.demo.svc", "Address: ..."]), out), Ok(()));
        assert!(check_output(&want(&["node/... condition met"; 3]), out).is_err(), "a third node");
        assert!(check_output(&want(&["Address: ...", "Name: ..."]), out).is_err(), "out of order");
        assert!(check_output(&want(&["condition met"]), out).is_err(), "a whole line, not a part");
        assert!(check_output(&want(&["web-..."]), "").is_err());
        assert!(glob("a...b...c", "axxbyyc") && !glob("a...b...c", "axxcyyb") && !glob("ab...ba", "aba"));
    }

    #[test]
    fn every_fence_is_read_with_its_line_info_and_body() {
        let page = "intro\n```sh on=admin\nvnetctl network init\n```\n```text\nout\n```\n";
        let f = fences(page);
        let info: Vec<_> = f.iter().map(|f| (f.line, f.info.as_str(), f.body.as_str())).collect();
        assert_eq!(info, [(2, "sh on=admin", "vnetctl network init\n"), (5, "text", "out\n")]);
    }
}
