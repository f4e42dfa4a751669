#!/usr/bin/env python3
"""scripts/shape.py's own tests: each probe is a small crate written to a
temporary tree, with the cycle shape.py must find (or must not); and
docs/ARCHITECTURE.md's "Two walks" checked against the tree (each file
named exists, none stepped into twice in its walk, no file entered again:
KNOWN_REENTRIES, the re-entries allowed with why, is empty).

Usage: python3 scripts/test_shape.py   (scripts/test.sh runs it before shape.py)"""
import importlib.util, os, re, tempfile, textwrap, unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("shape", os.path.join(HERE, "shape.py"))
shape = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape)


class Probe(unittest.TestCase):
    def crate(self, files):
        """`files` ({path under src: text}) as the crate `probe`; its cycles."""
        root = tempfile.mkdtemp(prefix="shape-probe.")
        self.addCleanup(lambda: __import__("shutil").rmtree(root))
        for path, text in files.items():
            p = os.path.join(root, "crates", "probe", "src", path)
            os.makedirs(os.path.dirname(p), exist_ok=True)
            with open(p, "w", encoding="utf-8") as f:
                f.write(textwrap.dedent(text))
        old, shape.ROOT = shape.ROOT, root
        self.addCleanup(lambda: setattr(shape, "ROOT", old))
        return [(kind, cycle) for kind, cycle, _ in shape.cycles("probe")]

    def test_two_files_through_a_reexport(self):
        # b.rs names `crate::A`, which lib.rs re-exports from a.rs: the
        # edge is b.rs -> a.rs, and a.rs -> b.rs closes the cycle.
        found = self.crate({
            "lib.rs": "mod a;\nmod b;\npub use a::A;\n",
            "a.rs": "use crate::b::B;\npub struct A(B);\n",
            "b.rs": "pub struct B;\nimpl B { pub fn a(&self) -> crate::A { todo!() } }\n",
        })
        self.assertIn(("files", ["a.rs", "b.rs", "a.rs"]), found)
        self.assertIn(("modules", ["a", "b", "a"]), found)

    def test_positive_control_one_way(self):
        # The same files with b.rs no longer naming A: nothing found.
        found = self.crate({
            "lib.rs": "mod a;\nmod b;\npub use a::A;\n",
            "a.rs": "use crate::b::B;\npub struct A(B);\n",
            "b.rs": "pub struct B;\n",
        })
        self.assertEqual(found, [])

    def test_parent_and_child_through_super(self):
        found = self.crate({
            "lib.rs": "mod x;\n",
            "x/mod.rs": "mod y;\npub struct X;\nfn f() { y::g(); }\n",
            "x/y.rs": "use super::X;\npub fn g() -> Option<X> { None }\n",
        })
        self.assertIn(("files", ["x/mod.rs", "x/y.rs", "x/mod.rs"]), found)

    def test_glob_import_of_the_parent(self):
        found = self.crate({
            "lib.rs": "mod x;\n",
            "x/mod.rs": "mod y;\npub struct X;\nfn f() { y::g(); }\n",
            "x/y.rs": "use super::*;\npub fn g() -> Option<X> { None }\n",
        })
        self.assertIn(("files", ["x/mod.rs", "x/y.rs", "x/mod.rs"]), found)

    def test_super_through_a_sibling_reexport_is_no_cycle(self):
        # y.rs names `super::Z`, which x/mod.rs only re-exports from z.rs:
        # resolved, the edge is y.rs -> z.rs, and no file names y.rs back.
        found = self.crate({
            "lib.rs": "mod x;\n",
            "x/mod.rs": "mod y;\nmod z;\npub use z::Z;\nfn f() { y::g(); }\n",
            "x/y.rs": "pub fn g() -> Option<super::Z> { None }\n",
            "x/z.rs": "pub struct Z;\n",
        })
        self.assertEqual(found, [])

    def test_a_test_modules_own_file_is_no_source(self):
        # `#[cfg(test)] mod tests;` (and `#[path]`) files are tests: neither
        # sized nor scanned for functions; the same declared without
        # `#[cfg(test)]` is a source (the positive control).
        self.crate({
            "lib.rs": "mod a;\n#[cfg(test)]\nmod tests;\nmod kept;\n",
            "a.rs": "#[cfg(test)]\n#[path = \"a_run.rs\"]\nmod run;\n",
            "a_run.rs": "fn t() {}\n",
            "tests.rs": "fn t() {}\n",
            "kept.rs": "fn k() {}\n",
        })
        self.assertEqual(sorted(shape.sources()), [
            "crates/probe/src/a.rs", "crates/probe/src/kept.rs", "crates/probe/src/lib.rs"])

    def test_tests_do_not_count(self):
        found = self.crate({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "pub struct A(crate::b::B);\n",
            "b.rs": "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
        })
        self.assertEqual(found, [])


# docs/ARCHITECTURE.md's "Two walks": each walk a run of numbered steps
# (`N. \`path\`: ...`, a new walk at each `1.`), each step one file first
# entered there; `- again \`path\`` a later entry into a file walked before
# (a re-entry: the walk left the file for another and came back).
STEP = re.compile(r"^(\d+)\. `([^`]+)`")
AGAIN = re.compile(r"^\s+- again `([^`]+)`")

# The re-entries the code still makes, by the walk's title and the file,
# each with why it stays. Any other `again` line fails, and so does one of
# these the walk no longer names (the list only shrinks). Empty since the
# policy decision's flows nest (`Flows::judge` asks the kernel's mirror,
# which asks the rules): no walk enters a file twice.
KNOWN_REENTRIES = {}


def walks(text):
    """The walks of `text`'s "## Two walks" section: [[(kind, path, line,
    title)]], `title` the `### ` heading the walk is under."""
    section = text.split("\n## Two walks\n", 1)[1].split("\n## ", 1)[0]
    out, title = [], ""
    for n, line in enumerate(section.splitlines()):
        if line.startswith("### "):
            title = line[4:]
        m = STEP.match(line)
        if m:
            if m.group(1) == "1":
                out.append([])
            out[-1].append(("step", m.group(2), n, title))
        elif AGAIN.match(line) and out:
            out[-1].append(("again", AGAIN.match(line).group(1), n, title))
    return out


def walk_errors(text, root, known=None):
    """What is wrong with the walks: a file that does not exist, a step
    naming a file its walk entered already, an "again" naming one it did
    not, a re-entry (an "again") not in `known` (by default
    KNOWN_REENTRIES: (title prefix, path)), and a known one no walk names
    any more."""
    known = KNOWN_REENTRIES if known is None else known
    errors, named = [], set()
    for w in walks(text):
        seen = set()
        for kind, path, n, title in w:
            if not os.path.isfile(os.path.join(root, path)):
                errors.append(f"{path}: no such file")
            if kind == "step" and path in seen:
                errors.append(f"{path}: a step again (an `again` line, or a walk that enters it once)")
            if kind == "again" and path not in seen:
                errors.append(f"{path}: `again` before any step entered it")
            elif kind == "again":
                key = next((k for k in known if title.startswith(k[0]) and k[1] == path), None)
                if key is None:
                    errors.append(f"{path}: entered again in \"{title}\" (a re-entry)")
                named.add(key)
            seen.add(path)
    for key in sorted(set(known) - named):
        errors.append(f"{key[1]}: listed as a re-entry of \"{key[0]}\" that the walk no longer makes")
    return errors


class Walks(unittest.TestCase):
    ROOT = os.path.dirname(HERE)

    def test_the_architectures_walks_name_files_that_exist_each_once(self):
        with open(os.path.join(self.ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
            text = f.read()
        ws = walks(text)
        # A control request; a policy decision's first packet; a later one.
        self.assertEqual(len(ws), 3, ws)
        self.assertTrue(all(len([s for s in w if s[0] == "step"]) >= 4 for w in ws), ws)
        # Each file once, but for the re-entries KNOWN_REENTRIES names.
        self.assertEqual(walk_errors(text, self.ROOT), [])

    def test_the_control_request_enters_each_file_once(self):
        # Acceptance 3 of issue 69: not one `again` under the control walk.
        with open(os.path.join(self.ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8") as f:
            control = walks(f.read())[0]
        self.assertTrue(control[0][3].startswith("A control request"), control[0])
        self.assertEqual([p for kind, p, _, _ in control if kind == "again"], [])

    def test_a_walk_that_drifted_is_caught(self):
        # The positive control: a file gone, a file stepped into twice, an
        # "again" with no first entry, each named.
        text = ("x\n## Two walks\n\n1. `scripts/shape.py`: a.\n2. `scripts/gone.py`: b.\n"
                "   - again `scripts/test.sh`: c.\n3. `scripts/shape.py`: d.\n\n## Next\n")
        self.assertEqual(walk_errors(text, self.ROOT, known={}), [
            "scripts/gone.py: no such file",
            "scripts/test.sh: `again` before any step entered it",
            "scripts/shape.py: a step again (an `again` line, or a walk that enters it once)",
        ])

    def test_a_reentry_fails_unless_known_and_a_known_one_gone_fails_too(self):
        # A walk that leaves shape.py for test.sh and comes back: a
        # re-entry, named; the same walk with it listed as known passes
        # (the positive control), and a known one no walk makes fails.
        text = ("x\n## Two walks\n\n### A walk\n\n1. `scripts/shape.py`: a.\n"
                "2. `scripts/test.sh`: b.\n   - again `scripts/shape.py`: c.\n\n## Next\n")
        self.assertEqual(walk_errors(text, self.ROOT, known={}), [
            'scripts/shape.py: entered again in "A walk" (a re-entry)',
        ])
        self.assertEqual(walk_errors(text, self.ROOT, known={("A walk", "scripts/shape.py"): "c"}), [])
        gone = {("A walk", "scripts/shape.py"): "c", ("A walk", "scripts/test.sh"): "d"}
        self.assertEqual(walk_errors(text, self.ROOT, known=gone), [
            'scripts/test.sh: listed as a re-entry of "A walk" that the walk no longer makes',
        ])


if __name__ == "__main__":
    unittest.main()
