//! Every committed fuzz input (`fuzz/corpus/TARGET/*`) and every past
//! crash (`fuzz/regressions/TARGET/*`) through its target's body: CI
//! checks what the fuzzers found without running a fuzzer.

use std::path::Path;

#[test]
fn every_corpus_input_and_past_crash_runs_clean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
    for (name, body) in vnet_fuzz::TARGETS {
        let mut n = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else { continue };
            for e in entries.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                body(&data);
                n += 1;
            }
        }
        assert!(n >= 1, "target {name}: no corpus in fuzz/corpus/{name}");
        eprintln!("{name}: {n} inputs");
    }
}
